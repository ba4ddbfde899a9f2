"""Hostile text is shown escaped on every page, checked in a real headless Chromium.

The study's name, description and consent text, every item's question text and option
labels, and a persona's text are set to a payload with a script tag, template syntax
(Jinja ``{{ }}`` and ``{% %}``) and attribute-breaking quotes with event handlers. A real
uvicorn process serves it (SQLite), and Debian's /usr/bin/chromium (through Playwright,
no browser download) walks the respondent's pages (consent, about you, question) and the
researcher's pages (designer, dashboard, jobs, simulation, groups, exports). On each
page, once it has loaded (failed images included): no injected script ran
(``window.__pwned`` stays undefined, no dialog opened) and the payload is shown literally
(its text appears verbatim in the page's visible text, so it was escaped, not dropped).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from sqlmodel import Session, select

from app.auth import set_password
from app.tables import Item, Researcher, Study, StudyPersona
from tests.support.data import DATASETS_DIR, REPO_ROOT, write_small_dataset
from tests.support.live_study import make_live_study
from tests.support.secutil import LiveServer, live_server

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
PASSWORD = "xss test password 1"
SCRIPT = "<script>window.__pwned='script'</script>"
TEMPLATE = "{{ 7*7 }} {% if 1 %}TPL{% endif %}"
ATTR = '"><img src=x onerror="window.__pwned=\'img\'">'
ATTR2 = "'><svg onload=window.__pwned='svg'>"
PAYLOAD = f"X {SCRIPT} {TEMPLATE} {ATTR} {ATTR2}"
PIECES = (SCRIPT, TEMPLATE, ATTR.strip(), ATTR2)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str]]:
    if not os.access(CHROMIUM, os.X_OK):
        subprocess.run([str(REPO_ROOT / "scripts" / "setup-browser")], check=True)
    folder = tmp_path_factory.mktemp("xss")
    url = f"sqlite:///{folder / 'xss.db'}"
    live = make_live_study(
        url,
        write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 30),
        settings={"budgets": {"max_questions": 2}},
    )
    with Session(live.engine) as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        study.name = f"Study {PAYLOAD}"
        study.description = f"About {PAYLOAD}"
        study.consent_text = f"Consent {PAYLOAD}"
        db.add(study)
        for item in db.exec(select(Item).where(Item.study_id == live.study_id)).all():
            item.question = f"{item.key} asks {PAYLOAD}"
            item.options = [[letter, f"{label} {PAYLOAD}"] for letter, label in item.options]
            db.add(item)
        db.add(
            StudyPersona(
                study_id=live.study_id,
                key="p-xss",
                text=f"Persona {PAYLOAD}",
                text_hash="0" * 64,
                source="test",
            )
        )
        owner = db.exec(select(Researcher).where(Researcher.email == "owner@example.org")).one()
        set_password(owner, PASSWORD, session=db)
        db.commit()
    live.engine.dispose()
    with live_server(url, folder / "server.log", log_level="warning") as srv:
        yield srv, live.slug


@pytest.fixture(scope="module")
def page(server: tuple[LiveServer, str]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        pg = context.new_page()
        dialogs: list[str] = []
        pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        pg.dialogs = dialogs  # type: ignore[attr-defined]
        yield pg
        browser.close()


def assert_escaped(page: Any, where: str, *, literal: bool = True) -> None:
    """No injected script ran on the loaded page; the payload's text is shown verbatim."""
    page.wait_for_load_state("load")
    assert page.evaluate("() => typeof window.__pwned") == "undefined", (
        f"{where}: injected code ran ({page.evaluate('() => window.__pwned')})"
    )
    assert page.dialogs == [], f"{where}: a dialog opened"
    assert (
        page.locator("script:not([src])").evaluate_all(
            "els => els.filter(e => e.textContent.includes('__pwned')).length"
        )
        == 0
    ), f"{where}: an injected <script> element exists"
    assert page.locator("[onerror], [onload]").count() == 0, f"{where}: an injected handler"
    if literal:
        text = page.inner_text("body")
        for piece in PIECES:
            assert piece in text, f"{where}: {piece!r} not shown literally"


def test_respondent_pages_escape_hostile_text(server: tuple[LiveServer, str], page: Any) -> None:
    srv, slug = server
    page.goto(f"{srv.base}/s/{slug}")
    assert_escaped(page, "consent page")
    page.click("button[value=accept]")
    page.wait_for_load_state("load")
    if page.locator("text=A few questions about you").count():
        assert_escaped(page, "about-you page")
        page.click("button[type=submit]")  # nothing chosen: asks to skip them all
        page.click("button[name=skip_all]")
        page.wait_for_selector("input[name=option]")
    assert_escaped(page, "question page")
    assert page.locator("input[type=radio]").count() >= 2


@pytest.mark.parametrize(
    ("path", "literal"),
    [
        ("/admin", True),
        ("/admin/studies/{slug}", True),
        ("/admin/studies/{slug}/dashboard", True),
        ("/admin/studies/{slug}/jobs", True),
        ("/admin/studies/{slug}/personas", True),
        ("/admin/studies/{slug}/simulation", True),
        ("/admin/studies/{slug}/groups", True),
        ("/admin/studies/{slug}/export", True),
    ],
)
def test_admin_pages_escape_hostile_text(
    server: tuple[LiveServer, str], page: Any, path: str, literal: bool
) -> None:
    srv, slug = server
    if not page.context.cookies() or not any(
        c["name"] == "priorly_session" for c in page.context.cookies()
    ):
        page.goto(f"{srv.base}/admin/login")
        page.fill("input[name=email]", "owner@example.org")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{srv.base}/admin")
    page.goto(srv.base + path.format(slug=slug))
    assert_escaped(page, path, literal=literal)


def test_persona_text_is_listed_escaped_on_the_jobs_page(
    server: tuple[LiveServer, str], page: Any
) -> None:
    """The persona dictionary on the jobs page shows the stored persona text verbatim."""
    srv, slug = server
    if not any(c["name"] == "priorly_session" for c in page.context.cookies()):
        page.goto(f"{srv.base}/admin/login")
        page.fill("input[name=email]", "owner@example.org")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{srv.base}/admin")
    page.goto(f"{srv.base}/admin/studies/{slug}/jobs")
    assert_escaped(page, "jobs page")
    cells = page.locator("td.persona-text").all_inner_texts()
    assert cells == [f"Persona {PAYLOAD}"]


def test_the_check_catches_an_unescaped_page(page: Any) -> None:
    """The same check on a page that embeds the payload raw fails (it can detect XSS)."""
    # A blank document: the app's pages forbid inline scripts (Content-Security-Policy),
    # which would stop the payload before the check could see it run.
    page.goto("about:blank")
    page.set_content(f"<html><body><p>{PAYLOAD}</p></body></html>")
    with pytest.raises(AssertionError, match="injected code ran"):
        assert_escaped(page, "raw page")
    page.evaluate("() => { delete window.__pwned; }")
