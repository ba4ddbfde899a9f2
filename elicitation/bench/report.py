"""Markdown tables of benchmark results (for docs/benchmarks.md and the terminal)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def markdown_table(result: dict[str, Any], metric: str, digits: int = 3) -> str:
    """A markdown table: one row per method, one column per number of questions asked.

    Args:
        result: a ``result.json`` object (``run_individual``).
        metric: ``accuracy``, ``log_loss``, ``brier_mean`` or ``brier_sum``.
        digits: decimals shown.

    Returns:
        The table; the best value of each column (highest accuracy, lowest loss) is bold,
        ``full`` excluded (it is a reference that observes every candidate).
    """
    budget = int(result["budget"])
    methods = result["methods"]
    higher_better = metric == "accuracy"
    head = "| method | " + " | ".join(str(n) for n in range(budget + 1)) + " |"
    sep = "| --- |" + " --- |" * (budget + 1)
    best: list[float] = []
    for n in range(budget + 1):
        vals = [res[metric][n] for name, res in methods.items() if name != "full"]
        best.append((max if higher_better else min)(vals) if vals else float("nan"))
    rows = [head, sep]
    for name, res in methods.items():
        cells = []
        for n, v in enumerate(res[metric]):
            text = f"{v:.{digits}f}"
            if name != "full" and round(v, digits) == round(best[n], digits):
                text = f"**{text}**"
            cells.append(text)
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def markdown_tables(result: dict[str, Any], budgets: Sequence[int] = (0, 1, 2, 3, 5, 10)) -> str:
    """Markdown tables of a ``result.json`` (accuracy and log loss at ``budgets``, CAPE
    measures): what docs/cape.md shows."""
    methods = result["methods"]
    t_max = int(result["budget"])
    cols = [b for b in budgets if b <= t_max]
    out: list[str] = []
    for metric in ("log_loss", "accuracy"):
        out.append(f"| {metric} | " + " | ".join(str(b) for b in cols) + " |")
        out.append("| --- |" + " --- |" * len(cols))
        for name, res in methods.items():
            out.append(f"| {name} | " + " | ".join(f"{res[metric][b]:.4f}" for b in cols) + " |")
        out.append("")
    out.append("| method | questions_to_90pct | log loss, all candidates | adaptivity (pairs) |")
    out.append("| --- | --- | --- | --- |")
    for name, res in methods.items():
        if "questions_to_90pct" not in res:
            continue
        q = res["questions_to_90pct"]
        a = res.get("adaptivity")
        out.append(
            f"| {name} | {q if q is not None else f'> {t_max}'} | "
            f"{res['log_loss_all_candidates']:.4f} | "
            f"{f'{a:.3f}' if a is not None else 'n/a'} ({res.get('adaptivity_pairs', 0)}) |"
        )
    return "\n".join(out) + "\n"


def auto_vs_best(result: Mapping[str, Any], metric: str = "log_loss") -> str:
    """Markdown rows: the best single method at each budget (``auto`` and ``full``
    excluded), ``auto``'s value and whether ``auto`` is at least as good."""
    methods = result["methods"]
    singles = {k: v for k, v in methods.items() if k not in ("auto", "full")}
    t_max = int(result["budget"])
    lower = metric == "log_loss"
    best, who, verdict = [], [], []
    for n in range(t_max + 1):
        pick = (min if lower else max)(singles, key=lambda k: singles[k][metric][n])
        b = singles[pick][metric][n]
        a = methods["auto"][metric][n]
        best.append(f"{b:.4f}")
        who.append(pick)
        verdict.append(("yes" if (a <= b if lower else a >= b) else "no") + f" ({a - b:+.4f})")
    head = f"| {metric} | " + " | ".join(str(n) for n in range(t_max + 1)) + " |"
    rows = [
        head,
        "| --- |" + " --- |" * (t_max + 1),
        "| best single | " + " | ".join(best) + " |",
        "| which | " + " | ".join(who) + " |",
        "| auto | "
        + " | ".join(f"{methods['auto'][metric][n]:.4f}" for n in range(t_max + 1))
        + " |",
        "| auto at least as good (auto - best) | " + " | ".join(verdict) + " |",
    ]
    return "\n".join(rows) + "\n"
