"""The study dashboard in a real headless Chromium (Debian's /usr/bin/chromium through
Playwright) against ``priorly serve`` in a real process, with axe-core on each page and
screenshots into ``docs/screenshots/``.

A published CES study (150 imported respondents, a 4-class model) gets live sessions
written with chosen statuses and times (tests.support.live_study.add_sessions); the
researcher starts "preview as respondent" (the survey pages show the preview banner, and
the preview counts nowhere), then reads the dashboard: the counts, the drop-off per
question, the personas in words and the answer distributions; "Open a respondent" goes to
the respondent's page for an id and explains an unknown completion code.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.data import DATASETS_DIR, REPO_ROOT, write_small_dataset
from tests.support.live_study import SessionSpec, add_sessions, make_live_study, priorly_serve

CHROMIUM = "/usr/bin/chromium"
AXE_JS = REPO_ROOT / "var" / "cache" / "npm" / "node_modules" / "axe-core" / "axe.min.js"
SHOTS = REPO_ROOT / "docs" / "screenshots"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
EMAIL, PASSWORD = "dash@example.org", "e2e dashboard password"

SESSIONS: list[SessionSpec] = [
    ("completed", 30, 22, 22, [(0, "A"), (1, "B"), (2, "A")], 0, False),  # 8 min
    ("completed", 50, 38, 38, [(0, "B"), (1, None), (2, "B")], 0, False),  # 12 min
    ("completed", 20, 10, 10, [(0, "A"), (1, "A")], 1, False),  # 10 min, a repeated start
    ("active", 10, 2, None, [(0, "A")], 0, False),  # in progress
    ("active", 200, 190, None, [(0, "B"), (1, "A")], 0, False),  # dropped after 2
    ("active", 300, 290, None, [], 2, False),  # dropped before the first question
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``priorly serve --no-demo`` on a fresh SQLite file with the prepared study and one
    admin account."""
    if not (os.access(CHROMIUM, os.X_OK) and AXE_JS.is_file()):
        subprocess.run([str(REPO_ROOT / "scripts" / "setup-browser")], check=True)
    from sqlmodel import Session

    from app.auth import create_account
    from app.tables import utcnow

    folder = tmp_path_factory.mktemp("dashboard-e2e")
    data = write_small_dataset(DATASETS_DIR / "ces", folder / "ces150", 150)
    live = make_live_study(f"sqlite:///{folder / 'dash.db'}", data)
    with Session(live.engine) as db:
        create_account(EMAIL, PASSWORD, session=db, is_admin=True)
    ids = add_sessions(live, SESSIONS, utcnow())
    try:
        with priorly_serve(live.url, folder) as base:
            yield {"base": base, "live": live, "ids": ids}
    finally:
        live.engine.dispose()


@pytest.fixture(scope="module")
def context(server: dict[str, Any]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        pg = ctx.new_page()
        pg.goto(server["base"] + "/admin/login")
        pg.fill("input[name=email]", EMAIL)
        pg.fill("input[name=password]", PASSWORD)
        pg.click("button[type=submit]")
        pg.wait_for_url(server["base"] + "/admin")
        yield ctx
        browser.close()


def _axe(page: Any) -> list[dict[str, Any]]:
    """Serious or critical axe-core violations of the page as it is now."""
    page.evaluate(AXE_JS.read_text(encoding="utf-8"))  # CDP evaluation: CSP refuses inline
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]][:5]}
        for v in result["violations"]
        if v.get("impact") in ("serious", "critical")
    ]


def _stat(page: Any, name: str) -> str:
    return str(page.locator(f"#stat-{name} .n").inner_text()).strip()


def test_preview_banner_then_dashboard_sections(server: dict[str, Any], context: Any) -> None:
    base, live = server["base"], server["live"]
    page = context.pages[0]
    # "preview as respondent" opens the survey in a new tab, with the banner
    page.goto(base + "/admin")
    with context.expect_page() as opened:
        page.click(f"tr[data-slug='{live.slug}'] button:has-text('Preview as respondent')")
    survey = opened.value
    survey.wait_for_url(f"{base}/s/{live.slug}/q*")
    banner = survey.locator("#preview-banner")
    assert banner.is_visible() and banner.inner_text() == "Preview — answers are not counted"
    assert _axe(survey) == []
    survey.set_viewport_size({"width": 390, "height": 800})
    (SHOTS / "respondent").mkdir(parents=True, exist_ok=True)
    survey.screenshot(path=str(SHOTS / "respondent" / "preview-banner-390.png"))
    survey.close()

    page.goto(f"{base}/admin/studies/{live.slug}/dashboard")
    # the preview is not among the six sessions started
    assert page.locator("#counts .stat").first.inner_text().split() == ["6", "started"]
    assert [_stat(page, k) for k in ("in-progress", "dropped", "live", "repeated")] == [
        "1",
        "2",
        "6",
        "2",
    ]
    assert _stat(page, "imported") == "150"
    assert _stat(page, "median") == "10 min 00 s"
    rows = page.locator("#drop-off tbody tr")
    assert rows.nth(0).inner_text().split("\t")[-1].strip() == "1"
    assert page.locator("#drop-off tr[data-position='2'] td.num").inner_text() == "1"
    personas = page.locator("#personas tbody tr")
    assert personas.count() == 4 and "overall)" in personas.first.inner_text()
    assert page.locator("#answers table.distribution").count() == 3  # questions 0, 1, 2
    assert _axe(page) == []
    (SHOTS / "admin").mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "admin" / "23-dashboard-sections.png"), full_page=True)


def test_open_a_respondent_by_id_or_code(server: dict[str, Any], context: Any) -> None:
    from sqlmodel import Session

    from app.tables import ElicitationSession

    base, live = server["base"], server["live"]
    with Session(live.engine) as db:
        sess = db.get(ElicitationSession, server["ids"][0])
        assert sess is not None
        rid = sess.respondent_id
    page = context.pages[0]
    page.goto(f"{base}/admin/studies/{live.slug}/dashboard")
    page.fill("#respondent-q", str(rid))
    page.click("#open-respondent button[type=submit]")
    page.wait_for_url(f"{base}/admin/studies/{live.slug}/respondents/{rid}")
    page.goto(f"{base}/admin/studies/{live.slug}/dashboard")
    page.fill("#respondent-q", "NOT-A-CODE")
    page.click("#open-respondent button[type=submit]")
    page.wait_for_selector("text=Not found")
    assert "has the completion code 'NOT-A-CODE'" in page.inner_text("body")
    assert _axe(page) == []
