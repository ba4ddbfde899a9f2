"""The Alembic chain: base -> head -> base -> head on SQLite and PostgreSQL, and the
migrated schema equals the tables' metadata (what ``alembic check`` verifies)."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError
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


def test_0012_keeps_the_newest_active_fit_of_a_study(db_url: str) -> None:
    """Before the one-active-fit index, a study could hold two queued fits: the migration
    cancels all but the newest (and leaves other kinds and finished jobs alone)."""
    from sqlalchemy import text

    upgrade(db_url, "0011")
    eng = create_engine(db_url, poolclass=NullPool)
    rows = [  # (kind, status): study_id NULL (a deleted study's jobs) keeps the FK out
        ("fit_model", "queued"),
        ("fit_model", "running"),
        ("fit_model", "failed"),
        ("simulation", "queued"),
        ("simulation", "queued"),
    ]
    try:
        with eng.begin() as conn:
            for kind, status in rows:
                conn.execute(
                    text(
                        "INSERT INTO job (kind, status, progress, message, payload, attempts, "
                        "created_at, cancel_requested) VALUES (:k, :s, 0, '', '{}', 0, "
                        "CURRENT_TIMESTAMP, false)"
                    ),
                    {"k": kind, "s": status},
                )
        upgrade(db_url)
        with eng.connect() as conn:
            got = conn.execute(text("SELECT kind, status FROM job ORDER BY id")).all()
    finally:
        eng.dispose()
    assert [tuple(r) for r in got] == [
        ("fit_model", "cancelled"),
        ("fit_model", "running"),
        ("fit_model", "failed"),
        ("simulation", "queued"),
        ("simulation", "queued"),
    ]


def test_0015_stores_the_code_that_sessions_completed_before_show(db_url: str) -> None:
    """The sessions completed before the column get the code they show now: the study's
    fixed code, ``''`` for the derived one; the others stay NULL. The downgrade's SQLite
    rebuild keeps ``AUTOINCREMENT`` (migration 0014)."""
    from sqlalchemy import text

    upgrade(db_url, "0014")
    eng = create_engine(db_url, poolclass=NullPool)
    sessions = [(1, 1, "completed"), (2, 1, "active"), (3, 2, "completed"), (4, 2, "abandoned")]
    try:
        with eng.begin() as conn:
            for study_id, code in ((1, "FIXED-1"), (2, None)):
                conn.execute(
                    text(
                        "INSERT INTO study (id, slug, name, status, description, consent_text, "
                        "completion_code, settings, benchmark_runs, created_at) VALUES (:id, "
                        ":slug, 'S', 'published', '', '', :code, '{}', '[]', CURRENT_TIMESTAMP)"
                    ),
                    {"id": study_id, "slug": f"s{study_id}", "code": code},
                )
                conn.execute(
                    text(
                        "INSERT INTO respondent (id, study_id, attributes, answers, source, "
                        "created_at) VALUES (:id, :id, '{}', '{}', 'live', CURRENT_TIMESTAMP)"
                    ),
                    {"id": study_id},
                )
            for sid, study_id, status in sessions:
                conn.execute(
                    text(
                        "INSERT INTO elicitation_session (id, study_id, respondent_id, "
                        "token_hash, status, state_version, created_at, updated_at) VALUES "
                        "(:id, :study, :study, :token, :status, 0, CURRENT_TIMESTAMP, "
                        "CURRENT_TIMESTAMP)"
                    ),
                    {"id": sid, "study": study_id, "token": f"t{sid}", "status": status},
                )
        upgrade(db_url)
        with eng.connect() as conn:
            rows = conn.execute(text("SELECT id, completion_code FROM elicitation_session"))
            assert dict(rows.all()) == {1: "FIXED-1", 2: None, 3: "", 4: None}
        downgrade(db_url, "0014")
        if eng.dialect.name == "sqlite":
            with eng.connect() as conn:
                sql = conn.execute(
                    text("SELECT sql FROM sqlite_master WHERE name = 'elicitation_session'")
                ).scalar_one()
            assert "AUTOINCREMENT" in sql and "completion_code" not in sql
    finally:
        eng.dispose()


def test_0016_adds_and_drops_the_worker_heartbeat_table(db_url: str) -> None:
    """0016 creates ``worker_heartbeat`` (its ``kind`` checked, ``last_seen`` indexed);
    the downgrade to 0015 drops it and nothing else."""
    upgrade(db_url, "0015")
    before = _tables(db_url)
    assert "worker_heartbeat" not in before
    upgrade(db_url)
    assert _tables(db_url) == before | {"worker_heartbeat"}
    eng = create_engine(db_url, poolclass=NullPool)
    insert = text(
        "INSERT INTO worker_heartbeat (id, kind, started_at, last_seen) "
        "VALUES (:id, :kind, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
    )
    try:
        insp = inspect(eng)
        assert {c["name"] for c in insp.get_columns("worker_heartbeat")} == {
            "id",
            "kind",
            "started_at",
            "last_seen",
        }
        assert [ix["column_names"] for ix in insp.get_indexes("worker_heartbeat")] == [
            ["last_seen"]
        ]
        with eng.begin() as conn:
            conn.execute(insert, {"id": "web1:10", "kind": "serve"})
            conn.execute(insert, {"id": "jobs1:11", "kind": "worker"})
        with pytest.raises(IntegrityError), eng.begin() as conn:
            conn.execute(insert, {"id": "x:12", "kind": "cron"})
    finally:
        eng.dispose()
    downgrade(db_url, "0015")
    assert _tables(db_url) == before
