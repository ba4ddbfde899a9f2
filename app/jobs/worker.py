"""Workers of the job queue: consumers that run jobs, and the reaper of dead workers' jobs.

:func:`run_worker` runs a consumer in the foreground (``priorly worker``, any number of
them, on any machine that reaches the database and the queue);
:func:`start_background_worker` starts consumer threads inside ``priorly serve``. Each
worker also runs a *reaper* thread (:func:`app.jobs.runner.reap_dead_jobs`) that queues
again the jobs whose worker died. This is the one place that connects the queue
(:mod:`app.jobs.queue`) to the job code (:mod:`app.jobs.runner`, :mod:`app.jobs.tasks`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from huey.consumer import Consumer

from app.jobs.queue import Queue, get_queue
from app.jobs.runner import execute_job, reap_dead_jobs
from app.settings import Settings

log = logging.getLogger("priorly.jobs")


def consumer_queue(settings: Settings) -> Queue:
    """The queue of ``settings`` with :func:`app.jobs.runner.execute_job` as its executor."""
    queue = get_queue(settings)
    queue.executor = execute_job
    return queue


class _EmbeddedConsumer(Consumer):  # type: ignore[misc]
    """A consumer that runs inside another program: no signal handlers of its own."""

    def _set_signal_handlers(self) -> None:
        return None


def _reaper_loop(queue: Queue, stop: threading.Event) -> None:
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
    queue = consumer_queue(settings)
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
    queue = consumer_queue(settings)
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
