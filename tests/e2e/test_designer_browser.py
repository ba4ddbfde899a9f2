"""The study designer, the upload import and the fit job in a real headless Chromium
(Debian's /usr/bin/chromium through Playwright) against ``priorly serve`` in a real process,
with axe-core on each changed page and screenshots into ``docs/screenshots/admin/``.

* An item far down the page is edited in place: the page is not reloaded (a marker set
  in ``window`` survives) and keeps its scroll position; several items get a role at once;
  an item's options are reordered and one is marked "not an answer" in place; a
  10,000-character study name is refused with the limit, a German one reads well.
* An upload (without ``runs.csv``) is previewed and imported from the preview page without
  choosing the files again.
* The fit job ends with a readable result; a running fit shows its percentage and restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlmodel import select

from tests.support.browser import SCREENSHOTS, admin_database, admin_page, axe_violations, shot
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import priorly_serve

SHOTS = SCREENSHOTS / "admin"
EMAIL, PASSWORD = "designer@example.org", "e2e designer password"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``priorly serve --no-demo`` on a fresh SQLite file, with one admin account."""
    folder = tmp_path_factory.mktemp("designer-e2e")
    datasets = folder / "datasets"
    write_small_dataset(DATASETS_DIR / "ces", datasets / "ces_small", 150)
    upload = write_small_dataset(DATASETS_DIR / "opinionqa", folder / "upload", 80)
    (upload / "runs.csv").unlink()
    url = f"sqlite:///{folder / 'designer.db'}"
    admin_database(url, EMAIL, PASSWORD)
    with priorly_serve(url, folder, PRIORLY_DEMO_DATASET=str(datasets / "ces_small")) as base:
        yield {"base": base, "upload": upload, "log": folder / "server.log", "url": url}


@pytest.fixture(scope="module")
def page(server: dict[str, Any], browser: Any) -> Any:
    """A page logged in as the admin."""
    return admin_page(browser, server["base"], EMAIL, PASSWORD)


def test_edit_in_place_keeps_the_page_and_its_scroll(server: dict[str, Any], page: Any) -> None:
    base = server["base"]
    page.goto(base + "/admin/import")
    page.select_option("#import-shipped select[name=dataset]", "ces_small")
    page.fill("#import-shipped input[name=name]", "Designer e2e")
    page.click("#import-shipped button[type=submit]")
    page.wait_for_url(base + "/admin/studies/designer-e2e")
    assert axe_violations(page) == []
    page.click("#criterion-help summary")
    page.click("#belief-help summary")
    assert "irt" not in page.locator("select[name=criterion]").inner_text()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("section:has(#budgets)").screenshot(path=str(SHOTS / "18-designer-help.png"))

    # an item far down the page: open its editor, reword it, save
    row = page.locator("table.items tbody tr").nth(-3)
    key = row.get_attribute("data-key")
    row.locator("details summary").click()
    row.scroll_into_view_if_needed()
    page.evaluate("window.__notReloaded = true")
    y_before = page.evaluate("window.scrollY")
    assert y_before > 1500  # really far down
    row.locator("textarea[name=question]").fill("Reworded in place?")
    row.locator("button:has-text('Save item')").click()
    page.wait_for_selector(f"tr[data-key='{key}'] >> text=item {key} saved")
    assert page.evaluate("window.__notReloaded === true")
    assert abs(page.evaluate("window.scrollY") - y_before) < 100
    assert "Reworded in place?" in page.locator(f"tr[data-key='{key}']").inner_text()
    shot(page, SHOTS, "19-designer-edit-in-place", full_page=False)

    # an invalid edit shows its error in the row, still without a reload
    row = page.locator(f"tr[data-key='{key}']")
    row.locator("details summary").click()
    row.locator("textarea[name=options]").fill("A: only one")
    row.locator("button:has-text('Save item')").click()
    page.wait_for_selector(f"tr[data-key='{key}'] [role=alert]")
    assert "two options" in page.locator(f"tr[data-key='{key}'] [role=alert]").inner_text()
    assert page.evaluate("window.__notReloaded === true")

    # bulk: two items become targets
    keys = [page.locator("table.items tbody tr").nth(i).get_attribute("data-key") for i in (0, 1)]
    for k in keys:
        page.check(f"input[name=keys][value='{k}']")
    page.select_option("#bulk-roles select[name=role]", "target")
    page.click("#bulk-roles button[type=submit]")
    page.wait_for_selector("text=2 items set to target")
    assert page.evaluate("window.__notReloaded === true")
    for k in keys:
        assert page.locator(f"#role-{k} select[name=role]").input_value() == "target"
    assert axe_violations(page) == []


def test_reorder_options_and_mark_one_missing_in_place(server: dict[str, Any], page: Any) -> None:
    """The item editor of an item with three or more options: its lines reversed (the new
    scale order) and its last option marked "not an answer" are saved in place; the row
    shows the options in the new order without the missing one."""
    base = server["base"]
    page.goto(base + "/admin/studies/designer-e2e")
    rows = page.locator("table.items tbody tr")
    row = next(
        rows.nth(i)
        for i in range(rows.count())
        if rows.nth(i).locator("input[name=missing]").count() >= 3
    )
    key = row.get_attribute("data-key")
    row.locator("details summary").click()
    lines = row.locator("textarea[name=options]").input_value().strip().splitlines()
    letters = [line.split(":", 1)[0] for line in lines]
    row.locator("textarea[name=options]").fill("\n".join(reversed(lines)))
    row.locator(f"input[name=missing][value='{letters[-1]}']").check()
    page.evaluate("window.__notReloaded = true")
    row.locator("button:has-text('Save item')").click()
    page.wait_for_selector(f"tr[data-key='{key}'] >> text=item {key} saved")
    assert page.evaluate("window.__notReloaded === true")
    shown = page.locator(f"tr[data-key='{key}'] div.muted").first.inner_text()
    assert [part.split(":", 1)[0] for part in shown.split(" · ")] == letters[-2::-1]
    assert axe_violations(page) == []


def test_a_long_name_is_refused_not_cut_and_a_unicode_name_reads_well(
    server: dict[str, Any], page: Any
) -> None:
    """The new-study form takes a 10,000-character name whole (no maxlength cuts it in the
    browser) and the server refuses it, saying the limit; a German name becomes a readable
    ASCII address."""
    base = server["base"]
    page.goto(base + "/admin")
    form = page.locator("form[action='/admin/studies']")
    form.locator("input[name=name]").fill("x" * 10_000)
    assert len(form.locator("input[name=name]").input_value()) == 10_000
    form.locator("button[type=submit]").click()
    page.wait_for_selector(".error[role=alert]")
    assert "the study name has 10,000 characters; the limit is 200" in page.inner_text(
        ".error[role=alert]"
    )
    assert "x" * 201 not in page.inner_text("body")
    form = page.locator("form[action='/admin/studies']")
    form.locator("input[name=name]").fill("Umfrage Größe Zürich")
    form.locator("button[type=submit]").click()
    page.wait_for_url(base + "/admin/studies/umfrage-grosse-zurich")
    assert page.locator("h1").first.inner_text().startswith("Umfrage Größe Zürich")


def test_upload_preview_then_import_without_choosing_files_again(
    server: dict[str, Any], page: Any
) -> None:
    base, upload = server["base"], server["upload"]
    page.goto(base + "/admin/import")
    for name in ("responses.csv", "codebook.jsonl", "dataset.json", "user_split.json"):
        page.set_input_files(f"#import-upload input[name='{name}']", str(upload / name))
    page.fill("#import-upload input[name=name]", "Uploaded OpinionQA")
    page.click("#import-upload button[value=preview]")
    page.wait_for_selector("#preview")
    text = page.inner_text("#preview")
    assert "80 respondents" in text and "not found" not in page.inner_text("body")
    assert axe_violations(page) == []
    page.locator("#preview").scroll_into_view_if_needed()
    shot(page, SHOTS, "20-import-preview")
    page.click("#import-previewed button[type=submit]")
    page.wait_for_url(base + "/admin/studies/uploaded-opinionqa")
    assert "Uploaded OpinionQA" in page.inner_text("body")


def test_fit_job_shows_progress_and_a_readable_result(server: dict[str, Any], page: Any) -> None:
    base = server["base"]
    page.goto(base + "/admin/studies/designer-e2e/jobs")
    page.click("button:has-text('Fit the belief model')")
    page.wait_for_selector("[id^=fit-summary]", timeout=600_000)
    summary = page.inner_text("[id^=fit-summary]")
    assert summary.startswith("Fitted: latent classes, ") and "classes" in summary
    assert axe_violations(page) == []
    shot(page, SHOTS, "22-fit-job-result", full_page=False)
    page.goto(base + "/admin/studies/designer-e2e")
    assert "Active: latent classes" in page.inner_text("#belief-model")

    # The running state: the fit of 150 respondents takes about a second, so whether a
    # poll lands in its restarts is timing. A running fit row that no worker claims
    # (``worker`` NULL: the reaper leaves it alone) shows it deterministically.
    from sqlmodel import Session

    from app.db import make_engine
    from app.tables import Job, Study

    message = "fitting latent classes: K grid: 8 classes (2 of 6), restart 2 of 3"
    engine = make_engine(server["url"])
    with Session(engine) as db:
        study = db.exec(select(Study).where(Study.slug == "designer-e2e")).one()
        job = Job(kind="fit_model", study_id=study.id, payload={}, status="running",
                  progress=0.4, message=message, attempts=1)  # fmt: skip
        db.add(job)
        db.commit()
        job_id = job.id
    try:
        page.goto(base + "/admin/studies/designer-e2e/jobs")
        running = page.locator(f"#job-{job_id}[data-status=running]")
        running.locator(f"text=40% {message}").wait_for()
        assert running.locator("progress").get_attribute("value") == "40"
        shot(page, SHOTS, "21-fit-job-progress", full_page=False)
    finally:
        with Session(engine) as db:
            row = db.get(Job, job_id)
            assert row is not None
            row.status = "cancelled"
            db.add(row)
            db.commit()
        engine.dispose()
