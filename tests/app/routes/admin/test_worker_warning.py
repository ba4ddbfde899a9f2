"""The admin pages that list jobs warn when a job is queued and no job worker has been seen
(``app.services.workers.no_worker_warning``): the Jobs tab, the simulation page and the
personas page, through TestClient on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.jobs.heartbeat import record_heartbeat
from app.services.designer import create_study
from app.services.workers import duration_words
from app.tables import Job, JobStatus, Researcher, WorkerKind, utcnow
from tests.support.admin import login

ADVICE = "queued jobs wait until one starts (priorly worker or priorly serve)."


def _beat(engine: Engine, worker: str, ago: timedelta) -> None:
    now = utcnow()
    record_heartbeat(
        engine, worker, kind=WorkerKind.worker, started_at=now - timedelta(hours=2), now=now - ago
    )


def test_pages_warn_while_jobs_wait_without_a_worker(
    client: TestClient, db: Session, engine: Engine, alice: Researcher
) -> None:
    study = create_study("Waiting", owner=alice, session=db)
    login(client, "alice@example.org")
    base = f"/admin/studies/{study.slug}"
    pages = (f"{base}/jobs", f"{base}/simulation")
    assert all('id="no-worker"' not in client.get(p).text for p in pages)  # nothing queued

    job = Job(kind="simulation", study_id=study.id, payload={})
    db.add(job)
    db.commit()
    for page in pages:  # never any worker
        assert f"No worker has been seen: {ADVICE}" in client.get(page).text, page

    _beat(engine, "gone:1", timedelta(minutes=12, seconds=5))
    for page in pages:
        assert f"No worker has been seen for 12 minutes: {ADVICE}" in client.get(page).text

    _beat(engine, "here:2", timedelta(seconds=1))
    assert all('id="no-worker"' not in client.get(p).text for p in pages)

    job.status = JobStatus.running.value  # a running job is not waiting for a worker
    db.add(job)
    db.commit()
    _beat(engine, "here:2", timedelta(minutes=5))
    assert all('id="no-worker"' not in client.get(p).text for p in pages)


def test_personas_page_warns_for_a_queued_generation(
    client: TestClient, db: Session, alice: Researcher
) -> None:
    study = create_study("Personas waiting", owner=alice, session=db)
    db.add(Job(kind="persona_generation", study_id=study.id, payload={}))
    db.commit()
    login(client, "alice@example.org")
    page = client.get(f"/admin/studies/{study.slug}/personas").text
    assert f'<p class="warning" role="status" id="no-worker">No worker has been seen: {ADVICE}' in (
        page
    )


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (61, "1 minute"),
        (754, "12 minutes"),
        (119 * 60 + 59, "119 minutes"),
        (2 * 3600, "2 hours"),
        (47 * 3600 + 59 * 60, "47 hours"),
        (3 * 86400 + 5, "3 days"),
    ],
)
def test_duration_words(seconds: float, words: str) -> None:
    assert duration_words(seconds) == words
