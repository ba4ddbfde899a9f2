"""Workers of the job queue: consumers that run jobs, their heartbeat, and the reaper of
dead workers' jobs.

:func:`run_worker` runs a consumer in the foreground (``priorly worker``, any number of
them, on any machine that reaches the database and the queue);
:func:`start_background_worker` starts consumer threads inside ``priorly serve``. A
consumer is Huey's, whose scheduler (a thread; a process with ``--processes``) also does
the worker's :class:`Upkeep` on each of its one-second ticks: the heartbeat
(:mod:`app.jobs.heartbeat`) and the *reaper* (:func:`app.jobs.runner.reap_dead_jobs`),
which queues again the jobs whose worker died.

Fork safety: with ``--processes`` Huey forks the scheduler and the job processes from the
consumer's main process, at start and again for each one that died. That main process
opens no database connection and runs no thread of its own after start-up (the upkeep
runs in the scheduler), and each process makes its own engine
(:attr:`app.jobs.queue.Queue.engine`): a thread inside SQLite or SQLAlchemy at the moment
of a fork leaves their locks held in the child, which then hangs on its first database
call, and a pooled connection shared by two processes mixes their statements.

This is the one place that connects the queue (:mod:`app.jobs.queue`) to the job code
(:mod:`app.jobs.runner`, :mod:`app.jobs.tasks`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from huey.consumer import Consumer, Scheduler

from app.errors import error_line
from app.jobs.heartbeat import HEARTBEAT_S, consumer_id, record_heartbeat
from app.jobs.queue import Queue, get_queue
from app.jobs.runner import execute_job, reap_dead_jobs
from app.settings import Settings
from app.tables import WorkerKind, utcnow

log = logging.getLogger("priorly.jobs")

STOP_WAIT_S = 5.0
"""How long :meth:`BackgroundWorker.stop` waits for the scheduler thread to end."""


def consumer_queue(settings: Settings) -> Queue:
    """The queue of ``settings`` with :func:`app.jobs.runner.execute_job` as its executor."""
    queue = get_queue(settings)
    queue.executor = execute_job
    return queue


def reap_every_s(settings: Settings) -> float:
    """Seconds between two runs of the reaper: a third of ``job_stale_after_s``, at least
    1 (the scheduler ticks once a second), e.g. 20 s with the default 60 s."""
    return max(1.0, settings.job_stale_after_s / 3)


@dataclass
class Upkeep:
    """What a consumer does besides running jobs, on each tick of its scheduler: the
    heartbeat every ``heartbeat_s`` seconds and the reaper every ``reap_s`` seconds, both
    on the first tick.

    Attributes:
        queue: the consumer's queue (its engine and settings; reaped jobs go back on it).
        worker: the consumer's id, ``host:pid`` of its main process
            (:func:`app.jobs.heartbeat.consumer_id`).
        kind: ``serve`` or ``worker``.
        heartbeat_s, reap_s: the intervals, in seconds of ``clock``.
        clock: monotonic seconds; :meth:`tick` compares it with the next due times.
        started_at: when the consumer started (its heartbeat row's ``started_at``).
    """

    queue: Queue
    worker: str
    kind: WorkerKind
    heartbeat_s: float = HEARTBEAT_S
    reap_s: float = 20.0
    clock: Callable[[], float] = time.monotonic
    started_at: datetime = field(default_factory=utcnow)
    _next_beat: float | None = None
    _next_reap: float | None = None

    def tick(self) -> None:
        """Beat and reap when each is due; never raises."""
        now = self.clock()
        if self._next_beat is None or now >= self._next_beat:
            self._next_beat = now + self.heartbeat_s
            self.beat()
        if self._next_reap is None or now >= self._next_reap:
            self._next_reap = now + self.reap_s
            self.reap()

    def beat(self) -> bool:
        """Write the heartbeat; on a database error log one line and return ``False``."""
        try:
            record_heartbeat(
                self.queue.engine, self.worker, kind=self.kind, started_at=self.started_at
            )
        except Exception as exc:  # a database hiccup must not stop the worker
            log.warning("worker heartbeat of %s failed: %s", self.worker, error_line(exc)[:300])
            return False
        return True

    def reap(self) -> None:
        """Queue again the jobs whose worker died (:func:`app.jobs.runner.reap_dead_jobs`)."""
        try:
            for job_id in reap_dead_jobs(
                self.queue.engine, stale_after_s=self.queue.settings.job_stale_after_s
            ):
                self.queue.enqueue(job_id)
        except Exception:  # the reaper must survive a database hiccup
            log.exception("reaping dead jobs failed")


class _Scheduler(Scheduler):  # type: ignore[misc]
    """Huey's scheduler that also runs the consumer's :class:`Upkeep` on each tick."""

    def __init__(self, *args: Any, upkeep: Upkeep) -> None:
        super().__init__(*args)
        self.upkeep = upkeep

    def loop(self, now: Any = None) -> None:
        self.upkeep.tick()
        super().loop(now)


class _Consumer(Consumer):  # type: ignore[misc]
    """Huey's consumer with :class:`_Scheduler` (Huey restarts a scheduler that died)."""

    def __init__(self, huey: Any, upkeep: Upkeep, **kwargs: Any) -> None:
        self.upkeep = upkeep  # read by _create_scheduler, which the base __init__ calls
        super().__init__(huey, **kwargs)

    def _create_scheduler(self) -> _Scheduler:
        return _Scheduler(
            self.huey, self.stop_flag, self.scheduler_interval, self.periodic, upkeep=self.upkeep
        )


class _EmbeddedConsumer(_Consumer):
    """A consumer that runs inside another program: no signal handlers of its own."""

    def _set_signal_handlers(self) -> None:
        return None


@dataclass
class BackgroundWorker:
    """Consumer threads and their scheduler started by :func:`start_background_worker`."""

    consumer: Consumer
    upkeep: Upkeep

    def stop(self) -> None:
        """Stop at once; wait up to :data:`STOP_WAIT_S` for the scheduler thread to end."""
        self.consumer.stop(graceful=False)
        scheduler = self.consumer.scheduler
        if isinstance(scheduler, threading.Thread) and scheduler.is_alive():
            scheduler.join(STOP_WAIT_S)


def start_background_worker(
    settings: Settings,
    workers: int = 1,
    *,
    heartbeat_s: float = HEARTBEAT_S,
    clock: Callable[[], float] = time.monotonic,
) -> BackgroundWorker:
    """Start ``workers`` consumer threads and their scheduler in this process
    (``priorly serve``); the heartbeat row's kind is ``serve``."""
    queue = consumer_queue(settings)
    upkeep = Upkeep(
        queue, consumer_id(), WorkerKind.serve, heartbeat_s, reap_every_s(settings), clock
    )
    consumer = _EmbeddedConsumer(
        queue.huey, upkeep, workers=workers, worker_type="thread", periodic=False, max_delay=1.0
    )
    consumer.start()
    return BackgroundWorker(consumer, upkeep)


def run_worker(
    settings: Settings,
    workers: int = 1,
    worker_type: str = "thread",
    *,
    heartbeat_s: float = HEARTBEAT_S,
) -> None:
    """Run a consumer in the foreground until interrupted (``priorly worker``); the
    heartbeat row's kind is ``worker``. ``worker_type`` ``"process"`` runs each job slot
    and the scheduler in a forked process (see the module docstring)."""
    queue = consumer_queue(settings)
    upkeep = Upkeep(queue, consumer_id(), WorkerKind.worker, heartbeat_s, reap_every_s(settings))
    consumer = _Consumer(
        queue.huey, upkeep, workers=workers, worker_type=worker_type, periodic=False, max_delay=1.0
    )
    consumer.run()
