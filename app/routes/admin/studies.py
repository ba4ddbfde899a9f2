"""The studies home page, creating a study, and importing one (a shipped dataset or an upload)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app import auth
from app.auth import CurrentResearcher
from app.deps import SessionDep, SettingsDep, TemplatesDep
from app.errors import InvalidInputError
from app.routes.admin.common import FORM_ERRORS, form_str, render, see_other
from app.services import designer
from app.services.studies import list_study_summaries
from app.tables import Researcher

router = APIRouter()


def _home_context(researcher: Researcher, session: Any, settings: Any) -> dict[str, Any]:
    visible = auth.visible_study_ids(researcher, session=session)
    studies = [
        s for s in list_study_summaries(session=session) if visible is None or s.id in visible
    ]
    return {
        "studies": studies,
        "datasets": designer.shipped_datasets(Path(settings.demo_dataset).parent),
    }


@router.get("", response_class=HTMLResponse, name="admin_home")
def home(
    request: Request,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
    templates: TemplatesDep,
) -> Response:
    ctx = _home_context(researcher, session, settings)
    return render(request, templates, "admin/home.html", {**ctx, "error": None})


@router.post("/studies")
async def create_study(
    request: Request,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
    templates: TemplatesDep,
) -> Response:
    form = await request.form()
    try:
        study = designer.create_study(form_str(form, "name"), owner=researcher, session=session)
    except FORM_ERRORS as exc:
        ctx = _home_context(researcher, session, settings)
        return render(request, templates, "admin/home.html", {**ctx, "error": str(exc)}, status=422)
    return see_other(str(request.url_for("admin_study", slug=study.slug)))


def _import_page(
    request: Request,
    templates: Any,
    settings: Any,
    *,
    error: str | None = None,
    preview: Any = None,
    fields: dict[str, str] | None = None,
) -> Response:
    """The import page (shipped datasets, upload form), with an inline error (422) or a
    preview of an upload."""
    ctx: dict[str, Any] = {
        "datasets": designer.shipped_datasets(Path(settings.demo_dataset).parent),
        "error": error,
        "preview": preview,
    }
    if fields is not None:
        ctx["fields"] = fields
    return render(
        request, templates, "admin/import.html", ctx, status=422 if error is not None else 200
    )


@router.get("/import", response_class=HTMLResponse, name="admin_import")
def import_page(
    request: Request,
    researcher: CurrentResearcher,
    settings: SettingsDep,
    templates: TemplatesDep,
) -> Response:
    return _import_page(request, templates, settings)


@router.post("/import/shipped")
async def import_shipped(
    request: Request,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
    templates: TemplatesDep,
) -> Response:
    form = await request.form()
    try:
        result = designer.import_shipped(
            form_str(form, "dataset"),
            datasets_dir=Path(settings.demo_dataset).parent,
            owner=researcher,
            session=session,
            study_name=form_str(form, "name"),
        )
    except FORM_ERRORS as exc:
        return _import_page(request, templates, settings, error=str(exc))
    return see_other(str(request.url_for("admin_study", slug=result.slug)))


UPLOAD_FIELDS = ("responses.csv", "codebook.jsonl", "dataset.json", "user_split.json", "runs.csv")


@router.post("/import/upload")
async def import_upload(
    request: Request,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
    templates: TemplatesDep,
) -> Response:
    """``action=preview`` validates and shows the preview; ``action=import`` imports."""
    form = await request.form()
    files: dict[str, bytes] = {}
    for name in UPLOAD_FIELDS:
        upload = form.get(name)
        if upload is not None and not isinstance(upload, str):
            if upload.size is not None and upload.size > designer.MAX_UPLOAD_BYTES:
                raise InvalidInputError(f"{name} is larger than the upload limit")
            files[name] = await upload.read()
    fields = {k: form_str(form, k) for k in ("name", "id_column", "attributes")}
    try:
        if form_str(form, "action") == "import":
            result = designer.import_upload(files, fields, owner=researcher, session=session)
            return see_other(str(request.url_for("admin_study", slug=result.slug)))
        preview = designer.preview_upload(files, fields)
    except FORM_ERRORS as exc:
        return _import_page(request, templates, settings, error=str(exc), fields=fields)
    return _import_page(request, templates, settings, preview=preview, fields=fields)
