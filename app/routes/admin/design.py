"""The study designer: texts, settings, items, status and sharing of one study."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlmodel import col, select

from app import auth
from app.auth import CurrentResearcher, VisibleStudy
from app.deps import SessionDep, TemplatesDep
from app.errors import InvalidInputError, PriorlyError
from app.routes.admin.common import FORM_ERRORS, form_str, opt_float, opt_int, render, see_other
from app.schemas import StudySettings
from app.services import designer
from app.tables import Researcher, StudyShare

router = APIRouter()


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
    from app.services import sessions as svc

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
    return render(
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
    return see_other(str(url))


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
            name=form_str(form, "name"),
            description=form_str(form, "description"),
            consent_text=form_str(form, "consent_text"),
            completion_code=form_str(form, "completion_code"),
            redirect_url=form_str(form, "redirect_url"),
        )
        return "texts saved"

    return _study_form(request, templates, study, session, change)


@router.post("/studies/{slug}/settings")
async def study_settings(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()
    f = lambda name: form_str(form, name)  # noqa: E731

    def change() -> str:
        values = {
            "criterion": f("criterion"),
            "ask_attributes": f("ask_attributes") == "on",
            "belief_model": f("belief_model") or "default",
            "budgets": {
                "max_questions": opt_int(f("max_questions")) or 0,
                "min_questions": opt_int(f("min_questions")) or 0,
                "stop_eig_threshold": opt_float(f("stop_eig_threshold")),
                "stop_entropy_threshold": opt_float(f("stop_entropy_threshold")),
                "allow_skip": f("allow_skip") == "on",
            },
            "group": {
                "rounds": opt_int(f("rounds")) or 0,
                "respondents_per_round": opt_int(f("respondents_per_round")),
                "respondents_share": opt_float(f("respondents_share")) or 0.0,
                "total_answers": opt_int(f("total_answers")),
                "max_questions_per_respondent": opt_int(f("max_questions_per_respondent")) or 0,
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
            key=form_str(form, "key"),
            question=form_str(form, "question"),
            options_text=form_str(form, "options"),
            role=form_str(form, "role", "question"),
            topic=form_str(form, "topic"),
            is_preference_criterion=form_str(form, "is_preference_criterion") == "on",
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
        if form_str(form, "action") == "delete":
            designer.delete_item(study, item, session=session)
            return "item deleted"
        options_text = form_str(form, "options")
        if not options_text.strip():
            options_text = "\n".join(f"{o[0]}: {o[1]}" for o in item.options)
        designer.update_item(
            study,
            item,
            session=session,
            question=form_str(form, "question", item.question) or item.question,
            options_text=options_text,
            role=form_str(form, "role", item.role),
            topic=form_str(form, "topic", item.topic or ""),
            is_preference_criterion=form_str(form, "is_preference_criterion") == "on",
        )
        return f"item {item.key} saved"

    return _study_form(request, templates, study, session, change)


@router.post("/studies/{slug}/status")
async def study_status(
    request: Request, study: VisibleStudy, session: SessionDep, templates: TemplatesDep
) -> Response:
    form = await request.form()

    def change() -> str:
        designer.set_status(study, form_str(form, "status"), session=session)
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
        return (
            f"shared with {auth.share_study(study, form_str(form, 'email'), session=session).email}"
        )

    return _study_form(request, templates, study, session, change)
