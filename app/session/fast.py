"""The fast path of an answer: two unlocked reads, the model step, one conditional write.

Optimistic concurrency: every stored answer increments ``elicitation_session.state_version``
in the same transaction, so a write conditional on the version read before the model step
stores nothing when another answer came in between; :func:`submit_fast` then returns
``None`` and the locked path answers. :func:`fast_step` (no I/O) is shared with the
event-loop path (:mod:`app.session.async_path`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from app.session.decide import model_step
from app.session.runtime import ItemInfo, StudyRuntime
from app.session.sql import (
    HISTORY,
    INSERT_ANSWER,
    INSERT_DECISION,
    PG_WRITE,
    SNAPSHOT_BY_ID,
    UPDATE_IF_UNCHANGED,
    AnswerRow,
    SessionSnapshot,
    dbapi_connection,
    driver_sql,
    read_snapshot,
    snapshot_of,
    timestamp_param,
)
from app.session.views import SessionView, plain_view
from app.tables import SessionStatus, utcnow


def submit_fast(
    rt: StudyRuntime,
    session_id: int,
    item: ItemInfo,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
    snap: SessionSnapshot | None,
) -> SessionView | None:
    """The common case in one conditional write; ``None`` hands over to the locked path.

    1. reads (no lock): the session row (unless the caller's authorization read it), then
       its answers and the pending decision in one statement;
    2. anything unusual — a known idempotency key, an item already answered, a closed
       session, an item that is not the pending question, a cached state that is not
       current — returns ``None`` (the locked path answers those);
    3. the model step (update, selection) runs without any lock;
    4. one write, conditional on ``state_version`` still being ``n`` (every answer
       increments it in the same transaction, so an unchanged version means no answer
       was stored in between): the session's new state and version, the answer row and
       the decision row, atomically. PostgreSQL: one statement; SQLite: ``BEGIN
       IMMEDIATE`` and three short statements. When the condition fails (a concurrent
       answer won) or a unique constraint fires, nothing was written and ``None`` is
       returned.

    Steps 2-3 are :func:`fast_step` (shared with the event-loop path of
    :mod:`app.session.async_path`).
    """
    with dbapi_connection(engine) as (raw, dialect):
        if snap is None or snap.id != session_id:
            row = read_snapshot(raw, dialect, SNAPSHOT_BY_ID, {"sid": session_id})
            if row is None:
                return None
            snap = snapshot_of(row)
        if not fast_snapshot_usable(rt, snap):
            return None
        cur = raw.cursor()
        try:
            cur.execute(
                driver_sql(dialect, HISTORY), {"sid": session_id, "pos": snap.state_version}
            )
            history = cur.fetchall()
        finally:
            cur.close()
    step = fast_step(rt, snap, item, option, idempotency_key, history, dialect)
    if step is None:
        return None
    with dbapi_connection(engine) as (raw, dialect):
        cur = raw.cursor()
        try:
            if dialect == "postgresql":
                cur.execute(driver_sql(dialect, PG_WRITE), step.params)
                if cur.fetchone() is None:
                    return None
            else:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    cur.execute(UPDATE_IF_UNCHANGED, step.params)
                    if cur.rowcount != 1:
                        raw.rollback()
                        return None
                    cur.execute(INSERT_ANSWER, step.params)
                    cur.execute(INSERT_DECISION, step.params)
                    raw.commit()
                except BaseException:
                    raw.rollback()
                    raise
        except engine.dialect.dbapi.IntegrityError:  # type: ignore[union-attr]
            return None
        finally:
            cur.close()
    return step.view(rt)


def fast_snapshot_usable(rt: StudyRuntime, snap: SessionSnapshot) -> bool:
    """Whether the fast path may start from ``snap`` (an active session of this study
    with a cached state of ``rt``'s model); otherwise the locked path answers."""
    return (
        snap.study_id == rt.study_id
        and snap.status == SessionStatus.active.value
        and snap.state is not None
        and snap.model_id in (None, rt.model_id)
    )


@dataclass(frozen=True)
class FastStep:
    """The outcome of the fast path's model step: the write's parameters (for
    :data:`PG_WRITE` or the SQLite statements) and what to show once it succeeded."""

    params: dict[str, Any]
    session_id: int
    next_item_id: int | None
    stop_reason: str | None
    n_posed: int

    def view(self, rt: StudyRuntime) -> SessionView:
        """The view to return once the write succeeded."""
        return plain_view(rt, self.session_id, self.next_item_id, self.stop_reason, self.n_posed)


def fast_step(
    rt: StudyRuntime,
    snap: SessionSnapshot,
    item: ItemInfo,
    option: str | None,
    idempotency_key: str | None,
    history: Sequence[Sequence[Any]],
    dialect: str,
) -> FastStep | None:
    """Steps 2-3 of :func:`submit_fast` (no I/O): check ``history`` (the rows of
    :data:`HISTORY` read after ``snap``), update the cached state with the answer, choose
    the next item, and build the conditional write; ``None`` when anything is unusual
    (the locked path answers it)."""
    n0 = snap.state_version
    answers = [AnswerRow(r[2], r[3], r[4]) for r in history if r[0] == 0]
    pending = [r[2] for r in history if r[0] == 1]
    if (
        len(answers) != n0
        or pending != [item.id]
        or any(a.item_id == item.id for a in answers)
        or (
            idempotency_key is not None
            and any(a.idempotency_key == idempotency_key for a in answers)
        )
    ):
        return None
    assert snap.state is not None
    answers.append(AnswerRow(item.id, option, idempotency_key))
    step = model_step(rt, snap.state, snap.id, answers, item, option)
    n1 = n0 + 1
    done = step.item_id is None
    now = timestamp_param(dialect, utcnow())
    params = {
        "sid": snap.id,
        "v0": n0,
        "v1": n1,
        "state": step.state,
        "new_status": SessionStatus.completed.value if done else SessionStatus.active.value,
        "now": now,
        "completed_at": now if done else None,
        "completes": done,
        "item_id": item.id,
        "option": option,
        "idempotency_key": idempotency_key,
        "d_item_id": step.item_id,
        "criterion": step.criterion,
        "scores": step.scores_json,
        "stop_reason": step.stop_reason,
    }
    return FastStep(params, snap.id, step.item_id, step.stop_reason, n1)
