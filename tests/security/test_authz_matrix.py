"""The authorization matrix: every route of the app x every kind of caller -> expected status.

Routes are read from the app itself (``create_app().routes``): a route that has no entry in
:data:`ROUTES` fails :func:`test_every_route_has_an_entry`, so a new page or API call cannot
ship without a decision about who may call it.

Callers (:data:`ACTORS`), each with real credentials made through the real flows:

* ``anonymous``: nobody (it still carries a CSRF cookie + header pair, so that the answer
  shows the authorization decision and not the CSRF check, which has its own test);
* ``resp_this`` / ``resp_other``: the respondent of the session under test / of another
  session of the same study: the respondent cookie (set by the resume link) and the session
  token as ``Authorization: Bearer``;
* ``owner``, ``not_owner``, ``shared``, ``admin``: researchers logged in to the admin UI (the
  study under test is owned by ``owner`` and shared with ``shared``);
* ``key_owner``, ``key_other``, ``key_shared``, ``key_admin``, ``key_revoked``: API keys of the
  owner, of an unrelated researcher, of the researcher the study is shared with, of an admin,
  and a revoked key of the owner.

Every allowed request that writes runs on its own copy of the prepared SQLite database (the
app's engine is pointed at the copy), so each cell sees the same starting state; every
denied request runs on the prepared database and must leave every table's row count
unchanged.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text
from sqlmodel import Session, select

from app.auth import create_account, create_invitation, set_password, share_study
from app.db import make_engine
from app.services.apikeys import create_api_key, revoke_api_key
from app.settings import Settings
from app.tables import Item, Job, Researcher, Study
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import make_live_study

PASSWORD = "matrix password 123"
CSRF = "matrix-csrf-token-0123456789"

ACTORS = (
    "anonymous",
    "resp_this",
    "resp_other",
    "owner",
    "not_owner",
    "shared",
    "admin",
    "key_owner",
    "key_other",
    "key_shared",
    "key_admin",
    "key_revoked",
)
RESPONDENTS = ("resp_this", "resp_other")
RESEARCHERS = ("owner", "not_owner", "shared", "admin")
KEYS = ("key_owner", "key_other", "key_shared", "key_admin", "key_revoked")
NOT_LOGGED_IN = ("anonymous", *RESPONDENTS, *KEYS)

API_HONOURS_SHARES = True
"""Whether an API key of a researcher the study is shared with may use the study through
the JSON API (yes: the API uses the admin UI's rule, app.auth.can_see_study)."""


# ----- expected statuses ---------------------------------------------------------------------


def everyone(status: int) -> dict[str, int]:
    return dict.fromkeys(ACTORS, status)


def logged_in(ok: int, method: str) -> dict[str, int]:
    """Any logged-in researcher: ``ok``; anyone else: to the login page (GET) or 401."""
    out = dict.fromkeys(NOT_LOGGED_IN, 303 if method == "GET" else 401)
    out.update(dict.fromkeys(RESEARCHERS, ok))
    return out


def study_member(ok: int, method: str, *, shared: int | None = None) -> dict[str, int]:
    """Owner, shared and admin: ``ok``; a researcher who cannot see the study: 404."""
    out = logged_in(ok, method)
    out["not_owner"] = 404
    if shared is not None:
        out["shared"] = shared
    return out


def admin_only(ok: int, method: str) -> dict[str, int]:
    out = logged_in(404, method)
    out["admin"] = ok
    return out


def api_study(ok: int) -> dict[str, int]:
    """A call on a study with an API key: owner's and admin's key ``ok``; others 404/401."""
    out = everyone(401)
    out.update(key_owner=ok, key_admin=ok, key_other=404)
    out["key_shared"] = ok if API_HONOURS_SHARES else 404
    out["resp_this"] = out["resp_other"] = 401  # a session token is not an API key
    return out


def api_session(ok: int) -> dict[str, int]:
    """A call on one session: its own token and the study's keys ``ok``; others 404/401."""
    out = everyone(401)
    out.update(resp_this=ok, resp_other=404, key_owner=ok, key_admin=ok, key_other=404)
    out["key_shared"] = ok if API_HONOURS_SHARES else 404
    return out


@dataclass
class Case:
    """One route: how to call it and what each actor gets.

    ``path`` uses ``{slug}``, ``{session_id}``, ``{item_id}``, ``{job_id}``, ``{key_id}``,
    ``{token}`` (an open invitation), ``{resume}`` (the resume token of ``resp_this``).
    """

    expect: dict[str, int]
    path: str | None = None  # default: the route's own path
    form: dict[str, str] | None = None
    json: Any = None
    writes: bool | None = None  # default: method != GET


ITEM_FORM = {"key": "zz_new", "question": "A new question?", "options": "A: yes\nB: no"}
SIM_RESULT = {
    "budget": 2,
    "n_test": 10,
    "targets": ["t"],
    "candidates": ["a", "b"],
    "methods": {"full": {"accuracy": [0.8] * 3, "log_loss": [0.5] * 3}},
    "study_method": "full",
    "questions_needed": {"80%": 1, "90%": 1, "95%": 2},
}

ROUTES: dict[tuple[str, str], Case] = {
    # ---- public: documentation, health, home ----
    ("GET", "/openapi.json"): Case(everyone(200)),
    ("GET", "/api/docs"): Case(everyone(200)),
    ("GET", "/api/docs/assets/{name}"): Case(everyone(200), path="/api/docs/assets/swagger-ui.css"),
    ("GET", "/api/docs/first-session"): Case(everyone(200)),
    ("GET", "/healthz"): Case(everyone(200)),
    # what no API route takes (no data): OPTIONS lists the methods of an API path (204),
    # another method of a path with routes is 405, a path without routes 404
    ("OPTIONS", "/api/v1/{path:path}"): Case(
        everyone(204), path="/api/v1/sessions/{session_id}", writes=False
    ),
    ("GET", "/api/v1/{path:path}"): Case(everyone(404), path="/api/v1/studies/{slug}/items"),
    ("DELETE", "/api/v1/{path:path}"): Case(everyone(404), path="/api/v1/nothing"),
    ("POST", "/api/v1/{path:path}"): Case(
        everyone(405), path="/api/v1/sessions/{session_id}", json={}, writes=False
    ),
    ("PUT", "/api/v1/{path:path}"): Case(
        everyone(405), path="/api/v1/sessions/{session_id}", json={}, writes=False
    ),
    ("PATCH", "/api/v1/{path:path}"): Case(
        everyone(405), path="/api/v1/sessions/{session_id}", json={}, writes=False
    ),
    ("GET", "/"): Case(everyone(200)),
    ("GET", "/favicon.ico"): Case(everyone(301)),  # to the static icon
    # ---- respondent pages: the cookie names the caller's own session, never another ----
    ("GET", "/s/{slug}"): Case({**everyone(200), "resp_this": 303, "resp_other": 303}),
    ("POST", "/s/{slug}/consent"): Case(everyone(303), form={"choice": "accept"}),
    ("GET", "/s/{slug}/declined"): Case(everyone(200)),
    ("GET", "/s/{slug}/resume/{token}"): Case(everyone(303), path="/s/{slug}/resume/{resume}"),
    ("GET", "/s/{slug}/q"): Case({**everyone(303), "resp_this": 200, "resp_other": 200}),
    ("POST", "/s/{slug}/about"): Case(everyone(303), form={}),
    ("POST", "/s/{slug}/answer"): Case(
        everyone(303),  # resp_other: back to its own current question
        form={"item": "{item_key}", "option": "{option}"},
    ),
    ("GET", "/s/{slug}/done"): Case({**everyone(303), "resp_this": 303, "resp_other": 303}),
    ("GET", "/s/{slug}/delete"): Case(everyone(200)),
    ("POST", "/s/{slug}/delete"): Case(everyone(422), form={}),  # unconfirmed: nothing erased
    # ---- JSON API ----
    ("POST", "/api/v1/studies/{slug}/sessions"): Case(api_study(201), json={}),
    ("GET", "/api/v1/sessions/{session_id}"): Case(api_session(200)),
    ("POST", "/api/v1/sessions/{session_id}/answers"): Case(
        api_session(200),
        json={"item": "{item_key}", "option": "{option}", "idempotency_key": "matrix-1"},
    ),
    ("GET", "/api/v1/sessions/{session_id}/predictions"): Case(api_session(200)),
    ("GET", "/api/v1/sessions/{session_id}/explanation"): Case(api_session(200)),
    ("GET", "/api/v1/sessions/{session_id}/profile"): Case(api_session(200)),
    ("POST", "/api/v1/sessions/{session_id}/finish"): Case(api_session(200)),
    ("DELETE", "/api/v1/sessions/{session_id}"): Case(api_session(200)),
    # results: any valid key lists the studies it may see (another's key: an empty list)
    ("GET", "/api/v1/studies"): Case(
        {
            **everyone(401),
            **dict.fromkeys(("key_owner", "key_other", "key_shared", "key_admin"), 200),
        }
    ),
    ("GET", "/api/v1/studies/{slug}"): Case(api_study(200)),
    ("GET", "/api/v1/studies/{slug}/responses"): Case(api_study(200)),
    ("GET", "/api/v1/studies/{slug}/predictions"): Case(api_study(200)),
    # ---- admin: login, invitations (the token is the credential) ----
    ("GET", "/admin/login"): Case(everyone(200)),
    ("POST", "/admin/login"): Case(
        everyone(303), form={"email": "owner@example.org", "password": PASSWORD}
    ),
    ("POST", "/admin/logout"): Case(everyone(303)),
    ("GET", "/admin/invite/{token}"): Case(everyone(200)),
    ("POST", "/admin/invite/{token}"): Case(  # reaches the form check (passwords differ)
        everyone(422), form={"password": "invited password 1", "password2": "another one 1"}
    ),
    # ---- admin: any researcher ----
    ("GET", "/admin"): Case(logged_in(200, "GET")),
    ("POST", "/admin/studies"): Case(logged_in(303, "POST"), form={"name": "Matrix study"}),
    ("GET", "/admin/import"): Case(logged_in(200, "GET")),
    ("POST", "/admin/import/shipped"): Case(
        logged_in(422, "POST"), form={"dataset": "no-such-dataset"}
    ),
    ("POST", "/admin/import/upload"): Case(logged_in(422, "POST"), form={"action": "preview"}),
    ("GET", "/admin/keys"): Case(logged_in(200, "GET")),
    ("POST", "/admin/keys"): Case(logged_in(200, "POST"), form={"name": "matrix"}),
    ("POST", "/admin/keys/{key_id}/revoke"): Case(
        {**logged_in(404, "POST"), "owner": 200}  # only one's own keys
    ),
    # ---- admin: the study's owner, researchers it is shared with, admins ----
    ("GET", "/admin/studies/{slug}"): Case(study_member(200, "GET")),
    ("POST", "/admin/studies/{slug}/texts"): Case(
        study_member(303, "POST"), form={"name": "Renamed", "consent_text": "ok"}
    ),
    ("POST", "/admin/studies/{slug}/settings"): Case(
        study_member(303, "POST"), form={"criterion": "eig", "max_questions": "5"}
    ),
    ("POST", "/admin/studies/{slug}/items"): Case(study_member(303, "POST"), form=ITEM_FORM),
    ("POST", "/admin/studies/{slug}/items/{item_id}"): Case(
        study_member(303, "POST"), form={"question": "Reworded?"}
    ),
    ("POST", "/admin/studies/{slug}/items/roles"): Case(
        study_member(422, "POST"),
        form={"role": "target"},  # no item selected: 422
    ),
    ("POST", "/admin/studies/{slug}/status"): Case(
        study_member(303, "POST"), form={"status": "closed"}
    ),
    ("POST", "/admin/studies/{slug}/share"): Case(
        study_member(303, "POST", shared=422), form={"email": "other@example.org"}
    ),
    ("GET", "/admin/studies/{slug}/jobs"): Case(study_member(200, "GET")),
    ("POST", "/admin/studies/{slug}/jobs"): Case(
        study_member(303, "POST"), form={"kind": "simulation", "budget": "2"}
    ),
    ("GET", "/admin/studies/{slug}/jobs/{job_id}"): Case(study_member(200, "GET")),
    ("POST", "/admin/studies/{slug}/jobs/{job_id}/cancel"): Case(
        study_member(200, "POST"), path="/admin/studies/{slug}/jobs/{queued_job_id}/cancel"
    ),
    ("GET", "/admin/studies/{slug}/jobs/{job_id}/plot.svg"): Case(study_member(200, "GET")),
    ("POST", "/admin/studies/{slug}/refit"): Case(study_member(303, "POST")),
    ("GET", "/admin/studies/{slug}/personas"): Case(study_member(200, "GET")),
    ("POST", "/admin/studies/{slug}/personas/texts"): Case(
        study_member(303, "POST"), form={"texts": "A retired nurse from Leeds"}
    ),
    ("POST", "/admin/studies/{slug}/personas/shares"): Case(
        study_member(422, "POST"),
        form={"sample": "3"},  # no share typed: 422
    ),
    ("POST", "/admin/studies/{slug}/personas/respondents"): Case(
        study_member(422, "POST"),
        form={"profiles": "0"},  # out of range (or no attributes)
    ),
    ("POST", "/admin/studies/{slug}/personas/clear"): Case(study_member(303, "POST")),
    ("POST", "/admin/studies/{slug}/personas/generate"): Case(
        study_member(422, "POST"), form={"backend": "another"}
    ),
    ("GET", "/admin/studies/{slug}/simulation"): Case(study_member(200, "GET")),
    ("GET", "/admin/studies/{slug}/dashboard"): Case(study_member(200, "GET")),
    ("GET", "/admin/studies/{slug}/dashboard/respondent"): Case(
        study_member(404, "GET"),
        path="/admin/studies/{slug}/dashboard/respondent?respondent=999999",
    ),
    ("GET", "/admin/studies/{slug}/respondents"): Case(study_member(200, "GET")),
    ("GET", "/admin/studies/{slug}/respondents/{respondent_id}"): Case(
        study_member(404, "GET"), path="/admin/studies/{slug}/respondents/999999"
    ),
    ("POST", "/admin/studies/{slug}/respondents/{respondent_id}/erase"): Case(
        study_member(404, "POST"), path="/admin/studies/{slug}/respondents/999999/erase"
    ),
    ("GET", "/admin/studies/{slug}/groups"): Case(study_member(200, "GET")),
    ("GET", "/admin/studies/{slug}/qr.svg"): Case(study_member(200, "GET")),
    ("POST", "/admin/studies/{slug}/preview"): Case(study_member(303, "POST")),
    ("GET", "/admin/studies/{slug}/export"): Case(study_member(200, "GET")),
    ("GET", "/admin/studies/{slug}/export/{name}"): Case(
        study_member(200, "GET"), path="/admin/studies/{slug}/export/answers_long.csv"
    ),
    # ---- group rounds (issue 7) ----
    # No round exists in this world: members reach the handler and get its 404/422.
    ("GET", "/admin/studies/{slug}/groups/{number}"): Case(
        study_member(404, "GET"), path="/admin/studies/{slug}/groups/1"
    ),
    ("GET", "/admin/studies/{slug}/groups/{number}/{name}"): Case(
        study_member(404, "GET"), path="/admin/studies/{slug}/groups/1/answers.csv"
    ),
    ("POST", "/admin/studies/{slug}/groups/open"): Case(study_member(422, "POST"), form={}),
    ("GET", "/admin/studies/{slug}/groups/open"): Case(study_member(303, "GET")),
    ("GET", "/admin/studies/{slug}/groups/plan"): Case(study_member(303, "GET")),
    ("GET", "/admin/studies/{slug}/groups/{number}/close"): Case(
        study_member(303, "GET"), path="/admin/studies/{slug}/groups/1/close"
    ),
    ("POST", "/admin/studies/{slug}/groups/plan"): Case(
        study_member(303, "POST"), form={"selection": "elook"}
    ),
    ("GET", "/admin/studies/{slug}/groups/distribution.svg"): Case(study_member(200, "GET")),
    ("POST", "/admin/studies/{slug}/groups/{number}/close"): Case(
        study_member(404, "POST"), path="/admin/studies/{slug}/groups/1/close"
    ),
    ("GET", "/g/{token}"): Case(everyone(404), path="/g/not-a-member-link"),
    ("POST", "/g/{token}"): Case(everyone(404), path="/g/not-a-member-link", form={"option": "A"}),
    # ---- admin: admins only ----
    ("GET", "/admin/accounts"): Case(admin_only(200, "GET")),
    ("POST", "/admin/accounts"): Case(
        admin_only(200, "POST"), form={"email": "made@example.org", "password": "made password 1"}
    ),
    ("POST", "/admin/invitations"): Case(
        admin_only(200, "POST"), form={"email": "inv@example.org"}
    ),
}


# ----- the app's routes ----------------------------------------------------------------------


def app_routes(app: Any) -> set[tuple[str, str]]:
    """``(method, path)`` of every route of ``app`` (HEAD and mounted static files left out)."""
    try:
        from fastapi.routing import iter_route_contexts

        contexts = list(iter_route_contexts(app.routes))
    except ImportError:  # older FastAPI: routes are flat
        contexts = list(app.routes)
    out = set()
    for route in contexts:
        methods = getattr(route, "methods", None)
        if not methods:
            continue  # Mount (/static): public files
        for method in methods - {"HEAD"}:
            out.add((method, route.path))
    return out


# ----- the prepared world --------------------------------------------------------------------


@dataclass
class World:
    db_file: Path
    settings: Settings
    slug: str
    values: dict[str, str]
    headers: dict[str, dict[str, str]]
    cookies: dict[str, dict[str, str]]


def _row_counts(engine: Any) -> dict[str, int]:
    """Rows per table, except the rate limiter's counters (every call counts, by design)."""
    names = [n for n in inspect(engine).get_table_names() if n != "rate_limit_counter"]
    with engine.connect() as conn:
        return {
            n: int(conn.execute(text(f'SELECT COUNT(*) FROM "{n}"')).scalar_one()) for n in names
        }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    folder = tmp_path_factory.mktemp("authz")
    db_file = folder / "template.db"
    url = f"sqlite:///{db_file}"
    live = make_live_study(url, write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 30))
    with Session(live.engine) as db:
        by_email = {r.email: r for r in db.exec(select(Researcher)).all()}
        for email in ("owner@example.org", "other@example.org", "admin@example.org"):
            set_password(by_email[email], PASSWORD, session=db)
        shared = create_account("shared@example.org", PASSWORD, session=db)
        study = db.get(Study, live.study_id)
        assert study is not None
        share_study(study, shared.email, session=db)
        shared_key = create_api_key(shared.email, session=db).key
        revoked = create_api_key("owner@example.org", session=db)
        revoke_api_key(revoked.prefix, session=db)
        owner_key_id = create_api_key("owner@example.org", session=db, name="to revoke").id
        invitation = create_invitation(
            "invitee@example.org", inviter=by_email["admin@example.org"], session=db
        )
        item_id = db.exec(select(Item.id).where(Item.study_id == study.id)).first()
        job = Job(
            kind="simulation",
            study_id=study.id,
            status="succeeded",
            progress=1.0,
            result=SIM_RESULT,
        )
        queued = Job(kind="simulation", study_id=study.id, status="queued")
        db.add(job)
        db.add(queued)
        db.commit()
        job_id, queued_job_id = job.id, queued.id
    settings = Settings(
        database_url=url,
        env="test",
        secret_key="m" * 40,  # type: ignore[arg-type]
        queue_path=folder / "queue.db",
    )
    from app.main import create_app

    headers: dict[str, dict[str, str]] = {a: {"X-CSRF-Token": CSRF} for a in ACTORS}
    cookies: dict[str, dict[str, str]] = {a: {"priorly_csrf": CSRF} for a in ACTORS}
    values = {"slug": live.slug, "token": invitation, "key_id": str(owner_key_id)}
    values.update(item_id=str(item_id), job_id=str(job_id), queued_job_id=str(queued_job_id))
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        for actor, key in (
            ("key_owner", live.owner_key),
            ("key_other", live.other_key),
            ("key_admin", live.admin_key),
            ("key_shared", shared_key),
            ("key_revoked", revoked.key),
        ):
            headers[actor]["Authorization"] = f"Bearer {key}"
        for actor in RESPONDENTS:  # real sessions through the API, cookies via the resume link
            r = client.post(
                f"/api/v1/studies/{live.slug}/sessions",
                json={},
                headers={"Authorization": f"Bearer {live.owner_key}"},
            )
            assert r.status_code == 201, r.text
            body = r.json()
            headers[actor]["Authorization"] = f"Bearer {body['token']}"
            client.cookies.clear()
            resume = client.get(f"/s/{live.slug}/resume/{body['token']}", follow_redirects=False)
            assert resume.status_code == 303
            cookies[actor].update(dict(resume.cookies))
            if actor == "resp_this":
                values.update(
                    session_id=str(body["session_id"]),
                    resume=body["token"],
                    item_key=body["question"]["item"],
                    option=body["question"]["options"][0]["letter"],
                )
        for actor, email in (
            ("owner", "owner@example.org"),
            ("not_owner", "other@example.org"),
            ("shared", "shared@example.org"),
            ("admin", "admin@example.org"),
        ):
            client.cookies.clear()
            r = client.post(
                "/admin/login",
                data={"email": email, "password": PASSWORD, "csrf_token": CSRF},
                headers={"Cookie": f"priorly_csrf={CSRF}"},
                follow_redirects=False,
            )
            assert r.status_code == 303, (email, r.text)
            cookies[actor] = dict(r.cookies)
            headers[actor] = {"X-CSRF-Token": cookies[actor]["priorly_csrf"]}
    live.engine.dispose()
    return World(db_file, settings, live.slug, values, headers, cookies)


@pytest.fixture(scope="module")
def client(world: World) -> Iterator[TestClient]:
    from app.main import create_app

    with TestClient(create_app(world.settings), base_url="http://localhost") as c:
        yield c


def _fill(template: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        template = template.replace("{" + name + "}", value)
    return template


def _call(client: TestClient, world: World, method: str, path: str, case: Case, actor: str) -> Any:
    url = _fill(case.path or path, world.values)
    assert "{" not in url, f"unfilled path parameter in {url}"
    kwargs: dict[str, Any] = {"headers": dict(world.headers[actor])}
    if case.form is not None:
        kwargs["data"] = {k: _fill(v, world.values) for k, v in case.form.items()}
    if case.json is not None:
        body = case.json
        if isinstance(body, dict):
            body = {k: _fill(v, world.values) if isinstance(v, str) else v for k, v in body.items()}
        kwargs["json"] = body
    kwargs["headers"]["Cookie"] = _cookie_header(world.cookies[actor])
    client.cookies.clear()
    try:
        return client.request(method, url, follow_redirects=False, **kwargs)
    finally:
        client.cookies.clear()


def _cookie_header(cookies: dict[str, str]) -> str:
    return "; ".join(f"{name}={value}" for name, value in cookies.items())


# ----- the tests -----------------------------------------------------------------------------


def test_every_route_has_an_entry(client: TestClient) -> None:
    routes = app_routes(client.app)
    missing = sorted(routes - ROUTES.keys())
    stale = sorted(ROUTES.keys() - routes)
    assert not missing, f"routes without an entry in the authorization matrix: {missing}"
    assert not stale, f"matrix entries for routes that no longer exist: {stale}"
    for key, case in ROUTES.items():
        assert set(case.expect) == set(ACTORS), f"{key}: an expectation for every actor"


@pytest.mark.parametrize(("method", "path"), sorted(ROUTES), ids=lambda x: str(x))
def test_matrix(client: TestClient, world: World, method: str, path: str) -> None:
    case = ROUTES[(method, path)]
    writes = case.writes if case.writes is not None else method != "GET"
    app = client.app
    template_engine = app.state.engine  # type: ignore[attr-defined]
    failures = []
    for n, actor in enumerate(ACTORS):
        expected = case.expect[actor]
        allowed = expected < 400 or expected == 422
        if writes and allowed:
            # A fresh copy of the prepared database for a request that may write.
            copy = world.db_file.with_name(f"cell-{n}.db")
            shutil.copyfile(world.db_file, copy)
            engine = make_engine(f"sqlite:///{copy}")
            app.state.engine = engine  # type: ignore[attr-defined]
            try:
                r = _call(client, world, method, path, case, actor)
            finally:
                app.state.engine = template_engine  # type: ignore[attr-defined]
                engine.dispose()
                copy.unlink()
        else:
            before = _row_counts(template_engine)
            r = _call(client, world, method, path, case, actor)
            after = _row_counts(template_engine)
            if writes and before != after:
                failures.append(f"{actor}: a denied request changed row counts")
        if r.status_code != expected:
            failures.append(f"{actor}: expected {expected}, got {r.status_code} {r.text[:160]!r}")
        elif r.status_code == 401 and path.startswith("/api/"):
            if r.json().get("code") != "unauthenticated":
                failures.append(f"{actor}: 401 without code 'unauthenticated'")
        elif r.status_code == 404 and path.startswith("/api/"):
            if not r.json().get("code", "").endswith("not_found"):
                failures.append(f"{actor}: 404 without a *_not_found code")
    assert not failures, f"{method} {path}:\n" + "\n".join(failures)


def test_state_changing_admin_request_needs_the_csrf_token(
    client: TestClient, world: World
) -> None:
    """The matrix sends the CSRF pair; without it, even the owner is refused (403)."""
    client.cookies.clear()
    cookie = _cookie_header(world.cookies["owner"])
    try:
        for data, headers in (
            ({}, {}),  # no token
            ({}, {"X-CSRF-Token": "not-the-cookie-value"}),
            ({"csrf_token": "é"}, {}),  # non-ASCII tokens: refused, not a 500
            ({"csrf_token": "\u202e" + CSRF}, {}),
            ({}, {"X-CSRF-Token": "\xe9".encode("latin-1")}),
        ):
            r = client.post(
                f"/admin/studies/{world.slug}/status",
                data={"status": "closed", **data},
                headers={**headers, "Cookie": cookie},
                follow_redirects=False,
            )
            assert r.status_code == 403, (data, headers)
    finally:
        client.cookies.clear()


def test_unknown_ids_are_404_for_allowed_callers(client: TestClient, world: World) -> None:
    """An authorized caller asking for something that does not exist gets 404, like a caller
    asking for something that is not theirs (no existence oracle)."""
    case = Case(everyone(0))
    r = _call(client, world, "GET", "/api/v1/sessions/999999", case, "key_admin")
    assert r.status_code == 404 and r.json()["code"] == "session_not_found"
    r = _call(client, world, "GET", "/admin/studies/no-such-study", case, "admin")
    assert r.status_code == 404
    r = _call(client, world, "GET", "/admin/invite/not-a-token", case, "anonymous")
    assert r.status_code == 404
