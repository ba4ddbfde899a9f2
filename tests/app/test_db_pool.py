"""The PostgreSQL pool's ping-after-idle (``app.db._install_idle_ping``) on a real server.

A pooled connection whose server process was terminated (as by a server restart) must
not surface as an error on the next request after a pause: the checkout pings it, the
pool discards it and connects anew. Without the ping (an idle threshold never reached)
the same dead connection fails, which shows the ping is what saves the request.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from app.db import make_engine


def _kill_backend(url: str, pid: int) -> None:
    admin = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
    finally:
        admin.dispose()


def _pooled_backend_pid(engine) -> int:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_dead_pooled_connection_is_replaced_after_idle(postgres_url: str) -> None:
    engine = make_engine(postgres_url, ping_after_idle_s=0.0, pool_size=1, max_overflow=0)
    try:
        first = _pooled_backend_pid(engine)
        _kill_backend(postgres_url, first)
        second = _pooled_backend_pid(engine)  # must not raise
        assert second != first
    finally:
        engine.dispose()


def test_without_the_ping_the_dead_connection_fails(postgres_url: str) -> None:
    engine = make_engine(postgres_url, ping_after_idle_s=3600.0, pool_size=1, max_overflow=0)
    try:
        first = _pooled_backend_pid(engine)
        _kill_backend(postgres_url, first)
        with pytest.raises(DBAPIError):
            _pooled_backend_pid(engine)
        # the failure invalidated the pool: the next checkout connects anew
        assert _pooled_backend_pid(engine) != first
    finally:
        engine.dispose()
