"""The FastAPI application factory.

``create_app(settings)`` builds the app; the database engine is created in the lifespan
(never at import) and disposed at shutdown. The schema is not created here: run
``priorly db upgrade`` (``priorly serve`` does it first); ``/healthz`` reports a database
that is not at the migration head, and any page that meets a database that is down or not
migrated answers 503 with ``Retry-After`` (:func:`database_unavailable_page`) and one log
line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import quote

from fastapi import Depends, FastAPI, Request, Security
from fastapi.exception_handlers import (
    http_exception_handler,
    request_validation_exception_handler,
)
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import iter_route_contexts
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app import session as sessions_service
from app.db import check_database, head_revision, make_engine
from app.errors import ConfigurationError, PriorlyError, error_line, validation_message
from app.gcfreeze import freeze_long_lived
from app.limits import BodyLimitMiddleware, path_regex
from app.logs import configure_logging
from app.middleware import (
    ApiCorsMiddleware,
    ApiKeyUseMiddleware,
    HeadAsGetMiddleware,
    HostileInputMiddleware,
    HttpsRequiredMiddleware,
    SecurityHeadersMiddleware,
    install_log_redaction,
)
from app.ratelimit import (
    ApiRateLimitMiddleware,
    RateLimited,
    RedisCounter,
    respondent_page_limit,
)
from app.respondent_text import Words, words
from app.routes import (
    admin,
    admin_respondents,
    api_docs,
    api_results,
    api_v1,
    health,
    pages,
    respondent,
)
from app.session import async_path as answer_async
from app.settings import Settings, get_settings
from app.templating import STATIC_DIR, make_templates
from app.textguard import clip, install_text_guard

RESPONDENT_PATHS = ("/s/", "/g/")
"""The respondents' pages (surveys, group round links): errors are pages, not JSON."""

log = logging.getLogger("priorly")

DATABASE_RETRY_AFTER_S = 30
"""``Retry-After`` of the 503 answered while the database is down or not migrated."""

MISSING_SCHEMA_STATES = ("42P01", "42703")
"""PostgreSQL's "undefined table" and "undefined column": a database not migrated."""


def missing_schema(exc: BaseException) -> bool:
    """Whether ``exc`` says a table or column of the code is missing (the database is not
    migrated): PostgreSQL's SQLSTATE 42P01 / 42703, SQLite's "no such table/column"."""
    orig = getattr(exc, "orig", None) or exc
    if getattr(orig, "sqlstate", None) in MISSING_SCHEMA_STATES:
        return True
    return str(orig).startswith(("no such table", "no such column"))


async def database_unavailable_page(request: Request, exc: Exception) -> Response:
    """The answer to a database that is unreachable, locked, out of connections or not
    migrated (the API's :data:`app.routes.api_v1.DB_UNAVAILABLE` errors, a pool timeout, a
    missing table): 503 with ``Retry-After`` and one warning line naming the cause, e.g.
    ``database unavailable on GET /s/ces: not migrated (at nothing, code expects 0031; run
    'priorly db upgrade')``. The respondent's message page on the survey pages, the API's
    JSON error under ``/api/``, a plain page elsewhere. A missing table while the database
    is at the migration head is a bug: raised again (500 with its traceback)."""
    if missing_schema(exc):
        reason = await run_in_threadpool(
            check_database, request.app.state.engine, request.app.state.schema_head
        )
        if reason == "ok":
            raise exc
    elif isinstance(exc, ProgrammingError):
        raise exc  # a bad statement, not an outage
    elif isinstance(exc, PoolTimeoutError):
        reason = "overloaded (no free pooled connection)"
    else:
        reason = f"unreachable: {error_line(getattr(exc, 'orig', None) or exc)}"
    log.warning("database unavailable on %s %s: %s", request.method, request.url.path, reason)
    headers = {"Retry-After": str(DATABASE_RETRY_AFTER_S)}
    path = request.url.path
    if path.startswith(RESPONDENT_PATHS):
        page = respondent.message_page(  # in English: no study's language can be read
            request,
            request.app.state.templates,
            words("unavailable.title"),
            words("unavailable.text"),
            503,
            language="en",
        )
        page.headers.update(headers)
        return page
    if path.startswith("/api/"):
        body = {"code": "database_unavailable", "message": "the database is unavailable; retry"}
        return JSONResponse(body, status_code=503, headers=headers)
    return HTMLResponse(
        "<!doctype html><meta charset=utf-8><title>Temporarily unavailable</title>"
        "<h1>Temporarily unavailable</h1><p>The service cannot reach its database. "
        "Please try again in a few minutes.</p>",
        status_code=503,
        headers=headers,
    )


def _trusted(value: str) -> list[str] | str:
    """``PRIORLY_TRUSTED_PROXIES`` as uvicorn's proxy middleware takes it."""
    hosts = [h.strip() for h in value.split(",") if h.strip()]
    return "*" if hosts == ["*"] else hosts


API_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
"""The methods :func:`_api_fallback` answers (every one a client may send)."""


async def _api_fallback(path: str, request: Request) -> Response:
    """What no API route answers under ``/api/v1/``, in the API's error format.

    Registered after every API route, for every method, so it is reached only when no route
    takes the request: ``OPTIONS`` gets 204 with ``Allow`` listing the methods the API's
    routes accept on this path (``HEAD`` wherever ``GET`` is); another method on a path that has routes gets 405
    ``method_not_allowed`` with ``Allow``; a path without routes gets 404 ``not_found``.
    Example: ``GET /api/v1/sessions`` (only ``POST`` on ``/studies/{slug}/sessions``) is 404.
    """
    methods: set[str] = set()
    for route in iter_route_contexts(request.app.routes):
        if getattr(route, "endpoint", None) is _api_fallback:
            continue
        path_format = str(getattr(route, "path_format", "") or "")
        if path_format.startswith("/api/v1/") and path_regex(path_format).match(request.url.path):
            methods |= set(getattr(route, "methods", None) or ())
    methods.discard("OPTIONS")
    if "GET" in methods:
        methods.add("HEAD")  # HeadAsGetMiddleware
    where = f"{request.method} {clip(request.url.path)}"
    if not methods:
        return JSONResponse({"code": "not_found", "message": f"no such API path: {where}"}, 404)
    allow = ", ".join(sorted(methods | {"OPTIONS"}))
    if request.method == "OPTIONS":
        return Response(status_code=204, headers={"Allow": allow})
    return JSONResponse(
        {"code": "method_not_allowed", "message": f"{where}: this path allows {allow}"},
        405,
        headers={"Allow": allow},
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the application for ``settings`` (default: :func:`get_settings`).

    Without ``settings`` (``uvicorn app.main:create_app --factory``), unusable settings
    from the environment stop the process with one line and exit status 2, as the
    ``priorly`` commands do, not a traceback; the log lines get their time, level and
    logger (:func:`app.logs.configure_logging`).
    """
    if settings is None:
        try:
            settings = get_settings()
        except ConfigurationError as exc:
            print(f"priorly: error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        configure_logging(settings.log_level)
    sessions_service.configure_step_memo(settings.step_memo_size)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url)
        app.state.engine = engine
        answers_db = None
        if answer_async.enabled_for(engine):
            answers_db = answer_async.AsyncAnswerDatabase(engine)
            await answers_db.open()
        app.state.answers_db = answers_db
        # The API limiter's counters go to Redis when the deployment has one.
        app.state.limiter_redis = RedisCounter(settings.redis_url) if settings.redis_url else None
        # Import the model families before serving. Otherwise the first requests of a cold
        # worker pay this import (seconds) while holding pooled connections, and a burst of
        # clients times out on the pool with 500s (tests/reliability, docs/reliability.md).
        import models  # noqa: F401

        freeze_long_lived()  # everything imported so far lives as long as the process
        try:
            yield
        finally:
            if answers_db is not None:
                await answers_db.close()
            if app.state.limiter_redis is not None:
                await app.state.limiter_redis.close()
            engine.dispose()

    app = FastAPI(title="priorly", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.templates = make_templates()
    app.state.schema_head = head_revision()
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.include_router(health.router)
    app.include_router(pages.router)
    # The survey pages: new respondents and posts limited per client address (429).
    app.include_router(respondent.router, dependencies=[Depends(respondent_page_limit)])
    # the bearer scheme is declared in the OpenAPI document (Swagger UI's "Authorize")
    app.include_router(api_v1.router, dependencies=[Security(api_docs.BEARER)])
    app.include_router(api_results.router)
    app.include_router(api_docs.router)  # /api/docs with Swagger UI served from here
    api_docs.keep_null_examples(app, [api_v1.AnswerIn])  # the skip example keeps its null
    # After every API route: OPTIONS (204, Allow), 405 and 404 in the API's error format.
    app.add_api_route(
        "/api/v1/{path:path}", _api_fallback, methods=API_METHODS, include_in_schema=False
    )
    app.include_router(admin_respondents.router)  # /admin/studies/{slug}/respondents

    def respondent_message(
        request: Request,
        title: Words,
        text: Words | str,
        status: int,
        headers: dict[str, str] | None = None,
    ) -> Response:
        page = respondent.message_page(request, app.state.templates, title, text, status)
        page.headers.update(headers or {})
        return page

    for db_error in (*api_v1.DB_UNAVAILABLE, PoolTimeoutError, ProgrammingError):
        app.add_exception_handler(db_error, database_unavailable_page)

    @app.exception_handler(RateLimited)
    async def _rate_limited(request: Request, exc: RateLimited) -> Response:
        headers = {"Retry-After": str(exc.retry_after)}
        if request.url.path.startswith(RESPONDENT_PATHS):
            said = words(exc.respondent_text) if exc.respondent_text else str(exc)
            return respondent_message(request, words("limit.title"), said, 429, headers)
        return JSONResponse({"detail": str(exc)}, status_code=429, headers=headers)

    @app.exception_handler(PriorlyError)
    async def _priorly_error(request: Request, exc: PriorlyError) -> Response:
        # clipped: a message never echoes a huge input (a 50,000-character slug) in full
        if request.url.path.startswith(RESPONDENT_PATHS):
            return respondent_message(
                request,
                words("page_error.title"),
                words("page_error.text", reason=clip(str(exc))),
                exc.http_status,
            )
        return JSONResponse({"detail": clip(str(exc))}, status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> Response:
        """A path, query or form value of the wrong type: a page for the survey pages, a
        404 for a malformed id in a path; the API router answers its own."""
        if request.url.path.startswith(RESPONDENT_PATHS):
            return respondent_message(
                request,
                words("page_error.title"),
                words("page_error.text", reason=validation_message(exc)),
                404,
            )
        return await request_validation_exception_handler(request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def _no_such_page(request: Request, exc: StarletteHTTPException) -> Response:
        """An address that is no page (a mistyped survey link): a page for the survey
        pages, FastAPI's JSON elsewhere (the API answers its own; the admin wraps this).
        A survey address opened with a method it does not take (a form's address reopened
        after an error page: 405) goes to the survey's start page (303), which resumes this
        browser's session."""
        path = request.url.path
        if exc.status_code == 405 and path.startswith("/s/"):
            slug = quote(path.split("/")[2], safe="")  # the path is decoded: quoted again
            return RedirectResponse(request.url_for("respondent_start", slug=slug), 303)
        if exc.status_code == 404 and path.startswith(RESPONDENT_PATHS):
            return respondent_message(
                request, words("not_found.title"), words("not_found.text"), 404
            )
        return await http_exception_handler(request, exc)

    admin.install(app)  # the admin UI (after the handlers: its error pages wrap them)
    install_log_redaction()  # tokens in resume/invitation/member-link paths stay out of logs
    install_text_guard()  # no NUL / lone surrogate reaches a statement (app/textguard.py)
    # 422 for a NUL character or a lone surrogate in the path, query, form or JSON body.
    app.add_middleware(HostileInputMiddleware, html_page=admin.html_error_page)
    # HEAD anywhere is answered as GET without the body (monitors, link previews).
    app.add_middleware(HeadAsGetMiddleware)
    # When each API key was last used (a conditional write at most once a minute per key).
    app.add_middleware(ApiKeyUseMiddleware)
    # Per-credential limit on /api/v1 calls (429), counters in Redis or the database.
    app.add_middleware(
        ApiRateLimitMiddleware,
        key_limit=settings.api_rate_limit_per_minute,
        session_limit=settings.session_rate_limit_per_minute,
    )
    # Refuse oversized bodies before anything reads them (413; JSON, or a page for a browser).
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        max_upload_bytes=settings.max_upload_bytes,
        html_page=admin.html_error_page,  # a browser's admin form: the admin error page
    )
    if settings.env == "prod":
        # Over plain http (after the proxy headers) the prod cookies cannot work: 400 page.
        app.add_middleware(HttpsRequiredMiddleware)
    # The client address behind PRIORLY_TRUSTED_PROXIES: from X-Forwarded-For.
    app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=_trusted(settings.trusted_proxies))
    # Browser pages of PRIORLY_API_CORS_ORIGINS may call the API (preflight, allow-origin).
    origins = [o.strip() for o in settings.api_cors_origins.split(",") if o.strip()]
    if origins:
        app.add_middleware(ApiCorsMiddleware, origins=origins)
    # Outside everything: CSP, framing, nosniff, referrer (and HSTS in prod) on every answer.
    app.add_middleware(SecurityHeadersMiddleware, hsts=settings.env == "prod")
    return app
