"""The individual-elicitation benchmark: replay real respondents, one question at a time.

Protocol (docs/methods.md §1 and §3; the papers' splits):

* models are fitted on the training users; anything chosen (e.g. the number of latent
  classes) is chosen on the validation users; only the test users are scored;
* for each benchmark run (``runs.csv``: a seed, 20 candidate items, 5 target items) a
  test user is asked only candidate items, and only those the user actually answered
  (the answer is the user's real one); demographics are observed for free;
* after ``n = 0 .. T`` questions, the target predictions are scored (accuracy, log loss,
  Brier averaged and summed over options) over all (test user, target) pairs with a
  known answer; curves are averaged over the runs (each run weighted equally).

Everything is batched over test users (``model.initial_batch`` / ``update_batch`` /
``lookahead_batch``); :func:`simulate` is the reusable core (the web app's simulation
replays respondents the same way).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from elicitation.bench.defaults import DEFAULT_METHODS
from elicitation.bench.methods import FitContext, get_method, method_names
from elicitation.bench.metrics import METRICS, score_predictions
from elicitation.criteria import SelectionCriterion
from elicitation.datasets import BenchmarkRun, Dataset, load_dataset
from elicitation.errors import BenchmarkError, ElicitationError
from models.base import MISSING, BeliefModel


def simulate(
    model: BeliefModel,
    criterion: SelectionCriterion,
    observed: Tensor,
    candidates: Sequence[int],
    answers: Tensor,
    targets: Sequence[int],
    budget: int,
) -> tuple[list[Tensor], Tensor]:
    """Replay ``B`` respondents through ``budget`` adaptive steps.

    At each step every respondent is asked the best-scoring candidate among those it has
    an answer for and was not asked yet; a respondent with none left is not updated.

    Args:
        model: the belief model.
        criterion: scores candidates (``score_batch``); ``prepare`` is called once here.
        observed: ``LongTensor [B, I]``: what is known for free (e.g. demographics).
        candidates: ``C`` askable items.
        answers: ``LongTensor [B, C]``: each respondent's answer to each candidate
            (``-1`` = did not answer: never asked).
        targets: target items.
        budget: number of steps ``T``.

    Returns:
        ``preds``: ``T + 1`` tensors ``[B, T_targets, O]`` (after 0..T questions) and
        ``asked``: ``LongTensor [B, T]`` the item asked at each step (``-1`` = none left).
    """
    cand = torch.as_tensor(list(candidates), dtype=torch.long)
    tgt = list(targets)
    b = observed.shape[0]
    rows = torch.arange(b)
    avail = answers >= 0
    asked = torch.full((b, budget), MISSING, dtype=torch.long)
    states = model.initial_batch(observed)
    preds = [model.predict_batch(states, tgt)]
    criterion.prepare(model, cand, tgt)
    for step in range(budget):
        has = avail.any(1)
        if not bool(has.any()):
            preds.append(preds[-1])
            continue
        scores = criterion.score_batch(model, states, cand, tgt)
        if scores.shape != (b, len(cand)):
            raise ElicitationError(
                f"criterion {criterion.name!r} returned scores of shape {list(scores.shape)}, "
                f"expected [{b}, {len(cand)}]"
            )
        if bool(torch.isnan(scores[avail]).any()):
            raise ElicitationError(f"criterion {criterion.name!r} returned NaN scores")
        pick = scores.masked_fill(~avail, -math.inf).argmax(1)
        options = torch.where(has, answers[rows, pick], torch.full_like(pick, MISSING))
        items = cand[pick]
        states = model.update_batch(states, items, options)
        avail[rows[has], pick[has]] = False
        asked[has, step] = items[has]
        preds.append(model.predict_batch(states, tgt))
    return preds, asked


def _as_long(a: Any) -> Tensor:
    return torch.as_tensor(a, dtype=torch.long)


def _check_inputs(ds: Dataset, budget: int, methods: Sequence[str], n_runs: int | None) -> None:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise BenchmarkError(f"budget must be an integer >= 0, got {budget!r}")
    if not methods:
        raise BenchmarkError("no benchmark methods given")
    for m in methods:
        get_method(m)
    dup = sorted({m for m in methods if list(methods).count(m) > 1})
    if dup:
        raise BenchmarkError(f"benchmark methods given twice: {', '.join(dup)}")
    if ds.split is None:
        raise BenchmarkError(f"dataset {ds.name!r} has no user split (user_split.json)")
    for part in ("train_users", "test_users"):
        if not ds.split.get(part):
            raise BenchmarkError(f"dataset {ds.name!r}: the split has no {part}")
    if not ds.runs:
        raise BenchmarkError(f"dataset {ds.name!r} has no benchmark runs (runs.csv)")
    if n_runs is not None and (n_runs < 1 or n_runs > len(ds.runs)):
        raise BenchmarkError(f"runs must be between 1 and {len(ds.runs)}, got {n_runs}")
    bank_keys = set(ds.default_keys())
    for r, run in enumerate(ds.runs):
        unknown = sorted((set(run.cand_qids) | set(run.eval_qids)) - bank_keys)
        if unknown:
            raise BenchmarkError(
                f"runs.csv run {r + 1}: items {unknown} are not questions or demographics"
            )
        both = sorted(set(run.cand_qids) & set(run.eval_qids))
        if both:
            raise BenchmarkError(
                f"runs.csv run {r + 1}: items {both} are both candidates and targets"
            )


def _json_safe(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_safe(x) for x in v]
    if isinstance(v, Tensor):
        return _json_safe(v.tolist()) if v.numel() <= 64 else f"<tensor {list(v.shape)}>"
    if isinstance(v, bool | int | str) or v is None:
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    return str(v)


def _scored_users(
    test: Tensor, n_items: int, demo: list[int], cand: list[int], tgt: list[int]
) -> tuple[Tensor, Tensor, Tensor]:
    """The test users with at least one target answer: ``(observed [U, I]`` (their
    demographics, ``-1`` elsewhere), ``answers [U, C]`` to the candidates, ``truth [U, T])``."""
    truth = test[:, tgt]
    users = (truth >= 0).any(1)  # users with at least one scored target
    observed = torch.full((int(users.sum()), n_items), MISSING, dtype=torch.long)
    observed[:, demo] = test[users][:, demo]
    return observed, test[users][:, cand], truth[users]


def _method_entry(
    name: str,
    ctx: FitContext,
    observed: Tensor,
    answers: Tensor,
    truth: Tensor,
    n_opt: Tensor,
    budget: int,
    run_seed: int,
) -> tuple[dict[str, Any], BeliefModel]:
    """One method on one run: its fitted model and the run's entry (the metrics of
    :data:`METRICS` after ``0..budget`` questions, ``[budget + 1]`` each, and the first
    items asked) for the test users ``observed [U, I]`` with ``answers [U, C]`` to the
    run's candidates and ``truth [U, T]`` for its targets."""
    bank, cand, tgt = ctx.item_bank, ctx.candidates, ctx.targets
    method = get_method(name)
    model = method.fit(ctx)
    if method.observe_all:
        obs = observed.clone()
        obs[:, cand] = answers
        p = model.predict_batch(model.initial_batch(obs), tgt)
        preds = [p] * (budget + 1)
        asked = None
    else:
        assert method.criterion is not None
        crit = method.criterion(ctx)
        preds, asked = simulate(model, crit, observed, cand, answers, tgt, budget)
    curves: dict[str, list[float]] = {m: [] for m in METRICS}
    for p in preds:
        means = score_predictions(p, truth, n_opt[tgt]).means()
        for m in METRICS:
            curves[m].append(means[m])
    entry: dict[str, Any] = {
        "seed": run_seed,
        "n_users": int(observed.shape[0]),
        "n_pairs": int((truth >= 0).sum()),
        **curves,
    }
    if asked is not None and asked.shape[1]:
        first = asked[:, 0][asked[:, 0] >= 0]
        if first.numel():
            counts = torch.bincount(first, minlength=bank.n_items)
            entry["most_common_first_item"] = bank.keys[int(counts.argmax())]
            entry["distinct_first_items"] = int((counts > 0).sum())
    return entry, model


def _method_result(
    name: str,
    entries: list[dict[str, Any]],
    info: dict[str, Any],
    seconds: dict[str, float],
    budget: int,
) -> dict[str, Any]:
    """One method's ``result.json`` entry: each metric's curve averaged over the runs'
    ``entries``, the entries themselves, its description, model and fit+run time."""
    res: dict[str, Any] = {}
    for m in METRICS:
        res[m] = [sum(e[m][n] for e in entries) / len(entries) for n in range(budget + 1)]
    res["per_run"] = entries
    res["description"] = get_method(name).description
    res["model"] = info.get(name, {})
    res["seconds"] = round(seconds[name], 3)
    return res


def _protocol(
    train: Tensor,
    val: Tensor,
    test: Tensor,
    runs: Sequence[BenchmarkRun],
    seed: int,
    options: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The ``protocol`` part of ``result.json``: user counts, runs, what the metrics mean."""
    return {
        "train_users": int(train.shape[0]),
        "val_users": int(val.shape[0]),
        "test_users": int(test.shape[0]),
        "runs": [r.seed for r in runs],
        "index": "number of questions asked (0..budget)",
        "brier_mean": "squared error averaged over the item's options",
        "brier_sum": "squared error summed over the item's options",
        "log_loss": "nats, probability floored at 1e-12",
        "seed": seed,
        "fit_options": options,
    }


def run_individual(
    dataset: Dataset | str | Path,
    budget: int,
    methods: Sequence[str] | None = None,
    *,
    n_runs: int | None = None,
    seed: int = 0,
    progress: bool = True,
    fit_options: Mapping[str, Mapping[str, Any]] | None = None,
    cache: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the individual benchmark and return the ``result.json`` object.

    Args:
        dataset: a loaded :class:`Dataset` or its folder.
        budget: ``T``, the most questions asked per test user.
        methods: method names (default: ``default, random, fixed, irt, full``).
        n_runs: use the first ``n_runs`` runs of ``runs.csv`` (default: all).
        seed: seed of the fits shared by all runs.
        progress: show a tqdm progress bar on stderr.
        fit_options: keyword arguments per fit (see :class:`FitContext` ``options``),
            e.g. a shorter list of class numbers for a quick run.
        cache: the fit cache (:meth:`FitContext.cached`); pass the same dict to a later
            pass over the same dataset and seed (e.g. ``cape_measures``) to reuse the fits.

    Returns:
        ``{"dataset", "budget", "methods": {name: {"accuracy": [T+1], "log_loss",
        "brier_mean", "brier_sum", "per_run": [...], ...}}, "protocol": {...}}``; index
        ``n`` of a curve is the metric after ``n`` questions, averaged over the runs.

    Raises:
        BenchmarkError: bad budget, unknown method, a dataset without split or runs.
        DatasetError: the dataset folder is invalid.
    """
    ds = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
    methods = list(DEFAULT_METHODS if methods is None else methods)
    _check_inputs(ds, budget, methods, n_runs)
    runs = ds.runs[: n_runs or len(ds.runs)]
    bank = ds.item_bank()
    assert ds.split is not None
    train = _as_long(ds.matrix(users=ds.split["train_users"]))
    val = _as_long(ds.matrix(users=ds.split.get("val_users", [])))
    test = _as_long(ds.matrix(users=ds.split["test_users"]))
    if val.numel() == 0:
        val = val.reshape(0, bank.n_items)
    demo = bank.indices(ds.demographics)
    n_opt = torch.tensor(bank.n_options, dtype=torch.long)
    cache = {} if cache is None else cache
    options = {k: dict(v) for k, v in (fit_options or {}).items()}
    per_method: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    info: dict[str, Any] = {}
    seconds = dict.fromkeys(methods, 0.0)
    bar = tqdm(
        total=len(runs) * len(methods),
        desc=f"bench {ds.name}",
        disable=not progress,
        unit="fit+run",
    )
    try:
        for run in runs:
            cand = bank.indices(run.cand_qids)
            tgt = bank.indices(run.eval_qids)
            observed, answers, truth_u = _scored_users(test, bank.n_items, demo, cand, tgt)
            ctx = FitContext(
                bank,
                train,
                val,
                demo,
                cand,
                tgt,
                seed=run.seed,
                base_seed=seed,
                cache=cache,
                options=options,
            )
            for name in methods:
                bar.set_postfix_str(f"run {run.seed} {name}")
                t0 = time.perf_counter()
                entry, model = _method_entry(
                    name, ctx, observed, answers, truth_u, n_opt, budget, run.seed
                )
                per_method[name].append(entry)
                info.setdefault(
                    name, {"family": model.family, "metrics": _json_safe(model.metrics)}
                )
                seconds[name] += time.perf_counter() - t0
                bar.update(1)
    finally:
        bar.close()

    out: dict[str, Any] = {"dataset": ds.name, "budget": budget, "methods": {}}
    for name in methods:
        out["methods"][name] = _method_result(name, per_method[name], info, seconds, budget)
    out["protocol"] = _protocol(train, val, test, runs, seed, options)
    return _json_safe(out)


__all__ = ["DEFAULT_METHODS", "method_names", "run_individual", "simulate"]
