"""Alembic environment: the schema is ``SQLModel.metadata`` as defined in ``app.tables``.

The database URL comes from ``config.attributes["database_url"]`` (set by
``app.db.alembic_config``) or else from the settings (``PRIORLY_DATABASE_URL``). SQLite uses
batch mode (it cannot ALTER most things in place); migrations run on a plain connection
with foreign-key enforcement off (SQLite's default), so a batch table copy never cascades.
"""

from __future__ import annotations

import logging
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool
from sqlmodel import SQLModel

import app.tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from app.settings import get_settings, normalise_database_url

config = context.config
if config.config_file_name is not None and not logging.getLogger().handlers:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = SQLModel.metadata


def _url() -> str:
    url = config.attributes.get("database_url")
    if url:
        return normalise_database_url(str(url))
    return get_settings().database_url


def _options(url: str) -> dict[str, object]:
    return {
        "target_metadata": target_metadata,
        "compare_type": True,
        "compare_server_default": False,
        "render_as_batch": url.startswith("sqlite"),
    }


def run_migrations_offline() -> None:
    url = _url()
    context.configure(url=url, literal_binds=True, **_options(url))  # type: ignore[arg-type]
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = _url()
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, **_options(url))  # type: ignore[arg-type]
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
