"""The logged-in researcher's API keys: list, create, revoke."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.auth import CurrentResearcher
from app.deps import SessionDep, TemplatesDep
from app.errors import NotFoundError
from app.routes.admin.common import FORM_ERRORS, form_str, render
from app.services import apikeys
from app.tables import ApiKey, Researcher

router = APIRouter()


def _keys_page(
    request: Request,
    templates: Any,
    researcher: Researcher,
    session: Any,
    *,
    new_key: str | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response:
    keys = apikeys.list_api_keys(researcher.email, session=session)
    return render(
        request,
        templates,
        "admin/keys.html",
        {"keys": keys, "new_key": new_key, "error": error},
        status=status,
    )


@router.get("/keys", response_class=HTMLResponse, name="admin_keys")
def keys_page(
    request: Request, researcher: CurrentResearcher, session: SessionDep, templates: TemplatesDep
) -> Response:
    return _keys_page(request, templates, researcher, session)


@router.post("/keys")
async def create_key(
    request: Request, researcher: CurrentResearcher, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()
    try:
        new = apikeys.create_api_key(researcher.email, session=session, name=form_str(form, "name"))
    except FORM_ERRORS as exc:
        return _keys_page(request, templates, researcher, session, error=str(exc), status=422)
    return _keys_page(request, templates, researcher, session, new_key=new.key)


@router.post("/keys/{key_id}/revoke")
def revoke_key(
    key_id: int,
    request: Request,
    researcher: CurrentResearcher,
    session: SessionDep,
    templates: TemplatesDep,
) -> Response:
    row = session.get(ApiKey, key_id)
    if row is None or row.researcher_id != researcher.id:
        raise NotFoundError(f"no API key {key_id} among your keys")
    apikeys.revoke_api_key(row.prefix, session=session)
    return _keys_page(request, templates, researcher, session)
