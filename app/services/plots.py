"""Server-side plots for the admin UI: matplotlib (Agg canvas, no display) to SVG text.

Each function returns a standalone ``<svg>`` document as a string. Labels come from the
database (item texts may be untrusted): matplotlib writes text into SVG with XML escaping,
and the pages embed the SVG through ``<img src=...>`` routes, never inline as markup.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

_COLOURS = ("#2457a6", "#c0392b", "#7f8c8d", "#27ae60", "#8e44ad", "#d35400")


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    FigureCanvasSVG(fig).print_svg(buf)
    return buf.getvalue()


TITLE_CHARS = 70
"""Longest title line (characters) of the 6.2-inch plots at 9 pt; longer titles wrap."""
TITLE_LINE_IN = 0.2
"""Height (inches) one more title line adds to a plot."""


def _short(text: str, n: int = 40) -> str:
    """``text`` cut to at most ``n`` characters at a word boundary, with "…" when cut
    (a tick label; a title is wrapped instead, see :func:`wrap_title`)."""
    if len(text) <= n:
        return text
    head = text[: n - 1]
    if " " in head:
        head = head.rsplit(" ", 1)[0]
    return head.rstrip(" ,;:") + "…"


def _title(fig: Figure, title: str, height: float) -> None:
    """Put ``title`` over ``fig`` (6.2 inches wide), wrapped (:func:`wrap_title`) at
    :data:`TITLE_CHARS` or, when its glyphs are wider than usual, at fewer characters
    until it fits the figure's width; then size the figure to ``height`` inches plus
    :data:`TITLE_LINE_IN` per extra title line."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    width = TITLE_CHARS
    while True:
        text = fig.suptitle(wrap_title(title, width), fontsize=9)
        fits = text.get_window_extent(renderer).width <= 0.96 * fig.bbox.width
        if fits or width <= 8:
            break
        width = int(width * 0.8)
    fig.set_size_inches(fig.get_figwidth(), height + TITLE_LINE_IN * text.get_text().count("\n"))


def wrap_title(title: str, width: int = TITLE_CHARS) -> str:
    """``title`` wrapped at word boundaries into lines of at most ``width`` characters
    (a longer word is broken), nothing left out: for a title without words longer than
    ``width``, ``" ".join(result.split()) == " ".join(title.split())``."""
    return "\n".join(textwrap.wrap(" ".join(title.split()), width)) or " "


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
    return _svg(distribution_figure(title, labels, mean, low, high, prior))


def distribution_figure(
    title: str,
    labels: Sequence[str],
    mean: Sequence[float],
    low: Sequence[float],
    high: Sequence[float],
    prior: Sequence[float] | None = None,
) -> Figure:
    """The figure of :func:`distribution_svg`; the title is centred on the figure (long tick
    labels cannot push it out) and wrapped to fit it (:func:`_title`)."""
    fig = Figure(figsize=(6.2, 2), dpi=100)
    _title(fig, title, max(1.6, 0.5 + 0.35 * len(labels)))
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
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def bars_svg(title: str, labels: Sequence[str], values: Sequence[float], xlabel: str) -> str:
    """A horizontal bar chart (exposure per item, persona weights)."""
    fig = Figure(figsize=(6.2, 2), dpi=100)
    _title(fig, title, max(1.6, 0.5 + 0.25 * len(labels)))
    ax = fig.subplots()
    ys = list(range(len(labels)))[::-1]
    ax.barh(ys, values, color="#2457a6", alpha=0.85)
    ax.set_yticks(ys, [_short(lbl, 30) for lbl in labels], fontsize=7)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _svg(fig)
