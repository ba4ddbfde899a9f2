"""Shared pytest fixtures: paths of the shipped datasets, small dataset copies, databases.

Fixtures here are used by several packages' tests; keep them cheap and free of state
shared between tests (every fixture that writes does so under ``tmp_path``).

Helpers that test modules import live in the package :mod:`tests.support`
(``from tests.support.data import DATASETS_DIR, write_small_dataset``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.db_templates import backend_of, built_database
from tests.support.live_study import fresh_database_url

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


@pytest.fixture(scope="session")
def datasets_dir() -> Path:
    """The folder of the datasets shipped with the project."""
    return DATASETS_DIR


@pytest.fixture
def small_dataset_factory(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``make(name="ces", n_respondents=30, folder="small")`` -> a fresh copy."""

    def make(name: str = "ces", n_respondents: int = 30, folder: str | None = None) -> Path:
        return write_small_dataset(
            DATASETS_DIR / name, tmp_path / (folder or f"{name}_{n_respondents}"), n_respondents
        )

    return make


@pytest.fixture
def small_dataset(small_dataset_factory: Callable[..., Path]) -> Path:
    """A 30-respondent copy of the CES dataset in a temporary folder (safe to corrupt)."""
    return small_dataset_factory("ces", 30)


# ---------------------------------------------------------------------------------------
# databases: a fresh SQLite file always, a fresh PostgreSQL database when
# PRIORLY_TEST_POSTGRES_URL is set (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test).
# Every test gets its own database; nothing is shared between tests.

BACKENDS = ("sqlite", "postgresql")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a fresh (empty, not migrated) SQLite file."""
    return f"sqlite:///{tmp_path / 'priorly-test.db'}"


@pytest.fixture
def postgres_url(tmp_path: Path) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database (skipped without PRIORLY_TEST_POSTGRES_URL)."""
    yield from fresh_database_url("postgresql", tmp_path)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database on each backend (the PostgreSQL case skips without a server)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'priorly-test.db'}"
    else:
        yield from fresh_database_url("postgresql", tmp_path)


@pytest.fixture
def migrated_db_url(db_url: str) -> str:
    """``db_url`` migrated to the newest schema."""
    from app.db import upgrade

    built_database(("migrated", backend_of(db_url)), db_url, upgrade)
    return db_url


@pytest.fixture
def engine(migrated_db_url: str) -> Iterator[Engine]:
    """An engine (project settings: WAL, foreign keys, ...) on a migrated fresh database."""
    from app.db import make_engine

    eng = make_engine(migrated_db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def migrated_sqlite_url(sqlite_url: str) -> str:
    """A fresh SQLite file migrated to the newest schema (for tests that need one backend)."""
    from app.db import upgrade

    built_database(("migrated", "sqlite"), sqlite_url, upgrade)
    return sqlite_url
