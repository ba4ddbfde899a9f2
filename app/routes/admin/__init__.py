"""The admin UI under ``/admin``: pages (full HTML) and htmx partials.

Routes are thin: parse the form, call one service, render. Authentication and study
access are dependencies (:data:`app.auth.CurrentResearcher`, :data:`app.auth.VisibleStudy`:
404 for a study the researcher may not see); every state-changing request passes
:func:`app.auth.verify_csrf` (a router-level dependency). A user error in a form is shown
inline in the re-rendered form (status 422, with what was typed), never as a bare error
page.

One module per area (``login``, ``studies``, ``design``, ``jobs``, ``personas``, ``dashboard``,
``groups``, ``exports``, ``keys``, ``accounts``), each with its own ``router``;
:data:`router` joins them under ``/admin``. :func:`install` adds the router, the
CSRF-cookie middleware and the error handlers that turn a missing login into a redirect to
the login page.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import auth
from app.errors import PriorlyError, validation_message
from app.limits import form_read_error
from app.routes import group_links
from app.routes.admin import (
    accounts,
    dashboard,
    design,
    exports,
    groups,
    jobs,
    keys,
    login,
    personas,
    sharing,
    studies,
)
from app.textguard import clip

# HTML pages and forms, not an API: kept out of the OpenAPI schema (/api/docs documents
# the JSON API; the fuzz test checks every operation the schema lists).
router = APIRouter(dependencies=[Depends(auth.verify_csrf)], include_in_schema=False)
for _area in (
    login, studies, sharing, design, jobs, personas, dashboard, groups, exports, keys, accounts,
):  # fmt: skip
    router.include_router(_area.router, prefix="/admin")


def install(app: FastAPI) -> None:
    """Add the admin router, the group round links (``/g/{token}``), the CSRF-cookie
    middleware and the admin error handlers."""
    app.include_router(router)
    app.include_router(group_links.router)
    app.add_middleware(auth.CsrfCookieMiddleware)

    async def login_required(request: Request, exc: Exception) -> Response:
        login_url = str(request.url_for("admin_login"))
        if request.headers.get("hx-request"):
            return Response(status_code=401, headers={"HX-Redirect": login_url})
        if request.method == "GET":
            return RedirectResponse(login_url, status_code=303)
        return HTMLResponse("please log in", status_code=401)

    def admin_error(request: Request, exc: Exception) -> Response | None:
        assert isinstance(exc, PriorlyError)
        return error_page(request, str(exc), exc.http_status)

    def admin_invalid(request: Request, exc: Exception) -> Response | None:
        """A malformed value in an admin path or query (``/jobs/abc``): the admin error
        page (422) naming the parameter."""
        return error_page(request, clip(validation_message(exc)), 422)  # type: ignore[arg-type]

    def admin_http(request: Request, exc: Exception) -> Response | None:
        """``GET`` of an address only a form posts to (a reload after a refused form, e.g.
        ``/admin/studies/x/settings``): 303 to the page it belongs to; an address that is
        no admin page: the admin error page (404)."""
        assert isinstance(exc, StarletteHTTPException)
        path = request.url.path.rstrip("/")
        if exc.status_code == 405 and request.method == "GET":
            return RedirectResponse(path.rsplit("/", 1)[0] or "/admin", status_code=303)
        if exc.status_code == 404:
            return error_page(request, "there is no admin page at this address", 404)
        if exc.status_code == 400 and wants_html(request.headers.get("accept", "")):
            # the only 400 under /admin: Starlette refusing a form (a text field over
            # FORM_FIELD_MAX_BYTES, too many fields, a broken multipart body)
            return error_page(request, form_read_error(str(exc.detail)), 400)
        return None

    app.add_exception_handler(auth.LoginRequired, login_required)
    for exc_type, answer in (
        (PriorlyError, admin_error),
        (RequestValidationError, admin_invalid),
        (StarletteHTTPException, admin_http),
    ):
        app.add_exception_handler(
            exc_type, _on_admin_paths(answer, app.exception_handlers[exc_type])
        )


def error_page(request: Request, message: str, status: int) -> Response:
    """The admin error page (``admin/error.html``) with ``message`` and ``status``."""
    return request.app.state.templates.TemplateResponse(  # type: ignore[no-any-return]
        request,
        "admin/error.html",
        {"message": message, "status": status, "researcher": None, "csrf_token": ""},
        status_code=status,
    )


def wants_html(accept: str) -> bool:
    """Whether a request with this ``Accept`` header takes an HTML page: a browser's (it
    names ``text/html`` for a page and a form), not a script's (``*/*``, none, JSON)."""
    return "text/html" in accept.lower()


def html_error_page(scope: MutableMapping[str, Any], status: int, message: str) -> Response | None:
    """The admin error page for a request refused before any route ran (an oversized body:
    :class:`app.limits.BodyLimitMiddleware`), when it is a browser's request to an admin
    page; ``None`` (JSON) otherwise."""
    if scope.get("type") != "http" or not str(scope.get("path", "")).startswith("/admin"):
        return None
    request = Request(scope)
    if not wants_html(request.headers.get("accept", "")):
        return None
    return error_page(request, message, status)


def _on_admin_paths(
    answer: Callable[[Request, Exception], Response | None], previous: Callable[..., Any]
) -> Callable[[Request, Exception], Awaitable[Response]]:
    """An exception handler: ``answer`` under ``/admin/`` (unless it gives ``None``),
    else the handler installed before (``app.main``'s, or FastAPI's own)."""

    async def handler(request: Request, exc: Exception) -> Response:
        if request.url.path.startswith("/admin"):
            got = answer(request, exc)
            if got is not None:
                return got
        result = previous(request, exc)
        return await result if inspect.isawaitable(result) else result  # type: ignore[no-any-return]

    return handler
