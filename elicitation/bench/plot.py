"""Plots of benchmark curves (matplotlib's Agg canvas: no display, no global backend)."""

from __future__ import annotations

import io
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


# one distinct colour per method for up to 12 methods (matplotlib's default cycle has 10)
_PLOT_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aec7e8",
)  # fmt: skip


def plot_group(result: dict[str, Any], path: str | Path) -> Path:
    """A PNG with accuracy and perplexity against rounds, one line per method.

    Colours repeat after 12 methods with the next line style (solid, dashed, dotted), so
    every method has its own line; the legend stands right of the panels."""
    n_methods = len(result["methods"])
    fig = Figure(figsize=(13, max(4.2, 0.2 * n_methods + 1.0)), dpi=120)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    x = list(range(int(result["rounds"]) + 1))
    for ax, (metric, label) in zip(
        axes, (("accuracy", "target accuracy"), ("perplexity", "target perplexity")), strict=True
    ):
        for i, (name, res) in enumerate(result["methods"].items()):
            ax.plot(
                x,
                res[metric],
                marker="o",
                markersize=3,
                label=name,
                color=_PLOT_COLOURS[i % len(_PLOT_COLOURS)],
                linestyle=("-", "--", ":")[(i // len(_PLOT_COLOURS)) % 3],
                linewidth=2.5 if name == "default" else 1.2,
            )
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.set_xticks(x)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7, frameon=False)
    fig.suptitle(
        f"{result['dataset']}: respondent budget {result['respondent_budget']} "
        f"({result['respondents_per_round']} of {result['n_test_members']} per round), "
        f"non-response {result['nonresponse']}, mean of {result['n_runs']} runs",
        fontsize=9,
    )
    fig.tight_layout(rect=(0.0, 0.0, 0.84, 1.0))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    path.write_bytes(buf.getvalue())
    return path
