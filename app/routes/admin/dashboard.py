"""Read-only views of a study: the simulation page ("how many questions do I need?") and
the live dashboard (htmx refreshes only its ``dashboard`` block), with its "open a
respondent" form (a respondent id or a completion code -> the respondent's profile page)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from app.auth import VisibleStudy
from app.deps import SessionDep, SettingsDep
from app.routes.admin.common import PageDep, see_other
from app.services.dashboard import dashboard_page as dashboard_view
from app.services.dashboard import resolve_respondent
from app.services.job_views import kind_overview
from app.services.simulation import unavailable_reason

router = APIRouter()


@router.get("/studies/{slug}/simulation", response_class=HTMLResponse, name="admin_simulation")
def simulation_page(page: PageDep, study: VisibleStudy, session: SessionDep) -> Response:
    ctx = kind_overview(study, "simulation", session=session)
    ctx["unavailable"] = unavailable_reason(study, session=session)
    return page.render("admin/simulation.html", ctx)


@router.get("/studies/{slug}/dashboard", response_class=HTMLResponse, name="admin_dashboard")
def dashboard_page(page: PageDep, study: VisibleStudy, session: SessionDep) -> Response:
    ctx = dashboard_view(study, session=session)
    return page.render("admin/dashboard.html", ctx, block="dashboard" if page.htmx else None)


@router.get("/studies/{slug}/dashboard/respondent", name="admin_dashboard_respondent")
def open_respondent(
    study: VisibleStudy, session: SessionDep, settings: SettingsDep, respondent: str = ""
) -> Response:
    """303 to the profile of the respondent named by ``respondent`` (an id or a completion
    code); 404 with the reason when the study has no such respondent, 422 when empty."""
    rid = resolve_respondent(
        study, respondent[:200], settings.secret_key.get_secret_value(), session=session
    )
    return see_other(f"/admin/studies/{quote(study.slug, safe='')}/respondents/{rid}")
