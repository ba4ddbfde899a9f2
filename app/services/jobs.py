"""Jobs seen from the web app: start one (row first, then the queue), list, cancel.

Imports only the registry of kinds and the queue (:mod:`app.jobs`), never the job code.

The job row is committed before its id is put on the queue, so a worker never sees an id
without a row; a crash between the two leaves a ``queued`` row that
:func:`requeue_orphans` (run at ``priorly serve`` / ``priorly worker`` start) queues again.
A queue that refuses the id (Redis down) marks the row ``failed`` at once and raises
:class:`QueueUnavailableError` (503): no ``queued`` row is left that nobody will run.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.errors import ConflictError, NotFoundError, PriorlyError, error_line
from app.jobs.queue import get_queue
from app.jobs.registry import check_kind
from app.settings import Settings
from app.tables import Job, JobStatus, Researcher, Study, utcnow

ACTIVE = (JobStatus.queued.value, JobStatus.running.value)

log = logging.getLogger(__name__)


def start_job(
    kind: str,
    study: Study,
    *,
    payload: dict[str, object] | None = None,
    researcher: Researcher | None,
    settings: Settings,
    session: Session,
) -> Job:
    """Create a queued job of ``kind`` for ``study`` and put it on the queue.

    Raises:
        JobAlreadyActiveError: a ``fit_model`` job while the study has one queued or
            running (the database refuses a second: index ``uq_job_one_active_fit``);
            ``.job`` is that job.
        QueueUnavailableError: the queue refused the job's id (e.g. Redis unreachable);
            the job is then ``failed`` with that reason, never left ``queued``.
    """
    check_kind(kind)  # unknown kind: InvalidInputError before anything is written
    job = Job(
        kind=kind,
        study_id=study.id,
        payload=dict(payload or {}),
        created_by_id=researcher.id if researcher else None,
        message="queued",
    )
    session.add(job)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        active = session.exec(
            select(Job)
            .where(Job.study_id == study.id, Job.kind == kind, col(Job.status).in_(ACTIVE))
            .order_by(col(Job.id).desc())
        ).first()
        if active is None:
            raise
        raise JobAlreadyActiveError(active) from None
    session.refresh(job)
    try:
        get_queue(settings).enqueue(job.id or 0)
    except Exception as exc:  # any refusal: a queued row nobody runs would wait forever
        reason = (
            f"the job queue is unreachable: {error_line(exc)}; "
            "start it again when the queue is back"
        )
        log.warning("job %s (%s) not queued: %s", job.id, kind, error_line(exc))
        session.rollback()
        session.execute(
            update(Job)
            .where(col(Job.id) == job.id, col(Job.status) == JobStatus.queued.value)
            .values(
                status=JobStatus.failed.value, message="failed", error=reason, finished_at=utcnow()
            )
        )
        session.commit()
        raise QueueUnavailableError(reason) from exc
    return job


class QueueUnavailableError(PriorlyError):
    """The job queue (Redis, or the SQLite queue file) refused a job: 503, try again later.

    Example message: ``the job queue is unreachable: Error 111 connecting to 127.0.0.1:1.
    Connection refused.; start it again when the queue is back``."""

    http_status = 503


class JobAlreadyActiveError(ConflictError):
    """The study already has a queued or running job of this kind (``job``)."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.id} ({job.kind}) is already {job.status} for this study")
        self.job = job


def study_jobs(study: Study, *, session: Session, limit: int = 50) -> list[Job]:
    """The study's jobs, newest first."""
    return list(
        session.exec(
            select(Job).where(Job.study_id == study.id).order_by(col(Job.id).desc()).limit(limit)
        ).all()
    )


def jobs_ahead(waiting: list[Job], *, session: Session) -> dict[int, tuple[int, int]]:
    """``{job id: (earlier, of other studies)}`` for each queued job of ``waiting``: the
    queued or running jobs of any study created before it (a smaller id), which the
    workers take first, and how many of those belong to another study. One query.

    Example: study A's fit (#7) is queued while study B's simulation (#5) runs and A's own
    persona job (#6) is queued: ``{7: (2, 1)}``.
    """
    queued = [j for j in waiting if j.status == JobStatus.queued.value and j.id is not None]
    if not queued:
        return {}
    newest = max(j.id or 0 for j in queued)
    active = session.exec(
        select(Job.id, Job.study_id).where(col(Job.status).in_(ACTIVE), col(Job.id) < newest)
    ).all()
    return {
        j.id or 0: (
            sum(1 for i, _ in active if (i or 0) < (j.id or 0)),
            sum(1 for i, s in active if (i or 0) < (j.id or 0) and s != j.study_id),
        )
        for j in queued
    }


def get_study_job(study: Study, job_id: int, *, session: Session) -> Job:
    """Job ``job_id`` of ``study``; :class:`NotFoundError` for another study's job."""
    job = session.get(Job, job_id)
    if job is None or job.study_id != study.id:
        raise NotFoundError(f"no job {job_id} in this study")
    return job


def latest_result(study: Study, kind: str, *, session: Session) -> Job | None:
    """The newest succeeded job of ``kind`` for ``study``."""
    return session.exec(
        select(Job)
        .where(Job.study_id == study.id, Job.kind == kind, Job.status == JobStatus.succeeded.value)
        .order_by(col(Job.id).desc())
    ).first()


def cancel_job(job: Job, *, session: Session) -> Job:
    """Cancel a queued job at once; ask a running one to stop at its next progress report."""
    if job.status not in ACTIVE:
        raise ConflictError(
            f"job {job.id} is {job.status}; only queued or running jobs can be cancelled"
        )
    session.execute(
        update(Job)
        .where(col(Job.id) == job.id, col(Job.status) == JobStatus.queued.value)
        .values(status=JobStatus.cancelled.value, finished_at=utcnow(), message="cancelled")
    )
    session.execute(
        update(Job)
        .where(col(Job.id) == job.id, col(Job.status) == JobStatus.running.value)
        .values(cancel_requested=True, message="cancelling")
    )
    session.commit()
    session.refresh(job)
    return job


def requeue_orphans(
    settings: Settings, *, session: Session, older_than_s: float = 5.0
) -> list[int]:
    """Queue again ``queued`` jobs older than ``older_than_s`` (a message may have been lost).

    A job delivered twice runs once (the claim is atomic), so this is safe to repeat.
    """
    limit = utcnow() - timedelta(seconds=older_than_s)
    ids = [
        int(i)
        for i in session.exec(
            select(Job.id).where(Job.status == JobStatus.queued.value, Job.created_at < limit)
        ).all()
        if i is not None
    ]
    queue = get_queue(settings)
    for job_id in ids:
        queue.enqueue(job_id)
    return ids
