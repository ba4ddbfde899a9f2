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

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import auth
from app.errors import PriorlyError, validation_message
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
    templates = app.state.templates

    async def login_required(request: Request, exc: Exception) -> Response:
        login_url = str(request.url_for("admin_login"))
        if request.headers.get("hx-request"):
            return Response(status_code=401, headers={"HX-Redirect": login_url})
        if request.method == "GET":
            return RedirectResponse(login_url, status_code=303)
        return HTMLResponse("please log in", status_code=401)

    previous = app.exception_handlers.get(PriorlyError)

    async def admin_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, PriorlyError)
        if not request.url.path.startswith("/admin"):
            if previous is not None:
                result = previous(request, exc)
                return await result if inspect.isawaitable(result) else result
            return JSONResponse({"detail": str(exc)}, status_code=exc.http_status)
        return templates.TemplateResponse(  # type: ignore[no-any-return]
            request,
            "admin/error.html",
            {"message": str(exc), "status": exc.http_status, "researcher": None, "csrf_token": ""},
            status_code=exc.http_status,
        )

    previous_invalid = app.exception_handlers.get(RequestValidationError)

    async def admin_invalid(request: Request, exc: Exception) -> Response:
        """A malformed value in an admin path or query (``/jobs/abc``): the admin error
        page (422) naming the parameter."""
        assert isinstance(exc, RequestValidationError)
        if not request.url.path.startswith("/admin"):
            assert previous_invalid is not None  # app.main installs one before this
            result = previous_invalid(request, exc)
            return await result if inspect.isawaitable(result) else result
        return templates.TemplateResponse(  # type: ignore[no-any-return]
            request,
            "admin/error.html",
            {
                "message": clip(validation_message(exc)),
                "status": 422,
                "researcher": None,
                "csrf_token": "",
            },  # fmt: skip
            status_code=422,
        )

    previous_http = app.exception_handlers.get(StarletteHTTPException)

    async def admin_http(request: Request, exc: Exception) -> Response:
        """``GET`` of an address only a form posts to (a reload after a refused form, e.g.
        ``/admin/studies/x/settings``): 303 to the page it belongs to."""
        assert isinstance(exc, StarletteHTTPException)
        path = request.url.path.rstrip("/")
        if exc.status_code == 405 and request.method == "GET" and path.startswith("/admin/"):
            return RedirectResponse(path.rsplit("/", 1)[0] or "/admin", status_code=303)
        assert previous_http is not None  # FastAPI installs one
        result = previous_http(request, exc)
        return await result if inspect.isawaitable(result) else result

    app.add_exception_handler(StarletteHTTPException, admin_http)
    app.add_exception_handler(auth.LoginRequired, login_required)
    app.add_exception_handler(PriorlyError, admin_error)
    app.add_exception_handler(RequestValidationError, admin_invalid)
