"""Engine settings and schema rules on a real database: SQLite in WAL mode with foreign
keys enforced, cascades, CHECK constraints and unique constraints on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from app.db import make_engine
from app.services.importer import import_dataset
from app.tables import Answer, ElicitationSession, Item, Respondent, Study


def test_sqlite_pragmas(migrated_sqlite_url: str) -> None:
    eng = make_engine(migrated_sqlite_url)
    try:
        with eng.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
    finally:
        eng.dispose()


def test_postgres_driver(postgres_url: str) -> None:
    eng = make_engine(postgres_url)
    try:
        assert eng.dialect.name == "postgresql" and eng.dialect.driver == "psycopg"
    finally:
        eng.dispose()


def _study_with_session(s: Session) -> tuple[Study, Item, ElicitationSession]:
    study = Study(slug="s", name="S")
    s.add(study)
    s.flush()
    assert study.id is not None
    item = Item(study_id=study.id, key="q1", question="Q?", options=[["A", "a"]], role="question")
    person = Respondent(study_id=study.id, external_id="r1")
    s.add_all([item, person])
    s.flush()
    assert person.id is not None
    sess = ElicitationSession(study_id=study.id, respondent_id=person.id, token_hash="h")
    s.add(sess)
    s.flush()
    return study, item, sess


def test_cascade_and_constraints(engine: Engine) -> None:
    with Session(engine) as s:
        study, item, sess = _study_with_session(s)
        assert sess.id is not None and item.id is not None
        s.add(Answer(session_id=sess.id, item_id=item.id, option="A", idempotency_key="k1"))
        s.commit()
        study_id, item_id, sess_id = study.id, item.id, sess.id

    with Session(engine) as s, pytest.raises(IntegrityError):  # one answer per session and item
        s.add(Answer(session_id=sess_id, item_id=item_id, option="A"))
        s.commit()
    with Session(engine) as s, pytest.raises(IntegrityError):  # unknown status
        s.add(Study(slug="t", name="T", status="archived"))
        s.commit()
    with Session(engine) as s, pytest.raises(IntegrityError):  # dangling foreign key
        s.add(Item(study_id=9999, key="x", question="x", options=[], role="question"))
        s.commit()

    with Session(engine) as s:  # deleting the study deletes everything under it
        s.exec(text("DELETE FROM study WHERE id = :i").bindparams(i=study_id))  # type: ignore[call-overload]
        s.commit()
        for table in (Item, Respondent, ElicitationSession, Answer):
            assert s.exec(select(func.count()).select_from(table)).one() == 0


def test_delete_imported_study_cascades(engine: Engine, small_dataset: Path) -> None:
    with Session(engine) as s:
        import_dataset(small_dataset, session=s)
    with Session(engine) as s:
        study = s.exec(select(Study)).one()
        s.delete(study)
        s.commit()
        assert s.exec(select(func.count()).select_from(Respondent)).one() == 0
        assert s.exec(select(func.count()).select_from(Item)).one() == 0


def test_iso_utc_has_one_shape() -> None:
    """Every time is written with microseconds and the UTC offset, a whole second too."""
    from datetime import datetime, timedelta, timezone

    from app.tables import iso_utc

    assert iso_utc(datetime(2026, 12, 4, 18, 55, 27)) == "2026-12-04T18:55:27.000000+00:00"
    east = datetime(2026, 12, 4, 20, 55, 27, 5, tzinfo=timezone(timedelta(hours=2)))
    assert iso_utc(east) == "2026-12-04T18:55:27.000005+00:00"
    assert iso_utc(None) is None
