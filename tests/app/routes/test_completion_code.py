"""A respondent keeps the completion code they were shown when the researcher changes the
study's fixed code in the designer afterwards (``elicitation_session.completion_code``):
the end page, its redirect link and the deletion page through TestClient, the change
through the designer's form, on a real SQLite file and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import select

from app import session as svc
from app.settings import PLACEHOLDER_SECRET
from app.tables import ElicitationSession, Researcher, Study
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import (
    LiveStudy,
    app_client,
    fresh_database_url,
    login_researcher,
    make_live_study,
    study_fields,
)
from tests.support.respondent import about, consent, finish

PASSWORD = "a long enough password 1"
REDIRECT = "https://panel.example.org/done?cc={code}"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStudy]:
    from app.auth import set_password

    folder = tmp_path_factory.mktemp("code")
    for url in fresh_database_url(request.param, folder):
        svc.clear_runtime_cache()
        data = write_small_dataset(DATASETS_DIR / "ces", folder / "ces120", 120)
        study = make_live_study(url, data, settings={"budgets": {"max_questions": 6}})
        with study.session() as db:
            row = db.get(Study, study.study_id)
            assert row is not None
            row.redirect_url = REDIRECT
            db.add(row)
            owner = db.exec(select(Researcher).where(Researcher.email == "owner@example.org"))
            set_password(owner.one(), PASSWORD, session=db)
            db.commit()
        yield study
        study.engine.dispose()


@pytest.fixture
def designer(live: LiveStudy) -> Iterator[Any]:
    """The study's owner logged in to the admin UI; the study's fixed code is restored
    afterwards."""
    from app.main import create_app
    from app.settings import load_settings

    settings = load_settings(database_url=live.url, env="dev")
    with (
        study_fields(live, completion_code=None),
        TestClient(create_app(settings), base_url="http://localhost") as admin,
    ):
        login_researcher(admin, "owner@example.org", PASSWORD)
        yield admin


def set_code(admin: Any, live: LiveStudy, code: str) -> None:
    """Save ``code`` as the study's completion code through the designer's texts form."""
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        form = {
            "name": study.name,
            "description": study.description,
            "consent_text": study.consent_text,
            "completion_code": code,
            "redirect_url": study.redirect_url or "",
            "csrf_token": admin.cookies.get("priorly_csrf"),
        }
    r = admin.post(f"/admin/studies/{live.slug}/texts", data=form)
    assert r.status_code == 200 and "texts saved" in r.text
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None and study.completion_code == (code or None)


@contextmanager
def respondent(live: LiveStudy) -> Iterator[tuple[Any, str, int]]:
    """A browser that takes part to the end: (its client, the code shown, its session id)."""
    with app_client(live.url) as client:
        consent(client, live)
        about(client, live, {})
        code = finish(client, live)
        with live.session() as db:
            sid = db.exec(select(ElicitationSession.id).order_by(ElicitationSession.id.desc()))
            yield client, code, int(sid.first() or 0)


def end_page(client: Any, live: LiveStudy) -> tuple[str, str]:
    """The code on the browser's end page and the page's text."""
    page = client.get(f"/s/{live.slug}/done")
    assert page.status_code == 200
    m = re.search(r'class="r-code"><strong>([^<]+)</strong>', page.text)
    assert m
    return m.group(1), page.text


def stored(live: LiveStudy, sid: int) -> str | None:
    with live.session() as db:
        sess = db.get(ElicitationSession, sid)
        assert sess is not None
        return sess.completion_code


def test_a_finished_respondent_keeps_the_fixed_code_after_the_researcher_changes_it(
    live: LiveStudy, designer: Any
) -> None:
    set_code(designer, live, "PANEL-A")
    with respondent(live) as (first, code, sid):
        assert code == "PANEL-A" and stored(live, sid) == "PANEL-A"
        set_code(designer, live, "PANEL-B")
        shown, page = end_page(first, live)
        assert shown == "PANEL-A" and "PANEL-B" not in page
        assert 'href="https://panel.example.org/done?cc=PANEL-A"' in page
    with respondent(live) as (second, code, sid):
        assert code == "PANEL-B" and stored(live, sid) == "PANEL-B"
        assert 'href="https://panel.example.org/done?cc=PANEL-B"' in end_page(second, live)[1]


def test_a_derived_code_stays_when_a_fixed_code_is_set(live: LiveStudy, designer: Any) -> None:
    """The derived code stays on the end page; the study now has one code for everyone,
    so deletion by a code is refused as before and the page no longer promises it."""
    with respondent(live) as (client, code, sid):
        study = Study(id=live.study_id, slug=live.slug, name="")
        assert code == svc.completion_code(study, sid, PLACEHOLDER_SECRET)
        assert stored(live, sid) == ""
        assert "Keep your completion code" in end_page(client, live)[1]
        set_code(designer, live, "PANEL-C")
        shown, page = end_page(client, live)
        assert shown == code and "PANEL-C" not in page
        assert "Keep your completion code" not in page and "later from this browser" in page
        with app_client(live.url) as other:
            r = other.post(f"/s/{live.slug}/delete", data={"code": code, "confirm": "yes"})
            assert r.status_code == 422 and "gives everyone the same completion code" in r.text


def test_a_fixed_code_stays_when_it_is_removed(live: LiveStudy, designer: Any) -> None:
    """Removed, the fixed code stays on the end pages of those who got it: it names no one,
    and neither does their derived code, which they were never shown; the browser that
    took part can still delete its answers."""
    set_code(designer, live, "PANEL-D")
    with respondent(live) as (client, code, sid):
        assert code == "PANEL-D"
        set_code(designer, live, "")
        shown, page = end_page(client, live)
        assert shown == "PANEL-D"
        assert "Keep your completion code" not in page and "later from this browser" in page
        derived = svc.completion_code(
            Study(id=live.study_id, slug=live.slug, name=""), sid, PLACEHOLDER_SECRET
        )
        with app_client(live.url) as other:
            for typed in ("PANEL-D", derived):
                r = other.post(f"/s/{live.slug}/delete", data={"code": typed, "confirm": "yes"})
                assert r.status_code == 422 and "No finished survey has this" in r.text
        assert stored(live, sid) == "PANEL-D"
        r = client.post(f"/s/{live.slug}/delete", data={"use_browser": "1", "confirm": "yes"})
        assert r.status_code == 200 and "Your answers were deleted" in r.text
    with respondent(live) as (client, code, sid):  # a new finisher: a derived code again
        assert re.fullmatch(r"[0-9A-F]{10}", code) and stored(live, sid) == ""
        assert "Keep your completion code" in end_page(client, live)[1]


def test_a_session_completed_before_the_code_was_stored_shows_the_studys_code(
    live: LiveStudy, designer: Any
) -> None:
    """``completion_code`` NULL (completed before the column was written): the code is the
    study's as it is now."""
    with respondent(live) as (client, code, sid):
        with live.session() as db:
            sess = db.get(ElicitationSession, sid)
            assert sess is not None
            sess.completion_code = None
            db.add(sess)
            db.commit()
        assert end_page(client, live)[0] == code
        set_code(designer, live, "PANEL-E")
        assert end_page(client, live)[0] == "PANEL-E"
