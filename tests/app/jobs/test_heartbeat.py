"""Worker heartbeats: a started background worker records one, ``/healthz`` reports it, the
upkeep beats on its interval (an injected clock), survives a database error with one log
line, prunes old rows; the queue's engine belongs to one process.

Real SQLite and PostgreSQL (the ``settings`` / ``engine`` fixtures); waits poll the
heartbeat row with a deadline.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.jobs.heartbeat import PRUNE_AFTER_S, SEEN_WITHIN_S, consumer_id, record_heartbeat
from app.jobs.queue import get_queue
from app.jobs.worker import Upkeep, start_background_worker
from app.main import create_app
from app.settings import Settings
from app.tables import WorkerHeartbeat, WorkerKind, as_utc, iso_utc, utcnow


def _rows(engine: Engine) -> dict[str, WorkerHeartbeat]:
    with Session(engine) as s:
        rows = s.exec(select(WorkerHeartbeat)).all()
        for r in rows:
            s.expunge(r)
    return {r.id: r for r in rows}


def _wait_for_row(engine: Engine, worker: str, timeout: float = 30.0) -> WorkerHeartbeat:
    deadline = time.monotonic() + timeout
    while True:
        row = _rows(engine).get(worker)
        if row is not None:
            return row
        if time.monotonic() > deadline:
            raise AssertionError(f"no heartbeat of {worker} within {timeout} s")
        time.sleep(0.02)  # polling interval of a condition, not a synchronisation sleep


def _healthz(settings: Settings) -> tuple[int, dict[str, object]]:
    with TestClient(create_app(settings)) as client:
        r = client.get("/healthz")
    return r.status_code, r.json()


def test_background_worker_beats_and_healthz_reports_it(settings: Settings, engine: Engine) -> None:
    status, body = _healthz(settings)
    assert status == 200 and body["database"] == "ok"  # no worker: still healthy
    assert body["workers"] == {"seen": 0, "last_seen": None, "seen_within_s": SEEN_WITHIN_S}

    worker = start_background_worker(settings)
    try:
        row = _wait_for_row(engine, consumer_id())
    finally:
        worker.stop()
        worker.upkeep.queue.engine.dispose()
    assert not worker.consumer.scheduler.is_alive()  # stopped: it beats no more
    assert row.kind == WorkerKind.serve.value
    assert as_utc(row.started_at) <= as_utc(row.last_seen) <= utcnow()

    status, body = _healthz(settings)
    assert status == 200
    assert body["workers"] == {
        "seen": 1,
        "last_seen": iso_utc(row.last_seen),
        "seen_within_s": SEEN_WITHIN_S,
    }


def test_healthz_counts_only_recent_heartbeats(settings: Settings, engine: Engine) -> None:
    now = utcnow()
    started = now - timedelta(hours=1)
    record_heartbeat(
        engine, "old:1", kind=WorkerKind.worker, started_at=started, now=now - timedelta(minutes=5)
    )
    newest = now - timedelta(seconds=SEEN_WITHIN_S / 2)
    record_heartbeat(engine, "new:2", kind=WorkerKind.worker, started_at=started, now=newest)
    status, body = _healthz(settings)
    assert status == 200
    assert body["workers"] == {
        "seen": 1,
        "last_seen": iso_utc(newest),
        "seen_within_s": SEEN_WITHIN_S,
    }


def test_upkeep_beats_and_reaps_on_its_intervals(settings: Settings, engine: Engine) -> None:
    """With an injected clock: both at the first tick, then only when their interval
    has passed; the row keeps its ``started_at`` and moves ``last_seen``."""
    clock = [1000.0]
    reaped: list[float] = []
    queue = get_queue(settings)
    upkeep = Upkeep(queue, "host:42", WorkerKind.worker, 30.0, 20.0, lambda: clock[0])
    upkeep.reap = lambda: reaped.append(clock[0])  # type: ignore[method-assign]

    upkeep.tick()
    first = _rows(engine)["host:42"]
    assert reaped == [1000.0]
    clock[0] = 1019.0
    upkeep.tick()
    assert _rows(engine)["host:42"].last_seen == first.last_seen and reaped == [1000.0]
    clock[0] = 1020.0
    upkeep.tick()
    assert _rows(engine)["host:42"].last_seen == first.last_seen and reaped == [1000.0, 1020.0]
    clock[0] = 1030.0
    upkeep.tick()
    second = _rows(engine)["host:42"]
    assert as_utc(second.last_seen) > as_utc(first.last_seen)
    assert second.started_at == first.started_at and second.kind == "worker"
    queue.engine.dispose()


def test_a_failed_heartbeat_logs_one_line_and_the_worker_goes_on(
    sqlite_url: str, tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    """An unmigrated database (no table): the beat fails, the tick returns, one line."""
    settings = Settings(database_url=sqlite_url, queue_path=f"{tmp_path}/q.db")
    upkeep = Upkeep(get_queue(settings), "host:7", WorkerKind.worker, 30.0, 20.0)
    upkeep.reap = lambda: None  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="priorly.jobs"):
        upkeep.tick()
        assert upkeep.beat() is False
    upkeep.queue.engine.dispose()
    lines = [r for r in caplog.records if r.name == "priorly.jobs"]
    assert len(lines) == 2 and all(r.exc_info is None for r in lines)
    message = lines[0].getMessage()
    assert message.startswith("worker heartbeat of host:7 failed: ") and "\n" not in message
    assert "worker_heartbeat" in message


def test_heartbeats_older_than_the_pruning_age_are_deleted(engine: Engine) -> None:
    now = utcnow()
    started = now - timedelta(days=30)

    def beat(worker: str, at: datetime) -> None:
        record_heartbeat(engine, worker, kind=WorkerKind.serve, started_at=started, now=at)

    beat("gone:1", now - timedelta(seconds=PRUNE_AFTER_S + 60))
    beat("yesterday:2", now - timedelta(days=1))
    assert set(_rows(engine)) == {"gone:1", "yesterday:2"}
    beat("here:3", now)  # any worker's beat prunes
    assert set(_rows(engine)) == {"yesterday:2", "here:3"}
    beat("yesterday:2", now)  # an existing row is updated in place
    rows = _rows(engine)
    assert set(rows) == {"yesterday:2", "here:3"}
    assert as_utc(rows["yesterday:2"].last_seen) == now
    assert as_utc(rows["yesterday:2"].started_at) == started


def test_the_queue_engine_belongs_to_the_process_that_made_it(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forked process (another pid) makes its own engine; the parent's is kept, unused."""
    import app.jobs.queue as queue_module

    queue = get_queue(settings)
    parent = queue.engine
    try:
        assert queue.engine is parent
        monkeypatch.setattr(queue_module, "os", SimpleNamespace(getpid=lambda: -1))
        child = queue.engine
        try:
            assert child is not parent and queue.engine is child
            assert parent in queue._inherited
        finally:
            child.dispose()
    finally:
        parent.dispose()
