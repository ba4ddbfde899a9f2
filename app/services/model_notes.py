"""What the admin pages say about where a study's belief model stands.

* :func:`failed_refit`: the study's last ``fit_model`` job when it failed after the newest
  model version, shown beside "Refit now";
* :func:`choice_size` and :data:`FEW_CHOICE_RESPONDENTS`: how many validation respondents
  ``auto``'s comparison table rests on, and when that is few;
* :func:`uniform_prior_notice`: the uniform-prior warning with what works for this study;
* :func:`persona_use`: what generating persona distributions leads to under the study's
  ``belief_model`` setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from sqlmodel import Session, col, func, select

from app.schemas import StudySettings
from app.services import learning
from app.services.belief import answers_a_question
from app.services.designer import study_items
from app.services.setting_words import BELIEF_MODEL_LABELS
from app.tables import FittedModel, Study, as_utc

CHOICE_SIZE_KEY = "model_choice_respondents"
"""The ``metrics`` key of an ``auto`` fit holding the validation respondents its comparison
rests on: those of the fit's selection part with an answer to some target item
(:func:`elicitation.model_choice.fit_auto` records it; ``choose_model`` scores no other)."""

FEW_CHOICE_RESPONDENTS = 100
"""Below this many validation respondents, ``auto``'s comparison table carries a caution:
docs/models.md measured that with a few dozen validation respondents ``auto`` can pick a
worse model than the best single one, and that it needs a few hundred."""


def failed_refit(study: Study, *, session: Session) -> dict[str, Any] | None:
    """The study's latest ``fit_model`` job when it failed
    (:func:`app.services.learning.failed_fit_job`) and failed after the newest model
    version was stored: ``{"job", "at" (when it failed, UTC), "reason" (what queued it,
    e.g. "refit now"), "error"}``; ``None`` when the latest fit succeeded, is queued or
    running, or a model version came after the failure."""
    job = learning.failed_fit_job(study.id or 0, session=session)
    if job is None:
        return None
    at = as_utc(job.finished_at or job.created_at)
    newest = session.exec(
        select(func.max(FittedModel.created_at)).where(
            FittedModel.study_id == study.id, col(FittedModel.family) != "gnn"
        )
    ).one()
    if newest is not None and as_utc(newest) >= at:
        return None
    return {
        "job": job,
        "at": at,
        "reason": str((job.payload or {}).get("reason") or ""),
        "error": (job.error or "no reason recorded").strip(),
    }


def choice_size(metrics: dict[str, Any] | None) -> dict[str, Any] | None:
    """How many validation respondents an ``auto`` fit's comparison rests on: ``{"n",
    "few": n < FEW_CHOICE_RESPONDENTS, "threshold"}``; ``None`` for a fit without the
    count (not ``auto``, or stored before it was recorded)."""
    n = (metrics or {}).get(CHOICE_SIZE_KEY)
    if not isinstance(n, int):
        return None
    return {"n": n, "few": n < FEW_CHOICE_RESPONDENTS, "threshold": FEW_CHOICE_RESPONDENTS}


def choice_sizes(
    versions: Sequence[learning.ModelVersion], fitted: dict[str, Any] | None
) -> dict[int, dict[str, Any]]:
    """:func:`choice_size` of each listed model version and of the active model
    (``fitted``: :func:`app.services.study_view.active_model_row`) that has one, by id."""
    sizes = {
        v.id: choice_size({CHOICE_SIZE_KEY: v.choice_respondents}) for v in versions if v.choice
    }
    if fitted is not None:
        sizes[int(fitted["id"])] = choice_size(fitted.get("metrics"))
    return {mid: size for mid, size in sizes.items() if size is not None}


TO_USE_PERSONAS = (
    "To fit with the persona prior, choose the belief model “language-model personas” "
    "(the personas alone) or “automatic choice” (the personas compete with the other "
    "models) on the Design page before refitting."
)
"""How a study whose fits leave the personas out gets them in (:func:`persona_use`)."""


def persona_use(study: Study, *, session: Session) -> str:
    """What generating persona distributions leads to for this study, in words, from its
    ``belief_model`` setting and whether it has respondents a fit learns from (the fit's
    training and selection parts, :func:`app.services.learning.study_training_data`):

    * none, or only respondents who gave no answer to a question or target item
      (:func:`app.services.belief.answers_a_question`): a fit is the persona prior
      itself, whatever the setting;
    * ``persona_mixture``: the persona prior, its weights refitted on the respondents;
    * ``auto``: the personas are candidates of the comparison;
    * ``default`` (latent classes): the classes are learnt from the respondents and the
      personas only predict items nobody answered (the classes' base);
    * a CAPE family: the personas are not used.
    """
    kind = StudySettings.model_validate(study.settings or {}).belief_model
    items = study_items(study, session=session)
    data = learning.study_training_data(study.id or 0, items, session=session) if items else None
    n = data.n_imported + data.n_live if data is not None else 0
    refit = "Afterwards, refit the model (“Refit now” on the Design page): "
    if n == 0:
        return (
            refit + "the study has no respondents to learn from yet, so the fit is the "
            "persona prior itself."
        )
    people = f"{n:,} respondent{'' if n == 1 else 's'}"
    assert data is not None
    if not answers_a_question(torch.cat([data.train, data.selection]), items):
        return (
            refit + f"the study's {people} gave only their attributes, no answer to a "
            "question or target item yet, so the fit is the persona prior itself, its "
            "weights refitted on their attributes."
        )
    promoted = " It replaces the active model only if it predicts the held-out respondents better."
    if kind == "persona_mixture":
        return (
            refit + "with the belief model “language-model personas” the fit is the persona "
            f"prior, its weights refitted on the study's {people}." + promoted
        )
    if kind == "auto":
        return (
            refit + "with the belief model “automatic choice” the persona prior and personas + "
            "latent classes compete with latent classes and the CAPE models on the "
            "validation respondents, and the personas are used only if they win." + promoted
        )
    label = BELIEF_MODEL_LABELS.get(kind, kind)
    if kind == "default":
        return (
            f"This study's belief model is “{label}” and it has {people} to learn from, so "
            "a refit learns latent classes from them and does not use the persona prior: "
            "the personas only set how items no respondent has answered yet are predicted. "
            + TO_USE_PERSONAS
        )
    return (
        f"This study's belief model is “{label}”, which does not use personas: a refit "
        f"learns from its {people} only. " + TO_USE_PERSONAS
    )
