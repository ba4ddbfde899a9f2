"""Answer steps are computed once per study design and reused (``app.session.memo.StepMemo``).

A step (the state updated with an answer, and the next decision) is a pure function of
the state before, the answers so far and the answer, for a fixed study design. Checked on
both backends through the JSON API: a second respondent giving the same answers runs no
selection step, and every stored state and decision equals the first respondent's, an
uncached computation's (memo off) and the replay of the answers; another answer or other
attributes compute a new step; a new budget gets its own memo (its sessions stop at the
new budget); ``random`` keeps no memo; the memo is bounded.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlmodel import select

from app import session as svc
from app.services.belief import model_from_blob
from app.session import memo as session_memo
from app.session import runtime as session_runtime
from app.tables import Answer, ElicitationSession, Respondent, SelectionDecision, Study
from tests.support.live_study import (
    LiveStudy,
    app_client,
    ces_sample_study,
    count_decisions,
    study_settings,
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStudy]:
    folder = tmp_path_factory.mktemp(f"step_memo_{request.param}")
    yield from ces_sample_study(request.param, folder, 60)


@pytest.fixture
def fresh_memo() -> Iterator[None]:
    """Empty step memos (and runtimes) before and after the test, at the default size."""
    size = session_memo.step_memo_size()
    svc.configure_step_memo(0)
    svc.configure_step_memo(size)
    yield
    svc.configure_step_memo(0)
    svc.configure_step_memo(size)


def _run(
    client: Any, live: LiveStudy, pick: int | list[int], attributes: dict[str, str] | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """Start a session and answer until it completes, option ``pick`` each time (or
    ``pick[k]`` at question k); returns the session id and the answer responses."""
    r = client.post(
        f"/api/v1/studies/{live.slug}/sessions",
        json={"attributes": attributes or {}},
        headers={"Authorization": f"Bearer {live.owner_key}"},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    sid, auth = body["session_id"], {"Authorization": f"Bearer {body['token']}"}
    out = []
    k = 0
    while body.get("question"):
        q = body["question"]
        i = pick[k] if isinstance(pick, list) else pick
        r = client.post(
            f"/api/v1/sessions/{sid}/answers",
            json={
                "item": q["item"],
                "option": q["options"][i]["letter"],
                "idempotency_key": uuid.uuid4().hex,
            },
            headers=auth,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        out.append(body)
        k += 1
    return sid, out


def _stored(live: LiveStudy, sid: int) -> tuple[bytes, list[tuple[Any, ...]], Any]:
    """The session's cached state, its decisions (position, item, criterion, scores, stop
    reason) and the replay of its answers under the study's runtime."""
    with live.session() as db:
        sess = db.get(ElicitationSession, sid)
        assert sess is not None and sess.state is not None
        decisions = [
            (d.position, d.item_id, d.criterion, d.scores, d.stop_reason)
            for d in db.exec(
                select(SelectionDecision)
                .where(SelectionDecision.session_id == sid)
                .order_by(SelectionDecision.position)  # type: ignore[arg-type]
            )
        ]
        answers = list(db.exec(select(Answer).where(Answer.session_id == sid).order_by(Answer.id)))
        respondent = db.get(Respondent, sess.respondent_id)
        study = db.get(Study, live.study_id)
        rt = svc.load_runtime(study, session=db, fit_if_missing=False)  # type: ignore[arg-type]
        return bytes(sess.state), decisions, svc.replay(rt, respondent, answers)  # type: ignore[arg-type]


def test_same_answers_reuse_every_step_bit_for_bit(
    live: LiveStudy, monkeypatch: pytest.MonkeyPatch, fresh_memo: None
) -> None:
    monkeypatch.setattr(
        session_runtime, "RUNTIME_TTL_S", 3600.0
    )  # rebuilt only where the test says
    calls = count_decisions(monkeypatch)
    # without calibration questions, which are drawn per session (test_learning.py)
    with study_settings(live, calibration_items=0), app_client(live.url) as client:
        first, answered = _run(client, live, 0)
        n = len(answered)
        assert n >= 3
        assert len(calls) == 1 + n  # the first decision, then one step per answer
        hits = session_memo.STEP_MEMO_STATS["hits"]
        svc.clear_runtime_cache()  # a rebuilt runtime of the same design keeps the memo
        second, again = _run(client, live, 0)
        assert len(calls) == 1 + n + 1, "a respondent with the same answers ran the step"
        assert session_memo.STEP_MEMO_STATS["hits"] == hits + n
        assert again == [{**b, "session_id": second} for b in answered]
        svc.configure_step_memo(0)  # the same answers, computed without the memo
        third, _ = _run(client, live, 0)
        assert len(calls) == 2 * (1 + n) + 1
    s1, s2, s3 = (_stored(live, sid) for sid in (first, second, third))
    assert s1[0] == s2[0] == s3[0]  # the cached state, byte for byte
    assert s1[1] == s2[1] == s3[1]  # every decision with its scores
    assert svc.states_equal(svc.load_state(s2[0]), s2[2])  # = the replay of the answers


def test_other_answers_or_attributes_compute_new_steps(
    live: LiveStudy, monkeypatch: pytest.MonkeyPatch, fresh_memo: None
) -> None:
    with live.session() as db:
        study = db.get(Study, live.study_id)
        rt = svc.load_runtime(study, session=db, fit_if_missing=False)  # type: ignore[arg-type]
    attribute = rt.attributes[0]
    monkeypatch.setattr(session_runtime, "RUNTIME_TTL_S", 3600.0)
    calls = count_decisions(monkeypatch)
    with app_client(live.url) as client:
        _, answered = _run(client, live, 0)
        n = len(answered)
        # the same first answer, then another one: one shared step, then new ones
        other, _ = _run(client, live, [0] + [1] * (n - 1))
        assert len(calls) == 1 + n + (n - 1)  # with the first decision
        # the same answers with a known attribute: another state, so every step is new
        before = len(calls)
        with_attr, _ = _run(client, live, 0, {attribute.key: attribute.options[0][0]})
        assert len(calls) - before >= 1
    for sid in (other, with_attr):
        state, _, replayed = _stored(live, sid)
        assert svc.states_equal(svc.load_state(state), replayed)


def test_a_new_budget_gets_its_own_memo(live: LiveStudy, fresh_memo: None) -> None:
    with app_client(live.url) as client:
        _, answered = _run(client, live, 0)
        assert len(answered) > 2
        budgets = {**_settings(live).get("budgets", {}), "max_questions": 2}
        with study_settings(live, budgets=budgets, calibration_items=0):  # both adaptive
            _, short = _run(client, live, 0)
    assert len(short) == 2 and short[-1]["status"] == "completed"
    assert [b["question"] for b in short[:1]] == [b["question"] for b in answered[:1]]


def test_random_criterion_keeps_no_memo(live: LiveStudy, fresh_memo: None) -> None:
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        rt = session_runtime.build_runtime(
            Study(id=study.id, slug=study.slug, settings={**study.settings, "criterion": "random"}),
            *_runtime_parts(db, study),
        )
        assert rt.criterion == "random" and rt.step_memo is None
        same = svc.load_runtime(study, session=db, fit_if_missing=False)
        assert same.step_memo is not None


def _settings(live: LiveStudy) -> dict[str, Any]:
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        return dict(study.settings)


def _runtime_parts(db: Any, study: Study) -> tuple[Any, ...]:
    ref, model, blob, items, orders = session_runtime.runtime_rows(study, db, False)
    if model is None:
        model = model_from_blob(ref, blob)
    return ref, model, items, orders


def test_memo_is_bounded_least_recently_used_first() -> None:
    memo = session_memo.StepMemo(2)
    steps = [session_memo.MemoStep(bytes([i]), i, "eig", "{}", None) for i in range(3)]
    keys = [session_memo.StepMemo.key(b"state", [(0, "A"), (i, None)]) for i in range(3)]
    assert (
        keys[0] != keys[1] and session_memo.StepMemo.key(b"other", [(0, "A"), (0, None)]) != keys[0]
    )
    memo.put(keys[0], steps[0])
    memo.put(keys[1], steps[1])
    assert memo.get(keys[0]) == steps[0]  # now the most recently used
    memo.put(keys[2], steps[2])
    assert len(memo) == 2
    assert memo.get(keys[1]) is None  # the least recently used went
    assert memo.get(keys[0]) == steps[0] and memo.get(keys[2]) == steps[2]
