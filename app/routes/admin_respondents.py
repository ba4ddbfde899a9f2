"""The researcher's list of a study's live respondents and erasing one (``/admin``).

``GET /admin/studies/{slug}/respondents`` lists the live respondents (answers, status and
repeated starts from one browser); ``GET .../respondents/{id}`` is one respondent's profile
(what they answered, and the predicted answer to every other item); ``POST .../respondents/{id}/erase`` deletes one through
:func:`app.services.respondents.erase_live_respondent` (the erasure record stays) after
the form's confirmation. CSRF is checked for every unsafe request (:func:`app.auth.verify_csrf`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app import auth
from app.deps import DbId, EngineDep, SessionDep, TemplatesDep
from app.routes.admin.common import PageDep
from app.services.respondents import (
    erase_live_respondent,
    live_respondents,
    respondent_profile,
)

router = APIRouter(
    prefix="/admin", dependencies=[Depends(auth.verify_csrf)], include_in_schema=False
)


def _page(request: Request, templates: Any, study: Any, session: Any, **extra: Any) -> Response:
    return templates.TemplateResponse(  # type: ignore[no-any-return]
        request,
        "admin/respondents.html",
        {
            "researcher": getattr(request.state, "researcher", None),
            "csrf_token": auth.csrf_token(request),
            "study": study,
            "section": "respondents",
            "rows": live_respondents(study, session=session),
            **extra,
        },
    )


@router.get("/studies/{slug}/respondents", response_class=HTMLResponse, name="admin_respondents")
def respondents_page(
    request: Request, study: auth.VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    """The study's live respondents, newest first, each with an erase button."""
    erased = request.query_params.get("erased")
    notice = f"Respondent {erased} was erased." if erased and erased.isdigit() else None
    return _page(request, templates, study, session, notice=notice)


@router.get(
    "/studies/{slug}/respondents/{respondent_id}",
    response_class=HTMLResponse,
    name="admin_respondent",
)
def respondent_page(
    respondent_id: DbId, page: PageDep, study: auth.VisibleStudy, session: SessionDep
) -> Response:
    """One respondent's profile: status, answers in order, and the predicted answer (with
    its probability) to every item they did not answer; 404 for an id of no respondent of
    this study."""
    profile = respondent_profile(study, respondent_id, session=session)
    return page.render(
        "admin/respondent.html", {"study": study, "section": "respondents", "p": profile}
    )


@router.post("/studies/{slug}/respondents/{respondent_id}/erase", name="admin_respondent_erase")
def erase(
    respondent_id: DbId,
    request: Request,
    study: auth.VisibleStudy,
    session: SessionDep,
    engine: EngineDep,
) -> Response:
    """Erase one live respondent (404 for an id that is not one of the study's)."""
    session.close()  # one pooled connection per request at a time
    result = erase_live_respondent(study, respondent_id, engine=engine)
    url = str(request.url_for("admin_respondents", slug=study.slug))
    url = f"{url}?erased={result.respondent_id}"
    if request.headers.get("HX-Request") == "true":  # the button's hx-confirm path
        return Response(status_code=200, headers={"HX-Redirect": url})
    return RedirectResponse(url, status_code=303)
