"""A study's live respondents as the researcher sees them, and erasing one.

:func:`live_respondents` lists each live respondent with its sessions' state, its answer
count and ``earlier_starts`` (respondents the same browser started in the study before:
more than 0 flags a repeated start). :func:`erase_live_respondent` deletes one through
the live loop's erasure (:func:`app.session.erase_respondent_id`), which keeps only the
:class:`app.tables.ErasureRecord` counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app import session as live
from app.errors import NotFoundError
from app.tables import (
    Answer,
    ElicitationSession,
    Respondent,
    RespondentSource,
    SessionStatus,
    Study,
)

MAX_ID = 2**31 - 1
"""The largest row id (an INTEGER primary key)."""

LIST_LIMIT = 500
"""The most respondents one listing shows (the newest first)."""


@dataclass(frozen=True)
class LiveRespondentRow:
    """One live respondent in the researcher's list.

    Attributes:
        status: ``completed`` when a session of it finished, else its newest session's.
        earlier_starts: respondents the same browser had started before this one.
    """

    id: int
    external_id: str | None
    created_at: datetime
    status: str
    n_answers: int
    earlier_starts: int
    panel_params: dict[str, object] | None


def live_respondents(study: Study, *, session: Session) -> list[LiveRespondentRow]:
    """The study's live respondents, newest first (at most :data:`LIST_LIMIT`)."""
    respondents = session.exec(
        select(Respondent)
        .where(Respondent.study_id == study.id, Respondent.source == RespondentSource.live.value)
        .order_by(Respondent.id.desc())  # type: ignore[union-attr]
        .limit(LIST_LIMIT)
    ).all()
    ids = [r.id for r in respondents]
    sessions = session.exec(
        select(ElicitationSession).where(ElicitationSession.respondent_id.in_(ids))  # type: ignore[attr-defined]
    ).all()
    counts = dict(
        session.exec(
            select(ElicitationSession.respondent_id, func.count(Answer.id))  # type: ignore[arg-type]
            .join(Answer, Answer.session_id == ElicitationSession.id)  # type: ignore[arg-type]
            .where(ElicitationSession.respondent_id.in_(ids))  # type: ignore[attr-defined]
            .group_by(ElicitationSession.respondent_id)  # type: ignore[arg-type]
        ).all()
    )
    status: dict[int, str] = {}
    for s in sorted(sessions, key=lambda s: s.id or 0):
        if status.get(s.respondent_id) != SessionStatus.completed.value:
            status[s.respondent_id] = s.status
    return [
        LiveRespondentRow(
            id=r.id or 0,
            external_id=r.external_id,
            created_at=r.created_at,
            status=status.get(r.id or 0, "no session"),
            n_answers=int(counts.get(r.id or 0, 0)),
            earlier_starts=r.earlier_starts,
            panel_params=r.panel_params,
        )
        for r in respondents
    ]


def erase_live_respondent(
    study: Study, respondent_id: int, *, engine: Engine
) -> live.ErasureResult:
    """Erase live respondent ``respondent_id`` of ``study`` (sessions, answers, decisions,
    states), leaving the erasure record.

    Raises:
        NotFoundError: no live respondent with that id in the study (404).
    """
    if not 0 < respondent_id <= MAX_ID:  # beyond any row id (PostgreSQL: out of range)
        raise NotFoundError(f"no live respondent {respondent_id} in study {study.slug!r}")
    try:
        return live.erase_respondent_id(respondent_id, study_id=study.id or 0, engine=engine)
    except live.SessionNotFoundError as exc:
        raise NotFoundError(f"no live respondent {respondent_id} in study {study.slug!r}") from exc
