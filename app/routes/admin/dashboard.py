"""Read-only views of a study: the simulation page ("how many questions do I need?") and
the live dashboard (htmx refreshes only its ``dashboard`` block)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from app.auth import VisibleStudy
from app.deps import SessionDep
from app.routes.admin.common import PageDep
from app.services.dashboard import dashboard_page as dashboard_view
from app.services.job_views import kind_overview

router = APIRouter()


@router.get("/studies/{slug}/simulation", response_class=HTMLResponse, name="admin_simulation")
def simulation_page(page: PageDep, study: VisibleStudy, session: SessionDep) -> Response:
    ctx = kind_overview(study, "simulation", session=session)
    return page.render("admin/simulation.html", ctx)


@router.get("/studies/{slug}/dashboard", response_class=HTMLResponse, name="admin_dashboard")
def dashboard_page(page: PageDep, study: VisibleStudy, session: SessionDep) -> Response:
    ctx = dashboard_view(study, session=session)
    return page.render("admin/dashboard.html", ctx, block="dashboard" if page.htmx else None)
