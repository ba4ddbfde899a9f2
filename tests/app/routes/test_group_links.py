"""A group round member's link ``/g/{token}`` through TestClient: the page while the
study is closed (paused, nothing stored, back once published), a second device after the
answer, and the one-question page's words. The whole round flow is in
``tests/app/services/test_group_rounds.py``."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.settings import Settings
from app.tables import Answer, GroupRoundMember, Researcher, Study
from tests.support.admin import csrf, login
from tests.support.group_round import group_study, open_test_round


def _n_answers(engine: Engine, round_id: int) -> int:
    with Session(engine) as s:
        sessions = s.exec(
            select(GroupRoundMember.session_id).where(GroupRoundMember.round_id == round_id)
        ).all()
        return len(s.exec(select(Answer).where(Answer.session_id.in_(sessions))).all())  # type: ignore[attr-defined]


def _set_status(client: TestClient, study: Study, status: str) -> str:
    """Press Publish or Close on the study page; the notice it redirects to."""
    r = client.post(
        f"/admin/studies/{study.slug}/status",
        data={"status": status, "csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    return client.get(r.headers["location"]).text


def test_a_closed_study_pauses_its_round_links_and_publishing_brings_them_back(
    client: TestClient,
    engine: Engine,
    db: Session,
    settings: Settings,
    ces_study: Study,
    alice: Researcher,
) -> None:
    study = group_study(db, ces_study, rounds=1, respondents_per_round=3)
    rnd, links = open_test_round(engine, settings, study)
    member = TestClient(client.app, base_url="http://localhost")  # no admin cookies
    page = member.get(links[0])  # shown before the close
    assert page.status_code == 200
    key = re.search(r'name="item" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    letter = re.findall(r'name="option" value="([^"]+)"', page.text)[0]

    login(client, "alice@example.org")
    before = client.get(f"/admin/studies/{study.slug}").text
    assert "group round 1 is open: its members cannot answer while the study is closed" in before
    after = _set_status(client, study, "closed")
    assert "study closed; group round 1 is open: its members cannot answer" in after
    assert 'id="status-round"' in after
    assert 'id="round-paused"' in client.get(f"/admin/studies/{study.slug}/groups/1").text

    for got in (
        member.get(links[0]),
        member.post(links[0], data={"item": key, "option": letter, "idempotency_key": "p1"}),
        member.post(links[1], data={"skip": "1", "idempotency_key": "p2"}),
        member.post(links[2], data={"option": "ZZ", "idempotency_key": "p3"}),
    ):
        assert got.status_code == 409
        assert "not accepting answers at the moment" in got.text
        assert "not valid" not in got.text
    assert _n_answers(engine, rnd.id or 0) == 0
    assert member.get("http://localhost/g/not-a-token").status_code == 404

    after = _set_status(client, study, "published")
    assert "study published" in after and "publish it again to let them" not in after
    assert 'id="status-round"' not in after
    assert member.get(links[0]).status_code == 200
    ok = member.post(
        links[0],
        data={"item": key, "option": letter, "idempotency_key": "p1"},
        follow_redirects=False,
    )
    assert ok.status_code == 303
    assert _n_answers(engine, rnd.id or 0) == 1
    # an answered member is thanked, also while the study is closed again
    _set_status(client, study, "closed")
    thanks = member.get(links[0])
    assert thanks.status_code == 200 and "Your reply was recorded" in thanks.text


def test_a_second_device_after_the_answer_sees_plain_words(
    client: TestClient, engine: Engine, db: Session, settings: Settings, ces_study: Study
) -> None:
    """The member answers on one device; the page shown earlier on another posts another
    option: 409 in a respondent's words (no item key, session, or stored option)."""
    study = group_study(db, ces_study, rounds=1, respondents_per_round=2)
    rnd, links = open_test_round(engine, settings, study)
    phone, laptop = (TestClient(client.app, base_url="http://localhost") for _ in range(2))
    shown = laptop.get(links[0]).text
    key = re.search(r'name="item" value="([^"]+)"', shown).group(1)  # type: ignore[union-attr]
    letters = re.findall(r'name="option" value="([^"]+)"', shown)
    idem = re.search(r'name="idempotency_key" value="([^"]+)"', shown).group(1)  # type: ignore[union-attr]
    phone_page = phone.get(links[0]).text
    phone_idem = re.search(r'name="idempotency_key" value="([^"]+)"', phone_page).group(1)  # type: ignore[union-attr]
    ok = phone.post(
        links[0], data={"item": key, "option": letters[0], "idempotency_key": phone_idem}
    )
    assert ok.status_code == 200 and "Your answer was saved" in ok.text
    for data in (
        {"item": key, "option": letters[-1], "idempotency_key": idem},  # the other page
        {"item": key, "option": letters[-1], "idempotency_key": phone_idem},  # same key
    ):
        late = laptop.post(links[0], data=data)
        assert late.status_code == 409
        assert "You have already answered this question; thank you." in late.text
        text = re.sub(r"<[^>]+>", " ", late.text)
        assert key not in text and "session" not in text and f"({letters[0]})" not in text
    assert _n_answers(engine, rnd.id or 0) == 1
    # the same answer again (a retry from the other page) is the thanks, not a conflict
    again = laptop.post(links[0], data={"item": key, "option": letters[0], "idempotency_key": idem})
    assert again.status_code == 200 and "Thank you" in again.text


def test_the_member_page_asks_one_question_without_a_count(
    client: TestClient, engine: Engine, db: Session, settings: Settings, ces_study: Study
) -> None:
    """No "Question 1 of at most 1" nor progress bar; the button submits the answer."""
    study = group_study(db, ces_study, rounds=1, respondents_per_round=1)
    _, links = open_test_round(engine, settings, study)
    page = TestClient(client.app, base_url="http://localhost").get(links[0])
    assert page.status_code == 200
    assert "of at most" not in page.text and "<progress" not in page.text
    assert ">Submit answer</button>" in page.text and ">Next</button>" not in page.text
    assert "saved when you press Submit answer" in page.text
    assert f"<title>{study.name}: your question" in page.text
