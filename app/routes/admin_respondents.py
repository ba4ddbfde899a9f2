"""The researcher's list of a study's live respondents and erasing one (``/admin``).

``GET /admin/studies/{slug}/respondents`` lists the live respondents (answers, status and
repeated starts from one browser); ``POST .../respondents/{id}/erase`` deletes one through
:func:`app.services.respondents.erase_live_respondent` (the erasure record stays) after
the form's confirmation. CSRF is checked for every unsafe request (:func:`app.auth.verify_csrf`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app import auth
from app.deps import EngineDep, SessionDep, TemplatesDep
from app.services.respondents import erase_live_respondent, live_respondents

router = APIRouter(
    prefix="/admin", dependencies=[Depends(auth.verify_csrf)], include_in_schema=False
)


def _page(request: Request, templates: Any, study: Any, session: Any, **extra: Any) -> Response:
    return templates.TemplateResponse(  # type: ignore[no-any-return]
        request,
        "pages/admin_respondents.html",
        {
            "researcher": getattr(request.state, "researcher", None),
            "csrf_token": auth.csrf_token(request),
            "study": study,
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


@router.post("/studies/{slug}/respondents/{respondent_id}/erase", name="admin_respondent_erase")
def erase(
    respondent_id: int,
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
