"""The Alembic chain: base -> head -> base -> head on SQLite and PostgreSQL, and the
migrated schema equals the tables' metadata (what ``alembic check`` verifies)."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect
from sqlalchemy.pool import NullPool
from sqlmodel import SQLModel

import app.tables  # noqa: F401  (registers the tables)
from app.db import current_revision, downgrade, head_revision, make_engine, upgrade

EXPECTED_TABLES = {
    "study",
    "item",
    "respondent",
    "elicitation_session",
    "answer",
    "selection_decision",
    "fitted_model",
    "job",
}


def _tables(url: str) -> set[str]:
    eng = create_engine(url, poolclass=NullPool)
    try:
        return set(inspect(eng).get_table_names()) - {"alembic_version"}
    finally:
        eng.dispose()


def _diff(url: str) -> list[object]:
    eng = create_engine(url, poolclass=NullPool)
    try:
        with eng.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(ctx, SQLModel.metadata))
    finally:
        eng.dispose()


def test_upgrade_downgrade_cycle(db_url: str) -> None:
    assert _tables(db_url) == set()
    upgrade(db_url)
    assert EXPECTED_TABLES <= _tables(db_url)
    assert _tables(db_url) == set(SQLModel.metadata.tables)
    assert _diff(db_url) == []  # the migration creates exactly the declared schema

    eng = make_engine(db_url)
    try:
        assert current_revision(eng) == head_revision()
    finally:
        eng.dispose()

    downgrade(db_url, "base")
    assert _tables(db_url) == set()
    upgrade(db_url)  # and it can be rebuilt from nothing
    assert _diff(db_url) == []


def test_every_foreign_key_is_indexed(migrated_db_url: str) -> None:
    """Each foreign-key column leads some index (its own or a composite unique one)."""
    eng = create_engine(migrated_db_url, poolclass=NullPool)
    try:
        insp = inspect(eng)
        for table in insp.get_table_names():
            leading = {tuple(ix["column_names"][:1]) for ix in insp.get_indexes(table)}
            leading |= {tuple(u["column_names"][:1]) for u in insp.get_unique_constraints(table)}
            for fk in insp.get_foreign_keys(table):
                col = tuple(fk["constrained_columns"][:1])
                assert col in leading, f"{table}.{col[0]} has no index"
    finally:
        eng.dispose()
