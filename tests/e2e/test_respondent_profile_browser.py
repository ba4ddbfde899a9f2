"""A respondent's profile in a real headless Chromium (Debian's /usr/bin/chromium through
Playwright) against ``priorly serve`` in a real process: the researcher opens the
Respondents tab, follows a respondent's link to ``/admin/studies/{slug}/respondents/{id}``
and sees their answers and the predicted answer to every other item (axe-core finds no
serious violation); screenshots into ``docs/screenshots/admin/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlmodel import Session, select

from tests.e2e.test_respondent_browser import (
    AXE_JS,
    CHROMIUM,
    LAUNCH_ARGS,
    browser_ready,
)
from tests.support.data import DATASETS_DIR, REPO_ROOT, write_small_dataset
from tests.support.live_study import make_live_study, priorly_serve

__all__ = ["browser_ready"]  # a fixture of this module too
SHOTS = REPO_ROOT / "docs" / "screenshots" / "admin"
EMAIL, PASSWORD = "owner-e2e@example.org", "e2e profile password"
N_ANSWERS = 4


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, browser_ready: None
) -> Iterator[dict[str, Any]]:
    """A prepared CES study (60 imported respondents, a fitted model) with two live
    respondents (the second a repeated start that answered :data:`N_ANSWERS` questions),
    served by ``priorly serve``."""
    from app import session as svc
    from app.auth import create_account
    from app.tables import Study

    folder = tmp_path_factory.mktemp("profile-e2e")
    data = write_small_dataset(DATASETS_DIR / "ces", folder / "ces_small", 60)
    url = f"sqlite:///{folder / 'profile.db'}"
    live = make_live_study(url, data, n_classes=(3,))
    with Session(live.engine) as db:
        create_account(EMAIL, PASSWORD, session=db, is_admin=True)
        study = db.exec(select(Study).where(Study.id == live.study_id)).one()
    svc.start_session(study, engine=live.engine)
    started = svc.start_session(study, engine=live.engine, earlier_starts=1)
    view = started.view
    for _ in range(N_ANSWERS):
        assert view.question is not None
        view = svc.submit_answer(
            study,
            started.session_id,
            item_key=view.question.key,
            option=view.question.options[-1][0],
            idempotency_key=None,
            engine=live.engine,
        )
    with Session(live.engine) as db:
        from app.tables import ElicitationSession

        rid = db.exec(
            select(ElicitationSession.respondent_id).where(
                ElicitationSession.id == started.session_id
            )
        ).one()
    live.engine.dispose()
    with priorly_serve(url, folder) as base:
        yield {"base": base, "slug": live.slug, "respondent": rid}


@pytest.fixture(scope="module")
def page(server: dict[str, Any]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        pg = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        pg.goto(server["base"] + "/admin/login")
        pg.fill("input[name=email]", EMAIL)
        pg.fill("input[name=password]", PASSWORD)
        pg.click("button[type=submit]")
        pg.wait_for_url(server["base"] + "/admin")
        yield pg
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


def test_profile_opens_from_the_respondents_tab(server: dict[str, Any], page: Any) -> None:
    base, slug, rid = server["base"], server["slug"], server["respondent"]
    page.goto(f"{base}/admin/studies/{slug}/respondents")
    assert _axe(page) == []
    page.click(f"tr[data-respondent='{rid}'] a[aria-label='Open respondent {rid}']")
    page.wait_for_url(f"{base}/admin/studies/{slug}/respondents/{rid}")
    assert page.locator("#respondent-status").inner_text() == "active"
    assert "yes, 1 earlier from this browser" in page.locator("#respondent-repeat").inner_text()
    answers = page.locator("#given tbody tr[data-kind=answer]")
    assert answers.count() == N_ANSWERS
    predicted = page.locator("#predicted tbody tr")
    n_items = predicted.count()
    assert n_items > 20  # every other item of the study (questions, targets, demographics)
    first = predicted.nth(0).locator("td").nth(2).inner_text()
    assert first.endswith("%") and 0 < int(first[:-1]) <= 100
    given = {answers.nth(i).get_attribute("data-item") for i in range(N_ANSWERS)}
    shown = {predicted.nth(i).get_attribute("data-item") for i in range(n_items)}
    assert given.isdisjoint(shown)
    assert page.locator(f"button[aria-label='Erase respondent {rid}']").is_visible()
    assert _axe(page) == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "24-respondent-profile.png"), full_page=True)

    # an unknown id: a readable 404 page
    r = page.goto(f"{base}/admin/studies/{slug}/respondents/999999")
    assert r is not None and r.status == 404
    assert f"no respondent 999999 in study '{slug}'" in page.inner_text("main")
