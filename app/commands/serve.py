"""``priorly serve``: migrate, import the demo study if the database has none, run uvicorn."""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn

from app.settings import load_settings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the web server (migrates the database first)",
        description=(
            "Migrate the database, import the bundled CES demo study when there is no study "
            "yet (unless --no-demo), then serve the app with uvicorn."
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


def _serve(args: argparse.Namespace) -> int:
    # The web app, the importer, the demo's preparation and the job code load torch,
    # numpy, fastapi and huey when the command runs: --help stays fast.
    from app.jobs.worker import start_background_worker
    from app.main import create_app
    from app.services.bootstrap import bootstrap_database
    from app.services.demo import prepare_demo_database

    overrides: dict[str, Any] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    settings = load_settings(**overrides)
    result = bootstrap_database(settings, import_demo=not args.no_demo)
    if result.demo is not None:
        print(
            f"imported the demo study {result.demo.slug!r} "
            f"({result.demo.n_respondents:,} respondents) in {result.demo.seconds:.1f} s"
        )
    if not args.no_demo:
        prepare_demo_database(settings, log=print)
    worker = None
    if not args.no_worker and args.workers > 0:
        worker = start_background_worker(settings, workers=args.workers)
        print(f"job worker: {args.workers} thread(s) in this process")
    print(f"serving on http://{settings.host}:{settings.port}")
    try:
        uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")
    finally:
        if worker is not None:
            worker.stop()
    return 0
