"""Fixtures of the app tests: a migrated database, settings, accounts, imported studies.

Every test gets its own SQLite file (and queue file) under ``tmp_path``; the PostgreSQL
variants use a fresh database per test (``db_url`` of tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.auth import create_account
from app.settings import Settings
from app.tables import Researcher, Study
from tests.support.admin import PASSWORD


@pytest.fixture
def settings(migrated_db_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=migrated_db_url,
        env="test",
        secret_key="t" * 40,  # type: ignore[arg-type]
        queue_path=tmp_path / "queue.db",
        job_stale_after_s=30.0,
    )


@pytest.fixture
def db(engine: Engine) -> Iterator[Session]:
    with Session(engine) as session:
        yield session


@pytest.fixture
def make_researcher(db: Session) -> Callable[..., Researcher]:
    def make(email: str, is_admin: bool = False) -> Researcher:
        return create_account(email, PASSWORD, session=db, is_admin=is_admin)

    return make


@pytest.fixture
def alice(make_researcher: Callable[..., Researcher]) -> Researcher:
    return make_researcher("alice@example.org")


@pytest.fixture
def bob(make_researcher: Callable[..., Researcher]) -> Researcher:
    return make_researcher("bob@example.org")


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    from app.main import create_app

    with TestClient(create_app(settings), base_url="http://localhost") as c:
        yield c


@pytest.fixture
def ces_study(db: Session, alice: Researcher, small_dataset_factory: Callable[..., Path]) -> Study:
    """A 400-respondent CES study owned by alice, targets = the first run's eval items."""
    from app.services.designer import set_roles
    from app.services.importer import import_dataset

    folder = small_dataset_factory("ces", 400)
    result = import_dataset(folder, session=db, study_name="CES small")
    study = db.get(Study, result.study_id)
    assert study is not None
    study.owner_id = alice.id
    db.add(study)
    db.commit()
    targets = study.benchmark_runs[0]["eval_qids"]
    set_roles(study, dict.fromkeys(targets, "target"), session=db)
    db.refresh(study)
    return study
