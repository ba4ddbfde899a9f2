"""Server-side plots for the admin UI: matplotlib (Agg canvas, no display) to SVG text.

Each function returns a standalone ``<svg>`` document as a string. Labels come from the
database (item texts may be untrusted): matplotlib writes text into SVG with XML escaping,
and the pages embed the SVG through ``<img src=...>`` routes, never inline as markup.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

_COLOURS = ("#2457a6", "#c0392b", "#7f8c8d", "#27ae60", "#8e44ad", "#d35400")


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    FigureCanvasSVG(fig).print_svg(buf)
    return buf.getvalue()


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def simulation_svg(result: dict[str, Any]) -> str:
    """Accuracy and log loss on the targets against questions asked, one line per method.

    ``result`` is :func:`app.services.simulation.run_study_simulation`'s output. The
    ``full`` reference (every candidate answered) is drawn as a dashed line.
    """
    fig = Figure(figsize=(10, 3.8), dpi=100)
    axes = fig.subplots(1, 2)
    budget = int(result["budget"])
    x = list(range(budget + 1))
    panels = (("accuracy", "target accuracy"), ("log_loss", "target log loss (nats)"))
    for ax, (metric, label) in zip(axes, panels, strict=True):
        for c, (name, res) in enumerate(result["methods"].items()):
            ys = [float("nan") if v is None else v for v in res[metric]]
            full = name == "full"
            ax.plot(
                x,
                ys,
                linestyle="--" if full else "-",
                marker=None if full else "o",
                markersize=3,
                color=_COLOURS[c % len(_COLOURS)],
                label=name,
            )
        ax.set_xlabel("questions asked")
        ax.set_ylabel(label)
        ax.set_xticks(x if budget <= 20 else x[:: max(1, budget // 10)])
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(
        f"Simulation on {result['n_test']:,} held-out respondents "
        f"({len(result['targets'])} targets, {len(result['candidates'])} candidate questions)",
        fontsize=10,
    )
    fig.tight_layout()
    return _svg(fig)


def distribution_svg(
    title: str,
    labels: Sequence[str],
    mean: Sequence[float],
    low: Sequence[float],
    high: Sequence[float],
    prior: Sequence[float] | None = None,
) -> str:
    """A bar chart of a predicted population distribution with an uncertainty band.

    Args:
        labels: option labels. mean / low / high: share of the population per option and
            the band's limits. prior: the model's distribution before any answer (markers).
    """
    height = 0.5 + 0.35 * len(labels)
    fig = Figure(figsize=(6.2, max(1.6, height)), dpi=100)
    ax = fig.subplots()
    ys = list(range(len(labels)))[::-1]
    err_lo = [max(0.0, m - lo) for m, lo in zip(mean, low, strict=True)]
    err_hi = [max(0.0, hi - m) for m, hi in zip(mean, high, strict=True)]
    ax.barh(ys, mean, color="#2457a6", alpha=0.8, xerr=[err_lo, err_hi], capsize=3)
    if prior is not None:
        ax.plot(prior, ys, "|", color="#c0392b", markersize=14, label="prior")
        ax.legend(loc="lower right", fontsize=7)
    ax.set_yticks(ys, [_short(lbl) for lbl in labels], fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of respondents", fontsize=8)
    ax.set_title(_short(title, 80), fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _svg(fig)


def bars_svg(title: str, labels: Sequence[str], values: Sequence[float], xlabel: str) -> str:
    """A horizontal bar chart (exposure per item, persona weights)."""
    fig = Figure(figsize=(6.2, max(1.6, 0.5 + 0.25 * len(labels))), dpi=100)
    ax = fig.subplots()
    ys = list(range(len(labels)))[::-1]
    ax.barh(ys, values, color="#2457a6", alpha=0.85)
    ax.set_yticks(ys, [_short(lbl, 30) for lbl in labels], fontsize=7)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _svg(fig)
