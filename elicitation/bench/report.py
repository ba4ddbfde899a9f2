"""Markdown tables of benchmark results (for docs/benchmarks.md and the terminal)."""

from __future__ import annotations

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
