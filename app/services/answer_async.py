"""The answer call and the API's session start on PostgreSQL without the thread pool: the
common case of each in the event loop.

Why: the answer call is the hottest path of the product (a respondent waits for the next
question). Run as a plain ``def`` route, each call crossed into the thread pool two or
three times (rate limiter, authorization, the route), and the threads of one process
then queued for the GIL behind each other on every database round trip: under 200
answers/s on a 2-core machine an answer spent ~12 ms waiting for ~2.5 ms of work, and
the slowest percent waited for hundreds of milliseconds (docs/respondents.md). Here the
same statements go through psycopg's asyncio connections, so a process serves its
answers one model step at a time in its event loop and overlaps only the waits.

What runs here is exactly the fast path of :mod:`app.services.sessions` (the same SQL,
the same :func:`~app.services.sessions.fast_step`): read the session by its token, read
its answers and pending decision, update the state and choose the next item, and write
answer + decision + state in one statement conditional on ``state_version``. Anything
unusual (a retry, a conflict, a concurrent answer, a stale cached state, an API key
instead of a session token, a study runtime to rebuild) goes to the thread pool and the
synchronous code, which stays the single source of those rules. Both paths write with
the same conditional statement, so they may run side by side in any number of processes.

Session starts through the API (``POST /api/v1/studies/{slug}/sessions``) follow the same
pattern: the API key and the study are checked in one statement (:func:`owned_study`),
and with the study's runtime cached the first decision and the one insert statement run
here (:func:`start_session`). Under load, bursts of starts run in the thread pool made
the slowest answers of the 1,000-respondent run wait behind them (docs/reliability.md).

Only for PostgreSQL with ``psycopg_pool`` installed; ``PRIORLY_ASYNC_ANSWERS=0`` turns it
off (everything then runs the synchronous code). SQLite always uses the thread pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Engine, make_url
from starlette.concurrency import run_in_threadpool

from app import ratelimit
from app.services import sessions as svc
from app.services.apikeys import KEY_PREFIX, AuthenticationError, hash_key

log = logging.getLogger(__name__)

_PG = "postgresql"

STATS = {"fast": 0, "handed_over": 0, "start_fast": 0, "start_handed_over": 0}
"""Per process: answers stored by the event-loop path, and answers it handed to the
synchronous code (a retry, a conflict, a lost race, a cold runtime); the same for
session starts (``start_*``). Read by tests and by the load test's breakdown; never reset
by the app."""


def enabled_for(engine: Engine) -> bool:
    """Whether the app should open an :class:`AsyncAnswerDatabase` for ``engine``."""
    if engine.dialect.name != _PG or os.environ.get("PRIORLY_ASYNC_ANSWERS", "1") == "0":
        return False
    try:
        import psycopg_pool  # noqa: F401
    except ImportError:  # pragma: no cover - the postgres extra installs it
        return False
    return True


def conninfo(engine: Engine) -> str:
    """libpq connection URI of ``engine`` (the SQLAlchemy URL without the driver name)."""
    return make_url(engine.url).set(drivername="postgresql").render_as_string(hide_password=False)


POOL_MAX = int(os.environ.get("PRIORLY_ASYNC_POOL_SIZE", "4"))
LIMITER_POOL_MAX = int(os.environ.get("PRIORLY_ASYNC_LIMITER_POOL_SIZE", "2"))
"""Most connections of a process's two asyncio pools (answers; rate limiter). A coroutine
holds its connection until the event loop resumes it, so under load some statements wait
for a connection (in the 1,000-respondent load test with 4 + 2: 2 % of the answer
statements, ~10 ms on average, and 10 % of the limiter's, ~18 ms). Larger pools did not
help there: one run with 8 + 4 had more waiting and more CPU per answer (more backends
competing for the same 2 cores; docs/reliability.md). PostgreSQL's ``max_connections``
must exceed ``processes x (POOL_MAX + LIMITER_POOL_MAX + the synchronous pools)``."""


class AsyncAnswerDatabase:
    """Two small asyncio connection pools of one process (opened in the app's lifespan).

    * ``pool``: autocommit connections for the answer call's reads and its one write
      (durable: the write commits with the server's ``synchronous_commit``).
    * ``limiter_pool``: autocommit connections with ``synchronous_commit = off`` for the
      API rate limiter's counter (a counter increment lost in a crash is harmless, and
      the call does not wait for the WAL flush), as in :mod:`app.ratelimit`.

    A checkout waits at most ``timeout`` seconds (then ``PoolTimeout``, a
    ``psycopg.OperationalError``: 503 ``database_unavailable``, like the synchronous pool).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_size: int = POOL_MAX,
        limiter_max_size: int = LIMITER_POOL_MAX,
        timeout: float = 5.0,
    ) -> None:
        from psycopg_pool import AsyncConnectionPool

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
            cur = await conn.execute(svc._sql(_PG, statement), params)
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


async def owned_study(db: AsyncAnswerDatabase, credential: str, slug: str) -> svc.StudyHead:
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
        raise svc.StudyNotFoundError(f"no study {slug!r} among your studies")
    if isinstance(settings, str | bytes):
        settings = json.loads(settings)
    return svc.StudyHead(
        id=int(study_id),
        slug=str(st_slug),
        status=str(status),
        settings=dict(settings or {}),
        owner_id=owner,
    )


async def start_session(
    db: AsyncAnswerDatabase,
    study: svc.StudyHead,
    *,
    engine: Engine,
    attributes: dict[str, str] | None,
    external_id: str | None,
) -> svc.StartedSession:
    """:func:`app.services.sessions.start_session` (API form: drafts allowed, attributes
    given) with the study's runtime cached: the prior state and first decision in the
    event loop and respondent + session + decision in one statement (the same
    :func:`~app.services.sessions.plan_start` and :data:`~app.services.sessions.PG_START`
    as the synchronous code). A study whose runtime this process has not built yet goes
    to the thread pool (the build may fit a model).

    Raises: what :func:`app.services.sessions.start_session` raises.
    """
    import psycopg

    params = svc.check_start(study, external_id, None, True)
    rt, fresh = svc.peek_runtime(study, engine=engine)
    if rt is None:
        STATS["start_handed_over"] += 1
        return await run_in_threadpool(_start_sync, study, engine, attributes, external_id)
    if not fresh:
        _refresh_runtime(study, engine)
    plan = svc.plan_start(rt, study.id, attributes, external_id, params, False, _PG)
    try:
        row = await db.fetchone(svc.PG_START, plan.values)
    except psycopg.IntegrityError:
        if external_id is None:
            raise
        raise svc.external_id_taken(external_id) from None
    STATS["start_fast"] += 1
    return plan.started(int(row[0]), int(row[1]))


def _start_sync(
    head: svc.StudyHead,
    engine: Engine,
    attributes: dict[str, str] | None,
    external_id: str | None,
) -> svc.StartedSession:
    """The synchronous start with the study's ORM row (a first runtime build may fit)."""
    from sqlmodel import Session

    from app.tables import Study

    with Session(engine) as db:
        study = db.get(Study, head.id)
    if study is None:  # deleted between the two reads
        raise svc.StudyNotFoundError(f"no study {head.slug!r} among your studies")
    return svc.start_session(
        study, engine=engine, attributes=attributes, external_id=external_id, allow_draft=True
    )


async def read_session_and_history(
    db: AsyncAnswerDatabase, token: str
) -> tuple[svc.SessionSnapshot, list[Any]] | None:
    """:func:`app.services.sessions.read_session_by_token` and the session's
    :data:`~app.services.sessions.HISTORY` rows at its ``state_version``, in one statement
    (:data:`~app.services.sessions.PG_SNAPSHOT_AND_HISTORY_BY_TOKEN`); ``None`` for an
    unknown token."""
    if not token or len(token) > 200:
        return None
    row = await db.fetchone(
        svc.PG_SNAPSHOT_AND_HISTORY_BY_TOKEN, {"token_hash": svc.hash_token(token)}
    )
    return None if row is None else _snapshot_and_history(row)


def _snapshot_and_history(row: Sequence[Any]) -> tuple[svc.SessionSnapshot, list[Any]]:
    """A row of :data:`~app.services.sessions.PG_SNAPSHOT_AND_HISTORY_BY_TOKEN` as
    ``(snapshot, history rows)``."""
    history = row[11]
    if isinstance(history, str | bytes):
        history = json.loads(history)
    return svc._snapshot_of(row), list(history or [])


# The API limiter's counter hit (app/ratelimit.py) and the read above in ONE statement:
# the counter row is written whether or not the token is known (as the middleware counts
# before any authorization), the session's columns are NULL for an unknown token.
_HIT_AND_SNAPSHOT = (
    "WITH hit AS ("
    + ratelimit.PG_UPSERT_SQL
    + ") SELECT hit.count, hit.expires_at, snap.* FROM hit LEFT JOIN ("
    + svc._sql(_PG, svc.PG_SNAPSHOT_AND_HISTORY_BY_TOKEN)
    + ") snap ON true"
)


async def read_counted_session_and_history(
    db: AsyncAnswerDatabase, token: str, counter_key: str, *, now: float | None = None
) -> tuple[int, float, tuple[svc.SessionSnapshot, list[Any]] | None]:
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
        "token_hash": svc.hash_token(token) if token and len(token) <= 200 else "",
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
    snap: svc.SessionSnapshot,
    *,
    item_key: str,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
    history: list[Any],
) -> svc.SessionView:
    """:func:`app.services.sessions.submit_answer` for the session ``snap`` (read by the
    caller's authorization): the fast path here, everything else in the thread pool.
    ``history``: the session's HISTORY rows at ``snap.state_version``, read with the
    snapshot (:func:`read_session_and_history`).

    Raises: what :func:`app.services.sessions.submit_answer` raises.
    """
    study = snap.study
    svc.check_idempotency_key(idempotency_key)
    rt, fresh = svc.peek_runtime(study, engine=engine)
    if rt is not None and not fresh:
        _refresh_runtime(study, engine)
    if rt is not None:
        item = svc.answered_item(rt, item_key, option)
        if svc.fast_snapshot_usable(rt, snap):
            step = svc.fast_step(rt, snap, item, option, idempotency_key, history, _PG)
            if step is not None and await _write(db, step):
                STATS["fast"] += 1
                return step.view(rt)
    STATS["handed_over"] += 1
    return await run_in_threadpool(
        svc.submit_answer,
        study,
        snap.id,
        item_key=item_key,
        option=option,
        idempotency_key=idempotency_key,
        engine=engine,
    )


_REFRESHING: dict[tuple[str, int, str], asyncio.Task[None]] = {}


def _refresh_runtime(study: svc.StudyHead, engine: Engine) -> None:
    """Rebuild the study's runtime in the thread pool, once at a time per study, while
    answers go on with the stale one (it is at most :data:`~app.services.sessions.
    RUNTIME_TTL_S` old, as with the synchronous path)."""
    key = svc._runtime_key(engine, study)
    if key in _REFRESHING:
        return

    async def refresh() -> None:
        try:
            await run_in_threadpool(svc.load_runtime, study, engine=engine, fit_if_missing=False)
        except Exception as exc:  # the next answer retries; the call itself is unaffected
            log.warning("study runtime refresh failed: %s", type(exc).__name__)
        finally:
            _REFRESHING.pop(key, None)

    _REFRESHING[key] = asyncio.get_running_loop().create_task(refresh())


async def _write(db: AsyncAnswerDatabase, step: svc.FastStep) -> bool:
    """The conditional write; ``False`` when it wrote nothing (another answer was stored
    since the read, or a unique constraint fired): the synchronous path then decides."""
    import psycopg

    try:
        return await db.fetchone(svc.PG_WRITE, step.params) is not None
    except psycopg.IntegrityError:
        return False
