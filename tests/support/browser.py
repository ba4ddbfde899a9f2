"""Browser-test helpers (tests/e2e): Debian's Chromium through Playwright, an admin login,
axe-core checks and screenshots.

Chromium is Debian's ``/usr/bin/chromium`` driven by Playwright's Python package through
``executable_path`` (no ``playwright install``); axe-core is npm's, in ``var/cache/npm``.
``scripts/setup-browser`` installs whichever is missing (:func:`ensure_browser`). The
fixtures built on these (``browser_ready``, ``browser``) are in tests/e2e/conftest.py.

Example::

    page = admin_page(browser, base, "admin@example.org", "its password")
    assert axe_violations(page) == []
    shot(page, SCREENSHOTS / "admin", "01-studies")
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.data import REPO_ROOT

CHROMIUM = "/usr/bin/chromium"
AXE_JS = REPO_ROOT / "var" / "cache" / "npm" / "node_modules" / "axe-core" / "axe.min.js"
SCREENSHOTS = REPO_ROOT / "docs" / "screenshots"
"""The screenshots the documentation shows (one folder per part: admin, respondent, ...)."""
RESULTS = REPO_ROOT / "results" / "e2e"
"""Screenshots kept as test output only (not tracked)."""
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}


def ensure_browser() -> None:
    """Run ``scripts/setup-browser`` when Chromium or axe-core is missing; fail clearly if
    they are still missing afterwards."""
    if not (os.access(CHROMIUM, os.X_OK) and AXE_JS.is_file()):
        subprocess.run([str(REPO_ROOT / "scripts" / "setup-browser")], check=True)
    assert os.access(CHROMIUM, os.X_OK), "scripts/setup-browser did not install chromium"
    assert AXE_JS.is_file(), "scripts/setup-browser did not install axe-core"


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright ``Browser``) launched from :data:`CHROMIUM` with
    :data:`LAUNCH_ARGS`; closed on exit."""
    from playwright.sync_api import sync_playwright

    ensure_browser()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def log_in(page: Any, base: str, email: str, password: str) -> None:
    """Log ``page`` in through the admin login form; returns once ``/admin`` is shown."""
    page.goto(f"{base}/admin/login")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/admin")


def admin_page(
    browser: Any, base: str, email: str, password: str, viewport: dict[str, int] | None = None
) -> Any:
    """A new page, in a new context of ``browser`` (``viewport``, :data:`DESKTOP` by
    default), logged in to the admin UI at ``base`` as ``email``."""
    page = browser.new_context(viewport=viewport or DESKTOP).new_page()
    log_in(page, base, email, password)
    return page


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """Serious or critical axe-core violations of the page as it is now, each as
    ``{"id", "impact", "nodes"}`` (the first five nodes' selectors); ``[]`` when none.

    axe is evaluated through the DevTools protocol, not added as a ``<script>``: the pages'
    Content-Security-Policy (script-src 'self') refuses inline scripts, as it should.
    """
    page.evaluate(AXE_JS.read_text(encoding="utf-8"))
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]][:5]}
        for v in result["violations"]
        if v.get("impact") in ("serious", "critical")
    ]


def wait_or_explain(page: Any, selector: str, *, timeout: float, log: Path, what: str) -> None:
    """Wait up to ``timeout`` ms for ``selector`` on ``page``; if it never shows, fail with
    ``what``, the start of the page's text and the end of the server's ``log``."""
    try:
        page.wait_for_selector(selector, timeout=timeout)
    except Exception:
        raise AssertionError(
            f"{what}; page: "
            + page.inner_text("body")[:1500]
            + "\nserver log: "
            + log.read_text()[-3000:]
        ) from None


def shot(page: Any, folder: Path, name: str, *, full_page: bool = True) -> Path:
    """Screenshot of ``page`` to ``folder / f"{name}.png"`` (the folder made if missing);
    returns the path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def admin_database(url: str, email: str, password: str) -> None:
    """Migrate the fresh database at ``url`` and add one admin account ``email``."""
    from sqlmodel import Session

    from app.auth import create_account
    from app.db import make_engine, upgrade

    upgrade(url)
    engine = make_engine(url)
    try:
        with Session(engine) as db:
            create_account(email, password, session=db, is_admin=True)
    finally:
        engine.dispose()
