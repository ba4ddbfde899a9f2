"""The htmx job partial (polls itself while active, stops when done; cancel; a running
fit's percentage and restart), the
simulation page, the dashboard page and the group page through TestClient."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlmodel import Session

from app.jobs.runner import execute_job
from app.tables import Job, Study
from tests.support.admin import csrf, login


def test_job_partial_polls_until_done_and_cancel(
    client: TestClient, ces_study: Study, db: Session
) -> None:
    job = Job(kind="simulation", study_id=ces_study.id, payload={})
    db.add(job)
    db.commit()
    login(client, "alice@example.org")
    url = f"/admin/studies/{ces_study.slug}/jobs/{job.id}"
    part = client.get(url, headers={"HX-Request": "true"})
    assert part.status_code == 200
    assert "<html" not in part.text  # a partial, not a page
    assert f'hx-get="{url}"' in part.text and 'data-status="queued"' in part.text
    # polled from the personas page: keeps asking for the reload on finish
    part = client.get(url + "?refresh=1", headers={"HX-Request": "true"})
    assert f'hx-get="{url}?refresh=1"' in part.text and "HX-Refresh" not in part.headers
    r = client.post(url + "/cancel", headers={"HX-Request": "true", "X-CSRF-Token": csrf(client)})
    assert r.status_code == 200 and 'data-status="cancelled"' in r.text
    assert "hx-get" not in r.text  # finished jobs stop polling
    assert client.post(url + "/cancel", headers={"X-CSRF-Token": csrf(client)}).status_code == 409
    # the poll that sees it finished reloads the personas page (its counts changed),
    # without the one-time notice the job's start put in its address
    personas = f"/admin/studies/{ces_study.slug}/personas"
    on_page = {"HX-Request": "true", "HX-Current-URL": f"http://testserver{personas}"}
    started = {**on_page, "HX-Current-URL": on_page["HX-Current-URL"] + "?notice=job+started&x=1"}
    done = client.get(url + "?refresh=1", headers=started)
    assert done.status_code == 200 and done.headers["HX-Redirect"] == f"{personas}?x=1"
    done = client.get(url + "?refresh=1", headers=on_page)
    assert done.headers["HX-Redirect"] == personas
    elsewhere = {"HX-Request": "true", "HX-Current-URL": "https://evil.example/phish"}
    done = client.get(url + "?refresh=1", headers=elsewhere)
    assert "HX-Redirect" not in done.headers and done.headers["HX-Refresh"] == "true"


def test_cancel_from_the_personas_page_reloads_it(
    client: TestClient, ces_study: Study, db: Session
) -> None:
    """A job cancelled from a page that reloads on finish reloads it, notice dropped."""
    job = Job(kind="persona_generation", study_id=ces_study.id, payload={})
    db.add(job)
    db.commit()
    login(client, "alice@example.org")
    url = f"/admin/studies/{ces_study.slug}/jobs/{job.id}"
    personas = f"/admin/studies/{ces_study.slug}/personas"
    page = client.get(personas).text
    assert f'hx-post="{url}/cancel?refresh=1"' in page
    headers = {
        "HX-Request": "true",
        "X-CSRF-Token": csrf(client),
        "HX-Current-URL": f"http://testserver{personas}?notice=persona+generation+started",
    }
    r = client.post(url + "/cancel?refresh=1", headers=headers)
    assert r.status_code == 200 and r.headers["HX-Redirect"] == personas
    db.refresh(job)
    assert job.status == "cancelled"


def test_running_fit_job_shows_its_restart_and_percentage(
    client: TestClient, ces_study: Study, db: Session
) -> None:
    message = "fitting latent classes: K grid: 8 classes (2 of 6), restart 2 of 3"
    job = Job(
        kind="fit_model",
        study_id=ces_study.id,
        payload={},
        status="running",
        progress=0.4,
        message=message,
    )
    db.add(job)
    db.commit()
    login(client, "alice@example.org")
    url = f"/admin/studies/{ces_study.slug}/jobs/{job.id}"
    part = client.get(url, headers={"HX-Request": "true"}).text
    assert '<progress max="100" value="40">' in part
    assert f"40% {message}" in part
    assert f'hx-get="{url}"' in part  # still polling


def test_simulation_page_says_before_the_run_when_it_cannot_simulate(
    client: TestClient, ces_study: Study, db: Session, alice
) -> None:  # type: ignore[no-untyped-def]
    from app.services.designer import create_study

    empty = create_study("No history", owner=alice, session=db)
    login(client, "alice@example.org")
    page = client.get(f"/admin/studies/{empty.slug}/simulation").text
    assert 'disabled aria-describedby="simulation-unavailable">Run simulation' in page
    assert (
        "This study has 0 imported respondents and 0 live respondents who answered every "
        "question; a simulation replays complete answers" in page
    )
    page = client.get(f"/admin/studies/{ces_study.slug}/simulation").text
    assert (
        'id="simulation-unavailable"' not in page and '<button type="submit">Run simulation' in page
    )
    # the jobs page disables the jobs that would fail, saying why
    jobs = client.get(f"/admin/studies/{empty.slug}/jobs").text
    for kind, label in (
        ("simulation", "Simulate before fielding"),
        ("train_gnn", "Train the group GNN"),
    ):
        assert f'disabled aria-describedby="why-not-{kind}">{label}</button>' in jobs
        assert f'id="why-not-{kind}">{label}: ' in jobs
    assert '<button type="submit" class="secondary">Fit the belief model</button>' in jobs
    jobs = client.get(f"/admin/studies/{ces_study.slug}/jobs").text
    assert "why-not-" not in jobs


def test_simulation_result_page_and_plot(
    client: TestClient, ces_study: Study, db: Session, engine
) -> None:  # type: ignore[no-untyped-def]
    payload = {"budget": 2, "max_test_users": 30, "n_classes": [2], "baselines": ["random", "full"]}
    job = Job(kind="simulation", study_id=ces_study.id, payload=payload)
    db.add(job)
    db.commit()
    assert execute_job(engine, job.id or 0) == "succeeded"
    login(client, "alice@example.org")
    page = client.get(f"/admin/studies/{ces_study.slug}/simulation")
    assert page.status_code == 200 and 'id="simulation-plot"' in page.text
    assert "How many questions do you need?" in page.text
    import re

    rows = re.findall(r"<tr><td>(\w+) <span class=\"muted\">accuracy</span></td>(.*?)</tr>",
                      page.text)  # fmt: skip
    assert {name for name, _ in rows} >= {"random", "full"}
    assert all(cells.count("<td") == 3 for _, cells in rows)  # 0..2 questions, every row
    svg = client.get(f"/admin/studies/{ces_study.slug}/jobs/{job.id}/plot.svg")
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml")
    assert svg.text.lstrip().startswith("<?xml") and "</svg>" in svg.text


def test_dashboard_without_model_and_group_page(client: TestClient, ces_study: Study) -> None:
    login(client, "alice@example.org")
    page = client.get(f"/admin/studies/{ces_study.slug}/dashboard")
    assert page.status_code == 200 and "no predictions" in page.text
    assert ">0</span> started" in page.text
    part = client.get(f"/admin/studies/{ces_study.slug}/dashboard", headers={"HX-Request": "true"})
    assert part.status_code == 200 and "<html" not in part.text and 'id="dashboard"' in part.text
    groups = client.get(f"/admin/studies/{ces_study.slug}/groups")
    assert groups.status_code == 200 and "Plan next round" in groups.text


def test_bad_simulation_options_are_refused_before_a_job_is_queued(
    client: TestClient, ces_study: Study, db: Session
) -> None:
    from sqlmodel import select

    login(client, "alice@example.org")
    url = f"/admin/studies/{ces_study.slug}/jobs"
    for field, value, message in (
        ("budget", "-5", "budget must be &gt;= 0"),
        ("max_test_users", "0", "max_test_users must be &gt;= 1"),
        ("budget", "abc", "budget: not a whole number"),
    ):
        r = client.post(url, data={"kind": "simulation", field: value, "csrf_token": csrf(client)})
        assert r.status_code == 422 and message in r.text, (field, value, r.text[:300])
    assert db.exec(select(Job).where(Job.study_id == ces_study.id)).all() == []


def test_job_results_in_words() -> None:
    from app.services.job_views import result_summary

    persona = Job(kind="persona_generation", status="succeeded", result={
        "personas": 4, "questions": 2, "total_pairs": 8, "already_stored": 0, "computed": 8,
        "flagged": 1, "pairs_per_second": 155.421, "model": "SmolLM2-135M-Instruct",
        "template_version": "v1-e8ba8e4a111b"})  # fmt: skip
    assert result_summary(persona) == (
        "8 persona × question pairs scored (4 personas × 2 questions; 0 were already stored) "
        "at 155.4 pairs per second with SmolLM2-135M-Instruct; 1 flagged: the model put "
        "little probability on the answer letters, so its distribution says little"
    )  # a result stored before the backend was recorded
    persona.result = {**persona.result, "flagged": 0, "backend": "local", "base_url": None}
    assert result_summary(persona).endswith("with SmolLM2-135M-Instruct (the embedded model)")
    persona.result = {**persona.result, "backend": "openai", "base_url": "http://gpu:8000"}
    assert result_summary(persona).endswith(
        "with SmolLM2-135M-Instruct on the inference server http://gpu:8000"
    )
    order = Job(kind="fixed_order", status="succeeded",
                result={"status": "not_applicable", "key": None, "cpu_seconds": None})  # fmt: skip
    assert result_summary(order) == (
        "nothing to compute: the study has no fitted model, or no question or target items"
    )
    order.result = {"status": "computed", "key": "k", "cpu_seconds": 12.34}
    assert result_summary(order) == "the fixed question order was computed in 12.3 s of CPU"


def test_the_simulation_page_says_why_the_last_run_failed(
    client: TestClient, ces_study: Study, db: Session
) -> None:
    job = Job(kind="simulation", study_id=ces_study.id, payload={}, status="failed",
              error="the study has too few imported respondents to simulate")  # fmt: skip
    db.add(job)
    db.commit()
    login(client, "alice@example.org")
    page = client.get(f"/admin/studies/{ces_study.slug}/simulation")
    assert page.status_code == 200 and "Last run failed" in page.text
    assert "too few imported respondents" in page.text and "No simulation yet" not in page.text


def test_a_rejected_auto_fit_shows_the_candidates_it_compared(
    client: TestClient, ces_study: Study, db: Session
) -> None:
    from app.services.belief import fit_study_model

    active = fit_study_model(ces_study, session=db, n_classes=(2,), n_restarts=1)
    worse = fit_study_model(ces_study, session=db, n_classes=(1,), n_restarts=1)
    assert active.is_active and worse.status == "rejected"
    rows = [
        {"name": "latent classes", "log_loss_0": 0.69, "log_loss_T": 0.5123, "mean_log_loss": 0.6},
        {"name": "persona mixture", "log_loss_0": 0.69, "log_loss_T": 0.4567, "chosen": True},
    ]
    worse.metrics = {**(worse.metrics or {}), "model_choice": rows}
    db.add(worse)
    db.commit()
    login(client, "alice@example.org")
    page = client.get(f"/admin/studies/{ces_study.slug}").text
    versions = page.split('id="model-versions"', 1)[1]
    assert versions.count("candidates compared") == 1  # the rejected auto fit only
    assert "0.5123" in versions and "0.4567" in versions
    assert 'id="model-choice"' not in page  # the active fit is not an auto fit


def test_persona_generation_starts_only_from_the_personas_page(
    client: TestClient, ces_study: Study, db: Session
) -> None:
    """The Jobs form does not start it: the Personas page checks the language model and
    the dictionary first, and the job would run with defaults nobody chose."""
    from sqlmodel import select

    login(client, "alice@example.org")
    r = client.post(
        f"/admin/studies/{ces_study.slug}/jobs",
        data={"kind": "persona_generation", "csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert r.status_code == 422 and "starts on the study&#39;s Personas page" in r.text
    assert db.exec(select(Job)).all() == []
