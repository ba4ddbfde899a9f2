"""The web app on a migrated SQLite file: /healthz checks the database, the home page
lists the studies, templates autoescape."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlmodel import Session

from app.db import make_engine
from app.main import create_app
from app.services.importer import import_dataset
from app.settings import Settings


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
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "database": "ok"}


def test_healthz_unmigrated(sqlite_url: str) -> None:
    with TestClient(create_app(Settings(database_url=sqlite_url))) as client:
        r = client.get("/healthz")
    assert r.status_code == 503
    assert r.json()["status"] == "error" and "not migrated" in r.json()["database"]


def test_healthz_unreachable(tmp_path: Path) -> None:
    """A database path that is a folder cannot be opened: 503 naming the problem."""
    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path}"))) as client:
        r = client.get("/healthz")
    assert r.status_code == 503
    assert r.json()["status"] == "error"
    assert r.json()["database"].startswith("unreachable: ")


def test_home_lists_studies(migrated_sqlite_url: str, small_dataset_factory) -> None:  # type: ignore[no-untyped-def]
    _import(migrated_sqlite_url, small_dataset_factory("ces", 30), "CES demo")
    _import(migrated_sqlite_url, small_dataset_factory("opinionqa", 12), "<b>Pew</b> & co")
    with TestClient(create_app(Settings(database_url=migrated_sqlite_url))) as client:
        r = client.get("/")
        css = client.get("/static/css/priorly.css")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert '<tr data-slug="ces-demo">' in html
    row = html.split('<tr data-slug="ces-demo">')[1].split("</tr>")[0]
    assert (
        "CES demo" in row and '<td class="num">39</td>' in row and '<td class="num">30</td>' in row
    )
    row2 = html.split('<tr data-slug="b-pew-b-co">')[1].split("</tr>")[0]
    assert "&lt;b&gt;Pew&lt;/b&gt; &amp; co" in row2 and "<b>Pew</b>" not in html
    assert '<td class="num">12</td>' in row2
    assert css.status_code == 200


def test_home_empty(migrated_sqlite_url: str) -> None:
    with TestClient(create_app(Settings(database_url=migrated_sqlite_url))) as client:
        r = client.get("/")
    assert r.status_code == 200 and "No studies yet" in r.text
