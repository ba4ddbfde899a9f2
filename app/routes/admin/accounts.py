"""Accounts (admins only): list, create, invite."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlmodel import col, select

from app import auth
from app.auth import AdminUser
from app.deps import SessionDep, TemplatesDep
from app.routes.admin.common import FORM_ERRORS, form_str, render
from app.tables import Researcher

router = APIRouter()


def _accounts_page(
    request: Request,
    templates: Any,
    session: Any,
    *,
    error: str | None = None,
    notice: str | None = None,
    invite_url: str | None = None,
    status: int = 200,
) -> Response:
    people = session.exec(select(Researcher).order_by(col(Researcher.email))).all()
    return render(
        request,
        templates,
        "admin/accounts.html",
        {"people": people, "error": error, "notice": notice, "invite_url": invite_url},
        status=status,
    )


@router.get("/accounts", response_class=HTMLResponse, name="admin_accounts")
def accounts_page(
    request: Request, admin: AdminUser, session: SessionDep, templates: TemplatesDep
) -> Response:
    return _accounts_page(request, templates, session)


@router.post("/accounts")
async def create_account(
    request: Request, admin: AdminUser, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()
    try:
        person = auth.create_account(
            form_str(form, "email"),
            form_str(form, "password"),
            session=session,
            is_admin=form_str(form, "role") == "admin",
        )
    except FORM_ERRORS as exc:
        return _accounts_page(request, templates, session, error=str(exc), status=422)
    return _accounts_page(request, templates, session, notice=f"account {person.email} created")


@router.post("/invitations")
async def invite(
    request: Request, admin: AdminUser, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()
    try:
        token = auth.create_invitation(
            form_str(form, "email"),
            inviter=admin,
            session=session,
            is_admin=form_str(form, "role") == "admin",
        )
    except FORM_ERRORS as exc:
        return _accounts_page(request, templates, session, error=str(exc), status=422)
    url = str(request.url_for("invitation_page", token=token))
    return _accounts_page(request, templates, session, invite_url=url)
