"""Submitting an answer: the one entry of every answer (browser, API, group rounds).

:func:`submit_answer` checks the answer against the study runtime, then tries the fast
path (:func:`app.session.fast.submit_fast`: unlocked reads, the model step, one write
conditional on ``state_version``) and hands anything unusual to the locked path
(:func:`app.session.locked.submit_locked`). Both store the same rows; the event-loop path
of :mod:`app.session.async_path` runs the fast path's steps itself and falls back here.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from app.services.learning import maybe_queue_refit
from app.session.errors import InvalidAnswerError, ItemNotFoundError, SessionClosedError
from app.session.fast import submit_fast
from app.session.locked import locked_session, submit_locked, write_slots
from app.session.runtime import ItemInfo, StudyRuntime, load_runtime, session_runtime
from app.session.sql import SessionSnapshot, StudyHead, read_session
from app.session.tokens import mark_completed
from app.session.views import SessionView, check_study, session_view
from app.tables import SessionStatus, Study, utcnow
from app.textguard import clip

IDEMPOTENCY_KEY_MAX = 128
"""The longest idempotency key accepted (characters)."""


def submit_answer(
    study: Study | StudyHead,
    session_id: int,
    *,
    item_key: str,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
    snapshot: SessionSnapshot | None = None,
) -> SessionView:
    """Store an answer (``option`` ``None`` = "prefer not to answer") and choose the next item.

    The session is answered with the model it started with (:func:`session_runtime`); an
    answer that completes it may queue a refit (:func:`maybe_queue_refit`: a cheap check,
    never a fit).

    Args:
        snapshot: the session row as the caller's authorization read it (saves a read);
            read here when ``None``. It is only a hint: the write is conditional on it.

    Returns:
        The view after the answer: the next question, or completion.

    Raises:
        SessionNotFoundError, ItemNotFoundError (404); InvalidAnswerError (422: unknown
        option, skip not allowed, bad key); AnswerConflictError, NotCurrentQuestionError,
        SessionClosedError (409).

    Idempotent: a request whose ``idempotency_key`` was already used in the session, or
    that repeats the stored answer to an item, returns the view that followed the stored
    answer, marked ``replayed`` (:attr:`SessionView.replayed`; a fresh answer's view is
    not); the same key or item with a different answer is a conflict (409), and so is an
    item that is not the pending question. Nothing is acknowledged before the answer, the
    state and the next decision are committed together.
    """
    check_idempotency_key(idempotency_key)
    rt = load_runtime(study, engine=engine, fit_if_missing=False)
    if snapshot is None or snapshot.id != session_id:
        snapshot = read_session(session_id, engine=engine)
    if snapshot is not None:  # a session keeps the model it started with
        rt = session_runtime(rt, study, snapshot.model_id, engine=engine)
    item = answered_item(rt, item_key, option)
    view = _submit(rt, session_id, item, option, idempotency_key, engine, snapshot)
    if view.status == SessionStatus.completed.value:
        maybe_queue_refit(rt.study_id, study.settings, engine=engine)
    return view


FINISHED = "finished"
"""The stop reason of a session its client finished before the study's stopping rule."""


def finish_session(study: Study, session_id: int, *, engine: Engine) -> SessionView:
    """End a session now, as completed, before the study's stopping rule (e.g. a product
    that asks a user 3 questions): its answers so far count as a completed respondent's,
    for the refit schedule too (:func:`maybe_queue_refit`).

    Under the session's write lock: an answer racing it either lands before (and is kept)
    or is refused afterwards (409 ``session_closed``; the answer writes are conditional
    on ``status = 'active'``). Finishing a completed session again returns its view.

    Raises:
        SessionNotFoundError (404); SessionClosedError (409: abandoned).
    """
    with locked_session(engine, session_id) as (db, sess):
        check_study(sess, study.id or 0, study.slug)
        if sess.status == SessionStatus.active.value:
            sess.updated_at = utcnow()
            mark_completed(db, sess, sess.updated_at)
            db.add(sess)
            db.commit()
            finished = True
        elif sess.status == SessionStatus.completed.value:
            finished = False
        else:
            raise SessionClosedError(f"session {sess.id} is {sess.status}")
        view = session_view(study, sess, session=db)
    if finished:
        maybe_queue_refit(study.id or 0, study.settings, engine=engine)
    return view


def _submit(
    rt: StudyRuntime,
    session_id: int,
    item: ItemInfo,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
    snapshot: SessionSnapshot | None,
) -> SessionView:
    with write_slots():
        view = submit_fast(rt, session_id, item, option, idempotency_key, engine, snapshot)
        if view is not None:
            return view
        for attempt in range(2):
            try:
                return submit_locked(rt, session_id, item, option, idempotency_key, engine)
            except IntegrityError:
                # A unique constraint caught a concurrent duplicate (only possible if the
                # lock was bypassed); the second attempt finds the stored row and answers
                # from it.
                if attempt == 1:
                    raise
    raise AssertionError("unreachable")


def check_idempotency_key(idempotency_key: str | None) -> None:
    """Raise :class:`InvalidAnswerError` for an idempotency key of a bad length."""
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= IDEMPOTENCY_KEY_MAX:
        raise InvalidAnswerError(f"idempotency_key must be 1 to {IDEMPOTENCY_KEY_MAX} characters")


def answered_item(rt: StudyRuntime, item_key: str, option: str | None) -> ItemInfo:
    """The item ``item_key`` of the study, checked against ``option`` (``None`` = skip).

    Raises:
        ItemNotFoundError (404); InvalidAnswerError (422: unknown option, skip not allowed).
    """
    item = rt.by_key.get(item_key)
    if item is None:
        raise ItemNotFoundError(f"item {clip(item_key, 80)!r} is not an item of study {rt.slug!r}")
    if option is not None and option not in [o[0] for o in item.options]:
        letters = ", ".join(o[0] for o in item.options)
        raise InvalidAnswerError(
            f"option {clip(option, 40)!r} is not an option of item {item_key!r} ({letters})"
        )
    if option is None and not rt.allow_skip:
        raise InvalidAnswerError(f"study {rt.slug!r} does not allow skipping a question")
    return item
