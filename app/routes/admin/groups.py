"""Group elicitation rounds: the rounds page (plan the next round, open it from the latest
plan), one round (question, budget use, the live member table), its members' personal
links as CSV, and closing it."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from app.auth import CurrentResearcher, VisibleStudy
from app.deps import DbId, EngineDep, SessionDep, SettingsDep
from app.errors import ConflictError, InvalidInputError
from app.routes.admin.common import FormDep, PageDep, error_status, user_error_message
from app.services import designer, group_rounds, group_views, jobs, round_tracking

router = APIRouter()


def _link_base(page: PageDep) -> str:
    """The absolute URL of a member's personal link without its token."""
    return page.url("group_round_link", token="x")[:-1]


@router.get("/studies/{slug}/groups", response_class=HTMLResponse, name="admin_groups")
def groups_page(page: PageDep, study: VisibleStudy, session: SessionDep) -> Response:
    return page.render("admin/groups.html", group_views.groups_overview(study, session=session))


@router.get("/studies/{slug}/groups/open", include_in_schema=False)
@router.get("/studies/{slug}/groups/plan", include_in_schema=False)
def groups_form_address(page: PageDep, study: VisibleStudy) -> Response:
    """The address a refused plan or open form leaves in the address bar: reloading it
    (a GET) shows the rounds page, not "path.number: Input should be a valid integer"."""
    return page.redirect("admin_groups", slug=study.slug)


@router.get("/studies/{slug}/groups/{number}/close", include_in_schema=False)
def group_close_address(number: DbId, page: PageDep, study: VisibleStudy) -> Response:
    """The address a refused close form leaves: reloading it shows the round's page."""
    return page.redirect("admin_group_round", slug=study.slug, number=number)


@router.post("/studies/{slug}/groups/plan")
async def plan_group_round(
    page: PageDep,
    form: FormDep,
    study: VisibleStudy,
    researcher: CurrentResearcher,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    """Start the plan job with the chosen respondent selection (``elook`` or
    ``relational``). Refused on the rounds page, with the reason and nothing started: an
    unknown selection, relational selection without a GNN, a study that cannot plan yet
    (:func:`group_views.plan_unavailable`), a round still open (a page shown before it was
    opened: 409)."""
    selection = form.text("selection") or "elook"
    try:
        if selection not in group_rounds.SELECTIONS:
            raise InvalidInputError(
                f"selection: unknown respondent selection {selection!r} "
                f"(known: {', '.join(sorted(group_rounds.SELECTIONS))})"
            )
        if selection == "relational" and (
            why := group_views.relational_unavailable(study, session=session)
        ):
            raise InvalidInputError(f"selection: {why}")
        if why := group_views.plan_unavailable(study, session=session):
            raise InvalidInputError(why)
        if (number := designer.open_round_number(study, session=session)) is not None:
            raise ConflictError(f"round {number} is open: close it before planning the next")
        job = jobs.start_job(
            "plan_group_round",
            study,
            payload={"selection": selection},
            researcher=researcher,
            settings=settings,
            session=session,
        )
    except Exception as exc:
        ctx = {**group_views.groups_overview(study, session=session)}
        ctx["error"] = user_error_message(exc)
        return page.render("admin/groups.html", ctx, status=error_status(exc))
    return page.redirect("admin_groups", query={"job": job.id}, slug=study.slug)


@router.post("/studies/{slug}/groups/open")
async def open_group_round(
    page: PageDep,
    form: FormDep,
    study: VisibleStudy,
    researcher: CurrentResearcher,
    session: SessionDep,
    engine: EngineDep,
    settings: SettingsDep,
) -> Response:
    """Open a round from the plan of job ``job_id``; a refused plan (another round open,
    a stale plan, the budget spent, ...) is shown on the rounds page with its status."""
    try:
        job_id = form.opt_id("job_id")
        if job_id is None:
            raise InvalidInputError("job_id: the plan to open is missing")
        rnd = group_rounds.open_round(
            study,
            job_id,
            engine=engine,
            secret=settings.secret_key.get_secret_value(),
            researcher=researcher,
        )
    except Exception as exc:
        ctx = {**group_views.groups_overview(study, session=session)}
        ctx["error"] = user_error_message(exc)
        return page.render("admin/groups.html", ctx, status=error_status(exc))
    return page.redirect("admin_group_round", slug=study.slug, number=rnd.number)


@router.get("/studies/{slug}/groups/distribution.svg", name="admin_group_distribution")
def group_distribution(study: VisibleStudy, session: SessionDep, layout: str = "") -> Response:
    """The imputed group distribution of each target, round by round (SVG); ``layout=narrow``:
    one panel a row, drawn for a phone's width (the page picks it by media query)."""
    return Response(
        group_views.group_distribution_svg(study, session=session, narrow=layout == "narrow"),
        media_type="image/svg+xml",
        headers={"Cache-Control": "private, no-cache"},
    )


@router.get(
    "/studies/{slug}/groups/{number}", response_class=HTMLResponse, name="admin_group_round"
)
def group_round_page(
    number: DbId,
    page: PageDep,
    study: VisibleStudy,
    session: SessionDep,
    settings: SettingsDep,
    since: str = "",
    notice: str = "",
) -> Response:
    """One round: question, budget use and the live member table (htmx polls the
    ``track`` block every 2 s while the round is open, with ``since`` = the fingerprint
    it was drawn with: 204, nothing to swap, while the round is unchanged; the closed
    table stops polling)."""
    if page.htmx and since and group_views.round_unchanged(study, number, since, session=session):
        return Response(status_code=204)
    ctx = group_views.round_page(
        study,
        number,
        session=session,
        secret=settings.secret_key.get_secret_value(),
        link_base=_link_base(page),
    )
    ctx["notice"] = notice[:200] or None
    return page.render("admin/group_round.html", ctx, block="track" if page.htmx else None)


@router.get("/studies/{slug}/groups/{number}/{name}", name="admin_group_round_file")
def group_round_file(
    number: DbId,
    name: str,
    page: PageDep,
    study: VisibleStudy,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    """A round's download as CSV (UTF-8 with a BOM): ``links.csv``, the members' personal
    links for a mail merge, or ``answers.csv``, the round's results
    (:data:`app.services.group_views.ROUND_FILES`); another name is 404."""
    text = group_views.round_csv(
        study,
        number,
        name,
        session=session,
        secret=settings.secret_key.get_secret_value(),
        link_base=_link_base(page),
    )
    stem = name.removesuffix(".csv")
    return Response(
        "\ufeff" + text,
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="{study.slug}-round-{number}-{stem}.csv"'
        },
    )


@router.post("/studies/{slug}/groups/{number}/close")
def close_group_round(
    number: DbId, page: PageDep, study: VisibleStudy, engine: EngineDep
) -> Response:
    """Close the round and show it; a round already closed (by another admin, or from a
    page shown before) is shown with that said, not as an error."""
    try:
        round_tracking.close_round(study, number, engine=engine)
    except ConflictError:
        return page.redirect(
            "admin_group_round",
            slug=study.slug,
            number=number,
            query={"notice": f"round {number} was already closed"},
        )
    return page.redirect("admin_group_round", slug=study.slug, number=number)
