"""Database engines, sessions and migrations.

The engine is created in the app's lifespan (never at import). SQLite connections use WAL
journaling (readers do not block the writer), enforce foreign keys and wait for a busy
lock instead of failing at once; PostgreSQL is reached through psycopg 3.

The schema is owned by Alembic (``migrations/``): :func:`upgrade` / :func:`downgrade` run
the migration chain; the app never calls ``create_all`` on a real database.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DisconnectionError, SQLAlchemyError
from sqlmodel import Session, create_engine

from app.errors import ConfigurationError, DatabaseError
from app.settings import get_settings

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 10_000
PING_AFTER_IDLE_S = 2.0
"""A pooled PostgreSQL connection idle for longer than this is pinged before use."""


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    # FULL: with WAL, a commit (an acknowledged answer) is fsynced before it returns, so it
    # survives an OS crash or power cut, not only a killed process (NORMAL would not).
    cur.execute("PRAGMA synchronous=FULL")
    cur.close()


def _install_idle_ping(engine: Engine, idle_s: float) -> None:
    """Ping a pooled connection on checkout only when it sat idle for ``idle_s`` seconds.

    SQLAlchemy's ``pool_pre_ping`` pings on *every* checkout: one more round trip per
    request, which was a sixth of the answer call's wall time. Under load a connection
    is back in use within milliseconds and cannot have been cut by a server restart
    unnoticed for long; after a pause it is checked. A dead connection raises
    :class:`DisconnectionError`, on which the pool discards it and connects anew (up to
    three times), so a restarted server still does not surface as an error on the first
    request after a pause.
    """

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info["priorly_checked_in"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("priorly_checked_in")
        if since is None or time.monotonic() - since < idle_s:
            return
        try:
            cur = dbapi_conn.cursor()
            cur.execute("SELECT 1")
            cur.close()
            dbapi_conn.rollback()
        except Exception as exc:  # any failure means the connection is unusable
            raise DisconnectionError(f"stale pooled connection: {exc}") from exc


def require_driver(url: str) -> None:
    """:class:`ConfigurationError` (one line, how to install it) when ``url`` is a
    PostgreSQL URL and the ``postgres`` extra (psycopg) is not installed."""
    if not url.startswith("postgresql"):
        return
    try:
        import psycopg  # noqa: F401  (optional: only PostgreSQL deployments install it)
    except ImportError:
        raise ConfigurationError(
            "the database URL is PostgreSQL but its driver is not installed: "
            "pip install 'priorly[postgres]'"
        ) from None


def make_engine(url: str, *, ping_after_idle_s: float = PING_AFTER_IDLE_S, **kwargs: Any) -> Engine:
    """An engine for ``url`` with the project's connection settings.

    SQLite: WAL, ``foreign_keys=ON``, a busy timeout, and connections usable from the
    threads of the web server. PostgreSQL: a pool of ``Settings.db_pool_size`` (+
    ``db_max_overflow``) connections unless ``kwargs`` give ``pool_size`` /
    ``max_overflow``, pinged on checkout only after ``ping_after_idle_s`` of idleness
    (:func:`_install_idle_ping`), so a restarted server does not surface as an error on
    the first request. A web process runs a bounded number of session writes and a few
    short authorization reads at once, each holding a connection for milliseconds, so a
    small pool suffices.
    """
    require_driver(url)
    sa_url = make_url(url)
    if sa_url.get_backend_name() == "sqlite":
        if sa_url.database and sa_url.database != ":memory:":
            Path(sa_url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if "pool_size" not in kwargs or "max_overflow" not in kwargs:
        settings = get_settings()
        kwargs.setdefault("pool_size", settings.db_pool_size)
        kwargs.setdefault("max_overflow", settings.db_max_overflow)
    engine = create_engine(url, **kwargs)
    _install_idle_ping(engine, ping_after_idle_s)
    return engine


def session_scope(engine: Engine) -> Iterator[Session]:
    """Yield one session (the FastAPI dependency wraps this); closed afterwards."""
    with Session(engine) as session:
        yield session


# ----- migrations ------------------------------------------------------------------------


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` that does not depend on the working directory."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["database_url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision``."""
    require_driver(url)
    try:
        command.upgrade(alembic_config(url), revision)
    except CommandError as exc:
        raise DatabaseError(f"cannot migrate the database: {exc}") from None
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot migrate the database: {_short(exc)}") from exc


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``base`` drops everything)."""
    try:
        command.downgrade(alembic_config(url), revision)
    except CommandError as exc:
        raise DatabaseError(f"cannot migrate the database: {exc}") from None
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot migrate the database: {_short(exc)}") from exc


def head_revision() -> str | None:
    """The newest revision of the migration chain."""
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (``None`` when it was never migrated)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check_database(engine: Engine, head: str | None) -> str:
    """``"ok"`` when the database answers and is at ``head``, else a short reason."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            rev = MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as exc:
        return f"unreachable: {_short(exc)}"
    if rev != head:
        return (
            f"not migrated (at {rev or 'nothing'}, code expects {head}; run 'priorly db upgrade')"
        )
    return "ok"


def _short(exc: BaseException) -> str:
    """First line of a driver error, without SQLAlchemy's background link."""
    orig = getattr(exc, "orig", None)
    text_ = str(orig if orig is not None else exc).strip()
    return text_.splitlines()[0] if text_ else type(exc).__name__
