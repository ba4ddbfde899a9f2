"""The API rate limiter's counters in Redis (``PRIORLY_REDIS_URL`` set; app/ratelimit.py).

* :class:`app.ratelimit.RedisCounter` against the real Redis server: exact counts, the
  window as the key's time to live, a new window after the key expired, and N concurrent
  hits counted exactly N times (one atomic script per hit).
* Two real uvicorn processes on one database with the same Redis: API calls made against
  one process count on the other, 429 ``rate_limited`` with ``Retry-After`` per
  credential, and no counter row is written to the database.
* Redis unreachable: calls are let through (the limiter never turns its own trouble into
  refusals).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select
from sqlmodel import Session

from app import ratelimit
from app.db import make_engine, upgrade
from app.tables import RateLimitCounter
from tests.support.secutil import LiveServer, live_server

REDIS_URL = "redis://127.0.0.1:6379/14"
API_LIMIT = 4
SESSION_LIMIT = 3


def _run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def _ttl_ms(key: str) -> int:
    counter = ratelimit.RedisCounter(REDIS_URL)
    try:
        return int(await counter.client.pttl(ratelimit.REDIS_PREFIX + key))
    finally:
        await counter.close()


def test_redis_counter_windows_and_concurrent_hits() -> None:
    key = f"test:{secrets.token_hex(8)}"

    async def scenario() -> tuple[list[tuple[int, float]], list[int], int, tuple[int, float]]:
        counter = ratelimit.RedisCounter(REDIS_URL)
        try:
            first = [await counter.hit(key, 30.0) for _ in range(3)]
            many = await asyncio.gather(*(counter.hit(key + ":c", 30.0) for _ in range(40)))
            ttl = int(await counter.client.pttl(ratelimit.REDIS_PREFIX + key))
            # The window ends: the key expires (Redis' own expiry), the next hit opens a
            # new window with count 1.
            await counter.client.pexpire(ratelimit.REDIS_PREFIX + key, 1)
            for _ in range(1000):
                if not await counter.client.exists(ratelimit.REDIS_PREFIX + key):
                    break
                await asyncio.sleep(0.005)
            again = await counter.hit(key, 30.0)
            await counter.client.delete(
                ratelimit.REDIS_PREFIX + key, ratelimit.REDIS_PREFIX + key + ":c"
            )
            return first, sorted(c for c, _ in many), ttl, again
        finally:
            await counter.close()

    first, many, ttl, again = _run(scenario())
    assert [c for c, _ in first] == [1, 2, 3]
    ends = [e for _, e in first]
    assert max(ends) - min(ends) < 1.0  # one window: the same end for every hit in it
    assert many == list(range(1, 41))  # 40 concurrent hits, each counted once
    assert 0 < ttl <= 30_000
    assert again[0] == 1


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    from app.auth import create_account
    from app.services.apikeys import create_api_key

    folder = tmp_path_factory.mktemp("ratelimit_redis")
    url = f"sqlite:///{folder / 'limits.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as db:
        create_account("one@example.org", "redis limits password 1", session=db)
        keys = [create_api_key("one@example.org", session=db).key for _ in range(2)]
    env = {
        "PRIORLY_REDIS_URL": REDIS_URL,
        "PRIORLY_API_RATE_LIMIT_PER_MINUTE": str(API_LIMIT),
        "PRIORLY_SESSION_RATE_LIMIT_PER_MINUTE": str(SESSION_LIMIT),
    }
    with (
        live_server(url, folder / "a.log", env_extra=env, log_level="warning") as a,
        live_server(url, folder / "b.log", env_extra=env, log_level="warning") as b,
    ):
        yield {"a": a, "b": b, "keys": keys, "engine": engine}
    engine.dispose()


def test_api_rate_limit_in_redis_across_processes(servers: dict[str, object]) -> None:
    a, b = servers["a"], servers["b"]
    key, other_key = servers["keys"]  # type: ignore[misc]
    assert isinstance(a, LiveServer) and isinstance(b, LiveServer)

    async def verified() -> None:  # as after a first 2xx answer (only those get a counter)
        counter = ratelimit.RedisCounter(REDIS_URL)
        try:
            await counter.forget(ratelimit.counter_key("api-ip", "127.0.0.1"))
            for k in (key, other_key):
                await counter.register(ratelimit.counter_key("api", k), 60.0, count=0)
        finally:
            await counter.close()

    _run(verified())
    assert [s.api_get(key).status_code for s in (a, b, a, b)] == [404] * API_LIMIT
    refused = a.api_get(key)
    assert refused.status_code == 429
    assert refused.json()["code"] == "rate_limited"
    assert 0 < int(refused.headers["retry-after"]) <= 60
    assert b.api_get(other_key).status_code == 404  # another key has its own count
    token = f"not-a-token-{secrets.token_hex(6)}"
    assert [b.api_get(token).status_code for _ in range(SESSION_LIMIT)] == [401] * SESSION_LIMIT
    assert a.api_get(token).status_code == 429
    assert a.api_get(token + "-2").status_code == 429  # made-up values share the address's
    assert _run(_ttl_ms(ratelimit.counter_key("api", token))) == -2  # and get no counter
    # The counters are in Redis, with the window as their time to live; none in the database.
    ttl = _run(_ttl_ms(ratelimit.counter_key("api", key)))
    assert 0 < ttl <= 60_000
    with Session(servers["engine"]) as db:  # type: ignore[arg-type]
        rows = db.exec(select(func.count()).select_from(RateLimitCounter)).scalar_one()  # type: ignore[call-overload]
    assert rows == 0


def test_unreachable_redis_lets_calls_through(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings

    url = f"sqlite:///{tmp_path / 'down.db'}"
    upgrade(url)
    settings = load_settings(
        database_url=url,
        env="dev",
        redis_url="redis://127.0.0.1:1/0",
        session_rate_limit_per_minute=1,
    )
    with TestClient(create_app(settings)) as client:
        statuses = [
            client.get("/api/v1/sessions/1", headers={"Authorization": "Bearer nope"}).status_code
            for _ in range(3)
        ]
    assert statuses == [401, 401, 401]  # counted nowhere, refused by nothing but the token
