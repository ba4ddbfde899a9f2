"""Databases built once per test process and copied for every test that asks again.

A test still gets its own database: a copy of the first one built for the same ``key``
(same backend, same recipe). Copies are exact: a SQLite file is copied byte for byte, a
PostgreSQL database is created with ``CREATE DATABASE ... TEMPLATE`` from a snapshot.
Migrating (about a second) and preparing a live study (import, fit, fixed question order:
several seconds) then run once per recipe instead of once per test.

Example::

    info = built_database(("migrated", "sqlite"), url, upgrade)
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

T = TypeVar("T")

_snapshots: dict[Hashable, tuple[str, Any]] = {}
"""``key -> (snapshot URL, what the build returned)``."""
_folder: Path | None = None


def backend_of(url: str) -> str:
    """``sqlite`` or ``postgresql``."""
    return make_url(url).get_backend_name()


def built_database(key: Hashable, url: str, build: Callable[[str], T]) -> T:
    """Make the database at ``url`` as ``build(url)`` would, building only once per ``key``.

    ``build`` must close every connection it opened (dispose its engines) before it
    returns, and its result must not depend on anything but ``key``. ``url`` is a fresh
    database (a SQLite path that may not exist yet, or an empty PostgreSQL database).

    Returns:
        What ``build`` returned the first time for ``key``.
    """
    if key in _snapshots:
        snapshot, result = _snapshots[key]
        _copy(snapshot, url)
        return result  # type: ignore[no-any-return]
    result = build(url)
    snapshot = _snapshot_url(url)
    _copy(url, snapshot)
    _snapshots[key] = (snapshot, result)
    return result


def _snapshot_url(like: str) -> str:
    global _folder
    parsed = make_url(like)
    name = f"priorly_t_{secrets.token_hex(6)}"
    if parsed.get_backend_name() == "sqlite":
        if _folder is None:
            _folder = Path(tempfile.mkdtemp(prefix="priorly-db-templates-"))
            atexit.register(shutil.rmtree, _folder, True)
        return f"sqlite:///{_folder / (name + '.db')}"
    atexit.register(admin_execute, parsed, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return parsed.set(database=name).render_as_string(hide_password=False)


def admin_execute(url: URL, *statements: str) -> None:
    """Run ``statements`` (CREATE / DROP DATABASE) in autocommit on the server of ``url``,
    connected to its base database (``$PRIORLY_TEST_POSTGRES_URL``'s, else ``postgres``)."""
    base = os.environ.get("PRIORLY_TEST_POSTGRES_URL")
    database = make_url(base).database if base else "postgres"
    admin = create_engine(
        url.set(database=database), isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    try:
        with admin.connect() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        admin.dispose()


def _copy(source: str, target: str) -> None:
    src, dst = make_url(source), make_url(target)
    if src.get_backend_name() == "sqlite":
        assert src.database and dst.database
        for suffix in ("", "-wal"):
            if os.path.exists(src.database + suffix):
                shutil.copyfile(src.database + suffix, dst.database + suffix)
        return
    admin_execute(
        dst,
        f'DROP DATABASE IF EXISTS "{dst.database}" WITH (FORCE)',
        f'CREATE DATABASE "{dst.database}" TEMPLATE "{src.database}"',
    )
