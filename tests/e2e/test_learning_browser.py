"""The learning loop on the study page in a real headless Chromium against ``priorly serve``
in a real process (its in-process job worker fits): "Refit now" queues a fit job, the job
page follows it to its result, and the study page lists the model versions (the first one
promoted; a second fit on the same data and seed scores the same on the held-out
respondents, so it is rejected, with both scores). axe-core on the study page; the
screenshot goes to ``docs/screenshots/admin/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import (
    SCREENSHOTS,
    admin_database,
    admin_page,
    axe_violations,
    wait_or_explain,
)
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import priorly_serve

SHOTS = SCREENSHOTS / "admin"
EMAIL, PASSWORD = "learning@example.org", "e2e learning password"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``priorly serve --no-demo`` on a fresh SQLite file, with one admin account."""
    folder = tmp_path_factory.mktemp("learning-e2e")
    datasets = folder / "datasets"
    write_small_dataset(DATASETS_DIR / "ces", datasets / "ces_small", 150)
    url = f"sqlite:///{folder / 'learning.db'}"
    admin_database(url, EMAIL, PASSWORD)
    with priorly_serve(url, folder, PRIORLY_DEMO_DATASET=str(datasets / "ces_small")) as base:
        yield {"base": base, "log": folder / "server.log"}


def _refit_and_wait(page: Any, server: dict[str, Any], slug: str) -> None:
    page.goto(f"{server['base']}/admin/studies/{slug}")
    page.click("#refit-now button[type=submit]")
    page.wait_for_url(f"**/admin/studies/{slug}/jobs?job=*")
    job_id = page.url.rsplit("job=", 1)[1]
    wait_or_explain(
        page,
        f"#job-{job_id}[data-status=succeeded]",
        timeout=300_000,
        log=server["log"],
        what="the fit job did not succeed",
    )


def test_refit_now_lists_promoted_and_rejected_versions(
    server: dict[str, Any], browser: Any
) -> None:
    base = server["base"]
    page = admin_page(browser, base, EMAIL, PASSWORD)
    page.goto(base + "/admin/import")
    page.select_option("#import-shipped select[name=dataset]", "ces_small")
    page.fill("#import-shipped input[name=name]", "Learning e2e")
    page.click("#import-shipped button[type=submit]")
    page.wait_for_url(base + "/admin/studies/learning-e2e")
    assert page.locator("#model-versions").count() == 0

    _refit_and_wait(page, server, "learning-e2e")
    page.goto(base + "/admin/studies/learning-e2e")
    rows = page.locator("#model-versions tbody tr")
    assert rows.count() == 1
    first = rows.nth(0).inner_text()
    assert "(active)" in first and "promoted: first model of the study" in first

    _refit_and_wait(page, server, "learning-e2e")
    page.goto(base + "/admin/studies/learning-e2e")
    rows = page.locator("#model-versions tbody tr")
    assert rows.count() == 2
    newest, oldest = rows.nth(0).inner_text(), rows.nth(1).inner_text()
    # the same data again: the same model, a tie that keeps the active one
    assert "rejected: ties with the active model" in newest and "(active)" not in newest
    assert "(active)" in oldest
    cells = rows.nth(0).locator("td")
    assert cells.nth(6).inner_text() == cells.nth(7).inner_text() != ""  # same fit, same score
    assert axe_violations(page) == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#belief-model").screenshot(path=str(SHOTS / "25-model-versions.png"))
    # 150 imported respondents: every item has fewer than 300 answers, so it calibrates
    status = page.locator("#calibration-status")
    assert status.inner_text().startswith("Calibrating: the last 5 of each respondent's questions")
    status.screenshot(path=str(SHOTS / "29-calibration-status.png"))
