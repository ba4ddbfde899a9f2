"""Erasing a live respondent: every session, answer, decision and state, in one transaction.

The respondent asks with the completion code (:func:`session_by_completion_code`) or the
browser's session; a researcher erases by respondent id (:func:`erase_respondent_id`).
Only counts stay behind (:class:`app.tables.ErasureRecord`). Readers of the erased
session that run at the same time see either everything before the erasure or
:class:`~app.session.errors.SessionNotFoundError`.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from sqlalchemy import delete, or_
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.session.errors import SessionNotFoundError
from app.session.tokens import derived_code
from app.tables import (
    Answer,
    ElicitationSession,
    ErasureRecord,
    Respondent,
    RespondentSource,
    SelectionDecision,
    SessionStatus,
    Study,
)


@dataclass(frozen=True)
class ErasureResult:
    """What an erasure deleted: the respondent id, its sessions and answers (counts).

    ``n_answers`` counts every answer row, "prefer not to answer" included; of these,
    ``n_skipped`` were "prefer not to answer"; ``n_attributes``: the stored answers to the
    questions about the respondent (in the respondent row, not answer rows).
    """

    respondent_id: int
    n_sessions: int
    n_answers: int
    n_skipped: int = 0
    n_attributes: int = 0


def erase_respondent(sess: ElicitationSession, *, engine: Engine) -> ErasureResult:
    """Delete the respondent of ``sess`` with every session, answer, decision and state.

    Only counts stay behind (:class:`app.tables.ErasureRecord`). Imported (historical)
    respondents are not erased this way (they belong to the dataset).
    """
    return erase_respondent_id(sess.respondent_id, study_id=sess.study_id, engine=engine)


def erase_respondent_id(respondent_id: int, *, study_id: int, engine: Engine) -> ErasureResult:
    """Delete the live respondent ``respondent_id`` of study ``study_id`` with every
    session, answer, decision and state, leaving an :class:`app.tables.ErasureRecord`.

    Two erasures of one respondent at once: one deletes and records it, the other finds
    nothing to delete (the respondent row's delete counts 0 rows) and raises, so one
    erasure is recorded once.

    Raises:
        SessionNotFoundError: no such respondent in the study (already erased, another
            study's, or an imported respondent, which belongs to the dataset).
    """
    with Session(engine) as db:
        respondent = db.get(Respondent, respondent_id)
        if (
            respondent is None
            or respondent.study_id != study_id
            or respondent.source != RespondentSource.live.value
        ):
            raise SessionNotFoundError(f"no live respondent {respondent_id} in this study")
        sessions = db.exec(
            select(ElicitationSession).where(ElicitationSession.respondent_id == respondent.id)
        ).all()
        ids = [s.id for s in sessions]
        n_completed = sum(1 for s in sessions if s.status == SessionStatus.completed.value)
        options = db.exec(select(Answer.option).where(Answer.session_id.in_(ids))).all()  # type: ignore[attr-defined]
        # explicit deletes, children first (not relying on ON DELETE CASCADE being enforced)
        db.exec(delete(SelectionDecision).where(SelectionDecision.session_id.in_(ids)))  # type: ignore[call-overload,attr-defined]
        n_answers = db.exec(delete(Answer).where(Answer.session_id.in_(ids))).rowcount  # type: ignore[call-overload,attr-defined]
        db.exec(delete(ElicitationSession).where(ElicitationSession.id.in_(ids)))  # type: ignore[call-overload,union-attr]
        gone = db.exec(delete(Respondent).where(Respondent.id == respondent.id)).rowcount  # type: ignore[call-overload,arg-type]
        if gone != 1:  # a concurrent erasure deleted it first: that one is the erasure
            db.rollback()
            raise SessionNotFoundError(f"no live respondent {respondent_id} in this study")
        db.add(
            ErasureRecord(
                study_id=respondent.study_id,
                n_sessions=len(ids),
                n_completed=n_completed,
                n_answers=n_answers,
            )
        )
        db.commit()
        return ErasureResult(
            respondent.id or 0,
            len(ids),
            n_answers,
            n_skipped=sum(1 for o in options if o is None),
            n_attributes=len(respondent.attributes or {}),
        )


def session_by_completion_code(
    study: Study, code: str, secret: str, *, session: Session
) -> ElicitationSession | None:
    """The completed session of ``study`` whose derived completion code is ``code``.

    ``None`` when no session has it, and always when the study has one fixed code for
    everyone now (it names no respondent). Only sessions that were shown their derived code
    are compared (:func:`found_by_code`: a session that completed under a fixed code since
    removed shows that code, never its derived one). The code is compared
    case-insensitively, in constant time per session (one HMAC per compared session).

    Example: ``session_by_completion_code(study, "3F9A0C21B7", key, session=db)``.
    """
    wanted = code.strip().upper()
    if study.completion_code or not wanted or len(wanted) > 64 or not wanted.isascii():
        return None
    rows = session.exec(
        select(ElicitationSession).where(
            ElicitationSession.study_id == study.id,
            ElicitationSession.status == SessionStatus.completed.value,
            or_(
                col(ElicitationSession.completion_code).is_(None),
                ElicitationSession.completion_code == "",
            ),
        )
    ).all()
    for row in rows:
        if hmac.compare_digest(derived_code(study.id or 0, row.id or 0, secret), wanted):
            return row
    return None


def found_by_code(study: Study, sess: ElicitationSession) -> bool:
    """Whether :func:`session_by_completion_code` finds the completed session ``sess`` by
    the code it shows (:func:`app.session.tokens.session_completion_code`): the study has no
    fixed code now and ``sess`` was shown its derived code. The completion page promises
    deletion by the code only then."""
    return not study.completion_code and not sess.completion_code
