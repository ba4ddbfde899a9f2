"""The admin UI in a real headless Chromium (Debian's /usr/bin/chromium through Playwright's
Python package; no browser download), against ``priorly serve`` in a real process (with
its in-process job worker) on a SQLite file.

The test logs in, creates a study from a shipped dataset, chooses targets, starts a
simulation job, waits for the plot (the job partial polls and replaces itself until the
job has succeeded) and takes a screenshot; then it visits every admin screen and takes a
screenshot of each (``results/e2e/admin/*.png``; docs/admin.md lists them). To show a
populated dashboard, a few live respondents answer through the respondent service after
a small model is fitted; a group round is opened, answered on one member's personal link
in a second tab, tracked (the table updates itself) and closed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import (
    DESKTOP,
    PHONE,
    RESULTS,
    admin_database,
    log_in,
    shot,
    wait_or_explain,
)
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import priorly_serve

SHOTS = RESULTS / "admin"
EMAIL, PASSWORD = "admin@example.org", "e2e admin password"
N_RESPONDENTS = 200


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``priorly serve --no-demo`` on a fresh SQLite file, with one admin account."""
    from app.db import make_engine

    folder = tmp_path_factory.mktemp("admin-e2e")
    datasets = folder / "datasets"
    write_small_dataset(DATASETS_DIR / "ces", datasets / "ces_small", N_RESPONDENTS)
    url = f"sqlite:///{folder / 'admin.db'}"
    admin_database(url, EMAIL, PASSWORD)
    engine = make_engine(url)
    try:
        with priorly_serve(url, folder, PRIORLY_DEMO_DATASET=str(datasets / "ces_small")) as base:
            yield {"base": base, "engine": engine, "log": folder / "server.log"}
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def page(browser: Any) -> Any:
    """A page of a fresh context, not logged in."""
    return browser.new_context(viewport=DESKTOP).new_page()


def test_admin_creates_study_simulates_and_sees_plot(server: dict[str, Any], page: Any) -> None:
    base = server["base"]
    page.goto(f"{base}/admin")
    assert page.url.endswith("/admin/login")
    shot(page, SHOTS, "01-login")
    log_in(page, base, EMAIL, PASSWORD)
    shot(page, SHOTS, "02-studies-empty")

    # create a study from the shipped dataset
    page.click("text=Import data")
    page.select_option("#import-shipped select[name=dataset]", "ces_small")
    page.fill("#import-shipped input[name=name]", "CES pilot")
    shot(page, SHOTS, "03-import")
    page.click("#import-shipped button[type=submit]")
    page.wait_for_url(f"{base}/admin/studies/ces-pilot")

    # choose three targets through the item role forms
    for key in ("334a", "334b", "330c"):
        page.select_option(f"#role-{key} select[name=role]", "target")
        page.click(f"#role-{key} button[type=submit]")
        page.wait_for_selector("text=item " + key + " saved")
    assert "targets: 3" in page.inner_text("body")
    shot(page, SHOTS, "04-study-designer")

    # start a simulation and wait for the plot (the job partial polls itself)
    page.click("text=Simulation")
    page.fill("#simulate input[name=budget]", "4")
    page.fill("#simulate input[name=max_test_users]", "60")
    page.click("#simulate button[type=submit]")
    page.wait_for_selector(".job[data-status=running], .job[data-status=queued], #simulation-plot")
    shot(page, SHOTS, "05-simulation-running")
    wait_or_explain(page, "#simulation-plot", timeout=420_000, log=server["log"], what="no plot")
    ok = page.evaluate("document.querySelector('#simulation-plot').naturalWidth > 0")
    assert ok, "the plot image did not load"
    assert "How many questions do you need?" in page.inner_text("body")
    shot(page, SHOTS, "06-simulation-result")


def test_every_admin_screen(server: dict[str, Any], page: Any) -> None:
    """Screenshots of the remaining screens (after a model fit and a few live respondents)."""
    from sqlmodel import Session, select

    from app import session as svc
    from app.services.belief import fit_study_model
    from app.tables import Study

    base, engine = server["base"], server["engine"]
    with Session(engine) as db:
        study = db.exec(select(Study).where(Study.slug == "ces-pilot")).one()
        fit_study_model(study, session=db, n_classes=(4,), n_restarts=1)
        study.status = "published"
        study.consent_text = "ok"
        study.settings = {
            **study.settings,
            "group": {**study.settings["group"], "respondents_per_round": 3, "rounds": 3},
        }
        db.add(study)
        db.commit()
        db.refresh(study)
        for r in range(6):
            # an external id (an API client's): a group round can reach the member
            started = svc.start_session(study, engine=engine, external_id=f"e2e-{r}")
            view = started.view
            for _ in range(3 if r % 3 else 1):
                if view.question is None:
                    break
                option = view.question.options[r % len(view.question.options)][0]
                view = svc.submit_answer(
                    study,
                    started.session_id,
                    item_key=view.question.key,
                    option=option,
                    idempotency_key=None,
                    engine=engine,
                )
    # plan a group round in the browser and wait for the plan
    page.goto(base + "/admin/studies/ces-pilot/groups")
    page.click("#plan-round button[type=submit]")
    page.wait_for_selector("#round-plan", timeout=300_000)
    plan = page.inner_text("#round-plan")
    # members: at most respondents_per_round, of those not yet asked the planned question
    found = re.search(r"to (\d+) of 6 live respondents", plan)
    assert plan.startswith("Ask") and found, plan
    n_members = int(found.group(1))
    assert 1 <= n_members <= 3
    # open the round, answer one personal link as a member, watch the track table, close
    page.goto(base + "/admin/studies/ces-pilot/groups")
    page.click("#open-round button[type=submit]")
    page.wait_for_url(base + "/admin/studies/ces-pilot/groups/1")
    assert page.locator("#members tr[data-status=waiting]").count() == n_members
    shot(page, SHOTS, "14-group-round-open")
    link = page.locator("#members input").first.input_value()
    member = page.context.new_page()
    member.goto(link)
    assert member.locator("input[name=option]").count() >= 2
    shot(member, SHOTS, "15-group-round-link")
    member.locator("input[name=option]").first.check()
    member.click("button.r-primary")
    member.wait_for_selector("text=Thank you")
    # the track table polls itself: the answer appears without a reload
    page.wait_for_selector("#members tr[data-status=answered]", timeout=30_000)
    shot(page, SHOTS, "16-group-round-track")
    page.once("dialog", lambda d: d.accept())
    page.click("#close-round button[type=submit]")
    page.wait_for_selector("#track[data-status=closed]")
    assert page.locator("#members tr[data-status=no_answer]").count() == n_members - 1
    shot(page, SHOTS, "17-group-round-closed")
    member.goto(link.replace("/g/", "/g/x"))  # a wrong token
    assert "not valid" in member.inner_text("body")
    member.close()
    for path, name in (
        ("/admin", "07-studies"),
        ("/admin/studies/ces-pilot/jobs", "08-jobs"),
        ("/admin/studies/ces-pilot/dashboard", "09-dashboard"),
        ("/admin/studies/ces-pilot/groups", "10-group-rounds"),
        ("/admin/studies/ces-pilot/export", "11-exports"),
        ("/admin/keys", "12-api-keys"),
        ("/admin/accounts", "13-accounts"),
    ):
        page.goto(base + path)
        assert page.locator("h1").first.is_visible()
        shot(page, SHOTS, name)
    page.goto(base + "/admin/studies/ces-pilot/dashboard")
    assert "6" in page.inner_text(".stats")


ADMIN_PAGES = (
    "/admin",
    "/admin/import",
    "/admin/studies/ces-pilot",
    "/admin/studies/ces-pilot/dashboard",
    "/admin/studies/ces-pilot/respondents",
    "/admin/studies/ces-pilot/jobs",
    "/admin/studies/ces-pilot/personas",
    "/admin/studies/ces-pilot/groups",
    "/admin/studies/ces-pilot/export",
    "/admin/keys",
    "/admin/accounts",
)


def test_admin_pages_fit_a_phone_screen(server: dict[str, Any], browser: Any) -> None:
    """At 390 px no admin page scrolls sideways: wide tables scroll inside their own box,
    and the header (with "Log out") wraps."""
    page = browser.new_context(viewport=PHONE).new_page()
    try:
        log_in(page, server["base"], EMAIL, PASSWORD)
        wide = {}
        for path in ADMIN_PAGES:
            response = page.goto(server["base"] + path)
            assert response is not None and response.status == 200, path
            assert page.locator("h1").first.is_visible(), path
            width = page.evaluate("() => document.documentElement.scrollWidth")
            if width > PHONE["width"]:
                wide[path] = page.evaluate(
                    """() => [...document.querySelectorAll('body *')]
                        .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
                        .slice(0, 6).map(e => e.tagName + '.' + e.className + '#' + e.id
                            + ':' + Math.round(e.getBoundingClientRect().right))"""
                )
        assert wide == {}, wide
        # the study's items are stacked, one block per item with labelled cells: nothing
        # scrolls inside the card either
        page.goto(server["base"] + "/admin/studies/ces-pilot")
        items = page.locator("table.items")
        assert items.evaluate("t => t.scrollWidth <= t.clientWidth + 1")
        key_cell = page.locator("table.items tbody td[data-label='Key']").first
        assert key_cell.evaluate("td => getComputedStyle(td, '::before').content") == '"Key: "'
        page.locator("table.items tbody tr").first.screenshot(
            path=str(SHOTS / "30-study-item-phone.png")
        )
        page.goto(server["base"] + "/admin")
        assert page.get_by_role("button", name="Log out").is_visible()
        shot(page, SHOTS, "18-studies-phone")
    finally:
        page.context.close()
