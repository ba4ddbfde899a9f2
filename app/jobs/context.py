"""What a job function gets: :class:`JobContext` (its row's data, the engine, progress).

A job function (:mod:`app.jobs.tasks`) has the signature
``fn(ctx: JobContext) -> dict`` (the dict, JSON-able, is stored in ``job.result``). It
reports progress through :meth:`JobContext.progress`, which raises :class:`JobCancelled`
when a cancel was requested and :class:`JobLost` when this worker no longer holds the job;
both are control flow of the runner (:mod:`app.jobs.runner`), not errors of the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.tables import Job, utcnow


class JobCancelled(Exception):
    """Raised inside a job function when the job was cancelled; its argument is the last
    progress message (what the job had done, e.g. "52 of 96 pairs scored")."""


class JobLost(Exception):
    """This worker no longer holds the job (it was presumed dead and the job retried)."""


@dataclass
class JobContext:
    """A running job as its function sees it.

    Attributes:
        engine: open a ``Session(engine)`` for database work.
        job_id, kind, study_id, payload: from the job row.
        worker: ``host:pid:thread`` of the worker holding the job; every write of
            :meth:`progress` is conditional on it.
    """

    engine: Engine
    job_id: int
    kind: str
    study_id: int | None
    payload: dict[str, Any]
    worker: str

    def progress(self, fraction: float, message: str = "") -> None:
        """Record progress in ``[0, 1]`` (clipped) with a message of at most 500 characters.

        Raises:
            JobLost: another worker holds the job now.
            JobCancelled: a cancel was requested.
        """
        fraction = min(1.0, max(0.0, float(fraction)))
        with Session(self.engine) as db:
            res = db.execute(
                update(Job)
                .where(col(Job.id) == self.job_id, col(Job.worker) == self.worker)
                .values(progress=fraction, message=message[:500], heartbeat_at=utcnow())
            )
            db.commit()
            if res.rowcount == 0:  # type: ignore[attr-defined]
                raise JobLost(f"job {self.job_id} is no longer held by this worker")
            cancel = db.exec(select(Job.cancel_requested).where(Job.id == self.job_id)).one()
        if cancel:
            raise JobCancelled(message[:400])

    def callback(self, start: float, end: float) -> Callable[[float, str], None]:
        """A progress function mapping ``[0, 1]`` of a sub-step onto ``[start, end]``."""

        def report(fraction: float, message: str = "") -> None:
            self.progress(start + (end - start) * fraction, message)

        return report
