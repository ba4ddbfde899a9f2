"""Getting a study out: the public list of open surveys, a survey's address, its QR
code (an SVG drawn on the server by :mod:`segno`; nothing loaded from elsewhere) and
"preview as respondent" (:func:`start_preview`: a session flagged ``is_preview``, which
dashboards and exports leave out).

Example::

    >>> qr_svg("http://127.0.0.1:8000/s/ces").startswith("<svg")
    True
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import segno
from sqlalchemy import update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.errors import ConflictError
from app.schemas import StudySettings
from app.services.demo import survey_readiness
from app.session import StartedSession, start_session
from app.tables import ElicitationSession, Study, StudyStatus


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


def start_preview(study: Study, *, engine: Engine) -> StartedSession:
    """Start a researcher's preview of the survey: an ordinary session of ``study`` (the
    same pages, questions and attribute step as a respondent's), flagged ``is_preview``
    so that dashboards and exports do not count it.

    Raises:
        ConflictError: the study is not published (the survey pages serve only open
            studies) or has no fitted model yet; the session package's errors.
    """
    if study.status != StudyStatus.published.value:
        raise ConflictError("publish the study to preview its survey")
    with Session(engine) as db:
        readiness = survey_readiness(study, session=db)
    if readiness != "ready":  # the model is never fitted inside a request
        raise ConflictError(
            "the study's model is still being fitted: preview it when the job is done"
            if readiness == "preparing"
            else "the study's last model fit failed (see Jobs): fix the study and refit it "
            "before previewing"
            if readiness == "fit_failed"
            else "the study has no fitted model yet: fit it (Jobs) before previewing"
        )
    ask = StudySettings.model_validate(study.settings or {}).ask_attributes
    started = start_session(study, engine=engine, ask_attributes=ask)
    with Session(engine) as db:
        db.execute(
            update(ElicitationSession)
            .where(col(ElicitationSession.id) == started.session_id)
            .values(is_preview=True)
        )
        db.commit()
    return started
