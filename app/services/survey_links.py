"""Getting a study out: the public list of open surveys, a survey's address and its QR
code (an SVG drawn on the server by :mod:`segno`; nothing loaded from elsewhere).

Example::

    >>> survey_url("http://127.0.0.1:8000/", "ces")
    'http://127.0.0.1:8000/s/ces'
    >>> qr_svg("http://127.0.0.1:8000/s/ces").startswith("<svg")
    True
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import segno
from sqlmodel import Session, col, select

from app.tables import Study, StudyStatus


@dataclass(frozen=True)
class OpenSurvey:
    """A published study as a visitor of the home page sees it: its title and address."""

    name: str
    slug: str


def open_surveys(*, session: Session) -> list[OpenSurvey]:
    """The published studies, by name: all a visitor of the public home page is shown
    (no drafts, closed studies, counts or ids)."""
    rows = session.exec(
        select(Study.name, Study.slug)
        .where(Study.status == StudyStatus.published.value)
        .order_by(col(Study.name), col(Study.id))
    ).all()
    return [OpenSurvey(name=str(n), slug=str(s)) for n, s in rows]


def survey_url(base_url: str, slug: str) -> str:
    """The respondent address of study ``slug`` on the server at ``base_url``."""
    return f"{base_url.rstrip('/')}/s/{slug}"


def qr_svg(url: str, *, scale: int = 4) -> str:
    """A QR code of ``url`` as an inline SVG element (dark modules on white, 4-module
    quiet zone; ``scale`` pixels per module), titled with the address for screen readers."""
    out = io.BytesIO()
    segno.make(url, error="m").save(
        out,
        kind="svg",
        scale=scale,
        border=4,
        xmldecl=False,
        svgns=True,
        title=url,
        svgclass="qr",
        lineclass=None,
        dark="#000",
        light="#fff",
    )
    return out.getvalue().decode("utf-8")
