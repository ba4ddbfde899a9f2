"""Worker heartbeats: each consumer of the job queue records, in the database, that it runs.

A consumer process (``priorly worker``, or ``priorly serve`` with its in-process worker)
has one row of ``worker_heartbeat`` (:class:`app.tables.WorkerHeartbeat`), keyed by its
``host:pid`` (:func:`consumer_id`), and rewrites its ``last_seen`` every
:data:`HEARTBEAT_S` seconds (:func:`record_heartbeat`, called by the consumer's
scheduler, :mod:`app.jobs.worker`). A worker is *seen* while its ``last_seen`` is at most
:data:`SEEN_WITHIN_S` old: two beats, so one late or failed write does not make a running
worker look dead. Rows not seen for :data:`PRUNE_AFTER_S` are deleted by every beat.

The readers are in :mod:`app.services.workers` (``/healthz``, the admin's Jobs tab). This
module imports no job code.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta

from sqlalchemy import delete, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from app.tables import WorkerHeartbeat, WorkerKind, utcnow

HEARTBEAT_S = 30.0
"""Seconds between two heartbeats of a worker."""

SEEN_WITHIN_S = 2 * HEARTBEAT_S
"""A worker whose last heartbeat is at most this old (60 s) counts as running."""

PRUNE_AFTER_S = 7 * 24 * 3600.0
"""Heartbeat rows older than this (7 days) are deleted."""


def consumer_id() -> str:
    """``host:pid`` of this process: the id of the consumer it runs, e.g. ``"web1:4121"``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def record_heartbeat(
    engine: Engine,
    worker: str,
    *,
    kind: WorkerKind,
    started_at: datetime,
    now: datetime | None = None,
) -> None:
    """Write ``worker``'s row with ``last_seen = now`` (inserted if missing, e.g. pruned
    while the machine slept) and delete the rows older than :data:`PRUNE_AFTER_S`, in one
    transaction. Raises the database's error; the caller logs it and beats again later."""
    now = now or utcnow()
    with Session(engine) as db:
        res = db.execute(
            update(WorkerHeartbeat)
            .where(col(WorkerHeartbeat.id) == worker)
            .values(last_seen=now, kind=kind.value, started_at=started_at)
        )
        if res.rowcount == 0:  # type: ignore[attr-defined]
            db.add(
                WorkerHeartbeat(id=worker, kind=kind.value, started_at=started_at, last_seen=now)
            )
        db.execute(
            delete(WorkerHeartbeat).where(
                col(WorkerHeartbeat.last_seen) < now - timedelta(seconds=PRUNE_AFTER_S)
            )
        )
        db.commit()
