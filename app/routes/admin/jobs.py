"""Background jobs of a study: the jobs page, starting a job, one job's row (it polls
itself while the job is queued or running), cancelling, a finished simulation's plot."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from app.auth import CurrentResearcher, VisibleStudy
from app.deps import DbId, SessionDep, SettingsDep
from app.errors import InvalidInputError
from app.routes.admin.common import FormDep, PageDep
from app.services import job_views, jobs, learning
from app.services.simulation import check_can_start

router = APIRouter()

SIMULATION_FIELDS = ("budget", "max_test_users")
"""The optional whole-number fields of a simulation job's payload."""

AFTER_START = {"simulation": "admin_simulation", "plan_group_round": "admin_groups"}
"""The page to go to after starting a job of a kind (the jobs page for the others)."""


@router.get("/studies/{slug}/jobs", response_class=HTMLResponse, name="admin_jobs")
def jobs_page(page: PageDep, study: VisibleStudy, session: SessionDep) -> Response:
    return page.render("admin/jobs.html", job_views.jobs_overview(study, session=session))


@router.post("/studies/{slug}/jobs")
async def start_job(
    page: PageDep,
    form: FormDep,
    study: VisibleStudy,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    kind = form.text("kind")
    payload: dict[str, Any] = {}
    if kind == "persona_generation":
        raise InvalidInputError(
            "kind: persona generation starts on the study's Personas page, which checks "
            "the language model and the persona dictionary first"
        )
    if kind == "simulation":
        for name in SIMULATION_FIELDS:
            value = form.opt_int(name)
            if value is not None:
                payload[name] = value
        check_can_start(study, payload, session=session)  # refused now, not when it runs
    job = jobs.start_job(
        kind, study, payload=payload, researcher=researcher, settings=settings, session=session
    )
    target = AFTER_START.get(kind, "admin_jobs")
    return page.redirect(target, query={"job": job.id}, slug=study.slug)


@router.get("/studies/{slug}/jobs/{job_id}", response_class=HTMLResponse, name="admin_job")
def job_partial(
    job_id: DbId, page: PageDep, study: VisibleStudy, session: SessionDep, refresh: str = ""
) -> Response:
    """The job's row: polls itself every second while the job is queued or running. With
    ``refresh=1`` (the personas page, whose counts the job changes) the poll that sees the
    job finish reloads the page instead (:meth:`Page.reload`)."""
    row = job_views.study_job_row(study, job_id, session=session)
    if refresh == "1" and not row["active"]:
        return page.reload()
    ctx = {"study": study, **row, "refresh_on_finish": refresh == "1"}
    return page.render("admin/job.html", ctx, block="job")


@router.post("/studies/{slug}/jobs/{job_id}/cancel")
def cancel_job(
    job_id: DbId, page: PageDep, study: VisibleStudy, session: SessionDep, refresh: str = ""
) -> Response:
    """Cancel the job; its row shows it cancelled, or with ``refresh=1`` the page reloads
    (as when the job finishes)."""
    row = job_views.cancel_study_job(study, job_id, session=session)
    if refresh == "1":
        return page.reload()
    return page.render("admin/job.html", {"study": study, **row}, block="job")


@router.get("/studies/{slug}/jobs/{job_id}/plot.svg", name="admin_job_plot")
def job_plot(job_id: DbId, study: VisibleStudy, session: SessionDep) -> Response:
    return Response(
        job_views.simulation_plot(study, job_id, session=session),
        media_type="image/svg+xml",
        headers={"Cache-Control": "private, max-age=3600"},
    )


@router.post("/studies/{slug}/refit", name="admin_refit")
def refit_now(
    page: PageDep,
    study: VisibleStudy,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    """ "Refit now": queue a ``fit_model`` job (or find the one queued or running) and go to
    the jobs page, where its row shows the progress; the study page lists the result."""
    job, _ = learning.queue_refit(
        study, researcher=researcher, settings=settings, session=session, reason="refit now"
    )
    return page.redirect("admin_jobs", query={"job": job.id}, slug=study.slug)
