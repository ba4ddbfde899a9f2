"""Downloads of a study's answers, codebook and predictions (:data:`EXPORTS`)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from app.auth import VisibleStudy
from app.deps import EngineDep
from app.routes.admin.common import PageDep
from app.services.downloads import EXPORTS, open_export

router = APIRouter()


@router.get("/studies/{slug}/export", response_class=HTMLResponse, name="admin_exports")
def exports_page(page: PageDep, study: VisibleStudy) -> Response:
    return page.render("admin/exports.html", {"study": study, "exports": EXPORTS})


@router.get("/studies/{slug}/export/{name}", name="admin_export")
def export_file(
    name: str,
    study: VisibleStudy,
    engine: EngineDep,
    imported: bool = False,
    predictions: bool = False,
) -> Response:
    """Send one export as an attachment; ``?imported=1`` adds the imported respondents to
    the answer exports, ``?predictions=1`` each respondent's predicted answers to the CSV
    answers."""
    download = open_export(
        study, name, engine=engine, include_imported=imported, predictions=predictions
    )
    headers = {"Content-Disposition": f'attachment; filename="{download.filename}"'}
    if download.path is not None:
        return FileResponse(
            download.path,
            media_type=download.media_type,
            headers=headers,
            background=BackgroundTask(download.path.unlink, missing_ok=True),
        )
    assert download.chunks is not None
    return StreamingResponse(download.chunks, media_type=download.media_type, headers=headers)
