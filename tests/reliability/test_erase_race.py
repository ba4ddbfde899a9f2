"""Erasing a session while its own client reads it: never a server error.

A real uvicorn server (two worker processes) on a fresh PostgreSQL database and on a fresh
SQLite file. Per round, one session with an answer; readers with the session's token
request ``GET /api/v1/sessions/{id}/predictions``, ``.../profile`` and ``.../explanation``
in a loop while ``DELETE /api/v1/sessions/{id}`` runs, so some reads pass the
authorization before the erasure commits and read the respondent after it. Every read must be a complete answer
(200, from the data before the erasure) or a clean refusal (404 for the erased session,
401 for its token once the session is gone); no response is >= 500.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from tests.support.live_study import LiveStudy
from tests.support.rel_harness import UvicornServer, create_sessions

ROUNDS = 15
READERS = 6
READS = ("predictions", "profile", "explanation")


async def _round(base_url: str, session_id: int, token: str, owner_key: str) -> list[int]:
    """One erasure raced by ``READERS`` looping readers; the status of every response."""
    statuses: list[int] = []
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        first = await client.get(f"/api/v1/sessions/{session_id}", headers=auth)
        assert first.status_code == 200, first.text
        question = first.json()["question"]
        answered = await client.post(
            f"/api/v1/sessions/{session_id}/answers",
            json={
                "item": question["item"],
                "option": question["options"][0]["letter"],
                "idempotency_key": f"erase-race-{session_id}",
            },
            headers=auth,
        )
        assert answered.status_code == 200, answered.text
        erased = asyncio.Event()
        started = asyncio.Event()

        async def reader(k: int) -> None:
            what = READS[k % len(READS)]
            n = 0
            while not erased.is_set() or n < 2:
                r = await client.get(f"/api/v1/sessions/{session_id}/{what}", headers=auth)
                statuses.append(r.status_code)
                n += 1
                started.set()

        async def eraser() -> None:
            await started.wait()  # the readers are already in flight
            r = await client.delete(
                f"/api/v1/sessions/{session_id}",
                headers={"Authorization": f"Bearer {owner_key}"},
            )
            statuses.append(r.status_code)
            assert r.status_code == 200, r.text
            erased.set()

        await asyncio.gather(eraser(), *(reader(k) for k in range(READERS)))
    return statuses


@pytest.mark.slow
def test_erase_while_reading_never_fails(served: tuple[LiveStudy, UvicornServer]) -> None:
    live, server = served
    sessions = create_sessions(server.base_url, live.slug, live.owner_key, ROUNDS)
    counts: Counter[int] = Counter()
    for s in sessions:
        counts.update(asyncio.run(_round(server.base_url, s.session_id, s.token, live.owner_key)))
    print(f"\nerase race ({live.url.split(':')[0]}): {dict(sorted(counts.items()))}")
    assert not {code for code in counts if code >= 500}, (dict(counts), server.log_tail())
    assert set(counts) <= {200, 401, 404}, dict(counts)
    assert counts[200] > ROUNDS  # the reads before the erasure were answered
