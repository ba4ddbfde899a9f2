"""One answer to "is this a user error?" (:func:`app.errors.is_user_error`): the app's
errors and the pure packages' base errors; a failed job shows a user error's message."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.errors import (
    ConfigurationError,
    ConflictError,
    DatabaseError,
    InvalidInputError,
    NotFoundError,
    is_user_error,
)
from app.jobs.runner import execute_job
from app.services.designer import set_roles
from app.services.importer import import_dataset
from app.settings import Settings
from app.tables import Job, JobStatus, Researcher, Study
from elicitation.criteria import get_criterion
from elicitation.datasets import DatasetError
from elicitation.errors import ElicitationError, UnknownCriterionError
from gnn.graph import GraphInputError
from inference_server.errors import BackendError
from models.base import ShapeError


@pytest.mark.parametrize(
    "exc",
    [
        InvalidInputError("x"),
        NotFoundError("x"),
        ConflictError("x"),
        ConfigurationError("x"),
        DatabaseError("x"),
        ElicitationError("x"),
        UnknownCriterionError("x"),
        DatasetError(None, "x"),
        ShapeError("x"),
        GraphInputError("x"),
        BackendError("x"),
    ],
)
def test_user_errors(exc: BaseException) -> None:
    assert is_user_error(exc)


@pytest.mark.parametrize("exc", [ValueError("x"), KeyError("x"), RuntimeError("x")])
def test_bugs_are_not_user_errors(exc: BaseException) -> None:
    assert not is_user_error(exc)


@pytest.fixture
def alice_id(engine: Engine) -> int:
    from app.auth import create_account

    with Session(engine) as db:
        return create_account("alice@example.org", "alice password 123", session=db).id or 0


@pytest.fixture
def study(engine: Engine, small_dataset_factory: Callable[..., Path]) -> Study:
    """A 60-respondent CES study whose targets are its first run's evaluation items."""
    with Session(engine) as db:
        result = import_dataset(small_dataset_factory("ces", 60), session=db, study_name="ces")
        study = db.get(Study, result.study_id)
        assert study is not None
        set_roles(study, dict.fromkeys(study.benchmark_runs[0]["eval_qids"], "target"), session=db)
        db.refresh(study)
        db.expunge(study)
        return study


def _run(engine: Engine, study: Study, payload: dict[str, object], kind: str = "simulation") -> Job:
    with Session(engine) as db:
        job = Job(kind=kind, study_id=study.id, payload=payload)
        db.add(job)
        db.commit()
        job_id = job.id or 0
    execute_job(engine, job_id)
    with Session(engine) as db:
        done = db.get(Job, job_id)
        assert done is not None
        return done


def test_a_job_failing_with_an_elicitation_error_shows_its_message(
    engine: Engine, study: Study
) -> None:
    # A study whose stored criterion is not (any more) in the registry: the simulation's
    # criterion lookup raises UnknownCriterionError, an ElicitationError.
    with Session(engine) as db:
        row = db.get(Study, study.id)
        assert row is not None
        row.settings = {**row.settings, "criterion": "nonsense"}
        db.add(row)
        db.commit()
    with pytest.raises(UnknownCriterionError) as raised:
        get_criterion("nonsense")
    job = _run(engine, study, {"max_test_users": 5})
    assert job.status == JobStatus.failed.value
    assert job.error == str(raised.value)
    assert "nonsense" in job.error and not job.error.startswith("internal error")


@pytest.mark.parametrize("kind", ["fit_model", "train_gnn"])
def test_fitting_a_study_without_items_says_so(engine: Engine, alice_id: int, kind: str) -> None:
    """A study with only an attribute item (or none): the fit and the GNN training fail
    with a user error naming what is missing, not an internal error."""
    from app.services.designer import add_item, create_study

    with Session(engine) as db:
        owner = db.get(Researcher, alice_id)
        empty = create_study("Empty", owner=owner, session=db)
        db.expunge(empty)
    job = _run(engine, empty, {}, kind)
    assert job.status == JobStatus.failed.value
    assert job.error is not None and "no question or target items" in job.error
    with Session(engine) as db:
        add_item(db.get(Study, empty.id), session=db, key="age", question="Age",
                 options_text="A\nB", role="attribute")  # fmt: skip
    job = _run(engine, empty, {}, kind)
    assert job.error is not None and "no question or target items" in job.error


@pytest.mark.parametrize(
    ("cls", "status", "code"),
    [
        (InvalidInputError, 422, "invalid_input"),
        (NotFoundError, 404, "not_found"),
        (ConflictError, 409, "conflict"),
        (ConfigurationError, 500, "configuration_error"),
        (DatabaseError, 503, "database_unavailable"),
    ],
)
def test_each_error_class_maps_to_a_status_and_a_code(
    cls: type[InvalidInputError], status: int, code: str
) -> None:
    exc = cls("what went wrong")
    assert (exc.http_status, exc.code, str(exc)) == (status, code, "what went wrong")


CLOSED_REDIS = "redis://127.0.0.1:1/9"
"""A Redis URL on a port where nothing listens: every enqueue is refused."""


def test_a_job_started_while_the_queue_is_down_fails_at_once_with_a_503(
    settings: Settings, engine: Engine, alice: Researcher, ces_study: Study
) -> None:
    """Redis unreachable when a researcher starts a job (a simulation, "Refit now"): the
    admin's error page (503) says the queue is unreachable, and the job is ``failed`` with
    that reason, not left ``queued`` for a worker that will never see it."""
    from fastapi.testclient import TestClient
    from sqlmodel import select

    from app.main import create_app
    from tests.support.admin import csrf, login

    down = settings.model_copy(update={"redis_url": CLOSED_REDIS})
    slug = ces_study.slug
    with TestClient(create_app(down), base_url="http://localhost") as client:
        login(client, "alice@example.org")
        sim = client.post(
            f"/admin/studies/{slug}/jobs",
            data={"kind": "simulation", "csrf_token": csrf(client)},
            follow_redirects=False,
        )
        refit = client.post(
            f"/admin/studies/{slug}/refit",
            data={"csrf_token": csrf(client)},
            follow_redirects=False,
        )
    for r in (sim, refit):
        assert r.status_code == 503, r.text
        assert "the job queue is unreachable" in r.text and "when the queue is back" in r.text
    with Session(engine) as db:
        rows = db.exec(select(Job).where(Job.study_id == ces_study.id)).all()
    assert sorted(j.kind for j in rows) == ["fit_model", "simulation"]
    for job in rows:
        assert job.status == JobStatus.failed.value and job.finished_at is not None
        assert job.error and job.error.startswith("the job queue is unreachable: ")
