"""A group-round member's link: from its token to the member's one-question session,
the answer through the live loop, and finishing the round session.

The link token is ``HMAC(secret, round id, respondent id)`` (:func:`app.services.group_rounds.link_token`);
only its SHA-256 is stored (``group_round_member.token_hash``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, or_, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app import session as svc
from app.services.group_rounds import (
    ONE_QUESTION_STOP,
    ROUND_CRITERION,
    RoundClosedError,
    RoundLinkNotFoundError,
)
from app.tables import (
    Answer,
    ElicitationSession,
    GroupRound,
    GroupRoundMember,
    GroupRoundStatus,
    SelectionDecision,
    SessionStatus,
    Study,
    utcnow,
)


@dataclass(frozen=True)
class MemberLink:
    """What a round link refers to (plain values, usable after the database session)."""

    member_id: int
    round_id: int
    round_number: int
    round_open: bool
    session_id: int
    item_key: str
    study: Study


def member_by_token(token: str, *, session: Session) -> MemberLink:
    """The round member whose link token is ``token``.

    Raises:
        RoundLinkNotFoundError: unknown token (also a token of a deleted study or round).
    """
    if not token or len(token) > 200:
        raise RoundLinkNotFoundError("unknown round link")
    row = session.exec(
        select(GroupRoundMember, GroupRound, Study)
        .join(GroupRound, col(GroupRound.id) == col(GroupRoundMember.round_id))
        .join(Study, col(Study.id) == col(GroupRound.study_id))
        .where(GroupRoundMember.token_hash == svc.hash_token(token))
    ).first()
    if row is None:
        raise RoundLinkNotFoundError("unknown round link")
    member, rnd, study = row
    rt = svc.load_runtime(study, session=session, fit_if_missing=False)
    item = rt.by_id.get(rnd.item_id)
    if item is None:
        raise RoundLinkNotFoundError("the question of this round no longer exists")
    return MemberLink(
        member.id or 0,
        rnd.id or 0,
        rnd.number,
        rnd.status == GroupRoundStatus.open.value,
        member.session_id,
        item.key,
        study,
    )


def link_view(link: MemberLink, *, session: Session) -> svc.SessionView:
    """Where the member's round session stands (``phase`` ``question`` or ``done``)."""
    sess = session.get(ElicitationSession, link.session_id)
    if sess is None:
        raise RoundLinkNotFoundError("unknown round link")
    return svc.session_view(link.study, sess, session=session)


def answer_round(
    link: MemberLink,
    *,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
) -> svc.SessionView:
    """Store a member's answer to the round question through the one answer path.

    :func:`app.session.submit_answer` stores it (lock, idempotency, conflicts);
    then :func:`finish_round_session` makes the round session stop after this question.
    A retried request (same idempotency key, or the same option again) returns the same
    result.

    Raises:
        RoundClosedError: the round is closed and this member had not answered.
        InvalidAnswerError, AnswerConflictError (from the answer path).
    """
    try:
        svc.submit_answer(
            link.study,
            link.session_id,
            item_key=link.item_key,
            option=option,
            idempotency_key=idempotency_key,
            engine=engine,
        )
    except svc.SessionClosedError:
        raise RoundClosedError(
            f"round {link.round_number} is closed: answers are no longer accepted"
        ) from None
    return finish_round_session(link.study, link.session_id, engine=engine)


def finish_round_session(study: Study, session_id: int, *, engine: Engine) -> svc.SessionView:
    """Stop a round session after its one answer (idempotent).

    The answer path chose a next question by the study's criterion (decision at position
    1); a round link asks one question only, so that decision becomes a stop
    (``item_id`` NULL, criterion ``group_round``) and the session is completed.
    """
    with svc.locked_session(engine, session_id) as (db, sess):
        n = int(
            db.exec(
                select(func.count()).select_from(Answer).where(Answer.session_id == session_id)
            ).one()
        )
        if n >= 1:
            nxt = db.exec(
                select(SelectionDecision).where(
                    SelectionDecision.session_id == session_id, SelectionDecision.position == 1
                )
            ).first()
            if nxt is not None and (nxt.item_id is not None or nxt.criterion != ROUND_CRITERION):
                nxt.item_id = None
                nxt.criterion = ROUND_CRITERION
                nxt.scores = {}
                nxt.stop_reason = ONE_QUESTION_STOP
                db.add(nxt)
            if sess.status != SessionStatus.completed.value:
                sess.status = SessionStatus.completed.value
                sess.completed_at = utcnow()
                sess.updated_at = utcnow()
                db.add(sess)
        db.commit()
        return svc.session_view(study, sess, session=db)


def stop_answered_round_sessions(db: Session, session_ids: list[int]) -> None:
    """:func:`finish_round_session` for many answered round sessions at once, inside the
    caller's transaction, which must hold their write locks (closing a round does): each
    next-question decision (position 1) becomes the stop and each session is completed.
    Two statements whatever the number of sessions; sessions already finished are left
    as they are."""
    if not session_ids:
        return
    now = utcnow()
    db.execute(
        update(SelectionDecision)
        .where(
            col(SelectionDecision.session_id).in_(session_ids),
            SelectionDecision.position == 1,
            or_(
                col(SelectionDecision.item_id).is_not(None),
                SelectionDecision.criterion != ROUND_CRITERION,
            ),
        )
        .values(item_id=None, criterion=ROUND_CRITERION, scores={}, stop_reason=ONE_QUESTION_STOP)
    )
    db.execute(
        update(ElicitationSession)
        .where(
            col(ElicitationSession.id).in_(session_ids),
            ElicitationSession.status != SessionStatus.completed.value,
        )
        .values(status=SessionStatus.completed.value, completed_at=now, updated_at=now)
    )
