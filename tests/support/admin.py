"""Admin UI helpers: the test accounts' password, logging a test client in, its CSRF token."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.support.live_study import login_researcher

PASSWORD = "correct horse battery"


def login(client: TestClient, email: str, password: str = PASSWORD) -> None:
    """Log ``client`` in through the login form (CSRF token from the login page)."""
    login_researcher(client, email, password)
    assert client.cookies.get("priorly_session")


def csrf(client: TestClient) -> str:
    token = client.cookies.get("priorly_csrf")
    assert token
    return token
