"""A live, published study on a fresh database, for the API, respondent and e2e tests.

Real parts only: a real SQLite file or PostgreSQL database migrated by Alembic, the real
CES data (its first ``n_respondents`` respondents), a latent class model fitted on them
(few classes, so the fit takes well under a second), the app served by TestClient (or by
uvicorn in the browser test).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app import session as svc
from app.db import make_engine, upgrade
from app.services.apikeys import create_api_key, create_researcher
from app.services.belief import fit_study_model
from app.services.demo import prepare_study_for_fielding
from app.services.importer import import_dataset
from app.session import decide as session_decide
from app.session import locked as session_locked
from app.tables import Answer, ElicitationSession, Item, Respondent, Study
from tests.support.db_templates import admin_execute, backend_of, built_database


@dataclass
class LiveStudy:
    """Handles of a prepared study.

    Attributes:
        url: the database URL; engine: an engine on it.
        slug, study_id: the published study.
        owner_key: API key of the study's owner; other_key: a key of another researcher;
        admin_key: a key of an admin.
    """

    url: str
    engine: Engine
    slug: str
    study_id: int
    owner_key: str
    other_key: str
    admin_key: str

    def session(self) -> Session:
        return Session(self.engine)


def make_live_study(
    db_url: str,
    dataset_dir: Path,
    *,
    n_classes: tuple[int, ...] = (4,),
    settings: dict[str, Any] | None = None,
) -> LiveStudy:
    """Migrate ``db_url``, import ``dataset_dir``, fit a small model, publish; make keys.

    Built once per test process for the same backend, dataset files, ``n_classes`` and
    ``settings``, and copied for every later call (:mod:`tests.support.db_templates`).
    """
    key = (
        "live",
        backend_of(db_url),
        _digest(dataset_dir),
        tuple(n_classes),
        json.dumps(settings or {}, sort_keys=True, default=str),
    )
    made = built_database(
        key, db_url, lambda url: _build_live_study(url, dataset_dir, n_classes, settings)
    )
    return LiveStudy(url=db_url, engine=make_engine(db_url), **made)


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _build_live_study(
    db_url: str,
    dataset_dir: Path,
    n_classes: tuple[int, ...],
    settings: dict[str, Any] | None,
) -> dict[str, Any]:
    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with Session(engine) as db:
            result = import_dataset(dataset_dir, session=db)
            owner = create_researcher("owner@example.org", session=db)
            create_researcher("other@example.org", session=db)
            create_researcher("admin@example.org", session=db, is_admin=True)
            study = db.exec(select(Study).where(Study.id == result.study_id)).one()
            study.owner_id = owner.id
            if settings:
                study.settings = {**study.settings, **settings}
            db.add(study)
            db.commit()
            fit_study_model(study, session=db, n_classes=n_classes, n_restarts=1)
            prepare_study_for_fielding(study, session=db)
            return {
                "slug": result.slug,
                "study_id": result.study_id,
                "owner_key": create_api_key("owner@example.org", session=db).key,
                "other_key": create_api_key("other@example.org", session=db).key,
                "admin_key": create_api_key("admin@example.org", session=db).key,
            }
    finally:
        engine.dispose()


POSTGRES_ENV = "PRIORLY_TEST_POSTGRES_URL"


def fresh_database_url(backend: str, folder: Path) -> Iterator[str]:
    """A fresh empty database: a SQLite file in ``folder``, or a new PostgreSQL database on
    the server of ``$PRIORLY_TEST_POSTGRES_URL`` (skipped without it), dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{folder / 'priorly-live.db'}"
        return
    import pytest
    from sqlalchemy.engine import make_url

    from app.settings import normalise_database_url

    base = os.environ.get(POSTGRES_ENV)
    if not base:
        pytest.skip(f"{POSTGRES_ENV} is not set")
    base_url = make_url(normalise_database_url(base))
    name = f"priorly_l_{secrets.token_hex(6)}"
    admin_execute(base_url, f'CREATE DATABASE "{name}"')
    try:
        yield base_url.set(database=name).render_as_string(hide_password=False)
    finally:
        admin_execute(base_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def app_client(db_url: str) -> Any:
    """A TestClient on the app for ``db_url`` (use as a context manager)."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings

    return TestClient(create_app(load_settings(database_url=db_url, env="dev")))


def login_researcher(client: Any, email: str, password: str) -> None:
    """Log ``client`` (a TestClient) in through the admin login form, with the CSRF token
    the login page set."""
    page = client.get("/admin/login")
    assert page.status_code == 200
    r = client.post(
        "/admin/login",
        data={
            "email": email,
            "password": password,
            "csrf_token": client.cookies.get("priorly_csrf"),
        },
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text


def admin_study_page(db_url: str, slug: str, email: str, password: str) -> str:
    """The admin study page of ``slug`` as the researcher ``email`` sees it (real login
    form, real session cookie); asserts it answers 200."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings

    settings = load_settings(database_url=db_url, env="dev")
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        login_researcher(client, email, password)
        page = client.get(f"/admin/studies/{slug}")
    assert page.status_code == 200, page.text
    return str(page.text)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for a server subprocess)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(
    base: str,
    proc: subprocess.Popen[bytes],
    what: str,
    *,
    log: Path | None = None,
    timeout: float = 90.0,
    every: float = 0.2,
) -> None:
    """Poll ``GET {base}/healthz`` until it answers 200.

    Raises RuntimeError (with the server's log when given) as soon as ``proc`` exits or
    ``timeout`` seconds pass: the readiness condition, not a fixed sleep, ends the wait.
    """
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            detail = f": {log.read_text(errors='replace')}" if log is not None else ""
            raise RuntimeError(f"{what} did not start{detail}")
        time.sleep(every)


def ces_sample_study(
    backend: str, folder: Path, n_rows: int, **study_kwargs: Any
) -> Iterator[LiveStudy]:
    """A prepared study of the first ``n_rows`` CES respondents on a fresh database of
    ``backend`` (``sqlite`` or ``postgresql``): a generator for module fixtures
    (``yield from``); the runtime cache is cleared first and the engine disposed after."""
    from tests.support.data import DATASETS_DIR, write_small_dataset

    for url in fresh_database_url(backend, folder):
        svc.clear_runtime_cache()
        data = write_small_dataset(DATASETS_DIR / "ces", folder / f"ces{n_rows}", n_rows)
        study = make_live_study(url, data, **study_kwargs)
        try:
            yield study
        finally:
            study.engine.dispose()


def count_decisions(monkeypatch: Any) -> list[int]:
    """Count the selection steps run from now on (``decide_next`` calls, wherever they are
    made from; a first-decision cache or step memo hit runs none): one entry per call."""
    calls: list[int] = []
    real = session_decide.decide_next

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    for module in (session_decide, session_locked):
        monkeypatch.setattr(module, "decide_next", counted)
    return calls


@contextmanager
def study_fields(live: LiveStudy, **fields: Any) -> Iterator[None]:
    """The live study's row with ``fields`` (column values) for the ``with`` block,
    restored afterwards."""

    def write(values: dict[str, Any]) -> dict[str, Any]:
        with live.session() as db:
            study = db.get(Study, live.study_id)
            assert study is not None
            before = {k: getattr(study, k) for k in values}
            for k, v in values.items():
                setattr(study, k, v)
            db.add(study)
            db.commit()
        return before

    original = write(fields)
    try:
        yield
    finally:
        write(original)


@contextmanager
def study_settings(live: LiveStudy, **changes: Any) -> Iterator[None]:
    """The live study's settings with ``changes`` (top-level keys) for the ``with`` block,
    restored afterwards."""
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        original = dict(study.settings)
    with study_fields(live, settings={**original, **changes}):
        yield


@contextmanager
def uvicorn_server(db_url: str, log: Path, *, timeout: float = 60.0) -> Iterator[str]:
    """A real uvicorn process (``app.main:create_app``) on ``db_url`` at a free port of
    127.0.0.1, its output in ``log``; yields the base URL once ``/healthz`` answers and stops
    the process afterwards."""
    import sys

    repo_root = Path(__file__).resolve().parents[2]
    port = free_port()
    env = {**os.environ, "PRIORLY_DATABASE_URL": db_url, "PRIORLY_ENV": "dev"}
    argv = [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=repo_root, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, "uvicorn", log=log, timeout=timeout)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@contextmanager
def priorly_serve(db_url: str, folder: Path, **env_extra: str) -> Iterator[str]:
    """``priorly serve --no-demo`` (the in-process job worker included) on ``db_url`` at a
    free port, its queue and ``server.log`` in ``folder``; yields the base URL once
    ``/healthz`` answers and stops the process afterwards. ``env_extra``: more
    environment variables (e.g. ``PRIORLY_DEMO_DATASET``)."""
    import sys

    repo_root = Path(__file__).resolve().parents[2]
    port = free_port()
    env = {
        **os.environ,
        "PRIORLY_DATABASE_URL": db_url,
        "PRIORLY_ENV": "dev",
        "PRIORLY_QUEUE_PATH": str(folder / "queue.db"),
        "OMP_NUM_THREADS": "1",
        **env_extra,
    }
    argv = [sys.executable, "-m", "app.cli", "serve", "--no-demo", "--port", str(port)]
    with (folder / "server.log").open("wb") as out:
        proc = subprocess.Popen(argv, cwd=repo_root, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, "priorly serve", log=folder / "server.log")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


SessionSpec = tuple[str, float, float, float | None, list[tuple[int, str | None]], int, bool]
"""A session to write: (status, started minutes ago, last activity minutes ago, completed
minutes ago or ``None``, answers as (question index, option letter or ``None`` for a
skip), the respondent's ``earlier_starts``, ``is_preview``)."""


def add_sessions(live: LiveStudy, specs: list[SessionSpec], now: datetime) -> list[int]:
    """Write one live respondent and session per spec (:data:`SessionSpec`) with the
    given timestamps relative to ``now`` and the answers to the study's question items in
    position order; returns the sessions' ids. The rows are written directly, so the
    figures that depend on time and status are exactly what the spec says."""

    def ago(minutes: float) -> datetime:
        return now - timedelta(minutes=minutes)

    ids = []
    with live.session() as db:
        questions = db.exec(
            select(Item)
            .where(Item.study_id == live.study_id, Item.role == "question")
            .order_by(Item.position, Item.id)  # type: ignore[arg-type]
        ).all()
        for status, created, active, done, answers, earlier, preview in specs:
            resp = Respondent(
                study_id=live.study_id,
                source="live",
                earlier_starts=earlier,
                created_at=ago(created),
            )
            db.add(resp)
            db.flush()
            sess = ElicitationSession(
                study_id=live.study_id,
                respondent_id=resp.id or 0,
                token_hash=secrets.token_hex(16),
                status=status,
                created_at=ago(created),
                updated_at=ago(active),
                completed_at=ago(done) if done is not None else None,
                state_version=len(answers),
                is_preview=preview,
            )
            db.add(sess)
            db.flush()
            for q, option in answers:
                db.add(
                    Answer(
                        session_id=sess.id or 0,
                        item_id=questions[q].id or 0,
                        option=option,
                        created_at=ago(active),
                    )
                )
            ids.append(sess.id or 0)
        db.commit()
    return ids
