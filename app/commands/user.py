"""``priorly user create --email E [--admin]``: create a researcher account."""

from __future__ import annotations

import argparse
from typing import Any

from sqlmodel import Session

from app import db
from app.services.apikeys import create_researcher
from app.settings import get_settings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "user",
        help="manage researcher accounts",
        description="Manage researcher accounts (owners of studies and API keys).",
    )
    sub = parser.add_subparsers(dest="user_command", metavar="ACTION", required=True)
    create = sub.add_parser("create", help="create a researcher account")
    create.add_argument("--email", required=True, help="the researcher's email (unique)")
    create.add_argument("--admin", action="store_true", help="an administrator (sees every study)")
    create.set_defaults(func=_create)


def _create(args: argparse.Namespace) -> int:
    engine = db.make_engine(get_settings().database_url)
    try:
        with Session(engine) as session:
            researcher = create_researcher(args.email, session=session, is_admin=args.admin)
            role = "admin" if researcher.is_admin else "researcher"
            print(f"created {role} {researcher.email} (id {researcher.id})")
    finally:
        engine.dispose()
    return 0
