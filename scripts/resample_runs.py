"""Copy a dataset folder with new benchmark runs: other study designs on the same answers.

    python scripts/resample_runs.py --dataset datasets/ces --out /tmp/alt/ces [--seed 1000] [--runs 10]

The published protocol's `runs.csv` fixes, per run, the candidate questions (`cand_qids`)
and the targets (`eval_qids`). A selection rule chosen on those runs may fit them; new
runs drawn the same way (the questions that appear in any run, shuffled per run with
`random.Random(seed + i)`, the first `len(cand_qids)` as candidates and the next
`len(eval_qids)` as targets, sizes from the first run) give designs that were not seen.
Run `i` gets benchmark seed `100 + i`. The users, answers and splits are unchanged.
"""

from __future__ import annotations

import argparse
import ast
import csv
import random
import shutil
import sys
from pathlib import Path


def read_runs(path: Path) -> list[tuple[list[str], list[str]]]:
    """``[(cand_qids, eval_qids)]`` of a runs.csv."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: no runs")
    out = []
    for n, row in enumerate(rows, start=2):
        try:
            cand, tgt = ast.literal_eval(row["cand_qids"]), ast.literal_eval(row["eval_qids"])
        except (KeyError, ValueError, SyntaxError) as exc:
            raise ValueError(
                f"{path}, line {n}: cand_qids / eval_qids unreadable ({exc})"
            ) from None
        out.append(([str(q) for q in cand], [str(q) for q in tgt]))
    return out


def resample(
    runs: list[tuple[list[str], list[str]]], seed: int, n_runs: int
) -> list[tuple[int, list[str], list[str]]]:
    """``n_runs`` new ``(seed, cand_qids, eval_qids)`` from the questions of ``runs``."""
    questions = sorted({q for cand, tgt in runs for q in (*cand, *tgt)})
    n_cand, n_eval = len(runs[0][0]), len(runs[0][1])
    if n_cand + n_eval > len(questions):
        raise ValueError(f"{n_cand} candidates + {n_eval} targets > {len(questions)} questions")
    out = []
    for i in range(n_runs):
        order = questions[:]
        random.Random(seed + i).shuffle(order)
        out.append((100 + i, order[:n_cand], order[n_cand : n_cand + n_eval]))
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args(argv)
    src = args.dataset / "runs.csv"
    if not src.is_file():
        print(f"error: {src} does not exist", file=sys.stderr)
        return 2
    try:
        new = resample(read_runs(src), args.seed, args.runs)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out.exists():
        print(f"error: {args.out} exists", file=sys.stderr)
        return 2
    shutil.copytree(args.dataset, args.out)
    with (args.out / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seed", "cand_qids", "eval_qids"])
        for s, cand, tgt in new:
            w.writerow([s, repr(cand), repr(tgt)])
    print(f"wrote {args.out} ({args.runs} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
