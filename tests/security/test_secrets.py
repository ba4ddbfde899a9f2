"""No secret in any response or log line, over a scripted run against a real server.

A uvicorn process (access log on, the app's loggers at INFO, everything captured in one
log file) serves a prepared study. The script logs in (once with a wrong password first),
creates an API key in the admin UI, creates a session with it, follows the resume link,
answers through the API and through the respondent page, sends an invitation and opens
it, and reads the admin pages, exports and API responses.

Secrets: the password and the wrong password tried, the password hash, the app's secret
key (signs cookies and the CSRF scheme), the new API key, the session token, the
invitation token. Rules checked:

* no log line contains any of them (the access log shows ``[redacted]`` for the tokens in
  resume, invitation and member-link paths);
* no response contains one, except the response that issues it (the key page right after
  creating the key, the session-creation JSON, the invitation notice), a request that
  itself carries it (e.g. the invitation page at its own URL), and the respondent's own
  pages, which show the respondent their private resume link;
* the password hash and the secret key appear in no response at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sqlmodel import Session, select

from app.auth import set_password
from app.middleware import redact
from app.tables import Researcher
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import make_live_study
from tests.support.secutil import SECRET, LiveServer, live_server

PASSWORD = "secret-password-4d1f9a"
WRONG = "wrong-password-8c2e71"


@dataclass
class Recorder:
    """Every request/response pair of the scripted run."""

    exchanges: list[tuple[str, str, str, str]] = field(default_factory=list)

    def hook(self, response: httpx.Response) -> None:
        response.read()
        req = response.request
        try:
            content = req.content.decode("utf-8", "replace")
        except httpx.RequestNotRead:
            content = ""
        sent = f"{req.url} {req.headers} {content}"
        self.exchanges.append(
            (req.method, req.url.path, sent, f"{response.headers} {response.text}")
        )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("secrets")
    url = f"sqlite:///{folder / 'secrets.db'}"
    live = make_live_study(
        url,
        write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 30),
        settings={"budgets": {"max_questions": 3}},
    )
    with Session(live.engine) as db:
        admin = db.exec(select(Researcher).where(Researcher.email == "admin@example.org")).one()
        set_password(admin, PASSWORD, session=db)
        password_hash = admin.password_hash
    live.engine.dispose()
    rec = Recorder()
    with live_server(
        url, folder / "server.log", env_extra={"PRIORLY_LOG_LEVEL": "info"}, log_level="info"
    ) as srv:
        secrets = _script(srv, live.slug, rec)
        log = srv.log
    secrets.update(password=PASSWORD, wrong=WRONG, hash=password_hash, secret_key=SECRET)
    yield {"rec": rec, "log": log.read_text(errors="replace"), "secrets": secrets}


def _client(srv: LiveServer, rec: Recorder) -> httpx.Client:
    return httpx.Client(
        base_url=srv.base,
        timeout=60,
        follow_redirects=True,
        event_hooks={"response": [rec.hook]},
    )


def _script(srv: LiveServer, slug: str, rec: Recorder) -> dict[str, str]:
    out: dict[str, str] = {}
    with _client(srv, rec) as ui:
        ui.get("/admin/login")
        csrf = ui.cookies["priorly_csrf"]
        r = ui.post(
            "/admin/login",
            data={"email": "admin@example.org", "password": WRONG, "csrf_token": csrf},
        )
        assert r.status_code == 401
        r = ui.post(
            "/admin/login",
            data={"email": "admin@example.org", "password": PASSWORD, "csrf_token": csrf},
            follow_redirects=False,
        )
        assert r.status_code == 303
        csrf = ui.cookies["priorly_csrf"]  # rotated at login
        out["csrf"] = csrf
        r = ui.post("/admin/keys", data={"name": "script", "csrf_token": csrf})
        match = re.search(r"pk_[A-Za-z0-9_\-]+", r.text)
        assert match, "the new key is shown once on the keys page"
        out["api_key"] = match.group(0)
        r = ui.post("/admin/invitations", data={"email": "new@example.org", "csrf_token": csrf})
        invite = re.search(r"/admin/invite/([A-Za-z0-9_\-]+)", r.text)
        assert invite
        out["invitation"] = invite.group(1)
        for path in (
            "/admin",
            "/admin/keys",
            "/admin/accounts",
            f"/admin/studies/{slug}",
            f"/admin/studies/{slug}/dashboard",
            f"/admin/studies/{slug}/export/answers_long.csv",
            f"/admin/studies/{slug}/export/codebook.jsonl",
            "/openapi.json",
        ):
            assert ui.get(path).status_code == 200, path
    with _client(srv, rec) as api:
        key = {"Authorization": f"Bearer {out['api_key']}"}
        r = api.post(f"/api/v1/studies/{slug}/sessions", json={}, headers=key)
        assert r.status_code == 201
        body = r.json()
        out["token"] = body["token"]
        sid = body["session_id"]
        q = body["question"]
        bearer = {"Authorization": f"Bearer {out['token']}"}
        r = api.post(
            f"/api/v1/sessions/{sid}/answers",
            json={"item": q["item"], "option": q["options"][0]["letter"], "idempotency_key": "s1"},
            headers=bearer,
        )
        assert r.status_code == 200
        for path in ("", "/predictions", "/explanation"):
            assert api.get(f"/api/v1/sessions/{sid}{path}", headers=key).status_code == 200
    with _client(srv, rec) as browser:
        r = browser.get(f"/s/{slug}/resume/{out['token']}")
        assert r.status_code == 200
        item = re.search(r'name="item" value="([^"]+)"', r.text)
        option = re.search(r'name="option"[^>]*value="([^"]+)"', r.text)
        assert item and option
        browser.post(f"/s/{slug}/answer", data={"item": item.group(1), "option": option.group(1)})
    with _client(srv, rec) as guest:
        assert guest.get(f"/admin/invite/{out['invitation']}").status_code == 200
    return out


ISSUING = {
    "api_key": ("POST", "/admin/keys"),
    "token": ("POST", "/api/v1/studies/{slug}/sessions"),
    "invitation": ("POST", "/admin/invitations"),
}


def test_no_secret_in_any_log_line(run: dict[str, Any]) -> None:
    log = run["log"]
    assert "GET /healthz" in log or "POST /admin/login" in log, "the access log was captured"
    assert "/resume/[redacted]" in log and "/admin/invite/[redacted]" in log
    for name, value in run["secrets"].items():
        assert value and value not in log, f"the {name} appears in the server log"


def test_no_secret_in_responses_except_where_issued(run: dict[str, Any]) -> None:
    secrets = run["secrets"]
    problems = []
    for method, path, sent, received in run["rec"].exchanges:
        for name, value in secrets.items():
            if value not in received:
                continue
            if name in ("hash", "secret_key", "password", "wrong"):
                problems.append(f"{method} {path}: the {name} is in the response")
                continue
            if name == "csrf":
                continue  # the CSRF token is in every form by design (double submit)
            issuing = ISSUING.get(name)
            if (
                issuing
                and method == issuing[0]
                and re.fullmatch(issuing[1].replace("{slug}", "[^/]+"), path)
            ):
                continue
            if value in sent:
                continue  # the request carried it (its own URL or header)
            if name == "token" and path.startswith("/s/"):
                continue  # the respondent's own pages show their private resume link
            problems.append(f"{method} {path}: the {name} is in the response")
    assert not problems, "\n".join(problems)


def test_redaction_of_credential_paths() -> None:
    line = '127.0.0.1:5 - "GET /s/ces/resume/abc-DEF_123?x=1 HTTP/1.1" 303'
    assert redact(line) == '127.0.0.1:5 - "GET /s/ces/resume/[redacted]?x=1 HTTP/1.1" 303'
    assert redact("/admin/invite/tok/x") == "/admin/invite/[redacted]/x"
    assert redact("/g/member-token") == "/g/[redacted]"
    assert redact("/s/ces/q") == "/s/ces/q"
