"""Fixtures of the reliability tests (issue 8, items 3 and 4).

``served``: one published CES study (its first 120 respondents, a 4-class model) on a
fresh PostgreSQL database and on a fresh SQLite file, served by a real uvicorn with two
worker processes. Session-scoped per backend so the concurrency and the crash tests share
one study preparation and one server start (each test makes its own 20 sessions and
checks only those); the crash test leaves the server restarted and running.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app import session as svc
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import LiveStudy, fresh_database_url, make_live_study
from tests.support.rel_harness import MAX_QUESTIONS, UvicornServer


@pytest.fixture(scope="session", params=["postgresql", "sqlite"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveStudy, UvicornServer]]:
    """``(study, running server)`` on a fresh database of each backend."""
    folder = tmp_path_factory.mktemp(f"reliability-{request.param}")
    for url in fresh_database_url(request.param, folder):
        svc.clear_runtime_cache()
        live = make_live_study(
            url,
            write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 120),
            settings={"budgets": {"max_questions": MAX_QUESTIONS}},
        )
        server = UvicornServer(url, folder / "uvicorn.log", workers=2)
        try:
            server.start()
            yield live, server
        finally:
            server.stop()
            live.engine.dispose()
