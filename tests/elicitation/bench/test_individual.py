"""The individual benchmark harness on a tiny constructed dataset (canonical format)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from elicitation.bench.individual import run_individual, simulate
from elicitation.bench.methods import FitContext, fit_latent_class_model, method_names
from elicitation.bench.metrics import METRICS, score_predictions
from elicitation.bench.plot import plot_curves
from elicitation.criteria import get_criterion
from elicitation.datasets import DatasetError, load_dataset
from elicitation.errors import BenchmarkError
from tests.support.elicitation_cases import TINY_RUNS, write_tiny_dataset

BUDGET = 5  # = the number of candidates of each tiny run
METHODS = ["default", "random", "fixed", "irt", "full"]
FIT_OPTIONS = {
    "latent_classes": {"n_classes": (2, 3, 4), "n_restarts": 1},
    "irt": {"max_iter": 40, "n_points": 21},
}
_FITS: dict = {}  # fitted models shared by the tests of this module (deterministic fits)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_dataset(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.fixture(scope="module")
def result(tiny: Path) -> dict:
    return run_individual(tiny, BUDGET, METHODS, progress=False, fit_options=FIT_OPTIONS)


def _context(tiny: Path, run_index: int) -> tuple[FitContext, torch.Tensor, list[int], list[int]]:
    ds = load_dataset(tiny)
    bank = ds.item_bank()
    assert ds.split is not None
    m = {k: torch.as_tensor(ds.matrix(users=ds.split[k]), dtype=torch.long) for k in ds.split}
    run = ds.runs[run_index]
    cand, tgt = bank.indices(run.cand_qids), bank.indices(run.eval_qids)
    ctx = FitContext(
        bank,
        m["train_users"],
        m["val_users"],
        bank.indices(ds.demographics),
        cand,
        tgt,
        seed=run.seed,
        cache=_FITS,
        options=FIT_OPTIONS,
    )
    return ctx, m["test_users"], cand, tgt


def test_result_schema(result: dict) -> None:
    assert result["dataset"] == "tiny" and result["budget"] == BUDGET
    assert list(result["methods"]) == METHODS
    for name, res in result["methods"].items():
        for metric in METRICS:
            assert len(res[metric]) == BUDGET + 1, (name, metric)
            assert all(isinstance(v, float) and math.isfinite(v) for v in res[metric])
        assert len(res["per_run"]) == len(TINY_RUNS)
        for entry, (seed, _, _) in zip(res["per_run"], TINY_RUNS, strict=True):
            assert entry["seed"] == seed
            for metric in METRICS:
                assert len(entry[metric]) == BUDGET + 1
        # the curve is the mean of the runs
        for metric in METRICS:
            for n in range(BUDGET + 1):
                mean = sum(e[metric][n] for e in res["per_run"]) / len(TINY_RUNS)
                assert res[metric][n] == pytest.approx(mean)
        assert all(0 <= a <= 1 for a in res["accuracy"])
        for bm, bs in zip(res["brier_mean"], res["brier_sum"], strict=True):
            assert bm < bs  # averaged over >= 2 options
    json.dumps(result)  # JSON-serialisable as is


def test_all_methods_start_equal_and_end_at_full(result: dict) -> None:
    """Demographics only at 0 questions; after asking every candidate = ``full``."""
    meth = result["methods"]
    full = meth["full"]
    assert len(set(full["log_loss"])) == 1
    for name in ("default", "random", "fixed"):
        assert meth[name]["log_loss"][0] == pytest.approx(meth["default"]["log_loss"][0])
        for metric in METRICS:
            assert meth[name][metric][BUDGET] == pytest.approx(full[metric][0], abs=1e-9), (
                name,
                metric,
            )
    # asking questions helps the greedy method on this data
    assert meth["default"]["log_loss"][1] < meth["default"]["log_loss"][0]
    assert meth["irt"]["log_loss"][0] != pytest.approx(meth["default"]["log_loss"][0])


def test_full_equals_a_direct_computation(tiny: Path, result: dict) -> None:
    """``full``: replay each test user's answered candidates one by one and score by hand."""
    for r in range(len(TINY_RUNS)):
        ctx, test, cand, tgt = _context(tiny, r)
        model = fit_latent_class_model(ctx)
        n_ok = n = 0
        ll = 0.0
        for u in range(test.shape[0]):
            attrs = {d: int(test[u, d]) for d in ctx.demographics if test[u, d] >= 0}
            answers = [(c, int(test[u, c])) for c in cand if test[u, c] >= 0]
            pred = model.predict(model.replay(answers, attrs), tgt)
            for j, t in enumerate(tgt):
                y = int(test[u, t])
                if y < 0:
                    continue
                o = model.item_bank.n_options[t]
                n += 1
                n_ok += int(int(torch.argmax(pred[j, :o])) == y)
                ll -= math.log(max(float(pred[j, y]), 1e-12))
        entry = result["methods"]["full"]["per_run"][r]
        assert entry["n_pairs"] == n
        assert entry["accuracy"][0] == pytest.approx(n_ok / n)
        assert entry["log_loss"][0] == pytest.approx(ll / n)


def test_simulate_asks_only_answered_candidates(tiny: Path) -> None:
    ctx, test, cand, tgt = _context(tiny, 0)
    model = fit_latent_class_model(ctx)
    answers = test[:, cand].clone()
    answers[::3, 1] = -1  # some users did not answer some candidates
    answers[::7, :] = -1  # and some answered none
    observed = torch.full_like(test, -1)
    observed[:, ctx.demographics] = test[:, ctx.demographics]
    for name in ("eig", "random", "posterior_entropy", "fixed"):
        preds, asked = simulate(model, get_criterion(name), observed, cand, answers, tgt, 4)
        assert len(preds) == 5 and asked.shape == (test.shape[0], 4)
        for u in range(test.shape[0]):
            got = [int(a) for a in asked[u] if a >= 0]
            answered = [c for c, a in zip(cand, answers[u].tolist(), strict=True) if a >= 0]
            assert len(got) == len(set(got)) == min(4, len(answered))
            assert set(got) <= set(answered)
        # a user with nothing to answer keeps the prior prediction
        torch.testing.assert_close(preds[-1][0], preds[0][0])


def test_metrics_by_hand() -> None:
    pred = torch.tensor([[[0.7, 0.3, 0.0], [0.2, 0.5, 0.3]]], dtype=torch.float64)
    truth = torch.tensor([[1, -1]])
    s = score_predictions(pred, truth, torch.tensor([2, 3]))
    assert s.count == 1 and s.accuracy == 0
    assert s.log_loss == pytest.approx(-math.log(0.3))
    assert s.brier_sum == pytest.approx(0.7**2 + 0.7**2)
    assert s.brier_mean == pytest.approx((0.7**2 + 0.7**2) / 2)


def test_plot(result: dict, tmp_path: Path) -> None:
    out = plot_curves(result, tmp_path / "img" / "curve.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_bad_inputs(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError, match="budget must be an integer >= 0"):
        run_individual(tiny, -1, ["random"], progress=False)
    with pytest.raises(BenchmarkError, match="unknown benchmark method 'magic'.*default"):
        run_individual(tiny, 2, ["default", "magic"], progress=False)
    with pytest.raises(BenchmarkError, match="runs must be between 1 and 2"):
        run_individual(tiny, 2, ["random"], n_runs=3, progress=False)
    with pytest.raises(DatasetError, match="not found"):
        run_individual(tmp_path / "nowhere", 2, progress=False)
    bare = write_tiny_dataset(tmp_path / "bare", n_users=60)
    manifest = json.loads((bare / "dataset.json").read_text())
    del manifest["runs"]
    (bare / "dataset.json").write_text(json.dumps(manifest))
    (bare / "runs.csv").unlink()
    with pytest.raises(BenchmarkError, match="no benchmark runs"):
        run_individual(bare, 2, ["random"], progress=False)
    assert {"default", "random", "fixed", "irt", "full"} <= set(method_names())
