"""``priorly password --email E``: set a researcher's admin-UI password (argon2).

How the first admin gets in: ``priorly user create --email E --admin``, then
``priorly password --email E`` (the password is read from the terminal without echo, or
from standard input when it is not a terminal, e.g. ``echo "$PW" | priorly password ...``).
Later accounts are created in the admin UI (by an admin, or through an invitation).
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from sqlmodel import Session

from app import db
from app.errors import InvalidInputError
from app.services.apikeys import get_researcher_by_email
from app.settings import get_settings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "password",
        help="set a researcher's password for the admin UI",
        description=(
            "Set (or change) the admin-UI password of an existing researcher. The password "
            "is read from the terminal, or from stdin when piped; sessions logged in with "
            "the old password end."
        ),
    )
    parser.add_argument("--email", required=True, help="the researcher's email")
    parser.set_defaults(func=_password)


def _read_password() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("new password: ")
        if first != getpass.getpass("repeat it: "):
            raise InvalidInputError("the two passwords differ")
        return first
    return sys.stdin.readline().rstrip("\r\n")


def _password(args: argparse.Namespace) -> int:
    from app.auth import set_password  # loads the web stack (fastapi): --help stays fast

    engine = db.make_engine(get_settings().database_url)
    try:
        with Session(engine) as session:
            researcher = get_researcher_by_email(args.email, session=session)
            set_password(researcher, _read_password(), session=session)
            print(f"password set for {researcher.email}")
    finally:
        engine.dispose()
    return 0
