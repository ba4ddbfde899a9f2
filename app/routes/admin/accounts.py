"""Accounts (admins only): the list of researchers, creating an account, inviting someone
(the invitation link is shown once)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response
from sqlmodel import Session

from app import auth
from app.auth import AdminUser
from app.deps import SessionDep
from app.routes.admin.common import FormDep, PageDep, user_error_message
from app.services.accounts import list_accounts

router = APIRouter()


def _accounts_page(
    page: PageDep,
    session: Session,
    *,
    error: str | None = None,
    notice: str | None = None,
    invite_url: str | None = None,
    status: int = 200,
) -> Response:
    ctx = {
        "people": list_accounts(session=session),
        "error": error,
        "notice": notice,
        "invite_url": invite_url,
    }
    return page.render("admin/accounts.html", ctx, status=status)


@router.get("/accounts", response_class=HTMLResponse, name="admin_accounts")
def accounts_page(page: PageDep, admin: AdminUser, session: SessionDep) -> Response:
    return _accounts_page(page, session)


@router.post("/accounts")
async def create_account(
    page: PageDep, form: FormDep, admin: AdminUser, session: SessionDep
) -> Response:
    try:
        person = auth.create_account(
            form.text("email"),
            form.text("password"),
            session=session,
            is_admin=form.text("role") == "admin",
        )
    except Exception as exc:
        return _accounts_page(page, session, error=user_error_message(exc), status=422)
    return _accounts_page(page, session, notice=f"account {person.email} created")


@router.post("/invitations")
async def invite(page: PageDep, form: FormDep, admin: AdminUser, session: SessionDep) -> Response:
    try:
        token = auth.create_invitation(
            form.text("email"),
            inviter=admin,
            session=session,
            is_admin=form.text("role") == "admin",
        )
    except Exception as exc:
        return _accounts_page(page, session, error=user_error_message(exc), status=422)
    return _accounts_page(page, session, invite_url=page.url("invitation_page", token=token))
