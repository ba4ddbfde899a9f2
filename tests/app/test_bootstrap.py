"""``priorly serve``'s preparation: migrate, import the demo study only into an empty
database, never twice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlmodel import Session, select

from app.db import head_revision, make_engine
from app.services.bootstrap import bootstrap_database
from app.settings import Settings
from app.tables import Respondent, Study


def _studies(url: str) -> list[tuple[str, int]]:
    eng = make_engine(url)
    try:
        with Session(eng) as s:
            return [
                (st.slug, len(s.exec(select(Respondent).where(Respondent.study_id == st.id)).all()))
                for st in s.exec(select(Study)).all()
            ]
    finally:
        eng.dispose()


def test_demo_imported_once(sqlite_url: str, small_dataset_factory: Callable[..., Path]) -> None:
    settings = Settings(database_url=sqlite_url, demo_dataset=small_dataset_factory("ces", 20))
    first = bootstrap_database(settings)
    assert first.revision == head_revision()
    assert first.demo is not None and first.demo.slug == "ces"
    assert _studies(sqlite_url) == [("ces", 20)]
    second = bootstrap_database(settings)
    assert second.demo is None
    assert _studies(sqlite_url) == [("ces", 20)]


def test_no_demo(sqlite_url: str, small_dataset_factory: Callable[..., Path]) -> None:
    settings = Settings(database_url=sqlite_url, demo_dataset=small_dataset_factory("ces", 20))
    result = bootstrap_database(settings, import_demo=False)
    assert result.demo is None and result.revision == head_revision()
    assert _studies(sqlite_url) == []
