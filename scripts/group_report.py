"""Markdown report of `priorly bench group` result files (the tables of docs/group.md §4).

    python scripts/group_report.py docs/group/s8-ces_10.json[:0.785,0.787,0.788,0.789,0.790] ...

For each file (one dataset and respondent budget): every method's target accuracy after
rounds 0..4, Brier and perplexity after the last round and the mean planning seconds per
round; `default` against each other method at rounds 1..R (`>` strictly better, `=`
equal, `<` worse) and, where it is not ahead everywhere, the paired difference over the
runs (mean, paired t, runs ahead / behind); the relative gain after the last round over
the strongest of the paper's baselines; and, when reference accuracies follow the path
after a colon, whether `default` is above them at every round after round 0.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

PAPER = ("random_random", "greedy_random", "greedy_random_selfimpute", "greedy_relational_gnn")


def paired(a: list[float], b: list[float]) -> tuple[float, float, int, int]:
    """Mean of ``a - b``, its paired t statistic, runs with ``a > b`` and ``a < b``."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    t = (
        mean / (sd / math.sqrt(n))
        if sd > 0
        else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    )
    return mean, t, sum(x > 0 for x in d), sum(x < 0 for x in d)


def report(path: Path, reference: list[float] | None) -> str:
    d = json.loads(path.read_text())
    methods = d["methods"]
    rounds = int(d["rounds"])
    out = [
        f"**{d['dataset']}, respondent budget {d['respondent_budget']}** "
        f"({d['respondents_per_round']} of {d['n_test_members']} test members per round, "
        f"mean of {d['n_runs']} runs; `{path.name}`)",
        "",
        "| method | "
        + " | ".join(f"acc r{r}" for r in range(rounds + 1))
        + f" | Brier r{rounds} | ppl r{rounds} | plan s/round |",
        "|---" * (rounds + 5) + "|",
    ]
    for name, m in methods.items():
        plan = m.get("plan_seconds") or [0.0]
        label = f"**{name}**" if name == "default" else name
        out.append(
            f"| {label} | "
            + " | ".join(f"{a:.4f}" for a in m["accuracy"])
            + f" | {m['brier_sum'][-1]:.4f} | {m['perplexity'][-1]:.4f}"
            + f" | {sum(plan) / len(plan):.2f} |"
        )
    if reference:
        out.append(
            "| reference: latent classes, greedy, random respondents | "
            + " | ".join(f"{a:.3f}" for a in reference)
            + " | | | |"
        )
    out.append("")
    if "default" not in methods:
        return "\n".join(out)
    dflt = methods["default"]
    marks, behind = [], []
    for name, m in methods.items():
        if name == "default":
            continue
        s = ""
        for r in range(1, rounds + 1):
            a, b = dflt["accuracy"][r], m["accuracy"][r]
            s += ">" if a > b else ("=" if a == b else "<")
        marks.append(f"{name}: {s}")
        if "<" in s or "=" in s:
            cells = []
            for r in range(1, rounds + 1):
                mean, t, up, down = paired(
                    [x[r] for x in dflt["accuracy_runs"]], [x[r] for x in m["accuracy_runs"]]
                )
                cells.append(f"r{r} {mean:+.4f} (t {t:+.1f}, {up}/{down})")
            behind.append(f"* default − {name}: " + "; ".join(cells))
    out.append(
        f"default vs each method, accuracy at rounds 1..{rounds} (`>` strictly better, "
        "`=` equal, `<` worse): " + "; ".join(marks)
    )
    out.append("")
    if behind:
        out.append(
            "Paired over the runs where default is not ahead in every round "
            "(mean difference, paired t, runs ahead / behind):"
        )
        out.append("")
        out.extend(behind)
        out.append("")
    line = []
    paper = [n for n in PAPER if n in methods]
    if paper:
        best = max(paper, key=lambda n: methods[n]["accuracy"][-1])
        b = methods[best]["accuracy"][-1]
        gain = (dflt["accuracy"][-1] / b - 1) * 100
        line.append(
            f"relative gain at round {rounds} over the strongest paper baseline "
            f"({best}, {b:.4f}): {gain:+.2f}%"
        )
    if reference:
        above = all(dflt["accuracy"][r] > reference[r] for r in range(1, rounds + 1))
        line.append(
            f"reference {reference[-1]:.3f} vs {dflt['accuracy'][-1]:.4f}; "
            f"above the reference at every round 1..{rounds}: {above}"
        )
    if line:
        out.append("; ".join(line))
    sd = dflt.get("accuracy_sd")
    if sd:
        out.append(f"(sd over runs of default at round {rounds}: {sd[-1]:.4f})")
    out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for arg in argv:
        path, _, ref = arg.partition(":")
        reference = [float(x) for x in ref.split(",")] if ref else None
        print(report(Path(path), reference))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
