"""``priorly serve``: migrate, import the demo study if the database has none, queue its
model fit, run uvicorn.

The server answers within seconds of the start, also on an empty database: the demo
study is imported (a few seconds), its belief model is fitted by a ``fit_model`` job that
the in-process worker runs, and until that model exists the demo survey shows a
"preparing" page (:func:`app.services.demo.queue_demo_preparation`). Nothing is fitted
before the port is open, and nothing is fitted inside a request.
"""

from __future__ import annotations

import argparse
import errno
import socket
from typing import Any

from app.errors import ConflictError
from app.logs import configure_logging, uvicorn_log_config
from app.settings import load_settings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the web server (migrates the database first)",
        description=(
            "Migrate the database, import the bundled CES demo study when there is no study "
            "yet (unless --no-demo) and queue the fit of its model, then serve the app with "
            "uvicorn."
        ),
    )
    parser.add_argument("--host", help="interface to bind (default: PRIORLY_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: PRIORLY_PORT or 8000)")
    parser.add_argument(
        "--no-demo", action="store_true", help="do not import the demo study into an empty database"
    )
    parser.add_argument(
        "--no-worker",
        action="store_true",
        help="do not run job workers in this process (run 'priorly worker' separately)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="job worker threads in this process (default 1)"
    )
    parser.set_defaults(func=_serve)


def bind_listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``(host, port)`` for uvicorn to serve on.

    Raises:
        ConflictError: the port is taken (the message says to choose another with
            ``--port``); the CLI prints it as one line and exits with code 2.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConflictError(
                f"port {port} on {host} is already in use; "
                f"choose another one with --port (e.g. priorly serve --port {port + 1})"
            ) from None
        raise ConflictError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def _serve(args: argparse.Namespace) -> int:
    # uvicorn, the web app, the importer and the job code load torch, numpy, fastapi and
    # huey when the command runs: --help stays fast.
    import uvicorn
    from sqlmodel import Session

    from app import db
    from app.jobs.worker import start_background_worker
    from app.main import create_app
    from app.services.bootstrap import bootstrap_database
    from app.services.demo import queue_demo_preparation
    from app.services.jobs import requeue_orphans

    overrides: dict[str, Any] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    settings = load_settings(**overrides)
    configure_logging(settings.log_level)
    # The port first: a busy port fails at once, before anything is written.
    sock = bind_listening_socket(settings.host, settings.port)
    try:
        result = bootstrap_database(settings, import_demo=not args.no_demo)
        if result.demo is not None:
            print(
                f"imported the demo study {result.demo.slug!r} "
                f"({result.demo.n_respondents:,} respondents) in {result.demo.seconds:.1f} s"
            )
        engine = db.make_engine(settings.database_url)
        try:
            with Session(engine) as session:
                demo = None
                if not args.no_demo:
                    demo = queue_demo_preparation(settings, session=session, log=print)
                requeue_orphans(settings, session=session)
        finally:
            engine.dispose()
        in_process = not args.no_worker and args.workers > 0
        if demo is not None and demo.state != "ready" and not in_process:
            print("no job worker in this process: run 'priorly worker' to fit the demo's model")
        worker = None
        if in_process:
            worker = start_background_worker(settings, workers=args.workers)
            print(f"job worker: {args.workers} thread(s) in this process")
        print(f"serving on http://{settings.host}:{settings.port}", flush=True)
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(settings),
                log_level=settings.log_level,
                log_config=uvicorn_log_config(settings.log_level),
            )
        )
        try:
            server.run(sockets=[sock])
        finally:
            if worker is not None:
                worker.stop()
    finally:
        sock.close()
    return 0
