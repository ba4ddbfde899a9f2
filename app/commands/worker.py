"""``priorly worker``: run a job-queue worker in the foreground (any number, any machine)."""

from __future__ import annotations

import argparse
from typing import Any

from sqlmodel import Session

from app.db import check_database, head_revision, make_engine
from app.errors import DatabaseError, InvalidInputError
from app.logs import configure_logging
from app.settings import load_settings, redact_url


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker",
        help=(
            "run a job worker (fits, simulations, GNN training, persona generation) "
            "in the foreground"
        ),
        description=(
            "Run a worker of the job queue: a SQLite queue file next to a SQLite database "
            "(or PRIORLY_QUEUE_PATH), or Redis when PRIORLY_REDIS_URL is set (workers on "
            "several machines). Jobs whose worker died are queued again. Stop with Ctrl-C."
        ),
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="jobs run at the same time (default 1)"
    )
    parser.add_argument(
        "--processes",
        action="store_true",
        help="run each job slot in its own process instead of a thread",
    )
    parser.set_defaults(func=_worker)


def _worker(args: argparse.Namespace) -> int:
    # The queue (huey) and the job code (torch, the services) load when the command runs:
    # --help stays fast.
    from app.jobs.queue import check_queue, queue_location
    from app.jobs.worker import run_worker
    from app.services.jobs import requeue_orphans

    if args.workers < 1:
        raise InvalidInputError(f"--workers must be >= 1, got {args.workers}")
    settings = load_settings()
    configure_logging(settings.log_level)
    engine = make_engine(settings.database_url)
    try:
        status = check_database(engine, head_revision())
        if status != "ok":
            raise DatabaseError(f"database {status}")
        check_queue(settings)
        with Session(engine) as session:
            requeue_orphans(settings, session=session)
    finally:
        engine.dispose()
    print(
        f"priorly worker: {args.workers} {'process' if args.processes else 'thread'}(s), "
        f"queue {redact_url(queue_location(settings))}",
        flush=True,
    )
    run_worker(
        settings, workers=args.workers, worker_type="process" if args.processes else "thread"
    )
    return 0
