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

from tests.support.browser import SCREENSHOTS, admin_page, axe_violations, shot
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import make_live_study, priorly_serve

SHOTS = SCREENSHOTS / "admin"
EMAIL, PASSWORD = "owner-e2e@example.org", "e2e profile password"
N_ANSWERS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
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
def page(server: dict[str, Any], browser: Any) -> Any:
    """A page logged in as the study's admin."""
    return admin_page(browser, server["base"], EMAIL, PASSWORD)


def test_profile_opens_from_the_respondents_tab(server: dict[str, Any], page: Any) -> None:
    base, slug, rid = server["base"], server["slug"], server["respondent"]
    page.goto(f"{base}/admin/studies/{slug}/respondents")
    assert axe_violations(page) == []
    page.click(f"tr[data-respondent='{rid}'] a[aria-label^='Open respondent ']")
    page.wait_for_url(f"{base}/admin/studies/{slug}/respondents/{rid}")
    assert page.locator("#respondent-status").inner_text() == "in progress"
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
    assert axe_violations(page) == []
    shot(page, SHOTS, "24-respondent-profile")

    # an unknown id: a readable 404 page
    r = page.goto(f"{base}/admin/studies/{slug}/respondents/999999")
    assert r is not None and r.status == 404
    assert f"no respondent 999999 in study '{slug}'" in page.inner_text("main")
