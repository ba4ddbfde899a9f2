"""The study designer: the study page, and the forms that change a study's texts,
settings, items, status and sharing.

Each form runs one designer change: on success it redirects (303) to the study page with a
short notice (``?notice=texts saved``), so a reload does not post again; a user error
re-renders the study page with the message inline (422). The item forms are also sent by
htmx (header ``HX-Request``): an item's edit answers with its table row only and the bulk
role change with the items section, so the page is not reloaded and keeps its scroll
position.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response
from sqlmodel import Session

from app.auth import CurrentResearcher, VisibleStudy
from app.deps import DbId, SessionDep
from app.errors import InvalidInputError
from app.routes.admin.common import FormDep, PageDep, error_status, user_error_message
from app.schemas import StudySettings
from app.services import accounts, designer, personas
from app.services.study_view import study_item_context, study_overview
from app.tables import Item, Study

router = APIRouter()


def _study_page(
    page: PageDep,
    study: Study,
    session: Session,
    *,
    error: str | None = None,
    notice: str | None = None,
    status: int = 200,
    section: str | None = None,
) -> Response:
    ctx = {
        **study_overview(study, session=session),
        "error": error,
        "notice": notice,
        "error_section": section,
    }
    return page.render("admin/study.html", ctx, status=status)


@router.get("/studies/{slug}", response_class=HTMLResponse, name="admin_study")
def study_page(
    page: PageDep, study: VisibleStudy, session: SessionDep, notice: str | None = None
) -> Response:
    return _study_page(page, study, session, notice=(notice or "")[:200] or None)


def _study_form(
    page: PageDep,
    study: Study,
    session: Session,
    change: Callable[[], str],
    section: str | None = None,
) -> Response:
    """Run a designer change: on success redirect to the study page with the notice
    ``change`` returns; on a user error re-render the study page with the error (422),
    showing what is stored (a change half-applied to the loaded rows is rolled back and
    the rows reloaded), also next to the form of ``section`` (its card's id) when given."""
    try:
        notice = change()
    except Exception as exc:
        session.rollback()
        session.expire_all()
        return _study_page(
            page,
            study,
            session,
            error=user_error_message(exc),
            status=error_status(exc),
            section=section,
        )
    return page.redirect("admin_study", slug=study.slug, query={"notice": notice})


@router.post("/studies/{slug}/texts")
async def study_texts(
    page: PageDep, form: FormDep, study: VisibleStudy, session: SessionDep
) -> Response:
    def change() -> str:
        designer.update_texts(
            study,
            session=session,
            name=form.text("name"),
            description=form.text("description"),
            consent_text=form.text("consent_text"),
            completion_code=form.text("completion_code"),
            redirect_url=form.text("redirect_url"),
        )
        return "texts saved"

    return _study_form(page, study, session, change)


@router.post("/studies/{slug}/settings")
async def study_settings(
    page: PageDep, form: FormDep, study: VisibleStudy, session: SessionDep
) -> Response:
    labelled = form.with_labels(designer.SETTING_FIELD_LABELS)

    def change() -> str:
        # settings the form leaves empty or does not show keep their stored values
        form = labelled
        stored = StudySettings.model_validate(study.settings or {})
        drop_after = form.opt_int("drop_after_minutes")
        refit, calibration = form.opt_int("refit_every"), form.opt_int("calibration_items")
        calibration_min = form.opt_int("calibration_min_answers")

        def kept(name: str, old: int) -> int:
            new = form.opt_int(name)
            return old if new is None else new

        values = {
            "criterion": form.text("criterion"),
            "ask_attributes": form.checked("ask_attributes"),
            "belief_model": form.text("belief_model") or "default",
            "show_learned": form.checked("show_learned"),
            "language": form.text("language") or stored.language,
            "drop_after_minutes": stored.drop_after_minutes if drop_after is None else drop_after,
            "refit_every": stored.refit_every if refit is None else refit,
            "calibration_items": stored.calibration_items if calibration is None else calibration,
            "calibration_min_answers": stored.calibration_min_answers
            if calibration_min is None
            else calibration_min,
            "budgets": {
                "max_questions": kept("max_questions", stored.budgets.max_questions),
                "min_questions": kept("min_questions", stored.budgets.min_questions),
                "stop_eig_threshold": form.opt_float("stop_eig_threshold"),
                "stop_entropy_threshold": form.opt_float("stop_entropy_threshold"),
                "allow_skip": form.checked("allow_skip"),
            },
            "group": {
                "rounds": kept("rounds", stored.group.rounds),
                "respondents_per_round": form.opt_int("respondents_per_round"),
                "respondents_share": stored.group.respondents_share
                if (share := form.opt_share("respondents_share")) is None
                else share,
                "total_answers": form.opt_int("total_answers"),
                "max_questions_per_respondent": kept(
                    "max_questions_per_respondent", stored.group.max_questions_per_respondent
                ),
                "panel": form.text("panel") or stored.group.panel,
            },
        }
        stored = designer.update_settings(study, values, session=session)
        asked = values.get("calibration_items")
        return (
            "settings saved (sessions in progress use them from their next question)"
            + designer.calibration_note(
                asked if isinstance(asked, int) else stored.calibration_items, stored
            )
            + designer.group_size_note(study, stored, session=session)
        )

    return _study_form(page, study, session, change)


@router.post("/studies/{slug}/items")
async def add_item(
    page: PageDep, form: FormDep, study: VisibleStudy, session: SessionDep
) -> Response:
    def change() -> str:
        designer.add_item(
            study,
            session=session,
            key=form.text("key"),
            question=form.text("question"),
            options_text=form.text("options"),
            role=form.text("role", "question"),
            topic=form.text("topic"),
            is_preference_criterion=form.checked("is_preference_criterion"),
        )
        return "item added"

    return _study_form(page, study, session, change, section="items")


def _item_row(
    page: PageDep,
    study: Study,
    item: Item | None,
    session: Session,
    *,
    error: str | None = None,
    notice: str | None = None,
    status: int = 200,
) -> Response:
    """The htmx answer to an item form: the item's table row (none once the item is
    deleted), with the notice or the error inside the row, and the item counts of the
    section's heading (swapped out of band)."""
    ctx = {
        **study_item_context(study, session=session),
        "items": designer.study_items(study, session=session),
        "it": item,
        "row_error": error,
        "row_notice": notice,
        "oob": True,
    }
    return page.render("admin/study.html", ctx, block="item_update", status=status)


@router.post("/studies/{slug}/items/roles")
async def bulk_roles(
    page: PageDep, form: FormDep, study: VisibleStudy, session: SessionDep
) -> Response:
    """Set the role of the selected items (``keys``, several) to ``role``. htmx gets the
    items section back; a plain form post is redirected to the study page."""
    keys = [k for k in form.form.getlist("keys") if isinstance(k, str)]
    role = form.text("role")
    try:
        if not keys:
            raise InvalidInputError("select at least one item to change its role")
        n = designer.set_roles(study, dict.fromkeys(keys, role), session=session)
        notice, error, status = f"{n} item{'s' if n != 1 else ''} set to {role}", None, 200
    except Exception as exc:
        notice, error, status = None, user_error_message(exc), error_status(exc)
    if page.htmx:
        ctx = {
            **study_item_context(study, session=session),
            "items": designer.study_items(study, session=session),
            "items_error": error,
            "items_notice": notice,
        }
        return page.render("admin/study.html", ctx, block="items", status=status)
    if error is not None:
        return _study_page(page, study, session, error=error, status=status)
    return page.redirect("admin_study", slug=study.slug, query={"notice": notice})


@router.post("/studies/{slug}/items/{item_id}")
async def update_item(
    item_id: DbId, page: PageDep, form: FormDep, study: VisibleStudy, session: SessionDep
) -> Response:
    """``action=delete`` deletes the item; otherwise the fields left empty keep their
    values (the options included); ``missing`` (several) marks option letters as not an
    answer. htmx gets the item's row back (edited in place); a plain form post is
    redirected to the study page."""
    item = designer.get_item(study, item_id, session=session)

    def change() -> str:
        action = form.text("action")
        if action not in ("", "save", "delete"):
            raise InvalidInputError(f"action: {action[:40]!r} is not save or delete")
        if action == "delete":
            designer.delete_item(study, item, session=session)
            return f"item {item.key} deleted"
        options_text = form.text("options")
        if not options_text.strip():
            options_text = "\n".join(f"{o[0]}: {o[1]}" for o in item.options)
        before = (item.question, [list(o) for o in item.options])
        answered = designer.live_answer_count(item, session=session)
        scored = personas.personas_scored_on(item, session=session)
        old_hash = personas.item_prompt_hash(item)
        designer.update_item(
            study,
            item,
            session=session,
            question=form.text("question", item.question) or item.question,
            options_text=options_text,
            role=form.text("role", item.role),
            topic=form.text("topic", item.topic or ""),
            is_preference_criterion=form.checked("is_preference_criterion"),
            missing=[m for m in form.form.getlist("missing") if isinstance(m, str)],
        )
        notice = f"item {item.key} saved"
        if answered and (item.question, [list(o) for o in item.options]) != before:
            notice += (
                f"; its {answered} earlier answer"
                f"{'' if answered == 1 else 's'} (kept by option letter) now show with the new "
                "wording and option order in the exports and the dashboard"
            )
        if scored and personas.item_prompt_hash(item) != old_hash:
            notice += (
                f"; the language-model distributions of {scored} persona"
                f"{'' if scored == 1 else 's'} were for the old wording or options: "
                "generate on the Personas page to score it again, then refit (until then "
                "the persona prior is uniform on this item)"
            )
        return notice

    if not page.htmx:
        return _study_form(page, study, session, change)
    try:
        notice = change()
    except Exception as exc:
        session.rollback()
        session.refresh(item)
        message = user_error_message(exc)
        return _item_row(page, study, item, session, error=message, status=error_status(exc))
    deleted = form.text("action") == "delete"
    return _item_row(page, study, None if deleted else item, session, notice=notice)


@router.post("/studies/{slug}/status")
async def study_status(
    page: PageDep, form: FormDep, study: VisibleStudy, session: SessionDep
) -> Response:
    def change() -> str:
        designer.set_status(study, form.text("status"), session=session)
        return f"study {study.status}" + designer.status_note(study, session=session)

    return _study_form(page, study, session, change, section="status")


@router.post("/studies/{slug}/share")
async def study_share(
    page: PageDep,
    form: FormDep,
    study: VisibleStudy,
    researcher: CurrentResearcher,
    session: SessionDep,
) -> Response:
    def change() -> str:
        shared = accounts.share_study(study, form.text("email"), by=researcher, session=session)
        return f"shared with {shared.email}"

    return _study_form(page, study, session, change)
