"""Rate limits kept in the database: login lockout and API call limits.

Counters live in the table ``rate_limit_counter`` (:class:`app.tables.RateLimitCounter`),
not in process memory, so several worker processes (and machines) share them. Each
counter is a fixed window: the first hit of a key opens a window of ``window_s`` seconds
with count 1; later hits in the window add 1 (one atomic ``INSERT ... ON CONFLICT DO
UPDATE ... RETURNING`` statement, the same SQL on SQLite >= 3.35 and PostgreSQL); the first
hit after the window ended opens a new one. Keys are ``<kind>:<sha256 of the value>``, so
no email, IP address or credential is stored in clear.

* **Login lockout** (:func:`check_login`, :func:`record_login_failure`,
  :func:`clear_login_failures`): after ``login_max_failures_per_account`` failed logins for
  one email, or ``login_max_failures_per_ip`` from one client address, within
  ``login_lockout_s`` seconds, further attempts are refused with 429 and ``Retry-After``
  (the seconds left in the window) *before* the password is checked. A successful login
  clears the account's counter (not the address's).
* **API limits** (:class:`ApiRateLimitMiddleware`): every ``/api/v1`` call counts against
  its credential (``Authorization: Bearer ...``) once that credential is verified, or else
  its client address. A credential is verified when the API answered one of its calls
  with a 2xx (or issued it: a new session's token); until then, and for every made-up
  value, the call counts against the address with the address's limit, and no counter
  is ever made for an unverified value (a client sending a new random credential each
  time is limited like one without any); a real credential whose first call finds its
  address over the limit (others behind the same address sent made-up ones) is looked up
  (:func:`known_credential`) and gets its own counter instead of the refusal;
  more than ``api_rate_limit_per_minute`` calls in a minute per API key, or
  ``session_rate_limit_per_minute`` per session token (or address), get 429 with
  ``Retry-After`` and the JSON error ``{"code": "rate_limited", "message": ...}``.
  With ``PRIORLY_REDIS_URL`` set (the several-machine deployment, whose job queue is
  there already) these counters live in Redis instead (:func:`hit_redis`: the same fixed
  windows, one atomic script per call), so the hottest call of the product does not
  write a database row: in the 1,000-respondent load test the counter's upsert was one
  of the answer call's three PostgreSQL statements and its small pool the most waited-for
  (docs/reliability.md). Login lockout stays in the database (rare, and audited there).
  Without Redis, on PostgreSQL, a session token's answer call
  (``POST /api/v1/sessions/{id}/answers``) is counted by its route instead, in the
  statement that reads the session (:data:`DEFERRED_SCOPE_KEY`,
  ``answer_async.read_counted_session_and_history``): the same counter row and the same
  429, one round trip fewer on the product's hottest call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from anyio import to_thread
from sqlalchemy import create_engine, delete, event, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import Response

from app.errors import ConfigurationError, PriorlyError
from app.respondent_text import text as respondent_words
from app.services.apikeys import KEY_PREFIX, hash_key
from app.session.tokens import hash_token
from app.tables import ApiKey, ElicitationSession, RateLimitCounter

log = logging.getLogger("priorly.ratelimit")

API_PREFIX = "/api/v1"
API_WINDOW_S = 60.0
ERROR_CODE = "rate_limited"
DEFERRED_SCOPE_KEY = "priorly.rate_limit"
"""Scope key of an answer call whose count the route adds to its own read: ``(counter
key, limit)`` (see :class:`ApiRateLimitMiddleware`)."""
_ANSWER_PATH = re.compile(r"^/api/v1/sessions/\d+/answers$")

RETAIN_S = 3600.0
"""A counter whose window ended is deleted only this long after (by the cleanup that runs
when any key opens a new window): a credential's counter also marks it as verified
(:class:`ApiRateLimitMiddleware`), so a respondent pausing longer than a window keeps it."""

_UPSERT = text(
    """
    INSERT INTO rate_limit_counter (key, count, expires_at) VALUES (:key, 1, :expires)
    ON CONFLICT (key) DO UPDATE SET
        count = CASE WHEN rate_limit_counter.expires_at <= :now
                     THEN 1 ELSE rate_limit_counter.count + 1 END,
        expires_at = CASE WHEN rate_limit_counter.expires_at <= :now
                          THEN :expires ELSE rate_limit_counter.expires_at END
    RETURNING count, expires_at
    """
)


class RateLimited(PriorlyError):
    """Too many requests (HTTP 429); ``retry_after`` is in whole seconds;
    ``respondent_text``: the id of the message a respondent page shows in the study's
    language (:mod:`app.respondent_text`), ``None`` for the message itself."""

    http_status = 429
    code = ERROR_CODE

    def __init__(
        self, message: str, retry_after: int, *, respondent_text: str | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = max(1, int(retry_after))
        self.respondent_text = respondent_text


class LoginLocked(RateLimited):
    """Too many failed logins for this account or from this address."""


def counter_key(kind: str, value: str) -> str:
    """``kind:<sha256(value)>``: the counter's name, without the value in clear."""
    return f"{kind}:{hashlib.sha256(value.encode('utf-8')).hexdigest()}"


def hit(
    engine: Engine, key: str, window_s: float, *, now: float | None = None
) -> tuple[int, float]:
    """Count one hit of ``key``; returns ``(count in the window, window end)``.

    A new window also deletes every counter whose window ended more than
    :data:`RETAIN_S` ago (rows of keys no longer hit).
    """
    now = time.time() if now is None else now
    with engine.begin() as conn:
        row = conn.execute(_UPSERT, {"key": key, "now": now, "expires": now + window_s}).one()
        count, expires = int(row[0]), float(row[1])
        if count == 1:
            conn.execute(
                delete(RateLimitCounter).where(
                    RateLimitCounter.expires_at <= now - RETAIN_S,  # type: ignore[arg-type]
                )
            )
    return count, expires


_BUMP = """
    UPDATE rate_limit_counter SET
        count = CASE WHEN expires_at <= :now THEN 1 ELSE count + 1 END,
        expires_at = CASE WHEN expires_at <= :now THEN :expires ELSE expires_at END
    WHERE key = :key
    RETURNING count, expires_at
"""
_REGISTER = """
    INSERT INTO rate_limit_counter (key, count, expires_at) VALUES (:key, :count, :expires)
    ON CONFLICT (key) DO NOTHING
"""
_FORGET = "DELETE FROM rate_limit_counter WHERE key = :key"
_CLEANUP = f"DELETE FROM rate_limit_counter WHERE expires_at <= :now - {RETAIN_S:.0f}"


def _pg(sql: str) -> str:
    return re.sub(r":(key|now|expires|count)\b", r"%(\1)s", sql)


_FAST_SQL = {
    "postgresql": (_pg(_UPSERT.text), _pg(_CLEANUP)),
    "sqlite": (_UPSERT.text, _CLEANUP),
}
_EXISTING_SQL = {
    "postgresql": (_pg(_BUMP), _pg(_REGISTER), _pg(_FORGET)),
    "sqlite": (_BUMP, _REGISTER, _FORGET),
}
PG_UPSERT_SQL, PG_CLEANUP_SQL = _FAST_SQL["postgresql"]
"""The counter's upsert (parameters ``key``, ``now``, ``expires``; returns ``count,
expires_at``) and the cleanup of long-ended windows, in psycopg's parameter style."""
_limiter_engines: dict[str, Engine] = {}
_limiter_lock = threading.Lock()


def _limiter_engine(engine: Engine) -> Engine:
    """The engine the API limiter writes with.

    PostgreSQL: a small pool of its own per database URL (so the limiter never waits for,
    nor takes, a connection of the request pool; a checkout waits at most 1 s), in
    autocommit with ``synchronous_commit = off`` (a counter increment lost in a crash is
    harmless; the call does not wait for the WAL flush). SQLite: the app's engine.
    """
    if engine.dialect.name != "postgresql":
        return engine
    url = engine.url.render_as_string(hide_password=False)
    with _limiter_lock:
        limiter = _limiter_engines.get(url)
        if limiter is None:
            limiter = create_engine(url, pool_size=4, max_overflow=4, pool_timeout=1.0)

            @event.listens_for(limiter, "connect")
            def _fast(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.autocommit = True
                with dbapi_conn.cursor() as cur:
                    cur.execute("SET synchronous_commit = off")

            _limiter_engines[url] = limiter
    return limiter


def hit_fast(
    engine: Engine, key: str, window_s: float, *, now: float | None = None
) -> tuple[int, float]:
    """:func:`hit` for the API hot path: the same statement on a raw DB-API connection
    (no ORM/Core overhead; see :func:`_limiter_engine` for the PostgreSQL settings)."""
    now = time.time() if now is None else now
    limiter = _limiter_engine(engine)
    upsert, cleanup = _FAST_SQL[limiter.dialect.name]
    params = {"key": key, "now": now, "expires": now + window_s}
    fairy = limiter.raw_connection()
    try:
        cur = fairy.cursor()
        try:
            cur.execute(upsert, params)
            row = cur.fetchone()
            count, expires = int(row[0]), float(row[1])
            if count == 1:
                cur.execute(cleanup, {"now": now})
        finally:
            cur.close()
        fairy.commit()
    finally:
        fairy.close()
    return count, expires


async def hit_async(
    answers_db: Any, key: str, window_s: float, *, now: float | None = None
) -> tuple[int, float]:
    """:func:`hit_fast` on PostgreSQL through the app's asyncio pool
    (:class:`app.session.async_path.AsyncAnswerDatabase`, ``synchronous_commit = off``)."""
    now = time.time() if now is None else now
    upsert, cleanup = _FAST_SQL["postgresql"]
    async with answers_db.limiter_connection() as conn:
        cur = await conn.execute(upsert, {"key": key, "now": now, "expires": now + window_s})
        row = await cur.fetchone()
        count, expires = int(row[0]), float(row[1])
        if count == 1:
            await conn.execute(cleanup, {"now": now})
    return count, expires


def _run_existing(engine: Engine, which: int, params: dict[str, Any]) -> tuple[int, float] | None:
    limiter = _limiter_engine(engine)
    sql = _EXISTING_SQL[limiter.dialect.name][which]
    fairy = limiter.raw_connection()
    try:
        cur = fairy.cursor()
        try:
            cur.execute(sql, params)
            row = cur.fetchone() if which == 0 else None
        finally:
            cur.close()
        fairy.commit()
    finally:
        fairy.close()
    return None if row is None else (int(row[0]), float(row[1]))


def bump_fast(
    engine: Engine, key: str, window_s: float, *, now: float | None = None
) -> tuple[int, float] | None:
    """:func:`hit_fast` for a key that has a counter already; ``None`` (and nothing
    written) for a key without one."""
    now = time.time() if now is None else now
    return _run_existing(engine, 0, {"key": key, "now": now, "expires": now + window_s})


def register_fast(
    engine: Engine, key: str, window_s: float, *, count: int = 1, now: float | None = None
) -> None:
    """Open a counter for ``key`` (a verified credential) unless it has one."""
    now = time.time() if now is None else now
    _run_existing(engine, 1, {"key": key, "count": count, "expires": now + window_s})


def forget_fast(engine: Engine, key: str) -> None:
    """Delete the counter of ``key``."""
    _run_existing(engine, 2, {"key": key})


async def _existing_async(
    answers_db: Any, which: int, params: dict[str, Any]
) -> tuple[int, float] | None:
    sql = _EXISTING_SQL["postgresql"][which]
    async with answers_db.limiter_connection() as conn:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone() if which == 0 else None
    return None if row is None else (int(row[0]), float(row[1]))


async def bump_async(
    answers_db: Any, key: str, window_s: float, *, now: float | None = None
) -> tuple[int, float] | None:
    """:func:`bump_fast` through the app's asyncio pool (PostgreSQL)."""
    now = time.time() if now is None else now
    return await _existing_async(answers_db, 0, {"key": key, "now": now, "expires": now + window_s})


# KEYS[1]: the counter; ARGV[1]: the window in ms. A new key gets the window as its
# time to live; the reply is the count and the milliseconds left (atomic in Redis).
_REDIS_HIT = """
local count = redis.call('INCR', KEYS[1])
if count == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  left = tonumber(ARGV[1])
end
return {count, left}
"""
# The same for a key that exists; nil (nothing written) for one that does not.
_REDIS_BUMP = "if redis.call('EXISTS', KEYS[1]) == 0 then return nil end\n" + _REDIS_HIT
REDIS_PREFIX = "priorly:ratelimit:"


class RedisCounter:
    """The API limiter's counters in Redis (one per app process; see the module docstring).

    ``hit(key, window_s)`` counts like :func:`hit`: the first hit opens a window of
    ``window_s`` seconds (the key's time to live), later hits in it add 1; returns
    ``(count, window end as a time.time() value)``. A key without a time to live (never
    left by the script, but possible after a manual edit) gets a fresh window.
    """

    def __init__(self, url: str) -> None:
        try:
            # optional: the redis extra (PRIORLY_REDIS_URL)
            import redis.asyncio as redis_asyncio
        except ImportError:  # pragma: no cover - the redis extra is not installed
            raise ConfigurationError(
                "PRIORLY_REDIS_URL is set but the redis client is not installed "
                "(pip install 'priorly[redis]')"
            ) from None

        self.client = redis_asyncio.Redis.from_url(url, socket_timeout=1.0)
        self._script = self.client.register_script(_REDIS_HIT)
        self._bump = self.client.register_script(_REDIS_BUMP)

    async def hit(self, key: str, window_s: float) -> tuple[int, float]:
        count, left_ms = await self._script(
            keys=[REDIS_PREFIX + key], args=[max(1, int(window_s * 1000))]
        )
        return int(count), time.time() + int(left_ms) / 1000.0

    async def bump(self, key: str, window_s: float) -> tuple[int, float] | None:
        """:meth:`hit` for a key that has a counter; ``None`` (nothing written) otherwise."""
        result = await self._bump(keys=[REDIS_PREFIX + key], args=[max(1, int(window_s * 1000))])
        if not result:
            return None
        count, left_ms = result
        return int(count), time.time() + int(left_ms) / 1000.0

    async def register(self, key: str, window_s: float, count: int = 1) -> None:
        """Open a counter for ``key`` unless it has one."""
        await self.client.set(REDIS_PREFIX + key, count, px=max(1, int(window_s * 1000)), nx=True)

    async def forget(self, key: str) -> None:
        await self.client.delete(REDIS_PREFIX + key)

    async def close(self) -> None:
        await self.client.aclose()


def _redis_errors() -> tuple[type[BaseException], ...]:
    try:
        # optional: the redis extra (PRIORLY_REDIS_URL)
        from redis.exceptions import RedisError
    except ImportError:  # pragma: no cover - the redis extra is not installed
        return ()
    return (RedisError,)


def peek(engine: Engine, key: str, *, now: float | None = None) -> tuple[int, float]:
    """``(count, window end)`` of ``key`` without counting; ``(0, now)`` outside a window."""
    now = time.time() if now is None else now
    with engine.connect() as conn:
        row = conn.execute(
            select(RateLimitCounter.count, RateLimitCounter.expires_at).where(  # type: ignore[call-overload]
                RateLimitCounter.key == key
            )
        ).first()
    if row is None or float(row[1]) <= now:
        return 0, now
    return int(row[0]), float(row[1])


def clear(engine: Engine, key: str) -> None:
    with engine.begin() as conn:
        conn.execute(delete(RateLimitCounter).where(RateLimitCounter.key == key))  # type: ignore[arg-type]


# ----- login lockout ---------------------------------------------------------------------------


def _login_keys(email: str, client_ip: str) -> tuple[str, str]:
    return (
        counter_key("login-account", email.strip().lower()),
        counter_key("login-ip", client_ip),
    )


def _minutes(seconds: float) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return f"{minutes} minute" + ("s" if minutes != 1 else "")


def check_login(
    engine: Engine, settings: Any, email: str, client_ip: str, *, now: float | None = None
) -> None:
    """Raise :class:`LoginLocked` when the account or the address is locked out."""
    now = time.time() if now is None else now
    account, ip = _login_keys(email, client_ip)
    for key, limit, what in (
        (account, settings.login_max_failures_per_account, "this account"),
        (ip, settings.login_max_failures_per_ip, "your network address"),
    ):
        count, expires = peek(engine, key, now=now)
        if limit > 0 and count >= limit:
            wait = expires - now
            raise LoginLocked(
                f"too many failed logins for {what}: try again in {_minutes(wait)}",
                retry_after=math.ceil(wait),
            )


def record_login_failure(
    engine: Engine, settings: Any, email: str, client_ip: str, *, now: float | None = None
) -> None:
    """Count a failed login against the account and the address."""
    for key in _login_keys(email, client_ip):
        hit(engine, key, settings.login_lockout_s, now=now)


def clear_login_failures(engine: Engine, email: str) -> None:
    """A successful login: the account's failure count starts again at 0."""
    clear(engine, counter_key("login-account", email.strip().lower()))


# ----- API limits ----------------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def api_counter_key(scope: Scope) -> tuple[str, bool]:
    """``(counter key, is an API key)`` of an API call: its bearer credential (an API key
    or a session token), else its client address. (The middleware uses the credential's
    key only once the credential is verified: :class:`ApiRateLimitMiddleware`.)"""
    credential = bearer_credential(scope)
    if credential:
        return counter_key("api", credential), credential.startswith(KEY_PREFIX)
    return address_key(scope), False


def bearer_credential(scope: Scope) -> str:
    """The ``Authorization: Bearer`` credential of a request ("" without one)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, credential = value.decode("latin-1").partition(" ")
            credential = credential.strip()
            if scheme.lower() == "bearer" and credential:
                return credential
    return ""


def address_key(scope: Scope) -> str:
    """The counter of the client address: calls without a credential and calls with one
    not (yet) verified share it."""
    client = scope.get("client") or ("unknown", 0)
    return counter_key("api-ip", str(client[0]))


def _dbapi_errors() -> tuple[type[BaseException], ...]:
    """The DB-API drivers' base errors (raw connections raise these, not SQLAlchemy's)."""
    errors: list[type[BaseException]] = [sqlite3.Error]
    try:
        import psycopg  # optional: the postgres extra

        errors.append(psycopg.Error)
    except ImportError:  # pragma: no cover - PostgreSQL support not installed
        pass
    return tuple(errors)


_DBAPI_ERRORS = _dbapi_errors()
_REDIS_ERRORS = _redis_errors()


class ApiRateLimitMiddleware:
    """Refuse ``/api/v1`` calls over a per-minute limit per credential with 429 (pure ASGI).

    Args:
        app: the ASGI app.
        key_limit: calls per minute per API key (a product's backend creating and reading
            many respondents' sessions); 0: no limit.
        session_limit: calls per minute per session token (one respondent's client), and
            per client address for calls without a credential; 0: no limit.

    The counter lives in Redis when the app has a :class:`RedisCounter`
    (``app.state.limiter_redis``, from ``PRIORLY_REDIS_URL``), else in the database of the
    app's engine (``app.state.engine``). If the counter cannot be written (database or
    Redis trouble), the call is let through: the limiter must not turn a hiccup into
    refusals; the call itself reports any database trouble.
    """

    def __init__(self, app: ASGIApp, *, key_limit: int, session_limit: int) -> None:
        self.app = app
        self.key_limit = key_limit
        self.session_limit = session_limit
        # Client addresses over their limit with made-up session tokens on the deferred
        # answer path, and when their window ends (this process's memory; bounded).
        self._blocked: dict[str, float] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(API_PREFIX + "/"):
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        counter = ApiCounter.of(state)
        if counter is None or (self.key_limit <= 0 and self.session_limit <= 0):
            await self.app(scope, receive, send)
            return
        credential = bearer_credential(scope)
        address = address_key(scope)
        is_api_key = credential.startswith(KEY_PREFIX)
        key = counter_key("api", credential) if credential else address
        limit = self.key_limit if is_api_key else self.session_limit
        after = ""  # what to do once the answer is known: "verify" or "deferred"
        result: tuple[int, float] | None = None
        try:
            if not credential:
                result = await counter.hit(address) if limit > 0 else None
            elif (
                counter.deferrable
                and not is_api_key
                and scope.get("method") == "POST"
                and _ANSWER_PATH.match(str(scope.get("path", "")))
                and self._blocked.get(address, 0.0) <= time.time()
            ):
                # A session token's answer call on PostgreSQL: the route counts it in the
                # statement that reads the session (one round trip fewer on the hottest
                # call; app/session/async_path.py) and answers 429 like this class.
                # A token it does not know is moved to the address's counter afterwards.
                scope[DEFERRED_SCOPE_KEY] = (key, limit)
                after = "deferred"
            else:
                result = await counter.bump(key) if limit > 0 else None
                if result is None:  # not verified: the address's counter and limit
                    own_limit, limit = limit, self.session_limit
                    result = await counter.hit(address) if limit > 0 else None
                    after = "verify"
                    if (
                        result is not None
                        and result[0] > limit
                        and own_limit > 0
                        and await to_thread.run_sync(known_credential, state.engine, credential)
                    ):  # a real credential behind a busy address: counted on its own
                        await counter.register(key)
                        limit, after = own_limit, ""
                        result = await counter.bump(key)
        except (SQLAlchemyError, OSError, *_DBAPI_ERRORS, *_REDIS_ERRORS) as exc:
            log.warning("rate limiter unavailable, call let through: %s", type(exc).__name__)
            result, after = None, ""
        if result is not None and result[0] > limit:
            by_address = after == "verify" or not credential
            await rate_limited_response(result[1], limit, by_address=by_address)(
                scope, receive, send
            )
            return
        if not after:
            await self.app(scope, receive, send)
            return
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await self.app(scope, receive, send_status)
        try:
            if after == "verify" and 200 <= status < 300:
                # The route accepted the credential: from now on it has its own counter.
                await counter.register(key)
            elif after == "deferred" and status == 401:
                # A made-up token: no counter of its own; the address's counts it.
                await counter.forget(key)
                if self.session_limit > 0:
                    count, expires = await counter.hit(address)
                    if count > self.session_limit:
                        if len(self._blocked) > 10_000:
                            self._blocked.clear()
                        self._blocked[address] = expires
        except (SQLAlchemyError, OSError, *_DBAPI_ERRORS, *_REDIS_ERRORS) as exc:
            log.warning("rate limiter unavailable after the call: %s", type(exc).__name__)


def known_credential(engine: Engine, credential: str) -> bool:
    """Whether ``credential`` is an API key that is not revoked or a session's token (one
    indexed lookup of its hash), for :class:`ApiRateLimitMiddleware`."""
    if len(credential) > 200:
        return False
    with engine.connect() as conn:
        if credential.startswith(KEY_PREFIX):
            found = conn.execute(
                select(ApiKey.id).where(  # type: ignore[call-overload]
                    ApiKey.key_hash == hash_key(credential),
                    ApiKey.revoked_at.is_(None),  # type: ignore[union-attr]
                )
            ).first()
        else:
            found = conn.execute(
                select(ElicitationSession.id).where(  # type: ignore[call-overload]
                    ElicitationSession.token_hash == hash_token(credential)
                )
            ).first()
    return found is not None


class ApiCounter:
    """The API limiter's counters where the app keeps them: Redis, else PostgreSQL through
    the app's asyncio pool, else the database of the app's engine (a thread)."""

    def __init__(self, redis: Any, answers_db: Any, engine: Engine) -> None:
        self.redis = redis
        self.answers_db = answers_db
        self.engine = engine
        self.deferrable = redis is None and answers_db is not None

    @classmethod
    def of(cls, state: Any) -> ApiCounter | None:
        engine = getattr(state, "engine", None)
        if engine is None:
            return None
        return cls(
            getattr(state, "limiter_redis", None), getattr(state, "answers_db", None), engine
        )

    async def hit(self, key: str) -> tuple[int, float]:
        """Count a call against ``key`` (opening its counter if needed)."""
        if self.redis is not None:
            return await self.redis.hit(key, API_WINDOW_S)  # type: ignore[no-any-return]
        if self.answers_db is not None:  # PostgreSQL: in the event loop, no thread hop
            return await hit_async(self.answers_db, key, API_WINDOW_S)
        return await to_thread.run_sync(hit_fast, self.engine, key, API_WINDOW_S)

    async def bump(self, key: str) -> tuple[int, float] | None:
        """Count a call against ``key`` if it has a counter; ``None`` (nothing written)."""
        if self.redis is not None:
            return await self.redis.bump(key, API_WINDOW_S)  # type: ignore[no-any-return]
        if self.answers_db is not None:
            return await bump_async(self.answers_db, key, API_WINDOW_S)
        return await to_thread.run_sync(bump_fast, self.engine, key, API_WINDOW_S)

    async def register(self, key: str, count: int = 1) -> None:
        """Give a verified credential its own counter (unless it has one)."""
        if self.redis is not None:
            await self.redis.register(key, API_WINDOW_S, count)
        elif self.answers_db is not None:
            params = {"key": key, "count": count, "expires": time.time() + API_WINDOW_S}
            await _existing_async(self.answers_db, 1, params)
        else:
            await to_thread.run_sync(
                lambda: register_fast(self.engine, key, API_WINDOW_S, count=count)
            )

    async def forget(self, key: str) -> None:
        if self.redis is not None:
            await self.redis.forget(key)
        elif self.answers_db is not None:
            await _existing_async(self.answers_db, 2, {"key": key})
        else:
            await to_thread.run_sync(forget_fast, self.engine, key)


async def register_new_credential(state: Any, credential: str) -> None:
    """A credential the app just issued (a new session's token) gets its counter now, so
    its first call is not counted against its client's address. Best effort."""
    counter = ApiCounter.of(state)
    if counter is None:
        return
    try:
        await counter.register(counter_key("api", credential), count=0)
    except (SQLAlchemyError, OSError, *_DBAPI_ERRORS, *_REDIS_ERRORS) as exc:
        log.warning("rate limiter unavailable: %s", type(exc).__name__)


def rate_limited_response(expires: float, limit: int, *, by_address: bool = False) -> Response:
    """The 429 of an API call over ``limit`` in a window ending at ``expires``
    (``time.time()``): the JSON error with ``Retry-After`` in whole seconds (sent by the
    middleware, and returned by the answer route that counts its own calls). With
    ``by_address`` the count was the client address's (no credential, or an unknown one)."""
    retry_after = max(1, math.ceil(expires - time.time()))
    whose = "from this address without a known credential" if by_address else "with this credential"
    body = json.dumps(
        {
            "code": ERROR_CODE,
            "message": f"more than {limit} calls per minute {whose}: retry in {retry_after} s",
        }
    ).encode("utf-8")
    return Response(
        body,
        status_code=429,
        headers={"retry-after": str(retry_after)},
        media_type="application/json",
    )


# ----- survey pages --------------------------------------------------------------------------

RESPONDENT_WINDOW_S = 60.0


def _client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def respondent_page_limit(request: Request) -> None:
    """Dependency of the survey pages (``/s/...``): per client address, at most
    ``respondent_start_rate_limit_per_minute`` new respondents (``POST .../consent``) and
    ``session_rate_limit_per_minute`` other posts per minute; :class:`RateLimited` (429,
    ``Retry-After``, a message for the respondent) beyond; a refused start keeps its form's
    text fields in ``request.state.refused_form`` (the 429 page's "Try again" link reopens
    the survey link with its link parameters). Pages that only show (GET) are not counted. The counters are
    the API limiter's (Redis, else the database), so every process counts the same."""
    if request.method != "POST":
        return
    state = request.app.state
    settings = state.settings
    if request.url.path.endswith("/consent"):
        kind, limit, message = (
            "resp-start",
            settings.respondent_start_rate_limit_per_minute,
            "limit.start",
        )
    else:
        kind, limit, message = ("resp-post", settings.session_rate_limit_per_minute, "limit.post")
    counter = ApiCounter.of(state)
    if limit <= 0 or counter is None:
        return
    try:
        count, expires = await counter.hit(counter_key(kind, _client_address(request)))
    except (SQLAlchemyError, OSError, *_DBAPI_ERRORS, *_REDIS_ERRORS) as exc:
        log.warning("rate limiter unavailable, page let through: %s", type(exc).__name__)
        return
    if count > limit:
        if kind == "resp-start":  # the page's "Try again" reopens the link with these
            request.state.refused_form = await _form_fields(request)
        wait = max(1, math.ceil(expires - time.time()))
        raise RateLimited(
            respondent_words("en", message), retry_after=wait, respondent_text=message
        )


async def _form_fields(request: Request) -> list[tuple[str, str]]:
    """The text fields of the refused form (empty when it cannot be read)."""
    try:
        form = await request.form()
    except Exception:  # a malformed body: the refusal stands, without the fields
        return []
    return [(str(k), v) for k, v in form.multi_items() if isinstance(v, str)]
