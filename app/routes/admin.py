"""The admin UI under ``/admin``: pages (full HTML) and htmx partials.

Routes are thin: parse the form, call one service, render. Authentication and study
access are dependencies (:data:`app.auth.CurrentResearcher`, :data:`app.auth.VisibleStudy`:
404 for a study the researcher may not see); every state-changing request passes
:func:`app.auth.verify_csrf` (a router-level dependency). A user error in a form is shown
inline in the re-rendered form (status 422), never as a bare error page.

:func:`install` adds the router, the CSRF-cookie middleware and the error handlers that
turn a missing login into a redirect to the login page.
"""

from __future__ import annotations

import inspect
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from sqlalchemy import func
from sqlmodel import col, select
from starlette.background import BackgroundTask

from app import auth
from app.auth import AdminUser, CurrentResearcher, VisibleStudy
from app.deps import EngineDep, SessionDep, SettingsDep, TemplatesDep
from app.errors import InvalidInputError, NotFoundError, PriorlyError
from app.jobs.registry import LABELS, kind_names
from app.schemas import StudySettings
from app.services import apikeys, designer, export, jobs
from app.services.studies import list_study_summaries
from app.tables import ApiKey, Job, JobStatus, Researcher, StudyPersona, StudyShare
from elicitation.datasets import DatasetError

# HTML pages and forms, not an API: kept out of the OpenAPI schema (/api/docs documents
# the JSON API; the fuzz test checks every operation the schema lists).
router = APIRouter(
    prefix="/admin", dependencies=[Depends(auth.verify_csrf)], include_in_schema=False
)

FORM_ERRORS = (PriorlyError, DatasetError)


def _render(
    request: Request,
    templates: Any,
    name: str,
    context: dict[str, Any],
    *,
    block: str | None = None,
    status: int = 200,
) -> Response:
    ctx = {
        "researcher": getattr(request.state, "researcher", None),
        "csrf_token": auth.csrf_token(request),
        **context,
    }
    if block is not None:
        return templates.TemplateResponse(request, name, ctx, block_name=block, status_code=status)
    return templates.TemplateResponse(request, name, ctx, status_code=status)


def _see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def _form_str(form: Any, name: str, default: str = "") -> str:
    value = form.get(name, default)
    return value if isinstance(value, str) else default


# ----- login / logout / invitations ------------------------------------------------------


@router.get("/login", response_class=HTMLResponse, name="admin_login")
def login_page(request: Request, templates: TemplatesDep) -> Response:
    return _render(request, templates, "admin/login.html", {"error": None})


@router.post("/login")
async def login(request: Request, session: SessionDep, templates: TemplatesDep) -> Response:
    form = await request.form()
    try:
        researcher = auth.login_with_limits(
            request, _form_str(form, "email"), _form_str(form, "password"), session=session
        )
    except auth.LoginLocked as exc:
        locked = _render(request, templates, "admin/login.html", {"error": str(exc)}, status=429)
        locked.headers["Retry-After"] = str(exc.retry_after)
        return locked
    except auth.LoginRequired as exc:
        return _render(request, templates, "admin/login.html", {"error": str(exc)}, status=401)
    response = _see_other(str(request.url_for("admin_home")))
    auth.set_login_cookies(request, response, researcher)
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    response = _see_other(str(request.url_for("admin_login")))
    auth.clear_login_cookies(request, response)
    return response


@router.get("/invite/{token}", response_class=HTMLResponse)
def invitation_page(
    token: str, request: Request, session: SessionDep, templates: TemplatesDep
) -> Response:
    invitation = auth.get_invitation(token, session=session)
    return _render(
        request, templates, "admin/invite.html", {"invitation": invitation, "error": None}
    )


@router.post("/invite/{token}")
async def accept_invitation(
    token: str, request: Request, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()
    invitation = auth.get_invitation(token, session=session)
    password = _form_str(form, "password")
    try:
        if password != _form_str(form, "password2"):
            raise InvalidInputError("the two passwords differ")
        researcher = auth.accept_invitation(token, password, session=session)
    except FORM_ERRORS as exc:
        return _render(
            request,
            templates,
            "admin/invite.html",
            {"invitation": invitation, "error": str(exc)},
            status=422,
        )
    response = _see_other(str(request.url_for("admin_home")))
    auth.set_login_cookies(request, response, researcher)
    return response


# ----- home: studies -----------------------------------------------------------------------


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
    return _render(request, templates, "admin/home.html", {**ctx, "error": None})


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
        study = designer.create_study(_form_str(form, "name"), owner=researcher, session=session)
    except FORM_ERRORS as exc:
        ctx = _home_context(researcher, session, settings)
        return _render(
            request, templates, "admin/home.html", {**ctx, "error": str(exc)}, status=422
        )
    return _see_other(str(request.url_for("admin_study", slug=study.slug)))


# ----- imports -----------------------------------------------------------------------------


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
    return _render(
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
            _form_str(form, "dataset"),
            datasets_dir=Path(settings.demo_dataset).parent,
            owner=researcher,
            session=session,
            study_name=_form_str(form, "name"),
        )
    except FORM_ERRORS as exc:
        return _import_page(request, templates, settings, error=str(exc))
    return _see_other(str(request.url_for("admin_study", slug=result.slug)))


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
    fields = {k: _form_str(form, k) for k in ("name", "id_column", "attributes")}
    try:
        if _form_str(form, "action") == "import":
            result = designer.import_upload(files, fields, owner=researcher, session=session)
            return _see_other(str(request.url_for("admin_study", slug=result.slug)))
        preview = designer.preview_upload(files, fields)
    except FORM_ERRORS as exc:
        return _import_page(request, templates, settings, error=str(exc), fields=fields)
    return _import_page(request, templates, settings, preview=preview, fields=fields)


# ----- the study designer ------------------------------------------------------------------


def _study_context(study: Any, session: Any) -> dict[str, Any]:
    from elicitation.criteria import criterion_names

    shares = session.exec(
        select(Researcher)
        .join(StudyShare, col(StudyShare.researcher_id) == col(Researcher.id))
        .where(StudyShare.study_id == study.id)
    ).all()
    owner = session.get(Researcher, study.owner_id) if study.owner_id else None
    return {
        "study": study,
        "items": designer.study_items(study, session=session),
        "settings": StudySettings.model_validate(study.settings or {}),
        "criteria": criterion_names(),
        "shares": shares,
        "owner": owner,
        "roles": ("question", "attribute", "target"),
        # the active belief model and its comparison table / notice (issue 6, owner C)
        "fitted_model": _active_model_row(study.id, session=session),
        "belief_models": _belief_model_choices(),
        "serving": _serving(study, session),
    }


def _serving(study: Any, session: Any) -> dict[str, Any] | None:
    """What live sessions are chosen with now: the criterion in use, the one the settings
    ask for when it waits for a fixed order (``requested``), and the stored order's
    length. ``None`` without a fitted model (or settings a runtime cannot be built from)."""
    from app import session as svc
    from app.errors import PriorlyError

    try:
        rt = svc.load_runtime(study, session=session, fit_if_missing=False)
    except PriorlyError:
        return None
    fixed = getattr(rt.selector, "fixed", rt.selector)
    order = getattr(fixed, "order", None) if rt.requested_criterion is None else None
    return {
        "criterion": rt.criterion,
        "requested": rt.requested_criterion,
        "order_length": len(order) if order else None,
    }


def _active_model_row(study_id: int, *, session: Any) -> Any:
    """The active fitted model's id, family, metrics and date (not its blob), or None."""
    from app.tables import FittedModel

    row = session.exec(
        select(FittedModel.id, FittedModel.family, FittedModel.metrics, FittedModel.created_at)
        .where(FittedModel.study_id == study_id, col(FittedModel.is_active))
        .order_by(col(FittedModel.id).desc())
    ).first()
    keys = ("id", "family", "metrics", "created_at")
    return None if row is None else dict(zip(keys, row, strict=True))


def _belief_model_choices() -> tuple[str, ...]:
    from elicitation.model_choice import BELIEF_MODEL_CHOICES

    return BELIEF_MODEL_CHOICES


def _study_page(
    request: Request,
    templates: Any,
    study: Any,
    session: Any,
    *,
    error: str | None = None,
    notice: str | None = None,
    status: int = 200,
) -> Response:
    ctx = _study_context(study, session)
    return _render(
        request,
        templates,
        "admin/study.html",
        {**ctx, "error": error, "notice": notice},
        status=status,
    )


@router.get("/studies/{slug}", response_class=HTMLResponse, name="admin_study")
def study_page(
    request: Request,
    study: VisibleStudy,
    session: SessionDep,
    templates: TemplatesDep,
    notice: str | None = None,
) -> Response:
    return _study_page(request, templates, study, session, notice=(notice or "")[:200] or None)


def _study_done(request: Request, study: Any, notice: str) -> Response:
    """After a successful change: redirect to the study page (a reload does not re-post)."""
    url = request.url_for("admin_study", slug=study.slug).include_query_params(notice=notice)
    return _see_other(str(url))


def _study_form(
    request: Request, templates: Any, study: Any, session: Any, change: Callable[[], str]
) -> Response:
    """Run a designer change: on success redirect with the notice ``change`` returns; on a
    user error re-render the study page with the error inline (422)."""
    try:
        notice = change()
    except FORM_ERRORS as exc:
        return _study_page(request, templates, study, session, error=str(exc), status=422)
    return _study_done(request, study, notice)


@router.post("/studies/{slug}/texts")
async def study_texts(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()

    def change() -> str:
        designer.update_texts(
            study,
            session=session,
            name=_form_str(form, "name"),
            description=_form_str(form, "description"),
            consent_text=_form_str(form, "consent_text"),
            completion_code=_form_str(form, "completion_code"),
            redirect_url=_form_str(form, "redirect_url"),
        )
        return "texts saved"

    return _study_form(request, templates, study, session, change)


def _opt_number(value: str, kind: type[int] | type[float], what: str) -> Any:
    """``None`` for an empty field, else the field as ``kind`` (InvalidInputError if not)."""
    value = value.strip()
    if not value:
        return None
    try:
        return kind(value)
    except ValueError:
        raise InvalidInputError(f"not {what}: {value!r}") from None


def _opt_int(value: str) -> int | None:
    return _opt_number(value, int, "a whole number")  # type: ignore[no-any-return]


def _opt_float(value: str) -> float | None:
    return _opt_number(value, float, "a number")  # type: ignore[no-any-return]


@router.post("/studies/{slug}/settings")
async def study_settings(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()
    f = lambda name: _form_str(form, name)  # noqa: E731

    def change() -> str:
        values = {
            "criterion": f("criterion"),
            "ask_attributes": f("ask_attributes") == "on",
            "belief_model": f("belief_model") or "default",
            "budgets": {
                "max_questions": _opt_int(f("max_questions")) or 0,
                "min_questions": _opt_int(f("min_questions")) or 0,
                "stop_eig_threshold": _opt_float(f("stop_eig_threshold")),
                "stop_entropy_threshold": _opt_float(f("stop_entropy_threshold")),
                "allow_skip": f("allow_skip") == "on",
            },
            "group": {
                "rounds": _opt_int(f("rounds")) or 0,
                "respondents_per_round": _opt_int(f("respondents_per_round")),
                "respondents_share": _opt_float(f("respondents_share")) or 0.0,
                "total_answers": _opt_int(f("total_answers")),
                "max_questions_per_respondent": _opt_int(f("max_questions_per_respondent")) or 0,
            },
        }
        designer.update_settings(study, values, session=session)
        return "budgets saved"

    return _study_form(request, templates, study, session, change)


@router.post("/studies/{slug}/items")
async def add_item(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()

    def change() -> str:
        designer.add_item(
            study,
            session=session,
            key=_form_str(form, "key"),
            question=_form_str(form, "question"),
            options_text=_form_str(form, "options"),
            role=_form_str(form, "role", "question"),
            topic=_form_str(form, "topic"),
            is_preference_criterion=_form_str(form, "is_preference_criterion") == "on",
        )
        return "item added"

    return _study_form(request, templates, study, session, change)


@router.post("/studies/{slug}/items/{item_id}")
async def update_item(
    item_id: int,
    request: Request,
    study: VisibleStudy,
    session: SessionDep,
    templates: TemplatesDep,
) -> Response:
    form = await request.form()
    item = designer.get_item(study, item_id, session=session)

    def change() -> str:
        if _form_str(form, "action") == "delete":
            designer.delete_item(study, item, session=session)
            return "item deleted"
        options_text = _form_str(form, "options")
        if not options_text.strip():
            options_text = "\n".join(f"{o[0]}: {o[1]}" for o in item.options)
        designer.update_item(
            study,
            item,
            session=session,
            question=_form_str(form, "question", item.question) or item.question,
            options_text=options_text,
            role=_form_str(form, "role", item.role),
            topic=_form_str(form, "topic", item.topic or ""),
            is_preference_criterion=_form_str(form, "is_preference_criterion") == "on",
        )
        return f"item {item.key} saved"

    return _study_form(request, templates, study, session, change)


@router.post("/studies/{slug}/status")
async def study_status(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()

    def change() -> str:
        designer.set_status(study, _form_str(form, "status"), session=session)
        return f"study {study.status}"

    return _study_form(request, templates, study, session, change)


@router.post("/studies/{slug}/share")
async def study_share(
    request: Request,
    study: VisibleStudy,
    researcher: CurrentResearcher,
    session: SessionDep,
    templates: TemplatesDep,
) -> Response:
    form = await request.form()

    def change() -> str:
        if not (researcher.is_admin or study.owner_id == researcher.id):
            raise InvalidInputError("only the study's owner can share it")
        return f"shared with {auth.share_study(study, _form_str(form, 'email'), session=session).email}"

    return _study_form(request, templates, study, session, change)


# ----- jobs --------------------------------------------------------------------------------


def _job_view(job: Job) -> dict[str, Any]:
    return {
        "job": job,
        "label": LABELS.get(job.kind, job.kind),
        "active": job.status in jobs.ACTIVE,
        "percent": int(round(100 * (job.progress or 0.0))),
    }


PERSONAS_SHOWN = 200
"""Personas listed on the jobs page (the count covers all of them)."""


@router.get("/studies/{slug}/jobs", response_class=HTMLResponse, name="admin_jobs")
def jobs_page(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    rows = [_job_view(j) for j in jobs.study_jobs(study, session=session)]
    # The study's persona dictionary (texts a researcher entered or generated from
    # attribute profiles), shown where persona generation is started; text is escaped.
    personas = session.exec(
        select(StudyPersona)
        .where(StudyPersona.study_id == study.id)
        .order_by(col(StudyPersona.id))
        .limit(PERSONAS_SHOWN)
    ).all()
    n_personas = session.exec(
        select(func.count()).select_from(StudyPersona).where(StudyPersona.study_id == study.id)
    ).one()
    return _render(
        request,
        templates,
        "admin/jobs.html",
        {
            "study": study,
            "jobs": rows,
            "kinds": [(k, LABELS[k]) for k in kind_names()],
            "personas": personas,
            "n_personas": n_personas,
        },
    )


@router.post("/studies/{slug}/jobs")
async def start_job(
    request: Request,
    study: VisibleStudy,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
    templates: TemplatesDep,
) -> Response:
    form = await request.form()
    kind = _form_str(form, "kind")
    payload: dict[str, Any] = {}
    if kind == "simulation":
        for name in ("budget", "max_test_users"):
            value = _opt_int(_form_str(form, name))
            if value is not None:
                payload[name] = value
    job = jobs.start_job(
        kind, study, payload=payload, researcher=researcher, settings=settings, session=session
    )
    target = {"simulation": "admin_simulation", "plan_group_round": "admin_groups"}.get(
        kind, "admin_jobs"
    )
    return _see_other(str(request.url_for(target, slug=study.slug)) + f"?job={job.id}")


@router.get("/studies/{slug}/jobs/{job_id}", response_class=HTMLResponse, name="admin_job")
def job_partial(
    job_id: int,
    request: Request,
    study: VisibleStudy,
    session: SessionDep,
    templates: TemplatesDep,
) -> Response:
    """The job's row: polls itself every second while the job is queued or running."""
    job = jobs.get_study_job(study, job_id, session=session)
    return _render(
        request, templates, "admin/job.html", {"study": study, **_job_view(job)}, block="job"
    )


@router.post("/studies/{slug}/jobs/{job_id}/cancel")
def cancel_job(
    job_id: int,
    request: Request,
    study: VisibleStudy,
    session: SessionDep,
    templates: TemplatesDep,
) -> Response:
    job = jobs.get_study_job(study, job_id, session=session)
    jobs.cancel_job(job, session=session)
    return _render(
        request, templates, "admin/job.html", {"study": study, **_job_view(job)}, block="job"
    )


@router.get("/studies/{slug}/jobs/{job_id}/plot.svg", name="admin_job_plot")
def job_plot(job_id: int, study: VisibleStudy, session: SessionDep) -> Response:
    from app.services.plots import simulation_svg

    job = jobs.get_study_job(study, job_id, session=session)
    if job.kind != "simulation" or job.status != JobStatus.succeeded.value or not job.result:
        raise NotFoundError("this job has no simulation plot")
    return Response(
        simulation_svg(job.result),
        media_type="image/svg+xml",
        headers={"Cache-Control": "private, max-age=3600"},
    )


def _kind_context(study: Any, kind: str, session: Any) -> dict[str, Any]:
    """A page about one job kind: its queued/running jobs (polling rows) and latest result."""
    return {
        "study": study,
        "pending": [
            _job_view(j)
            for j in jobs.study_jobs(study, session=session, limit=20)
            if j.kind == kind and j.status in jobs.ACTIVE
        ],
        "latest": jobs.latest_result(study, kind, session=session),
        "settings": StudySettings.model_validate(study.settings or {}),
    }


@router.get("/studies/{slug}/simulation", response_class=HTMLResponse, name="admin_simulation")
def simulation_page(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    return _render(
        request, templates, "admin/simulation.html", _kind_context(study, "simulation", session)
    )


# ----- dashboard -----------------------------------------------------------------------------


@router.get("/studies/{slug}/dashboard", response_class=HTMLResponse, name="admin_dashboard")
def dashboard_page(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    from app.services import plots
    from app.services.dashboard import build_dashboard

    dash = build_dashboard(study, session=session)
    target_svgs = [
        plots.distribution_svg(
            f"{t.key}: {t.question} (n = {t.n})", t.labels, t.mean, t.low, t.high, t.prior
        )
        for t in dash.targets
    ]
    persona_svg = (
        plots.bars_svg(
            "aggregate persona posterior",
            [p["label"] for p in dash.personas],
            [p["weight"] for p in dash.personas],
            "mean posterior weight",
        )
        if dash.personas and dash.counts["started"]
        else None
    )
    block = "dashboard" if request.headers.get("hx-request") else None
    return _render(
        request,
        templates,
        "admin/dashboard.html",
        {"study": study, "dash": dash, "target_svgs": target_svgs, "persona_svg": persona_svg},
        block=block,
    )


def _groups_context(study: Any, session: Any) -> dict[str, Any]:
    from app.services import group_rounds

    ctx = _kind_context(study, "plan_group_round", session)
    latest = ctx["latest"]
    rounds = group_rounds.study_rounds(study, session=session)
    is_open = any(r.status == "open" for r in rounds)
    can_open = (
        latest is not None
        and not is_open
        and study.status == "published"
        and (latest.result or {}).get("rounds_done") == len(rounds)
    )
    return {
        **ctx,
        "can_open": can_open,
        "round_open": is_open,
        "rounds": rounds,
        "usage": group_rounds.budget_usage(study, session=session),
    }


@router.get("/studies/{slug}/groups", response_class=HTMLResponse, name="admin_groups")
def groups_page(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    """Plan the next round, open it from the latest plan, and the list of rounds."""
    return _render(request, templates, "admin/groups.html", _groups_context(study, session))


@router.post("/studies/{slug}/groups/open")
async def open_group_round(
    request: Request,
    study: VisibleStudy,
    researcher: CurrentResearcher,
    session: SessionDep,
    engine: EngineDep,
    settings: SettingsDep,
    templates: TemplatesDep,
) -> Response:
    from app.services import group_rounds

    form = await request.form()
    try:
        job_id = _opt_int(_form_str(form, "job_id"))
        if job_id is None:
            raise InvalidInputError("job_id: the plan to open is missing")
        rnd = group_rounds.open_round(
            study,
            job_id,
            engine=engine,
            secret=settings.secret_key.get_secret_value(),
            researcher=researcher,
        )
    except FORM_ERRORS as exc:
        ctx = _groups_context(study, session)
        return _render(
            request,
            templates,
            "admin/groups.html",
            {**ctx, "error": str(exc)},
            status=_exc_status(exc),
        )
    return _see_other(str(request.url_for("admin_group_round", slug=study.slug, number=rnd.number)))


def _exc_status(exc: Exception) -> int:
    """The status of a form error: its own (409 conflict, 404, ...) or 422."""
    return exc.http_status if isinstance(exc, PriorlyError) else 422


def _round_view(request: Request, study: Any, number: int, session: Any, settings: Any) -> Any:
    """Round ``number`` with its members' status and personal links (absolute URLs)."""
    from app.services import group_rounds

    return group_rounds.round_view(
        study,
        group_rounds.get_round(study, number, session=session),
        session=session,
        secret=settings.secret_key.get_secret_value(),
        link_base=str(request.url_for("group_round_link", token="x"))[:-1],
    )


@router.get(
    "/studies/{slug}/groups/{number}", response_class=HTMLResponse, name="admin_group_round"
)
def group_round_page(
    number: int,
    request: Request,
    study: VisibleStudy,
    session: SessionDep,
    settings: SettingsDep,
    templates: TemplatesDep,
) -> Response:
    """One round: question, budget use and the live member table (htmx polls the
    ``track`` block every 2 s while the round is open; the closed table stops polling)."""
    from app.services import group_rounds

    view = _round_view(request, study, number, session, settings)
    usage = group_rounds.budget_usage(study, session=session)
    block = "track" if request.headers.get("hx-request") else None
    return _render(
        request,
        templates,
        "admin/group_round.html",
        {"study": study, "rv": view, "usage": usage},
        block=block,
    )


@router.get("/studies/{slug}/groups/{number}/links.csv", name="admin_group_round_links")
def group_round_links(
    number: int,
    request: Request,
    study: VisibleStudy,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    """The round's members with their personal links, as CSV (UTF-8 with a BOM), for a
    mail merge."""
    from app.services import group_rounds

    view = _round_view(request, study, number, session, settings)
    return Response(
        "\ufeff" + group_rounds.links_csv(view),
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="{study.slug}-round-{number}-links.csv"'
        },
    )


@router.post("/studies/{slug}/groups/{number}/close")
def close_group_round(
    number: int, request: Request, study: VisibleStudy, engine: EngineDep
) -> Response:
    from app.services import group_rounds

    group_rounds.close_round(study, number, engine=engine)
    return _see_other(str(request.url_for("admin_group_round", slug=study.slug, number=number)))


# ----- exports ---------------------------------------------------------------------------------

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
    return _render(request, templates, "admin/exports.html", {"study": study, "exports": EXPORTS})


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
            from app import session as svc

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


# ----- API keys -------------------------------------------------------------------------------


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
    return _render(
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
        new = apikeys.create_api_key(
            researcher.email, session=session, name=_form_str(form, "name")
        )
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


# ----- accounts (admins) ------------------------------------------------------------------------


def _accounts_page(
    request: Request,
    templates: Any,
    session: Any,
    *,
    error: str | None = None,
    notice: str | None = None,
    invite_url: str | None = None,
    status: int = 200,
) -> Response:
    people = session.exec(select(Researcher).order_by(col(Researcher.email))).all()
    return _render(
        request,
        templates,
        "admin/accounts.html",
        {"people": people, "error": error, "notice": notice, "invite_url": invite_url},
        status=status,
    )


@router.get("/accounts", response_class=HTMLResponse, name="admin_accounts")
def accounts_page(
    request: Request, admin: AdminUser, session: SessionDep, templates: TemplatesDep
) -> Response:
    return _accounts_page(request, templates, session)


@router.post("/accounts")
async def create_account(
    request: Request, admin: AdminUser, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()
    try:
        person = auth.create_account(
            _form_str(form, "email"),
            _form_str(form, "password"),
            session=session,
            is_admin=_form_str(form, "role") == "admin",
        )
    except FORM_ERRORS as exc:
        return _accounts_page(request, templates, session, error=str(exc), status=422)
    return _accounts_page(request, templates, session, notice=f"account {person.email} created")


@router.post("/invitations")
async def invite(
    request: Request, admin: AdminUser, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()
    try:
        token = auth.create_invitation(
            _form_str(form, "email"),
            inviter=admin,
            session=session,
            is_admin=_form_str(form, "role") == "admin",
        )
    except FORM_ERRORS as exc:
        return _accounts_page(request, templates, session, error=str(exc), status=422)
    url = str(request.url_for("invitation_page", token=token))
    return _accounts_page(request, templates, session, invite_url=url)


# ----- installation --------------------------------------------------------------------------------


def install(app: FastAPI) -> None:
    """Add the admin router, the group round links (``/g/{token}``), the CSRF-cookie
    middleware and the admin error handlers."""
    from app.routes import group_links

    app.include_router(router)
    app.include_router(group_links.router)
    app.add_middleware(auth.CsrfCookieMiddleware)
    templates = app.state.templates

    async def login_required(request: Request, exc: Exception) -> Response:
        login_url = str(request.url_for("admin_login"))
        if request.headers.get("hx-request"):
            return Response(status_code=401, headers={"HX-Redirect": login_url})
        if request.method == "GET":
            return RedirectResponse(login_url, status_code=303)
        return HTMLResponse("please log in", status_code=401)

    previous = app.exception_handlers.get(PriorlyError)

    async def admin_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, PriorlyError)
        if not request.url.path.startswith("/admin"):
            if previous is not None:
                result = previous(request, exc)
                return await result if inspect.isawaitable(result) else result
            return JSONResponse({"detail": str(exc)}, status_code=exc.http_status)
        return templates.TemplateResponse(  # type: ignore[no-any-return]
            request,
            "admin/error.html",
            {"message": str(exc), "status": exc.http_status, "researcher": None, "csrf_token": ""},
            status_code=exc.http_status,
        )

    app.add_exception_handler(auth.LoginRequired, login_required)
    app.add_exception_handler(PriorlyError, admin_error)
