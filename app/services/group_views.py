"""Group elicitation rounds as the admin pages show them: the rounds page and one round
with its members' personal links (absolute URLs).
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from app.services import group_rounds
from app.services.job_views import kind_overview
from app.tables import Study


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
        "can_open": can_open,
        "round_open": is_open,
        "rounds": rounds,
        "usage": group_rounds.budget_usage(study, session=session),
    }


def round_members(
    study: Study, number: int, *, session: Session, secret: str, link_base: str
) -> group_rounds.RoundView:
    """Round ``number`` of ``study`` with its members' status and personal links
    (``link_base`` + token); :class:`NotFoundError` for a round that does not exist."""
    return group_rounds.round_view(
        study,
        group_rounds.get_round(study, number, session=session),
        session=session,
        secret=secret,
        link_base=link_base,
    )


def round_page(
    study: Study, number: int, *, session: Session, secret: str, link_base: str
) -> dict[str, Any]:
    """One round's page: ``study``, ``rv`` (:func:`round_members`) and the group budget's
    ``usage``."""
    view = round_members(study, number, session=session, secret=secret, link_base=link_base)
    return {"study": study, "rv": view, "usage": group_rounds.budget_usage(study, session=session)}


def round_links_csv(
    study: Study, number: int, *, session: Session, secret: str, link_base: str
) -> str:
    """Round ``number``'s members with their personal links as CSV text (a mail merge)."""
    view = round_members(study, number, session=session, secret=secret, link_base=link_base)
    return group_rounds.links_csv(view)
