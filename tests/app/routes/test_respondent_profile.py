"""One respondent's predicted answers through HTTP: the admin profile page
``/admin/studies/{slug}/respondents/{id}`` (linked from the Respondents tab) and the API
(session predictions and profile, the results listing), on the enumerable 2-class model
of tests/support/tiny_model.py, on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.services.apikeys import create_api_key
from app.services.respondents import live_respondents
from app.tables import Researcher, utcnow
from tests.support.admin import csrf, login
from tests.support.tiny_model import NEW, OLD, TinyStudy, by_hand, make_tiny_study


@pytest.fixture
def tiny(db: Session, alice: Researcher) -> TinyStudy:
    return make_tiny_study(db, alice)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_profile_page_shows_answers_and_predictions(
    client: TestClient, tiny: TinyStudy, db: Session
) -> None:
    login(client, "alice@example.org")
    slug, r1 = tiny.study.slug, tiny.respondents["r1"]
    listing = client.get(f"/admin/studies/{slug}/respondents")
    assert f'href="http://localhost/admin/studies/{slug}/respondents/{r1}"' in listing.text
    r4 = tiny.respondents["r4"]  # a preview: listed, not linked (it has no profile)
    assert f'href="http://localhost/admin/studies/{slug}/respondents/{r4}"' not in listing.text
    # each listed by the id the exports give it: the external id, else r<id>
    assert '<td>r4 <span class="muted">(preview)</span></td>' in listing.text
    assert 'aria-label="Open respondent r1">r1</a>' in listing.text
    # an unfinished respondent reads as the dashboard counts them: in progress, then
    # dropped once idle for longer than the study's drop_after_minutes (60)
    rows = {r.id: r for r in live_respondents(tiny.study, session=db)}
    assert rows[r1].status == "in progress" and "<td>in progress</td>" in listing.text
    later = utcnow() + timedelta(minutes=61)
    assert {r.id: r.status for r in live_respondents(tiny.study, session=db, now=later)}[
        r1
    ] == "dropped"

    page = client.get(f"/admin/studies/{slug}/respondents/{r1}")
    assert page.status_code == 200
    html = page.text
    assert 'id="respondent-status">in progress<' in html
    assert "yes, 2 earlier from this browser" in html
    given = html.split('id="given"')[1].split("</table>")[0]
    assert re.findall(r'data-item="(\w+)"', given) == ["x", "a"]
    assert 'no <span class="muted">(B)</span>' in given  # x = B with its label
    predicted = html.split('id="predicted"')[1].split("</table>")[0]
    assert re.findall(r'data-item="(\w+)"', predicted) == ["t"]
    pct = round(100 * (1 - by_hand(OLD, {"x": "B", "a": "A"})["t"]))
    assert f"<td>{pct}%</td>" in predicted and pct == 79
    assert f"model {tiny.old_id}, the one their survey in progress uses" in html
    assert f'action="http://localhost/admin/studies/{slug}/respondents/{r1}/erase"' in html

    # r2 declined x and skipped a: both shown as such, and predicted with t
    r2 = client.get(f"/admin/studies/{slug}/respondents/{tiny.respondents['r2']}").text
    assert "<em>declined</em>" in r2 and "<em>skipped</em>" in r2
    assert re.findall(r'data-item="(\w+)"', r2.split('id="predicted"')[1]) == ["x", "a", "t"]

    # an imported respondent: its stored answers, the active model, no erase button
    h1 = client.get(f"/admin/studies/{slug}/respondents/{tiny.respondents['h1']}").text
    assert "imported history" in h1 and "/erase" not in h1
    assert f"the study's active model {tiny.new_id}" in h1

    # the erase button works from the profile
    r = client.post(
        f"/admin/studies/{slug}/respondents/{r1}/erase",
        data={"csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert r.status_code == 303
    gone = client.get(f"/admin/studies/{slug}/respondents/{r1}")
    assert gone.status_code == 404


def test_profile_page_refuses_unknown_foreign_and_preview_respondents(
    client: TestClient, tiny: TinyStudy, db: Session, alice: Researcher, bob: Researcher
) -> None:
    other = make_tiny_study(db, alice, name="Other tiny")
    login(client, "alice@example.org")
    slug = tiny.study.slug
    for rid in (999999, other.respondents["r1"], tiny.respondents["r4"]):
        r = client.get(f"/admin/studies/{slug}/respondents/{rid}")
        assert r.status_code == 404, rid
        assert f"no respondent {rid} in study {slug!r}" in r.text.replace("&#39;", "'")
    assert client.get(f"/admin/studies/{slug}/respondents/0").status_code == 422
    # another researcher cannot see the study at all
    client.cookies.clear()
    login(client, "bob@example.org")
    r = client.get(f"/admin/studies/{slug}/respondents/{tiny.respondents['r1']}")
    assert r.status_code == 404


def test_api_predictions_and_profile_cover_every_item(
    client: TestClient, tiny: TinyStudy, db: Session
) -> None:
    sid, token = tiny.sessions["r2"], tiny.tokens["r2"]
    prior = by_hand(OLD, {})
    r = client.get(f"/api/v1/sessions/{sid}/predictions", headers=_bearer(token))
    assert r.status_code == 200, r.text
    body = r.json()
    # the keys there were before, unchanged
    assert body["answers"] == 1 and [p["item"] for p in body["targets"]] == ["t"]
    assert body["items"] == []  # the only question was asked (and skipped)
    assert body["targets"][0]["distribution"]["A"] == pytest.approx(prior["t"], abs=1e-12)
    # every unanswered item, attributes included
    assert body["model_id"] == tiny.old_id
    assert [(p["item"], p["role"], p["status"]) for p in body["predicted"]] == [
        ("x", "attribute", "skipped"),
        ("a", "question", "skipped"),
        ("t", "target", "not asked"),
    ]
    for p in body["predicted"]:
        pa = prior[p["item"]]
        assert p["predicted"] == ("A" if pa >= 0.5 else "B")
        assert p["label"] == ("yes" if pa >= 0.5 else "no")
        assert p["probability"] == pytest.approx(max(pa, 1 - pa), abs=1e-12)
        assert p["distribution"] == pytest.approx({"A": pa, "B": 1 - pa}, abs=1e-12)

    prof = client.get(f"/api/v1/sessions/{sid}/profile", headers=_bearer(token)).json()
    assert prof["predicted"] == body["predicted"]
    assert {"session_id", "answers", "model_family", "criteria", "items", "summary"} <= set(prof)

    # r3 (no decision recorded): the active model
    r3 = client.get(
        f"/api/v1/sessions/{tiny.sessions['r3']}/predictions", headers=_bearer(tiny.tokens["r3"])
    ).json()
    assert r3["model_id"] == tiny.new_id
    assert [p["item"] for p in r3["items"]] == ["a"]
    assert r3["predicted"][-1]["distribution"]["A"] == pytest.approx(
        by_hand(NEW, {})["t"], abs=1e-12
    )


def test_api_results_predictions_list_every_unanswered_item(
    client: TestClient, tiny: TinyStudy, db: Session
) -> None:
    key = create_api_key("alice@example.org", session=db).key
    url = f"/api/v1/studies/{tiny.study.slug}/predictions"
    first = client.get(url, params={"limit": 2}, headers=_bearer(key))
    assert first.status_code == 200, first.text
    page = first.json()
    rest = client.get(url, params={"cursor": page["next_cursor"]}, headers=_bearer(key)).json()
    rows = page["predictions"] + rest["predictions"]
    assert rest["next_cursor"] is None
    assert [r["respondent_id"] for r in rows] == ["r1", "r2", "r3"]  # no preview, live only
    r1 = rows[0]
    assert r1["model_id"] == tiny.old_id and r1["answers"] == 1
    assert [t["item"] for t in r1["targets"]] == ["t"]
    assert (r1["targets"][0]["status"], r1["targets"][0]["answer"]) == ("not asked", None)
    assert [(i["item"], i["predicted"], i["label"]) for i in r1["items"]] == [("t", "B", "no")]
    assert r1["items"][0]["probability"] == pytest.approx(1 - 2.3 / 11, abs=1e-12)
    assert [i["item"] for i in rows[1]["items"]] == ["x", "a", "t"]
