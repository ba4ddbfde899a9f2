"""What each study setting means, and which criteria a belief model can run: the labels
and plain-language help the study page shows, and the rules the settings form checks
(:func:`app.services.designer.update_settings`)."""

from __future__ import annotations

from typing import Any

from elicitation.criteria import criterion_names
from models.cape_cooccurrence import CapeCooccurrence
from models.cape_factor import CapeFactor
from models.cape_linear import CapeLinear
from models.cape_mixture import StackedMixture
from models.persona import PersonaMixture

CRITERION_NEEDS: dict[str, str] = {
    "posterior_entropy": "latent_posterior",
    "irt": "theta_posterior",
}
"""The model method a criterion needs beyond the common interface (``models.base``)."""

BELIEF_MODEL_CLASSES: dict[str, tuple[type, ...]] = {
    "default": (PersonaMixture,),
    "persona_mixture": (PersonaMixture,),
    "auto": (StackedMixture,),
    "cape_cooccurrence": (CapeCooccurrence,),
    "cape_linear": (CapeLinear,),
    "cape_factor": (CapeFactor,),
}
"""The model classes each ``belief_model`` setting fits (``default``: latent classes, a
:class:`PersonaMixture`)."""

BELIEF_MODEL_LABELS: dict[str, str] = {
    "default": "latent classes (default)",
    "auto": "automatic choice (latent classes or CAPE, best on validation)",
    "cape_cooccurrence": "CAPE co-occurrence",
    "cape_linear": "CAPE linear factor",
    "cape_factor": "CAPE latent factor (Pyro)",
    "persona_mixture": "language-model personas",
}
"""How the settings form names each belief model: by the family it fits."""

FAMILY_LABELS: dict[str, str] = {
    "latent_class": "latent classes",
    "persona_mixture": "language-model personas",
    "stacked_mixture": "automatic choice (stacked mixture)",
    **{k: v for k, v in BELIEF_MODEL_LABELS.items() if k.startswith("cape_")},
}
"""A fitted model's family in words (unknown families are shown as stored)."""

CRITERION_HELP: dict[str, str] = {
    "eig_anchored": (
        "Asks the question expected to tell you most about the target items, but prefers "
        "to keep a fixed, precomputed order unless another question is clearly better, "
        "judged only as far as the model's data on each question support it. "
        "The recommended choice: nearly as informative as full adaptivity, and respondents "
        "with similar answers see similar questionnaires."
    ),
    "eig": (
        "Each time asks the question expected to reduce uncertainty about the target items "
        "the most (expected information gain). Pick it for the most adaptive survey."
    ),
    "eig_tempered": (
        "Like eig, but judges questions under a deliberately less certain belief, so it "
        "explores more early on. Pick it when eig keeps asking very similar questions."
    ),
    "eig2": (
        "Looks two questions ahead instead of one. Slower per answer; pick it when pairs of "
        "questions are informative together but not alone."
    ),
    "fixed": (
        "Everyone gets the same order, chosen once to be as informative as possible on "
        "average. Pick it when every respondent must see the same questionnaire."
    ),
    "random": ("Questions in a random order. Only useful as a baseline to compare against."),
    "posterior_entropy": (
        "Asks what best tells which kind of respondent (latent class or persona) a person "
        "is, ignoring the targets. Pick it to describe respondents rather than predict "
        "targets. Needs latent classes or personas as the belief model."
    ),
    "irt": (
        "Item response theory's adaptive testing: narrows down a single ability score. "
        "Needs an IRT model, which this app does not fit, so it cannot be chosen here."
    ),
}
"""Plain-language help for each selection criterion: what it does, when to pick it."""

BELIEF_MODEL_HELP: dict[str, str] = {
    "default": (
        "Groups past respondents into latent classes of people who answer alike and "
        "predicts a new respondent from the classes their answers match. Robust; the usual "
        "choice when you have imported past responses. A study that starts from personas "
        "keeps its persona prior until a refit's latent classes predict its held-out "
        "respondents better; from then on the personas are no longer used."
    ),
    "auto": (
        "Fits latent classes and the CAPE models (and, with persona distributions, the "
        "persona prior and personas + latent classes), compares them on held-out "
        "respondents and combines the best. Slower to fit; pick it when you have enough "
        "data (hundreds of respondents), or to keep the personas among the candidates at "
        "every refit."
    ),
    "cape_cooccurrence": (
        "Predicts from how often answers occur together in past data. Fast and simple; "
        "good with many respondents and few items."
    ),
    "cape_linear": (
        "A linear factor model of the answers with exact updating. Well calibrated; good "
        "when answers vary along a few broad attitudes."
    ),
    "cape_factor": (
        "A non-linear latent factor model (fitted with Pyro). The most flexible and the "
        "slowest to fit."
    ),
    "persona_mixture": (
        "Uses answers simulated by a language model for a set of personas as the prior. "
        "Pick it when you have no past responses; needs a persona generation job first."
    ),
}
"""Plain-language help for each belief model."""

STOPPING_HELP: dict[str, str] = {
    "max_questions": "The most questions a respondent is asked (after the attribute items).",
    "min_questions": "Always ask at least this many, whatever the stopping rules below say.",
    "stop_eig_threshold": (
        "Stop early when even the best remaining question is expected to teach less than "
        "this (in nats; 0.01 is small). Leave empty to ask up to the maximum."
    ),
    "stop_entropy_threshold": (
        "Stop early once the predictions of the target items are this certain (mean "
        "entropy in nats; 0 is certain, about 0.7 is a coin flip between two options). "
        "Leave empty to ignore."
    ),
    "allow_skip": "Show a 'skip' button; a skipped question counts as asked but not answered.",
    "drop_after_minutes": (
        "On the dashboard, a respondent who has not finished and has done nothing for this "
        "many minutes counts as dropped out; a more recent one counts as still in progress."
    ),
}
"""Plain-language help for the stopping settings."""


def describe_fit(family: str, metrics: dict[str, Any] | None) -> str:
    """A fitted model in words, e.g. ``"latent classes, 516 classes, log-likelihood -12.31
    per selection respondent"`` (what the jobs and designer pages show; the selection
    respondents chose the number of classes; the held-out log loss that promotion compares
    is in the model versions table)."""
    m = metrics or {}
    if m.get("prior") == "uniform":
        return "uniform prior (no respondents, no persona distributions)"
    if m.get("model") == "latent_class":
        parts = ["latent classes"]
    else:
        parts = [FAMILY_LABELS.get(family, family)]
    if isinstance(m.get("n_classes"), int):
        parts.append(f"{m['n_classes']:,} classes")
    if isinstance(m.get("val_log_lik"), (int, float)):
        parts.append(f"log-likelihood {m['val_log_lik']:.2f} per selection respondent")
    chosen = [r for r in m.get("model_choice") or [] if isinstance(r, dict) and r.get("chosen")]
    if chosen and isinstance(chosen[0].get("mean_log_loss"), (int, float)):
        parts.append(
            f"chose {chosen[0].get('name')}, validation target log loss "
            f"{chosen[0]['mean_log_loss']:.2f}"
        )
    return ", ".join(parts)


def criterion_runs_with(criterion: str, belief_model: str) -> bool:
    """Whether the models that ``belief_model`` fits have what ``criterion`` needs."""
    need = CRITERION_NEEDS.get(criterion)
    if need is None:
        return True
    classes = BELIEF_MODEL_CLASSES.get(belief_model, ())
    return bool(classes) and all(hasattr(cls, need) for cls in classes)


def criteria_for(belief_model: str) -> list[str]:
    """The registered criteria that can run with ``belief_model``'s models."""
    return [c for c in criterion_names() if criterion_runs_with(c, belief_model)]
