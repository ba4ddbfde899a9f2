"""The studies home page, creating a study, and importing one (a shipped dataset or an
upload, with a preview of the upload before anything is written)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from app.auth import CurrentResearcher
from app.deps import SessionDep, SettingsDep
from app.routes.admin.common import FormDep, PageDep, user_error_message
from app.services import designer
from app.services.importer import ImportResult
from app.services.studies import visible_study_summaries
from app.settings import Settings

router = APIRouter()


def _datasets(settings: Settings) -> list[str]:
    """The datasets shipped with the server (next to the demo dataset)."""
    return designer.shipped_datasets(Path(settings.demo_dataset).parent)


@router.get("", response_class=HTMLResponse, name="admin_home")
def home(
    page: PageDep, researcher: CurrentResearcher, session: SessionDep, settings: SettingsDep
) -> Response:
    studies = visible_study_summaries(researcher, session=session)
    ctx = {"studies": studies, "datasets": _datasets(settings), "error": None}
    ctx["name_max_len"] = designer.NAME_MAX_LEN
    return page.render("admin/home.html", ctx)


@router.post("/studies")
async def create_study(
    page: PageDep,
    form: FormDep,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    try:
        study = designer.create_study(form.text("name"), owner=researcher, session=session)
    except Exception as exc:
        error = user_error_message(exc)
        studies = visible_study_summaries(researcher, session=session)
        ctx = {"studies": studies, "datasets": _datasets(settings), "error": error}
        ctx["name_max_len"] = designer.NAME_MAX_LEN
        return page.render("admin/home.html", ctx, status=422)
    return page.redirect("admin_study", slug=study.slug)


def _import_page(
    page: PageDep,
    settings: Settings,
    *,
    error: str | None = None,
    preview: Any = None,
    fields: dict[str, str] | None = None,
) -> Response:
    """The import page (shipped datasets, upload form), with an inline error (422) or a
    preview of an upload."""
    ctx: dict[str, Any] = {"datasets": _datasets(settings), "error": error, "preview": preview}
    ctx["name_max_len"] = designer.NAME_MAX_LEN
    if fields is not None:
        ctx["fields"] = fields
    return page.render("admin/import.html", ctx, status=422 if error is not None else 200)


@router.get("/import", response_class=HTMLResponse, name="admin_import")
def import_page(page: PageDep, researcher: CurrentResearcher, settings: SettingsDep) -> Response:
    return _import_page(page, settings)


@router.post("/import/shipped")
async def import_shipped(
    page: PageDep,
    form: FormDep,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    try:
        result = designer.import_shipped(
            form.text("dataset"),
            datasets_dir=Path(settings.demo_dataset).parent,
            owner=researcher,
            session=session,
            study_name=form.text("name"),
        )
    except Exception as exc:
        return _import_page(page, settings, error=user_error_message(exc))
    return _imported(page, result)


def _imported(page: PageDep, result: ImportResult) -> Response:
    """To the new study's page, with what the import says (renamed ids), if anything."""
    notice = result.notice()
    return page.redirect(
        "admin_study", slug=result.slug, query={"notice": notice} if notice else None
    )


UPLOAD_FIELDS = ("responses.csv", "codebook.jsonl", "dataset.json", "user_split.json", "runs.csv")
"""The file fields of the upload form."""


@router.post("/import/upload")
async def import_upload(
    page: PageDep,
    form: FormDep,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    """``action=preview`` validates the files, keeps them and shows the preview (with a
    button that imports the kept upload: ``action=import`` with ``upload_token``);
    ``action=import`` with files imports them at once. The files come from the field
    ``files`` (several chosen together, known by their names) and from the one-file fields
    of :data:`UPLOAD_FIELDS`."""
    fields = {k: form.text(k) for k in ("name", "id_column", "attributes")}
    token = form.text("upload_token")
    try:
        if form.text("action") == "import" and token:
            result = designer.import_stored_upload(
                token, owner=researcher, session=session, study_name=form.text("name")
            )
            return _imported(page, result)
        limit = designer.MAX_UPLOAD_BYTES
        files = {  # the files chosen together, then any chosen one by one (these win)
            **await form.named_files("files", UPLOAD_FIELDS, max_bytes=limit),
            **await form.files(UPLOAD_FIELDS, max_bytes=limit),
        }
        if form.text("action") == "import":
            result = designer.import_upload(files, fields, owner=researcher, session=session)
            return _imported(page, result)
        preview = designer.preview_upload(files, fields, owner=researcher)
    except Exception as exc:
        return _import_page(page, settings, error=user_error_message(exc), fields=fields)
    return _import_page(page, settings, preview=preview, fields=fields)
