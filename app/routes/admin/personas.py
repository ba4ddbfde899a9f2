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
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response
from sqlmodel import Session

from app.auth import CurrentResearcher, VisibleStudy
from app.deps import SessionDep, SettingsDep
from app.errors import InvalidInputError
from app.routes.admin.common import FormDep, PageDep, user_error_message
from app.services import job_views, jobs
from app.services import personas as persona_service
from app.settings import Settings
from app.tables import Study

router = APIRouter()

MAX_PERSONA_UPLOAD = 8 * 1024 * 1024
"""Largest persona file accepted (bytes)."""


def _page(
    page: PageDep,
    study: Study,
    session: Session,
    settings: Settings,
    status: int = 200,
    **extra: Any,
) -> Response:
    ctx = job_views.persona_overview(study, session=session, settings=settings, **extra)
    return page.render("admin/personas.html", ctx, status=status)


@router.get("/studies/{slug}/personas", response_class=HTMLResponse, name="admin_personas")
def personas_page(
    page: PageDep,
    study: VisibleStudy,
    session: SessionDep,
    settings: SettingsDep,
    notice: str | None = None,
) -> Response:
    return _page(page, study, session, settings, notice=(notice or "")[:200] or None)


def _persona_form(
    page: PageDep, study: Study, session: Session, settings: Settings, change: Callable[[], str]
) -> Response:
    """Run one change: redirect with its notice, or re-render with the error (422)."""
    try:
        notice = change()
    except Exception as exc:
        session.rollback()
        return _page(page, study, session, settings, status=422, error=user_error_message(exc))
    return page.redirect("admin_personas", slug=study.slug, query={"notice": notice})


def _added(n: int, what: str) -> str:
    return f"{n} persona{'s' if n != 1 else ''} added from {what}"


@router.post("/studies/{slug}/personas/texts")
async def persona_texts(
    page: PageDep,
    form: FormDep,
    study: VisibleStudy,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    upload = await form.upload("file", max_bytes=MAX_PERSONA_UPLOAD)

    def change() -> str:
        if upload is not None:
            name, data = upload
            try:
                raw = data.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInputError(f"{name}: not UTF-8 text") from None
            n = persona_service.add_text_personas(study, raw, filename=name, session=session)
        else:
            n = persona_service.add_text_personas(study, form.text("texts"), session=session)
        return _added(n, "persona texts")

    return _persona_form(page, study, session, settings, change)


@router.post("/studies/{slug}/personas/shares")
async def persona_shares(
    page: PageDep,
    form: FormDep,
    study: VisibleStudy,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    def change() -> str:
        shares = persona_service.shares_from_fields(study, form.text, session=session)
        n = persona_service.add_share_personas(
            study, shares, sample=form.opt_int("sample"), session=session
        )
        return _added(n, "attribute shares")

    return _persona_form(page, study, session, settings, change)


@router.post("/studies/{slug}/personas/respondents")
async def persona_respondents(
    page: PageDep,
    form: FormDep,
    study: VisibleStudy,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    def change() -> str:
        n = persona_service.add_respondent_personas(
            study, n=form.opt_int("profiles"), session=session
        )
        return _added(n, "the imported respondents' profiles")

    return _persona_form(page, study, session, settings, change)


@router.post("/studies/{slug}/personas/clear")
async def persona_clear(
    page: PageDep, study: VisibleStudy, session: SessionDep, settings: SettingsDep
) -> Response:
    def change() -> str:
        n = persona_service.clear_personas(study, session=session)
        return f"{n} persona{'s' if n != 1 else ''} removed"

    return _persona_form(page, study, session, settings, change)


@router.post("/studies/{slug}/personas/generate")
async def persona_generate(
    page: PageDep,
    form: FormDep,
    study: VisibleStudy,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
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

    return _persona_form(page, study, session, settings, change)
