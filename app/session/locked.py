"""The locked path: an answer stored under the session's write lock, and that lock.

:func:`submit_locked` answers everything the fast path hands over (retries, idempotent
replays, conflicts, a lost race, a stale cached state): one ORM transaction holding the
session's lock (:func:`locked_session`), in which the answer row is stored first, then the
state and the decision that follow from it, all committed together. :func:`write_slots`
bounds how many session writes one process runs at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.session.decide import decide_next
from app.session.errors import (
    AnswerConflictError,
    NotCurrentQuestionError,
    SessionClosedError,
    SessionNotFoundError,
)
from app.session.runtime import ItemInfo, StudyRuntime
from app.session.state import answers_of, current_state, dump_state
from app.session.tokens import mark_completed
from app.session.views import SessionView, check_study, decision_at, result_of, view_at
from app.settings import get_settings
from app.tables import Answer, ElicitationSession, Respondent, SessionStatus, utcnow

_SLOTS: list[threading.BoundedSemaphore] = []
_SLOTS_LOCK = threading.Lock()


def write_slots() -> threading.BoundedSemaphore:
    """The process's semaphore of session writes (``session_concurrency`` at once).

    A write is mostly CPU (the model update and selection step) under the GIL; running
    many at once in one process only makes each slower and lets them hold pooled
    connections longer. Further requests wait here, before taking a connection
    (backpressure). Created on first use from :func:`app.settings.get_settings`.
    """
    if not _SLOTS:
        with _SLOTS_LOCK:
            if not _SLOTS:
                size = max(1, get_settings().session_concurrency)
                _SLOTS.append(threading.BoundedSemaphore(size))
    return _SLOTS[0]


@contextmanager
def locked_session(engine: Engine, session_id: int) -> Iterator[tuple[Session, ElicitationSession]]:
    """A new database session holding the write lock on one elicitation session.

    PostgreSQL: ``SELECT ... FOR UPDATE`` of the session row (other sessions proceed in
    parallel). SQLite: ``BEGIN IMMEDIATE`` (the database's single write lock, taken
    before anything is read, so no two writers interleave a read and a write). The caller
    commits; anything else rolls back.

    Raises:
        SessionNotFoundError: no such session.
    """
    with Session(engine, expire_on_commit=False) as db:
        try:
            if engine.dialect.name == "sqlite":
                db.connection().exec_driver_sql("BEGIN IMMEDIATE")
                sess = db.get(ElicitationSession, session_id)
            else:
                sess = db.exec(
                    select(ElicitationSession)
                    .where(ElicitationSession.id == session_id)
                    .with_for_update()
                ).first()
            if sess is None:
                raise SessionNotFoundError(f"no session {session_id}")
            yield db, sess
        except BaseException:
            db.rollback()
            raise


def submit_locked(
    rt: StudyRuntime,
    session_id: int,
    item: ItemInfo,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
) -> SessionView:
    """Store the answer ``option`` to ``item`` under the session's lock; the general case
    (retries, idempotent replays, conflicts, a lost race of the fast path).

    A known idempotency key or an item answered before with the same option returns the
    view that followed that answer, marked ``replayed`` (idempotent); with a different item or option it is a
    conflict. Otherwise the answer must be to the pending question of an active session;
    the answer, the new state and the next decision are committed in one transaction.

    Raises:
        SessionNotFoundError (404); AnswerConflictError, SessionClosedError,
        NotCurrentQuestionError (409); sqlalchemy's IntegrityError when a unique constraint
        caught a concurrent duplicate (the caller retries once).
    """
    with locked_session(engine, session_id) as (db, sess):
        check_study(sess, rt.study_id, rt.slug)
        answers = answers_of(db, session_id)
        stored = _stored_answer(answers, item, option, idempotency_key)
        if stored is not None:
            view = replace(result_of(rt, db, sess, stored), replayed=True)
            db.commit()
            return view
        _check_pending(rt, db, sess, len(answers), item)
        row = Answer(
            session_id=session_id,
            item_id=item.id,
            option=option,
            idempotency_key=idempotency_key,
        )
        db.add(row)
        db.flush()  # the answer is stored first: the unique constraints apply here
        respondent = db.get(Respondent, sess.respondent_id)
        assert respondent is not None
        state = current_state(rt, sess, respondent, answers)
        if option is not None:
            idx = [o[0] for o in item.options].index(option)
            state = rt.model.update(state, rt.model_index[item.id], idx)
        answers.append(row)
        decision = decide_next(rt, state, session_id, answers).to_row()
        db.add(decision)
        sess.state = dump_state(state)
        sess.state_version = len(answers)
        sess.updated_at = utcnow()
        if decision.item_id is None:
            mark_completed(db, sess, sess.updated_at)
        db.add(sess)
        db.commit()
        return view_at(rt, sess, decision, len(answers))


def _stored_answer(
    answers: list[Answer], item: ItemInfo, option: str | None, idempotency_key: str | None
) -> Answer | None:
    """The stored answer this request repeats (same idempotency key, or the same item with
    the same option), or ``None`` for a new answer.

    Raises:
        AnswerConflictError: the key or the item was used for a different answer.
    """
    if idempotency_key is not None:
        same_key = next((a for a in answers if a.idempotency_key == idempotency_key), None)
        if same_key is not None:
            if same_key.item_id != item.id or same_key.option != option:
                raise AnswerConflictError(
                    f"idempotency_key {idempotency_key!r} was already used for a different "
                    f"answer in this session"
                )
            return same_key
    previous = next((a for a in answers if a.item_id == item.id), None)
    if previous is not None and previous.option != option:
        raise AnswerConflictError(
            f"item {item.key!r} was already answered in this session "
            f"({previous.option or 'skipped'}); an answer cannot be changed"
        )
    return previous


def _check_pending(
    rt: StudyRuntime, db: Session, sess: ElicitationSession, n_answers: int, item: ItemInfo
) -> None:
    """Raise unless ``item`` is the pending question of the active session ``sess``.

    Raises:
        SessionClosedError: the session is not active.
        NotCurrentQuestionError: no first question yet, or another question is pending.
    """
    if sess.status != SessionStatus.active.value:
        raise SessionClosedError(f"session {sess.id} is {sess.status}")
    pending = decision_at(db, sess.id or 0, n_answers)
    if pending is None:
        raise NotCurrentQuestionError(
            "this session has not chosen its first question yet (answer the attribute "
            "questions first)"
        )
    if pending.item_id != item.id:
        current = rt.by_id[pending.item_id].key if pending.item_id else None
        raise NotCurrentQuestionError(
            f"item {item.key!r} is not the current question"
            + (f" (the current question is {current!r})" if current else "")
        )
