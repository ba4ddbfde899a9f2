"""Group elicitation rounds as the admin pages show them: the rounds page and one round
with its members' personal links (absolute URLs).
"""

from __future__ import annotations

import io
import textwrap
from typing import Any

from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from sqlmodel import Session, select

from app.errors import NotFoundError, is_user_error
from app.schemas import StudySettings
from app.services import group_rounds, round_tracking
from app.services.belief import active_model_ref
from app.services.dashboard import clip_middle
from app.services.job_views import kind_overview
from app.tables import FittedModel, GroupRound, Item, ItemRole, Job, RespondentSource, Study
from elicitation.group import GroupState, replay


def groups_overview(study: Study, *, session: Session) -> dict[str, Any]:
    """The rounds page: :func:`~app.services.job_views.kind_overview` of the planning jobs,
    the study's ``rounds``, whether one is open (``round_open``), the group budget's
    ``usage``, and ``can_open``: the latest plan can be opened as a round (the study is
    published, no round is open and the plan was made after the last round).

    Also: ``plan_unavailable`` (why no plan can be made: no targets, no fitted belief
    model; the Plan button is disabled with it), ``plan_status`` of the latest plan
    (:func:`plan_status`), ``panel`` (``live`` / ``imported``: fixed by round 1, ``None``
    before it) and ``panel_setting`` (the study's Panel setting), and ``estimate`` (the
    model of the latest plan's imputed targets in words, :func:`estimate_label`)."""
    ctx = kind_overview(study, "plan_group_round", session=session)
    latest = ctx["latest"]
    result = (latest.result or {}) if latest is not None else {}
    rounds = group_rounds.study_rounds(study, session=session)
    is_open = any(r.status == "open" for r in rounds)
    can_open = (
        latest is not None
        and not is_open
        and study.status == "published"
        and result.get("rounds_done") == len(rounds)
    )
    no_gnn = relational_unavailable(study, session=session)
    return {
        **ctx,
        "selections": group_rounds.SELECTION_LABELS,
        "no_gnn": no_gnn,
        "plan_unavailable": plan_unavailable(study, session=session),
        "plan_status": plan_status(latest, rounds, gnn_trained=no_gnn is None),
        "panel": (
            None
            if not rounds
            else "live"
            if rounds[0].panel == RespondentSource.live
            else "imported"
        ),
        "panel_setting": StudySettings.model_validate(study.settings or {}).group.panel,
        "estimate": estimate_label(
            bool(result.get("uses_gnn")), [float(result.get("pool_weight") or 0.0)]
        ),
        "can_open": can_open,
        "round_open": is_open,
        "rounds": rounds,
        "usage": round_tracking.budget_usage(study, session=session),
    }


def plan_status(
    latest: Job | None, rounds: list[GroupRound], *, gnn_trained: bool
) -> dict[str, Any]:
    """Where the latest plan stands: ``opened_as`` (the number of the round opened from
    it, or ``None``), ``stale`` (made before a round was opened or closed, and not opened:
    plan again), ``gnn_since`` (planned without a GNN that has been trained since).
    A plan that was opened or is stale is shown as one line, its details folded.

    Example: plan #7 opened as round 2 → ``{"opened_as": 2, "stale": False, ...}``.
    """
    if latest is None or not latest.result:
        return {"opened_as": None, "stale": False, "gnn_since": False}
    opened = [r.number for r in rounds if r.plan_job_id == latest.id]
    return {
        "opened_as": opened[0] if opened else None,
        "stale": not opened and latest.result.get("rounds_done") != len(rounds),
        "gnn_since": gnn_trained and latest.result.get("gnn_model_id") is None,
    }


def plan_unavailable(study: Study, *, session: Session) -> str | None:
    """Why no round can be planned for ``study`` yet, or ``None``: it has no target item,
    or no fitted belief model (the rounds page disables its Plan button with this)."""
    target = session.exec(
        select(Item.id).where(Item.study_id == study.id, Item.role == ItemRole.target.value)
    ).first()
    if target is None:
        return "choose at least one target item (role “target” on the Design tab) first"
    if active_model_ref(study.id or 0, session=session) is None:
        return group_rounds.FIT_FIRST


def relational_unavailable(study: Study, *, session: Session) -> str | None:
    """Why relational selection cannot plan for ``study`` (it has no trained group GNN),
    or ``None``: the rounds page disables the choice with this reason and the plan form
    refuses it."""
    gnn = session.exec(
        select(FittedModel.id).where(FittedModel.study_id == study.id, FittedModel.family == "gnn")
    ).first()
    if gnn is not None:
        return None
    return (
        "relational selection needs the study's trained group GNN: run "
        '"Train the group GNN" on the Jobs tab first'
    )


def round_members(
    study: Study, number: int, *, session: Session, secret: str, link_base: str
) -> round_tracking.RoundView:
    """Round ``number`` of ``study`` with its members' status and personal links
    (``link_base`` + token); :class:`NotFoundError` for a round that does not exist."""
    return round_tracking.round_view(
        study,
        group_rounds.get_round(study, number, session=session),
        session=session,
        secret=secret,
        link_base=link_base,
    )


MAX_SHOWN_MEMBERS = 100
"""The most member rows a round's page draws (each with its link); the CSVs have all."""


def shown_members(
    members: list[round_tracking.MemberRow], limit: int = MAX_SHOWN_MEMBERS
) -> list[round_tracking.MemberRow]:
    """The first ``limit`` rows of a round's member table: members with an answer (or a
    "prefer not to answer"), the most recent first, then the others in the plan's order.

    Example: answers by r3 at 10:00 and r1 at 10:05, r2 waiting → ``[r1, r3, r2]``.
    """
    replied = sorted(
        (m for m in members if m.answered_at is not None),
        key=lambda m: m.answered_at,  # type: ignore[arg-type, return-value]
        reverse=True,
    )
    return (replied + [m for m in members if m.answered_at is None])[:limit]


def round_page(
    study: Study, number: int, *, session: Session, secret: str, link_base: str
) -> dict[str, Any]:
    """One round's page: ``study``, ``rv`` (:func:`round_members`: the round's exact
    counts), ``shown`` (its first :data:`MAX_SHOWN_MEMBERS` member rows,
    :func:`shown_members`: a refresh of a round of 2,000 stays small; the CSVs list
    all), ``has_panel`` (some member arrived with link parameters), the study's group
    budget ``usage`` (current settings, all rounds) and the round's ``fingerprint``
    (:func:`round_unchanged`)."""
    view = round_members(study, number, session=session, secret=secret, link_base=link_base)
    return {
        "study": study,
        "rv": view,
        "shown": shown_members(view.members),
        "has_panel": any(m.panel for m in view.members),
        "status_words": STATUS_WORDS,
        "usage": round_tracking.budget_usage(study, session=session),
        "fingerprint": round_tracking.round_fingerprint(view.round, session=session),
    }


STATUS_WORDS = {
    "answered": "answered",
    "skipped": "preferred not to answer",
    "waiting": "waiting",
    "no_answer": "did not answer",
}
"""A member's status on the round's page, in the words of its counts."""


def round_unchanged(study: Study, number: int, since: str, *, session: Session) -> bool:
    """Whether round ``number`` still has the fingerprint ``since`` the page was drawn
    with (:func:`app.services.round_tracking.round_fingerprint`): the open round's page
    polls with it, and an unchanged round is answered without drawing its members (a
    round of 2,000 members is a large page)."""
    rnd = group_rounds.get_round(study, number, session=session)
    return round_tracking.round_fingerprint(rnd, session=session) == since


ROUND_FILES = {"links.csv": round_tracking.links_csv, "answers.csv": round_tracking.answers_csv}
"""A round's downloads: its members' personal links (a mail merge) and its results."""


def round_csv(
    study: Study, number: int, name: str, *, session: Session, secret: str, link_base: str
) -> str:
    """Round ``number``'s download ``name`` (:data:`ROUND_FILES`) as CSV text.

    Raises:
        NotFoundError: no such round or file.
    """
    write = ROUND_FILES.get(name)
    if write is None:
        raise NotFoundError(f"no file {name!r} for a group round (known: {', '.join(ROUND_FILES)})")
    view = round_members(study, number, session=session, secret=secret, link_base=link_base)
    return write(view)


def distribution_history(study: Study, *, session: Session) -> dict[str, Any]:
    """The panel's imputed distribution of every target before round 1 and after each
    closed round (:func:`app.services.group_rounds.target_predictions` of
    :func:`~app.services.group_rounds.panel_estimate`, the figures every plan shows).

    Returns ``{"rounds": [0, 1, ...], "targets": [{"item", "question", "labels",
    "mean": [[O] per round], "se": [[O] per round]}], "uses_gnn": bool,
    "pool_weights": [w per round]}`` (the GNN's pool weight after each round; all 0
    without a GNN).
    """
    rep = group_rounds.replay_group(study, session=session)
    state = rep.state
    ge = replay(
        rep.models,
        GroupState(state.observed, state.candidates, state.targets, askable=state.askable),
        rep.budget,
    )

    def weight() -> float:
        return ge.pool_weight if ge.method.imputation == "pool" else 0.0

    steps, weights = [group_rounds.target_predictions(rep.rt, ge)], [weight()]
    for rnd in state.rounds:
        ge.apply(rnd.question, rnd.asked, rnd.answers)
        steps.append(group_rounds.target_predictions(rep.rt, ge))
        weights.append(weight())
    targets = [
        {
            "item": first["item"],
            "question": first["question"],
            "labels": first["labels"],
            "mean": [step[t]["mean"] for step in steps],
            "se": [step[t]["se"] for step in steps],
        }
        for t, first in enumerate(steps[0])
    ]
    return {
        "rounds": list(range(len(steps))),
        "targets": targets,
        "uses_gnn": rep.models.gnn is not None,
        "pool_weights": weights,
    }


def estimate_label(uses_gnn: bool, weights: list[float]) -> str:
    """Which model the imputed targets come from, in words (the chart's title and the
    plan page). Example: ``(True, [0.0, 0.15])`` → ``"belief model pooled with the GNN
    (weight 0–0.15)"``; ``(True, [0.0])`` → ``"belief model (the GNN's pool weight is
    0)"``."""
    if not uses_gnn:
        return "belief model"
    lo, hi = min(weights, default=0.0), max(weights, default=0.0)
    if hi == 0.0:
        return "belief model (the GNN's pool weight is 0)"
    span = f"{lo:.2g}" if lo == hi else f"{lo:.2g}–{hi:.2g}"
    return f"belief model pooled with the GNN (weight {span})"


_COLOURS = ("#2457a6", "#c0392b", "#7f8c8d", "#27ae60", "#8e44ad", "#d35400", "#16a085")
MAX_PLOTTED_TARGETS = 8


def distribution_svg(history: dict[str, Any], *, narrow: bool = False) -> str:
    """:func:`distribution_figure` as a standalone ``<svg>`` document (matplotlib escapes
    the labels, which come from the database; pages embed it through ``<img>``)."""
    buf = io.StringIO()
    FigureCanvasSVG(distribution_figure(history, narrow=narrow)).print_svg(buf)
    return buf.getvalue()


def distribution_figure(history: dict[str, Any], *, narrow: bool = False) -> Figure:
    """The imputed group distribution of each target, round by round: one panel per
    target (at most :data:`MAX_PLOTTED_TARGETS`), one line per option (the panel's share)
    with a band of two standard errors (:func:`distribution_history`).

    Titles keep the end of long questions (:func:`app.services.dashboard.clip_middle`:
    questions sharing a stem stay apart) and each legend sits outside its panel. Two
    panels a row, legends to the right; ``narrow`` (a phone, 390 px): one panel a row,
    390 px wide, legends below, so that the text is drawn near its size."""
    targets = history["targets"][:MAX_PLOTTED_TARGETS]
    rounds = history["rounds"]
    cols = 1 if narrow else min(2, max(1, len(targets)))
    rows = (len(targets) + cols - 1) // cols
    size = (3.9, 3.6 * rows + 0.6) if narrow else (6.4 * cols, 3.0 * rows + 0.6)
    fig = Figure(figsize=size, dpi=100, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, t in zip(axes.flat, targets, strict=False):
        for o, label in enumerate(t["labels"]):
            m = [step[o] for step in t["mean"]]
            se = [step[o] for step in t["se"]]
            c = _COLOURS[o % len(_COLOURS)]
            ax.plot(rounds, m, marker="o", markersize=3, color=c, label=clip_middle(label, 28))
            ax.fill_between(
                rounds,
                [max(0.0, a - 2 * b) for a, b in zip(m, se, strict=True)],
                [min(1.0, a + 2 * b) for a, b in zip(m, se, strict=True)],
                color=c,
                alpha=0.15,
                linewidth=0,
            )
        title = clip_middle(f"{t['item']}: {t['question']}", 100)
        ax.set_title(textwrap.fill(title, 50), fontsize=9, loc="left")
        ax.set_xticks(rounds)
        ax.set_ylim(0, 1)
        ax.tick_params(labelsize=8)
        ax.set_xlabel("closed rounds", fontsize=8)
        ax.set_ylabel("share of the panel", fontsize=8)
        ax.grid(alpha=0.3)
        if narrow:
            n = len(t["labels"])
            ax.legend(
                fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                ncol=min(2, n), frameon=False,
            )  # fmt: skip
        else:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    for ax in list(axes.flat)[len(targets) :]:
        ax.set_visible(False)
    model = estimate_label(bool(history.get("uses_gnn")), history.get("pool_weights", []))
    fig.suptitle(
        textwrap.fill(f"Imputed by the {model}; bands: ±2 standard errors", 60 if narrow else 120),
        fontsize=9,
    )
    return fig


def message_svg(text: str) -> str:
    """A small SVG that says ``text`` (where a plot cannot be drawn yet)."""
    fig = Figure(figsize=(6.2, 0.9), dpi=100)
    fig.text(0.02, 0.5, textwrap.fill(clip_middle(text, 220), 110), fontsize=9, va="center")
    buf = io.StringIO()
    FigureCanvasSVG(fig).print_svg(buf)
    return buf.getvalue()


def group_distribution_svg(study: Study, *, session: Session, narrow: bool = False) -> str:
    """:func:`distribution_svg` of the study's rounds so far (``narrow``: the phone
    layout), or a message saying why there is none yet (no targets, no fitted model, no
    panel)."""
    try:
        history = distribution_history(study, session=session)
    except Exception as exc:
        if not is_user_error(exc):
            raise
        return message_svg(f"No distribution yet: {exc}")
    return distribution_svg(history, narrow=narrow)
