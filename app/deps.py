"""FastAPI dependencies and their ``Annotated`` aliases (``SessionDep``, ``SettingsDep``),
:data:`DbId`, the type of a row's id in a path, and :func:`form_str`, one field of a
submitted form.

Dependencies that only read ``request.app.state`` are ``async def``: FastAPI runs a plain
``def`` dependency in the thread pool, and that hop (a queue put, a thread wake-up, a GIL
hand-off) cost more than the attribute read on every request (measured on the answer
call under load, docs/respondents.md)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from jinja2_fragments.fastapi import Jinja2Blocks
from pydantic import BeforeValidator
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.errors import InvalidInputError
from app.settings import Settings


def form_str(form: Any, name: str, default: str = "") -> str:
    """The text field ``name`` of a submitted form (starlette's ``FormData``); ``default``
    when it is missing or a file.

    A field sent more than once is refused: a browser sends a text field, a radio group or
    a select once, and taking the last of several (what ``form.get`` does) would store a
    value the page never showed together with the others.

    Example: ``option=A&option=B`` read as ``option`` raises ``InvalidInputError("option:
    sent 2 times; a form sends it once")``.
    """
    values = form.getlist(name)
    if len(values) > 1:
        raise InvalidInputError(f"{name}: sent {len(values)} times; a form sends it once")
    value = values[0] if values else default
    return value if isinstance(value, str) else default


async def get_engine(request: Request) -> Engine:
    """The engine created by the app's lifespan."""
    return request.app.state.engine  # type: ignore[no-any-return]


async def get_app_settings(request: Request) -> Settings:
    """The settings the app was created with (not necessarily the process-wide ones)."""
    return request.app.state.settings  # type: ignore[no-any-return]


async def get_templates(request: Request) -> Jinja2Blocks:
    return request.app.state.templates  # type: ignore[no-any-return]


def get_session(engine: Annotated[Engine, Depends(get_engine)]) -> Iterator[Session]:
    """One database session per request, closed afterwards."""
    with Session(engine) as session:
        yield session


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
TemplatesDep = Annotated[Jinja2Blocks, Depends(get_templates)]

MAX_DB_ID = 2**31 - 1
"""The largest id a row can have: id columns are 32-bit integers (PostgreSQL ``integer``)."""


PLAIN_NUMBER = re.compile(r"0|[1-9][0-9]*")
"""A whole number as a path or query parameter writes it: digits, no leading zero."""


def plain_number(value: object) -> object:
    """Refuse a number in a path or query that ``int`` would take but that is written
    otherwise than in plain digits: ``"3 "``, ``"+3"``, ``"03"``, ``"3.0"``, ``"3_0"`` (read
    as 30). A value that is not text is left to the type's own check.

    >>> plain_number("30")
    '30'
    """
    if isinstance(value, str) and not PLAIN_NUMBER.fullmatch(value):
        raise ValueError(
            "write a whole number in plain digits (no sign, spaces, leading zero, dot or _)"
        )
    return value


DbId = Annotated[
    int,
    BeforeValidator(plain_number),
    Path(ge=1, le=MAX_DB_ID, description="a row's id, 1 to 2^31 - 1"),
]
"""A row's id (or a group round's number) in a path: outside 1 to 2^31 - 1, or with
spaces around it, the request is answered 422 (``loc: ["path", name]``, the reason in
``msg``) before any query runs."""
