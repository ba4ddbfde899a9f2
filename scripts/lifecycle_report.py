"""Markdown report of `priorly bench lifecycle` result files (the tables of
docs/benchmarks.md, "priorly bench lifecycle").

    python scripts/lifecycle_report.py docs/bench/lifecycle_ces.json [...] [--questions 10]

For each file: every method's target log loss after ``--questions`` questions (default:
the file's budget) at each arrival count, mean ± SE over the runs; then the benchmark's
four criteria, each from the paired differences over the runs (``d_r`` = one run's
difference, ``SE = sd(d) / sqrt(R)``; "beyond noise" = ``mean(d) > 2 SE``):

* **falls**: ``default``'s mean log loss decreases from each arrival count to the next;
* **below uniform from 50**: ``default`` − ``uniform`` < 0 at every count >= 50;
* **never worse than fixed from 200**: ``default`` − ``fixed`` is not above 2 SE at any
  count >= 200;
* **within 0.01 of full_history at the last count**: ``default`` − ``full_history``
  <= 0.01.

``full_history`` has one curve per run, repeated at every count (its runs are the same
seeds as the other methods', so the differences are paired).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

FULL_GAP = 0.01
"""The largest gap to ``full_history`` at the last arrival count that meets the criterion."""


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of ``a - b`` over runs and its standard error (0 with one run).

    Example: ``paired([1.0, 2.0], [0.5, 1.0])`` is ``(0.75, 0.25)``."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    n = len(d)
    mean = sum(d) / n
    if n < 2:
        return mean, 0.0
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    return mean, sd / math.sqrt(n)


def curve(result: dict[str, Any], method: str, a: int, n: int) -> list[float]:
    """Per-run log loss of ``method`` after ``arrivals[a]`` arrivals and ``n`` questions."""
    return [r["log_loss"][a][n] for r in result["methods"][method]["per_run"]]


def _mean_se(values: list[float]) -> str:
    m, se = paired(values, [0.0] * len(values))
    return f"{m:.4f} ± {se:.4f}"


def criteria(result: dict[str, Any], n: int) -> dict[str, Any]:
    """The four criteria of the module docstring after ``n`` questions: ``{"falls",
    "below_uniform", "not_worse_than_fixed", "near_full_history"}`` (each a bool) and
    the paired figures they come from."""
    arrivals = result["arrivals"]
    means = [sum(curve(result, "default", a, n)) / len(curve(result, "default", a, n))
             for a in range(len(arrivals))]  # fmt: skip
    uni = [paired(curve(result, "default", a, n), curve(result, "uniform", a, n))
           for a in range(len(arrivals))]  # fmt: skip
    fix = [paired(curve(result, "default", a, n), curve(result, "fixed", a, n))
           for a in range(len(arrivals))]  # fmt: skip
    last = len(arrivals) - 1
    full = paired(curve(result, "default", last, n), curve(result, "full_history", last, n))
    return {
        "falls": all(b < a for a, b in zip(means, means[1:], strict=False)),
        "below_uniform": all(uni[a][0] < 0 for a, c in enumerate(arrivals) if c >= 50),
        "not_worse_than_fixed": all(
            fix[a][0] <= 2 * fix[a][1] for a, c in enumerate(arrivals) if c >= 200
        ),
        "near_full_history": full[0] <= FULL_GAP,
        "means": means,
        "uniform": uni,
        "fixed": fix,
        "full_history": full,
    }


def is_lifecycle_result(result: object) -> bool:
    """Whether ``result`` (a parsed JSON file) has the keys of a lifecycle result:
    ``budget``, ``arrivals`` and ``methods.default``."""
    return (
        isinstance(result, dict)
        and {"budget", "arrivals", "methods"} <= result.keys()
        and isinstance(result["methods"], dict)
        and "default" in result["methods"]
    )


def report(path: Path, n: int | None = None) -> str:
    """The Markdown tables of one result file."""
    result = json.loads(path.read_text())
    n = result["budget"] if n is None else n
    arrivals = result["arrivals"]
    proto = result.get("protocol", {})
    runs = len(result["methods"]["default"]["per_run"])
    lines = [
        f"### {result['dataset']}: {path.name}",
        "",
        f"{runs} runs; calibration_items {proto.get('calibration_items')}, "
        f"calibration_min_answers {proto.get('calibration_min_answers', 'n/a')}; "
        f"target log loss after {n} questions, mean ± SE over the runs",
        "",
        "| method | " + " | ".join(str(a) for a in arrivals) + " |",
        "| --- |" + " --- |" * len(arrivals),
    ]
    for m in result["methods"]:
        cells = [_mean_se(curve(result, m, a, n)) for a in range(len(arrivals))]
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    c = criteria(result, n)

    def pair(p: tuple[float, float]) -> str:
        return f"{p[0]:+.4f} ({p[1]:.4f})"

    yes = {True: "yes", False: "no"}
    lines += [
        "",
        "| criterion | figures (paired mean difference, SE) | met |",
        "| --- | --- | --- |",
        "| falls as respondents arrive | "
        + " → ".join(f"{v:.4f}" for v in c["means"])
        + f" | {yes[c['falls']]} |",
        "| below `uniform` from 50 | "
        + " / ".join(pair(p) for p, a in zip(c["uniform"], arrivals, strict=True) if a >= 50)
        + f" | {yes[c['below_uniform']]} |",
        "| never worse than `fixed` beyond 2 SE from 200 | "
        + " / ".join(pair(p) for p, a in zip(c["fixed"], arrivals, strict=True) if a >= 200)
        + f" | {yes[c['not_worse_than_fixed']]} |",
        f"| within {FULL_GAP} of `full_history` at {arrivals[-1]} | {pair(c['full_history'])} "
        f"| {yes[c['near_full_history']]} |",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="priorly bench lifecycle JSON files")
    p.add_argument("--questions", type=int, help="questions asked (default: the budget)")
    args = p.parse_args(argv)
    results = []
    for f in args.files:
        if not f.is_file():
            p.error(f"no such result file: {f}")
        if not is_lifecycle_result(json.loads(f.read_text())):
            # a glob such as docs/bench/lifecycle_*.json also matches the ceiling files
            print(f"skipped {f}: not a priorly bench lifecycle result", file=sys.stderr)
            continue
        results.append(report(f, args.questions))
    print("\n".join(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
