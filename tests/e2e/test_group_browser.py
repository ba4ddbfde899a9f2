"""Group rounds with the study's GNN, in a real headless Chromium against ``priorly serve``.

The study (a small CES copy, three targets, a fitted belief model, published) has six live
members who answered and can be reached (external ids), and a GNN trained by the "Train
the group GNN" job. In the browser the researcher plans a round with relational selection
(k-means over the GNN's member embeddings; the plan explains each member), opens it, a
member answers on their personal link, the track table updates itself, the round is
closed; then a second round is planned with the default selection (the belief model and
the GNN pooled), opened and closed. The groups page plots the imputed target distribution
round by round, and the wide CSV has each member once (survey and round answers in one
row). axe-core finds no serious or critical violation on the groups and round pages.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import RESULTS, admin_page, axe_violations, shot
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import priorly_serve

SHOTS = RESULTS / "groups"
EMAIL, PASSWORD = "admin@example.org", "e2e admin password"
SLUG = "ces-groups"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from sqlmodel import Session

    from app import session as svc
    from app.auth import create_account
    from app.db import make_engine, upgrade
    from app.jobs.runner import execute_job
    from app.services.belief import fit_study_model
    from app.services.designer import set_roles
    from app.services.importer import import_dataset
    from app.tables import Job, JobStatus, Study

    folder = tmp_path_factory.mktemp("groups-e2e")
    data = write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 200)
    url = f"sqlite:///{folder / 'groups.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as db:
        admin = create_account(EMAIL, PASSWORD, session=db, is_admin=True)
        result = import_dataset(data, session=db, study_name="CES groups")
        study = db.get(Study, result.study_id)
        assert study is not None
        set_roles(study, dict.fromkeys(("334a", "334b", "330c"), "target"), session=db)
        db.refresh(study)
        fit_study_model(study, session=db, n_classes=(4,), n_restarts=1)
        study.slug, study.owner_id, study.status, study.consent_text = (
            SLUG,
            admin.id,
            "published",
            "ok",
        )
        study.settings = {
            **study.settings,
            "group": {**study.settings["group"], "respondents_per_round": 3, "rounds": 3},
        }
        db.add(study)
        db.commit()
        db.refresh(study)
        for r in range(6):
            started = svc.start_session(study, engine=engine, external_id=f"member-{r}")
            view = started.view
            for k in range(2):
                assert view.question is not None
                view = svc.submit_answer(
                    study,
                    started.session_id,
                    item_key=view.question.key,
                    option=view.question.options[(r + k) % len(view.question.options)][0],
                    idempotency_key=f"{r}-{k}",
                    engine=engine,
                )
        job = Job(kind="train_gnn", study_id=study.id, payload={"max_epochs": 8})
        db.add(job)
        db.commit()
        assert execute_job(engine, job.id or 0) == JobStatus.succeeded.value
    engine.dispose()
    with priorly_serve(url, folder) as base:
        yield base


def _plan(page: Any, base: str, selection: str) -> str:
    page.goto(f"{base}/admin/studies/{SLUG}/groups")
    page.select_option("#selection", selection)
    page.click("#plan-round button[type=submit]")
    page.wait_for_url(re.compile(r".*[?&]job=\d+"))
    job_id = re.search(r"[?&]job=(\d+)", page.url).group(1)  # type: ignore[union-attr]
    # this plan's job row polls itself until it shows the plan (an earlier plan may be
    # on the page already)
    page.wait_for_selector(f"#job-{job_id} #round-plan", timeout=300_000)
    page.goto(f"{base}/admin/studies/{SLUG}/groups")  # the latest plan with its open button
    return str(page.inner_text("#round-plan"))


def _open_answer_close(page: Any, base: str, number: int, answer: bool) -> None:
    page.goto(f"{base}/admin/studies/{SLUG}/groups")
    page.click("#open-round button[type=submit]")
    page.wait_for_url(f"{base}/admin/studies/{SLUG}/groups/{number}")
    assert page.locator("#members tr[data-status=waiting]").count() == 3
    if answer:
        link = page.locator("#members input").first.input_value()
        member = page.context.new_page()
        member.goto(link)
        member.click("button.r-primary")  # nothing chosen: the refusal is shown
        member.wait_for_selector("text=Please choose an answer")
        member.locator("input[name=option]").first.check()
        member.click("button.r-primary")
        member.wait_for_selector("text=Thank you")
        member.close()
        page.wait_for_selector("#members tr[data-status=answered]", timeout=30_000)
        assert "UTC" in page.inner_text("#members tr[data-status=answered]")
    # one unit for gains (correct target answers, as on the plan); no raw ISO timestamp
    body = page.inner_text("body")
    assert "nats" not in body and not re.search(r"\d{4}-\d\d-\d\dT\d", body)
    assert axe_violations(page) == []
    shot(page, SHOTS, f"round-{number}-open")
    page.once("dialog", lambda d: d.accept())
    page.click("#close-round button[type=submit]")
    page.wait_for_selector("#track[data-status=closed]")


def test_rounds_with_the_gnn_and_relational_selection(server: str, browser: Any) -> None:
    base = server
    page = admin_page(browser, base, EMAIL, PASSWORD)

    plan = _plan(page, base, "relational")
    assert "relational" in plan and "Uses the study's trained GNN" in plan
    assert page.locator("#plan-members td:has-text('stands for')").count() == 3
    assert page.inner_text("#n-eligible") == "6"
    assert "ask 3 respondents" in page.inner_text("#open-round")
    assert axe_violations(page) == []
    shot(page, SHOTS, "plan-relational")
    _open_answer_close(page, base, 1, answer=True)

    plan = _plan(page, base, "elook")
    assert "expected gain in correct target answers" in plan
    assert "Uses the study's trained GNN" in plan
    shot(page, SHOTS, "plan-default")
    _open_answer_close(page, base, 2, answer=False)

    page.goto(f"{base}/admin/studies/{SLUG}/groups")
    page.wait_for_function(
        "() => { const i = document.querySelector('#group-distribution');"
        " return i && i.complete && i.naturalWidth > 0 }",
        timeout=120_000,
    )
    assert axe_violations(page) == []
    # the rounds list: readable times in UTC, one closed round per row
    for row in page.locator("#rounds tbody tr").all():
        cells = row.locator("td").all_inner_texts()
        for cell in cells[3:5]:
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", cell), cells
    assert page.locator("#rounds tbody tr").count() == 2
    first_question = page.locator("#rounds tbody tr").first.locator("td").nth(1).inner_text()
    shot(page, SHOTS, "groups-distribution")
    # the wide CSV: each member once, their survey and round answers in one row
    got = page.request.get(f"{base}/admin/studies/{SLUG}/export/answers_wide.csv")
    assert got.status == 200
    rows = list(csv.DictReader(io.StringIO(got.body().decode("utf-8-sig"))))
    assert sorted(r["respondent_id"] for r in rows) == [f"member-{r}" for r in range(6)]
    assert any(r[first_question] not in ("", "<skip>") for r in rows), first_question
