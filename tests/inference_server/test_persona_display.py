"""Persona text with markup is shown escaped: the admin dashboard's persona chart.

The dashboard shows the top personas' labels (a study persona's key, which may be the
researcher's own text) in the SVG of :func:`app.services.plots.bars_svg`, embedded inline
in the page. A label that tries HTML, a closing comment or template syntax must come out
as inert text: well-formed SVG, no element or attribute it injected.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from app.services.plots import bars_svg

NASTY = [
    '<script>alert("x")</script>',
    "--> <img src=x onerror=alert(1)> <!--",
    "{{ persona }} {% if 1 %}{persona}{% endif %} &amp; ]]>",
]


def test_persona_labels_in_the_dashboard_chart_are_inert() -> None:
    svg = bars_svg("aggregate persona posterior", NASTY, [0.5, 0.3, 0.2], "mean posterior weight")
    root = ET.fromstring(svg)  # well-formed: nothing broke out of a text node or comment
    tags = {el.tag.rsplit("}", 1)[-1] for el in root.iter()}
    assert not tags & {"script", "img", "foreignObject", "iframe"}
    for el in root.iter():
        assert not any(k.lower().startswith("on") for k in el.attrib), el.attrib
    assert svg.count("<!--") == svg.count("-->")  # every comment closed by its own end
    assert "<script" not in svg and "<img" not in svg
