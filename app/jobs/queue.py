"""The task queue: Huey with a SQLite file (one machine) or Redis (several machines).

One Huey task, ``priorly.run_job(job_id)``, carries a job id; everything else is in the
``job`` table. A queue is built per settings (:func:`get_queue`) and cached per process.
Huey's SQLite storage keeps queued messages on disk, so queued jobs survive a restart of
the server or of the workers; Redis does the same for workers on several machines.

This module is the producer side (:meth:`Queue.enqueue`) and imports no job code. The
consumer side (:mod:`app.jobs.worker`) sets :attr:`Queue.executor` to the function that
runs a job (:func:`app.jobs.runner.execute_job`) before it consumes messages.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huey import RedisHuey, SqliteHuey
from huey.api import Huey
from sqlalchemy.engine import Engine, make_url

from app.db import make_engine
from app.errors import ConfigurationError
from app.settings import Settings, redact_url

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


def check_queue(settings: Settings) -> None:
    """Raise :class:`ConfigurationError`, one line naming the queue (its password
    hidden), when the Redis queue does not answer a PING within 5 s; a SQLite queue file
    needs no check (it is created on first use).

    A worker calls this before it consumes: without it, a worker whose Redis is down
    logs a traceback several times a second and never stops.
    """
    if not settings.redis_url:
        return
    import redis  # the client Huey's Redis storage uses; loaded only for a Redis queue

    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=5, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ConfigurationError(
            f"the job queue at {redact_url(settings.redis_url)} does not answer: {exc}"
        ) from None
    finally:
        client.close()


Executor = Callable[..., Any]
"""``executor(engine, job_id, *, stale_after_s)``: claims and runs one job."""


@dataclass
class Queue:
    """A Huey instance with the job task registered, and the engine its workers use.

    Attributes:
        huey: the Huey instance.
        task: the ``priorly.run_job`` task (calling it enqueues a job id).
        settings: the settings the queue was built from.
        executor: what the task runs in a consumer; set by :mod:`app.jobs.worker`.
    """

    huey: Huey
    task: Any
    settings: Settings
    executor: Executor | None = None
    _engine: Engine | None = None
    _engine_pid: int = 0
    _inherited: list[Engine] = field(default_factory=list)

    @property
    def engine(self) -> Engine:
        """This process's engine, made on first use in each process.

        A process forked after its parent made the engine (Huey's job processes, with
        ``priorly worker --processes``) makes its own: a pooled connection used by two
        processes mixes their statements, and a lock held by a parent's thread at the fork
        stays held in the child. The inherited engine is kept, unused, so that nothing of
        the parent's connections is closed from the child.
        """
        pid = os.getpid()
        if self._engine is None or self._engine_pid != pid:
            if self._engine is not None:
                self._inherited.append(self._engine)
            self._engine = make_engine(self.settings.database_url)
            self._engine_pid = pid
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
        # redis is an optional dependency (priorly[redis]): checked only when configured.
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
        q = holder["queue"]
        if q.executor is None:
            raise RuntimeError("this queue has no executor: consume it through app.jobs.worker")
        q.executor(q.engine, job_id, stale_after_s=q.settings.job_stale_after_s)

    queue = Queue(huey=huey, task=run_job, settings=settings)
    holder["queue"] = queue
    return queue
