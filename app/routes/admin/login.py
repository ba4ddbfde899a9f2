"""Login, logout and accepting an invitation: the pages a visitor without a login sees.

A successful login or accepted invitation sets the login cookies and redirects (303) to the
studies home page; a wrong password is 401 and too many attempts 429 with ``Retry-After``,
on the login page itself.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app import auth
from app.deps import SessionDep, TemplatesDep, form_str
from app.errors import InvalidInputError
from app.routes.admin.common import (
    FormDep,
    PageDep,
    render,
    see_other,
    user_error_message,
)

router = APIRouter()


@router.get("/login", response_class=HTMLResponse, name="admin_login")
def login_page(request: Request, templates: TemplatesDep) -> Response:
    return render(request, templates, "admin/login.html", {"error": None})


@router.post("/login")
async def login(request: Request, session: SessionDep, templates: TemplatesDep) -> Response:
    form = await request.form()
    try:
        researcher = auth.login_with_limits(
            request, form_str(form, "email"), form_str(form, "password"), session=session
        )
    except auth.LoginLocked as exc:
        locked = render(request, templates, "admin/login.html", {"error": str(exc)}, status=429)
        locked.headers["Retry-After"] = str(exc.retry_after)
        return locked
    except auth.LoginRequired as exc:
        return render(request, templates, "admin/login.html", {"error": str(exc)}, status=401)
    except InvalidInputError as exc:
        return render(request, templates, "admin/login.html", {"error": exc.message}, status=400)
    response = see_other(str(request.url_for("admin_home")))
    auth.set_login_cookies(request, response, researcher)
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    response = see_other(str(request.url_for("admin_login")))
    auth.clear_login_cookies(request, response)
    return response


@router.get("/invite/{token}", response_class=HTMLResponse)
def invitation_page(token: str, page: PageDep, session: SessionDep) -> Response:
    invitation = auth.get_invitation(token, session=session)
    return page.render("admin/invite.html", {"invitation": invitation, "error": None})


@router.post("/invite/{token}")
async def accept_invitation(
    token: str, page: PageDep, form: FormDep, session: SessionDep
) -> Response:
    invitation = auth.get_invitation(token, session=session)
    password = form.text("password")
    try:
        if password != form.text("password2"):
            raise InvalidInputError("the two passwords differ")
        researcher = auth.accept_invitation(token, password, session=session)
    except Exception as exc:
        ctx = {"invitation": invitation, "error": user_error_message(exc)}
        return page.render("admin/invite.html", ctx, status=422)
    response = page.redirect("admin_home")
    auth.set_login_cookies(page.request, response, researcher)
    return response
