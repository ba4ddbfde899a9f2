"""The group benchmark end to end on a small copy of a shipped dataset, and its CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from elicitation.errors import BenchmarkError
from elicitation.group_bench import DEFAULT_GROUP_METHODS, run_group
from gnn.train import GNNConfig

TINY_GNN = GNNConfig(
    dim=16, lr=1e-2, max_epochs=15, patience=15, num_threads=1, partial_mask="uniform"
)


def test_group_protocol_on_a_small_copy(small_dataset_factory: Callable[..., Path]) -> None:
    # OpinionQA: multi-option questions (2 to 12 options) exercise the padding paths
    folder = small_dataset_factory("opinionqa", 250)
    result = run_group(
        folder,
        0.1,
        2,
        list(DEFAULT_GROUP_METHODS),
        n_runs=1,
        n_classes=(2, 4),
        gnn_config=TINY_GNN,
        log=lambda _: None,
    )
    n_test = result["n_test_members"]
    assert n_test > 20
    assert result["respondents_per_round"] == max(1, int(0.1 * n_test + 0.5))
    assert set(result["methods"]) == set(DEFAULT_GROUP_METHODS)
    for res in result["methods"].values():
        for metric in ("accuracy", "brier_sum", "perplexity"):
            assert len(res[metric]) == 3
        assert all(0.0 <= a <= 1.0 for a in res["accuracy"])
        assert res["accuracy_runs"] == [res["accuracy"]]  # one run: its curve is the mean
        assert all(p >= 1.0 for p in res["perplexity"])
    # all methods but the default share the predictor and start from the same state
    base = {round(r["accuracy"][0], 12) for n, r in result["methods"].items() if n != "default"}
    assert len(base) == 1


def test_unknown_method_and_bad_rates_are_refused(small_dataset: Path) -> None:
    with pytest.raises(BenchmarkError, match="unknown group methods"):
        run_group(small_dataset, 0.1, 1, ["nearest"], log=lambda _: None)
    with pytest.raises(BenchmarkError, match="nonresponse"):
        run_group(small_dataset, 0.1, 1, ["random_random"], nonresponse=1.0, log=lambda _: None)


def test_cli_writes_result_and_plot(
    small_dataset_factory: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.commands import bench

    folder = small_dataset_factory("ces", 300)
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    import argparse

    parser = argparse.ArgumentParser(prog="priorly")
    bench.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        [
            "bench",
            "group",
            "--dataset",
            str(folder),
            "--respondent-budget",
            "5",
            "--rounds",
            "1",
            "--out",
            str(out),
            "--plot",
            str(png),
            "--runs",
            "1",
            "--methods",
            "random_random",
            "--nonresponse",
            "0.5",
        ]
    )
    import elicitation.group_bench as gb

    orig = gb.prepare

    def small_prepare(ds, **kw):  # type: ignore[no-untyped-def]
        kw.update(n_classes=(2,), gnn_config=TINY_GNN)
        return orig(ds, **kw)

    # keep the CLI test fast: tiny models, the same code path
    monkeypatch.setattr(gb, "prepare", small_prepare)
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert result["respondents_per_round"] == 5
    assert len(result["methods"]["random_random"]["accuracy"]) == 2
    assert png.stat().st_size > 1000


def test_group_speed_cli_times_the_default_with_a_later_round(
    small_dataset_factory: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`priorly bench group-speed`: one entry per group size with the default,
    ``eig_eig_pool`` and the relational planner; `--rounds` reaches the lookahead
    (its chance of a later answer is > 0 in the timed round, so the slower gain is timed)."""
    import argparse

    import elicitation.group.selectors as selectors
    import elicitation.group_bench as gb
    from app.commands import bench

    folder = small_dataset_factory("ces", 300)
    out = tmp_path / "speed.json"
    parser = argparse.ArgumentParser(prog="priorly")
    bench.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["bench", "group-speed", "--dataset", str(folder), "--members", "0,500"]
        + ["--no-train", "--rounds", "3", "--respondent-budget", "0.2", "--out", str(out)]
    )
    orig = gb.prepare

    def small_prepare(ds, **kw):  # type: ignore[no-untyped-def]
        kw.update(n_classes=(2,), gnn_config=TINY_GNN)
        return orig(ds, **kw)

    monkeypatch.setattr(gb, "prepare", small_prepare)
    chances: list[float] = []
    orig_gain = selectors.member_lookahead_accuracy_gain

    def recording_gain(*a, **kw):  # type: ignore[no-untyped-def]
        chances.append(a[4])
        return orig_gain(*a, **kw)

    monkeypatch.setattr(selectors, "member_lookahead_accuracy_gain", recording_gain)
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert [r["members"] for r in result["rounds"]][1] == 500
    for entry in result["rounds"]:
        for name in ("default", "eig_eig_pool", "greedy_relational_gnn"):
            assert entry[name]["plan_seconds"] > 0 and entry[name]["update_seconds"] > 0
    assert chances and all(q == pytest.approx(0.4) for q in chances)  # 0.2 x 2 rounds left


def test_live_planner_ties_the_default_to_the_digit(
    small_dataset_factory: Callable[..., Path],
) -> None:
    """``live`` replays the closed rounds and calls :func:`elicitation.group.plan_round`
    each round, as the app's plan job does; ``default`` runs one elicitation through its
    rounds. Same questions, members and predictions: identical curves (nonresponse and the
    online pool weight included)."""
    folder = small_dataset_factory("ces", 260)
    result = run_group(
        folder,
        0.1,
        2,
        ["default", "live"],
        nonresponse=0.2,
        n_runs=1,
        n_classes=(2, 4),
        gnn_config=TINY_GNN,
        log=lambda _: None,
    )
    d, live = result["methods"]["default"], result["methods"]["live"]
    for key in ("accuracy", "brier_sum", "log_loss", "perplexity", "pool_weight", "accuracy_runs"):
        assert live[key] == d[key], key
    assert len(d["accuracy"]) == 3
