"""Getting a study out from the studies list: the survey's QR code (SVG) and "preview as
respondent" (:mod:`app.services.survey_links`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from app.auth import VisibleStudy
from app.deps import EngineDep
from app.services.survey_links import qr_svg, start_preview

router = APIRouter()


@router.get("/studies/{slug}/qr.svg", name="admin_survey_qr")
def survey_qr(request: Request, study: VisibleStudy) -> Response:
    """The QR code of the study's survey address on this server (an SVG image)."""
    url = str(request.url_for("respondent_start", slug=study.slug))
    return Response(
        qr_svg(url),
        media_type="image/svg+xml",
        headers={"Content-Disposition": f'inline; filename="{study.slug}-qr.svg"'},
    )


@router.post("/studies/{slug}/preview", name="admin_preview")
def preview(request: Request, study: VisibleStudy, engine: EngineDep) -> Response:
    """Start a preview session (not counted) and open it in the survey pages through the
    session's resume link, which sets this browser's respondent cookie."""
    started = start_preview(study, engine=engine)
    url = request.url_for("respondent_resume", slug=study.slug, token=started.token)
    return RedirectResponse(str(url), status_code=303)
