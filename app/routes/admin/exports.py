"""Downloads of a study's answers, codebook and predictions."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from app.auth import VisibleStudy
from app.deps import EngineDep, TemplatesDep
from app.errors import NotFoundError
from app.routes.admin.common import render
from app.services import export

router = APIRouter()


EXPORTS = {
    "answers_wide.csv": "text/csv; charset=utf-8",
    "answers_long.csv": "text/csv; charset=utf-8",
    "answers.sav": "application/x-spss-sav",
    "answers.dta": "application/x-stata-dta",
    "codebook.jsonl": "application/jsonl; charset=utf-8",
    "predictions.csv": "text/csv; charset=utf-8",
}


@router.get("/studies/{slug}/export", response_class=HTMLResponse, name="admin_exports")
def exports_page(request: Request, study: VisibleStudy, templates: TemplatesDep) -> Response:
    return render(request, templates, "admin/exports.html", {"study": study, "exports": EXPORTS})


@router.get("/studies/{slug}/export/{name}", name="admin_export")
def export_file(
    name: str,
    study: VisibleStudy,
    engine: EngineDep,
    imported: bool = False,
) -> Response:
    """Stream one export; ``?imported=1`` adds the imported respondents to answer exports."""
    from sqlmodel import Session

    if name not in EXPORTS:
        raise NotFoundError(f"no export {name!r}")
    filename = f"{study.slug}-{name}"
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    if name.endswith((".sav", ".dta")):
        tmp = tempfile.NamedTemporaryFile(prefix="priorly-", suffix=name[-4:], delete=False)
        tmp.close()
        path = Path(tmp.name)
        with Session(engine) as db:
            writer = export.write_sav if name.endswith(".sav") else export.write_dta
            writer(study, path, session=db, include_imported=imported)
        return FileResponse(
            path,
            media_type=EXPORTS[name],
            headers=headers,
            background=BackgroundTask(path.unlink, missing_ok=True),
        )
    if name == "predictions.csv":
        # Fail before streaming (a half-sent CSV would look complete).
        with Session(engine) as db:
            from app.services import sessions as svc

            svc.load_runtime(study, session=db, fit_if_missing=False)

    def stream() -> Any:
        with Session(engine) as db:
            if name == "answers_wide.csv":
                yield from export.csv_wide(study, session=db, include_imported=imported)
            elif name == "answers_long.csv":
                yield from export.csv_long(study, session=db)
            elif name == "codebook.jsonl":
                yield from export.codebook_jsonl(study, session=db)
            else:
                yield from export.csv_predictions(study, session=db)

    return StreamingResponse(
        (chunk.encode("utf-8") for chunk in stream()), media_type=EXPORTS[name], headers=headers
    )
