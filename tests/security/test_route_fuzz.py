"""Hostile values sent to EVERY route of the app, on a real uvicorn over SQLite and
PostgreSQL: no answer may be a server error (>= 500).

The routes are read from the app itself (``create_app().routes``; the admin pages and the
survey pages are not in the OpenAPI document, so :mod:`test_api_fuzz` does not reach
them), so a new route is fuzzed without anyone adding it here. For each route and each
probe the request is sent once with every path parameter replaced and once per path
parameter with only that one replaced (the others real: the live study's slug, a real
session, item, job, API key, round), as a logged-in admin (with the CSRF token of the
login), with the owner's API key (or the session's token) and the respondent flow's
cookies where the route needs them. The probes:

* ``nul``: ``a<NUL>b`` in the path parameters, a query parameter, and every form field /
  JSON string of the body: 422 ``invalid_input`` expected (before any route runs);
* ``surrogate``: a lone surrogate (``\\ud800``; in a URL its UTF-8 bytes, which the server
  decodes as U+FFFD) in the same places;
* ``bigint``: out-of-range integers (2^31 and 2^63, PostgreSQL's and SQLite's limits)
  in the path parameters and every form field / JSON value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from tests.support.secutil import HostileWorld, admin_client, hostile_world

NUL = "a\x00b"
SURROGATE_URL = "%ED%A0%80"  # the UTF-8 bytes of U+D800 (not valid UTF-8)
BIG = ("2147483648", "9223372036854775808")
FORM_FIELDS = (
    "name", "email", "password", "password2", "text", "title", "intro", "consent_text",
    "question", "options", "key", "role", "status", "criterion", "job_id", "kind",
    "choice", "option", "item", "external_id", "idempotency_key", "action", "id_column",
    "attributes", "max_questions", "rounds", "dataset", "topic", "belief_model",
)  # fmt: skip
PARAM = re.compile(r"\{([^}:]+)(?::[^}]+)?\}")


def _routes() -> list[tuple[str, str]]:
    from fastapi.routing import iter_route_contexts

    app = create_app(Settings(database_url="sqlite://"))
    out = []
    for route in iter_route_contexts(app.routes):
        for method in sorted((getattr(route, "methods", None) or set()) - {"HEAD"}):
            out.append((method, str(route.path)))
    return out


def _cases() -> list[Any]:
    cases = []
    for method, path in _routes():
        for probe in ("nul", "surrogate", "bigint"):
            cases.append(pytest.param(method, path, probe, id=f"{method} {path} {probe}"))
    return cases


@dataclass
class Fuzz:
    world: HostileWorld
    real: dict[str, str]
    session_token: str
    respondent_cookies: dict[str, str]
    login: dict[str, str]
    """The cookies of the admin's login (session and CSRF), shared by the module's tests."""


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzz(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fuzz]:
    from sqlmodel import Session, select

    from app.db import make_engine
    from app.tables import ApiKey, Item, Job

    folder = tmp_path_factory.mktemp(f"route-fuzz-{request.param}")
    with hostile_world(request.param, folder) as world:
        live = world.live
        base = world.server.base
        created = httpx.post(
            f"{base}/api/v1/studies/{live.slug}/sessions",
            json={},
            headers={"Authorization": f"Bearer {live.owner_key}"},
        )
        assert created.status_code == 201, created.text
        sess = created.json()
        with httpx.Client(base_url=base) as browser:
            browser.get(f"/s/{live.slug}/resume/{sess['token']}")
            cookies = dict(browser.cookies)
        engine = make_engine(live.url)
        with Session(engine) as db:
            item_id = db.exec(select(Item.id).where(Item.study_id == live.study_id)).first()
            job = Job(kind="simulation", study_id=live.study_id, status="queued")
            db.add(job)
            db.commit()
            key_id = db.exec(select(ApiKey.id)).first()
            real = {
                "slug": live.slug,
                "session_id": str(sess["session_id"]),
                "token": sess["token"],
                "item_id": str(item_id),
                "job_id": str(job.id),
                "key_id": str(key_id),
                "respondent_id": "1",  # an imported respondent: never erased by the admin route
                "number": "1",
                "name": "answers_wide.csv",
                "path": f"sessions/{sess['session_id']}",
            }
        engine.dispose()
        yield Fuzz(world, real, sess["token"], cookies, _login(world))


def _login(world: HostileWorld) -> dict[str, str]:
    """The cookies of a fresh admin login through the login form."""
    with admin_client(world.server) as admin:
        return dict(admin.cookies)


@contextmanager
def _admin(fuzz: Fuzz) -> Iterator[httpx.Client]:
    """A client with the admin's login and the respondent's cookies. A probe may end the
    login (``POST /admin/logout``): it is made again for the next test, one login per
    module otherwise (a login verifies an argon2 hash)."""
    base = fuzz.world.server.base
    try:
        with httpx.Client(base_url=base, timeout=60) as admin:
            admin.cookies.update(fuzz.login)
            admin.cookies.update(fuzz.respondent_cookies)
            admin.headers["X-CSRF-Token"] = fuzz.login["priorly_csrf"]
            yield admin
    finally:
        with httpx.Client(base_url=base, cookies=fuzz.login) as check:
            if check.get("/admin", follow_redirects=False).status_code != 200:
                fuzz.login = _login(fuzz.world)


def _url(path: str, values: dict[str, str]) -> str:
    def fill(m: re.Match[str]) -> str:
        value = values[m.group(1)]
        return value if value.startswith("%") else quote(value, safe="/")

    return PARAM.sub(fill, path)


def _bodies(probe: str, big: str) -> tuple[dict[str, str], bytes]:
    """(form fields, JSON body bytes) of a probe."""
    if probe == "nul":
        form = {f: NUL for f in FORM_FIELDS}
        return form, json.dumps(form).encode()
    if probe == "surrogate":
        form = {f: "x\ufffdy" for f in FORM_FIELDS}
        raw = "{" + ", ".join(f'"{f}": "x\\ud800y"' for f in FORM_FIELDS) + "}"
        return form, raw.encode()
    form = {f: big for f in FORM_FIELDS}
    body = {f: int(big) for f in FORM_FIELDS}
    body["attributes"] = {"x": big}  # type: ignore[assignment]
    return form, json.dumps(body).encode()


def _variants(path: str, real: dict[str, str], value: str) -> list[dict[str, str]]:
    names = PARAM.findall(path)
    out = [dict(real, **{n: value for n in names})]
    if len(names) > 1:
        out += [dict(real, **{n: value}) for n in names]
    return out


@pytest.mark.parametrize(("method", "path", "probe"), _cases())
def test_no_server_error(fuzz: Fuzz, method: str, path: str, probe: str) -> None:
    values = {"nul": [quote(NUL)], "surrogate": [SURROGATE_URL], "bigint": list(BIG)}[probe]
    failures = []
    with _admin(fuzz) as admin:
        for value in values:
            form, body = _bodies(probe, value)
            for params in _variants(path, fuzz.real, value):
                url = _url(path, params)
                query = {"q": NUL} if probe == "nul" else {"q": value}
                headers: dict[str, str] = {}
                if path.startswith("/api/v1/sessions"):
                    headers["Authorization"] = f"Bearer {fuzz.session_token}"
                elif path.startswith("/api/v1"):
                    headers["Authorization"] = f"Bearer {fuzz.world.live.owner_key}"
                kwargs: dict[str, Any] = {"params": query, "headers": headers}
                if method in ("POST", "PUT", "PATCH"):
                    if path.startswith("/api/"):
                        kwargs["content"] = body
                        headers["content-type"] = "application/json"
                    else:
                        kwargs["data"] = form
                r = admin.request(method, url, follow_redirects=False, **kwargs)
                if r.status_code >= 500:
                    failures.append(f"{method} {url[:120]} -> {r.status_code}: {r.text[:200]}")
                elif probe == "nul" and r.status_code != 422:
                    failures.append(f"{method} {url[:120]} -> {r.status_code}, not 422")
                elif probe == "nul":
                    assert r.json()["code"] == "invalid_input"
    assert not failures, "\n".join(failures)
