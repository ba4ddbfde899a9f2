"""Time one live selection step of the load-test study's model, per criterion.

The step the answer call runs in the server (``elicitation.session.decide``) with the CES
demo's fitted model (the one ``scripts/loadtest`` caches in ``var/cache/loadtest/``), the
candidates and targets of run 0 of ``datasets/ces/runs.csv``, simulated respondents drawn
from the model, one torch thread. Prints p50 / mean / p99 thread-CPU milliseconds of a
``decide`` per criterion (steps after the first of each respondent, as in a session after
its cached first decision). Used for the session-5 figures in docs/reliability.md.

    python scripts/step_microbench.py [--model var/cache/loadtest/model-<hash>.bin]
        [--criteria eig,eig_anchored] [--respondents 40]
"""

from __future__ import annotations

import argparse
import ast
import csv
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import models  # noqa: E402,F401  (registers the model families)
from elicitation.budget import Budget  # noqa: E402
from elicitation.criteria import get_criterion  # noqa: E402
from elicitation.session import decide  # noqa: E402
from models.base import load_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--dataset", type=Path, default=REPO / "datasets" / "ces")
    parser.add_argument("--criteria", default="eig,eig_anchored")
    parser.add_argument("--respondents", type=int, default=40)
    parser.add_argument("--questions", type=int, default=10)
    args = parser.parse_args()
    path = args.model
    if path is None:
        found = sorted((REPO / "var" / "cache" / "loadtest").glob("model-*.bin"))
        if not found:
            raise SystemExit(
                "no cached load-test model in var/cache/loadtest/: run scripts/loadtest once "
                "first, or give --model"
            )
        path = found[-1]
    torch.set_num_threads(1)
    model = load_model(path.read_bytes())
    keys = list(model.item_bank.keys)
    with open(args.dataset / "runs.csv", newline="", encoding="utf-8") as fh:
        run = next(csv.DictReader(fh))
    cand = [keys.index(q) for q in ast.literal_eval(run["cand_qids"])]
    tgt = [keys.index(q) for q in ast.literal_eval(run["eval_qids"])]
    print(f"{path.name}: {model.n_personas} classes, {len(cand)} candidates, {len(tgt)} targets")
    gen = torch.Generator().manual_seed(0)
    prior = model.log_prior.exp()
    for name in args.criteria.split(","):
        crit = get_criterion(name)
        crit.prepare(model, cand, tgt)  # a live study stores the fixed order with its model
        budget = Budget(max_questions=args.questions)
        times: list[float] = []
        for _ in range(args.respondents):
            theta = int(torch.multinomial(prior, 1, generator=gen))
            state, asked = model.initial_state(), []
            for step in range(args.questions):
                t0 = time.thread_time()
                d = decide(
                    model,
                    state,
                    asked=asked,
                    candidates=cand,
                    targets=tgt,
                    criterion=crit,
                    budget=budget,
                )
                if step:
                    times.append(time.thread_time() - t0)
                if d.item is None:
                    break
                y = int(torch.multinomial(model.mu[theta, d.item], 1, generator=gen))
                state = model.update(state, d.item, y)
                asked.append(d.item)
        times.sort()
        ms = [t * 1000 for t in times]
        print(
            f"{name}: decide CPU ms p50 {ms[len(ms) // 2]:.3f} mean {sum(ms) / len(ms):.3f} "
            f"p99 {ms[int(0.99 * (len(ms) - 1))]:.3f} ({len(ms)} steps)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
