"""The web app on a migrated SQLite file: /healthz checks the database, the home page
lists only the open surveys, templates autoescape."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.db import make_engine
from app.main import create_app
from app.services.importer import import_dataset
from app.settings import Settings
from app.tables import Study, StudyStatus


def _import(url: str, folder: Path, name: str) -> None:
    eng = make_engine(url)
    try:
        with Session(eng) as s:
            import_dataset(folder, session=s, study_name=name)
    finally:
        eng.dispose()


def test_healthz_ok(migrated_sqlite_url: str) -> None:
    with TestClient(create_app(Settings(database_url=migrated_sqlite_url))) as client:
        r = client.get("/healthz")
        head = client.head("/healthz")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "database": "ok",
        "workers": {"seen": 0, "last_seen": None, "seen_within_s": 60},
    }
    assert head.status_code == 200 and head.content == b""


def test_head_is_get_without_body(migrated_sqlite_url: str) -> None:
    """HEAD on any page has GET's status and headers and no body (not 405)."""
    with TestClient(create_app(Settings(database_url=migrated_sqlite_url))) as client:
        for path in ("/admin/login", "/static/css/admin.css", "/api/v1/studies", "/s/nope"):
            get, head = client.get(path), client.head(path)
            assert head.status_code == get.status_code != 405, path
            assert head.content == b"", path
            assert head.headers["content-type"] == get.headers["content-type"], path
            if "content-length" in get.headers:
                assert head.headers["content-length"] == get.headers["content-length"], path
        allow = client.options("/api/v1/studies").headers["allow"]
    assert {m.strip() for m in allow.split(",")} >= {"GET", "HEAD"}


def test_healthz_unmigrated(sqlite_url: str) -> None:
    with TestClient(create_app(Settings(database_url=sqlite_url))) as client:
        r = client.get("/healthz")
    assert r.status_code == 503
    assert r.json()["status"] == "error" and "not migrated" in r.json()["database"]
    assert r.json()["workers"] is None


def test_healthz_unreachable(tmp_path: Path) -> None:
    """A database path that is a folder cannot be opened: 503 naming the problem."""
    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path}"))) as client:
        r = client.get("/healthz")
    assert r.status_code == 503
    assert r.json()["status"] == "error"
    assert r.json()["database"].startswith("unreachable: ")


def _publish(url: str, slug: str) -> None:
    eng = make_engine(url)
    try:
        with Session(eng) as s:
            study = s.exec(select(Study).where(Study.slug == slug)).one()
            study.status = StudyStatus.published.value
            s.add(study)
            s.commit()
    finally:
        eng.dispose()


def test_home_shows_visitors_only_open_surveys(
    migrated_sqlite_url: str, small_dataset_factory
) -> None:  # type: ignore[no-untyped-def]
    """Drafts, slugs and counts stay private: a visitor sees the open surveys' titles and
    links, nothing else."""
    _import(migrated_sqlite_url, small_dataset_factory("ces", 30), "CES draft")
    _import(migrated_sqlite_url, small_dataset_factory("opinionqa", 12), "<b>Pew</b> & co")
    _publish(migrated_sqlite_url, "b-pew-b-co")
    with TestClient(create_app(Settings(database_url=migrated_sqlite_url))) as client:
        r = client.get("/")
        css = client.get("/static/css/priorly.css")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "CES draft" not in html and "ces-draft" not in html  # a draft is not shown
    assert 'href="http://testserver/s/b-pew-b-co"' in html
    assert "&lt;b&gt;Pew&lt;/b&gt; &amp; co" in html and "<b>Pew</b>" not in html
    assert ">12<" not in html and ">30<" not in html and "draft" not in html.lower()
    assert css.status_code == 200


def test_home_empty(migrated_sqlite_url: str, small_dataset_factory) -> None:  # type: ignore[no-untyped-def]
    _import(migrated_sqlite_url, small_dataset_factory("ces", 30), "CES draft")
    with TestClient(create_app(Settings(database_url=migrated_sqlite_url))) as client:
        r = client.get("/")
    assert r.status_code == 200 and "There is no open survey here" in r.text
    assert "CES draft" not in r.text


def test_the_icon_is_served(migrated_sqlite_url: str) -> None:
    with TestClient(create_app(Settings(database_url=migrated_sqlite_url))) as client:
        home = client.get("/")
        ico = client.get("/favicon.ico")
    assert 'rel="icon" href="http://testserver/static/img/favicon.svg"' in home.text
    assert ico.status_code == 200 and ico.headers["content-type"].startswith("image/svg+xml")


def test_an_address_that_is_no_page_is_a_page_on_the_survey_and_admin_sides(
    migrated_sqlite_url: str,
) -> None:
    """A mistyped survey link is a 404 page a respondent can read, not JSON; so is an
    unknown admin address; the API keeps its JSON error."""
    with TestClient(create_app(Settings(database_url=migrated_sqlite_url))) as client:
        survey = client.get("/s/no-such-study/typo")
        member = client.get("/g/some-token/extra")
        admin = client.get("/admin/no/such/page")
        api = client.get("/api/v1/no-such-path")
    for page in (survey, member):
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
        assert "Page not found" in page.text and "check the link you were given" in page.text
    assert admin.status_code == 404 and "there is no admin page at this address" in admin.text
    assert api.status_code == 404 and api.json()["code"] == "not_found"


def test_api_cors_for_the_configured_origins(migrated_sqlite_url: str) -> None:
    """PRIORLY_API_CORS_ORIGINS: a page of that origin may call /api/v1 (preflight and
    allow-origin, no cookies); another origin and the admin pages get no CORS header."""
    settings = Settings(database_url=migrated_sqlite_url, api_cors_origins="https://app.example")
    preflight = {
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    with TestClient(create_app(settings)) as client:
        r = client.options("/api/v1/sessions/1/answers", headers=preflight)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-credentials" not in r.headers
        call = client.get("/api/v1/studies", headers={"Origin": "https://app.example"})
        assert call.status_code == 401  # no credential: the API's answer, readable by the page
        assert call.headers["access-control-allow-origin"] == "https://app.example"
        assert "retry-after" in call.headers["access-control-expose-headers"].lower()
        assert "idempotent-replayed" in call.headers["access-control-expose-headers"].lower()
        other = client.get("/api/v1/studies", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        admin = client.get("/admin/login", headers={"Origin": "https://app.example"})
        assert "access-control-allow-origin" not in admin.headers
    with TestClient(create_app(Settings(database_url=migrated_sqlite_url))) as client:
        r = client.get("/api/v1/studies", headers={"Origin": "https://app.example"})
        assert "access-control-allow-origin" not in r.headers  # off by default


DOWN_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:1/x"
"""A PostgreSQL URL on a port where nothing listens: every connection is refused."""


@pytest.mark.parametrize("where", ["postgres down", "sqlite unmigrated"])
def test_pages_answer_503_while_the_database_is_down_or_not_migrated(
    where: str, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The home page, a survey and the admin's login answer 503 with ``Retry-After`` (the
    survey: its message page), never a 500; each logs one line (no traceback) naming the
    cause. (The login form itself needs no database: 200.)"""
    url = DOWN_POSTGRES if where == "postgres down" else sqlite_url
    cause = "unreachable: " if where == "postgres down" else "not migrated ("
    paths = ("/", "/s/ces", "/admin/login")
    caplog.set_level(logging.WARNING)
    app = create_app(Settings(database_url=url))
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as c:
        answers = {p: c.get(p, follow_redirects=False) for p in paths[:2]}
        assert c.get("/admin/login").status_code == 200
        form = {
            "email": "a@example.org",
            "password": "x" * 12,
            "csrf_token": c.cookies["priorly_csrf"],
        }
        answers["/admin/login"] = c.post("/admin/login", data=form, follow_redirects=False)
    for path, r in answers.items():
        assert r.status_code == 503, (path, r.status_code, r.text[:300])
        assert r.headers["retry-after"] == "30", path
    assert "This survey is temporarily unavailable." in answers["/s/ces"].text
    lines = [r for r in caplog.records if r.getMessage().startswith("database unavailable on")]
    assert len(lines) == len(paths), [r.getMessage() for r in caplog.records]
    assert all(cause in r.getMessage() and r.exc_info is None for r in lines)
    if where == "sqlite unmigrated":
        assert "run 'priorly db upgrade'" in lines[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
