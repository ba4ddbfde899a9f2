"""``priorly worker --processes --workers 2`` as a real subprocess on a SQLite database and
queue file: the jobs run in the job processes Huey forked, the worker's heartbeat is
written, and the worker's main process, which forks the job processes (at start and
again for each one that died), holds no open database file, so no forked process
inherits a connection.

A database connection or a thread doing database work in the main process would reach
every process forked from it: a pooled connection then used by two processes, or a lock
held at the fork (SQLite's, SQLAlchemy's) on which the child hangs at its first query.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine, make_url
from sqlmodel import Session, select

from app.auth import create_account
from app.db import make_engine
from app.jobs.heartbeat import consumer_id
from app.services.designer import create_study
from app.services.jobs import start_job
from app.settings import Settings
from app.tables import Job, JobStatus, WorkerHeartbeat
from tests.support.admin import PASSWORD

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")


def _poll(cond: Callable[[], object], timeout: float, what: str, log: Path) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; log:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)  # polling interval of a condition, not a synchronisation sleep


def _open_files(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found.add(os.readlink(fd))
        except OSError:  # closed meanwhile
            pass
    return found


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _jobs(engine: Engine, ids: list[int]) -> list[Job]:
    with Session(engine) as s:
        rows = list(s.exec(select(Job).where(Job.id.in_(ids))).all())  # type: ignore[union-attr]
        for r in rows:
            s.expunge(r)
    return rows


def test_worker_processes_run_jobs_without_sharing_the_database(
    migrated_sqlite_url: str, tmp_path: Path
) -> None:
    settings = Settings(
        database_url=migrated_sqlite_url,
        env="test",
        secret_key="t" * 40,  # type: ignore[arg-type]
        queue_path=tmp_path / "queue.db",
    )
    engine = make_engine(migrated_sqlite_url)
    log = tmp_path / "worker.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        with Session(engine) as db:
            owner = create_account("w@example.org", PASSWORD, session=db)
            study = create_study("Forked", owner=owner, session=db)
            ids = [
                start_job("fixed_order", study, researcher=owner, settings=settings, session=db).id
                or 0
                for _ in range(4)
            ]
        env = {
            **os.environ,
            "PRIORLY_DATABASE_URL": migrated_sqlite_url,
            "PRIORLY_QUEUE_PATH": str(settings.queue_path),
            "PRIORLY_ENV": "test",
            "PRIORLY_SECRET_KEY": "t" * 40,
            "PRIORLY_JOB_STALE_AFTER_S": "30",
            "OMP_NUM_THREADS": "1",
        }
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "worker", "--processes", "--workers", "2"],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        done = {JobStatus.succeeded.value, JobStatus.failed.value, JobStatus.cancelled.value}
        jobs = _poll(
            lambda: (rows := _jobs(engine, ids)) and all(j.status in done for j in rows) and rows,
            180,
            "the 4 jobs to finish",
            log,
        )
        assert isinstance(jobs, list)
        assert [j.status for j in jobs] == ["succeeded"] * 4, [j.error for j in jobs]
        host = consumer_id().split(":")[0]
        with Session(engine) as db:
            beat = db.get(WorkerHeartbeat, f"{host}:{proc.pid}")
            assert beat is not None and beat.kind == "worker"

        # the jobs ran in processes forked by the worker, not in the worker itself
        job_pids = {int((j.worker or "").split(":")[1]) for j in jobs}
        assert proc.pid not in job_pids
        assert all(_parent(pid) == proc.pid for pid in job_pids)
        # ... and the worker, which forks them, keeps no database file open: its reaper
        # and heartbeat run in the forked scheduler
        database = Path(make_url(migrated_sqlite_url).database or "").resolve()
        assert database.exists()
        held = {f for f in _open_files(proc.pid) if f.startswith(str(database))}
        assert held == set(), f"the worker's main process holds {held}"
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(60)
        engine.dispose()
