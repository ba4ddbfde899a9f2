"""Run one job: claim it, heartbeat, progress, cancellation, result; retry dead workers.

Life of a job row (``job.status``): ``queued`` → ``running`` → ``succeeded`` / ``failed`` /
``cancelled``. A worker *claims* a queued job with one conditional update (``status =
'queued'`` → ``'running'``, its id in ``job.worker``, ``attempts + 1``), so the same job
delivered twice, or to two workers, runs once. While it runs, a heartbeat thread touches
``job.heartbeat_at``; progress calls write ``progress`` / ``message`` and raise
:class:`JobCancelled` when a cancel was requested. Every write after the claim is
conditional on ``job.worker`` still being this worker, so a worker that was presumed dead
cannot overwrite the job after another worker took it.

A worker that dies (killed, machine lost) leaves its job ``running``. :func:`reap_dead_jobs`
(run by every worker at start and then periodically) finds such jobs: the worker's
process is gone (same host) or its heartbeat is older than ``stale_after_s`` (any host);
the job goes back to ``queued`` and is put on the queue again, up to
:data:`MAX_ATTEMPTS` attempts. Job functions are deterministic given the job's payload
(seeded), so a retried job finishes with the same result as an uninterrupted one.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.errors import error_line, is_user_error
from app.jobs.context import JobCancelled, JobContext, JobLost
from app.jobs.tasks import task_of
from app.tables import Job, JobStatus, utcnow

log = logging.getLogger("priorly.jobs")

MAX_ATTEMPTS = 3
"""A job whose worker died this many times is marked failed instead of retried."""


def worker_id() -> str:
    """``host:pid:thread`` of the calling worker thread."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _worker_dead_here(worker: str | None) -> bool:
    """Whether ``worker`` ran on this host in a process that no longer exists."""
    if not worker:
        return False
    parts = worker.split(":")
    if len(parts) < 2 or parts[0] != socket.gethostname():
        return False
    try:
        pid = int(parts[1])
    except ValueError:
        return False
    return not _pid_alive(pid)


def claim(engine: Engine, job_id: int, worker: str) -> Job | None:
    """Atomically take the queued job ``job_id``; ``None`` if it is not queued any more."""
    now = utcnow()
    with Session(engine) as db:
        res = db.execute(
            update(Job)
            .where(col(Job.id) == job_id, col(Job.status) == JobStatus.queued.value)
            .values(
                status=JobStatus.running.value,
                worker=worker,
                heartbeat_at=now,
                started_at=now,
                attempts=Job.attempts + 1,
                progress=0.0,
                message="started",
            )
        )
        db.commit()
        if res.rowcount != 1:  # type: ignore[attr-defined]
            return None
        job = db.get(Job, job_id)
        assert job is not None
        db.expunge(job)
        return job


def _finish(engine: Engine, job_id: int, worker: str, **values: Any) -> bool:
    with Session(engine) as db:
        res = db.execute(
            update(Job)
            .where(col(Job.id) == job_id, col(Job.worker) == worker)
            .values(finished_at=utcnow(), **values)
        )
        db.commit()
        return bool(res.rowcount == 1)  # type: ignore[attr-defined]


def _heartbeat(
    engine: Engine, job_id: int, worker: str, stop: threading.Event, every: float
) -> None:
    while not stop.wait(every):
        try:
            with Session(engine) as db:
                db.execute(
                    update(Job)
                    .where(col(Job.id) == job_id, col(Job.worker) == worker)
                    .values(heartbeat_at=utcnow())
                )
                db.commit()
        except Exception:  # a missed heartbeat is not fatal; the next one may succeed
            log.exception("heartbeat of job %s failed", job_id)


def execute_job(engine: Engine, job_id: int, *, stale_after_s: float = 60.0) -> str | None:
    """Claim and run job ``job_id``; returns its final status (``None`` if not claimed).

    The job's ``error`` is the message of a user error (:func:`app.errors.is_user_error`),
    else ``internal error (<class>: <message>)`` with the traceback in the log.
    """
    me = worker_id()
    job = claim(engine, job_id, me)
    if job is None:
        return None
    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat,
        args=(engine, job_id, me, stop, max(0.2, stale_after_s / 4)),
        daemon=True,
        name=f"heartbeat-{job_id}",
    )
    beat.start()
    ctx = JobContext(engine, job_id, job.kind, job.study_id, dict(job.payload or {}), me)
    started = time.monotonic()
    what = f"job {job_id} ({job.kind}, study {job.study_id})"
    log.info("%s started, attempt %s", what, job.attempts)
    try:
        result = task_of(job.kind)(ctx)
    except JobCancelled as exc:
        last = str(exc.args[0]) if exc.args and exc.args[0] else ""
        message = f"cancelled; last progress: {last}" if last else "cancelled"
        _finish(engine, job_id, me, status=JobStatus.cancelled.value, message=message)
        log.info("%s cancelled after %.1f s", what, time.monotonic() - started)
        return JobStatus.cancelled.value
    except JobLost:
        log.warning("job %s was taken over by another worker", job_id)
        return None
    except Exception as exc:
        if is_user_error(exc):
            error = error_line(exc)
        else:
            log.error("job %s failed:\n%s", job_id, traceback.format_exc())
            error = f"internal error ({type(exc).__name__}: {exc})"
        _finish(engine, job_id, me, status=JobStatus.failed.value, error=error[:4000])
        log.warning("%s failed after %.1f s: %s", what, time.monotonic() - started, error[:500])
        return JobStatus.failed.value
    finally:
        stop.set()
    done = _finish(
        engine,
        job_id,
        me,
        status=JobStatus.succeeded.value,
        result=result,
        progress=1.0,
        message="done",
    )
    log.info("%s succeeded in %.1f s", what, time.monotonic() - started)
    return JobStatus.succeeded.value if done else None


def reap_dead_jobs(engine: Engine, *, stale_after_s: float) -> list[int]:
    """Queue again the running jobs whose worker died; returns the ids to enqueue.

    A job's worker is dead when it ran on this host and its process is gone, or when its
    heartbeat is older than ``stale_after_s``. A job that already used
    :data:`MAX_ATTEMPTS` attempts is marked failed instead.
    """
    now = utcnow()
    limit = now - timedelta(seconds=stale_after_s)
    requeue: list[int] = []
    with Session(engine) as db:
        # Only jobs claimed by a queue worker (``worker`` set): a job row that a CLI command
        # runs itself (e.g. ``priorly personas generate``) has no worker and is not ours.
        running = db.exec(
            select(Job).where(Job.status == JobStatus.running.value, col(Job.worker).is_not(None))
        ).all()
        for job in running:
            beat = job.heartbeat_at
            if beat is not None and beat.tzinfo is None:  # SQLite returns naive UTC
                beat = beat.replace(tzinfo=now.tzinfo)
            stale = beat is None or beat < limit
            if not (stale or _worker_dead_here(job.worker)):
                continue
            if job.attempts >= MAX_ATTEMPTS:
                values: dict[str, Any] = {
                    "status": JobStatus.failed.value,
                    "error": f"the worker died {job.attempts} times while running this job",
                    "finished_at": now,
                    "worker": None,
                }
            elif job.cancel_requested:
                values = {"status": JobStatus.cancelled.value, "finished_at": now, "worker": None}
            else:
                values = {
                    "status": JobStatus.queued.value,
                    "worker": None,
                    "message": f"retrying: the worker of attempt {job.attempts} died",
                }
            res = db.execute(
                update(Job)
                .where(
                    col(Job.id) == job.id,
                    col(Job.status) == JobStatus.running.value,
                    col(Job.worker) == job.worker,
                )
                .values(**values)
            )
            if res.rowcount == 1 and values["status"] == JobStatus.queued.value:  # type: ignore[attr-defined]
                requeue.append(int(job.id or 0))
        db.commit()
    if requeue:
        log.warning("queued again jobs whose worker died: %s", requeue)
    return requeue
