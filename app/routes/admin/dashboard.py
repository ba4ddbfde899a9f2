"""Read-only views of a study: the simulation page and the live dashboard."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.auth import VisibleStudy
from app.deps import SessionDep, TemplatesDep
from app.routes.admin.common import kind_context, render

router = APIRouter()


@router.get("/studies/{slug}/simulation", response_class=HTMLResponse, name="admin_simulation")
def simulation_page(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    return render(
        request, templates, "admin/simulation.html", kind_context(study, "simulation", session)
    )


@router.get("/studies/{slug}/dashboard", response_class=HTMLResponse, name="admin_dashboard")
def dashboard_page(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    from app.services import plots
    from app.services.dashboard import build_dashboard

    dash = build_dashboard(study, session=session)
    target_svgs = [
        plots.distribution_svg(
            f"{t.key}: {t.question} (n = {t.n})", t.labels, t.mean, t.low, t.high, t.prior
        )
        for t in dash.targets
    ]
    persona_svg = (
        plots.bars_svg(
            "aggregate persona posterior",
            [p["label"] for p in dash.personas],
            [p["weight"] for p in dash.personas],
            "mean posterior weight",
        )
        if dash.personas and dash.counts["started"]
        else None
    )
    block = "dashboard" if request.headers.get("hx-request") else None
    return render(
        request,
        templates,
        "admin/dashboard.html",
        {"study": study, "dash": dash, "target_svgs": target_svgs, "persona_svg": persona_svg},
        block=block,
    )
