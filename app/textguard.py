"""A last guard before the database: no statement is sent with a text value that no text
column can store (U+0000, refused by PostgreSQL; a lone surrogate, not encodable as UTF-8).

The web app refuses such characters at the door (:class:`app.middleware.HostileInputMiddleware`,
which says where: the path, a query parameter, a form field, a JSON path). Values that come
another way (the files of a dataset upload, ``priorly import``) are caught here instead:
:func:`install_text_guard` listens to ``before_cursor_execute`` of every SQLAlchemy engine
and raises :class:`app.errors.InvalidInputError` naming the column's parameter, before the
driver sees the statement (PostgreSQL would raise ``DataError``, a 500).

Statements sent on raw DB-API connections (the API's answer path, the rate limiter) carry
only values that passed the middleware or are hashes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from app.errors import InvalidInputError

BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
"""Characters no text column can store: U+0000 (PostgreSQL refuses it in text) and the
lone surrogates U+D800-U+DFFF (not encodable as UTF-8)."""

MAX_MESSAGE_CHARS = 200


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters (an error message never echoes a huge input).

    >>> clip("x" * 5, 3)
    'xxx… (5 characters)'
    """
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def bad_character(value: str) -> str | None:
    """A description of the first character of ``value`` no database can store, or None.

    >>> bad_character("a\\x00b")
    'a NUL character (U+0000) at position 1'
    """
    if value.isascii():  # the common case: one memchr-speed scan for NUL
        at = value.find("\x00")
        return None if at < 0 else f"a NUL character (U+0000) at position {at}"
    found = BAD_TEXT.search(value)
    if found is None:
        return None
    char = found.group()
    what = "a NUL character" if char == "\x00" else "a lone surrogate"
    return f"{what} (U+{ord(char):04X}) at position {found.start()}"


NAME_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200b\u2060\ufeff]")
"""Characters refused in one-line names and ids (a study or API key name, an item key,
an external id): control characters (C0, DEL, C1: a terminal or a CSV row would act on
them), the bidirectional embeddings, overrides and isolates U+202A-U+202E,
U+2066-U+2069 (they make a name display as another), and the invisible zero-width space
U+200B, word joiner U+2060 and byte order mark U+FEFF (``"a\u200bb"`` displays as
``"ab"``; the zero-width joiners U+200C/U+200D, part of emoji and of some scripts, stay)."""


def unsafe_in_name(value: str) -> str | None:
    """A description of the first character of ``value`` that a one-line name may not
    hold (:data:`NAME_UNSAFE`), or None.

    >>> unsafe_in_name("evil\u202egnp.exe")
    'a bidirectional control character (U+202E) at position 4'
    >>> unsafe_in_name("a\x1b[2J")
    'a control character (U+001B) at position 1'
    >>> unsafe_in_name("\u200b")
    'an invisible character (U+200B) at position 0'
    """
    found = NAME_UNSAFE.search(value)
    if found is None:
        return None
    char = found.group()
    if char in "\u200b\u2060\ufeff":
        what = "an invisible character"
    elif char >= "\u202a":
        what = "a bidirectional control character"
    else:
        what = "a control character"
    return f"{what} (U+{ord(char):04X}) at position {found.start()}"


_installed = False


def _describe(name: object, value: str) -> str:
    problem = bad_character(value)
    column = str(name).rsplit("_", 1)[0] if str(name)[-1:].isdigit() else str(name)
    return (
        f"the value for {column!r} ({clip(value, 60)!r}) contains {problem}: "
        "remove it from the input"
    )


def check_parameters(parameters: Any, names: Sequence[str] | None = None) -> None:
    """Raise :class:`InvalidInputError` if a text parameter holds a character no text
    column can store. ``parameters``: one row (a mapping or a sequence) or a list of rows
    (``executemany``); ``names``: the names of positional parameters, if known."""
    rows = parameters if isinstance(parameters, list) else [parameters]
    for row in rows:
        if isinstance(row, Mapping):
            items: Any = row.items()
        elif isinstance(row, Sequence) and not isinstance(row, str | bytes):
            items = (
                (names[i] if names and i < len(names) else f"parameter {i + 1}", v)
                for i, v in enumerate(row)
            )
        else:
            continue
        for name, value in items:
            if isinstance(value, str) and bad_character(value) is not None:
                raise InvalidInputError(_describe(name, value))


def _before_cursor_execute(
    conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
) -> None:
    if not parameters:
        return
    compiled = getattr(context, "compiled", None)
    names = getattr(compiled, "positiontup", None) if compiled is not None else None
    check_parameters(parameters, names)


def install_text_guard() -> None:
    """Listen on every engine of the process (idempotent)."""
    global _installed
    if not _installed:
        event.listen(Engine, "before_cursor_execute", _before_cursor_execute)
        _installed = True
