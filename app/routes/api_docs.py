"""The API's documentation pages, served without any other site: ``/api/docs`` (Swagger UI
over ``/openapi.json``) and ``/api/docs/first-session`` (a first session with curl).

Swagger UI's script and stylesheet come from the ``fastapi-offline`` package, which ships
the current Swagger UI distribution as package data; they are served under
``/api/docs/assets/``. The page's own start-up code is ``static/js/api-docs.js`` (no inline
script), so the page runs under the same Content-Security-Policy as every other page.

:data:`BEARER` declares the API's credential in the OpenAPI document (security scheme
``bearer``): Swagger UI's "Authorize" button then sends ``Authorization: Bearer <value>``
on every call. The routes themselves check the credential (:mod:`app.routes.api_v1`).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.security import HTTPBearer
from pydantic import BaseModel

from app.deps import TemplatesDep
from app.errors import NotFoundError
from app.templating import TEMPLATES_DIR

BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    bearerFormat="pk_... (API key) or the session token",
    description="A researcher's API key (`priorly apikey create --email ...`) for study "
    "calls, or a session's token (returned once when the session is created) for that "
    "session's calls.",
)
"""The ``Authorization: Bearer`` scheme of ``/api/v1`` (``auto_error=False``: it only
declares the scheme; a missing or wrong credential is answered by the routes, as JSON)."""

SWAGGER_PACKAGE = "fastapi-offline"
SWAGGER_ASSETS = resources.files("fastapi_offline") / "static"
ASSET_TYPES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}
"""The asset files served from :data:`SWAGGER_ASSETS`, with their media types."""

ASSET_MAX_AGE_S = 86_400

FIRST_SESSION_SCRIPT = TEMPLATES_DIR / "api" / "first_session.sh"
"""The walkthrough's commands, shown by the first-session page and copied in docs/api.md
(a test runs them, as shown, against a real server)."""
DEFAULT_BASE = "http://127.0.0.1:8000"

PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; "
    "object-src 'none'"
)
"""The documentation pages' policy: everything from this server (Swagger UI sets inline
styles and uses ``data:`` images), no inline script."""

router = APIRouter(include_in_schema=False)


def _assets_version() -> str:
    return metadata.version(SWAGGER_PACKAGE)


def first_session_script(base: str = DEFAULT_BASE) -> str:
    """The walkthrough's shell commands for a server at ``base``."""
    text = FIRST_SESSION_SCRIPT.read_text(encoding="utf-8")
    return text.replace(f"BASE={DEFAULT_BASE}", f"BASE={base}", 1)


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _page(
    templates: TemplatesDep, request: Request, name: str, context: dict[str, Any]
) -> Response:
    response = templates.TemplateResponse(request, name, context)
    response.headers["Content-Security-Policy"] = PAGE_CSP
    return response


@router.get("/api/docs", response_class=HTMLResponse, name="api_docs")
def api_docs(request: Request, templates: TemplatesDep) -> Response:
    """Swagger UI over the app's OpenAPI document, with every asset from this server."""
    root = request.scope.get("root_path", "")
    return _page(
        templates,
        request,
        "api/docs.html",
        {
            "openapi_url": f"{root}{request.app.openapi_url}",
            "version": _assets_version(),
            "title": f"{request.app.title} API",
        },
    )


@router.get("/api/docs/assets/{name}", name="api_docs_asset")
def api_docs_asset(name: str) -> Response:
    """One of Swagger UI's files (cached by browsers for a day)."""
    media_type = ASSET_TYPES.get(name)
    if media_type is None:
        raise NotFoundError(f"no documentation asset {name[:80]!r}")
    path = Path(str(SWAGGER_ASSETS / name))
    return FileResponse(
        path,
        media_type=media_type,
        headers={"Cache-Control": f"public, max-age={ASSET_MAX_AGE_S}"},
    )


@router.get("/api/docs/first-session", response_class=HTMLResponse, name="api_first_session")
def api_first_session(request: Request, templates: TemplatesDep) -> Response:
    """A first session with curl against this server: key, session, question, answer,
    predictions, profile and the results."""
    return _page(
        templates,
        request,
        "api/first_session.html",
        {"script": first_session_script(_base_url(request))},
    )


def keep_null_examples(app: FastAPI, models: Sequence[type[BaseModel]]) -> None:
    """Serve the ``examples`` of ``models`` in the OpenAPI document as the models declare
    them.

    FastAPI drops every ``null`` from the document it builds, so an example such as
    ``{"item": "330a", "option": null, ...}`` (a skip) would be served without its
    ``option`` and fail when pasted. This wraps ``app.openapi`` to put each model's own
    examples back into its component schema (``components.schemas.<Model>.examples``).
    """
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            components = schema.get("components", {}).get("schemas", {})
            for model in models:
                extra = model.model_config.get("json_schema_extra")
                if model.__name__ in components and isinstance(extra, dict):
                    components[model.__name__]["examples"] = extra["examples"]
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]
