"""Results through the API (GET /api/v1/studies, .../responses, .../predictions) on a real
database (SQLite file and PostgreSQL), checked against the CSV exports of the same study.

Sessions are made and answered through the API itself (in-process); the results are read
over HTTP from ``priorly serve`` running in its own process on the same database, and the
pages are walked with a small limit so that several pages and the last partial page are
exercised.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlmodel import select

from app.auth import share_study
from app.services.apikeys import create_api_key, create_researcher
from app.services.export import SKIP_MARK, codebook_jsonl, csv_predictions, csv_wide
from app.session import study_settings
from app.tables import ElicitationSession, Item, Respondent, Study
from tests.support.live_study import LiveStudy, app_client, ces_sample_study, priorly_serve

N_SESSIONS = 7


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def _answer_some(client: Any, body: dict[str, Any], token: str, n: int, skip_at: int) -> None:
    """Answer ``n`` questions of a new session (the last option; a skip at ``skip_at``)."""
    sid = body["session_id"]
    for k in range(n):
        q = body["question"]
        if q is None:
            return
        option = None if (k == skip_at and body["allow_skip"]) else q["options"][-1]["letter"]
        r = client.post(
            f"/api/v1/sessions/{sid}/answers",
            json={"item": q["item"], "option": option, "idempotency_key": f"{sid}-{k}"},
            headers=bearer(token),
        )
        assert r.status_code == 200, r.text
        body = r.json()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStudy]:
    """A prepared study with ``N_SESSIONS`` sessions answered to different lengths."""
    folder = tmp_path_factory.mktemp("results")
    for study in ces_sample_study(request.param, folder, 120):
        with app_client(study.url) as client:
            for i in range(N_SESSIONS):
                extra = {"external_id": f"ext-{i}"} if i % 2 else {}
                r = client.post(
                    f"/api/v1/studies/{study.slug}/sessions",
                    json=extra,
                    headers=bearer(study.owner_key),
                )
                assert r.status_code == 201, r.text
                _answer_some(client, r.json(), r.json()["token"], n=i, skip_at=1)
        with study.session() as db:  # as if ext-1 had come from /s/{slug}?PROLIFIC_PID=pp-1
            resp = db.exec(select(Respondent).where(Respondent.external_id == "ext-1")).one()
            resp.panel_params = {"PROLIFIC_PID": "pp-1"}
            db.add(resp)
            db.commit()
        yield study


@pytest.fixture(scope="module")
def client(live: LiveStudy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An HTTP client of ``priorly serve`` running in its own process on the study's
    database: the product or pipeline's view, over a real socket."""
    import httpx

    folder = tmp_path_factory.mktemp("results-server")
    with priorly_serve(live.url, folder) as base, httpx.Client(base_url=base, timeout=60) as c:
        yield c


def walk(client: Any, url: str, key: str, limit: int, field: str) -> list[list[dict[str, Any]]]:
    """Every page of a listing, following next_cursor."""
    pages: list[list[dict[str, Any]]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        r = client.get(url, params=params, headers=bearer(key))
        assert r.status_code == 200, r.text
        body = r.json()
        pages.append(body[field])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 100, "the cursor never ends"


def _csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text.lstrip("\ufeff"))))


def _study(live: LiveStudy, db: Any) -> Study:
    study = db.get(Study, live.study_id)
    assert study is not None
    return study


def test_studies_lists_what_the_key_may_see(client: Any, live: LiveStudy) -> None:
    def slugs(key: str) -> list[str]:
        r = client.get("/api/v1/studies", headers=bearer(key))
        assert r.status_code == 200, r.text
        return [s["slug"] for s in r.json()["studies"]]

    assert slugs(live.owner_key) == [live.slug]
    assert slugs(live.admin_key) == [live.slug]
    assert slugs(live.other_key) == []
    row = client.get("/api/v1/studies", headers=bearer(live.owner_key)).json()["studies"][0]
    assert row["status"] == "published" and row["items"] > 0 and row["respondents"] >= N_SESSIONS
    # a share makes the study visible to that researcher, with its results
    with live.session() as db:
        create_researcher("reader@example.org", session=db)
        reader_key = create_api_key("reader@example.org", session=db).key
        assert slugs(reader_key) == []
        share_study(_study(live, db), "reader@example.org", session=db)
    assert slugs(reader_key) == [live.slug]
    r = client.get(f"/api/v1/studies/{live.slug}/responses", headers=bearer(reader_key))
    assert r.status_code == 200 and len(r.json()["responses"]) == N_SESSIONS


def test_responses_pages_cover_every_session_once_with_the_exports_data(
    client: Any, live: LiveStudy
) -> None:
    url = f"/api/v1/studies/{live.slug}/responses"
    pages = walk(client, url, live.owner_key, limit=3, field="responses")
    assert [len(p) for p in pages] == [3, 3, 1]
    rows = [r for p in pages for r in p]
    ids = [r["session_id"] for r in rows]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    with live.session() as db:
        study = _study(live, db)
        want_ids = sorted(
            db.exec(
                select(ElicitationSession.id).where(ElicitationSession.study_id == live.study_id)
            ).all()
        )
        wide = _csv("".join(csv_wide(study, session=db)))
        codebook = [json.loads(x) for x in codebook_jsonl(study, session=db)]
    assert ids == want_ids
    labels = {c["id"]: c["options"] for c in codebook}
    roles = {c["id"]: c["role"] for c in codebook}
    by_session = {int(w["session_id"]): w for w in wide}
    assert len(by_session) == len(rows)
    skipped = 0
    for r in rows:
        w = by_session[r["session_id"]]
        for meta in ("respondent_id", "source", "status"):
            assert r[meta] == w[meta]
        assert (r["started_at"] or "") == w["started_at"]
        assert (r["completed_at"] or "") == w["completed_at"]
        assert r["earlier_starts"] == int(w["earlier_starts"])
        panel = {k.removeprefix("panel."): v for k, v in w.items() if k.startswith("panel.")}
        assert r["panel"] == {k: v for k, v in panel.items() if v}
        assert r["panel"] == ({"PROLIFIC_PID": "pp-1"} if r["respondent_id"] == "ext-1" else {})
        started = datetime.fromisoformat(r["started_at"])
        assert started.utcoffset() == timedelta(0), r["started_at"]  # UTC on both databases
        cells = {
            a["item"]: a["option"] if a["option"] is not None else SKIP_MARK for a in r["answers"]
        }
        assert cells == {k: v for k, v in w.items() if k in labels and v != ""}
        for a in r["answers"]:
            assert a["role"] == roles[a["item"]]
            if a["option"] is None:
                skipped += 1
                assert a["label"] is None
            else:
                assert a["label"] == labels[a["item"]][a["option"]]
    assert any(r["respondent_id"] == "ext-1" for r in rows)
    assert sum(len(r["answers"]) for r in rows) >= sum(range(N_SESSIONS))
    # one page of everything equals the walk
    whole = client.get(url, params={"limit": 500}, headers=bearer(live.owner_key)).json()
    assert whole["responses"] == rows and whole["next_cursor"] is None
    # an exact multiple of the limit ends without an empty page
    assert [len(p) for p in walk(client, url, live.owner_key, 7, "responses")] == [7]
    assert skipped > 0, "a skipped question comes back as option null"


def test_predictions_pages_equal_the_predictions_export(client: Any, live: LiveStudy) -> None:
    url = f"/api/v1/studies/{live.slug}/predictions"
    pages = walk(client, url, live.admin_key, limit=2, field="predictions")
    assert [len(p) for p in pages] == [2, 2, 2, 1]
    rows = [r for p in pages for r in p]
    with live.session() as db:
        study = _study(live, db)
        exported = _csv("".join(csv_predictions(study, session=db)))
        codebook = [json.loads(x) for x in codebook_jsonl(study, session=db)]
    labels = {c["id"]: c["options"] for c in codebook}
    assert exported, "the study has targets: the export has rows"
    want: dict[tuple[int, str], dict[str, float]] = {}
    best: dict[tuple[int, str], str] = {}
    meta: dict[int, tuple[str, str, int]] = {}
    for e in exported:
        key = (int(e["session_id"]), e["target"])
        want.setdefault(key, {})[e["option"]] = float(e["probability"])
        if e["predicted"] == "1":
            best[key] = e["option"]
        meta[int(e["session_id"])] = (e["respondent_id"], e["status"], int(e["n_answers"]))
    assert sorted(meta) == [r["session_id"] for r in rows]
    got = 0
    for r in rows:
        assert (r["respondent_id"], r["status"], r["answers"]) == meta[r["session_id"]]
        for t in r["targets"]:
            key = (r["session_id"], t["item"])
            assert set(t["distribution"]) == set(want[key])
            for letter, p in t["distribution"].items():
                assert abs(p - want[key][letter]) <= 5e-7  # the CSV's 6 decimals
                got += 1
            assert abs(sum(t["distribution"].values()) - 1) < 1e-5
            assert t["predicted"] == best[key]
            assert t["label"] == labels[t["item"]][t["predicted"]]
    assert got == len(exported)
    # the answers the predictions depend on: a longer session moves away from the prior
    first, last = rows[0], rows[-1]
    assert first["answers"] == 0 and last["answers"] > 0
    assert first["targets"] != last["targets"]


def test_a_study_describes_its_items_for_a_client(client: Any, live: LiveStudy) -> None:
    r = client.get(f"/api/v1/studies/{live.slug}", headers=bearer(live.owner_key))
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["slug"], body["status"]) == (live.slug, "published")
    with live.session() as db:
        items = db.exec(
            select(Item).where(Item.study_id == live.study_id).order_by(Item.position, Item.id)
        ).all()
        settings = study_settings(_study(live, db))
    assert body["max_questions"] == settings.budgets.max_questions
    assert [(i["key"], i["role"], i["question"]) for i in body["items"]] == [
        (it.key, it.role, it.question) for it in items
    ]
    assert [[(o["letter"], o["label"]) for o in i["options"]] for i in body["items"]] == [
        [(str(o[0]), str(o[1])) for o in it.options] for it in items
    ]
    # what it lists is what a session accepts: every attribute key, with one of its letters
    attrs = {
        i["key"]: i["options"][-1]["letter"] for i in body["items"] if i["role"] == "attribute"
    }
    started = client.post(
        f"/api/v1/studies/{live.slug}/sessions",
        json={"attributes": attrs},
        headers=bearer(live.owner_key),
    )
    assert started.status_code == 201, started.text


def test_a_study_the_key_may_not_see_is_404(client: Any, live: LiveStudy) -> None:
    for path in ("responses", "predictions", ""):
        for slug in (live.slug, "no-such-study"):
            url = f"/api/v1/studies/{slug}/{path}".rstrip("/")
            r = client.get(url, headers=bearer(live.other_key))
            assert r.status_code == 404, r.text
            assert r.json()["code"] == "study_not_found"
        # a session token is not a researcher's key; no credential is 401
        url = f"/api/v1/studies/{live.slug}/{path}".rstrip("/")
        r = client.get(url)
        assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
        r = client.get(url, headers=bearer("st_made_up"))
        assert r.status_code == 401 and "API key" in r.json()["message"]


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("name", "value", "encode"),
    [
        ("cursor", "not a cursor!", False),
        ("cursor", "%%%", False),
        ("cursor", "x" * 201, False),
        ("cursor", "predictions:{study}:1", True),  # another listing's
        ("cursor", "responses:999999:1", True),  # another study's
        ("cursor", "responses:{study}:-1", True),
        ("cursor", "responses:{study}:99999999999", True),  # past a 32-bit id
        ("limit", "0", False),
        ("limit", "501", False),
        ("limit", "ten", False),
        ("limit", "1.0", False),  # int() would take these: refused as not plain digits
        ("limit", "1_0", False),
        ("limit", " 1", False),
    ],
)
def test_bad_cursor_or_limit_is_422_naming_it(
    client: Any, live: LiveStudy, name: str, value: str, encode: bool
) -> None:
    if encode:
        value = _cursor(value.format(study=live.study_id))
    r = client.get(
        f"/api/v1/studies/{live.slug}/responses",
        params={name: value},
        headers=bearer(live.owner_key),
    )
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "invalid_input", body
    assert re.match(rf"(query\.)?{name}: ", body["message"]), body


def test_prediction_limit_is_bounded_lower_than_responses(client: Any, live: LiveStudy) -> None:
    url = f"/api/v1/studies/{live.slug}/predictions"
    r = client.get(url, params={"limit": 201}, headers=bearer(live.owner_key))
    assert r.status_code == 422 and "limit" in r.json()["message"]
    cursor = client.get(
        f"/api/v1/studies/{live.slug}/responses",
        params={"limit": 1},
        headers=bearer(live.owner_key),
    ).json()["next_cursor"]
    # a responses cursor is not a predictions cursor
    r = client.get(url, params={"cursor": cursor}, headers=bearer(live.owner_key))
    assert r.status_code == 422 and "cursor" in r.json()["message"]
