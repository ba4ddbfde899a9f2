"""Full HTML pages."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.deps import SessionDep, TemplatesDep
from app.services.studies import list_study_summaries

router = APIRouter()


@router.get("/", response_class=HTMLResponse, name="home")
def home(request: Request, session: SessionDep, templates: TemplatesDep) -> Response:
    """The study list: name, slug, number of items and respondents."""
    studies = list_study_summaries(session=session)
    return templates.TemplateResponse(request, "pages/home.html", {"studies": studies})
