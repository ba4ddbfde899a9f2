"""The task queue: Huey with a SQLite file (one machine) or Redis (several machines).

One Huey task, ``priorly.run_job(job_id)``, carries a job id; everything else is in the
``job`` table. A queue is built per settings (:func:`get_queue`) and cached per process.
Huey's SQLite storage keeps queued messages on disk, so queued jobs survive a restart of
the server or of the workers; Redis does the same for workers on several machines.

Workers: :func:`run_worker` runs a consumer in the foreground (``priorly worker``, any
number of them, on any machine that reaches the database and the queue);
:func:`start_background_worker` starts consumer threads inside ``priorly serve``. Each
worker also runs a *reaper* thread (:func:`app.jobs.runner.reap_dead_jobs`) that queues
again the jobs whose worker died.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huey import RedisHuey, SqliteHuey
from huey.api import Huey
from huey.consumer import Consumer
from sqlalchemy.engine import Engine, make_url

from app.db import make_engine
from app.errors import ConfigurationError
from app.settings import Settings

log = logging.getLogger("priorly.jobs")

TASK_NAME = "priorly.run_job"


def queue_location(settings: Settings) -> str:
    """Where the queue lives: the Redis URL, or the SQLite queue file's path."""
    if settings.redis_url:
        return settings.redis_url
    if settings.queue_path is not None:
        return str(settings.queue_path)
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        return str(Path(url.database).expanduser().resolve().with_name("priorly-queue.db"))
    return str(Path("priorly-queue.db").resolve())


@dataclass
class Queue:
    """A Huey instance with the job task registered, and the engine its workers use."""

    huey: Huey
    task: Any
    settings: Settings
    _engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = make_engine(self.settings.database_url)
        return self._engine

    def enqueue(self, job_id: int) -> None:
        """Put ``job_id`` on the queue."""
        self.task(job_id)


_queues: dict[tuple[str, str], Queue] = {}
_lock = threading.Lock()


def get_queue(settings: Settings) -> Queue:
    """The (cached) queue of ``settings``."""
    key = (settings.database_url, queue_location(settings))
    with _lock:
        if key not in _queues:
            _queues[key] = _build(settings)
        return _queues[key]


def _build(settings: Settings) -> Queue:
    if settings.redis_url:
        try:
            import redis  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                "PRIORLY_REDIS_URL is set but the redis client is not installed "
                "(pip install 'priorly[redis]')"
            ) from None
        huey: Huey = RedisHuey("priorly", url=settings.redis_url, results=False)
    else:
        path = Path(queue_location(settings))
        path.parent.mkdir(parents=True, exist_ok=True)
        huey = SqliteHuey("priorly", filename=str(path), results=False)
    holder: dict[str, Queue] = {}

    @huey.task(name=TASK_NAME)
    def run_job(job_id: int) -> None:
        from app.jobs.runner import execute_job

        q = holder["queue"]
        execute_job(q.engine, job_id, stale_after_s=q.settings.job_stale_after_s)

    queue = Queue(huey=huey, task=run_job, settings=settings)
    holder["queue"] = queue
    return queue


class _EmbeddedConsumer(Consumer):  # type: ignore[misc]
    """A consumer that runs inside another program: no signal handlers of its own."""

    def _set_signal_handlers(self) -> None:
        return None


def _reaper_loop(queue: Queue, stop: threading.Event) -> None:
    from app.jobs.runner import reap_dead_jobs

    interval = max(0.5, queue.settings.job_stale_after_s / 3)
    while True:
        try:
            for job_id in reap_dead_jobs(
                queue.engine, stale_after_s=queue.settings.job_stale_after_s
            ):
                queue.enqueue(job_id)
        except Exception:  # the reaper must survive a database hiccup
            log.exception("reaping dead jobs failed")
        if stop.wait(interval):
            return


@dataclass
class BackgroundWorker:
    """Consumer threads and a reaper thread started by :func:`start_background_worker`."""

    consumer: Consumer
    stop_event: threading.Event
    reaper: threading.Thread

    def stop(self) -> None:
        self.stop_event.set()
        self.consumer.stop(graceful=False)


def start_background_worker(settings: Settings, workers: int = 1) -> BackgroundWorker:
    """Start ``workers`` consumer threads and a reaper in this process (``priorly serve``)."""
    queue = get_queue(settings)
    consumer = _EmbeddedConsumer(
        queue.huey, workers=workers, worker_type="thread", periodic=False, max_delay=1.0
    )
    consumer.start()
    stop = threading.Event()
    reaper = threading.Thread(target=_reaper_loop, args=(queue, stop), daemon=True, name="reaper")
    reaper.start()
    return BackgroundWorker(consumer, stop, reaper)


def run_worker(settings: Settings, workers: int = 1, worker_type: str = "thread") -> None:
    """Run a consumer in the foreground until interrupted (``priorly worker``)."""
    queue = get_queue(settings)
    stop = threading.Event()
    reaper = threading.Thread(target=_reaper_loop, args=(queue, stop), daemon=True, name="reaper")
    reaper.start()
    consumer = Consumer(
        queue.huey, workers=workers, worker_type=worker_type, periodic=False, max_delay=1.0
    )
    try:
        consumer.run()
    finally:
        stop.set()
