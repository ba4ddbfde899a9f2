"""The answer call's event-loop path on PostgreSQL (``app/session/async_path.py``).

Through the real app (TestClient, lifespan opens the asyncio pools) on a fresh PostgreSQL
database: a whole questionnaire goes through the event-loop path (counted, so a silent
fall-back to the thread pool fails the test) and leaves exactly what the synchronous path
would (one answer per item, one decision per position, cached state = replay); a
competing answer that lands between its read and its write makes its conditional write
refuse, and the synchronous path answers the retry from the stored row (stored once);
a stale study runtime is refreshed in the background without handing answers over.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import select

from app import session as svc
from app.session import async_path as answer_async
from app.session import runtime as session_runtime
from app.session.sql import HISTORY
from app.tables import Answer, ElicitationSession, Respondent, SelectionDecision, Study
from tests.support.live_study import LiveStudy, app_client, ces_sample_study


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStudy]:
    folder = tmp_path_factory.mktemp("answer_async")
    yield from ces_sample_study("postgresql", folder, 60)


@pytest.fixture
def client(live: LiveStudy) -> Iterator[Any]:
    with app_client(live.url) as c:
        assert c.app.state.answers_db is not None, "PostgreSQL app without its asyncio pool"
        yield c


def _bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def _create(client: Any, live: LiveStudy) -> dict[str, Any]:
    r = client.post(
        f"/api/v1/studies/{live.slug}/sessions", json={}, headers=_bearer(live.owner_key)
    )
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def _answer(client: Any, body: dict[str, Any], option: str, key: str | None = None) -> Any:
    return client.post(
        f"/api/v1/sessions/{body['session_id']}/answers",
        json={"item": body["question"]["item"], "option": option, "idempotency_key": key},
        headers=_bearer(body["token"]),
    )


def _check_stored(live: LiveStudy, sid: int, n_answers: int) -> None:
    with live.session() as db:
        answers = list(db.exec(select(Answer).where(Answer.session_id == sid).order_by(Answer.id)))
        decisions = list(
            db.exec(select(SelectionDecision).where(SelectionDecision.session_id == sid))
        )
        sess = db.get(ElicitationSession, sid)
        assert sess is not None
        assert len(answers) == n_answers
        assert len({a.item_id for a in answers}) == n_answers
        assert sorted(d.position for d in decisions) == list(range(n_answers + 1))
        assert sess.state_version == n_answers
        study = db.get(Study, live.study_id)
        respondent = db.get(Respondent, sess.respondent_id)
        rt = svc.load_runtime(study, session=db, fit_if_missing=False)  # type: ignore[arg-type]
        replayed = svc.replay(rt, respondent, answers)  # type: ignore[arg-type]
    cached = svc.load_state(sess.state)  # type: ignore[arg-type]
    assert svc.dump_state(cached) == svc.dump_state(replayed)


def test_questionnaire_runs_in_the_event_loop(client: Any, live: LiveStudy) -> None:
    body = _create(client, live)
    before = dict(answer_async.STATS)
    n = 0
    while body.get("question"):
        options = body["question"]["options"]
        r = _answer(client, body, options[n % len(options)]["letter"], f"k{n}")
        assert r.status_code == 200, r.text
        assert r.json()["replayed"] is False and "idempotent-replayed" not in r.headers
        n += 1
        body = {**body, **r.json()}
    assert body["status"] == "completed"
    assert n >= 2
    assert answer_async.STATS["fast"] - before["fast"] == n
    assert answer_async.STATS["handed_over"] == before["handed_over"]
    _check_stored(live, body["session_id"], n)


def test_snapshot_and_history_read_in_one_statement(client: Any, live: LiveStudy) -> None:
    """The answer call's one read returns what the two reads it replaced return: the
    session snapshot and the HISTORY rows (answers in order, the pending decision)."""
    body = _create(client, live)
    for n, key in enumerate(("first", "second")):
        r = _answer(client, body, body["question"]["options"][n % 2]["letter"], key)
        assert r.status_code == 200, r.text
        body = {**body, **r.json()}
    db = client.app.state.answers_db
    merged = client.portal.call(answer_async.read_session_and_history, db, body["token"])
    snap = svc.read_session_by_token(body["token"], engine=live.engine)
    assert snap is not None
    with live.engine.connect() as conn:
        history = conn.execute(text(HISTORY), {"sid": snap.id, "pos": snap.state_version}).all()
    assert merged is not None and merged[0] == snap
    assert [tuple(r) for r in merged[1]] == [tuple(r) for r in history]
    assert [r[0] for r in history] == [0, 0, 1]  # two answers, then the pending decision
    assert [r[4] for r in history[:2]] == ["first", "second"]
    assert history[2][2] is not None and history[2][2] not in {r[2] for r in history[:2]}
    assert client.portal.call(answer_async.read_session_and_history, db, "no-such") is None


def test_retry_is_answered_by_the_sync_path(client: Any, live: LiveStudy) -> None:
    body = _create(client, live)
    option = body["question"]["options"][0]["letter"]
    first = _answer(client, body, option, "same-key")
    before = dict(answer_async.STATS)
    again = _answer(client, body, option, "same-key")
    assert first.status_code == again.status_code == 200
    assert first.json()["replayed"] is False
    assert again.json() == {**first.json(), "replayed": True}
    assert again.headers["Idempotent-Replayed"] == "true"
    assert answer_async.STATS["handed_over"] == before["handed_over"] + 1
    other = body["question"]["options"][1]["letter"]
    conflict = _answer(client, body, other, "another-key")
    assert conflict.status_code == 409
    assert conflict.json()["code"] == "answer_conflict"
    _check_stored(live, body["session_id"], 1)


def test_answer_landing_between_read_and_write(
    client: Any, live: LiveStudy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same answer (same idempotency key) is stored by another process between this
    call's reads and its write: the conditional write refuses, the call is handed over
    and returns the stored result; one answer row."""
    body = _create(client, live)
    option = body["question"]["options"][0]["letter"]
    real_step = answer_async.fast_step
    competitor: dict[str, Any] = {}

    def step_after_competitor(*args: Any, **kwargs: Any) -> Any:
        if not competitor:
            competitor["started"] = True  # the competitor's own fast_step runs plainly
            with ThreadPoolExecutor(1) as pool:  # the synchronous path, as another worker
                competitor["view"] = pool.submit(
                    svc.submit_answer,
                    svc.read_session(body["session_id"], engine=live.engine).study,  # type: ignore[union-attr]
                    body["session_id"],
                    item_key=body["question"]["item"],
                    option=option,
                    idempotency_key="raced",
                    engine=live.engine,
                ).result()
        return real_step(*args, **kwargs)

    monkeypatch.setattr(answer_async, "fast_step", step_after_competitor)
    before = dict(answer_async.STATS)
    r = _answer(client, body, option, "raced")
    assert r.status_code == 200, r.text
    assert competitor["view"].n_posed == 1
    assert answer_async.STATS["fast"] == before["fast"]
    assert answer_async.STATS["handed_over"] == before["handed_over"] + 1
    assert r.json()["question"]["item"] == competitor["view"].question.key
    # the competitor stored the answer; this call replays it and says so
    assert competitor["view"].replayed is False
    assert r.json()["replayed"] is True and r.headers["Idempotent-Replayed"] == "true"
    _check_stored(live, body["session_id"], 1)


def test_stale_runtime_is_refreshed_without_handing_over(
    client: Any, live: LiveStudy, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = _create(client, live)
    monkeypatch.setattr(
        session_runtime, "RUNTIME_TTL_S", 0.0
    )  # every cached runtime is stale at once
    before = dict(answer_async.STATS)
    option = body["question"]["options"][0]["letter"]
    r = _answer(client, body, option, "stale")
    assert r.status_code == 200, r.text
    assert answer_async.STATS["fast"] == before["fast"] + 1
    assert answer_async.STATS["handed_over"] == before["handed_over"]
    _check_stored(live, body["session_id"], 1)


def test_rate_limit_counts_in_the_event_loop(live: LiveStudy) -> None:
    """On PostgreSQL the API rate limiter counts through the asyncio pool: a session token
    gets ``session_rate_limit_per_minute`` calls, then 429 with Retry-After; every call
    is counted in the database."""
    from fastapi.testclient import TestClient

    from app import ratelimit
    from app.main import create_app
    from app.settings import load_settings
    from app.tables import RateLimitCounter

    settings = load_settings(database_url=live.url, env="dev", session_rate_limit_per_minute=3)
    with TestClient(create_app(settings)) as c:
        assert c.app.state.answers_db is not None
        body = _create(c, live)
        sid, token = body["session_id"], body["token"]
        responses = [c.get(f"/api/v1/sessions/{sid}", headers=_bearer(token)) for _ in range(5)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429, 429]
    assert responses[3].json()["code"] == "rate_limited"
    assert 1 <= int(responses[3].headers["retry-after"]) <= 60
    with live.session() as db:
        row = db.get(RateLimitCounter, ratelimit.counter_key("api", token))
    assert row is not None and row.count == 5


def test_session_start_runs_in_the_event_loop(client: Any, live: LiveStudy) -> None:
    """With the study's runtime cached, an API session start (key check, prior state,
    first decision, the insert) runs in the event loop and stores what the synchronous
    start stores: one respondent with its attributes and external id, an active session
    whose cached state is the replay of no answers, the decision at position 0 for the
    question returned. Without a cached runtime the start is handed to the thread pool."""
    svc.clear_runtime_cache()
    before = dict(answer_async.STATS)
    cold = _create(client, live)
    assert answer_async.STATS["start_handed_over"] == before["start_handed_over"] + 1
    assert answer_async.STATS["start_fast"] == before["start_fast"]

    with live.session() as db:
        study = db.get(Study, live.study_id)
        rt = svc.load_runtime(study, session=db, fit_if_missing=False)  # type: ignore[arg-type]
    attribute = rt.attributes[0]
    letter = attribute.options[-1][0]
    r = client.post(
        f"/api/v1/studies/{live.slug}/sessions",
        json={"external_id": "loop-start-1", "attributes": {attribute.key: letter}},
        headers=_bearer(live.owner_key),
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert answer_async.STATS["start_fast"] == before["start_fast"] + 1
    assert answer_async.STATS["start_handed_over"] == before["start_handed_over"] + 1
    assert body["question"]["number"] == 1 and body["questions_answered"] == 0
    assert body["token"] != cold["token"]
    with live.session() as db:
        sess = db.get(ElicitationSession, body["session_id"])
        assert sess is not None and sess.status == "active" and sess.state_version == 0
        assert sess.token_hash == svc.hash_token(body["token"])
        respondent = db.get(Respondent, sess.respondent_id)
        assert respondent is not None and respondent.id == body["respondent_id"]
        assert respondent.external_id == "loop-start-1"
        assert respondent.attributes == {attribute.key: letter}
        decisions = list(
            db.exec(select(SelectionDecision).where(SelectionDecision.session_id == sess.id))
        )
        replayed = svc.replay(rt, respondent, [])
    assert [d.position for d in decisions] == [0]
    assert rt.by_id[decisions[0].item_id].key == body["question"]["item"]  # type: ignore[index]
    assert svc.dump_state(svc.load_state(sess.state)) == svc.dump_state(replayed)  # type: ignore[arg-type]

    # the same external id again: 409 from the event-loop path, nothing written
    with live.session() as db:
        n_respondents = len(list(db.exec(select(Respondent.id))))
    again = client.post(
        f"/api/v1/studies/{live.slug}/sessions",
        json={"external_id": "loop-start-1"},
        headers=_bearer(live.owner_key),
    )
    assert again.status_code == 409 and again.json()["code"] == "external_id_taken"
    with live.session() as db:
        assert len(list(db.exec(select(Respondent.id)))) == n_respondents
    bad = client.post(
        f"/api/v1/studies/{live.slug}/sessions",
        json={"attributes": {attribute.key: "Z"}},
        headers=_bearer(live.owner_key),
    )
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_attributes"
    assert f"attributes.{attribute.key}" in bad.json()["message"]
    assert answer_async.STATS["start_handed_over"] == before["start_handed_over"] + 1


def test_session_start_authorization_in_the_event_loop(client: Any, live: LiveStudy) -> None:
    """The event-loop key check keeps the synchronous rules: another researcher's key and
    an unknown study get 404 study_not_found, an admin's key may start, a session token
    or an unknown key gets 401, a deactivated researcher's key gets 401."""
    from app.tables import Researcher

    url = f"/api/v1/studies/{live.slug}/sessions"
    other = client.post(url, json={}, headers=_bearer(live.other_key))
    assert other.status_code == 404 and other.json()["code"] == "study_not_found"
    missing = client.post(
        "/api/v1/studies/no-such-study/sessions", json={}, headers=_bearer(live.owner_key)
    )
    assert missing.status_code == 404 and missing.json()["code"] == "study_not_found"
    assert client.post(url, json={}, headers=_bearer(live.admin_key)).status_code == 201
    created = _create(client, live)
    assert client.post(url, json={}, headers=_bearer(created["token"])).status_code == 401
    assert client.post(url, json={}, headers=_bearer(live.owner_key + "x")).status_code == 401

    def set_active(active: bool) -> None:
        with live.session() as db:
            other = db.exec(select(Researcher).where(Researcher.email == "other@example.org")).one()
            other.is_active = active
            db.add(other)
            db.commit()

    set_active(False)
    try:
        off = client.post(url, json={}, headers=_bearer(live.other_key))
        assert off.status_code == 401 and "deactivated" in off.json()["message"]
    finally:
        set_active(True)
