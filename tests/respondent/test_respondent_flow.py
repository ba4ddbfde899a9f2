"""The respondent's pages through TestClient: plain form POSTs (JavaScript off) and htmx
partials, on a real SQLite file and PostgreSQL; consent/decline, panel parameters,
attribute questions, prefer-not-to-answer, resume, completion code and redirect."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import DATASETS_DIR, write_small_dataset
from live_study import LiveStudy, app_client, fresh_database_url, make_live_study, study_fields
from sqlalchemy import func
from sqlmodel import select

from app import session as svc
from app.tables import Answer, ElicitationSession, Respondent, SelectionDecision, Study


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStudy]:
    folder = tmp_path_factory.mktemp("resp")
    for url in fresh_database_url(request.param, folder):
        svc.clear_runtime_cache()
        data = write_small_dataset(DATASETS_DIR / "ces", folder / "ces120", 120)
        study = make_live_study(url, data, settings={"budgets": {"max_questions": 6}})
        with study.session() as db:
            row = db.get(Study, study.study_id)
            assert row is not None
            row.redirect_url = "https://panel.example.org/done?cc={code}"
            db.add(row)
            db.commit()
        yield study
        study.engine.dispose()


@pytest.fixture
def client(live: LiveStudy) -> Iterator[Any]:
    with app_client(live.url) as c:
        yield c


def field(html: str, name: str) -> str:
    m = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert m, f"no field {name!r} in the page"
    return m.group(1)


def first_option(html: str) -> str:
    m = re.search(r'name="option" value="([^"]+)"', html)
    assert m
    return m.group(1)


def consent(client: Any, live: LiveStudy, **params: str) -> Any:
    page = client.get(f"/s/{live.slug}", params=params)
    assert page.status_code == 200 and "Before you start" in page.text
    data = {"choice": "accept", **{f"p_{k}": v for k, v in params.items()}}
    for k, v in params.items():
        assert field(page.text, f"p_{k}") == v
    return client.post(f"/s/{live.slug}/consent", data=data, follow_redirects=False)


def about(client: Any, live: LiveStudy, answers: dict[str, str], htmx: bool = False) -> Any:
    data = {f"a_{k}": v for k, v in answers.items()}
    headers = {"HX-Request": "true"} if htmx else {}
    return client.post(f"/s/{live.slug}/about", data=data, headers=headers, follow_redirects=False)


def session_of(live: LiveStudy, client: Any) -> ElicitationSession:
    with live.session() as db:
        rows = db.exec(select(ElicitationSession).order_by(ElicitationSession.id.desc())).all()
        token = None
        for name, value in client.cookies.items():
            if name.startswith("priorly_s"):
                token = value
        assert token is not None
        from itsdangerous import URLSafeSerializer

        from app.routes.respondent import COOKIE_SALT
        from app.settings import PLACEHOLDER_SECRET

        sid = URLSafeSerializer(PLACEHOLDER_SECRET, salt=COOKIE_SALT).loads(token)["s"]
        return next(r for r in rows if r.id == sid)


def test_full_questionnaire_with_plain_forms(client: Any, live: LiveStudy) -> None:
    r = consent(client, live, PROLIFIC_PID="pp-123", STUDY_ID="st-9", SESSION_ID="se-1")
    assert r.status_code == 303 and r.headers["location"].endswith(f"/s/{live.slug}/q")
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie and f"path=/s/{live.slug}" in cookie
    page = client.get(f"/s/{live.slug}/q")
    assert "A few questions about you" in page.text and "Prefer not to answer" in page.text
    # answer two attributes, prefer not to answer the others
    r = about(client, live, {"gender4": "B", "educ": "A", "race": "__skip__"})
    assert r.status_code == 303
    sess = session_of(live, client)
    with live.session() as db:
        respondent = db.get(Respondent, sess.respondent_id)
        assert respondent is not None
        assert respondent.panel_params == {
            "PROLIFIC_PID": "pp-123",
            "STUDY_ID": "st-9",
            "SESSION_ID": "se-1",
        }
        assert respondent.attributes == {"gender4": "B", "educ": "A"}
    asked: list[str] = []
    page = client.get(f"/s/{live.slug}/q")
    for n in range(1, 7):
        assert f"Question {n} of at most 6" in page.text
        item = field(page.text, "item")
        assert item not in asked
        asked.append(item)
        data = {"item": item, "idempotency_key": field(page.text, "idempotency_key")}
        if n == 2:
            data["skip"] = "1"  # prefer not to answer
        else:
            data["option"] = first_option(page.text)
        r = client.post(f"/s/{live.slug}/answer", data=data, follow_redirects=False)
        assert r.status_code == 303
        page = client.get(r.headers["location"], follow_redirects=False)
        if n < 6:
            assert page.status_code == 200
    assert page.status_code == 303 and page.headers["location"].endswith("/done")
    done = client.get(f"/s/{live.slug}/done")
    code = svc.completion_code(
        Study(id=live.study_id, slug=live.slug, name=""), sess.id or 0, "dev-insecure-change-me"
    )
    assert done.status_code == 200 and code in done.text
    assert f'href="https://panel.example.org/done?cc={code}"' in done.text
    with live.session() as db:
        rows = db.exec(select(Answer).where(Answer.session_id == sess.id).order_by(Answer.id)).all()
        assert len(rows) == 6 and rows[1].option is None
        assert [r.option is None for r in rows].count(True) == 1
        stored = db.get(ElicitationSession, sess.id)
        assert stored is not None and stored.status == "completed"
    # back to the start page: the cookie leads to the finished session, never a new one
    again = client.get(f"/s/{live.slug}", follow_redirects=True)
    assert "Thank you" in again.text


def test_htmx_partials_and_redirect(client: Any, live: LiveStudy) -> None:
    consent(client, live)
    r = about(client, live, {}, htmx=True)  # all attributes left out
    assert r.status_code == 200
    assert "<html" not in r.text and 'id="survey"' in r.text and "Question 1 of" in r.text
    html = r.text
    for _ in range(6):
        data = {
            "item": field(html, "item"),
            "option": first_option(html),
            "idempotency_key": field(html, "idempotency_key"),
        }
        r = client.post(f"/s/{live.slug}/answer", data=data, headers={"HX-Request": "true"})
        assert r.status_code == 200
        html = r.text
    assert r.headers["HX-Redirect"].endswith(f"/s/{live.slug}/done")
    # an empty submission re-renders the question with an error (no row written)
    client.cookies.clear()  # a new respondent in this browser
    consent(client, live)
    about(client, live, {})
    page = client.get(f"/s/{live.slug}/q")
    r = client.post(
        f"/s/{live.slug}/answer",
        data={"item": field(page.text, "item"), "idempotency_key": "x"},
        follow_redirects=False,
    )
    assert r.status_code == 422 and "Please choose an answer" in r.text
    sess = session_of(live, client)
    with live.session() as db:
        n = db.exec(
            select(func.count()).select_from(Answer).where(Answer.session_id == sess.id)
        ).one()
    assert n == 0


def test_double_submit_and_second_tab(client: Any, live: LiveStudy) -> None:
    consent(client, live)
    about(client, live, {})
    page = client.get(f"/s/{live.slug}/q").text
    item, key = field(page, "item"), field(page, "idempotency_key")
    data = {"item": item, "option": "A", "idempotency_key": key}
    first = client.post(f"/s/{live.slug}/answer", data=data, headers={"HX-Request": "true"})
    again = client.post(f"/s/{live.slug}/answer", data=data, headers={"HX-Request": "true"})
    assert field(first.text, "item") == field(again.text, "item")
    # a second tab still showing the first question answers it differently
    other = {"item": item, "option": "B", "idempotency_key": "tab-2"}
    tab2 = client.post(f"/s/{live.slug}/answer", data=other, headers={"HX-Request": "true"})
    assert tab2.status_code == 200 and "already answered" in tab2.text
    assert field(tab2.text, "item") == field(first.text, "item")
    sess = session_of(live, client)
    with live.session() as db:
        rows = db.exec(select(Answer).where(Answer.session_id == sess.id)).all()
        n_dec = db.exec(
            select(func.count())
            .select_from(SelectionDecision)
            .where(SelectionDecision.session_id == sess.id)
        ).one()
    assert [(r.option, r.idempotency_key) for r in rows] == [("A", key)] and n_dec == 2


def test_resume_link_and_cookie(client: Any, live: LiveStudy) -> None:
    consent(client, live)
    about(client, live, {})
    page = client.get(f"/s/{live.slug}/q").text
    link = re.search(r'href="(http://testserver/s/[^"]+/resume/[^"]+)"', page)
    assert link, "the question page shows the resume link"
    item = field(page, "item")
    client.post(
        f"/s/{live.slug}/answer",
        data={"item": item, "option": "A", "idempotency_key": "r1"},
        follow_redirects=False,
    )
    current = field(client.get(f"/s/{live.slug}/q").text, "item")
    # the tab is closed and the cookie kept: the same question comes back
    with app_client(live.url) as fresh:
        fresh.cookies.update(dict(client.cookies.items()))
        assert field(fresh.get(f"/s/{live.slug}/q").text, "item") == current
    # another browser without the cookie: the start page; then the resume link
    with app_client(live.url) as other:
        r = other.get(f"/s/{live.slug}/q", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].endswith(f"/s/{live.slug}")
        resumed = other.get(link.group(1).replace("http://testserver", ""))
        assert resumed.status_code == 200 and field(resumed.text, "item") == current
        assert "Question 2 of" in resumed.text
        bad = other.get(f"/s/{live.slug}/resume/not-a-token")
        assert bad.status_code == 404 and "not valid" in bad.text
    # a tampered cookie is ignored (start page, no error)
    with app_client(live.url) as forged:
        forged.cookies.set(f"priorly_s{live.study_id}", "eyJzIjoxfQ.forged", path=f"/s/{live.slug}")
        r = forged.get(f"/s/{live.slug}/q", follow_redirects=False)
        assert r.status_code == 303


def test_decline_stores_nothing_and_unknown_study(client: Any, live: LiveStudy) -> None:
    with live.session() as db:
        before = db.exec(select(func.count()).select_from(Respondent)).one()
    r = client.post(
        f"/s/{live.slug}/consent",
        data={"choice": "decline", "p_PROLIFIC_PID": "z"},
        follow_redirects=True,
    )
    assert r.status_code == 200 and "Nothing was recorded" in r.text
    with live.session() as db:
        assert db.exec(select(func.count()).select_from(Respondent)).one() == before
    assert client.get("/s/no-such-study").status_code == 404
    assert client.get(f"/s/{live.slug}", params={"x" * 100: "1"}).status_code == 422


def test_pages_escape_study_text(client: Any, live: LiveStudy) -> None:
    with study_fields(live, consent_text="<script>alert(1)</script> & more"):
        page = client.get(f"/s/{live.slug}").text
        assert "<script>alert(1)</script>" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
