"""The first run in a real headless Chromium (Debian's /usr/bin/chromium through
Playwright's Python package) against ``priorly serve`` on a database without studies:
the public home page, the demo survey's "preparing" page while its model is fitted in the
job queue (the page turns into the consent page by itself once the job is done), and the
admin studies list with the survey link, its copy button, the QR code and "preview as
respondent" (a real survey session that is not counted). axe-core finds no serious or
critical violation on these pages; screenshots go to ``results/e2e/first-run/``.

The server runs with ``--no-worker`` so that the "preparing" state lasts until the test
starts a ``priorly worker`` process, which runs the queued fit job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import DESKTOP, RESULTS, admin_database, axe_violations, log_in, shot
from tests.support.data import DATASETS_DIR, REPO_ROOT, write_small_dataset
from tests.support.live_study import free_port, wait_healthy

SHOTS = RESULTS / "first-run"
EMAIL, PASSWORD = "admin@example.org", "first run admin password"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``priorly serve --no-worker`` on a database with one admin account and no study
    (it imports the demo: the first 120 CES respondents); a ``start_worker()`` handle."""
    from app.db import make_engine

    folder = tmp_path_factory.mktemp("first-run")
    demo = write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 120)
    url = f"sqlite:///{folder / 'first.db'}"
    admin_database(url, EMAIL, PASSWORD)
    engine = make_engine(url)
    env = {
        **os.environ,
        "PRIORLY_DATABASE_URL": url,
        "PRIORLY_ENV": "dev",
        "PRIORLY_DEMO_DATASET": str(demo),
        "PRIORLY_QUEUE_PATH": str(folder / "queue.db"),
        "OMP_NUM_THREADS": "1",
    }
    port = free_port()
    log_path = folder / "server.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--no-worker", "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    workers: list[subprocess.Popen[bytes]] = []

    def start_worker() -> None:
        workers.append(
            subprocess.Popen(
                [sys.executable, "-m", "app.cli", "worker"],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, "priorly serve", log=log_path, timeout=90)
        yield {"base": base, "engine": engine, "log": log_path, "start_worker": start_worker}
    finally:
        for p in [*workers, proc]:
            p.terminate()
            p.wait(timeout=30)
        engine.dispose()


def test_visitor_sees_open_surveys_and_the_preparing_page_turns_into_the_survey(
    server: dict[str, Any], browser: Any
) -> None:
    base = server["base"]
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.goto(f"{base}/")
    assert page.inner_text("h1") == "Surveys"
    links = page.locator("ul.surveys a")
    assert links.count() == 1 and links.first.get_attribute("href") == f"{base}/s/ces"
    assert "Respondents" not in page.inner_text("body")  # no counts, slugs or drafts
    assert axe_violations(page) == []
    shot(page, SHOTS, "home-visitor-phone")

    links.first.click()
    page.wait_for_url(f"{base}/s/ces")
    assert page.inner_text("h1") == "Preparing the survey"
    assert page.get_by_role("status").count() >= 1
    assert page.locator("text=I agree").count() == 0
    assert axe_violations(page) == []
    shot(page, SHOTS, "demo-preparing-phone")
    desktop = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    desktop.goto(f"{base}/s/ces")
    shot(desktop, SHOTS, "demo-preparing-desktop")

    # the fit job runs in a worker; the open page polls and reloads itself into consent
    server["start_worker"]()
    try:
        page.wait_for_selector("text=I agree, start the survey", timeout=300_000)
    except Exception:
        raise AssertionError(server["log"].read_text()[-3000:]) from None
    assert page.url == f"{base}/s/ces"
    page.click("text=I agree, start the survey")
    page.wait_for_url(f"{base}/s/ces/q")
    assert page.locator("form").count() >= 1


def test_studies_list_link_copy_qr_and_uncounted_preview(
    server: dict[str, Any], browser: Any
) -> None:
    from sqlmodel import Session, select

    from app.services.dashboard import build_dashboard
    from app.tables import ElicitationSession, Study

    base = server["base"]
    context = browser.new_context(viewport=DESKTOP)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
    page = context.new_page()
    log_in(page, base, EMAIL, PASSWORD)

    row = page.locator('tr[data-slug="ces"]')
    survey = f"{base}/s/ces"
    assert row.locator("input.link-field").input_value() == survey
    row.locator("text=Copy link").click()
    page.wait_for_selector("#copied-ces:has-text('Link copied')")
    assert page.evaluate("navigator.clipboard.readText()") == survey
    row.locator("summary:has-text('QR code')").click()
    qr = row.locator(".qr img")
    qr.wait_for()
    assert page.evaluate("(img) => img.complete && img.naturalWidth > 0", qr.element_handle())
    assert axe_violations(page) == []
    shot(page, SHOTS, "admin-studies-share")

    with Session(server["engine"]) as db:
        before = len(db.exec(select(ElicitationSession)).all())
    with context.expect_page() as popup:
        row.locator("text=Preview as respondent").click()
    preview = popup.value
    preview.wait_for_url(f"{base}/s/ces/q")
    preview.wait_for_selector("form")
    shot(preview, SHOTS, "admin-preview-as-respondent")
    with Session(server["engine"]) as db:
        sessions = db.exec(select(ElicitationSession).order_by(ElicitationSession.id)).all()  # type: ignore[arg-type]
    assert len(sessions) == before + 1 and sessions[-1].is_preview
    assert not any(s.is_preview for s in sessions[:-1])
    with Session(server["engine"]) as db:
        study = db.exec(select(Study).where(Study.slug == "ces")).one()
        counted = build_dashboard(study, session=db).counts["started"]
    assert counted == len(sessions) - 1  # every session but the preview
