"""Every write that completes a session stores the completion code it gets
(``elicitation_session.completion_code``: the study's fixed code at that moment, ``''``
without one): the answer's fast and locked paths, a client's finish, a stop before any
question at the start and after the questions about the respondent; and the code shown
afterwards (:func:`app.session.session_completion_code`). SQLite file and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app import session as svc
from app.session import submit
from app.settings import PLACEHOLDER_SECRET
from app.tables import ElicitationSession, Study
from tests.support.live_study import LiveStudy, ces_sample_study, study_fields, study_settings


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStudy]:
    folder = tmp_path_factory.mktemp("codes")
    yield from ces_sample_study(
        request.param, folder, 60, settings={"budgets": {"max_questions": 3}}
    )


def _study(live: LiveStudy) -> Study:
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        db.expunge(study)
        return study


def _session(live: LiveStudy, sid: int) -> ElicitationSession:
    with live.session() as db:
        sess = db.get(ElicitationSession, sid)
        assert sess is not None
        db.expunge(sess)
        return sess


def _answer_all(live: LiveStudy, study: Study, started: svc.StartedSession) -> svc.SessionView:
    view = started.view
    while view.question is not None:
        q = view.question
        view = svc.submit_answer(
            study,
            started.session_id,
            item_key=q.key,
            option=q.options[0][0],
            idempotency_key=f"k{q.number}",
            engine=live.engine,
        )
    return view


@pytest.mark.parametrize("path", ["fast", "locked"])
def test_the_answer_that_completes_a_session_stores_its_code(
    live: LiveStudy, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    if path == "locked":
        monkeypatch.setattr(submit, "submit_fast", lambda *args, **kwargs: None)
    with study_fields(live, completion_code="ALPHA-1"):
        study = _study(live)
        started = svc.start_session(study, engine=live.engine)
        assert _session(live, started.session_id).completion_code is None  # not completed
        assert _answer_all(live, study, started).status == "completed"
        fixed = _session(live, started.session_id)
        assert fixed.completion_code == "ALPHA-1"
    study = _study(live)  # no fixed code: the derived one
    started = svc.start_session(study, engine=live.engine)
    _answer_all(live, study, started)
    derived = _session(live, started.session_id)
    assert derived.completion_code == ""
    with study_fields(live, completion_code="OMEGA-9"):  # a later change shows on neither
        now = _study(live)
        assert svc.session_completion_code(now, fixed, PLACEHOLDER_SECRET) == "ALPHA-1"
        code = svc.session_completion_code(now, derived, PLACEHOLDER_SECRET)
        assert code == svc.completion_code(study, started.session_id, PLACEHOLDER_SECRET)
        assert len(code) == 10 and code != "OMEGA-9"


def test_a_session_its_client_finishes_stores_its_code(live: LiveStudy) -> None:
    with study_fields(live, completion_code="BETA-2"):
        study = _study(live)
        started = svc.start_session(study, engine=live.engine)
        assert started.view.question is not None
        svc.finish_session(study, started.session_id, engine=live.engine)
        assert _session(live, started.session_id).completion_code == "BETA-2"


def test_a_session_that_stops_before_any_question_stores_its_code(live: LiveStudy) -> None:
    """A stopping threshold no question reaches: the first decision is the stop, at the
    start (one insert) or after the questions about the respondent."""
    try:
        with (
            study_settings(live, budgets={"max_questions": 3, "stop_eig_threshold": 1000.0}),
            study_fields(live, completion_code="GAMMA-3"),
        ):
            svc.clear_runtime_cache()
            study = _study(live)
            started = svc.start_session(study, engine=live.engine)
            assert started.view.status == "completed"
            assert _session(live, started.session_id).completion_code == "GAMMA-3"
            asked = svc.start_session(study, engine=live.engine, ask_attributes=True)
            assert _session(live, asked.session_id).status == "active"
            view = svc.submit_attributes(study, asked.session_id, {}, engine=live.engine)
            assert view.status == "completed"
            assert _session(live, asked.session_id).completion_code == "GAMMA-3"
    finally:
        svc.clear_runtime_cache()
