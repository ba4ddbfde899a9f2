"""Which job workers run, from their heartbeats (:mod:`app.jobs.heartbeat`): the
``workers`` field of ``/healthz`` and the Jobs tab's warning that no worker runs.

A worker is *seen* while its last heartbeat is at most
:data:`app.jobs.heartbeat.SEEN_WITHIN_S` (60 s) old.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from app.jobs.heartbeat import SEEN_WITHIN_S
from app.tables import WorkerHeartbeat, as_utc, iso_utc, utcnow


@dataclass(frozen=True)
class WorkersSeen:
    """The workers' heartbeats at ``now``.

    Attributes:
        seen: workers whose last heartbeat is at most :data:`SEEN_WITHIN_S` old.
        last_seen: the newest heartbeat of any worker (UTC), ``None`` when there is none
            (no worker ever ran, or none in the last 7 days).
        now: the time it was read at.
    """

    seen: int
    last_seen: datetime | None
    now: datetime

    def silent_for_s(self) -> float | None:
        """Seconds since the newest heartbeat (``None`` without one)."""
        if self.last_seen is None:
            return None
        return max(0.0, (self.now - self.last_seen).total_seconds())


def workers_seen(session: Session, *, now: datetime | None = None) -> WorkersSeen:
    """Count the workers seen at ``now`` (default: the current time) and the newest heartbeat."""
    now = now or utcnow()
    since = now - timedelta(seconds=SEEN_WITHIN_S)
    seen = session.exec(select(func.count()).where(col(WorkerHeartbeat.last_seen) >= since)).one()
    newest = session.exec(select(func.max(WorkerHeartbeat.last_seen))).one()
    return WorkersSeen(int(seen), as_utc(newest) if newest is not None else None, now)


def worker_health(engine: Engine, *, now: datetime | None = None) -> dict[str, Any] | None:
    """The ``workers`` field of ``/healthz``: ``{"seen": 1, "last_seen":
    "2026-12-05T10:00:00.000000+00:00", "seen_within_s": 60}`` (``last_seen`` ``None``
    without any heartbeat); ``None`` when the database does not answer the query."""
    try:
        with Session(engine) as session:
            w = workers_seen(session, now=now)
    except SQLAlchemyError:
        return None
    return {"seen": w.seen, "last_seen": iso_utc(w.last_seen), "seen_within_s": int(SEEN_WITHIN_S)}


def duration_words(seconds: float) -> str:
    """A silence in whole units: minutes below 2 hours, hours below 2 days, else days, e.g.
    ``duration_words(754)`` = "12 minutes", ``duration_words(3 * 86400)`` = "3 days"."""
    for unit, size, below in (("minute", 60, 120), ("hour", 3600, 48), ("day", 86400, None)):
        n = max(1, int(seconds // size))
        if below is None or n < below:
            return f"{n} {unit}{'' if n == 1 else 's'}"
    raise AssertionError("unreachable")


def no_worker_warning(session: Session, *, queued: bool, now: datetime | None = None) -> str:
    """The Jobs tab's warning when ``queued`` jobs wait and no worker is seen, e.g. "No
    worker has been seen for 12 minutes: queued jobs wait until one starts (priorly worker
    or priorly serve)."; empty when nothing is queued or a worker is seen."""
    if not queued:
        return ""
    w = workers_seen(session, now=now)
    if w.seen:
        return ""
    silent = w.silent_for_s()
    since = "" if silent is None else f" for {duration_words(silent)}"
    return (
        f"No worker has been seen{since}: queued jobs wait until one starts "
        "(priorly worker or priorly serve)."
    )
