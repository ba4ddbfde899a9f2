"""GET /api/v1/sessions/{id}/profile: the preference profile of a session (issue 6).

A real database (SQLite file, and PostgreSQL when configured), the real CES data, the app
through TestClient. The profile is checked against the session's own predictions and
against the expected level computed from its distribution; unknown and foreign sessions
get 404.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import DATASETS_DIR, write_small_dataset
from live_study import LiveStudy, app_client, fresh_database_url, make_live_study
from sqlmodel import select

from app.services import sessions as svc
from app.tables import Item


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStudy]:
    folder = tmp_path_factory.mktemp("profile")
    for url in fresh_database_url(request.param, folder):
        svc.clear_runtime_cache()
        data = write_small_dataset(DATASETS_DIR / "ces", folder / "ces120", 120)
        study = make_live_study(url, data)
        yield study
        study.engine.dispose()


@pytest.fixture
def client(live: LiveStudy) -> Iterator[Any]:
    with app_client(live.url) as c:
        yield c


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def start(client: Any, live: LiveStudy, answers: int) -> tuple[int, str, list[str]]:
    r = client.post(
        f"/api/v1/studies/{live.slug}/sessions",
        json={"attributes": {"gender4": "B"}},
        headers=bearer(live.owner_key),
    )
    assert r.status_code == 201, r.text
    body = r.json()
    sid, token, asked = body["session_id"], body["token"], []
    for n in range(answers):
        q = body["question"]
        asked.append(q["item"])
        r = client.post(
            f"/api/v1/sessions/{sid}/answers",
            json={"item": q["item"], "option": "A", "idempotency_key": f"p{n}"},
            headers=bearer(token),
        )
        assert r.status_code == 200, r.text
        body = r.json()
    return sid, token, asked


def test_profile_ranks_items_and_matches_the_predictions(client: Any, live: LiveStudy) -> None:
    sid, token, asked = start(client, live, 2)
    r = client.get(f"/api/v1/sessions/{sid}/profile", headers=bearer(token))
    assert r.status_code == 200, r.text
    prof = r.json()
    assert prof["session_id"] == sid and prof["answers"] == 2 and prof["criteria"] == []
    entries = prof["items"]
    probs = [e["probability"] for e in entries]
    assert probs == sorted(probs, reverse=True)
    by_key = {e["item"]: e for e in entries}
    for e in entries:
        assert sum(e["distribution"]) == pytest.approx(1.0)
        assert e["probability"] == pytest.approx(max(e["distribution"]))
    assert {k for k, e in by_key.items() if e["observed"]} == {*asked, "gender4"}
    # the same distributions as the session's predictions endpoint
    pred = client.get(f"/api/v1/sessions/{sid}/predictions", headers=bearer(token)).json()
    for p in pred["items"] + pred["targets"]:
        got = by_key[p["item"]]["distribution"]
        assert got == pytest.approx(list(p["distribution"].values()), abs=1e-12)
    top = entries[0]
    assert top["question"] in prof["summary"] and top["option"] in prof["summary"]
    # the study owner's API key sees the same profile
    again = client.get(f"/api/v1/sessions/{sid}/profile", headers=bearer(live.owner_key))
    assert again.status_code == 200 and again.json() == prof


def test_preference_criteria_are_ranked_by_expected_level(client: Any, live: LiveStudy) -> None:
    with live.session() as db:
        rows = db.exec(
            select(Item).where(Item.study_id == live.study_id, Item.key.in_(["educ", "faminc_new"]))  # type: ignore[attr-defined]
        ).all()
        for row in rows:
            row.is_preference_criterion = True
            db.add(row)
        db.commit()
    try:
        sid, token, _ = start(client, live, 1)
        prof = client.get(f"/api/v1/sessions/{sid}/profile", headers=bearer(token)).json()
        crit = prof["criteria"]
        assert {c["item"] for c in crit} == {"educ", "faminc_new"}
        for c in crit:
            want = sum((k + 1) * p for k, p in enumerate(c["distribution"]))
            assert c["expected_level"] == pytest.approx(want) and c["criterion"]
        levels = [c["expected_level"] for c in crit]
        assert levels == sorted(levels, reverse=True)
        assert "cares about most" in prof["summary"]
    finally:
        with live.session() as db:
            for row in db.exec(select(Item).where(Item.study_id == live.study_id)).all():
                row.is_preference_criterion = False
                db.add(row)
            db.commit()


def test_profile_of_unknown_or_foreign_session_is_404(client: Any, live: LiveStudy) -> None:
    sid, token, _ = start(client, live, 0)
    other_sid, other_token, _ = start(client, live, 0)
    url = f"/api/v1/sessions/{sid}/profile"
    assert client.get(url, headers=bearer(other_token)).status_code == 404
    assert client.get(url, headers=bearer(live.other_key)).status_code == 404
    missing = client.get("/api/v1/sessions/999999/profile", headers=bearer(live.owner_key))
    assert missing.status_code == 404
    assert client.get(url).status_code == 401
    assert client.get(url, headers=bearer(token)).status_code == 200
