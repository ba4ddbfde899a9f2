"""Erasing a live respondent: every session, answer, decision and state, in one transaction.

Only counts stay behind (:class:`app.tables.ErasureRecord`). Readers of the erased
session that run at the same time see either everything before the erasure or
:class:`~app.session.errors.SessionNotFoundError`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, func
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.session.errors import SessionNotFoundError
from app.tables import (
    Answer,
    ElicitationSession,
    ErasureRecord,
    Respondent,
    SelectionDecision,
    SessionStatus,
)


@dataclass(frozen=True)
class ErasureResult:
    """What an erasure deleted: the respondent id, its sessions and answers (counts)."""

    respondent_id: int
    n_sessions: int
    n_answers: int


def erase_respondent(sess: ElicitationSession, *, engine: Engine) -> ErasureResult:
    """Delete the respondent of ``sess`` with every session, answer, decision and state.

    Only counts stay behind (:class:`app.tables.ErasureRecord`). Imported (historical)
    respondents are not erased this way (they belong to the dataset).
    """
    with Session(engine) as db:
        respondent = db.get(Respondent, sess.respondent_id)
        if respondent is None:
            raise SessionNotFoundError(f"no session {sess.id}")
        sessions = db.exec(
            select(ElicitationSession).where(ElicitationSession.respondent_id == respondent.id)
        ).all()
        ids = [s.id for s in sessions]
        n_answers = int(
            db.exec(
                select(func.count()).select_from(Answer).where(Answer.session_id.in_(ids))  # type: ignore[attr-defined]
            ).one()
        )
        n_completed = sum(1 for s in sessions if s.status == SessionStatus.completed.value)
        # explicit deletes, children first (not relying on ON DELETE CASCADE being enforced)
        db.exec(delete(SelectionDecision).where(SelectionDecision.session_id.in_(ids)))  # type: ignore[call-overload,attr-defined]
        db.exec(delete(Answer).where(Answer.session_id.in_(ids)))  # type: ignore[call-overload,attr-defined]
        db.exec(delete(ElicitationSession).where(ElicitationSession.id.in_(ids)))  # type: ignore[call-overload,union-attr]
        db.exec(delete(Respondent).where(Respondent.id == respondent.id))  # type: ignore[call-overload,arg-type]
        db.add(
            ErasureRecord(
                study_id=respondent.study_id,
                n_sessions=len(ids),
                n_completed=n_completed,
                n_answers=n_answers,
            )
        )
        db.commit()
        return ErasureResult(respondent.id or 0, len(ids), n_answers)
