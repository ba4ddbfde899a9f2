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

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import SCREENSHOTS, admin_page, axe_violations, shot
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import SessionSpec, add_sessions, make_live_study, priorly_serve

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
def context(server: dict[str, Any], browser: Any) -> Any:
    """A browser context whose first page is logged in as the admin."""
    return admin_page(browser, server["base"], EMAIL, PASSWORD).context


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
    assert axe_violations(survey) == []
    survey.set_viewport_size({"width": 390, "height": 800})
    shot(survey, SCREENSHOTS / "respondent", "preview-banner-390", full_page=False)
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
    assert axe_violations(page) == []
    shot(page, SCREENSHOTS / "admin", "23-dashboard-sections")


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
    assert axe_violations(page) == []
