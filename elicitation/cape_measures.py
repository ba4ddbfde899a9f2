"""CAPE measures over a benchmark result, and the CAPE benchmark's command line.

* CAPE measures (docs/methods.md §2): ``questions_to_90pct`` — the questions a
  method needs to reach 90% of the log-loss gain of answering every candidate (its own
  model with all answered candidates observed), and ``adaptivity`` — among pairs of users
  asked the same first question who answered it differently, the share whose second
  question differed (CAPE reports 39-62%; a non-adaptive order scores 0).

``python -m elicitation.cape_measures`` runs the individual protocol with these measures
(optionally in slices of runs, merged with ``merge``).

Pure: no web framework, database or settings imports.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from elicitation import model_choice
from elicitation.bench.individual import run_individual, simulate
from elicitation.bench.methods import FitContext, get_method
from elicitation.bench.metrics import METRICS, score_predictions
from elicitation.bench.report import auto_vs_best, markdown_tables
from elicitation.datasets import Dataset, load_dataset
from elicitation.errors import BenchmarkError
from elicitation.model_choice import CAPE_FAMILIES
from models.base import MISSING, BeliefModel

__all__ = [
    "adaptivity_counts",
    "all_candidates_log_loss",
    "cape_measures",
    "merge_results",
    "questions_to_fraction",
    "run_with_cape_measures",
]


def questions_to_fraction(
    curve: Sequence[float], reference: float, fraction: float = 0.9
) -> int | None:
    """Fewest questions ``n`` with ``curve[0] - curve[n] >= fraction * (curve[0] - reference)``.

    Args:
        curve: log loss after ``0..T`` questions.
        reference: log loss with every candidate answered (the full gain).
        fraction: share of the full gain to reach.

    Returns:
        ``n``; ``0`` when answering everything gains nothing; ``None`` when the budget
        ``T`` is not enough.
    """
    if not curve:
        raise ValueError("questions_to_fraction: empty curve")
    gain = curve[0] - reference
    if not math.isfinite(gain) or gain <= 0:
        return 0
    for n, value in enumerate(curve):
        if curve[0] - value >= fraction * gain - 1e-12:
            return n
    return None


def adaptivity_counts(asked: Tensor, answers: Tensor, candidates: Sequence[int]) -> tuple[int, int]:
    """Pairs of users with the same first question and different answers to it.

    Args:
        asked: ``LongTensor [B, T]`` item asked at each step (``-1`` = none), ``T >= 2``.
        answers: ``LongTensor [B, C]`` each user's answer to each candidate.
        candidates: the ``C`` candidate items (column order of ``answers``).

    Returns:
        ``(differ, pairs)``: ``pairs`` = pairs asked the same first item with different
        answers to it (both asked a second question); ``differ`` = those whose second
        items differ. ``adaptivity = differ / pairs``.
    """
    if asked.shape[1] < 2:
        return 0, 0
    pos = {int(c): k for k, c in enumerate(candidates)}
    ok = (asked[:, 0] >= 0) & (asked[:, 1] >= 0)
    first, second = asked[ok, 0], asked[ok, 1]
    col = torch.tensor([pos[int(i)] for i in first.tolist()], dtype=torch.long)
    ans = answers[ok].gather(1, col.unsqueeze(1)).squeeze(1) if col.numel() else col
    pairs = same_second = 0
    for item in torch.unique(first).tolist():
        m = first == item
        a, s = ans[m], second[m]
        n = int(m.sum())
        n_same_answer = sum(int(c) ** 2 for c in torch.unique(a, return_counts=True)[1])
        pairs += (n * n - n_same_answer) // 2
        for sec in torch.unique(s).tolist():
            ms = s == sec
            k = int(ms.sum())
            k_same = sum(int(c) ** 2 for c in torch.unique(a[ms], return_counts=True)[1])
            same_second += (k * k - k_same) // 2
    return pairs - same_second, pairs


def all_candidates_log_loss(
    model: BeliefModel,
    observed: Tensor,
    candidates: Sequence[int],
    answers: Tensor,
    targets: Sequence[int],
    truth: Tensor,
    n_options: Tensor,
) -> float:
    """Target log loss of ``model`` with every answered candidate observed."""
    obs = observed.clone()
    obs[:, list(candidates)] = answers
    pred = model.predict_batch(model.initial_batch(obs), list(targets))
    return score_predictions(pred, truth, n_options).means()["log_loss"]


def cape_measures(
    dataset: Dataset | str | Path,
    result: dict[str, Any],
    *,
    n_runs: int | None = None,
    seed: int = 0,
    cache: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """``questions_to_90pct`` and ``adaptivity`` for each method of a ``result.json``.

    Recomputes, per run, each method's model with every candidate observed (the
    reference of ``questions_to_90pct``) and a 2-question replay (for ``adaptivity``) —
    the same protocol and fits as :func:`~elicitation.bench.individual.run_individual`
    (fits come from ``cache`` when the benchmark's fit cache is passed, else they are
    rebuilt; CAPE and latent-class fits are deterministic given the seed).

    Returns:
        ``{method: {"questions_to_90pct": int | None, "log_loss_all_candidates": float,
        "adaptivity": float | None, "adaptivity_pairs": int}}`` (``full`` is skipped).
    """
    ds = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
    if ds.split is None or not ds.runs:
        raise BenchmarkError(f"dataset {ds.name!r} needs a user split and runs")
    bank = ds.item_bank()
    train = torch.as_tensor(ds.matrix(users=ds.split["train_users"]), dtype=torch.long)
    val = torch.as_tensor(ds.matrix(users=ds.split.get("val_users", [])), dtype=torch.long)
    val = val.reshape(-1, bank.n_items)
    test = torch.as_tensor(ds.matrix(users=ds.split["test_users"]), dtype=torch.long)
    demo = bank.indices(ds.demographics)
    n_opt = torch.tensor(bank.n_options, dtype=torch.long)
    cache = {} if cache is None else cache  # the benchmark's own fit cache, when given
    acc: dict[str, dict[str, Any]] = {}
    runs = ds.runs[: n_runs or len(ds.runs)]
    for run in runs:
        cand, tgt = bank.indices(run.cand_qids), bank.indices(run.eval_qids)
        truth = test[:, tgt]
        users = (truth >= 0).any(1)
        observed = torch.full((int(users.sum()), bank.n_items), MISSING, dtype=torch.long)
        observed[:, demo] = test[users][:, demo]
        answers = test[users][:, cand]
        ctx = FitContext(
            bank, train, val, demo, cand, tgt, seed=run.seed, base_seed=seed, cache=cache
        )
        for name in result["methods"]:
            method = get_method(name)
            if method.observe_all or method.criterion is None:
                continue
            model = method.fit(ctx)
            a = acc.setdefault(name, {"ref": [], "differ": 0, "pairs": 0})
            a["ref"].append(
                all_candidates_log_loss(
                    model, observed, cand, answers, tgt, truth[users], n_opt[tgt]
                )
            )
            _, asked = simulate(model, method.criterion(ctx), observed, cand, answers, tgt, 2)
            differ, pairs = adaptivity_counts(asked, answers, cand)
            a["differ"] += differ
            a["pairs"] += pairs
    out: dict[str, dict[str, Any]] = {}
    for name, a in acc.items():
        ref = sum(a["ref"]) / len(a["ref"])
        out[name] = {
            "questions_to_90pct": questions_to_fraction(result["methods"][name]["log_loss"], ref),
            "log_loss_all_candidates": ref,
            "adaptivity": a["differ"] / a["pairs"] if a["pairs"] else None,
            "adaptivity_pairs": a["pairs"],
        }
    return out




def run_with_cape_measures(
    dataset: str | Path,
    budget: int,
    methods: Sequence[str],
    *,
    n_runs: int | None = None,
    seed: int = 0,
    progress: bool = True,
    first_run: int = 0,
) -> dict[str, Any]:
    """``run_individual`` plus :func:`cape_measures` merged into each method's entry;
    ``first_run`` skips the runs before it (``n_runs`` then counts from it)."""
    ds = load_dataset(dataset)
    if first_run:  # a later slice of runs.csv (to split a long benchmark; see ``merge``)
        ds = dataclasses.replace(ds, runs=ds.runs[first_run:])
    fits: dict[str, Any] = {}
    result = run_individual(
        ds, budget, list(methods), n_runs=n_runs, seed=seed, progress=progress, cache=fits
    )
    for name, extra in cape_measures(ds, result, n_runs=n_runs, seed=seed, cache=fits).items():
        result["methods"][name].update(extra)
    return result


def merge_results(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One ``result.json`` from parts of the same protocol: different methods, and/or
    different runs of a method (``--first-run``), combined exactly.

    A method found in several parts gets its runs concatenated; its curves are the mean
    over all runs (each run weighted equally, as in ``run_individual``),
    ``log_loss_all_candidates`` the run-weighted mean, ``adaptivity`` the pooled share of
    pairs and ``questions_to_90pct`` recomputed from the merged curve.

    Raises:
        BenchmarkError: the parts differ in dataset or budget, a run of a method appears
            twice, or the methods do not end up with the same runs.
    """
    if not parts:
        raise BenchmarkError("merge: no results given")
    first = parts[0]
    by_method: dict[str, list[tuple[list[int], Mapping[str, Any]]]] = {}
    for part in parts:
        for key in ("dataset", "budget"):
            if part[key] != first[key]:
                raise BenchmarkError(f"merge: {key} differs ({part[key]!r} vs {first[key]!r})")
        for name, res in part["methods"].items():
            by_method.setdefault(name, []).append((list(part["protocol"]["runs"]), res))
    out: dict[str, Any] = {k: v for k, v in first.items() if k not in ("methods", "protocol")}
    out["methods"] = {}
    out["auto_choices"] = [c for part in parts for c in part.get("auto_choices", [])]
    all_runs: list[int] | None = None
    for name, pieces in by_method.items():
        runs = [r for rs, _ in pieces for r in rs]
        if len(set(runs)) != len(runs):
            raise BenchmarkError(f"merge: method {name!r} has a run twice")
        order = sorted(runs)
        if all_runs is None:
            all_runs = order
        elif order != all_runs:
            raise BenchmarkError(f"merge: method {name!r} has runs {order}, others {all_runs}")
        if len(pieces) == 1:
            out["methods"][name] = dict(pieces[0][1])
            continue
        res = dict(pieces[0][1])
        entries = sorted((e for _, r in pieces for e in r["per_run"]), key=lambda e: int(e["seed"]))
        n = len(entries)
        for m in METRICS:
            res[m] = [sum(e[m][t] for e in entries) / n for t in range(len(entries[0][m]))]
        res["per_run"] = entries
        res["seconds"] = round(sum(float(r.get("seconds", 0.0)) for _, r in pieces), 3)
        if all("log_loss_all_candidates" in r for _, r in pieces):
            ref = sum(len(rs) * r["log_loss_all_candidates"] for rs, r in pieces) / n
            pairs = sum(int(r.get("adaptivity_pairs", 0)) for _, r in pieces)
            differ = sum(
                (r.get("adaptivity") or 0.0) * int(r.get("adaptivity_pairs", 0)) for _, r in pieces
            )
            res["log_loss_all_candidates"] = ref
            res["adaptivity_pairs"] = pairs
            res["adaptivity"] = differ / pairs if pairs else None
            res["questions_to_90pct"] = questions_to_fraction(res["log_loss"], ref)
        out["methods"][name] = res
    out["protocol"] = {**first["protocol"], "runs": all_runs}
    return out


def _merge_main(argv: Sequence[str]) -> int:
    """``python -m elicitation.cape_measures merge A.json B.json ... --out FILE [--plot PNG]``."""
    from elicitation.bench.plot import plot_curves  # matplotlib: heavy, only for --plot

    p = argparse.ArgumentParser(description=_merge_main.__doc__)
    p.add_argument("parts", nargs="+", type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    merged = merge_results([json.loads(f.read_text(encoding="utf-8")) for f in args.parts])
    args.out.write_text(json.dumps(merged, indent=1), encoding="utf-8")
    if args.plot is not None:
        plot_curves(merged, args.plot)
    print(markdown_tables(merged, budgets=range(int(merged["budget"]) + 1)))
    if "auto" in merged["methods"]:
        print(auto_vs_best(merged, "log_loss"))
        print(auto_vs_best(merged, "accuracy"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m elicitation.cape_measures --dataset DIR --budget T --out FILE [--methods a,b]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        return _merge_main(argv[1:])
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--dataset", required=True, type=Path)
    p.add_argument("--budget", type=int, default=10)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--methods", default="default,random,fixed,irt,full," + ",".join((*CAPE_FAMILIES, "auto"))
    )
    p.add_argument("--runs", type=int, default=None)
    p.add_argument("--first-run", type=int, default=0, help="skip the runs before this index")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--fit-cache", type=Path, default=None, help="store / reuse fits here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_choice.FIT_CACHE_DIR = args.fit_cache
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    result = run_with_cape_measures(
        args.dataset, args.budget, methods, n_runs=args.runs, first_run=args.first_run
    )
    result["auto_choices"] = [
        {
            "seed": c["seed"],
            "chosen": c["chosen"],
            "mean_log_loss": {r["name"]: r["mean_log_loss"] for r in c["table"]},
        }
        for key, m in model_choice.fitted_models()
        if key[0] == "auto"
        for c in [m.metrics.get("auto_table", {})]
        if c
    ]
    args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(markdown_tables(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
