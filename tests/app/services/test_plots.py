"""Server-side SVG plots: well-formed SVG, untrusted text escaped (they are inlined)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from app.services.plots import bars_svg, distribution_svg, simulation_svg
from app.services.simulation import questions_needed

HOSTILE = 'x --><script>alert(1)</script><!-- <img src=x onerror="alert(2)">'


def _elements(svg: str) -> set[str]:
    return {el.tag.split("}")[-1] for el in ET.fromstring(svg).iter()}


def test_untrusted_text_cannot_become_markup() -> None:
    for svg in (
        distribution_svg(HOSTILE, [HOSTILE, "b"], [0.5, 0.5], [0.4, 0.4], [0.6, 0.6], [0.5, 0.5]),
        bars_svg(HOSTILE, [HOSTILE], [0.3], HOSTILE),
    ):
        tags = _elements(svg)  # parses: the document is well-formed
        assert "script" not in tags and "img" not in tags
        assert "<script" not in svg and "<img" not in svg


def test_simulation_svg_has_both_panels() -> None:
    result = {
        "budget": 2,
        "n_test": 10,
        "targets": ["t"],
        "candidates": ["a", "b"],
        "methods": {
            "eig (study)": {"accuracy": [0.5, 0.6, 0.7], "log_loss": [0.7, 0.6, None]},
            "full": {"accuracy": [0.8] * 3, "log_loss": [0.5] * 3},
        },
    }
    svg = simulation_svg(result)
    assert "svg" in _elements(svg)
    assert svg.count('id="axes_') >= 2


def test_questions_needed_against_hand_computed_cases() -> None:
    curve = [0.5, 0.6, 0.68, 0.7, 0.71]
    # gap 0.2 to the ceiling 0.7: 80 % = +0.16 and 90 % = +0.18 first at n=2 (+0.18),
    # 95 % = +0.19 at n=3 (+0.20)
    assert questions_needed(curve, 0.5, 0.7, 0.8) == 2
    assert questions_needed(curve, 0.5, 0.7, 0.9) == 2
    assert questions_needed(curve, 0.5, 0.7, 0.95) == 3
    assert questions_needed(curve[:2], 0.5, 0.7, 0.9) is None
    assert questions_needed(curve, 0.5, 0.5, 0.9) == 0  # nothing to gain


LONG_TITLE = (
    "334a: Which of these statements comes closest to your view about what the federal "
    "government should do about gun laws and background checks (n = 1,234)"
)


def _comments(svg: str) -> list[str]:
    import re

    return re.findall(r"<!-- (.*?) -->", svg, flags=re.S)


def test_long_titles_are_wrapped_whole_and_fit_the_figure() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from app.services.plots import TITLE_CHARS, distribution_figure, wrap_title

    wrapped = wrap_title(LONG_TITLE)
    assert wrapped.count("\n") >= 1 and max(map(len, wrapped.split("\n"))) <= TITLE_CHARS
    assert " ".join(wrapped.split()) == LONG_TITLE
    # the SVG names the title (matplotlib writes each line of text as a comment): all of it
    svg = distribution_svg(LONG_TITLE, ["A: yes", "B: no"], [0.6, 0.4], [0.5, 0.3], [0.7, 0.5])
    assert LONG_TITLE in " ".join(" ".join(c.split()) for c in _comments(svg))
    assert "…" not in svg
    # drawn, the title lies inside the figure (nothing cut at an edge), with long tick labels
    for title in (LONG_TITLE, "W" * 150, "short"):
        fig = distribution_figure(
            title, ["A: " + "a long option label " * 4, "B: no"], [0.6, 0.4], [0.5, 0.3], [0.7, 0.5]
        )
        renderer = FigureCanvasAgg(fig).get_renderer()
        title_text = [
            t for t in fig.texts if "".join(t.get_text().split()) == "".join(title.split())
        ]
        assert len(title_text) == 1, title
        box = title_text[0].get_window_extent(renderer)
        frame = fig.bbox
        assert box.x0 >= frame.x0 and box.x1 <= frame.x1, title
        assert box.y0 >= frame.y0 and box.y1 <= frame.y1, title


def test_bars_title_is_wrapped_whole() -> None:
    svg = bars_svg(LONG_TITLE, ["a", "b"], [0.3, 0.7], "weight")
    assert LONG_TITLE in " ".join(" ".join(c.split()) for c in _comments(svg))
