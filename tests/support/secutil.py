"""Helpers of the security tests: a real uvicorn server process on a free loopback port.

The server is started as ``python -m uvicorn app.main:create_app --factory`` with the
settings in its environment (``PRIORLY_*``), its output captured in a log file so tests can
read the log lines; readiness is polled on ``/healthz`` with a deadline.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.data import REPO_ROOT
from tests.support.live_study import free_port, wait_healthy

SECRET = "s" * 48


@dataclass
class LiveServer:
    base: str
    port: int
    pid: int
    log: Path

    def api_get(self, credential: str, path: str = "/api/v1/sessions/1") -> httpx.Response:
        """``GET path`` with ``Authorization: Bearer credential`` (rate-limit tests)."""
        return httpx.get(
            f"{self.base}{path}", headers={"Authorization": f"Bearer {credential}"}, timeout=60
        )

    def rss_kib(self) -> int:
        """Resident memory of the server process (KiB, from /proc)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")


@contextmanager
def live_server(
    db_url: str, log: Path, *, env_extra: dict[str, str] | None = None, log_level: str = "info"
) -> Iterator[LiveServer]:
    """Serve the app on ``db_url`` (already migrated) in a uvicorn subprocess."""

    port = free_port()
    env = {
        **os.environ,
        "PRIORLY_DATABASE_URL": db_url,
        "PRIORLY_ENV": "test",
        "PRIORLY_SECRET_KEY": SECRET,
        "OMP_NUM_THREADS": "1",
        **(env_extra or {}),
    }
    out = log.open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app.main:create_app",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            log_level,
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, "uvicorn", log=log, every=0.1)
        yield LiveServer(base=base, port=port, pid=proc.pid, log=log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        out.close()


ADMIN_EMAIL = "admin@example.org"
OWNER_EMAIL = "owner@example.org"
PASSWORD = "hostile password 123"


@contextmanager
def admin_client(server: LiveServer, email: str = ADMIN_EMAIL) -> Iterator[httpx.Client]:
    """An httpx client logged in to the admin UI of ``server`` through the real login form;
    its ``headers`` carry the CSRF token of the login session (``X-CSRF-Token``)."""
    with httpx.Client(base_url=server.base, timeout=60) as client:
        page = client.get("/admin/login")
        assert page.status_code == 200, page.text
        r = client.post(
            "/admin/login",
            data={
                "email": email,
                "password": PASSWORD,
                "csrf_token": client.cookies["priorly_csrf"],
            },
            follow_redirects=False,
        )
        assert r.status_code == 303, r.text
        client.headers["X-CSRF-Token"] = client.cookies["priorly_csrf"]
        yield client


@dataclass
class HostileWorld:
    """A live study on a fresh database served by a real uvicorn, with admin passwords."""

    backend: str
    server: LiveServer
    live: Any


@contextmanager
def hostile_world(
    backend: str, folder: Path, *, env_extra: dict[str, str] | None = None
) -> Iterator[HostileWorld]:
    """:func:`live_study.make_live_study` (30 CES respondents) on a fresh ``backend``
    database, passwords for the owner and the admin, served by uvicorn."""
    from sqlmodel import Session, select

    from app.auth import set_password
    from app.tables import Researcher
    from tests.support.data import DATASETS_DIR, write_small_dataset
    from tests.support.live_study import fresh_database_url, make_live_study

    urls = fresh_database_url(backend, folder)
    url = next(urls)
    try:
        live = make_live_study(url, write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 30))
        with Session(live.engine) as db:
            for email in (ADMIN_EMAIL, OWNER_EMAIL):
                person = db.exec(select(Researcher).where(Researcher.email == email)).one()
                set_password(person, PASSWORD, session=db)
        live.engine.dispose()
        with live_server(
            url, folder / "server.log", log_level="warning", env_extra=env_extra
        ) as server:
            yield HostileWorld(backend, server, live)
    finally:
        urls.close()
