"""Issue 8, item 3: 100 concurrent clients on 20 sessions, 2 uvicorn worker processes.

A real uvicorn server with two worker processes (separate Python processes, so the
per-session lock must hold across processes, not just threads) on a fresh PostgreSQL
database and on a fresh SQLite file in WAL mode. 100 asyncio + httpx clients answer the
same 20 sessions through the JSON API: five clients per session race on each question
with their own idempotency keys and random options (two "tabs" with the same option,
or with conflicting options), and 30 % of the requests are sent twice with the same key
(a retry after a lost response). Afterwards, on the stored rows:

* no 5xx and no response other than 2xx or the documented 409 conflicts, except the
  documented 503 ``database_unavailable`` of a server shedding load (nothing stored), which
  the clients send again unchanged (counted and reported); likewise a request whose
  connection broke (a keep-alive connection closed by the server as it was reused) is sent
  again with the same idempotency key;
* every acknowledged answer is stored exactly once, with its option, and every stored
  answer was acknowledged (no extra rows);
* what each acknowledged response said comes next is the stored next decision, and a
  retry got exactly the response of the first request, marked ``replayed``;
* per stored answer, the request that stored it got the one fresh reply (``replayed``
  false, no ``Idempotent-Replayed`` header), and every other acknowledgement (a tab that
  lost the race with the same option, a retry) a replay;
* per session: no item answered twice, no question asked twice, one decision per
  position agreeing with the answers, the cached state equal to the replay of the
  answers, and every stored choice equal to the selection step re-run on the replay.
"""

from __future__ import annotations

import time

import pytest
from sqlmodel import Session, select

from app.tables import Answer, Item
from tests.support.live_study import LiveStudy
from tests.support.rel_harness import (
    MAX_QUESTIONS,
    UvicornServer,
    check_acknowledged,
    check_sessions,
    create_sessions,
    flood,
)

N_SESSIONS = 20
N_CLIENTS = 100


@pytest.mark.slow
def test_concurrent_clients_same_sessions(
    served: tuple[LiveStudy, UvicornServer], record_property: pytest.RecordProperty
) -> None:
    live, server = served
    sessions = create_sessions(server.base_url, live.slug, live.owner_key, N_SESSIONS)
    t0 = time.monotonic()
    log = flood(server.base_url, sessions, clients=N_CLIENTS, seed=8)
    seconds = time.monotonic() - t0
    counts = log.counts()
    record_property("flood", {**counts, "seconds": round(seconds, 1)})
    print(f"\nconcurrency ({live.url.split(':')[0]}): {counts}, {seconds:.1f} s")

    assert not log.unexpected, log.unexpected[:10]
    assert counts.get("no_response", 0) == 0
    # the race really happened: tabs lost to other tabs, retries were answered from storage
    assert counts.get("409_answer_conflict", 0) > 0
    assert sum(p.retry for p in log.acked()) > 0
    # the losers of the race and the retries were told their reply is a replay
    assert any((p.body or {}).get("replayed") and not p.retry for p in log.acked())
    assert all((p.body or {}).get("replayed") for p in log.acked() if p.retry)

    n_acked, problems = check_acknowledged(live.engine, log)
    assert not problems, problems[:10]
    ids = [s.session_id for s in sessions]
    with Session(live.engine) as db:
        stored = {
            (a.session_id, key)
            for a, key in db.exec(
                select(Answer, Item.key)
                .join(Item, Item.id == Answer.item_id)  # type: ignore[arg-type]
                .where(Answer.session_id.in_(ids))  # type: ignore[attr-defined]
            ).all()
        }
    acked = {(p.session_id, p.item) for p in log.acked()}
    assert stored == acked, f"stored but never acknowledged: {sorted(stored - acked)[:10]}"
    assert n_acked == len(stored)

    check = check_sessions(live.engine, live.study_id, ids)
    assert not check.problems, check.problems[:10]
    # every session ran to its end: all its questions were answered through the race
    assert check.completed == N_SESSIONS
    assert check.answers == N_SESSIONS * MAX_QUESTIONS
    assert check.replayed_decisions == N_SESSIONS * (MAX_QUESTIONS + 1)
