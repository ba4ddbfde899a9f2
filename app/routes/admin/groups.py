"""Group elicitation rounds: plan, open, follow and close a round; its members' links."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.auth import CurrentResearcher, VisibleStudy
from app.deps import EngineDep, SessionDep, SettingsDep, TemplatesDep
from app.errors import InvalidInputError
from app.routes.admin.common import (
    FORM_ERRORS,
    exc_status,
    form_str,
    kind_context,
    opt_int,
    render,
    see_other,
)

router = APIRouter()


def _groups_context(study: Any, session: Any) -> dict[str, Any]:
    from app.services import group_rounds

    ctx = kind_context(study, "plan_group_round", session)
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
    return render(request, templates, "admin/groups.html", _groups_context(study, session))


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
        job_id = opt_int(form_str(form, "job_id"))
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
        return render(
            request,
            templates,
            "admin/groups.html",
            {**ctx, "error": str(exc)},
            status=exc_status(exc),
        )
    return see_other(str(request.url_for("admin_group_round", slug=study.slug, number=rnd.number)))


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
    return render(
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
    return see_other(str(request.url_for("admin_group_round", slug=study.slug, number=number)))
