"""``priorly db upgrade`` / ``priorly db downgrade REV``: run the Alembic migration chain."""

from __future__ import annotations

import argparse
from typing import Any

from app import db
from app.settings import get_settings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "db",
        help="migrate the database",
        description="Migrate the database at PRIORLY_DATABASE_URL.",
    )
    sub = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = sub.add_parser("upgrade", help="migrate to the newest schema (or REV)")
    up.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    up.set_defaults(func=_upgrade)
    down = sub.add_parser("downgrade", help="migrate down to REV ('base' removes all tables)")
    down.add_argument("revision", help="target revision, e.g. base or -1")
    down.set_defaults(func=_downgrade)


def _upgrade(args: argparse.Namespace) -> int:
    settings = get_settings()
    db.upgrade(settings.database_url, args.revision)
    print(f"database at {db.head_revision() if args.revision == 'head' else args.revision}")
    return 0


def _downgrade(args: argparse.Namespace) -> int:
    settings = get_settings()
    db.downgrade(settings.database_url, args.revision)
    print(f"database downgraded to {args.revision}")
    return 0
