"""The respondent's pages through TestClient: plain form POSTs (JavaScript off) and htmx
partials, on a real SQLite file and PostgreSQL; consent/decline, panel parameters,
attribute questions, prefer-not-to-answer, resume, completion code and redirect."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func
from sqlmodel import select

from app import session as svc
from app.tables import Answer, ElicitationSession, Respondent, SelectionDecision, Study
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import (
    LiveStudy,
    app_client,
    fresh_database_url,
    make_live_study,
    study_fields,
)
from tests.support.respondent import about, attribute_pages, consent, field, finish, first_option


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
    assert "answers are not counted" not in page.text  # the preview banner is for previews only
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
    n_attr = sum(len(p) for p in attribute_pages(live))
    page = client.get(f"/s/{live.slug}/q")
    for n in range(1, 7):
        assert f"Question {n_attr + n} of at most {n_attr + 6}" in page.text
        # the first question says that a saved answer stays (there is no way back)
        assert ("cannot be changed afterwards" in page.text) == (n == 1)
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


def test_redirect_url_fills_the_respondents_link_parameters(client: Any, live: LiveStudy) -> None:
    """``{NAME}`` in the redirect URL is the link parameter the respondent arrived with
    (URL-encoded); one their link did not carry becomes empty."""
    url = (
        "https://app.prolific.example/submissions/complete?cc={code}"
        "&PROLIFIC_PID={PROLIFIC_PID}&s={STUDY_ID}"
    )
    with study_fields(live, redirect_url=url):
        consent(client, live, PROLIFIC_PID="pid ABC/1")
        about(client, live, {})
        code = finish(client, live)
        done = client.get(f"/s/{live.slug}/done").text
    link = (
        f"https://app.prolific.example/submissions/complete?cc={code}"
        "&amp;PROLIFIC_PID=pid%20ABC%2F1&amp;s="
    )
    assert f'href="{link}"' in done


def test_htmx_partials_and_redirect(client: Any, live: LiveStudy) -> None:
    consent(client, live)
    r = about(client, live, {}, htmx=True)  # all attributes left out
    assert r.status_code == 200
    n_attr = sum(len(p) for p in attribute_pages(live))
    assert "<html" not in r.text and 'id="survey"' in r.text
    assert f"Question {n_attr + 1} of" in r.text
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
    # a crafted form with two answers to one question is refused in plain words (which
    # field the form got wrong is nothing the respondent can act on)
    r = client.post(
        f"/s/{live.slug}/answer",
        data={"item": field(page.text, "item"), "option": ["A", "B"], "idempotency_key": "y"},
        follow_redirects=False,
    )
    assert r.status_code == 422 and "Nothing was saved: your answer could not be read." in r.text
    assert "sent 2 times" not in r.text
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
        n_attr = sum(len(p) for p in attribute_pages(live))
        assert f"Question {n_attr + 2} of" in resumed.text
        bad = other.get(f"/s/{live.slug}/resume/not-a-token")
        assert bad.status_code == 404 and "not valid" in bad.text
    # a tampered cookie is ignored (start page, no error)
    with app_client(live.url) as forged:
        forged.cookies.set(f"priorly_s{live.study_id}", "eyJzIjoxfQ.forged", path=f"/s/{live.slug}")
        r = forged.get(f"/s/{live.slug}/q", follow_redirects=False)
        assert r.status_code == 303


def test_a_form_posted_without_the_cookie_goes_to_the_start_page_saying_so(
    client: Any, live: LiveStudy
) -> None:
    """The cookie lost mid-survey: htmx gets an ``HX-Redirect`` (a full page, never the
    consent page swapped into the survey card), a plain form a 303; the start page says this
    browser no longer has the answers and points to the resume link."""
    consent(client, live)
    page = client.get(f"/s/{live.slug}/q").text
    assert 'name="page"' in page  # the first page of questions about the respondent
    client.cookies.clear()
    start = f"/s/{live.slug}?priorly_lost=1"
    hx = {"HX-Request": "true"}
    for path, data in (
        ("about", {"page": "1", "skip_all": "1"}),
        ("answer", {"item": "x", "option": "A", "idempotency_key": "lost-1"}),
    ):
        r = client.post(f"/s/{live.slug}/{path}", data=data, headers=hx, follow_redirects=False)
        assert r.status_code == 200 and r.headers["HX-Redirect"].endswith(start), path
        assert "Before you start" not in r.text
        r = client.post(f"/s/{live.slug}/{path}", data=data, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].endswith(start), path
    r = client.get(start)
    assert r.status_code == 200 and "Before you start" in r.text
    assert "This browser no longer has your answers" in r.text and "resume link" in r.text
    assert "priorly_lost" not in r.text  # not carried as a link parameter
    fresh = client.get(f"/s/{live.slug}", params={"PROLIFIC_PID": "p1"}).text
    assert "no longer has your answers" not in fresh
    assert field(fresh, "p_PROLIFIC_PID") == "p1"
    # a page opened without the cookie (not a form sent) is the plain start page
    r = client.get(f"/s/{live.slug}/q", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith(f"/s/{live.slug}")


@pytest.mark.parametrize("path", ["consent", "about", "answer"])
def test_opening_a_post_only_survey_address_goes_to_the_start_page(
    client: Any, live: LiveStudy, path: str
) -> None:
    """GET on a form's address (reopened after an error page) is not a bare 405 JSON: 303 to
    the start page, which resumes this browser's session."""
    r = client.get(f"/s/{live.slug}/{path}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith(f"/s/{live.slug}")
    consent(client, live)
    r = client.get(f"/s/{live.slug}/{path}", follow_redirects=True)
    assert r.status_code == 200 and "A few questions about you" in r.text
    # another method on a page that only shows: the same
    r = client.put(f"/s/{live.slug}/q", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith(f"/s/{live.slug}")


def test_decline_stores_nothing_and_unknown_study(client: Any, live: LiveStudy) -> None:
    with live.session() as db:
        before = db.exec(select(func.count()).select_from(Respondent)).one()
    r = client.post(
        f"/s/{live.slug}/consent",
        data={"choice": "decline", "p_PROLIFIC_PID": "z"},
        follow_redirects=True,
    )
    assert r.status_code == 200 and "Nothing was recorded" in r.text
    assert "<h1>You chose not to take part</h1>" in r.text
    assert re.search(r"<title>[^<]+: You chose not to take part</title>", r.text)
    with live.session() as db:
        assert db.exec(select(func.count()).select_from(Respondent)).one() == before
    assert client.get("/s/no-such-study").status_code == 404
    assert client.get(f"/s/{live.slug}", params={"x" * 100: "1"}).status_code == 422


@pytest.mark.parametrize(
    ("query", "form", "message"),
    [
        ("k=1&k=2", {"p_k": ["1", "2"]}, "link parameter &#39;k&#39; is given twice"),
        ("a%20b=1", {"p_a b": "1"}, "link parameter name &#39;a b&#39;: use 1-64 letters"),
        ("k%0A2=1", {"p_k\n2": "1"}, "link parameter name"),
        ("k=x%E2%80%AEy", {"p_k": "x\u202ey"}, "holds a bidirectional control character"),
    ],
)
def test_a_bad_link_parameter_is_refused_naming_it(
    client: Any, live: LiveStudy, query: str, form: dict[str, Any], message: str
) -> None:
    """On the consent page (the link) and on its form: 422 "This link does not work", what
    to do in plain words, the parameter at fault in small print; nobody is stored."""
    with live.session() as db:
        before = db.exec(select(func.count()).select_from(Respondent)).one()
    page = client.get(f"/s/{live.slug}?{query}")
    posted = client.post(
        f"/s/{live.slug}/consent", data={"choice": "accept", **form}, follow_redirects=False
    )
    for r in (page, posted):
        assert r.status_code == 422 and "<h1>This link does not work</h1>" in r.text
        assert "Please open the link exactly as you received it" in r.text
        assert "or contact the study team." in r.text
        detail = re.search(r'<p class="r-detail">Details: ([^<]*)</p>', r.text)
        assert detail is not None and message in detail.group(1)
    with live.session() as db:
        assert db.exec(select(func.count()).select_from(Respondent)).one() == before


def test_too_many_starts_page_names_the_study_and_offers_to_try_again(live: LiveStudy) -> None:
    """Over the start limit: 429 in plain words under the study's name, and "Try again"
    reopens the survey link with the link parameters of the refused "I agree"."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings

    settings = load_settings(
        database_url=live.url, env="dev", respondent_start_rate_limit_per_minute=1
    )
    address = (f"198.51.100.{live.study_id % 200 + 1}", 50000)  # this test's own counter
    data = {"choice": "accept", "p_PROLIFIC_PID": "pid ABC"}
    app = create_app(settings)
    with TestClient(app, client=address) as first, TestClient(app, client=address) as second:
        started = first.post(f"/s/{live.slug}/consent", data=data, follow_redirects=False)
        refused = second.post(f"/s/{live.slug}/consent", data=data, follow_redirects=False)
    assert started.status_code == 303 and refused.status_code == 429
    page = refused.text
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        assert f'<p class="r-study" dir="auto">{study.name}</p>' in page
    assert "Many people on your network are starting this survey right now." in page
    assert "Please try again in a minute." in page
    assert f'href="http://testserver/s/{live.slug}?PROLIFIC_PID=pid+ABC">Try again</a>' in page


def test_pages_escape_study_text(client: Any, live: LiveStudy) -> None:
    with study_fields(live, consent_text="<script>alert(1)</script> & more"):
        page = client.get(f"/s/{live.slug}").text
        assert "<script>alert(1)</script>" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page


def test_researchers_texts_take_their_direction_from_their_text(
    client: Any, live: LiveStudy
) -> None:
    """``dir="auto"`` on the study name, the consent text, the questions and the option
    labels: an Arabic text is laid out right to left, its punctuation in place."""
    with study_fields(live, consent_text="نص الموافقة."):
        start = client.get(f"/s/{live.slug}").text
    assert '<p class="r-study" dir="auto">' in start and '<p dir="auto">نص الموافقة.</p>' in start
    consent(client, live)
    about_page = client.get(f"/s/{live.slug}/q").text
    assert about_page.count('<legend class="r-legend" dir="auto"') == about_page.count("<legend")
    assert about_page.count('<span dir="auto">') == about_page.count('class="r-option"') > 0
    about(client, live, {})
    question = client.get(f"/s/{live.slug}/q").text
    assert '<h1 class="r-qtext" dir="auto"' in question
    assert question.count('<span dir="auto">') == question.count('class="r-option"') > 0


def n_respondents(live: LiveStudy) -> int:
    with live.session() as db:
        return int(
            db.exec(
                select(func.count()).select_from(Respondent).where(Respondent.source == "live")
            ).one()
        )


def test_back_to_consent_resumes_never_a_second_respondent(client: Any, live: LiveStudy) -> None:
    start = client.get(f"/s/{live.slug}")
    assert start.headers["cache-control"] == "no-store"
    consent(client, live)
    before = n_respondents(live)
    assert client.get(f"/s/{live.slug}/q").headers["cache-control"] == "no-store"
    # Back to the (cached) consent page, "I agree" again: the same session, no new respondent
    r = client.post(f"/s/{live.slug}/consent", data={"choice": "accept"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith(f"/s/{live.slug}/q")
    assert "set-cookie" not in r.headers
    assert n_respondents(live) == before
    about(client, live, {"gender4": "A"})
    page = client.get(f"/s/{live.slug}/q").text
    client.post(
        f"/s/{live.slug}/answer",
        data={"item": field(page, "item"), "option": "A", "idempotency_key": "b1"},
    )
    # "I do not want to take part" now: says what is stored and how to delete it
    r = client.post(f"/s/{live.slug}/consent", data={"choice": "decline"}, follow_redirects=True)
    assert r.status_code == 200 and "Nothing was recorded" not in r.text
    assert "<h1>You chose not to take part</h1>" in r.text
    assert "1 answer to the survey questions" in r.text
    assert "1 answer to the questions about you" in r.text
    assert f'href="http://testserver/s/{live.slug}/delete"' in r.text
    # after completion, "I agree" from the cached consent page shows the completion page
    code = finish(client, live)
    r = client.post(f"/s/{live.slug}/consent", data={"choice": "accept"}, follow_redirects=True)
    assert r.url.path == f"/s/{live.slug}/done" and code in r.text
    assert n_respondents(live) == before
    sess = session_of(live, client)
    with live.session() as db:
        first = db.get(Respondent, sess.respondent_id)
        assert first is not None and first.earlier_starts == 0
    # the session cookie is gone but the browser is the same: a new respondent, flagged
    client.cookies.delete(f"priorly_s{live.study_id}", path=f"/s/{live.slug}")
    consent(client, live)
    assert n_respondents(live) == before + 1
    again = session_of(live, client)
    with live.session() as db:
        second = db.get(Respondent, again.respondent_id)
        assert second is not None and second.earlier_starts == 1


def test_delete_with_completion_code(client: Any, live: LiveStudy) -> None:
    from app.tables import ErasureRecord

    consent(client, live)
    about(client, live, {"educ": "B"})
    code = finish(client, live)
    done = client.get(f"/s/{live.slug}/done").text
    assert f"/s/{live.slug}/delete" in done
    sess = session_of(live, client)
    with live.session() as db:
        erasures = db.exec(select(func.count()).select_from(ErasureRecord)).one()
    with app_client(live.url) as other:  # another device: only the code
        page = other.get(f"/s/{live.slug}/delete")
        assert page.status_code == 200 and 'name="code"' in page.text
        assert page.headers["cache-control"] == "no-store"
        wrong = other.post(f"/s/{live.slug}/delete", data={"code": "0000000000", "confirm": "yes"})
        assert (
            wrong.status_code == 422 and "No finished survey has this completion code" in wrong.text
        )
        # the typed code and the tick box are kept, the focus is on the code
        assert re.search(r'<input id="code"[^>]* value="0000000000"[^>]* autofocus>', wrong.text)
        assert re.search(r'name="confirm" value="yes" required checked>', wrong.text)
        unticked = other.post(f"/s/{live.slug}/delete", data={"code": "0000000000"})
        assert re.search(r'<input id="code"[^>]* value="0000000000"', unticked.text)
        assert re.search(r'name="confirm" value="yes" required autofocus>', unticked.text)
        for hostile in ("é", "\u202e" + code):  # non-ASCII: no such code, not a 500
            r = other.post(f"/s/{live.slug}/delete", data={"code": hostile, "confirm": "yes"})
            assert r.status_code == 422 and "No finished survey has this" in r.text
        unconfirmed = other.post(f"/s/{live.slug}/delete", data={"code": code})
        assert unconfirmed.status_code == 422 and "tick the box" in unconfirmed.text
        with live.session() as db:
            assert db.get(ElicitationSession, sess.id) is not None
        r = other.post(f"/s/{live.slug}/delete", data={"code": code.lower(), "confirm": "yes"})
        assert r.status_code == 200 and "Your answers were deleted" in r.text
        again = other.post(f"/s/{live.slug}/delete", data={"code": code, "confirm": "yes"})
        assert again.status_code == 422
    with live.session() as db:
        assert db.get(ElicitationSession, sess.id) is None
        assert db.get(Respondent, sess.respondent_id) is None
        n = db.exec(select(func.count()).select_from(Answer).where(Answer.session_id == sess.id))
        assert n.one() == 0
        assert db.exec(select(func.count()).select_from(ErasureRecord)).one() == erasures + 1
    # the browser that took part now sees the start page (its session is gone)
    r = client.get(f"/s/{live.slug}/q", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith(f"/s/{live.slug}")


def test_a_shared_completion_code_is_not_offered_for_deletion(client: Any, live: LiveStudy) -> None:
    """With one code for everyone the end page does not promise deletion by the code (the
    delete page says that code cannot find anyone's answers); it offers this browser."""
    with study_fields(live, completion_code="COLD25"):
        consent(client, live)
        about(client, live, {"educ": "B"})
        assert finish(client, live) == "COLD25"
        done = client.get(f"/s/{live.slug}/done").text
        assert "Keep your completion code" not in done
        assert "later from this browser; elsewhere, please ask the research team" in done
        with app_client(live.url) as other:
            page = other.get(f"/s/{live.slug}/delete").text
            assert "the code cannot find your answers" in page and 'name="code"' not in page
            # no form that cannot work here; the private resume link gives access
            assert "<form" not in page and 'name="confirm"' not in page
            assert "If you kept the private link shown during the survey" in page
        mine = client.get(f"/s/{live.slug}/delete").text  # the browser that took part can
        assert 'name="use_browser"' in mine and "<form" in mine


def test_delete_this_browsers_answers_before_finishing(client: Any, live: LiveStudy) -> None:
    """The deletion message counts what was deleted as the declined page listed it:
    answers, questions preferred not to answer, answers to the questions about you."""
    consent(client, live)
    pages = attribute_pages(live)
    about(client, live, {k: "A" for k in pages[0]})
    for data in ({"option": None}, {"skip": "1"}):
        page = client.get(f"/s/{live.slug}/q").text
        data = {k: v or first_option(page) for k, v in data.items()}
        data |= {"item": field(page, "item"), "idempotency_key": field(page, "idempotency_key")}
        client.post(f"/s/{live.slug}/answer", data=data)
    sess = session_of(live, client)
    n_about = len(pages[0])
    listed = client.get(f"/s/{live.slug}/declined").text
    assert "1 answer to the survey questions (1 question you preferred not to answer)" in listed
    assert f"{n_about} answers to the questions about you" in listed
    page = client.get(f"/s/{live.slug}/delete")
    assert 'name="use_browser"' in page.text and 'name="code"' not in page.text
    r = client.post(f"/s/{live.slug}/delete", data={"use_browser": "1", "confirm": "yes"})
    assert r.status_code == 200 and "Your answers were deleted" in r.text
    assert (
        "We deleted everything stored about you in this survey: 1 answer to the survey "
        f"questions, 1 question you preferred not to answer and {n_about} answers to the "
        "questions about you." in r.text
    )
    assert f"priorly_s{live.study_id}=" in r.headers["set-cookie"]
    with live.session() as db:
        assert db.get(Respondent, sess.respondent_id) is None


def test_researcher_erases_a_respondent_from_the_admin_ui(client: Any, live: LiveStudy) -> None:
    from fastapi.testclient import TestClient

    from app.auth import set_password
    from app.main import create_app
    from app.settings import load_settings
    from app.tables import ErasureRecord, Researcher
    from tests.support.live_study import login_researcher

    with live.session() as db:
        owner = db.exec(select(Researcher).where(Researcher.email == "owner@example.org")).one()
        set_password(owner, "a long enough password 1", session=db)
        erasures = db.exec(select(func.count()).select_from(ErasureRecord)).one()
    consent(client, live)
    sess = session_of(live, client)
    about(client, live, {})  # no attributes; then one question skipped, one answered
    for data in ({"skip": "1"}, {"option": None}):
        page = client.get(f"/s/{live.slug}/q").text
        data = {k: v or first_option(page) for k, v in data.items()}
        data |= {"item": field(page, "item"), "idempotency_key": field(page, "idempotency_key")}
        assert client.post(f"/s/{live.slug}/answer", data=data).status_code == 200
    settings = load_settings(database_url=live.url, env="dev")
    with TestClient(create_app(settings), base_url="http://localhost") as admin:
        anonymous = admin.get(f"/admin/studies/{live.slug}/respondents", follow_redirects=False)
        assert anonymous.status_code == 303
        login_researcher(admin, "owner@example.org", "a long enough password 1")
        page = admin.get(f"/admin/studies/{live.slug}/respondents")
        assert page.status_code == 200 and f'data-respondent="{sess.respondent_id}"' in page.text
        row = page.text.split(f'data-respondent="{sess.respondent_id}"', 1)[1].split("</tr>")[0]
        assert '<td>2 <span class="muted">(1 skipped)</span></td>' in row
        url = f"/admin/studies/{live.slug}/respondents/{sess.respondent_id}/erase"
        assert admin.post(url, follow_redirects=False).status_code == 403  # no CSRF token
        csrf = admin.cookies.get("priorly_csrf")
        r = admin.post(url, data={"csrf_token": csrf}, follow_redirects=True)
        assert r.status_code == 200 and f"Respondent {sess.respondent_id} was erased" in r.text
        assert f'data-respondent="{sess.respondent_id}"' not in r.text
        gone = admin.post(url, data={"csrf_token": csrf}, follow_redirects=False)
        assert gone.status_code == 404
        huge = f"/admin/studies/{live.slug}/respondents/{10**20}/erase"
        assert admin.post(huge, data={"csrf_token": csrf}).status_code == 422  # as every admin id
    with live.session() as db:
        assert db.get(Respondent, sess.respondent_id) is None
        assert db.exec(select(func.count()).select_from(ErasureRecord)).one() == erasures + 1


def test_questions_about_you_are_paged_worded_counted_and_skipped_once(
    client: Any, live: LiveStudy
) -> None:
    pages = attribute_pages(live)
    n_attr = sum(len(p) for p in pages)
    assert len(pages) >= 2 and all(len(p) <= svc.ATTRIBUTES_PER_PAGE for p in pages)
    consent(client, live)
    page = client.get(f"/s/{live.slug}/q").text
    assert page.count('class="r-question"') == len(pages[0])
    assert f"Questions 1 to {len(pages[0])} of at most {n_attr + 6}" in page
    assert "In which year were you born?" in page  # the codebook's question text
    # an empty page asks once before skipping everything (nothing stored, no question yet)
    r = client.post(f"/s/{live.slug}/about", data={"page": "1"}, follow_redirects=False)
    assert r.status_code == 200 and "Skip all the remaining questions about you?" in r.text
    # Enter in a field presses the form's first submit button: "Continue", not "skip them all"
    first_button = re.search(r"<button[^>]*>([^<]*)</button>", r.text.split("<form", 1)[1])
    assert first_button is not None and first_button.group(1) == "Continue"
    assert 'type="submit"' in first_button.group(0) and "name=" not in first_button.group(0)
    sess = session_of(live, client)
    with live.session() as db:
        assert (
            db.exec(
                select(SelectionDecision).where(SelectionDecision.session_id == sess.id)
            ).first()
            is None
        )
    # one answer and blanks on page 1: the page again, the answer kept, the blanks marked
    first_key, *others = pages[0]
    assert others
    r = client.post(
        f"/s/{live.slug}/about", data={"page": "1", f"a_{first_key}": "B"}, follow_redirects=False
    )
    assert r.status_code == 200
    n = len(others)
    assert f"You did not answer {n} question{'s' if n > 1 else ''} on this page." in r.text
    assert re.search(rf'name="a_{first_key}" value="B" checked', r.text)
    assert r.text.count("Not answered yet") == n and 'name="blank_ok"' in r.text
    assert all(f'id="blank-{k}"' in r.text for k in others)
    # the focus on the first blank question, not on one of its options
    assert re.search(rf'aria-describedby="blank-{others[0]}">\s*<legend[^>]* autofocus', r.text)
    assert not re.search(r"<input[^>]* autofocus", r.text)
    with live.session() as db:
        respondent = db.get(Respondent, sess.respondent_id)
        assert respondent is not None and not respondent.attributes
    # "Continue" again leaves them unanswered: the one answer stored, then page 2
    r = client.post(
        f"/s/{live.slug}/about",
        data={"page": "1", f"a_{first_key}": "B", "blank_ok": "1"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"].endswith(f"/s/{live.slug}/q?page=2")
    page2 = client.get(r.headers["location"]).text
    start = len(pages[0]) + 1
    assert f"Questions {start} to {start + len(pages[1]) - 1} of at most {n_attr + 6}" in page2
    # Back to page 1 shows the stored answer
    back = client.get(f"/s/{live.slug}/q?page=1").text
    assert re.search(rf'name="a_{first_key}" value="B" checked', back)
    # htmx: the empty page 2 asks, "Yes, skip" goes to the first adaptive question
    hx = {"HX-Request": "true"}
    r = client.post(f"/s/{live.slug}/about", data={"page": "2"}, headers=hx)
    assert "Skip all the remaining questions about you?" in r.text
    assert r.headers["HX-Push-Url"] == f"/s/{live.slug}/q?page=2"
    r = client.post(f"/s/{live.slug}/about", data={"page": "2", "skip_all": "1"}, headers=hx)
    assert f"Question {n_attr + 1} of at most {n_attr + 6}" in r.text and 'name="item"' in r.text
    with live.session() as db:
        respondent = db.get(Respondent, sess.respondent_id)
        assert respondent is not None and respondent.attributes == {first_key: "B"}


def test_public_and_preparing_pages_speak_to_respondents() -> None:
    """The site's tagline and the "preparing" page in plain words (no jargon, no "the
    first time")."""
    from app.tables import Study
    from app.templating import make_templates

    env = make_templates().env
    context = {"url_for": lambda *a, **k: "/x", "study": Study(name="S", slug="s")}
    home = env.get_template("pages/home.html").render(surveys=[], **context)
    assert '<span class="tagline">short surveys for research</span>' in home
    assert "Bayesian" not in home and "elicitation" not in home
    preparing = env.get_template("pages/respondent_preparing.html").render(**context)
    assert "This survey is being prepared; this page will update by itself." in preparing
    assert "first time" not in preparing.lower()


def test_attribute_wording_from_bare_labels() -> None:
    from app.session.runtime import ItemInfo

    def item(question: str, key: str = "F_AGECAT", topic: str | None = None) -> ItemInfo:
        return ItemInfo(1, key, question, [["A", "x"]], "attribute", topic)

    assert svc.attribute_question(item("age")) == "What is your age?"
    assert svc.attribute_question(item("  sex ")) == "What is your sex?"
    assert svc.attribute_question(item("", key="party_id")) == "What is your party id?"
    assert svc.attribute_question(item("", topic="Region")) == "What is your region?"
    assert svc.attribute_question(item("What is your gender?")) == "What is your gender?"
    assert svc.attribute_question(item("Highest level of education completed")) == (
        "Highest level of education completed"
    )


def test_completion_page_shows_what_we_learned_only_when_set(client: Any, live: LiveStudy) -> None:
    from tests.support.live_study import study_settings

    consent(client, live)
    about(client, live, {"gender4": "B"})
    finish(client, live)
    assert "What we learned about you" not in client.get(f"/s/{live.slug}/done").text  # default
    with study_settings(live, show_learned=True):
        svc.clear_runtime_cache()
        html = client.get(f"/s/{live.slug}/done").text
        sess = session_of(live, client)
        with live.session() as db:
            study = db.get(Study, live.study_id)
            assert study is not None
            rt = svc.load_runtime(study, session=db, fit_if_missing=False)
            asked = {a.item for a in svc.session_answers(sess, session=db)}
            preds = [
                p for p in svc.predictions(study, sess, session=db).targets if p.item not in asked
            ]
    svc.clear_runtime_cache()
    assert preds, "the study has unasked targets"
    assert "What we learned about you" in html
    sentences = re.findall(
        r"<li>We think you would answer “<bdi>([^<]+)</bdi>” to “<bdi>([^<]+)</bdi>” \((\d+)% sure\)",
        html,
    )
    assert len(sentences) == len(preds)
    for pred, (label, question, percent) in zip(preds, sentences, strict=True):
        letter, p = max(pred.distribution.items(), key=lambda kv: kv[1])
        item = rt.by_key[pred.item]
        import html as html_lib

        assert html_lib.unescape(label) == dict((o[0], o[1]) for o in item.options)[letter]
        assert html_lib.unescape(question) == item.question and int(percent) == round(100 * p)


def test_completion_page_shows_the_cape_preference_profile(client: Any, live: LiveStudy) -> None:
    """A CAPE model's preference criteria are listed too (runs last: it refits the study)."""
    from app.services.belief import fit_study_model
    from app.tables import Item
    from tests.support.live_study import study_settings

    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        items = db.exec(select(Item).where(Item.study_id == live.study_id)).all()
        for it in items:
            it.is_preference_criterion = it.role == "question"
            db.add(it)
        db.commit()
        fit_study_model(
            study,
            session=db,
            belief_model="cape_linear",
            fit_options={"cape_linear": {"dims": (1,)}},
            force=True,
        )
    svc.clear_runtime_cache()
    try:
        with study_settings(live, show_learned=True):
            consent(client, live)
            about(client, live, {})
            finish(client, live)
            html = client.get(f"/s/{live.slug}/done").text
        assert "What matters to you" in html
        section = html.split("What matters to you", 1)[1]
        assert (
            1
            <= len(
                re.findall(
                    r"<li>We think you would answer “<bdi>[^<]+</bdi>” to “<bdi>[^<]+</bdi>” \(\d+% sure\)",
                    section,
                )
            )
            <= 5
        )
    finally:
        svc.clear_runtime_cache()


def test_every_respondent_page_is_sent_no_store(client: Any, live: LiveStudy) -> None:
    for path in (f"/s/{live.slug}", f"/s/{live.slug}/declined", f"/s/{live.slug}/delete"):
        assert client.get(path).headers["cache-control"] == "no-store", path
    gone = client.get("/g/not-a-token")  # a group-round link
    assert gone.status_code == 404 and gone.headers["cache-control"] == "no-store"
