"""What the study designer page shows about one study, read in one place.

:func:`study_overview` gathers the study's items and settings, the choices the settings
form offers (criteria, belief models), who owns the study and whom it is shared with, the
active fitted model (id, family, metrics, date; not its blob) and what live sessions are
served with now (:func:`serving_summary`).
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, col, select

from app.errors import PriorlyError
from app.schemas import StudySettings
from app.services import designer
from app.session import load_runtime
from app.tables import FittedModel, Researcher, Study, StudyShare
from elicitation.criteria import criterion_names
from elicitation.model_choice import BELIEF_MODEL_CHOICES

ITEM_ROLES = ("question", "attribute", "target")


def study_overview(study: Study, *, session: Session) -> dict[str, Any]:
    """The designer page's context: ``study``, ``items``, ``settings`` (validated),
    ``criteria``, ``shares`` (researchers), ``owner``, ``roles``, ``fitted_model``
    (:func:`active_model_row`), ``belief_models`` and ``serving`` (:func:`serving_summary`)."""
    return {
        "study": study,
        "items": designer.study_items(study, session=session),
        "settings": StudySettings.model_validate(study.settings or {}),
        "criteria": criterion_names(),
        "shares": study_shares(study, session=session),
        "owner": session.get(Researcher, study.owner_id) if study.owner_id else None,
        "roles": ITEM_ROLES,
        "fitted_model": active_model_row(study, session=session),
        "belief_models": BELIEF_MODEL_CHOICES,
        "serving": serving_summary(study, session=session),
    }


def study_shares(study: Study, *, session: Session) -> list[Researcher]:
    """The researchers ``study`` is shared with."""
    return list(
        session.exec(
            select(Researcher)
            .join(StudyShare, col(StudyShare.researcher_id) == col(Researcher.id))
            .where(StudyShare.study_id == study.id)
        ).all()
    )


def active_model_row(study: Study, *, session: Session) -> dict[str, Any] | None:
    """The active fitted model's ``id``, ``family``, ``metrics`` and ``created_at`` (not its
    blob), or ``None`` without one."""
    row = session.exec(
        select(FittedModel.id, FittedModel.family, FittedModel.metrics, FittedModel.created_at)
        .where(FittedModel.study_id == study.id, col(FittedModel.is_active))
        .order_by(col(FittedModel.id).desc())
    ).first()
    keys = ("id", "family", "metrics", "created_at")
    return None if row is None else dict(zip(keys, row, strict=True))


def serving_summary(study: Study, *, session: Session) -> dict[str, Any] | None:
    """What live sessions are chosen with now: ``criterion`` (the one in use),
    ``requested`` (the one the settings ask for while it waits for a fixed order, else
    ``None``) and ``order_length`` (the stored fixed order's length, else ``None``).
    ``None`` without a fitted model or with settings no runtime can be built from."""
    try:
        rt = load_runtime(study, session=session, fit_if_missing=False)
    except PriorlyError:
        return None
    fixed = getattr(rt.selector, "fixed", rt.selector)
    order = getattr(fixed, "order", None) if rt.requested_criterion is None else None
    return {
        "criterion": rt.criterion,
        "requested": rt.requested_criterion,
        "order_length": len(order) if order else None,
    }
