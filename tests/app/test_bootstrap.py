"""``priorly serve``'s preparation: migrate, import the demo study only into an empty
database, never twice; in a real process, answer at once while the demo's model is fitted
in the job queue; a busy port is one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from sqlmodel import Session, select

from app.db import head_revision, make_engine
from app.services.bootstrap import bootstrap_database
from app.settings import Settings
from app.tables import Respondent, Study
from tests.support.data import REPO_ROOT
from tests.support.live_study import free_port, wait_healthy


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


# ----- ``priorly serve`` in a real process ---------------------------------------------------


def _serve(folder: Path, port: int, *extra: str, demo: Path | None = None) -> Any:
    """``python -m app.cli serve --port PORT`` on ``folder``'s SQLite file and queue."""
    env = {
        **os.environ,
        "PRIORLY_DATABASE_URL": f"sqlite:///{folder / 'serve.db'}",
        "PRIORLY_ENV": "dev",
        "PRIORLY_QUEUE_PATH": str(folder / "queue.db"),
        "OMP_NUM_THREADS": "1",
    }
    if demo is not None:
        env["PRIORLY_DEMO_DATASET"] = str(demo)
    log = (folder / f"serve-{port}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port), *extra],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _stop(proc: Any) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def test_serve_answers_at_once_and_fits_the_demo_in_the_job_queue(
    tmp_path: Path, small_dataset_factory: Callable[..., Path]
) -> None:
    """An empty database: ``/healthz`` and the home page answer within seconds of the
    start, the demo survey says "preparing" while its fit job waits (no worker), and after
    a restart with the in-process worker the job runs and the survey starts; ``/healthz``
    counts that worker, and none before."""
    demo = small_dataset_factory("ces", 120)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    proc = _serve(tmp_path, port, "--no-worker", demo=demo)
    try:
        wait_healthy(base, proc, "priorly serve", log=tmp_path / f"serve-{port}.log", timeout=60)
        ready_after = time.monotonic() - started
        home = httpx.get(f"{base}/", timeout=10)
        assert home.status_code == 200
        # the process start (Python, torch, the app) and a 120-respondent import; the
        # fit is not waited for (it would not even start: no worker)
        assert ready_after < 45, f"the server answered only after {ready_after:.1f} s"
        assert '/s/ces"' in home.text
        page = httpx.get(f"{base}/s/ces", timeout=10)
        assert page.status_code == 200
        assert "Preparing the survey" in page.text and "refreshes by itself" in page.text
        assert "I agree" not in page.text
        poll = httpx.get(f"{base}/s/ces", headers={"HX-Request": "true", "HX-Trigger": "preparing"})
        assert poll.status_code == 204
        health = httpx.get(f"{base}/healthz", timeout=10)  # healthy, without any worker
        assert health.status_code == 200
        assert health.json()["workers"] == {"seen": 0, "last_seen": None, "seen_within_s": 60}
    finally:
        _stop(proc)

    log = tmp_path / f"serve-{port}.log"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _serve(tmp_path, port, demo=demo)
    try:
        wait_healthy(base, proc, "priorly serve", log=tmp_path / f"serve-{port}.log", timeout=60)
        deadline = time.monotonic() + 300
        while True:  # the page's own poll: 204 while preparing, HX-Refresh once ready
            poll = httpx.get(
                f"{base}/s/ces", headers={"HX-Request": "true", "HX-Trigger": "preparing"}
            )
            if poll.headers.get("HX-Refresh") == "true":
                break
            assert poll.status_code == 204
            assert proc.poll() is None and time.monotonic() < deadline, (
                tmp_path / f"serve-{port}.log"
            ).read_text()[-3000:]
            time.sleep(0.5)
        with httpx.Client(base_url=base, timeout=30) as client:
            consent = client.get("/s/ces")
            assert "I agree" in consent.text
            r = client.post("/s/ces/consent", data={"choice": "accept"}, follow_redirects=True)
            assert r.status_code == 200, r.text
            assert 'name="option"' in r.text or "a_" in r.text
            # the in-process worker's heartbeat, written at its start
            assert client.get("/healthz").json()["workers"]["seen"] == 1
    finally:
        _stop(proc)
    assert "fitted by job" in log.read_text()


def test_busy_port_says_use_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "PRIORLY_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}
        out = subprocess.run(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert f"port {port}" in lines[0] and "--port" in lines[0]
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "x.db").exists()  # nothing written before the port check


def test_a_survey_never_fits_while_a_respondent_waits(
    migrated_sqlite_url: str, small_dataset_factory: Callable[..., Path]
) -> None:
    """A published study without a model and without a fit job: the survey page queues the
    first fit job and says "preparing", and a consent posted anyway goes back to the start
    page; no model is fitted by either (the fit is the queued job's)."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.services.demo import open_for_fielding
    from app.services.importer import import_dataset
    from app.tables import FittedModel, Job

    eng = make_engine(migrated_sqlite_url)
    try:
        with Session(eng) as s:
            result = import_dataset(small_dataset_factory("ces", 20), session=s)
            study = s.exec(select(Study).where(Study.id == result.study_id)).one()
            open_for_fielding(study, session=s)
        settings = Settings(database_url=migrated_sqlite_url, env="dev")
        with TestClient(create_app(settings)) as client:
            page = client.get("/s/ces")
            assert page.status_code == 200 and "Preparing the survey" in page.text
            r = client.post("/s/ces/consent", data={"choice": "accept"}, follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"].endswith("/s/ces")
        with Session(eng) as s:
            assert s.exec(select(FittedModel)).all() == []
            assert [j.kind for j in s.exec(select(Job)).all()] == ["fit_model"]
            assert s.exec(select(Respondent)).all() != []  # only the imported ones
            assert all(r.source == "import" for r in s.exec(select(Respondent)).all())
    finally:
        eng.dispose()
