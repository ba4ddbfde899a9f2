"""Issue 8, item 4 (server part): kill -9 of every server process in an answer flood.

On PostgreSQL and on SQLite in WAL mode, with uvicorn running two worker processes:

1. 100 clients answer 20 fresh sessions (the flood of ``test_concurrency``); once
   ``KILL_AFTER`` answers were acknowledged (35 on PostgreSQL, 60 on SQLite) the whole
   process group (supervisor and both workers) gets SIGKILL, with requests in flight;
2. with the server dead, the database holds every acknowledged answer exactly once, with
   its option; a stored answer that was not acknowledged is one of the requests in flight
   at the crash; all per-session invariants hold (the cached state equals the replay, one
   decision per position agreeing with the answers and with the replayed selection);
3. the server restarts on the same database (SQLite recovers its WAL file); the time from
   the new process to a ready ``/healthz`` is the recovery time;
4. each session's current question after the restart is its stored pending decision (the
   one the replay selects, checked in 2), and every request that was in flight is retried
   with its idempotency key: it gets 2xx (the stored result, when it had been stored) or
   the 409 of a tab that lost the race; nothing is stored twice;
5. the clients finish every session; all invariants hold on the complete sessions and the
   stored answers are exactly the acknowledged ones.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url
from sqlmodel import Session, select

from app.tables import Answer, Item, SelectionDecision
from tests.support.live_study import LiveStudy
from tests.support.rel_harness import (
    ALLOWED_409,
    MAX_QUESTIONS,
    FloodLog,
    Posted,
    UvicornServer,
    check_acknowledged,
    check_sessions,
    create_sessions,
    flood,
)

N_SESSIONS = 20
N_CLIENTS = 100
KILL_AFTER = {"postgresql": 35, "sqlite": 60}
"""Acknowledged answers before the kill (of the 100 the sessions need): two kill points."""


def _stored(live: LiveStudy, ids: list[int]) -> dict[tuple[int, str], tuple[str | None, str]]:
    """``{(session id, item key): (option, idempotency key)}`` of the stored answers."""
    with Session(live.engine) as db:
        return {
            (a.session_id, key): (a.option, a.idempotency_key or "")
            for a, key in db.exec(
                select(Answer, Item.key)
                .join(Item, Item.id == Answer.item_id)  # type: ignore[arg-type]
                .where(Answer.session_id.in_(ids))  # type: ignore[attr-defined]
            ).all()
        }


def _pending(live: LiveStudy, sid: int) -> str | None:
    """The item key of the session's newest decision (None when it stopped)."""
    with Session(live.engine) as db:
        d = db.exec(
            select(SelectionDecision)
            .where(SelectionDecision.session_id == sid)
            .order_by(SelectionDecision.position.desc())  # type: ignore[attr-defined]
        ).first()
        assert d is not None
        return None if d.item_id is None else db.get(Item, d.item_id).key  # type: ignore[union-attr]


@pytest.mark.slow
def test_kill9_during_answer_flood_loses_nothing(
    served: tuple[LiveStudy, UvicornServer], record_property: pytest.RecordProperty
) -> None:
    live, server = served
    backend = make_url(live.url).get_backend_name()
    sessions = create_sessions(server.base_url, live.slug, live.owner_key, N_SESSIONS)
    ids = [s.session_id for s in sessions]
    tokens = {s.session_id: s.token for s in sessions}

    # 1. the flood, killed after KILL_AFTER acknowledged answers
    stop = threading.Event()
    killed: dict[str, Any] = {}

    def kill_when_enough(log: FloodLog) -> None:
        if not killed and len(log.acked()) >= KILL_AFTER[backend]:
            killed["acked"] = len(log.acked())
            killed["processes"] = server.kill9()
            killed["at"] = time.monotonic()
            stop.set()

    log1 = flood(
        server.base_url,
        sessions,
        clients=N_CLIENTS,
        seed=4,
        stop=stop,
        on_ack=kill_when_enough,
        retry_transport=False,
    )
    assert killed, f"the flood ended before {KILL_AFTER[backend]} answers were acknowledged"
    assert killed["processes"] >= 3  # the supervisor and both workers
    assert not log1.unexpected, log1.unexpected[:10]
    in_flight = log1.in_flight()

    # 2. the database right after the crash, before anything restarts
    if backend == "sqlite":
        path = make_url(live.url).database
        assert path is not None
        wal_bytes = Path(path + "-wal").stat().st_size if Path(path + "-wal").exists() else 0
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    n_acked, problems = check_acknowledged(live.engine, log1)
    assert not problems, problems[:10]
    stored = _stored(live, ids)
    acked = {(p.session_id, p.item) for p in log1.acked()}
    extra = set(stored) - acked
    flying = {(p.session_id, p.item, p.option, p.key) for p in in_flight}
    for sid, item in extra:
        option, key = stored[(sid, item)]
        assert (sid, item, option, key) in flying, (
            f"stored answer {sid}/{item}={option} key {key!r} was neither acknowledged "
            "nor in flight at the crash"
        )
    check = check_sessions(live.engine, live.study_id, ids)
    assert not check.problems, check.problems[:10]

    # 3. restart
    t_restart = time.monotonic()
    ready_s = server.start()
    recovery_s = time.monotonic() - killed["at"]

    # 4. where each session stands after the restart, then the retries of lost responses
    log2 = FloodLog()
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        for sid in ids:
            r = http.get(
                f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {tokens[sid]}"}
            )
            assert r.status_code == 200, r.text
            got = (r.json()["question"] or {}).get("item")
            assert got == _pending(live, sid), f"session {sid}: asks {got!r} after the restart"
        for p in in_flight:
            r = http.post(
                f"/api/v1/sessions/{p.session_id}/answers",
                json={"item": p.item, "option": p.option, "idempotency_key": p.key},
                headers={"Authorization": f"Bearer {tokens[p.session_id]}"},
            )
            body = r.json()
            log2.posts.append(
                Posted(p.session_id, p.client, p.item, p.option, p.key, r.status_code, body, True)
            )
            ok = r.status_code in (200, 201)
            assert ok or (r.status_code == 409 and body.get("code") in ALLOWED_409), r.text
            if (p.session_id, p.item) in extra and stored[(p.session_id, p.item)][1] == p.key:
                assert ok, f"a stored in-flight answer was refused on retry: {r.text}"
    assert _stored(live, ids).keys() >= stored.keys()

    # 5. finish every session
    log3 = flood(server.base_url, sessions, clients=N_CLIENTS, seed=5)
    assert not log3.unexpected, log3.unexpected[:10]
    assert not log3.in_flight()
    everything = FloodLog(posts=log1.posts + log2.posts + log3.posts)
    n_acked, problems = check_acknowledged(live.engine, everything)
    assert not problems, problems[:10]
    final = _stored(live, ids)
    assert set(final) == {(p.session_id, p.item) for p in everything.acked()}
    check = check_sessions(live.engine, live.study_id, ids)
    assert not check.problems, check.problems[:10]
    assert check.completed == N_SESSIONS and check.answers == N_SESSIONS * MAX_QUESTIONS

    figures = {
        "backend": backend,
        "acked_at_kill": killed["acked"],
        "processes_killed": killed["processes"],
        "in_flight_at_kill": len(in_flight),
        "stored_not_acked_at_kill": len(extra),
        "restart_to_ready_s": round(ready_s, 1),
        "kill_to_ready_s": round(recovery_s, 1),
        "retries_after_restart": {
            "2xx": sum(1 for p in log2.posts if p.status < 300),
            "409": sum(1 for p in log2.posts if p.status == 409),
        },
        "answers_total": len(final),
        "lost": 0,
        "duplicated": 0,
        **({"wal_bytes_at_kill": wal_bytes} if backend == "sqlite" else {}),
    }
    assert time.monotonic() >= t_restart
    record_property("crash", figures)
    print(f"\ncrash recovery: {figures}")
