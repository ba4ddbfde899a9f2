"""Login lockout and API rate limits (app/ratelimit.py), counted across processes.

* The counter itself, on SQLite and PostgreSQL: exact counts, a new window after expiry,
  expired rows removed, and N concurrent hits from N threads counted exactly N times.
* Two real uvicorn processes on the same database: failed logins and API calls made
  against one process count on the other (the counters are in the database), a locked
  account is refused with 429, ``Retry-After`` and a clear message even with the right
  password, a successful login clears the account's count, the per-address limit locks
  out a second account, and the API answers 429 ``rate_limited`` per credential.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest
from sqlalchemy import func, select
from sqlmodel import Session

from app import ratelimit
from app.auth import create_account
from app.db import make_engine, upgrade
from app.services.apikeys import create_api_key
from app.tables import RateLimitCounter
from tests.support.secutil import LiveServer, live_server

PASSWORD = "limits password 123"
ACCOUNT_LIMIT = 3
IP_LIMIT = 8
API_LIMIT = 5  # per API key
SESSION_LIMIT = 3  # per session token / address


# ----- the counter ---------------------------------------------------------------------------


def test_counter_windows_and_cleanup(engine) -> None:  # type: ignore[no-untyped-def]
    assert [ratelimit.hit(engine, "k", 10.0, now=100.0)[0] for _ in range(3)] == [1, 2, 3]
    assert ratelimit.hit(engine, "k", 10.0, now=105.0) == (4, 110.0)  # same window
    assert ratelimit.peek(engine, "k", now=109.0) == (4, 110.0)
    assert ratelimit.peek(engine, "k", now=110.0) == (0, 110.0)  # the window is over
    ratelimit.hit(engine, "other", 5.0, now=100.0)  # expires at 105
    assert ratelimit.hit(engine, "k", 10.0, now=111.0) == (1, 121.0)  # a new window
    later = 105.0 + ratelimit.RETAIN_S
    with Session(engine) as db:  # "other" ended less than RETAIN_S ago: kept
        keys = db.exec(select(RateLimitCounter.key)).scalars().all()  # type: ignore[call-overload]
    assert sorted(keys) == ["k", "other"]
    assert ratelimit.hit(engine, "k", 10.0, now=later) == (1, later + 10.0)
    with Session(engine) as db:  # ...that new window removed the long-ended "other"
        keys = db.exec(select(RateLimitCounter.key)).scalars().all()  # type: ignore[call-overload]
    assert keys == ["k"]
    ratelimit.clear(engine, "k")
    assert ratelimit.peek(engine, "k", now=111.0) == (0, 111.0)


def test_bump_register_forget(engine) -> None:  # type: ignore[no-untyped-def]
    """Counting only keys that have a counter: nothing is written for an unknown key."""
    assert ratelimit.bump_fast(engine, "made-up", 10.0, now=100.0) is None
    assert ratelimit.peek(engine, "made-up", now=100.0) == (0, 100.0)
    ratelimit.register_fast(engine, "verified", 10.0, count=0, now=100.0)
    ratelimit.register_fast(engine, "verified", 10.0, count=0, now=101.0)  # no-op: exists
    assert ratelimit.bump_fast(engine, "verified", 10.0, now=102.0) == (1, 110.0)
    assert ratelimit.bump_fast(engine, "verified", 10.0, now=111.0) == (1, 121.0)  # new window
    ratelimit.forget_fast(engine, "verified")
    assert ratelimit.bump_fast(engine, "verified", 10.0, now=112.0) is None


def test_fast_hit_equals_hit(engine) -> None:  # type: ignore[no-untyped-def]
    """The API path's raw-connection counter gives the same counts and windows."""
    assert [ratelimit.hit_fast(engine, "f", 10.0, now=100.0)[0] for _ in range(3)] == [1, 2, 3]
    assert ratelimit.hit(engine, "f", 10.0, now=105.0) == (4, 110.0)
    assert ratelimit.hit_fast(engine, "f", 10.0, now=111.0) == (1, 121.0)
    assert ratelimit.peek(engine, "f", now=111.0) == (1, 121.0)


@pytest.mark.parametrize("counter", ["hit", "hit_fast"])
def test_concurrent_hits_are_counted_exactly(engine, counter: str) -> None:  # type: ignore[no-untyped-def]
    n_threads, per_thread = 8, 10
    errors: list[BaseException] = []
    count = getattr(ratelimit, counter)

    def worker() -> None:
        try:
            for _ in range(per_thread):
                count(engine, "shared", 3600.0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert ratelimit.peek(engine, "shared")[0] == n_threads * per_thread
    with Session(engine) as db:
        assert db.exec(select(func.count()).select_from(RateLimitCounter)).scalar_one() == 1  # type: ignore[call-overload]


def test_login_lockout_logic(engine) -> None:  # type: ignore[no-untyped-def]
    settings = SimpleNamespace(
        login_max_failures_per_account=2, login_max_failures_per_ip=100, login_lockout_s=60.0
    )
    ratelimit.check_login(engine, settings, "A@x.org", "1.2.3.4", now=0.0)
    ratelimit.record_login_failure(engine, settings, "a@x.org", "1.2.3.4", now=0.0)
    ratelimit.record_login_failure(engine, settings, " A@X.org", "1.2.3.4", now=10.0)
    with pytest.raises(ratelimit.LoginLocked) as info:
        ratelimit.check_login(engine, settings, "a@x.org", "9.9.9.9", now=20.0)
    assert info.value.retry_after == 40 and info.value.http_status == 429
    assert "try again in 1 minute" in str(info.value)
    ratelimit.check_login(engine, settings, "b@x.org", "1.2.3.4", now=20.0)  # other account
    ratelimit.check_login(engine, settings, "a@x.org", "1.2.3.4", now=60.0)  # window over
    with Session(engine) as db:  # no email or address in clear
        keys = db.exec(select(RateLimitCounter.key)).scalars().all()  # type: ignore[call-overload]
    assert keys and all("x.org" not in k and "1.2.3.4" not in k for k in keys)


# ----- two real processes --------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    folder = tmp_path_factory.mktemp("ratelimit")
    url = f"sqlite:///{folder / 'limits.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as db:
        for name in ("one", "two", "three"):
            create_account(f"{name}@example.org", PASSWORD, session=db)
        keys = [create_api_key("one@example.org", session=db).key for _ in range(2)]
    engine.dispose()
    env = {
        "PRIORLY_LOGIN_MAX_FAILURES_PER_ACCOUNT": str(ACCOUNT_LIMIT),
        "PRIORLY_LOGIN_MAX_FAILURES_PER_IP": str(IP_LIMIT),
        "PRIORLY_API_RATE_LIMIT_PER_MINUTE": str(API_LIMIT),
        "PRIORLY_SESSION_RATE_LIMIT_PER_MINUTE": str(SESSION_LIMIT),
    }
    with (
        live_server(url, folder / "a.log", env_extra=env, log_level="warning") as a,
        live_server(url, folder / "b.log", env_extra=env, log_level="warning") as b,
    ):
        yield {"a": a, "b": b, "keys": keys, "url": url}


def _login(server: LiveServer, email: str, password: str) -> httpx.Response:
    with httpx.Client(base_url=server.base, timeout=60) as client:
        page = client.get("/admin/login")
        assert page.status_code == 200
        token = client.cookies.get("priorly_csrf")
        return client.post(
            "/admin/login",
            data={"email": email, "password": password, "csrf_token": token},
            follow_redirects=False,
        )


def _retry_after(r: httpx.Response) -> int:
    value = int(r.headers["retry-after"])
    assert 0 < value <= 900
    return value


def test_login_lockout_across_processes(servers: dict[str, LiveServer]) -> None:
    a, b = servers["a"], servers["b"]
    # A success clears the account's count: 2 failures, success, 2 failures, success.
    for server in (a, b):
        assert _login(server, "three@example.org", "wrong password 1").status_code == 401
    assert _login(a, "three@example.org", PASSWORD).status_code == 303
    for server in (b, a):
        assert _login(server, "three@example.org", "wrong password 2").status_code == 401
    assert _login(b, "three@example.org", PASSWORD).status_code == 303  # address: 4 failures
    # Three failures for "one", spread over both processes, lock the account on both.
    for server in (a, b, a):
        assert _login(server, "one@example.org", "wrong password 3").status_code == 401
    for server in (b, a):
        locked = _login(server, "one@example.org", PASSWORD)  # even the right password
        assert locked.status_code == 429
        _retry_after(locked)
        assert "too many failed logins for this account" in locked.text
        assert re.search(r"try again in \d+ minutes?", locked.text)
        assert "priorly_session" not in locked.headers.get("set-cookie", "")
    # The address has 7 failures: another account still logs in, one more failure locks
    # the address for every account.
    assert _login(a, "two@example.org", PASSWORD).status_code == 303
    assert _login(b, "two@example.org", "wrong password 4").status_code == 401
    locked = _login(a, "two@example.org", PASSWORD)
    assert locked.status_code == 429
    assert "too many failed logins for your network address" in locked.text
    _retry_after(locked)


def test_api_rate_limit_per_verified_credential_across_processes(
    servers: dict[str, object],
) -> None:
    a, b = servers["a"], servers["b"]
    key, other_key = servers["keys"]  # type: ignore[misc]
    assert isinstance(a, LiveServer) and isinstance(b, LiveServer)

    # Neither key was accepted yet (no 2xx answer: there is no session 1), so both share
    # the client address's counter and limit, counted on both processes; so do made-up
    # tokens (which get no counter of their own: tests/security/test_hostile_input.py),
    # refused once the address is over its limit, while a real key is then looked up.
    statuses = [server.api_get(key).status_code for server in (a, b, a)]
    assert statuses == [404] * SESSION_LIMIT
    refused = b.api_get("not-a-token")
    assert refused.status_code == 429
    assert refused.json()["code"] == "rate_limited"
    assert "from this address without a known credential" in refused.json()["message"]
    assert 0 < int(refused.headers["retry-after"]) <= 60
    # a real key over the address's limit is looked up and counted on its own instead
    assert b.api_get(other_key).status_code == 404
    # A verified credential has its own counter and limit (API_LIMIT per key).
    engine = make_engine(servers["url"])  # type: ignore[arg-type]
    ratelimit.register_fast(engine, ratelimit.counter_key("api", key), 60.0, count=0)
    engine.dispose()
    statuses = [server.api_get(key).status_code for server in (a, b, a, b, a)]
    assert statuses == [404] * API_LIMIT
    assert b.api_get(key).status_code == 429
    # Pages are not limited by the API limit.
    assert httpx.get(f"{a.base}/healthz", timeout=30).status_code == 200
