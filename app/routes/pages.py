"""Full HTML pages."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.deps import SessionDep, TemplatesDep
from app.services.survey_links import open_surveys

router = APIRouter()


@router.get("/", response_class=HTMLResponse, name="home", include_in_schema=False)
def home(request: Request, session: SessionDep, templates: TemplatesDep) -> Response:
    """The public home page: the open surveys' titles with their links, nothing else."""
    surveys = open_surveys(session=session)
    return templates.TemplateResponse(request, "pages/home.html", {"surveys": surveys})


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> Response:
    """Browsers ask for ``/favicon.ico`` before reading a page's icon link."""
    return RedirectResponse("/static/img/favicon.svg", status_code=301)
