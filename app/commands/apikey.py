"""``priorly apikey create --email E``: create an API key (printed once), list, revoke."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app import db
from app.services.apikeys import all_api_keys, create_api_key, list_api_keys, revoke_api_key
from app.settings import get_settings
from app.tables import ApiKey
from app.textguard import unsafe_in_name


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "apikey",
        help="manage API keys of researchers",
        description="Create, list and revoke API keys for the JSON API (/api/v1).",
    )
    sub = parser.add_subparsers(dest="apikey_command", metavar="ACTION", required=True)
    create = sub.add_parser("create", help="create a key (printed once, on stdout)")
    create.add_argument("--email", required=True, help="the owning researcher's email")
    create.add_argument("--name", default="", help="a label for the key")
    create.set_defaults(func=_create)
    listing = sub.add_parser(
        "list",
        help="list keys (prefixes only): a researcher's, or every key with its researcher",
    )
    listing.add_argument("--email", help="only this researcher's keys (default: every key)")
    listing.set_defaults(func=_list)
    revoke = sub.add_parser("revoke", help="revoke a key by its prefix (pk_xxxxxxxx)")
    revoke.add_argument("prefix")
    revoke.set_defaults(func=_revoke)


def _engine() -> Engine:
    return db.make_engine(get_settings().database_url)


def _create(args: argparse.Namespace) -> int:
    engine = _engine()
    try:
        with Session(engine) as session:
            new = create_api_key(args.email, session=session, name=args.name)
    finally:
        engine.dispose()
    print(new.key)
    print(
        f"API key {new.prefix} for {new.researcher_email}: store it now, it is not shown again",
        file=sys.stderr,
    )
    return 0


def _line(key: ApiKey, email: str | None = None) -> str:
    """One key, tab-separated: prefix, state, created, last used (or -), name[, email]."""
    state = "revoked" if key.revoked_at else "active"
    used = f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "-"
    name = key.name  # a name stored before control characters were refused: escaped
    if unsafe_in_name(name):
        name = name.encode("unicode_escape").decode("ascii")
    cells = [key.prefix, state, f"{key.created_at:%Y-%m-%d %H:%M}", used, name]
    return "\t".join(cells + ([email] if email is not None else []))


def _list(args: argparse.Namespace) -> int:
    engine = _engine()
    try:
        with Session(engine) as session:
            if args.email:
                lines = [_line(k) for k in list_api_keys(args.email, session=session)]
            else:
                lines = [_line(k, email) for k, email in all_api_keys(session=session)]
    finally:
        engine.dispose()
    print("prefix\tstate\tcreated\tlast used\tname" + ("" if args.email else "\tresearcher"))
    print("\n".join(lines) if lines else "(no API keys)")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    engine = _engine()
    try:
        with Session(engine) as session:
            before = session.exec(
                select(ApiKey.revoked_at).where(ApiKey.prefix == args.prefix.strip())
            ).first()
            key = revoke_api_key(args.prefix, session=session)
            if before is not None:
                print(f"{key.prefix} was already revoked on {before:%Y-%m-%d %H:%M}")
            else:
                print(f"revoked {key.prefix}")
    finally:
        engine.dispose()
    return 0
