"""The JSON API under /api/v1 on a real database (SQLite file and PostgreSQL).

A whole questionnaire through the API, checked against the database and against a brute
force recomputation of every stored score; idempotent retries and conflicting re-answers;
authorization (own study, another owner's study, revoked key, session token); erasure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func
from sqlmodel import select

from app import session as svc
from app.routes.api_v1 import AnswerIn
from app.schemas import StudySettings
from app.services.apikeys import create_api_key, revoke_api_key
from app.services.belief import stored_fixed_orders
from app.services.designer import update_settings
from app.tables import (
    Answer,
    ElicitationSession,
    ErasureRecord,
    FittedModel,
    Item,
    Respondent,
    SelectionDecision,
    Study,
)
from elicitation.criteria import DEFAULT_DELTA, DEFAULT_EVIDENCE_STRENGTH
from tests.support.live_study import LiveStudy, app_client, ces_sample_study


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStudy]:
    """One prepared study per backend for this module (each test makes its own sessions)."""
    folder = tmp_path_factory.mktemp("api")
    yield from ces_sample_study(request.param, folder, 120)


@pytest.fixture
def client(live: LiveStudy) -> Iterator[Any]:
    with app_client(live.url) as c:
        yield c


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def create(client: Any, live: LiveStudy, **body: Any) -> dict[str, Any]:
    r = client.post(
        f"/api/v1/studies/{live.slug}/sessions", json=body, headers=bearer(live.owner_key)
    )
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def answer_first_options(client: Any, view: dict[str, Any], n: int, key: str) -> dict[str, Any]:
    """Answer the session's next ``n`` questions with their first option (idempotency keys
    ``key0``, ``key1``, ...); returns the last view."""
    sid, token = view["session_id"], view["token"]
    for j in range(n):
        q = view["question"]
        r = client.post(
            f"/api/v1/sessions/{sid}/answers",
            json={
                "item": q["item"],
                "option": q["options"][0]["letter"],
                "idempotency_key": f"{key}{j}",
            },  # fmt: skip
            headers=bearer(token),
        )
        assert r.status_code == 200, r.text
        view = {**r.json(), "token": token}
    return view


def entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def brute_force_eig(model: Any, state: Any, item: int, targets: list[int]) -> float:
    """EIG by enumerating the candidate's answers with ``model.update`` (no lookahead)."""

    def mean_h(s: Any) -> float:
        return sum(entropy(row.tolist()) for row in model.predict(s, targets)) / len(targets)

    p_x = model.predict(state, [item])[0].tolist()
    expected = sum(
        p_x[k] * mean_h(model.update(state, item, k))
        for k in range(model.item_bank.n_options[item])
        if p_x[k] > 0
    )
    return mean_h(state) - expected


def test_full_questionnaire_matches_database_and_brute_force(client: Any, live: LiveStudy) -> None:
    created = create(client, live, external_id="ext-1", attributes={"gender4": "A"})
    token, sid = created["token"], created["session_id"]
    assert created["phase"] == "question" and created["questions_answered"] == 0
    seen: list[str] = []
    body = created
    while body["question"] is not None:
        q = body["question"]
        assert q["item"] not in seen, "a question was asked twice"
        assert q["number"] == len(seen) + 1
        seen.append(q["item"])
        r = client.post(
            f"/api/v1/sessions/{sid}/answers",
            json={
                "item": q["item"],
                "option": q["options"][-1]["letter"],
                "idempotency_key": f"a{len(seen)}",
            },
            headers=bearer(token),
        )
        assert r.status_code == 200, r.text
        body = r.json()
    assert body["status"] == "completed" and body["phase"] == "done"
    assert body["stop_reason"] == "max_questions"
    assert body["questions_answered"] == len(seen) == 10

    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        sess = db.get(ElicitationSession, sid)
        assert sess is not None and sess.status == "completed" and sess.completed_at is not None
        respondent = db.get(Respondent, sess.respondent_id)
        assert respondent is not None
        assert respondent.external_id == "ext-1" and respondent.attributes == {"gender4": "A"}
        answers = db.exec(select(Answer).where(Answer.session_id == sid).order_by(Answer.id)).all()
        keys = {it.id: it.key for it in db.exec(select(Item).where(Item.study_id == live.study_id))}
        assert [keys[a.item_id] for a in answers] == seen
        decisions = db.exec(
            select(SelectionDecision)
            .where(SelectionDecision.session_id == sid)
            .order_by(SelectionDecision.position)
        ).all()
        assert [d.position for d in decisions] == list(range(11))
        assert [keys[d.item_id] for d in decisions[:-1]] == seen
        assert decisions[-1].item_id is None and decisions[-1].stop_reason == "max_questions"

        # the cached state equals the replay of the stored answers
        rt = svc.load_runtime(study, session=db)
        replayed = svc.replay(rt, respondent, answers)
        assert sess.state_version == 10
        assert svc.states_equal(svc.load_state(sess.state), replayed)

        # every stored score is the brute-force EIG of that candidate under the model's
        # evidence view, from the model's own posterior, minus delta per unasked candidate
        # before it in the fixed order stored with the model (the default criterion
        # eig_anchored), and the chosen item is the best one (not random)
        model = rt.model
        view = model.evidence_view(DEFAULT_EVIDENCE_STRENGTH)
        assert view is not model
        targets = [rt.model_index[t.id] for t in rt.targets]
        assert len(targets) == 5
        model_row = db.get(FittedModel, rt.model_id)
        assert model_row is not None
        (stored,) = stored_fixed_orders(model_row.metrics).values()
        order = stored["order"]
        # a study of 120 respondents is still calibrating: its last places are calibration
        n_cal = rt.calibration_items
        assert n_cal == 5
        assert [d.criterion for d in decisions[:-1]] == ["eig_anchored"] * (10 - n_cal) + [
            "calibration"
        ] * n_cal
        for d in decisions[:3]:
            assert d.criterion == "eig_anchored"
            state = svc.replay(rt, respondent, answers[: d.position])
            scores = d.scores["scores"]
            assert len(scores) == len(rt.candidates) - d.position
            for key, score in scores.items():
                rank = sum(1 for k in order[: order.index(key)] if k in scores)
                assert score == pytest.approx(
                    brute_force_eig(view, state, model.item_bank.index(key), targets)
                    - DEFAULT_DELTA * rank,
                    abs=1e-9,
                )
            assert keys[d.item_id] == max(scores, key=lambda k: scores[k])

    # get, predictions, explanation
    got = client.get(f"/api/v1/sessions/{sid}", headers=bearer(token)).json()
    assert [a["item"] for a in got["answers"]] == seen and got["question"] is None
    preds = client.get(f"/api/v1/sessions/{sid}/predictions", headers=bearer(token)).json()
    assert preds["answers"] == 10
    assert {p["item"] for p in preds["items"]}.isdisjoint(seen)
    asked_candidates = sum(k in {c.key for c in rt.candidates} for k in seen)
    assert len(preds["items"]) == len(rt.candidates) - asked_candidates
    assert len(preds["targets"]) == 5
    for p in preds["items"] + preds["targets"]:
        assert sum(p["distribution"].values()) == pytest.approx(1.0, abs=1e-9)
    weights = [p["weight"] for p in preds["personas"]]
    assert weights == sorted(weights, reverse=True) and 0 < sum(weights) <= 1 + 1e-9
    expl = client.get(f"/api/v1/sessions/{sid}/explanation", headers=bearer(token)).json()
    assert expl["item"] is None and expl["stop_reason"] == "max_questions"


def test_idempotent_retry_and_conflicting_reanswer(client: Any, live: LiveStudy) -> None:
    created = create(client, live)
    sid, token = created["session_id"], created["token"]
    item = created["question"]["item"]
    url = f"/api/v1/sessions/{sid}/answers"
    first = client.post(
        url, json={"item": item, "option": "A", "idempotency_key": "k1"}, headers=bearer(token)
    )
    retry = client.post(
        url, json={"item": item, "option": "A", "idempotency_key": "k1"}, headers=bearer(token)
    )
    assert first.status_code == retry.status_code == 200
    # a fresh answer says so; its retry is the same reply, marked as a replay
    assert first.json()["replayed"] is False
    assert "idempotent-replayed" not in first.headers
    assert retry.json() == {**first.json(), "replayed": True}
    assert retry.headers["Idempotent-Replayed"] == "true"
    # the same answer from a second tab (another key): the same result, still one row
    tab2 = client.post(
        url, json={"item": item, "option": "A", "idempotency_key": "k-tab2"}, headers=bearer(token)
    )
    assert tab2.status_code == 200 and tab2.json() == {**first.json(), "replayed": True}
    assert tab2.headers["Idempotent-Replayed"] == "true"
    changed = client.post(
        url, json={"item": item, "option": "B", "idempotency_key": "k2"}, headers=bearer(token)
    )
    assert changed.status_code == 409 and changed.json()["code"] == "answer_conflict"
    assert "idempotent-replayed" not in changed.headers
    reused = client.post(
        url, json={"item": item, "option": "B", "idempotency_key": "k1"}, headers=bearer(token)
    )
    assert reused.status_code == 409 and reused.json()["code"] == "answer_conflict"
    nxt = first.json()["question"]["item"]
    with live.session() as db:
        other = db.exec(
            select(Item.key).where(
                Item.study_id == live.study_id,
                Item.role == "question",
                Item.key != nxt,
                Item.key != item,
            )
        ).first()
        n = db.exec(select(func.count()).select_from(Answer).where(Answer.session_id == sid)).one()
        n_dec = db.exec(
            select(func.count())
            .select_from(SelectionDecision)
            .where(SelectionDecision.session_id == sid)
        ).one()
    assert n == 1 and n_dec == 2
    wrong = client.post(
        url, json={"item": other, "option": "A", "idempotency_key": "k3"}, headers=bearer(token)
    )
    assert wrong.status_code == 409 and wrong.json()["code"] == "not_current_question"
    bad_opt = client.post(
        url, json={"item": nxt, "option": "Z", "idempotency_key": "k4"}, headers=bearer(token)
    )
    assert bad_opt.status_code == 422 and bad_opt.json()["code"] == "invalid_answer"
    missing = client.post(url, json={"item": nxt}, headers=bearer(token))
    assert missing.status_code == 422 and missing.json()["code"] == "invalid_input"
    assert "idempotency_key" in missing.json()["message"]
    # a body that is not a JSON object says so, and how to send one
    for kwargs, words in (
        ({}, "request body: a JSON object is required (send it with Content-Type: "
             "application/json)"),
        ({"content": b"item=x", "headers": {"content-type": "text/plain"}},
         "request body: must be a JSON object"),
        ({"json": ["x"]}, "request body: must be a JSON object"),
        ({"content": b'{"item": ', "headers": {"content-type": "application/json"}},
         "request body: not valid JSON at character 9"),
    ):  # fmt: skip
        headers = {**bearer(token), **kwargs.pop("headers", {})}  # type: ignore[dict-item]
        bad = client.post(url, headers=headers, **kwargs)
        assert bad.status_code == 422 and bad.json()["code"] == "invalid_input"
        assert bad.json()["message"].startswith(words), bad.json()
    unknown_item = client.post(
        url, json={"item": "nope", "option": "A", "idempotency_key": "k5"}, headers=bearer(token)
    )
    assert unknown_item.status_code == 404 and unknown_item.json()["code"] == "item_not_found"
    skipped = client.post(
        url, json={"item": nxt, "option": None, "idempotency_key": "k6"}, headers=bearer(token)
    )
    assert skipped.status_code == 200 and skipped.json()["questions_answered"] == 2
    assert skipped.json()["replayed"] is False and "idempotent-replayed" not in skipped.headers
    with live.session() as db:
        rows = db.exec(select(Answer).where(Answer.session_id == sid).order_by(Answer.id)).all()
    assert [(r.option, r.idempotency_key) for r in rows] == [("A", "k1"), (None, "k6")]
    # once the session moved on, the first answer again (under any key) gets the reply
    # that answer got, every time: a tab's retry may come after another tab moved on
    for key in ("k7", "k7", "k1"):
        again = client.post(
            url, json={"item": item, "option": "A", "idempotency_key": key}, headers=bearer(token)
        )
        assert again.status_code == 200 and again.json() == {**first.json(), "replayed": True}
        assert again.headers["Idempotent-Replayed"] == "true"


def test_concurrent_duplicate_answers_store_one_row(live: LiveStudy) -> None:
    """Eight threads answer the same question at once: one row; agreeing requests succeed
    with the same result, the one that stored it fresh and the others replayed, disagreeing
    ones conflict; eight same-key retries all succeed, one fresh and seven replayed."""
    with live.session() as db:
        study = db.get(Study, live.study_id)
    assert study is not None
    started = svc.start_session(study, engine=live.engine)
    item = started.view.question.key  # type: ignore[union-attr]

    def post(option: str, key: str) -> str:
        try:
            view = svc.submit_answer(
                study,
                started.session_id,
                item_key=item,
                option=option,
                idempotency_key=key,
                engine=live.engine,
            )
            replays[key].append(view.replayed)
            return f"ok:{view.question.key if view.question else None}:{view.n_posed}"
        except svc.AnswerConflictError:
            return "conflict"

    replays: defaultdict[str, list[bool]] = defaultdict(list)

    options = ["A" if i % 2 == 0 else "B" for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(post, options, [f"key-{i}" for i in range(8)]))
    with live.session() as db:
        rows = db.exec(select(Answer).where(Answer.session_id == started.session_id)).all()
        n_dec = db.exec(
            select(func.count())
            .select_from(SelectionDecision)
            .where(SelectionDecision.session_id == started.session_id)
        ).one()
    assert len(rows) == 1 and n_dec == 2
    winner = rows[0].option
    assert {r for o, r in zip(options, results, strict=True) if o == winner} != {"conflict"}
    assert len({r for o, r in zip(options, results, strict=True) if o == winner}) == 1
    assert all(r == "conflict" for o, r in zip(options, results, strict=True) if o != winner)
    # the request that stored the row is the one fresh reply; the other agreeing ones replay
    assert replays.pop(rows[0].idempotency_key or "") == [False]
    assert all(flags == [True] for flags in replays.values())
    assert len(replays) == options.count(winner) - 1

    # the next question, retried 8 times concurrently with one key: one row, same result
    nxt = results[options.index(winner)].split(":")[1]
    item = nxt
    with ThreadPoolExecutor(max_workers=8) as pool:
        retries = list(pool.map(post, ["A"] * 8, ["same-key"] * 8))
    assert len(set(retries)) == 1 and retries[0].startswith("ok:") and retries[0].endswith(":2")
    assert sorted(replays["same-key"]) == [False] + [True] * 7
    with live.session() as db:
        assert (
            len(db.exec(select(Answer).where(Answer.session_id == started.session_id)).all()) == 2
        )


def test_authorization(client: Any, live: LiveStudy) -> None:
    url = f"/api/v1/studies/{live.slug}/sessions"
    assert client.post(url, json={}).json()["code"] == "unauthenticated"
    assert client.post(url, json={}).status_code == 401
    other = client.post(url, json={}, headers=bearer(live.other_key))
    assert other.status_code == 404 and other.json()["code"] == "study_not_found"
    missing = client.post(
        "/api/v1/studies/no-such/sessions", json={}, headers=bearer(live.owner_key)
    )
    assert missing.status_code == 404 and missing.json()["code"] == "study_not_found"
    assert client.post(url, json={}, headers=bearer(live.admin_key)).status_code == 201
    created = create(client, live)
    sid = created["session_id"]
    # a session token cannot create sessions; a token of another session gets 404
    assert client.post(url, json={}, headers=bearer(created["token"])).status_code == 401
    second = create(client, live)
    assert client.get(f"/api/v1/sessions/{sid}", headers=bearer(second["token"])).status_code == 404
    assert client.get(f"/api/v1/sessions/{sid}", headers=bearer("nonsense")).status_code == 401
    assert client.get(f"/api/v1/sessions/{sid}", headers=bearer(live.other_key)).status_code == 404
    assert client.get(f"/api/v1/sessions/{sid}", headers=bearer(live.owner_key)).status_code == 200
    bad_attr = client.post(
        url, json={"attributes": {"gender4": "Q"}}, headers=bearer(live.owner_key)
    )
    assert bad_attr.status_code == 422 and bad_attr.json()["code"] == "invalid_attributes"
    not_attr = client.post(url, json={"attributes": {"330a": "A"}}, headers=bearer(live.owner_key))
    assert not_attr.status_code == 422 and "not an attribute item" in not_attr.json()["message"]
    dup = client.post(url, json={"external_id": "x"}, headers=bearer(live.owner_key))
    assert dup.status_code == 201
    dup2 = client.post(url, json={"external_id": "x"}, headers=bearer(live.owner_key))
    assert dup2.status_code == 409 and dup2.json()["code"] == "external_id_taken"
    first = dup.json()["session_id"]
    assert f"its session is {first} (GET /api/v1/sessions/{first}" in dup2.json()["message"]
    for bad, code in (
        ("ev\u202eil", "U+202E"),
        ("a\x1b[2J", "U+001B"),
        ("a\r\nb", "U+000D"),
        ("\u200b", "invisible character (U+200B)"),  # displays as an empty id
    ):
        r = client.post(url, json={"external_id": bad}, headers=bearer(live.owner_key))
        assert r.status_code == 422 and "external_id contains" in r.json()["message"], r.text
        assert code in r.json()["message"]
    # an id the exports could not tell from another respondent's, or one a stats package
    # would trim, is refused (R_5373 and r5373x are fine)
    for bad, why in (("r5373", "has the form r<number>"), (" ext-1 ", "begins or ends with a")):
        r = client.post(url, json={"external_id": bad}, headers=bearer(live.owner_key))
        assert r.status_code == 422 and why in r.json()["message"], r.text
    for fine in ("R_5373", "r5373x", "\U0001f468\u200d\U0001f469"):  # an emoji's joiner is fine
        r = client.post(url, json={"external_id": fine}, headers=bearer(live.owner_key))
        assert r.status_code == 201, r.text
    with live.session() as db:
        spare = create_api_key("owner@example.org", session=db, name="to revoke")
    assert client.post(url, json={}, headers=bearer(spare.key)).status_code == 201
    with live.session() as db:
        revoke_api_key(spare.prefix, session=db)
    revoked = client.post(url, json={}, headers=bearer(spare.key))
    assert revoked.status_code == 401 and "revoked" in revoked.json()["message"]


def test_erasure_removes_every_row_of_the_respondent(client: Any, live: LiveStudy) -> None:
    keep = create(client, live)
    gone = create(client, live, external_id="erase-me", attributes={"gender4": "B"})
    for body in (keep, gone):
        q = body["question"]
        r = client.post(
            f"/api/v1/sessions/{body['session_id']}/answers",
            json={"item": q["item"], "option": "A", "idempotency_key": "x"},
            headers=bearer(body["token"]),
        )
        assert r.status_code == 200
    with live.session() as db:
        rid = db.get(ElicitationSession, gone["session_id"]).respondent_id  # type: ignore[union-attr]
    r = client.delete(f"/api/v1/sessions/{gone['session_id']}", headers=bearer(gone["token"]))
    assert r.status_code == 200 and r.json() == {
        "erased": True,
        "respondent_id": rid,
        "sessions": 1,
        "answers": 1,
    }
    with live.session() as db:
        assert db.get(Respondent, rid) is None
        assert (
            db.exec(select(ElicitationSession).where(ElicitationSession.respondent_id == rid)).all()
            == []
        )
        assert db.exec(select(Answer).where(Answer.session_id == gone["session_id"])).all() == []
        assert (
            db.exec(
                select(SelectionDecision).where(SelectionDecision.session_id == gone["session_id"])
            ).all()
            == []
        )
        assert db.exec(select(Respondent).where(Respondent.external_id == "erase-me")).all() == []
        record = db.exec(select(ErasureRecord).order_by(ErasureRecord.id.desc())).first()
        assert record is not None
        assert (record.n_sessions, record.n_answers, record.study_id) == (1, 1, live.study_id)
        # the other respondent is untouched
        assert db.exec(select(Answer).where(Answer.session_id == keep["session_id"])).all()
    after = client.get(f"/api/v1/sessions/{gone['session_id']}", headers=bearer(gone["token"]))
    assert after.status_code == 401
    # the erased respondent was the newest: the next one gets new ids, never the erased ones
    # (SQLite would reuse the largest id without AUTOINCREMENT)
    nxt = create(client, live, external_id="after-erase")
    with live.session() as db:
        new_rid = db.get(ElicitationSession, nxt["session_id"]).respondent_id  # type: ignore[union-attr]
    assert nxt["session_id"] > gone["session_id"] and new_rid > rid


def test_openapi_documents_the_api_with_examples(client: Any) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {
        "/api/v1/studies/{slug}/sessions",
        "/api/v1/sessions/{session_id}",
        "/api/v1/sessions/{session_id}/answers",
        "/api/v1/sessions/{session_id}/predictions",
        "/api/v1/sessions/{session_id}/explanation",
    } <= set(paths)
    assert not any(p.startswith("/s/") for p in paths)
    answer_in = spec["components"]["schemas"]["AnswerIn"]
    assert answer_in["examples"][0]["idempotency_key"]
    # every served example is a valid body as pasted, the skip's null option included
    # (FastAPI drops nulls from the document it builds)
    for example in answer_in["examples"]:
        AnswerIn.model_validate(example)
    assert {"item": "330a", "option": None, "idempotency_key": "6f1c2a9e-skip-1"} in answer_in[
        "examples"
    ]
    responses = paths["/api/v1/sessions/{session_id}/answers"]["post"]["responses"]
    assert {"200", "401", "404", "409", "422"} <= set(responses)


def test_every_error_code_is_listed_and_documented() -> None:
    """docs/api.md's error table is ``ERROR_CODES``, and every error class's code is in it
    (the group-round errors answer pages, not the API)."""
    import re
    from pathlib import Path

    import app.main  # noqa: F401  (imports every error class)
    from app.errors import PriorlyError
    from app.routes.api_v1 import ERROR_CODES

    doc = (Path(__file__).parents[4] / "docs" / "api.md").read_text(encoding="utf-8")
    table = dict(re.findall(r"^\| `([a-z_]+)` \| ([0-9x]+) \| ", doc, flags=re.M))
    assert table == {k: v.split(":")[0] for k, v in ERROR_CODES.items()}

    def subclasses(cls: type) -> list[type]:
        return [c for s in cls.__subclasses__() for c in (s, *subclasses(s))]

    pages_only = {"round_closed", "round_link_not_found", "group_budget"}
    codes = {c.code for c in subclasses(PriorlyError)} - pages_only
    assert codes <= set(ERROR_CODES), codes - set(ERROR_CODES)


def test_a_client_finishes_a_session_early(client: Any, live: LiveStudy) -> None:
    """After 2 answers the client finishes: completed, stop reason ``finished``, no more
    answers (409), finishing again returns the same; the respondent counts as completed in
    the listing."""
    created = create(client, live, external_id="finish-early")
    sid, token = created["session_id"], created["token"]
    view = answer_first_options(client, created, 2, "f")
    pending = view["question"]["item"]
    before = client.get(f"/api/v1/sessions/{sid}/explanation", headers=bearer(token)).json()
    assert (before["item"], before["stop_reason"]) == (pending, None)
    done = client.post(f"/api/v1/sessions/{sid}/finish", headers=bearer(token))
    assert done.status_code == 200, done.text
    body = done.json()
    assert (body["status"], body["phase"], body["question"]) == ("completed", "done", None)
    assert body["stop_reason"] == "finished" and body["questions_answered"] == 2
    # the explanation agrees: the pending question was never asked to an end
    why = client.get(f"/api/v1/sessions/{sid}/explanation", headers=bearer(token)).json()
    assert (why["item"], why["stop_reason"], why["position"]) == (None, "finished", 2)
    assert why["scores"] == before["scores"]
    again = client.post(f"/api/v1/sessions/{sid}/finish", headers=bearer(live.owner_key))
    assert again.status_code == 200 and again.json() == body
    late = client.post(
        f"/api/v1/sessions/{sid}/answers",
        json={"item": pending, "option": None, "idempotency_key": "late"},
        headers=bearer(token),
    )
    assert late.status_code == 409 and late.json()["code"] == "session_closed"
    got = client.get(f"/api/v1/sessions/{sid}", headers=bearer(token)).json()
    assert got["status"] == "completed" and len(got["answers"]) == 2
    for a in got["answers"]:  # UTC with its offset on both databases
        assert datetime.fromisoformat(a["answered_at"]).utcoffset() == timedelta(0), a
    with live.session() as db:
        sess = db.get(ElicitationSession, sid)
        assert sess is not None and sess.status == "completed" and sess.completed_at is not None


def test_a_budget_lowered_mid_session_shows_the_question_reached(
    client: Any, live: LiveStudy
) -> None:
    """The researcher lowers ``max_questions`` from the study's to 2 while a session's 4th
    question is pending: the session shows "4 of 4" (not "4 of 2"), takes that answer, and
    stops with reason ``max_questions`` after it; a new session gets the new budget."""
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        before = dict(study.settings or {})
    created = create(client, live, external_id="budget-lowered")
    sid, token = created["session_id"], created["token"]
    view = answer_first_options(client, created, 3, "b")
    assert view["question"]["number"] == 4
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        lowered = StudySettings.model_validate(before).model_dump(mode="json")
        lowered["budgets"]["max_questions"] = 2
        lowered["budgets"]["min_questions"] = 0
        lowered["calibration_items"] = 0
        update_settings(study, lowered, session=db)
    try:
        got = client.get(f"/api/v1/sessions/{sid}", headers=bearer(token)).json()
        assert (got["questions_answered"], got["max_questions"]) == (3, 4)
        assert got["question"]["number"] == 4
        r = client.post(
            f"/api/v1/sessions/{sid}/answers",
            json={"item": got["question"]["item"], "option": "A", "idempotency_key": "b3"},
            headers=bearer(token),
        )
        done = r.json()
        assert (done["phase"], done["stop_reason"]) == ("done", "max_questions"), done
        assert (done["questions_answered"], done["max_questions"]) == (4, 4)
        fresh = create(client, live, external_id="budget-lowered-new")
        assert fresh["max_questions"] == 2
    finally:
        with live.session() as db:
            study = db.get(Study, live.study_id)
            assert study is not None
            update_settings(study, before, session=db)
