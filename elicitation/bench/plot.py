"""Plots of benchmark curves (matplotlib's Agg canvas: no display, no global backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PANELS = (("accuracy", "target accuracy"), ("log_loss", "target log loss (nats)"))


def plot_curves(result: dict[str, Any], path: str | Path) -> Path:
    """Write a PNG with accuracy and log loss against questions asked, one line per method.

    Args:
        result: a ``result.json`` object of :func:`elicitation.bench.individual.run_individual`.
        path: the PNG file to write.

    Returns:
        The path written. Non-adaptive references that do not depend on the number of
        questions (``full``) are drawn dashed.
    """
    fig = Figure(figsize=(11, 4.2), dpi=120)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(PANELS))
    budget = int(result["budget"])
    x = list(range(budget + 1))
    for ax, (metric, label) in zip(axes, PANELS, strict=True):
        for name, res in result["methods"].items():
            ys = res[metric]
            constant = len(set(ys)) == 1 and budget > 0
            ax.plot(
                x,
                ys,
                linestyle="--" if constant else "-",
                marker=None if constant else "o",
                markersize=3,
                label=name,
            )
        ax.set_xlabel("questions asked")
        ax.set_ylabel(label)
        ax.set_xticks(x)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(
        f"{result['dataset']}: individual elicitation, mean of {len(next(iter(result['methods'].values()))['per_run'])} runs"
    )
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out
