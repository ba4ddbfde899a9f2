"""How close can a study get to ``full_history`` after N arrivals, whatever it asks them?

    python scripts/lifecycle_ceiling.py --dataset datasets/ces --arrivals 800 --runs 3

The lifecycle benchmark (docs/benchmarks.md, "priorly bench lifecycle") asks that after
800 arrivals the live study be within 0.01 nats of ``full_history``, the latent classes
fitted on every training user's complete answers. This script bounds what any question
policy can reach with N arrivals: for each run of ``runs.csv`` it draws N of the training
and validation users (seeded by the run) and fits the same latent classes
(``models.latent_class.fit_latent_classes``, classes chosen on a selection part) on

* ``complete``: all their answers to the run's items (as if every arrival answered every
  candidate and target), split as the product's refit splits live respondents (65%
  training, 15% selection; the 20% the product holds out for promotion are left out);
* ``complete_all``: the same complete answers with nothing held out (85% training, 15%
  selection): what any question policy could reach with these N users under any split;
* ``random<k>``: the same users with only ``k`` of the run's items each, drawn at random
  (``--answers``, default 10: what a 10-question session gives, calibrated at random);

and scores the test users as ``bench individual``'s ``default`` does (``eig_anchored``,
after 0..``--budget`` questions), next to ``full_history`` itself. It prints the mean
target log loss after ``--budget`` questions and the paired gap to ``full_history``
(mean and SE over the runs), and writes the per-run curves with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

import torch

from elicitation.bench.individual import _as_long, _scored_users, simulate
from elicitation.bench.methods import DEFAULT_DELTA
from elicitation.bench.metrics import score_predictions
from elicitation.criteria import get_criterion
from elicitation.datasets import load_dataset
from models.base import MISSING
from models.latent_class import fit_latent_classes

TRAIN_SHARE, SELECTION_SHARE = 0.65, 0.15
"""The product's split of live respondents (app.services.learning: 20% held out)."""


def _keep(x: torch.Tensor, cols: list[int]) -> torch.Tensor:
    out = torch.full_like(x, MISSING)
    out[:, cols] = x[:, cols]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, type=Path)
    p.add_argument("--arrivals", type=int, default=800)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--answers", type=int, default=10)
    p.add_argument("--budget", type=int, default=10)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    ds = load_dataset(args.dataset)
    assert ds.split is not None
    bank = ds.item_bank()
    demo = bank.indices(ds.demographics)
    train = _as_long(ds.matrix(users=ds.split["train_users"]))
    val = _as_long(ds.matrix(users=ds.split["val_users"]))
    test = _as_long(ds.matrix(users=ds.split["test_users"]))
    arriving = torch.cat([train, val])
    n = args.arrivals
    if not 0 < n <= arriving.shape[0]:
        raise SystemExit(f"--arrivals must be between 1 and {arriving.shape[0]}, got {n}")
    n_tr, n_sel = int(TRAIN_SHARE * n), int(SELECTION_SHARE * n)
    n_opt = torch.tensor(bank.n_options)
    curves: dict[str, list[list[float]]] = {}
    for run in ds.runs[: args.runs]:
        cand, tgt = bank.indices(run.cand_qids), bank.indices(run.eval_qids)
        order = torch.randperm(arriving.shape[0], generator=torch.Generator().manual_seed(run.seed))
        drawn = arriving[order[:n]]
        complete = _keep(drawn, demo + cand + tgt)
        sparse = _keep(drawn, demo)
        for i in range(n):
            pick = random.Random(run.seed * 1_000_003 + i).sample(cand + tgt, args.answers)
            sparse[i, pick] = drawn[i, pick]
        fits = {
            "full_history": (train, val),
            "complete": (complete[:n_tr], complete[n_tr : n_tr + n_sel]),
            "complete_all": (complete[: n - n_sel], complete[n - n_sel :]),
            f"random{args.answers}": (sparse[:n_tr], sparse[n_tr : n_tr + n_sel]),
        }
        observed, answers, truth = _scored_users(test, bank.n_items, demo, cand, tgt)
        for name, (tr, sel) in fits.items():
            model = fit_latent_classes(tr, bank, val_responses=sel, seed=0)
            crit = get_criterion("eig_anchored", delta=DEFAULT_DELTA, seed=run.seed)
            preds, _ = simulate(model, crit, observed, cand, answers, tgt, args.budget)
            ll = [float(score_predictions(q, truth, n_opt[tgt]).means()["log_loss"]) for q in preds]
            curves.setdefault(name, []).append(ll)
            print(f"run {run.seed} {name}: {ll[-1]:.4f}", file=sys.stderr, flush=True)
    full = [c[-1] for c in curves["full_history"]]
    print(f"{ds.name}, {n} arrivals, {args.runs} runs: log loss after {args.budget} questions")
    print("| fit | log loss | gap to full_history (SE) |")
    print("| --- | --- | --- |")
    for name, runs in curves.items():
        last = [c[-1] for c in runs]
        d = [a - b for a, b in zip(last, full, strict=True)]
        mean = sum(d) / len(d)
        se = (
            math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
            if len(d) > 1
            else 0.0
        )
        print(f"| {name} | {sum(last) / len(last):.4f} | {mean:+.4f} ({se:.4f}) |")
    if args.out is not None:
        args.out.write_text(
            json.dumps({"dataset": ds.name, "arrivals": n, "curves": curves}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
