"""The raw SQL of the live loop and the plain row objects it reads and writes.

The statements that run on every answer or start go straight to the pooled DB-API
connection (psycopg / sqlite3): through SQLAlchemy Core each costs ~0.5 ms of CPU, raw
~0.03-0.1 ms. They are written once with ``:name`` parameters and translated for psycopg
by :func:`driver_sql`; everything else in the app uses the ORM.

* reads: :data:`SNAPSHOT_BY_ID` / :data:`SNAPSHOT_BY_TOKEN` (a session row with its
  study's head, :class:`SessionSnapshot`), :data:`HISTORY` (the answers and the pending
  decision), :data:`PG_SNAPSHOT_AND_HISTORY_BY_TOKEN` (both in one statement);
* the answer's write, conditional on ``state_version``: :data:`PG_WRITE` (one statement)
  or :data:`UPDATE_IF_UNCHANGED` + :data:`INSERT_ANSWER` + :data:`INSERT_DECISION`;
* the start's write: :data:`PG_START` or :data:`INSERT_RESPONDENT` +
  :data:`INSERT_SESSION` + :data:`INSERT_FIRST_DECISION`.

A write that completes the session also stores its ``completion_code``: the study's fixed
code read in that statement, ``''`` without one (:func:`app.session.tokens.code_at_completion`
for the ORM writes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine

from app.session.tokens import hash_token
from app.tables import SelectionDecision


@dataclass(frozen=True)
class StudyHead:
    """The columns of a study row that a live session needs (a plain, cacheable copy)."""

    id: int
    slug: str
    status: str
    settings: dict[str, Any]
    owner_id: int | None


@dataclass(frozen=True)
class SessionSnapshot:
    """One read of an ``elicitation_session`` row with its study's head (no lock held).

    ``state`` is the cached belief state after ``state_version`` answers. A snapshot is
    never trusted for a write: the write is conditional on ``state_version`` being
    unchanged (see :func:`app.session.fast.submit_fast`).
    """

    id: int
    study_id: int
    respondent_id: int
    token_hash: str
    status: str
    state: bytes | None
    state_version: int
    study: StudyHead
    model_id: int | None = None


_SNAPSHOT_SQL = """
    SELECT s.id, s.study_id, s.respondent_id, s.token_hash, s.status, s.state,
           s.state_version, st.slug, st.status, st.settings, st.owner_id, s.model_id
    FROM elicitation_session s JOIN study st ON st.id = s.study_id
    WHERE {where}
"""
SNAPSHOT_BY_ID = _SNAPSHOT_SQL.format(where="s.id = :sid")
SNAPSHOT_BY_TOKEN = _SNAPSHOT_SQL.format(where="s.token_hash = :token_hash")
# The answers of a session (kind 0, in order) and its decision at ``pos`` (kind 1).
HISTORY = """
    SELECT 0 AS kind, id AS n, item_id, option, idempotency_key
    FROM answer WHERE session_id = :sid
    UNION ALL
    SELECT 1, position, item_id, NULL, NULL
    FROM selection_decision WHERE session_id = :sid AND position = :pos
    ORDER BY 1, 2
"""
# PostgreSQL: the snapshot by token and the rows of :data:`HISTORY` at the snapshot's
# ``state_version`` in one round trip (column 12: a JSON array of ``[kind, n, item_id,
# option, idempotency_key]``, ``null`` without rows): the answer call's reads as one
# statement (each statement costs the worker a few hundred microseconds of driver and
# event-loop work).
PG_SNAPSHOT_AND_HISTORY_BY_TOKEN = """
    SELECT s.id, s.study_id, s.respondent_id, s.token_hash, s.status, s.state,
           s.state_version, st.slug, st.status, st.settings, st.owner_id, s.model_id,
           (SELECT json_agg(json_build_array(h.kind, h.n, h.item_id, h.option,
                                             h.idempotency_key) ORDER BY h.kind, h.n)
            FROM (SELECT 0 AS kind, a.id AS n, a.item_id, a.option, a.idempotency_key
                  FROM answer a WHERE a.session_id = s.id
                  UNION ALL
                  SELECT 1, d.position, d.item_id, NULL, NULL
                  FROM selection_decision d
                  WHERE d.session_id = s.id AND d.position = s.state_version) h)
    FROM elicitation_session s JOIN study st ON st.id = s.study_id
    WHERE s.token_hash = :token_hash
"""
UPDATE_IF_UNCHANGED = """
    UPDATE elicitation_session
    SET state = :state, state_version = :v1, status = :new_status,
        updated_at = :now, completed_at = :completed_at,
        completion_code = CASE WHEN :completes THEN COALESCE(
            (SELECT st.completion_code FROM study st
             WHERE st.id = elicitation_session.study_id), '') END
    WHERE id = :sid AND state_version = :v0 AND status = 'active'
"""
INSERT_ANSWER = """
    INSERT INTO answer (session_id, item_id, option, idempotency_key, created_at)
    VALUES (:sid, :item_id, :option, :idempotency_key, :now)
"""
INSERT_DECISION = """
    INSERT INTO selection_decision
        (session_id, position, item_id, criterion, scores, stop_reason, created_at)
    VALUES (:sid, :v1, :d_item_id, :criterion, :scores, :stop_reason, :now)
"""
# PostgreSQL: the conditional update and both inserts in ONE statement (one round trip,
# atomic without BEGIN/COMMIT): the inserts select from the update's RETURNING, so nothing
# is inserted when the session changed since it was read.
PG_WRITE = """
    WITH s AS (
        UPDATE elicitation_session
        SET state = :state, state_version = :v1, status = :new_status,
            updated_at = :now, completed_at = :completed_at,
            completion_code = CASE WHEN :completes THEN COALESCE(
                (SELECT st.completion_code FROM study st
                 WHERE st.id = elicitation_session.study_id), '') END
        WHERE id = :sid AND state_version = :v0 AND status = 'active'
        RETURNING id
    ), a AS (
        INSERT INTO answer (session_id, item_id, option, idempotency_key, created_at)
        SELECT id, :item_id, :option, :idempotency_key, :now FROM s
        RETURNING id
    )
    INSERT INTO selection_decision
        (session_id, position, item_id, criterion, scores, stop_reason, created_at)
    SELECT s.id, :v1, :d_item_id, :criterion, CAST(:scores AS json), :stop_reason, :now
    FROM s JOIN a ON true
    RETURNING id
"""
_PARAM = re.compile(r"(?<![:\w]):(\w+)")
_PG_SQL: dict[str, str] = {}


def driver_sql(dialect: str, statement: str) -> str:
    """``statement`` with ``:name`` parameters in the driver's style (psycopg: ``%(name)s``)."""
    if dialect != "postgresql":
        return statement  # sqlite3 takes :name
    out = _PG_SQL.get(statement)
    if out is None:
        out = _PG_SQL[statement] = _PARAM.sub(r"%(\1)s", statement)
    return out


@contextmanager
def dbapi_connection(engine: Engine) -> Iterator[tuple[Any, str]]:
    """A pooled DB-API connection and the dialect name; PostgreSQL in autocommit mode (each
    statement its own transaction: no BEGIN/ROLLBACK round trips for the reads)."""
    fairy = engine.raw_connection()
    dialect = engine.dialect.name
    raw = fairy.dbapi_connection
    try:
        if dialect == "postgresql":
            raw.autocommit = True  # type: ignore[union-attr]
        yield raw, dialect
    finally:
        try:
            if dialect == "postgresql":
                raw.autocommit = False  # type: ignore[union-attr]
        finally:
            fairy.close()  # back to the pool (which rolls back anything left open)


def timestamp_param(dialect: str, when: datetime) -> Any:
    """A timestamp parameter as SQLAlchemy's ``DateTime`` stores it on this backend."""
    if dialect == "sqlite":
        return when.strftime("%Y-%m-%d %H:%M:%S.%f")
    return when


def snapshot_of(row: Sequence[Any]) -> SessionSnapshot:
    """A row of :data:`SNAPSHOT_BY_ID` / :data:`SNAPSHOT_BY_TOKEN` (or the first 12 columns
    of :data:`PG_SNAPSHOT_AND_HISTORY_BY_TOKEN`) as a :class:`SessionSnapshot`."""
    settings = row[9]
    if isinstance(settings, str | bytes):
        settings = json.loads(settings)
    return SessionSnapshot(
        id=int(row[0]),
        study_id=int(row[1]),
        respondent_id=int(row[2]),
        token_hash=str(row[3]),
        status=str(row[4]),
        state=bytes(row[5]) if row[5] is not None else None,
        state_version=int(row[6]),
        study=StudyHead(
            id=int(row[1]),
            slug=str(row[7]),
            status=str(row[8]),
            settings=dict(settings or {}),
            owner_id=row[10],
        ),
        model_id=None if row[11] is None else int(row[11]),
    )


def read_snapshot(raw: Any, dialect: str, statement: str, params: dict[str, Any]) -> Any:
    """The one row of a snapshot ``statement`` on a DB-API connection, or ``None``."""
    cur = raw.cursor()
    try:
        cur.execute(driver_sql(dialect, statement), params)
        return cur.fetchone()
    finally:
        cur.close()


def read_session(session_id: int, *, engine: Engine) -> SessionSnapshot | None:
    """The session ``session_id`` with its study's head (one statement, no lock)."""
    with dbapi_connection(engine) as (raw, dialect):
        row = read_snapshot(raw, dialect, SNAPSHOT_BY_ID, {"sid": session_id})
    return None if row is None else snapshot_of(row)


def read_session_by_token(token: str, *, engine: Engine) -> SessionSnapshot | None:
    """The session whose token is ``token`` (by its SHA-256; one statement, no lock)."""
    if not token or len(token) > 200:
        return None
    with dbapi_connection(engine) as (raw, dialect):
        row = read_snapshot(raw, dialect, SNAPSHOT_BY_TOKEN, {"token_hash": hash_token(token)})
    return None if row is None else snapshot_of(row)


INSERT_RESPONDENT = """
    INSERT INTO respondent
        (study_id, external_id, attributes, answers, panel_params, source, split,
         earlier_starts, created_at)
    VALUES (:study_id, :external_id, :attributes, '{}', :panel_params, 'live', NULL,
        :earlier_starts, :now)
"""
INSERT_SESSION = """
    INSERT INTO elicitation_session (study_id, respondent_id, token_hash, status, state,
        state_version, created_at, updated_at, completed_at, model_id, asked_attributes,
        completion_code)
    VALUES (:study_id, :respondent_id, :token_hash, :status, :state, 0, :now, :now,
        :completed_at, :model_id, :asked_attributes,
        CASE WHEN :completes THEN COALESCE(
            (SELECT st.completion_code FROM study st WHERE st.id = :study_id), '') END)
"""
INSERT_FIRST_DECISION = """
    INSERT INTO selection_decision
        (session_id, position, item_id, criterion, scores, stop_reason, created_at)
    VALUES (:sid, 0, :d_item_id, :criterion, :scores, :stop_reason, :now)
"""
# PostgreSQL: respondent, session and (when chosen) the first decision in one statement.
PG_START = """
    WITH r AS (
        INSERT INTO respondent
            (study_id, external_id, attributes, answers, panel_params, source, split,
             earlier_starts, created_at)
        VALUES (:study_id, :external_id, CAST(:attributes AS json), CAST('{}' AS json),
            CAST(:panel_params AS json), 'live', NULL, :earlier_starts, :now)
        RETURNING id
    ), s AS (
        INSERT INTO elicitation_session (study_id, respondent_id, token_hash, status, state,
            state_version, created_at, updated_at, completed_at, model_id, asked_attributes,
            completion_code)
        SELECT :study_id, r.id, :token_hash, :status, :state, 0, :now, :now, :completed_at,
            CAST(:model_id AS integer), :asked_attributes,
            CASE WHEN :completes THEN COALESCE(
                (SELECT st.completion_code FROM study st WHERE st.id = :study_id), '') END
        FROM r
        RETURNING id, respondent_id
    ), d AS (
        INSERT INTO selection_decision
            (session_id, position, item_id, criterion, scores, stop_reason, created_at)
        SELECT s.id, 0, :d_item_id, :criterion, CAST(:scores AS json), :stop_reason, :now
        FROM s WHERE :has_decision
    )
    SELECT id, respondent_id FROM s
"""


@dataclass(frozen=True)
class AnswerRow:
    """A stored answer as the fast path reads it (duck-types :class:`app.tables.Answer` for replays)."""

    item_id: int
    option: str | None
    idempotency_key: str | None


@dataclass
class DecisionRow:
    """The column values of a ``selection_decision`` row (a plain object: building the ORM
    row costs more than the rest of the bookkeeping, and the fast path writes with Core)."""

    session_id: int
    position: int
    item_id: int | None
    criterion: str
    scores: dict[str, Any]
    stop_reason: str | None

    def to_row(self) -> SelectionDecision:
        """The ORM row of these values."""
        return SelectionDecision(
            session_id=self.session_id,
            position=self.position,
            item_id=self.item_id,
            criterion=self.criterion,
            scores=self.scores,
            stop_reason=self.stop_reason,
        )
