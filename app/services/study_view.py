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
from app.respondent_text import LANGUAGE_NAMES
from app.schemas import StudySettings
from app.services import (
    designer,
    job_views,
    jobs,
    learning,
    model_notes,
    personas,
    setting_words,
)
from app.session import load_runtime
from app.tables import FittedModel, Researcher, Study, StudyShare, StudyStatus
from elicitation.criteria import criterion_names
from elicitation.model_choice import BELIEF_MODEL_CHOICES

ITEM_ROLES = ("question", "attribute", "target")


def study_item_context(study: Study, *, session: Session) -> dict[str, Any]:
    """What one item row of the designer needs besides the item: ``study``, ``roles``."""
    return {"study": study, "roles": ITEM_ROLES}


def study_overview(study: Study, *, session: Session) -> dict[str, Any]:
    """The designer page's context: ``study``, ``items``, ``settings`` (validated),
    ``criteria`` (those that can run with the study's belief model), ``criterion_help``,
    ``belief_models`` (value, label by the family it fits), ``belief_model_help``,
    ``stopping_help``, ``languages`` (code, name: the respondent pages' languages),
    ``shares`` (researchers), ``owner``, ``roles``, ``fitted_model``
    (:func:`active_model_row`), ``serving`` (:func:`serving_summary`), ``model_versions``
    (:func:`app.services.learning.model_versions`), ``refit_job`` (the fit job queued or
    running, if any), ``refit_waiting`` (what a queued one waits behind, in words:
    :func:`app.services.job_views.waiting_words`), ``open_round`` (the number of the open
    group round, or ``None``), ``rounds_asked`` (the round questions asked so far:
    :func:`app.services.designer.round_questions_asked`), ``failed_refit`` (the last fit
    job when it failed after the newest model version: :func:`app.services.model_notes.failed_refit`),
    ``choice_sizes`` (the validation respondents behind each listed ``auto`` fit's
    comparison, by model id: :func:`app.services.model_notes.choice_sizes`) and, for a
    published study whose prior is uniform, ``prior_warning``
    (:func:`app.services.personas.uniform_prior_warning`)."""
    settings = StudySettings.model_validate(study.settings or {})
    refit_job = learning.active_fit_job(study.id or 0, session=session)
    ahead = jobs.jobs_ahead([refit_job], session=session) if refit_job else {}
    fitted = active_model_row(study, session=session)
    versions = learning.model_versions(study.id or 0, session=session)
    return {
        **study_item_context(study, session=session),
        "items": designer.study_items(study, session=session),
        "settings": settings,
        "criteria": setting_words.criteria_for(settings.belief_model),
        "all_criteria": criterion_names(),
        "criterion_help": setting_words.CRITERION_HELP,
        "criterion_models": {
            c: [m for m in BELIEF_MODEL_CHOICES if setting_words.criterion_runs_with(c, m)]
            for c in criterion_names()
        },
        "shares": study_shares(study, session=session),
        "owner": session.get(Researcher, study.owner_id) if study.owner_id else None,
        "fitted_model": fitted,
        "belief_models": [
            (m, setting_words.BELIEF_MODEL_LABELS.get(m, m)) for m in BELIEF_MODEL_CHOICES
        ],
        "belief_model_help": setting_words.BELIEF_MODEL_HELP,
        "stopping_help": setting_words.STOPPING_HELP,
        "languages": list(LANGUAGE_NAMES.items()),
        "name_max_len": designer.NAME_MAX_LEN,
        "serving": serving_summary(study, session=session),
        "model_versions": versions,
        "choice_sizes": model_notes.choice_sizes(versions, fitted),
        "refit_job": refit_job,
        "failed_refit": model_notes.failed_refit(study, session=session),
        "refit_waiting": job_views.waiting_words(*ahead[refit_job.id or 0])
        if refit_job and refit_job.id in ahead
        else "",
        "open_round": designer.open_round_number(study, session=session),
        "rounds_asked": designer.round_questions_asked(study, session=session),
        "prior_warning": (
            personas.uniform_prior_warning(study, session=session)
            if study.status == StudyStatus.published.value
            else None
        ),
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
    """The active fitted model's ``id``, ``family``, ``metrics``, ``created_at`` (not its
    blob) and ``label`` (:func:`app.services.setting_words.describe_fit`), or ``None``."""
    row = session.exec(
        select(FittedModel.id, FittedModel.family, FittedModel.metrics, FittedModel.created_at)
        .where(FittedModel.study_id == study.id, col(FittedModel.is_active))
        .order_by(col(FittedModel.id).desc())
    ).first()
    keys = ("id", "family", "metrics", "created_at")
    if row is None:
        return None
    out = dict(zip(keys, row, strict=True))
    out["label"] = setting_words.describe_fit(out["family"], out["metrics"])
    return out


def serving_summary(study: Study, *, session: Session) -> dict[str, Any] | None:
    """What live sessions are chosen with now: ``criterion`` (the one in use),
    ``requested`` (the one the settings ask for while it waits for a fixed order, else
    ``None``), ``order_length`` (the stored fixed order's length, else ``None``) and
    ``calibration``: ``{"places": calibration places per session now, "threshold":
    calibration_min_answers, "under_observed": [(key, answers)] fewest first, at most 5,
    "n_under_observed": how many items are under the threshold}`` (``places`` 0 once every
    item is observed often enough, see :attr:`app.session.StudyRuntime.calibration_items`).
    ``None`` without a fitted model or with settings no runtime can be built from."""
    try:
        rt = load_runtime(study, session=session, fit_if_missing=False)
    except PriorlyError:
        return None
    fixed = getattr(rt.selector, "fixed", rt.selector)
    order = getattr(fixed, "order", None) if rt.requested_criterion is None else None
    counts = rt.item_answers or {}
    under = sorted((counts.get(it.id, 0), it.key) for it in rt.under_observed)
    return {
        "criterion": rt.criterion,
        "requested": rt.requested_criterion,
        "order_length": len(order) if order else None,
        "calibration": {
            "places": rt.calibration_items,
            "threshold": rt.settings.calibration_min_answers,
            "under_observed": [(key, n) for n, key in under[:5]],
            "n_under_observed": len(under),
        },
    }
