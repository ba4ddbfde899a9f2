"""The optimistic fast path (``app.session.fast.submit_fast``) under forced races.

The fast path reads without a lock, runs the model step, and writes only if the session's
``state_version`` is unchanged. These tests make another answer land *between* that read
and that write (deterministically: the selection step of the first request runs the
competing request to completion in another thread) and check that the stale write is
refused, the locked path answers instead, and the database holds exactly what one
serial history would (SQLite file and PostgreSQL).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from sqlmodel import select

from app import session as svc
from app.session import fast, submit, tokens
from app.tables import Answer, ElicitationSession, Respondent, SelectionDecision, Study
from tests.support.live_study import LiveStudy, ces_sample_study


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStudy]:
    folder = tmp_path_factory.mktemp("fast")
    yield from ces_sample_study(request.param, folder, 60)


def _study(live: LiveStudy) -> Study:
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        db.expunge(study)
        return study


def _rows(live: LiveStudy, sid: int) -> tuple[list[Answer], list[SelectionDecision], Any]:
    with live.session() as db:
        answers = list(db.exec(select(Answer).where(Answer.session_id == sid).order_by(Answer.id)))
        decisions = list(
            db.exec(
                select(SelectionDecision)
                .where(SelectionDecision.session_id == sid)
                .order_by(SelectionDecision.position)  # type: ignore[arg-type]
            )
        )
        sess = db.get(ElicitationSession, sid)
        assert sess is not None
        respondent = db.get(Respondent, sess.respondent_id)
        rt = svc.load_runtime(_study(live), session=db, fit_if_missing=False)
        replayed = svc.replay(rt, respondent, answers)  # type: ignore[arg-type]
        return answers, decisions, (sess, replayed)


class _RaceInStep:
    """Wraps ``app.session.fast.model_step`` (the fast path's model step, computed or
    from the step memo): the first call (inside the first request's fast path, after its
    reads) runs ``competitor`` to completion in another thread first."""

    def __init__(self, competitor: Any) -> None:
        self.real = fast.model_step
        self.competitor = competitor
        self.fired = False
        self.competitor_result: Any = None
        self.competitor_error: BaseException | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.fired:
            self.fired = True

            def run() -> None:
                try:
                    self.competitor_result = self.competitor()
                except BaseException as exc:  # noqa: BLE001 (reported by the test)
                    self.competitor_error = exc

            t = threading.Thread(target=run)
            t.start()
            t.join(timeout=120)
            assert not t.is_alive(), "the competing answer did not finish"
        return self.real(*args, **kwargs)


@pytest.mark.parametrize("same_option", [True, False])
def test_answer_landing_between_read_and_write_wins_and_stale_write_is_refused(
    live: LiveStudy, monkeypatch: pytest.MonkeyPatch, same_option: bool
) -> None:
    study = _study(live)
    started = svc.start_session(study, engine=live.engine, allow_draft=True)
    sid = started.session_id
    q = started.view.question
    assert q is not None
    mine, theirs = q.options[0][0], q.options[0 if same_option else 1][0]

    def competitor() -> svc.SessionView:
        return svc.submit_answer(
            study,
            sid,
            item_key=q.key,
            option=theirs,
            idempotency_key="other-tab",
            engine=live.engine,
        )

    race = _RaceInStep(competitor)
    monkeypatch.setattr(fast, "model_step", race)
    real_fast = submit.submit_fast
    fast_results: list[Any] = []

    def recording_fast(*args: Any, **kwargs: Any) -> Any:
        out = real_fast(*args, **kwargs)
        fast_results.append(out)
        return out

    monkeypatch.setattr(submit, "submit_fast", recording_fast)
    if same_option:
        view = svc.submit_answer(
            study, sid, item_key=q.key, option=mine, idempotency_key="mine", engine=live.engine
        )
        # the item was answered with the same option in between: the same next question
        assert race.competitor_error is None
        # the competitor's answer was the fresh one; this request replays it
        assert not race.competitor_result.replayed and view.replayed
        assert view == replace(race.competitor_result, replayed=True)
    else:
        with pytest.raises(svc.AnswerConflictError):
            svc.submit_answer(
                study, sid, item_key=q.key, option=mine, idempotency_key="mine", engine=live.engine
            )
        assert race.competitor_error is None
    monkeypatch.undo()
    # the competitor's fast path wrote (it finished first); the first request's fast write
    # was refused (its version check failed) and the locked path answered it
    assert len(fast_results) == 2
    assert fast_results[0] == race.competitor_result and fast_results[1] is None

    answers, decisions, (sess, replayed) = _rows(live, sid)
    assert [(a.item_id, a.option, a.idempotency_key) for a in answers] == [
        (q.item_id, theirs, "other-tab")
    ]
    assert [d.position for d in decisions] == [0, 1]
    assert decisions[0].item_id == q.item_id
    assert sess.state_version == 1
    assert svc.states_equal(svc.load_state(sess.state), replayed)
    assert race.competitor_result.n_posed == 1
    assert race.competitor_result.question.item_id == decisions[1].item_id


def test_stale_snapshot_from_authorization_is_not_trusted(live: LiveStudy) -> None:
    """A snapshot read before another answer (as the API's authorization read it) leads to
    the same result as a fresh one: the fast path sees the history moved on."""
    study = _study(live)
    started = svc.start_session(study, engine=live.engine, allow_draft=True)
    sid = started.session_id
    stale = svc.read_session(sid, engine=live.engine)
    assert stale is not None and stale.state_version == 0
    q1 = started.view.question
    assert q1 is not None
    v1 = svc.submit_answer(
        study,
        sid,
        item_key=q1.key,
        option=q1.options[0][0],
        idempotency_key="k1",
        engine=live.engine,
    )
    q2 = v1.question
    assert q2 is not None
    v2 = svc.submit_answer(
        stale.study,
        sid,
        item_key=q2.key,
        option=q2.options[-1][0],
        idempotency_key="k2",
        engine=live.engine,
        snapshot=stale,
    )
    assert v2.n_posed == 2
    # a retry of the first answer with the stale snapshot replays its stored result
    again = svc.submit_answer(
        stale.study,
        sid,
        item_key=q1.key,
        option=q1.options[0][0],
        idempotency_key="k1",
        engine=live.engine,
        snapshot=stale,
    )
    assert again == replace(v1, replayed=True) and not v1.replayed
    answers, decisions, (sess, replayed) = _rows(live, sid)
    assert [a.idempotency_key for a in answers] == ["k1", "k2"]
    assert [d.position for d in decisions] == [0, 1, 2]
    assert [d.item_id for d in decisions[:2]] == [q1.item_id, q2.item_id]
    assert sess.state_version == 2
    assert svc.states_equal(svc.load_state(sess.state), replayed)


def test_unreachable_database_is_503_database_unavailable() -> None:
    """A database that refuses connections (here: nothing listens on port 1) is a
    retryable 503 with the documented code on the answer call, never a 500."""
    from tests.support.live_study import app_client

    with app_client("postgresql+psycopg://postgres@127.0.0.1:1/nowhere") as client:
        r = client.post(
            "/api/v1/sessions/1/answers",
            json={"item": "x", "option": "A", "idempotency_key": "k"},
            headers={"Authorization": "Bearer some-session-token"},
        )
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "database_unavailable"


def test_session_token_never_looks_like_an_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token drawn with the API-key prefix is redrawn (the API routes credentials by it)."""
    draws = iter(["pk_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "pk_b", "Zx_fine-token"])
    monkeypatch.setattr(tokens.secrets, "token_urlsafe", lambda _n: next(draws))
    assert svc.new_token() == "Zx_fine-token"
