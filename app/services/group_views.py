"""Group elicitation rounds as the admin pages show them: the rounds page and one round
with its members' personal links (absolute URLs).
"""

from __future__ import annotations

import io
from typing import Any

from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from sqlmodel import Session, select

from app.errors import NotFoundError, is_user_error
from app.services import group_rounds, round_tracking
from app.services.job_views import kind_overview
from app.tables import FittedModel, Study


def groups_overview(study: Study, *, session: Session) -> dict[str, Any]:
    """The rounds page: :func:`~app.services.job_views.kind_overview` of the planning jobs,
    the study's ``rounds``, whether one is open (``round_open``), the group budget's
    ``usage``, and ``can_open``: the latest plan can be opened as a round (the study is
    published, no round is open and the plan was made after the last round)."""
    ctx = kind_overview(study, "plan_group_round", session=session)
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
        "selections": group_rounds.SELECTION_LABELS,
        "no_gnn": relational_unavailable(study, session=session),
        "can_open": can_open,
        "round_open": is_open,
        "rounds": rounds,
        "usage": round_tracking.budget_usage(study, session=session),
    }


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


def round_page(
    study: Study, number: int, *, session: Session, secret: str, link_base: str
) -> dict[str, Any]:
    """One round's page: ``study``, ``rv`` (:func:`round_members`), the group budget's
    ``usage`` and the round's ``fingerprint`` (:func:`round_unchanged`)."""
    view = round_members(study, number, session=session, secret=secret, link_base=link_base)
    return {
        "study": study,
        "rv": view,
        "usage": round_tracking.budget_usage(study, session=session),
        "fingerprint": round_tracking.round_fingerprint(view.round, session=session),
    }


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


_COLOURS = ("#2457a6", "#c0392b", "#7f8c8d", "#27ae60", "#8e44ad", "#d35400", "#16a085")
MAX_PLOTTED_TARGETS = 8


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def distribution_svg(history: dict[str, Any]) -> str:
    """The imputed group distribution of each target, round by round: one panel per
    target (at most :data:`MAX_PLOTTED_TARGETS`), one line per option (the panel's share)
    with a band of two standard errors (:func:`group_rounds.distribution_history`).

    A standalone ``<svg>`` document (matplotlib escapes the labels, which come from the
    database; pages embed it through ``<img>``)."""
    targets = history["targets"][:MAX_PLOTTED_TARGETS]
    rounds = history["rounds"]
    cols = min(2, max(1, len(targets)))
    rows = (len(targets) + cols - 1) // cols
    fig = Figure(figsize=(5.2 * cols, 2.9 * rows + 0.5), dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, t in zip(axes.flat, targets, strict=False):
        for o, label in enumerate(t["labels"]):
            m = [step[o] for step in t["mean"]]
            se = [step[o] for step in t["se"]]
            c = _COLOURS[o % len(_COLOURS)]
            ax.plot(rounds, m, marker="o", markersize=3, color=c, label=_short(label, 28))
            ax.fill_between(
                rounds,
                [max(0.0, a - 2 * b) for a, b in zip(m, se, strict=True)],
                [min(1.0, a + 2 * b) for a, b in zip(m, se, strict=True)],
                color=c,
                alpha=0.15,
                linewidth=0,
            )
        ax.set_title(_short(f"{t['item']}: {t['question']}", 60), fontsize=9)
        ax.set_xticks(rounds)
        ax.set_ylim(0, 1)
        ax.set_xlabel("closed rounds", fontsize=8)
        ax.set_ylabel("share of the panel", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper right")
    for ax in list(axes.flat)[len(targets) :]:
        ax.set_visible(False)
    model = "belief model and GNN" if history.get("uses_gnn") else "belief model"
    fig.suptitle(
        f"Imputed target distribution of the panel ({model}); bands: ±2 standard errors",
        fontsize=10,
    )
    fig.tight_layout()
    buf = io.StringIO()
    FigureCanvasSVG(fig).print_svg(buf)
    return buf.getvalue()


def message_svg(text: str) -> str:
    """A small SVG that says ``text`` (where a plot cannot be drawn yet)."""
    fig = Figure(figsize=(6.2, 0.9), dpi=100)
    fig.text(0.02, 0.5, _short(text, 110), fontsize=9, va="center")
    buf = io.StringIO()
    FigureCanvasSVG(fig).print_svg(buf)
    return buf.getvalue()


def group_distribution_svg(study: Study, *, session: Session) -> str:
    """:func:`distribution_svg` of the study's rounds so far, or a message saying why
    there is none yet (no targets, no fitted model, no panel)."""
    try:
        history = group_rounds.distribution_history(study, session=session)
    except Exception as exc:
        if not is_user_error(exc):
            raise
        return message_svg(f"No distribution yet: {exc}")
    return distribution_svg(history)
