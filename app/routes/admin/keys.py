"""The logged-in researcher's API keys: list, create (the new key is shown once), revoke."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response
from sqlmodel import Session

from app.auth import CurrentResearcher
from app.deps import DbId, SessionDep
from app.routes.admin.common import FormDep, PageDep, user_error_message
from app.services import accounts, apikeys
from app.tables import Researcher

router = APIRouter()


def _keys_page(
    page: PageDep,
    researcher: Researcher,
    session: Session,
    *,
    new_key: str | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response:
    keys = apikeys.list_api_keys(researcher.email, session=session)
    ctx = {"keys": keys, "new_key": new_key, "error": error}
    return page.render("admin/keys.html", ctx, status=status)


@router.get("/keys", response_class=HTMLResponse, name="admin_keys")
def keys_page(page: PageDep, researcher: CurrentResearcher, session: SessionDep) -> Response:
    return _keys_page(page, researcher, session)


@router.post("/keys")
async def create_key(
    page: PageDep, form: FormDep, researcher: CurrentResearcher, session: SessionDep
) -> Response:
    try:
        new = apikeys.create_api_key(researcher.email, session=session, name=form.text("name"))
    except Exception as exc:
        error = user_error_message(exc)
        return _keys_page(page, researcher, session, error=error, status=422)
    return _keys_page(page, researcher, session, new_key=new.key)


@router.post("/keys/{key_id}/revoke")
def revoke_key(
    key_id: DbId, page: PageDep, researcher: CurrentResearcher, session: SessionDep
) -> Response:
    accounts.revoke_own_api_key(researcher, key_id, session=session)
    return _keys_page(page, researcher, session)
