"""Accounts in the admin UI: login, CSRF, logout, cookies, roles, invitations, study access."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.auth import hash_password, verify_password
from app.services.apikeys import create_api_key, record_key_use, revoke_api_key
from app.tables import ApiKey, Researcher, Study, utcnow
from tests.support.admin import PASSWORD, csrf, login


def test_password_hash_is_argon2_and_verifies() -> None:
    h = hash_password("a long password")
    assert h.startswith("$argon2id$")
    assert verify_password(h, "a long password")
    assert not verify_password(h, "a long passworD")
    assert not verify_password(None, "anything at all")


def test_login_sets_safe_cookies_and_logout_clears(client: TestClient, alice: Researcher) -> None:
    r = client.get("/admin", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith("/admin/login")
    client.get("/admin/login")
    r = client.post(
        "/admin/login",
        data={"email": "ALICE@example.org", "password": PASSWORD, "csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert r.status_code == 303
    set_cookies = r.headers.get_list("set-cookie")
    session_cookie = next(c for c in set_cookies if c.startswith("priorly_session="))
    assert "HttpOnly" in session_cookie and "SameSite=lax" in session_cookie
    assert "Secure" not in session_cookie  # localhost
    page = client.get("/admin")
    assert page.status_code == 200 and "alice@example.org" in page.text
    r = client.post("/admin/logout", data={"csrf_token": csrf(client)}, follow_redirects=False)
    assert r.status_code == 303
    assert client.get("/admin", follow_redirects=False).status_code == 303


def test_wrong_password_is_refused(client: TestClient, alice: Researcher) -> None:
    client.get("/admin/login")
    r = client.post(
        "/admin/login",
        data={
            "email": "alice@example.org",
            "password": "wrong password!",
            "csrf_token": csrf(client),
        },
    )
    assert r.status_code == 401 and "wrong email or password" in r.text
    assert client.cookies.get("priorly_session") is None


def test_cookies_are_secure_outside_localhost(settings, alice: Researcher) -> None:  # type: ignore[no-untyped-def]
    from app.main import create_app

    with TestClient(create_app(settings), base_url="https://admin.example.org") as c:
        page = c.get("/admin/login")
        assert "Secure" in page.headers["set-cookie"]
        r = c.post(
            "/admin/login",
            data={"email": "alice@example.org", "password": PASSWORD, "csrf_token": csrf(c)},
            follow_redirects=False,
        )
        assert all("Secure" in v for v in r.headers.get_list("set-cookie"))


def test_form_without_csrf_token_is_rejected(
    client: TestClient, alice: Researcher, db: Session
) -> None:
    client.get("/admin/login")
    r = client.post("/admin/login", data={"email": "alice@example.org", "password": PASSWORD})
    assert r.status_code == 403
    assert client.cookies.get("priorly_session") is None
    login(client, "alice@example.org")
    for data in ({"name": "Sneaky"}, {"name": "Sneaky", "csrf_token": "forged"}):
        r = client.post("/admin/studies", data=data)
        assert r.status_code == 403, r.text
    assert db.exec(select(Study).where(Study.name == "Sneaky")).first() is None
    r = client.post(
        "/admin/studies", data={"name": "Fine", "csrf_token": csrf(client)}, follow_redirects=False
    )
    assert r.status_code == 303
    # htmx requests send the token as a header
    r = client.post(
        "/admin/studies",
        data={"name": "Fine two"},
        headers={"X-CSRF-Token": csrf(client)},
        follow_redirects=False,
    )
    assert r.status_code == 303


def test_researcher_cannot_see_or_change_anothers_study(
    client: TestClient, ces_study: Study, bob: Researcher, db: Session
) -> None:
    login(client, "bob@example.org")
    home = client.get("/admin")
    assert ces_study.slug not in home.text
    base = f"/admin/studies/{ces_study.slug}"
    for path in (
        "",
        "/jobs",
        "/simulation",
        "/dashboard",
        "/export",
        "/export/answers_wide.csv",
        "/groups",
    ):
        assert client.get(base + path).status_code == 404, path
    token = csrf(client)
    posts = {
        "/texts": {
            "name": "hijacked",
            "description": "",
            "consent_text": "",
            "completion_code": "",
            "redirect_url": "",
        },
        "/status": {"status": "closed"},
        "/jobs": {"kind": "simulation"},
        "/share": {"email": "bob@example.org"},
        "/items": {"key": "x", "question": "q", "options": "a\nb", "role": "question"},
    }
    for path, data in posts.items():
        r = client.post(base + path, data={**data, "csrf_token": token})
        assert r.status_code == 404, path
    db.refresh(ces_study)
    assert ces_study.name == "CES small" and ces_study.status == "draft"


def test_shared_study_is_visible_and_admin_sees_all(
    client: TestClient,
    ces_study: Study,
    bob: Researcher,
    make_researcher: Callable[..., Researcher],
) -> None:
    make_researcher("root@example.org", is_admin=True)
    login(client, "alice@example.org")
    r = client.post(
        f"/admin/studies/{ces_study.slug}/share",
        data={"email": "bob@example.org", "csrf_token": csrf(client)},
    )
    assert r.status_code == 200 and "shared with bob@example.org" in r.text
    client.post("/admin/logout", data={"csrf_token": csrf(client)})
    login(client, "bob@example.org")
    assert client.get(f"/admin/studies/{ces_study.slug}").status_code == 200
    assert client.get("/admin/accounts").status_code == 404  # not an admin
    client.post("/admin/logout", data={"csrf_token": csrf(client)})
    login(client, "root@example.org")
    assert ces_study.slug in client.get("/admin").text
    assert client.get("/admin/accounts").status_code == 200


def test_api_refuses_another_researchers_study(
    client: TestClient, ces_study: Study, bob: Researcher, db: Session
) -> None:
    """The JSON API (R's routes) answers 404 for a key of a researcher who is not the owner."""
    from app.services.apikeys import create_api_key

    key = create_api_key("bob@example.org", session=db).key
    r = client.post(
        f"/api/v1/studies/{ces_study.slug}/sessions",
        json={},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 404


def test_invitation_creates_account_once(
    client: TestClient, make_researcher: Callable[..., Researcher], db: Session
) -> None:
    make_researcher("root@example.org", is_admin=True)
    login(client, "root@example.org")
    r = client.post(
        "/admin/invitations",
        data={"email": "carol@example.org", "role": "researcher", "csrf_token": csrf(client)},
    )
    assert r.status_code == 200
    url = r.text.split('id="invite-url">')[1].split("<")[0]
    path = url.split("localhost", 1)[1]
    client.post("/admin/logout", data={"csrf_token": csrf(client)})
    assert client.get(path).status_code == 200
    short = client.post(
        path, data={"password": "short", "password2": "short", "csrf_token": csrf(client)}
    )
    assert short.status_code == 422 and "at least 10" in short.text
    assert (
        db.exec(select(Researcher).where(Researcher.email == "carol@example.org")).first() is None
    )
    ok = client.post(
        path,
        data={
            "password": "carol's password",
            "password2": "carol's password",
            "csrf_token": csrf(client),
        },
        follow_redirects=False,
    )
    assert ok.status_code == 303
    assert client.get("/admin").status_code == 200
    assert client.get(path).status_code == 404  # used once


def test_api_keys_page_creates_and_revokes_own_keys(
    client: TestClient, alice: Researcher, bob: Researcher, db: Session
) -> None:
    from app.services.apikeys import authenticate_api_key, create_api_key

    other = create_api_key("bob@example.org", session=db)
    login(client, "alice@example.org")
    r = client.post("/admin/keys", data={"name": "panel", "csrf_token": csrf(client)})
    assert r.status_code == 200
    key = r.text.split('id="new-key">')[1].split("<")[0]
    assert authenticate_api_key(key, session=db).email == "alice@example.org"
    # a name with terminal escapes or line breaks (printed by `priorly apikey list`)
    for bad in ("a\x1b[2J\x1b[31mPWNED", "a\r\nb"):
        r = client.post("/admin/keys", data={"name": bad, "csrf_token": csrf(client)})
        assert r.status_code == 422 and "the key name contains a control character" in r.text
    assert key not in client.get("/admin/keys").text  # shown once
    assert (
        client.post(f"/admin/keys/{other.id}/revoke", data={"csrf_token": csrf(client)}).status_code
        == 404
    )
    from app.tables import ApiKey

    mine = db.exec(select(ApiKey).where(ApiKey.researcher_id == alice.id)).one()
    assert (
        client.post(f"/admin/keys/{mine.id}/revoke", data={"csrf_token": csrf(client)}).status_code
        == 200
    )
    db.expire_all()
    assert db.get(ApiKey, mine.id).revoked_at is not None  # type: ignore[union-attr]


def test_cli_sets_password_for_first_admin(
    settings,
    monkeypatch,
    capsys,
    db: Session,  # type: ignore[no-untyped-def]
) -> None:
    import io

    from app.cli import main
    from app.settings import get_settings

    monkeypatch.setenv("PRIORLY_DATABASE_URL", settings.database_url)
    get_settings.cache_clear()
    try:
        assert main(["user", "create", "--email", "First@Example.org", "--admin"]) == 0
        monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
        assert main(["password", "--email", "first@example.org"]) == 2
        assert "at least 10" in capsys.readouterr().err
        monkeypatch.setattr("sys.stdin", io.StringIO("first admin password\n"))
        assert main(["password", "--email", "first@example.org"]) == 0
    finally:
        get_settings.cache_clear()
    person = db.exec(select(Researcher).where(Researcher.email == "first@example.org")).one()
    assert person.is_admin and verify_password(person.password_hash, "first admin password")


def test_api_key_last_use_is_recorded_to_the_minute(
    client: TestClient, ces_study: Study, alice: Researcher, bob: Researcher, db: Session
) -> None:
    key = create_api_key("alice@example.org", session=db, name="assistant")
    bobs = create_api_key("bob@example.org", session=db)

    def last_used(row_id: int | None) -> object:
        db.expire_all()
        return db.get(ApiKey, row_id).last_used_at  # type: ignore[union-attr]

    # a refused call (bob's key on alice's study: 404) records nothing
    url = f"/api/v1/studies/{ces_study.slug}/responses"
    assert client.get(url, headers={"Authorization": f"Bearer {bobs.key}"}).status_code == 404
    assert last_used(bobs.id) is None
    # an answered call records the time; the admin's key list shows it
    before = utcnow().replace(tzinfo=None)
    assert client.get(url, headers={"Authorization": f"Bearer {key.key}"}).status_code == 200
    stamp = last_used(key.id)
    assert stamp is not None and stamp.replace(tzinfo=None) >= before - timedelta(seconds=1)
    login(client, "alice@example.org")
    row = client.get("/admin/keys").text.split("assistant")[1].split("</tr>")[0]
    assert stamp.strftime("%Y-%m-%d") in row and "—" not in row
    # the write itself: at most once a minute per key, never for a revoked or unknown key
    engine = db.get_bind()
    t0 = utcnow()
    assert record_key_use(engine, key.key, t0 + timedelta(minutes=5))
    assert not record_key_use(engine, key.key, t0 + timedelta(minutes=5, seconds=30))
    assert record_key_use(engine, key.key, t0 + timedelta(minutes=6, seconds=1))
    assert not record_key_use(engine, "pk_unknown_key", t0)
    revoke_api_key(bobs.prefix, session=db)
    assert not record_key_use(engine, bobs.key, t0 + timedelta(minutes=9))
