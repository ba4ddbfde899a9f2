"""What the admin pages say about a study's model lifecycle, through TestClient (SQLite
and PostgreSQL): a failed refit beside "Refit now", the validation respondents behind
``auto``'s comparison table, what a simulation's figures rest on (test respondents, the
belief model) and when it cannot run, the uniform prior's way out and what a persona
generation leads to under the study's belief model."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.jobs.runner import execute_job
from app.schemas import StudySettings
from app.services.belief import fit_study_model
from app.services.designer import (
    add_item,
    create_study,
    set_roles,
    study_items,
    update_settings,
)
from app.services.learning import respondent_part
from app.services.model_notes import CHOICE_SIZE_KEY
from app.tables import Job, Researcher, Respondent, Study, utcnow
from tests.support.admin import csrf, login


def _set_belief_model(db: Session, study: Study, kind: str) -> None:
    values = StudySettings.model_validate(study.settings or {}).model_dump(mode="json")
    update_settings(study, {**values, "belief_model": kind}, session=db)


def test_a_failed_refit_shows_beside_refit_now_until_a_newer_model(
    client: TestClient, ces_study: Study, db: Session, engine: Engine
) -> None:
    fit_study_model(ces_study, session=db, n_classes=(2,), n_restarts=1)
    login(client, "alice@example.org")
    url = f"/admin/studies/{ces_study.slug}"
    assert 'id="refit-failed"' not in client.get(url).text
    roles = {it.key: "attribute" for it in study_items(ces_study, session=db)}
    set_roles(ces_study, roles, session=db)  # nothing left to model: the fit raises
    job = Job(kind="fit_model", study_id=ces_study.id, payload={"reason": "refit now"})
    db.add(job)
    db.commit()
    assert execute_job(engine, job.id or 0) == "failed"
    db.refresh(job)
    page = client.get(url).text
    shown = page.split('id="refit-failed"', 1)[1].split("</p>", 1)[0]
    assert "The last fit of the belief model (refit now) failed on " in shown
    assert "has no question or target items to model" in shown  # the job's error
    assert "The active model is unchanged" in shown
    assert f'href="/admin/studies/{ces_study.slug}/jobs?job={job.id}">Job {job.id}</a>' in shown
    # a model version stored after the failure: the failure is old news
    set_roles(ces_study, dict.fromkeys(roles, "question") | _targets(ces_study), session=db)
    fit_study_model(ces_study, session=db, n_classes=(1,), n_restarts=1, force=True)
    assert 'id="refit-failed"' not in client.get(url).text
    # a later failed fit shows again; a fit job that succeeded after it hides it
    later = utcnow() + timedelta(seconds=5)
    failed = Job(kind="fit_model", study_id=ces_study.id, status="failed",
                 error="belief_model 'auto': every candidate was skipped", finished_at=later)  # fmt: skip
    db.add(failed)
    db.commit()
    page = client.get(url).text
    assert 'id="refit-failed"' in page and "every candidate was skipped" in page
    db.add(Job(kind="fit_model", study_id=ces_study.id, status="succeeded", finished_at=later))
    db.commit()
    assert 'id="refit-failed"' not in client.get(url).text


def _targets(study: Study) -> dict[str, str]:
    return dict.fromkeys(study.benchmark_runs[0]["eval_qids"], "target")


def test_auto_comparison_shows_its_validation_respondents_and_cautions_when_few(
    client: TestClient, ces_study: Study, db: Session
) -> None:
    active = fit_study_model(ces_study, session=db, n_classes=(2,), n_restarts=1)
    rejected = fit_study_model(ces_study, session=db, n_classes=(1,), n_restarts=1)
    assert rejected.status == "rejected"
    rows = [
        {"name": "latent_classes", "log_loss_0": 0.69, "log_loss_T": 0.51, "mean_log_loss": 0.6,
         "chosen": True},
        {"name": "cape_linear", "log_loss_0": 0.7, "log_loss_T": 0.52, "mean_log_loss": 0.61},
    ]  # fmt: skip
    active.metrics = {**(active.metrics or {}), "model_choice": rows, CHOICE_SIZE_KEY: 12}
    rejected.metrics = {**(rejected.metrics or {}), "model_choice": rows, CHOICE_SIZE_KEY: 250}
    db.add(active)
    db.add(rejected)
    db.commit()
    login(client, "alice@example.org")
    page = client.get(f"/admin/studies/{ces_study.slug}").text
    table, versions = page.split('id="model-choice"', 1)[1].split('id="model-versions"', 1)
    assert "12 validation respondents</strong>" in table
    assert "Only 12 validation respondents (fewer than 100): this choice is noisy" in table
    assert "Promotion still checks the fit against the active model on the held-out" in table
    assert "250 validation respondents</strong>" in versions and "choice is noisy" not in versions
    active.metrics = {k: v for k, v in active.metrics.items() if k != CHOICE_SIZE_KEY}
    db.add(active)
    db.commit()
    page = client.get(f"/admin/studies/{ces_study.slug}").text
    assert "their number was not recorded for this fit" in page


def test_auto_records_its_validation_respondents_the_selection_part_with_a_target_answer(
    ces_study: Study, db: Session
) -> None:
    """The fit's selection part (``val`` of the dataset split, and 15 % of the respondents
    without one): an ``auto`` fit records how many of them answered some target (those
    ``choose_model`` scores)."""
    targets = set(ces_study.benchmark_runs[0]["eval_qids"])
    everyone = db.exec(select(Respondent).where(Respondent.study_id == ces_study.id)).all()
    want = sum(
        1
        for r in everyone
        if respondent_part(ces_study.id or 0, r.id or 0, r.split) == "selection"
        and targets & set(r.answers or {})
    )
    assert want > 0
    row = fit_study_model(ces_study, session=db, n_classes=(2,), n_restarts=1,
                          belief_model="auto",
                          fit_options={"auto": {"families": ("latent_classes",)}})  # fmt: skip
    assert (row.metrics or {})[CHOICE_SIZE_KEY] == want


def test_a_simulation_on_one_test_respondent_cautions_and_names_its_model(
    client: TestClient, ces_study: Study, db: Session, engine: Engine
) -> None:
    payload = {"budget": 2, "max_test_users": 1, "n_classes": [2], "baselines": ["random", "full"]}
    job = Job(kind="simulation", study_id=ces_study.id, payload=payload)
    db.add(job)
    db.commit()
    assert execute_job(engine, job.id or 0) == "succeeded"
    login(client, "alice@example.org")
    for url in (f"/admin/studies/{ces_study.slug}/simulation",
                f"/admin/studies/{ces_study.slug}/jobs"):  # fmt: skip
        page = client.get(url).text
        assert 'id="simulation-caution"' in page, url
        assert "These figures rest on only 1 test respondent (fewer than 30)" in page
        assert "asking questions does not improve" not in page
        assert "reach 90 % of the accuracy" not in page
        assert "1 held-out (test) respondent," in page
        model = page.split('id="simulation-model">', 1)[1].split("</p>", 1)[0]
        assert (
            "Belief model: <strong>latent classes (default)</strong> (<code>default</code>)"
            in model
        )
        assert "fitted as <strong>latent classes</strong> (<code>persona_mixture</code>)" in model
    part = client.get(f"/admin/studies/{ces_study.slug}/jobs/{job.id}").text
    assert 'id="simulation-caution"' in part and 'id="simulation-model"' in part


def test_run_is_disabled_and_refused_when_no_respondent_answered_a_target(
    client: TestClient, ces_study: Study, db: Session
) -> None:
    set_roles(ces_study, dict.fromkeys(_targets(ces_study), "question"), session=db)
    add_item(ces_study, session=db, key="new_t", question="A new target?",
             options_text="A: Yes\nB: No", role="target", topic="", is_preference_criterion=False)  # fmt: skip
    login(client, "alice@example.org")
    page = client.get(f"/admin/studies/{ces_study.slug}/simulation").text
    assert 'disabled aria-describedby="simulation-unavailable">Run simulation' in page
    reason = page.split('id="simulation-unavailable">', 1)[1].split("</p>", 1)[0]
    assert "No respondent of this study has an answer to a target item (new_t)" in reason
    assert "so there is nothing to score" in reason
    jobs = client.get(f"/admin/studies/{ces_study.slug}/jobs").text
    assert 'disabled aria-describedby="why-not-simulation"' in jobs
    r = client.post(f"/admin/studies/{ces_study.slug}/jobs",
                    data={"kind": "simulation", "csrf_token": csrf(client)},
                    follow_redirects=False)  # fmt: skip
    assert r.status_code == 409 and "simulation not started: No respondent of this" in r.text
    assert db.exec(select(Job).where(Job.study_id == ces_study.id)).all() == []


def test_the_uniform_prior_warning_says_what_works_for_this_study(
    client: TestClient, db: Session, alice: Researcher
) -> None:
    study = create_study("Cold start", owner=alice, session=db)
    add_item(study, session=db, key="q1", question="Trust?", options_text="A: Yes\nB: No",
             role="question", topic="", is_preference_criterion=False)  # fmt: skip
    study.status, study.consent_text = "published", "ok"
    db.add(study)
    db.commit()
    login(client, "alice@example.org")
    for url in (f"/admin/studies/{study.slug}", f"/admin/studies/{study.slug}/personas"):
        warning = client.get(url).text.split('id="prior-warning">', 1)[1].split("</p>", 1)[0]
        assert "import historical respondents (Import)" not in warning, url
        assert "What works for this study: add personas on the Personas tab" in warning
        assert "Import always creates a new study" in warning
    page = client.get(f"/admin/studies/{study.slug}").text
    assert ">Import (as a new study)</a>" in page


def test_the_personas_page_says_what_a_generation_leads_to(
    client: TestClient, ces_study: Study, db: Session, alice: Researcher
) -> None:
    login(client, "alice@example.org")
    url = f"/admin/studies/{ces_study.slug}/personas"

    def use() -> str:
        page = client.get(url).text
        assert "Afterwards, fit the model (Jobs) to use the persona prior" not in page
        return page.split('id="persona-use">', 1)[1].split("</p>", 1)[0]

    said = use()  # latent classes and 400 imported respondents
    assert "belief model is “latent classes (default)”" in said
    assert "does not use the persona prior" in said
    assert "“language-model personas”" in said and "“automatic choice”" in said
    _set_belief_model(db, ces_study, "persona_mixture")
    said = use()
    assert "the fit is the persona prior, its weights refitted on the study&#39;s 265" in said
    _set_belief_model(db, ces_study, "cape_linear")
    assert "which does not use personas" in use()
    _set_belief_model(db, ces_study, "auto")
    assert "the personas are used only if they win" in use()
    empty = create_study("No answers", owner=alice, session=db)
    add_item(empty, session=db, key="q1", question="Trust?", options_text="A: Yes\nB: No",
             role="question", topic="", is_preference_criterion=False)  # fmt: skip
    page = client.get(f"/admin/studies/{empty.slug}/personas").text
    assert "no respondents to learn from yet, so the fit is the persona prior itself" in page
