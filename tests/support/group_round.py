"""A published group study with an open round, for the tests of the round pages.

Example::

    study = group_study(db, ces_study, rounds=2, respondents_per_round=3)
    rnd, links = open_test_round(engine, settings, study)  # links: "http://localhost/g/..."
    job = plan_from_form(client, engine, study)  # the Jobs form's plan, run here
    open_from_form(client, study, job.id)  # the rounds page's "Open round"
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.jobs.runner import execute_job
from app.services import group_rounds
from app.settings import Settings
from app.tables import GroupRound, GroupRoundMember, Job, JobStatus, Study
from tests.support.admin import csrf


def group_study(db: Session, study: Study, **group: Any) -> Study:
    """``study`` with a fitted model (2 classes, one restart), the group settings
    ``group`` over the stored ones, a consent text, and published."""
    from app.services.belief import fit_study_model

    fit_study_model(study, session=db, n_classes=(2,), n_restarts=1)
    settings = dict(study.settings)
    settings["group"] = {**settings["group"], **group}
    study.settings = settings
    study.consent_text = "You agree to answer one question per round."
    study.status = "published"
    db.add(study)
    db.commit()
    db.refresh(study)
    return study


def open_test_round(
    engine: Engine, settings: Settings, study: Study, *, max_members: int = 60
) -> tuple[GroupRound, list[str]]:
    """Plan (the job, run here) and open the next round of ``study``: the round and its
    members' link URLs (``http://localhost/g/<token>``), in member order."""
    with Session(engine) as db:
        job = Job(kind="plan_group_round", study_id=study.id, payload={"max_members": max_members})
        db.add(job)
        db.commit()
        job_id = job.id or 0
    assert execute_job(engine, job_id) == JobStatus.succeeded.value
    secret = settings.secret_key.get_secret_value()
    rnd = group_rounds.open_round(study, job_id, engine=engine, secret=secret)
    with Session(engine) as db:
        members = db.exec(
            select(GroupRoundMember)
            .where(GroupRoundMember.round_id == rnd.id)
            .order_by(col(GroupRoundMember.id))
        ).all()
        tokens = [group_rounds.link_token(secret, rnd.id or 0, m.respondent_id) for m in members]
    return rnd, [f"http://localhost/g/{t}" for t in tokens]


def plan_from_form(client: TestClient, engine: Engine, study: Study) -> Job:
    """Start a plan job from the Jobs form (logged-in ``client``) and run it (no worker in
    tests); the finished job, detached."""
    r = client.post(
        f"/admin/studies/{study.slug}/jobs",
        data={"kind": "plan_group_round", "csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    job_id = int(r.headers["location"].rsplit("job=", 1)[1])
    execute_job(engine, job_id)
    with Session(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def open_from_form(client: TestClient, study: Study, job_id: int) -> Any:
    """Post the rounds page's "Open round" for plan ``job_id``; the response (not followed)."""
    return client.post(
        f"/admin/studies/{study.slug}/groups/open",
        data={"job_id": str(job_id), "csrf_token": csrf(client)},
        follow_redirects=False,
    )
