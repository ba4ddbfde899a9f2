"""Integer ids in admin paths and forms are bounded: an id no database row can have is a
clear 422, never a server error.

A real uvicorn server on SQLite and on PostgreSQL. Every id column is a 32-bit integer,
so an admin id is a whole number from 1 to 2^31 - 1. Unbounded, an id of 2^31 or more
reached the database, where PostgreSQL refuses it as an ``integer`` and SQLite's driver
refuses 2^63 or more: a 500 on either. The largest in-range id stays an ordinary unknown
id (404).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlmodel import Session

from app.auth import create_account
from app.db import make_engine, upgrade
from app.services.designer import create_study
from tests.support.live_study import fresh_database_url
from tests.support.secutil import LiveServer, live_server

PASSWORD = "correct horse battery"
MAX_ID = 2**31 - 1
OUT_OF_RANGE = (2**31, 2**63, 2**64, 10**40, 0, -1)

GET_PATHS = (
    "/admin/studies/{slug}/jobs/{id}",
    "/admin/studies/{slug}/jobs/{id}/plot.svg",
    "/admin/studies/{slug}/groups/{id}",
    "/admin/studies/{slug}/groups/{id}/links.csv",
)
POST_PATHS = (
    "/admin/studies/{slug}/items/{id}",
    "/admin/studies/{slug}/jobs/{id}/cancel",
    "/admin/studies/{slug}/groups/{id}/close",
    "/admin/keys/{id}/revoke",
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """One server per backend for the module: no test changes what the others read."""
    folder = tmp_path_factory.mktemp(f"id-bounds-{request.param}")
    for url in fresh_database_url(request.param, folder):
        upgrade(url)
        engine = make_engine(url)
        with Session(engine) as db:
            owner = create_account("owner@example.org", PASSWORD, session=db)
            create_study("Bounds", owner=owner, session=db)
        engine.dispose()
        with live_server(url, folder / "server.log", log_level="warning") as srv:
            yield srv


@pytest.fixture
def browser(server: LiveServer) -> Iterator[httpx.Client]:
    """A client logged in as the study's owner through the login form."""
    with httpx.Client(base_url=server.base, timeout=60) as client:
        assert client.get("/admin/login").status_code == 200
        token = client.cookies["priorly_csrf"]
        data = {"email": "owner@example.org", "password": PASSWORD, "csrf_token": token}
        assert client.post("/admin/login", data=data).status_code == 303
        yield client


def _call(client: httpx.Client, method: str, path: str, data: dict[str, str]) -> httpx.Response:
    headers = {"x-csrf-token": client.cookies["priorly_csrf"]} if method == "POST" else {}
    return client.request(method, path, data=data or None, headers=headers)


def _status(client: httpx.Client, method: str, path: str, data: dict[str, str]) -> int:
    """The response's status; 0 when the server dropped the connection instead."""
    try:
        return _call(client, method, path, data).status_code
    except httpx.TransportError:
        return 0


def _probes(slug: str, value: int) -> list[tuple[str, str, dict[str, str]]]:
    out = [("GET", p.format(slug=slug, id=value), {}) for p in GET_PATHS]
    out += [("POST", p.format(slug=slug, id=value), {}) for p in POST_PATHS]
    out.append(("POST", f"/admin/studies/{slug}/groups/open", {"job_id": str(value)}))
    return out


def test_out_of_range_ids_are_422_with_the_bounds(browser: httpx.Client) -> None:
    wrong = []
    for value in OUT_OF_RANGE:
        for method, path, data in _probes("bounds", value):
            status = _status(browser, method, path, data)
            if status != 422:
                wrong.append((method, path, data, status))
    assert not wrong, wrong


def test_the_bound_names_the_field_and_the_range(browser: httpx.Client) -> None:
    r = _call(browser, "GET", f"/admin/studies/bounds/jobs/{2**31}", {})
    assert r.status_code == 422 and r.headers["content-type"].startswith("text/html")
    assert "path.job_id" in r.text and str(MAX_ID) in r.text  # the admin's error page
    r = _call(browser, "POST", "/admin/studies/bounds/groups/open", {"job_id": str(2**63)})
    assert r.status_code == 422
    assert "job_id" in r.text and f"1 to {MAX_ID}" in r.text


def test_the_largest_id_is_an_unknown_id(browser: httpx.Client) -> None:
    statuses = {
        (method, path): _status(browser, method, path, data)
        for method, path, data in _probes("bounds", MAX_ID)
    }
    assert set(statuses.values()) == {404}, statuses
