"""The answer call counts against the API rate limit in the statement that reads the session.

On PostgreSQL a session token's ``POST /api/v1/sessions/{id}/answers`` is counted by the
route (``answer_async.read_counted_session_and_history``) instead of by a statement of
the middleware of its own. Checked on a real PostgreSQL server: the combined statement
returns what the plain read returns and adds 1 to the same counter row the middleware
would write (also for an unknown token); over the per-token limit the call is refused
with the middleware's 429 (``rate_limited``, ``Retry-After``) and nothing is stored; other
calls and API keys are still counted by the middleware.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func
from sqlmodel import Session, select

from app import ratelimit
from app.session import async_path as answer_async
from app.tables import Answer, RateLimitCounter
from tests.support.live_study import LiveStudy, ces_sample_study

LIMIT = 4


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStudy]:
    folder = tmp_path_factory.mktemp("counted_read")
    yield from ces_sample_study("postgresql", folder, 60)


def _client(live: LiveStudy) -> Any:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings

    settings = load_settings(database_url=live.url, env="dev", session_rate_limit_per_minute=LIMIT)
    return TestClient(create_app(settings))


def _count(live: LiveStudy, credential: str) -> int | None:
    key = ratelimit.counter_key("api", credential)
    with Session(live.engine) as db:
        row = db.get(RateLimitCounter, key)
        return None if row is None else row.count


def test_combined_statement_reads_what_the_plain_read_reads(live: LiveStudy) -> None:
    with _client(live) as client:
        r = client.post(
            f"/api/v1/studies/{live.slug}/sessions",
            json={},
            headers={"Authorization": f"Bearer {live.owner_key}"},
        )
        assert r.status_code == 201, r.text
        token = r.json()["token"]
        db = client.app.state.answers_db  # type: ignore[attr-defined]

        async def both() -> tuple[Any, Any, Any]:
            plain = await answer_async.read_session_and_history(db, token)
            counted = await answer_async.read_counted_session_and_history(
                db, token, ratelimit.counter_key("api", token)
            )
            unknown = await answer_async.read_counted_session_and_history(
                db, "no-such-token", ratelimit.counter_key("api", "no-such-token")
            )
            return plain, counted, unknown

        plain, counted, unknown = client.portal.call(both)  # type: ignore[union-attr]
    count, expires, read = counted
    assert read == plain and read is not None
    assert count == 1 and count == _count(live, token)
    assert unknown[0] == 1 and unknown[2] is None
    assert _count(live, "no-such-token") == 1


def test_answers_over_the_limit_are_refused_like_the_middleware(
    live: LiveStudy, monkeypatch: pytest.MonkeyPatch
) -> None:
    middleware_hits: list[str] = []
    real_hit = ratelimit.hit_async

    async def counted_hit(db: Any, key: str, window_s: float, **kw: Any) -> Any:
        middleware_hits.append(key)
        return await real_hit(db, key, window_s, **kw)

    real_bump = ratelimit.bump_async

    async def counted_bump(db: Any, key: str, window_s: float, **kw: Any) -> Any:
        middleware_hits.append(key)
        return await real_bump(db, key, window_s, **kw)

    monkeypatch.setattr(ratelimit, "hit_async", counted_hit)
    monkeypatch.setattr(ratelimit, "bump_async", counted_bump)
    with _client(live) as client:
        r = client.post(
            f"/api/v1/studies/{live.slug}/sessions",
            json={},
            headers={"Authorization": f"Bearer {live.owner_key}"},
        )
        body = r.json()
        sid, token = body["session_id"], body["token"]
        auth = {"Authorization": f"Bearer {token}"}
        statuses = []
        for _ in range(LIMIT + 1):
            q = body["question"]
            r = client.post(
                f"/api/v1/sessions/{sid}/answers",
                json={
                    "item": q["item"],
                    "option": q["options"][0]["letter"],
                    "idempotency_key": uuid.uuid4().hex,
                },
                headers=auth,
            )
            statuses.append(r.status_code)
            if r.status_code == 200:
                body = r.json()
        assert statuses == [200] * LIMIT + [429]
        token_key = ratelimit.counter_key("api", token)
        assert token_key not in middleware_hits  # counted in the route's read only
        assert r.json()["code"] == "rate_limited"
        assert 0 < int(r.headers["retry-after"]) <= 60
        assert r.headers["content-type"] == "application/json"
        # counted once per call in the one row the middleware would write
        assert _count(live, token) == LIMIT + 1
        # another call with the same token is counted by the middleware: refused too
        assert client.get(f"/api/v1/sessions/{sid}", headers=auth).status_code == 429
        assert middleware_hits.count(token_key) == 1
        assert _count(live, token) == LIMIT + 2
    with Session(live.engine) as db:
        stored = db.exec(select(func.count()).where(Answer.session_id == sid)).one()
    assert stored == LIMIT  # the refused answer was not stored


def test_unknown_token_is_counted_and_refused(live: LiveStudy) -> None:
    with _client(live) as client:
        statuses = [
            client.post(
                "/api/v1/sessions/1/answers",
                json={"item": "x", "option": "A", "idempotency_key": uuid.uuid4().hex},
                headers={"Authorization": "Bearer unknown-token-1"},
            ).status_code
            for _ in range(LIMIT + 1)
        ]
    # An unknown token is counted against the client address (as calls without a
    # credential are), with the address's limit, and gets no counter of its own.
    assert statuses[-1] == 429 and set(statuses[:-1]) == {401}, statuses
    assert _count(live, "unknown-token-1") is None
    with Session(live.engine) as db:
        row = db.get(RateLimitCounter, ratelimit.counter_key("api-ip", "testclient"))
        assert row is not None and row.count > LIMIT
