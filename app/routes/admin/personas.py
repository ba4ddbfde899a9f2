"""A study's personas page: the persona dictionary, its three sources (persona texts,
attribute shares, the imported respondents' profiles), generating their answer
distributions with the embedded model or the configured inference server, and the
persona jobs (progress, cancel, resume).

Each source form adds personas in one transaction and redirects (303) to the page with a
notice; a user error re-renders the page with the message naming the place (422), with
nothing stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse, Response

from app.auth import CurrentResearcher, VisibleStudy
from app.deps import SessionDep, SettingsDep
from app.routes.admin.common import FormDep, PageDep, error_status, user_error_message
from app.services import job_views, jobs, persona_input
from app.services import personas as persona_service

router = APIRouter()

MAX_PERSONA_UPLOAD = 8 * 1024 * 1024
"""Largest persona file accepted (bytes)."""


class PersonasPage:
    """Dependency: what every personas route shares: the page to answer with, the study of
    the URL (visible to the logged-in researcher, else 404), the database session and the
    settings.

    Example: a route taking ``personas: PersonasPageDep`` answers with
    ``personas.render(notice="3 personas added")`` or ``personas.apply(change)``.
    """

    def __init__(
        self, page: PageDep, study: VisibleStudy, session: SessionDep, settings: SettingsDep
    ) -> None:
        self.page = page
        self.study = study
        self.session = session
        self.settings = settings

    def render(self, status: int = 200, **extra: Any) -> Response:
        """The personas page of the study (``extra``: ``notice`` / ``error``)."""
        ctx = job_views.persona_overview(
            self.study, session=self.session, settings=self.settings, **extra
        )
        return self.page.render("admin/personas.html", ctx, status=status)

    def apply(self, change: Callable[[], str]) -> Response:
        """Run one change: redirect (303) with its notice, or roll back and re-render with
        the user error (422, or its own status: 503 when the job queue is unreachable)."""
        try:
            notice = change()
        except Exception as exc:
            self.session.rollback()
            return self.render(status=error_status(exc), error=user_error_message(exc))
        return self.page.redirect("admin_personas", slug=self.study.slug, query={"notice": notice})


PersonasPageDep = Annotated[PersonasPage, Depends(PersonasPage)]


@router.get("/studies/{slug}/personas", response_class=HTMLResponse, name="admin_personas")
def personas_page(personas: PersonasPageDep, notice: str | None = None) -> Response:
    return personas.render(notice=(notice or "")[:200] or None)


def _added(n: int, what: str) -> str:
    return f"{n} persona{'s' if n != 1 else ''} added from {what}"


@router.post("/studies/{slug}/personas/texts")
async def persona_texts(form: FormDep, personas: PersonasPageDep) -> Response:
    study, session = personas.study, personas.session
    upload = await form.upload("file", max_bytes=MAX_PERSONA_UPLOAD)

    def change() -> str:
        raw, name = persona_input.form_persona_texts(form.text("texts"), upload)
        n = persona_service.add_text_personas(
            study, raw, filename=name, session=session, settings=personas.settings
        )
        return _added(n, "persona texts")

    return personas.apply(change)


@router.post("/studies/{slug}/personas/shares")
async def persona_shares(form: FormDep, personas: PersonasPageDep) -> Response:
    study, session = personas.study, personas.session

    def change() -> str:
        shares = persona_service.shares_from_fields(study, form.texts(), session=session)
        n = persona_service.add_share_personas(
            study,
            shares,
            sample=form.opt_int("sample"),
            session=session,
            settings=personas.settings,
        )
        return _added(n, "attribute shares")

    return personas.apply(change)


@router.post("/studies/{slug}/personas/respondents")
async def persona_respondents(form: FormDep, personas: PersonasPageDep) -> Response:
    study, session = personas.study, personas.session

    def change() -> str:
        n = persona_service.add_respondent_personas(
            study, n=form.opt_int("profiles"), session=session, settings=personas.settings
        )
        return _added(n, "the imported respondents' profiles")

    return personas.apply(change)


@router.post("/studies/{slug}/personas/clear")
async def persona_clear(personas: PersonasPageDep) -> Response:
    def change() -> str:
        n = persona_service.clear_personas(personas.study, session=personas.session)
        return f"{n} persona{'s' if n != 1 else ''} removed"

    return personas.apply(change)


@router.post("/studies/{slug}/personas/generate")
async def persona_generate(
    form: FormDep, personas: PersonasPageDep, researcher: CurrentResearcher
) -> Response:
    study, session, settings = personas.study, personas.session, personas.settings

    def change() -> str:
        payload = persona_service.generation_payload(
            form.text("backend"), study, session=session, settings=settings
        )
        job = jobs.start_job(
            "persona_generation",
            study,
            payload=payload,
            researcher=researcher,
            settings=settings,
            session=session,
        )
        return f"persona generation job #{job.id} started"

    return personas.apply(change)
