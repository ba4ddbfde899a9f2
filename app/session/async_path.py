"""The answer call and the API's session start on PostgreSQL in the event loop.

The same steps as the synchronous fast path (:mod:`app.session.fast`: the same SQL, the
same :func:`~app.session.fast.fast_step`) through psycopg's asyncio connections, so a
process serves its answers one model step at a time in its event loop and overlaps only
the database waits, without crossing into the thread pool:

* :func:`read_session_and_history` / :func:`read_counted_session_and_history`: the session
  by its token and its answers and pending decision in one statement (the second with the
  API rate limiter's counter hit in the same statement);
* :func:`submit_answer`: the model step, then answer + decision + state in one statement
  conditional on ``state_version``;
* :func:`owned_study` and :func:`start_session`: the API key and the study checked in one
  statement, then the first decision and the one insert (:data:`~app.session.sql.PG_START`).

Anything unusual (a retry, a conflict, a concurrent answer, a stale cached state, a study
runtime not built yet in this process) goes to the thread pool and the synchronous code
(:func:`app.session.submit.submit_answer`, :func:`app.session.start.start_session`),
which stays the single source of those rules. Both write with the same conditional
statement, so they may run side by side in any number of processes.

Only for PostgreSQL with ``psycopg_pool`` installed (:func:`enabled_for`); the setting
``async_answers`` (``PRIORLY_ASYNC_ANSWERS=0``) turns it off. SQLite always uses the
thread pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Engine, make_url
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app import ratelimit
from app.services.apikeys import KEY_PREFIX, AuthenticationError, hash_key
from app.services.learning import maybe_queue_refit, refit_every
from app.session.errors import StudyNotFoundError
from app.session.fast import FastStep, fast_snapshot_usable, fast_step
from app.session.runtime import load_runtime, peek_runtime, runtime_key
from app.session.sql import (
    PG_SNAPSHOT_AND_HISTORY_BY_TOKEN,
    PG_START,
    PG_WRITE,
    SessionSnapshot,
    StudyHead,
    driver_sql,
    snapshot_of,
)
from app.session.start import StartedSession, check_start, external_id_taken, plan_start
from app.session.start import start_session as start_session_sync
from app.session.submit import answered_item, check_idempotency_key
from app.session.submit import submit_answer as submit_answer_sync
from app.session.tokens import hash_token
from app.session.views import SessionView
from app.settings import get_settings
from app.tables import SessionStatus, Study

try:  # the ``postgres`` extra; without it this path is never enabled (enabled_for)
    import psycopg
    from psycopg_pool import AsyncConnectionPool
except ImportError:  # pragma: no cover - the postgres extra installs both
    psycopg = None  # type: ignore[assignment]
    AsyncConnectionPool = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

_PG = "postgresql"

STATS = {"fast": 0, "handed_over": 0, "start_fast": 0, "start_handed_over": 0}
"""Per process: answers stored by the event-loop path, and answers it handed to the
synchronous code (a retry, a conflict, a lost race, a cold runtime); the same for
session starts (``start_*``). Read by tests and by ``scripts/loadtest_probe.py``; never
reset by the app."""


def enabled_for(engine: Engine) -> bool:
    """Whether the app should open an :class:`AsyncAnswerDatabase` for ``engine``."""
    if engine.dialect.name != _PG or not get_settings().async_answers:
        return False
    return AsyncConnectionPool is not None


def conninfo(engine: Engine) -> str:
    """libpq connection URI of ``engine`` (the SQLAlchemy URL without the driver name)."""
    return make_url(engine.url).set(drivername="postgresql").render_as_string(hide_password=False)


class AsyncAnswerDatabase:
    """Two small asyncio connection pools of one process (opened in the app's lifespan).

    * ``pool``: autocommit connections for the answer call's reads and its one write
      (durable: the write commits with the server's ``synchronous_commit``).
    * ``limiter_pool``: autocommit connections with ``synchronous_commit = off`` for the
      API rate limiter's counter (a counter increment lost in a crash is harmless, and
      the call does not wait for the WAL flush), as in :mod:`app.ratelimit`.

    A checkout waits at most ``timeout`` seconds (then ``PoolTimeout``, a
    ``psycopg.OperationalError``: 503 ``database_unavailable``, like the synchronous pool).

    Pool sizes default to the settings ``async_pool_size`` and ``async_limiter_pool_size``
    (4 and 2). A coroutine holds its connection until the event loop resumes it, so under
    load some statements wait for a connection (docs/reliability.md has the figures).
    PostgreSQL's ``max_connections`` must exceed ``processes x (the two pools + the
    synchronous pool)``.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_size: int | None = None,
        limiter_max_size: int | None = None,
        timeout: float = 5.0,
    ) -> None:
        settings = get_settings()
        max_size = settings.async_pool_size if max_size is None else max_size
        if limiter_max_size is None:
            limiter_max_size = settings.async_limiter_pool_size
        info = conninfo(engine)

        async def _sync_off(conn: Any) -> None:
            await conn.execute("SET synchronous_commit = off")

        def pool(name: str, size: int, **kw: Any) -> Any:
            return AsyncConnectionPool(
                info,
                min_size=1,
                max_size=size,
                timeout=timeout,
                kwargs={"autocommit": True},
                open=False,
                name=name,
                **kw,
            )

        self.pool = pool("answers", max_size)
        self.limiter_pool = pool("limiter", limiter_max_size, configure=_sync_off)

    async def open(self) -> None:
        # wait=False: a database that is down at start-up is reported per call (503), as
        # with the synchronous engine, instead of failing the start.
        await self.pool.open(wait=False)
        await self.limiter_pool.open(wait=False)

    async def close(self) -> None:
        await self.pool.close()
        await self.limiter_pool.close()

    async def fetchone(self, statement: str, params: dict[str, Any]) -> Any:
        async with self.pool.connection() as conn:
            cur = await conn.execute(driver_sql(_PG, statement), params)
            return await cur.fetchone()

    def limiter_connection(self) -> Any:
        """A connection of the limiter's pool (``async with``): the rate limiter's
        statements and their rules stay in :func:`app.ratelimit.hit_async`."""
        return self.limiter_pool.connection()


# The API key's researcher and the study ``slug`` with what :func:`app.auth.can_see_study`
# needs (owner, shared with, admin): the rules of ``get_api_researcher`` and
# ``get_owned_study`` of app/routes/api_v1.py in one round trip.
_KEY_AND_STUDY = """
    SELECT k.revoked_at, r.id, r.is_active, r.is_admin,
           st.id, st.slug, st.status, st.settings, st.owner_id,
           EXISTS (SELECT 1 FROM study_share sh
                   WHERE sh.study_id = st.id AND sh.researcher_id = r.id)
    FROM api_key k JOIN researcher r ON r.id = k.researcher_id
    LEFT JOIN study st ON st.slug = :slug
    WHERE k.key_hash = :key_hash
"""


async def owned_study(db: AsyncAnswerDatabase, credential: str, slug: str) -> StudyHead:
    """The study ``slug`` if the API key ``credential`` may use it, in the event loop.

    The same rules and messages as the synchronous dependencies (``authenticate_api_key``,
    ``can_see_study``): 401 for a missing, unknown or revoked key or a deactivated
    researcher; 404 ``study_not_found`` for a study that does not exist or is not theirs
    (never 403, so a key cannot learn which studies exist).
    """
    if not credential.startswith(KEY_PREFIX):
        raise AuthenticationError("this call needs a researcher's API key")
    if len(credential) > 200:
        raise AuthenticationError("invalid API key")
    row = await db.fetchone(_KEY_AND_STUDY, {"key_hash": hash_key(credential), "slug": slug})
    if row is None:
        raise AuthenticationError("invalid API key")
    revoked_at, researcher_id, active, admin, study_id, st_slug, status, settings, owner, shared = (
        row
    )
    if revoked_at is not None:
        raise AuthenticationError("this API key was revoked")
    if not active:
        raise AuthenticationError("the researcher of this API key is deactivated")
    if study_id is None or not (admin or (owner is not None and owner == researcher_id) or shared):
        raise StudyNotFoundError(f"no study {slug!r} among your studies")
    if isinstance(settings, str | bytes):
        settings = json.loads(settings)
    return StudyHead(
        id=int(study_id),
        slug=str(st_slug),
        status=str(status),
        settings=dict(settings or {}),
        owner_id=owner,
    )


async def start_session(
    db: AsyncAnswerDatabase,
    study: StudyHead,
    *,
    engine: Engine,
    attributes: dict[str, str] | None,
    external_id: str | None,
) -> StartedSession:
    """:func:`app.session.start.start_session` (API form: drafts allowed, attributes
    given) with the study's runtime cached: the prior state and first decision in the
    event loop and respondent + session + decision in one statement (the same
    :func:`~app.session.start.plan_start` and :data:`~app.session.sql.PG_START` as the
    synchronous code). A study whose runtime this process has not built yet goes to the
    thread pool (the build may fit a model).

    Raises: what :func:`app.session.start.start_session` raises.
    """
    params = check_start(study, external_id, None, True)
    rt, fresh = peek_runtime(study, engine=engine)
    if rt is None:
        STATS["start_handed_over"] += 1
        return await run_in_threadpool(_start_sync, study, engine, attributes, external_id)
    if not fresh:
        _refresh_runtime(study, engine)
    plan = plan_start(rt, study.id, attributes, external_id, params, False, _PG)
    try:
        row = await db.fetchone(PG_START, plan.values)
    except psycopg.IntegrityError:
        if external_id is None:
            raise
        raise external_id_taken(external_id) from None
    STATS["start_fast"] += 1
    return plan.started(int(row[0]), int(row[1]))


def _start_sync(
    head: StudyHead,
    engine: Engine,
    attributes: dict[str, str] | None,
    external_id: str | None,
) -> StartedSession:
    """The synchronous start with the study's ORM row (a first runtime build may fit)."""
    with Session(engine) as db:
        study = db.get(Study, head.id)
    if study is None:  # deleted between the two reads
        raise StudyNotFoundError(f"no study {head.slug!r} among your studies")
    return start_session_sync(
        study, engine=engine, attributes=attributes, external_id=external_id, allow_draft=True
    )


async def read_session_and_history(
    db: AsyncAnswerDatabase, token: str
) -> tuple[SessionSnapshot, list[Any]] | None:
    """:func:`app.session.sql.read_session_by_token` and the session's
    :data:`~app.session.sql.HISTORY` rows at its ``state_version``, in one statement
    (:data:`~app.session.sql.PG_SNAPSHOT_AND_HISTORY_BY_TOKEN`); ``None`` for an
    unknown token."""
    if not token or len(token) > 200:
        return None
    row = await db.fetchone(PG_SNAPSHOT_AND_HISTORY_BY_TOKEN, {"token_hash": hash_token(token)})
    return None if row is None else _snapshot_and_history(row)


def _snapshot_and_history(row: Sequence[Any]) -> tuple[SessionSnapshot, list[Any]]:
    """A row of :data:`~app.session.sql.PG_SNAPSHOT_AND_HISTORY_BY_TOKEN` as
    ``(snapshot, history rows)``."""
    history = row[12]
    if isinstance(history, str | bytes):
        history = json.loads(history)
    return snapshot_of(row), list(history or [])


# The API limiter's counter hit (app/ratelimit.py) and the read above in ONE statement:
# the counter row is written whether or not the token is known (as the middleware counts
# before any authorization), the session's columns are NULL for an unknown token.
_HIT_AND_SNAPSHOT = (
    "WITH hit AS ("
    + ratelimit.PG_UPSERT_SQL
    + ") SELECT hit.count, hit.expires_at, snap.* FROM hit LEFT JOIN ("
    + driver_sql(_PG, PG_SNAPSHOT_AND_HISTORY_BY_TOKEN)
    + ") snap ON true"
)


async def read_counted_session_and_history(
    db: AsyncAnswerDatabase, token: str, counter_key: str, *, now: float | None = None
) -> tuple[int, float, tuple[SessionSnapshot, list[Any]] | None]:
    """:func:`read_session_and_history` with the API rate limiter's hit of
    ``counter_key`` (:func:`app.ratelimit.hit_async`) in the same statement, on the
    limiter's connections (``synchronous_commit = off``: the read is unaffected, the
    counter needs no flush). Returns ``(count, window end, read or None)``; the caller
    refuses the call when the count is over its limit."""
    now = time.time() if now is None else now
    params = {
        "key": counter_key,
        "now": now,
        "expires": now + ratelimit.API_WINDOW_S,
        "token_hash": hash_token(token) if token and len(token) <= 200 else "",
    }
    async with db.limiter_connection() as conn:
        cur = await conn.execute(_HIT_AND_SNAPSHOT, params)
        row = await cur.fetchone()
        count, expires = int(row[0]), float(row[1])
        if count == 1:
            await conn.execute(ratelimit.PG_CLEANUP_SQL, {"now": now})
    return count, expires, None if row[2] is None else _snapshot_and_history(row[2:])


async def submit_answer(
    db: AsyncAnswerDatabase,
    snap: SessionSnapshot,
    *,
    item_key: str,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
    history: list[Any],
) -> SessionView:
    """:func:`app.session.submit.submit_answer` for the session ``snap`` (read by the
    caller's authorization): the fast path here, everything else in the thread pool.
    ``history``: the session's HISTORY rows at ``snap.state_version``, read with the
    snapshot (:func:`read_session_and_history`).

    Raises: what :func:`app.session.submit.submit_answer` raises.
    """
    study = snap.study
    check_idempotency_key(idempotency_key)
    rt, fresh = peek_runtime(study, engine=engine)
    if rt is not None and not fresh:
        _refresh_runtime(study, engine)
    if rt is not None and snap.model_id not in (None, rt.model_id):
        rt = None  # a session of an earlier model: the synchronous path loads that model
    if rt is not None:
        item = answered_item(rt, item_key, option)
        if fast_snapshot_usable(rt, snap):
            step = fast_step(rt, snap, item, option, idempotency_key, history, _PG)
            if step is not None and await _write(db, step):
                STATS["fast"] += 1
                view = step.view(rt)
                if view.status == SessionStatus.completed.value and refit_every(study.settings):
                    await run_in_threadpool(
                        maybe_queue_refit, rt.study_id, study.settings, engine=engine
                    )
                return view
    STATS["handed_over"] += 1
    return await run_in_threadpool(
        submit_answer_sync,
        study,
        snap.id,
        item_key=item_key,
        option=option,
        idempotency_key=idempotency_key,
        engine=engine,
    )


_REFRESHING: dict[tuple[str, int, str], asyncio.Task[None]] = {}


def _refresh_runtime(study: StudyHead, engine: Engine) -> None:
    """Rebuild the study's runtime in the thread pool, once at a time per study, while
    answers go on with the stale one (at most
    :data:`~app.session.runtime.RUNTIME_TTL_S` old, as with the synchronous path)."""
    key = runtime_key(engine, study)
    if key in _REFRESHING:
        return

    async def refresh() -> None:
        try:
            await run_in_threadpool(load_runtime, study, engine=engine, fit_if_missing=False)
        except Exception as exc:  # the next answer retries; the call itself is unaffected
            log.warning("study runtime refresh failed: %s", type(exc).__name__)
        finally:
            _REFRESHING.pop(key, None)

    _REFRESHING[key] = asyncio.get_running_loop().create_task(refresh())


async def _write(db: AsyncAnswerDatabase, step: FastStep) -> bool:
    """The conditional write; ``False`` when it wrote nothing (another answer was stored
    since the read, or a unique constraint fired): the synchronous path then decides."""
    try:
        return await db.fetchone(PG_WRITE, step.params) is not None
    except psycopg.IntegrityError:
        return False
