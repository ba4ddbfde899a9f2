"""Markdown report of `priorly bench group` result files (the tables of docs/group.md §4).

    python scripts/group_report.py docs/group/ces_10.json[:0.785,0.787,0.788,0.789,0.790] ...

For each file (one dataset and respondent budget): every method's target accuracy after
rounds 0..4, Brier and perplexity after the last round and the mean planning seconds per
round; `default` against each other method at rounds 1..R (`>` strictly better, `=`
equal, `<` worse) and, where it is not ahead everywhere, the paired difference over the
runs (mean, paired t, runs ahead / behind, and the exact one-sided sign-flip p-value that
the other method is ahead); how many cells each side leads with p < 0.05; the relative
gain after the last round over the strongest of the paper's baselines; and, when
reference accuracies follow the path after a colon, whether `default` is above them at
every round after round 0. With several files, the totals over all of them close the
report.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import NamedTuple

PAPER = ("random_random", "greedy_random", "greedy_random_selfimpute", "greedy_relational_gnn")
ALPHA = 0.05
SAME_AS_DEFAULT = ("elook_elook_pool",)  # `default` under its component names: not compared


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


def sign_flip_p(d: list[float]) -> float:
    """Exact one-sided p-value of the paired sign-flip test that ``mean(d) > 0``.

    Under the null hypothesis (the two methods are exchangeable within each run) every
    run's difference is as likely to be ``+d_i`` as ``-d_i``, so the ``2^n`` sign
    assignments are equally likely; ``p = #{s : sum_i s_i |d_i| >= sum_i d_i} / 2^n``,
    enumerated exactly (``n <= 20``). Sums equal to the observed one within ``1e-12``
    count (accuracies are ratios, so floating sums of the same terms may differ in the
    last bit). The smallest possible ``p`` is ``2^-n`` (``1/1024`` for 10 runs).
    """
    n = len(d)
    if n == 0 or n > 20:
        raise ValueError(f"sign-flip test needs 1..20 paired runs, got {n}")
    obs = sum(d)
    mags = [abs(x) for x in d]
    hits = sum(
        sum(s * m for s, m in zip(signs, mags, strict=True)) >= obs - 1e-12
        for signs in itertools.product((1, -1), repeat=n)
    )
    return hits / 2**n


class Leads(NamedTuple):
    """Cells (method, round 1..R) against ``default``: how many, where ``default``'s mean
    is ahead (and with ``p < ALPHA``), where the other method's is (and with
    ``p < ALPHA``), and the smallest p of the latter (1 when none)."""

    cells: int = 0
    ahead: int = 0
    ahead_sig: int = 0
    behind: int = 0
    behind_sig: int = 0
    min_p: float = 1.0

    def __add__(self, other: object) -> Leads:
        if not isinstance(other, Leads):
            return NotImplemented
        return Leads(
            *(a + b for a, b in zip(self[:5], other[:5], strict=True)),
            min(self.min_p, other.min_p),
        )

    def describe(self, against: str, scope: str) -> str:
        """The start of one report line: ``against`` names the methods, ``scope`` follows
        the cell count in the brackets; the caller closes the last bracket."""
        return (
            f"{against} ({self.cells} cells{scope}): default ahead in {self.ahead} "
            f"({self.ahead_sig} with p < {ALPHA}), behind in {self.behind} "
            f"({self.behind_sig} with p < {ALPHA}"
        )


def lead_counts(methods: dict, names: list[str], rounds: int) -> Leads:
    """The :class:`Leads` of ``default`` against the methods ``names`` at rounds 1..R."""
    dflt = methods["default"]["accuracy_runs"]
    ahead = ahead_sig = behind = behind_sig = 0
    min_p = 1.0
    for name in names:
        other = methods[name]["accuracy_runs"]
        for r in range(1, rounds + 1):
            d = [a[r] - b[r] for a, b in zip(dflt, other, strict=True)]
            mean = sum(d) / len(d)
            if mean > 0:
                ahead += 1
                ahead_sig += sign_flip_p(d) < ALPHA
            elif mean < 0:
                behind += 1
                p = sign_flip_p([-x for x in d])
                behind_sig += p < ALPHA
                min_p = min(min_p, p)
    return Leads(len(names) * rounds, ahead, ahead_sig, behind, behind_sig, min_p)


def report(
    path: Path, reference: list[float] | None, totals: dict[str, Leads] | None = None
) -> str:
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
                a_r = [x[r] for x in dflt["accuracy_runs"]]
                b_r = [x[r] for x in m["accuracy_runs"]]
                mean, t, up, down = paired(a_r, b_r)
                p = sign_flip_p([b - a for a, b in zip(a_r, b_r, strict=True)])
                cells.append(f"r{r} {mean:+.4f} (t {t:+.1f}, {up}/{down}, p {p:.3f})")
            behind.append(f"* default − {name}: " + "; ".join(cells))
    out.append(
        f"default vs each method, accuracy at rounds 1..{rounds} (`>` strictly better, "
        "`=` equal, `<` worse): " + "; ".join(marks)
    )
    out.append("")
    if behind:
        out.append(
            "Paired over the runs where default is not ahead in every round "
            "(mean difference, paired t, runs ahead / behind, one-sided sign-flip p "
            "that the other method is ahead):"
        )
        out.append("")
        out.extend(behind)
        out.append("")
    paper = [n for n in PAPER if n in methods]
    others = [n for n in methods if n != "default" and n not in PAPER and n not in SAME_AS_DEFAULT]
    for label, names in (("the paper's methods", paper), ("the other methods", others)):
        if not names:
            continue
        leads = lead_counts(methods, names, rounds)
        out.append(
            leads.describe(f"Against {label}", f", rounds 1..{rounds}")
            + (f", smallest p {leads.min_p:.3f}" if leads.behind else "")
            + ")"
        )
        if totals is not None:
            totals[label] = totals.get(label, Leads()) + leads
    out.append("")
    line = []
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


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line: one or more ``FILE[:REF,...]`` arguments (see the module doc)."""
    parser = argparse.ArgumentParser(
        prog="scripts/group_report.py",
        description="Markdown report of `priorly bench group` result files "
        "(the tables of docs/group.md section 4).",
    )
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE[:REF,...]",
        help="a `priorly bench group` result file, optionally followed by a colon and the "
        "reference accuracies after rounds 0..R, comma-separated "
        "(e.g. docs/group/ces_10.json:0.785,0.787,0.788,0.789,0.790)",
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    totals: dict[str, Leads] = {}
    for arg in args.files:
        path, _, ref = arg.partition(":")
        reference = [float(x) for x in ref.split(",")] if ref else None
        print(report(Path(path), reference, totals))
    if len(args.files) > 1:
        for label, leads in totals.items():
            print(
                leads.describe(f"All files, against {label}", "")
                + f", {ALPHA * leads.cells:.1f} expected by chance if every method were "
                "exchangeable with default"
                + (f"; smallest p {leads.min_p:.3f}" if leads.behind else "")
                + ")"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
