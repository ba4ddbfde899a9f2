"""Background jobs of a study: list, start, poll one job's row, cancel, a simulation's plot."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import func
from sqlmodel import col, select

from app.auth import CurrentResearcher, VisibleStudy
from app.deps import SessionDep, SettingsDep, TemplatesDep
from app.errors import NotFoundError
from app.jobs.kinds import LABELS, kind_names
from app.routes.admin.common import form_str, job_view, opt_int, render, see_other
from app.services import jobs
from app.tables import JobStatus, StudyPersona

router = APIRouter()


PERSONAS_SHOWN = 200
"""Personas listed on the jobs page (the count covers all of them)."""


@router.get("/studies/{slug}/jobs", response_class=HTMLResponse, name="admin_jobs")
def jobs_page(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    rows = [job_view(j) for j in jobs.study_jobs(study, session=session)]
    # The study's persona dictionary (texts a researcher entered or generated from
    # attribute profiles), shown where persona generation is started; text is escaped.
    personas = session.exec(
        select(StudyPersona)
        .where(StudyPersona.study_id == study.id)
        .order_by(col(StudyPersona.id))
        .limit(PERSONAS_SHOWN)
    ).all()
    n_personas = session.exec(
        select(func.count()).select_from(StudyPersona).where(StudyPersona.study_id == study.id)
    ).one()
    return render(
        request,
        templates,
        "admin/jobs.html",
        {
            "study": study,
            "jobs": rows,
            "kinds": [(k, LABELS[k]) for k in kind_names()],
            "personas": personas,
            "n_personas": n_personas,
        },
    )


@router.post("/studies/{slug}/jobs")
async def start_job(
    request: Request,
    study: VisibleStudy,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
    templates: TemplatesDep,
) -> Response:
    form = await request.form()
    kind = form_str(form, "kind")
    payload: dict[str, Any] = {}
    if kind == "simulation":
        for name in ("budget", "max_test_users"):
            value = opt_int(form_str(form, name))
            if value is not None:
                payload[name] = value
    job = jobs.start_job(
        kind, study, payload=payload, researcher=researcher, settings=settings, session=session
    )
    target = {"simulation": "admin_simulation", "plan_group_round": "admin_groups"}.get(
        kind, "admin_jobs"
    )
    return see_other(str(request.url_for(target, slug=study.slug)) + f"?job={job.id}")


@router.get("/studies/{slug}/jobs/{job_id}", response_class=HTMLResponse, name="admin_job")
def job_partial(
    job_id: int,
    request: Request,
    study: VisibleStudy,
    session: SessionDep,
    templates: TemplatesDep,
) -> Response:
    """The job's row: polls itself every second while the job is queued or running."""
    job = jobs.get_study_job(study, job_id, session=session)
    return render(
        request, templates, "admin/job.html", {"study": study, **job_view(job)}, block="job"
    )


@router.post("/studies/{slug}/jobs/{job_id}/cancel")
def cancel_job(
    job_id: int,
    request: Request,
    study: VisibleStudy,
    session: SessionDep,
    templates: TemplatesDep,
) -> Response:
    job = jobs.get_study_job(study, job_id, session=session)
    jobs.cancel_job(job, session=session)
    return render(
        request, templates, "admin/job.html", {"study": study, **job_view(job)}, block="job"
    )


@router.get("/studies/{slug}/jobs/{job_id}/plot.svg", name="admin_job_plot")
def job_plot(job_id: int, study: VisibleStudy, session: SessionDep) -> Response:
    from app.services.plots import simulation_svg

    job = jobs.get_study_job(study, job_id, session=session)
    if job.kind != "simulation" or job.status != JobStatus.succeeded.value or not job.result:
        raise NotFoundError("this job has no simulation plot")
    return Response(
        simulation_svg(job.result),
        media_type="image/svg+xml",
        headers={"Cache-Control": "private, max-age=3600"},
    )
