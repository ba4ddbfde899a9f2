"""A study's belief model: fit it from the study's respondents, store and load it.

A live session needs a fitted belief model (:mod:`models`). When a study has historical
(imported) respondents and no active fitted model, :func:`ensure_fitted_model` fits the
default one and stores it in ``fitted_model`` (active):

* **family**: latent classes (:func:`models.latent_class.fit_latent_classes`), i.e. a
  persona mixture whose personas are fitted by EM. It is a joint model of *every* item of
  the study (attributes, questions and targets), so any item can be conditioned on or
  predicted, whatever roles the designer later gives the items.
* **data**: the study's imported and live respondents, split stably into training,
  selection and held-out parts (:mod:`app.services.learning`). The selection part chooses
  the number of classes (validation log-likelihood, then a refit on train + selection);
  the held-out part is never fitted on: a new fit is promoted over the active model only
  when it scores better there, else it is stored as ``rejected``.
* **classes**: :data:`DEFAULT_N_CLASSES` candidates, :data:`DEFAULT_RESTARTS` restarts.
* **prior**: with stored persona distributions, the Dirichlet pseudo-counts of the class
  distributions follow the persona prior's population predictive
  (:func:`population_predictive`), so an item no respondent has answered yet (a target
  before the calibration questions reach it) keeps what the language model said about it
  instead of becoming uniform; without persona distributions they are uniform.

The fitted model's ``training_hash`` identifies its data; :func:`load_active_model` keeps
one deserialised model per process, cached by ``(fitted_model.id, training_hash)``, so
a worker reads a model blob once, and a newly activated model (new id) is picked up on
the next request without any invalidation message between processes.

The ``fit_model`` job (:mod:`app.jobs.tasks`) calls :func:`fit_study_model`.

**The fixed order.** The criteria ``eig_anchored`` (the default of new studies) and
``fixed`` need the study's non-adaptive question order
(:class:`elicitation.criteria.FixedOrder`: a greedy search under the model's prior, from a
fraction of a second for a small model to the CPU seconds that docs/benchmarks.md
(``priorly bench speed``) gives for 86 candidates and 2,058 personas). It is never
computed while a respondent waits: :func:`ensure_fixed_order` computes it when the model
is fitted (:func:`fit_study_model`, so the ``fit_model`` job) and when a study is prepared
for fielding (the bundled demo), and stores it in the model row's
``metrics["fixed_orders"]`` under :func:`fixed_order_key` (the model's ``training_hash``,
the candidate pool and the target set in study order, and the order's parameters), so a
change of roles after the fit finds no stored order. The live loop (:mod:`app.session`)
loads it into the cached study runtime; when it is missing the study is served with
``eig`` meanwhile (recorded in every decision) and :func:`request_fixed_order` queues a
``fixed_order`` job that computes and stores it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from sqlmodel import Session, select

import models  # noqa: F401  (registers every model family with models.base.load_model)
from app.errors import ConflictError, InvalidInputError
from app.gcfreeze import freeze_long_lived
from app.schemas import StudySettings
from app.services import learning
from app.services.jobs import ACTIVE, start_job
from app.services.persona_models import prior_group
from app.services.personas import item_prompt_hash
from app.settings import get_settings
from app.tables import (
    FittedModel,
    Item,
    ItemRole,
    Job,
    ModelStatus,
    PersonaDistribution,
    Study,
    StudyPersona,
)
from elicitation.criteria import FixedOrder, get_criterion
from elicitation.errors import ElicitationError
from elicitation.model_choice import BELIEF_MODEL_CHOICES, fit_belief_model
from models.base import BeliefModel, ItemBank, load_model, responses_hash
from models.latent_class import DEFAULT_N_CLASSES as LC_DEFAULT_N_CLASSES
from models.latent_class import DEFAULT_RESTARTS as LC_DEFAULT_RESTARTS
from models.persona import PersonaMixture
from models.persona_fit import compress_for_live, fit_prior_em

# The benchmark's ``default`` fit (models.latent_class defaults): what the study serves is
# what docs/benchmarks.md measures.
DEFAULT_N_CLASSES: tuple[int, ...] = LC_DEFAULT_N_CLASSES
DEFAULT_RESTARTS = LC_DEFAULT_RESTARTS
DEFAULT_FAMILY = "persona_mixture"
PERSONA_ATTRIBUTE_EPSILON = 0.01
"""The persona prior's ``ε`` on a persona's own attribute values: ``1 − ε`` on the
persona's option, ``ε / (O − 1)`` on each other (docs/methods.md §1.2), so a respondent
whose attributes match no persona still gets a posterior (:func:`persona_prior_model`)."""


class NoModelError(ConflictError):
    """The study has no fitted model and no historical respondents to fit one from."""

    code = "no_model"


def item_bank_of(items: Sequence[Item]) -> ItemBank:
    """The :class:`models.ItemBank` of a study's items (keys in ``items`` order)."""
    return ItemBank(tuple(i.key for i in items), tuple(len(i.options) for i in items))


def _study_items(study_id: int, *, session: Session) -> list[Item]:
    return list(
        session.exec(
            select(Item).where(Item.study_id == study_id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
        ).all()
    )


def historical_matrix(
    study_id: int, items: Sequence[Item], *, session: Session
) -> tuple[torch.Tensor, torch.Tensor]:
    """The imported respondents as response matrices ``(train [N, I], val [N_val, I])``,
    each in respondent id order (:func:`app.services.learning.imported_rows`; ``val``
    those of split ``val``).

    Cells are option indices in ``item.options`` order, ``-1`` where missing. Letters that
    are not an option of the item (possible only if the codebook was edited after the
    import) are treated as missing.
    """
    train: list[list[int]] = []
    val: list[list[int]] = []
    for _, row, split in learning.imported_rows(study_id, items, session=session):
        (val if split == "val" else train).append(row)
    n = len(items)
    as_t = lambda r: torch.tensor(r, dtype=torch.long).reshape(-1, n)  # noqa: E731
    return as_t(train), as_t(val)


def fit_study_model(
    study: Study,
    *,
    session: Session,
    n_classes: Sequence[int] = DEFAULT_N_CLASSES,
    n_restarts: int = DEFAULT_RESTARTS,
    seed: int = 0,
    belief_model: str | None = None,
    fit_options: dict[str, dict[str, object]] | None = None,
    progress: Callable[[float, str], None] | None = None,
    force: bool = False,
) -> FittedModel:
    """Fit a new version of the study's belief model; promote it only if it beats the
    active one on the study's held-out respondents (the learning loop,
    :mod:`app.services.learning`).

    The data are the study's imported and live respondents
    (:func:`app.services.learning.study_training_data`): the fit uses the training part
    (its ``selection`` part chooses the number of classes, ``auto``'s candidate...), never
    the held-out one. ``belief_model`` (default: the study's ``settings["belief_model"]``,
    else ``"default"``) is one of :data:`elicitation.model_choice.BELIEF_MODEL_CHOICES`:
    latent classes, ``auto`` (:func:`elicitation.model_choice.fit_auto`: the best on
    validation of latent classes, the CAPE models, the study's persona prior and personas
    + latent classes, or their stack when it is better by more than its standard error;
    the comparison table, skipped candidates included, lands in
    ``metrics["model_choice"]``), a CAPE family, or the
    study's persona prior (:func:`persona_prior_model`). A study without respondents
    gets the persona prior (or a uniform prior when no persona distributions are stored),
    with ``metrics["notice"]`` saying so.

    The new row records its training counts, its held-out score and the active model's,
    and the verdict (:func:`app.services.learning.judge`): ``promoted`` (the study's other
    models are deactivated in the same transaction, and its fixed order is computed) or
    ``rejected`` (stored inactive; the active model stays). ``force`` promotes it whatever
    the scores (still recorded). ``progress(fraction, message)`` reports the fit's
    progress (see :func:`elicitation.model_choice.fit_belief_model`).

    Raises:
        InvalidInputError: a study without question or target items; ``auto`` on a study
            without target or question items.
    """
    assert study.id is not None
    items = _study_items(study.id, session=session)
    if not any(it.role != ItemRole.attribute.value for it in items):
        raise InvalidInputError(
            f"study {study.slug!r} has no question or target items to model: add them in "
            "the designer (Items), then refit"
        )
    data = learning.study_training_data(study.id, items, session=session)
    kind = belief_model or str((study.settings or {}).get("belief_model") or "default")
    model = _fit_by_kind(
        kind, study, items, data.train, data.selection, session, n_classes, n_restarts, seed,
        fit_options, progress,
    )  # fmt: skip
    everyone = torch.cat([data.train, data.selection, data.holdout])
    model.metrics[ITEM_ANSWERS_KEY] = {
        it.key: int(n) for it, n in zip(items, (everyone >= 0).sum(0).tolist(), strict=True)
    }
    if not model.training_hash:  # the CAPE fits set none: the data and family identify it
        model.training_hash = f"{model.family}:" + responses_hash(
            torch.cat([data.train, data.selection]), item_bank_of(items)
        )
    active_row = active_model_row(study.id, session=session)
    verdict = learning.judge(
        model,
        learning.load_row_model(active_row),
        data.holdout,
        force=force,
        unscored_replaces=data.n_imported + data.n_live == 0
        or (active_row is not None and (active_row.metrics or {}).get("prior") == "uniform"),
    )
    promoted = verdict.status == ModelStatus.promoted.value
    if promoted:
        for old in session.exec(
            select(FittedModel).where(FittedModel.study_id == study.id, FittedModel.is_active)  # type: ignore[arg-type]
        ).all():
            old.is_active = False
            session.add(old)
    row = FittedModel(
        study_id=study.id,
        family=model.family,
        blob=model.to_bytes(),
        training_hash=model.training_hash or "",
        metrics=_jsonable(model.metrics),
        is_active=promoted,
        status=verdict.status,
        reason=verdict.reason[:500],
        val_log_lik=verdict.score,
        active_val_log_lik=verdict.active_score,
        n_imported=data.n_imported,
        n_live=data.n_live,
        n_validation=data.n_holdout,
    )
    session.add(row)
    session.commit()
    session.refresh(row)
    if promoted:
        try_ensure_fixed_order(study, session=session, row=row, model=model)
    return row


def _fit_by_kind(  # type: ignore[no-untyped-def]
    kind: str,
    study: Study,
    items: Sequence[Item],
    train: torch.Tensor,
    val: torch.Tensor,
    session: Session,
    n_classes: Sequence[int],
    n_restarts: int,
    seed: int,
    fit_options: dict[str, dict[str, object]] | None = None,
    progress: Callable[[float, str], None] | None = None,
):
    """The fitted model of :func:`fit_study_model` (logic in ``elicitation.model_choice``)."""
    if kind not in BELIEF_MODEL_CHOICES:
        raise InvalidInputError(
            f"belief_model: unknown {kind!r} (known: {', '.join(BELIEF_MODEL_CHOICES)})"
        )
    history = torch.cat([train, val]) if val.shape[0] else train
    if not answers_a_question(history, items) or kind == "persona_mixture":
        return persona_prior_model(study, items, session=session, history=history)
    role = {r: [j for j, it in enumerate(items) if it.role == r.value] for r in ItemRole}
    personas = None
    latent_class_options: dict[str, object] = {
        "n_classes": tuple(n_classes), "n_restarts": n_restarts
    }  # fmt: skip
    if kind in ("default", "auto"):
        prior = persona_prior_model(study, items, session=session)
        if prior.metrics.get("prior") == "persona":
            personas = prior.mu if kind == "auto" else None  # auto's persona candidates
            latent_class_options["base"] = population_predictive(prior)
    try:
        return fit_belief_model(
            kind,
            train,
            val,
            item_bank_of(items),
            demographics=role[ItemRole.attribute],
            candidates=role[ItemRole.question],
            targets=role[ItemRole.target],
            seed=seed,
            latent_class_options=latent_class_options,
            fit_options=fit_options,
            progress=progress,
            personas=personas,
        )
    except ElicitationError as exc:
        raise InvalidInputError(f"belief_model {kind!r}: {exc}") from None


def answers_a_question(history: torch.Tensor, items: Sequence[Item]) -> bool:
    """Whether any row of ``history`` ``[N, I]`` (``-1`` missing) answers a question or
    target item: respondents who gave only their attributes say nothing about the
    questions, so a study with only those keeps its persona prior (which conditions on
    the attributes) instead of latent classes fitted on no answers."""
    asked = [j for j, it in enumerate(items) if it.role != ItemRole.attribute.value]
    return bool(history.shape[0]) and bool((history[:, asked] >= 0).any())


PERSONA_PRIOR_STRENGTH = 10.0
"""How many respondents the personas' weights count as when a study's persona prior is
refitted by EM on its respondents (:func:`persona_prior_model`): with 2 respondents the
weights move by at most 2/12, with 500 the data hold 98 % of the say."""


def population_predictive(model: BeliefModel) -> torch.Tensor:
    """A model's answer distribution for a respondent nobody knows anything about, its
    prediction from the prior state: ``[I, O]``; for a persona mixture
    ``p(y_i = k) = Σ_θ π_θ μ[θ, i, k]``.

    The latent classes fitted from a study's respondents take it as the base of their
    Dirichlet pseudo-counts (:func:`models.latent_class.pseudo_counts`): an item nobody has
    answered yet keeps what the persona prior says about the population instead of
    becoming uniform.
    """
    return model.predict(model.initial_state())


def persona_prior_model(  # type: ignore[no-untyped-def]
    study: Study, items: Sequence[Item], *, session: Session, history: torch.Tensor | None = None
):
    """The study's persona prior: a :class:`models.PersonaMixture` over its personas.

    ``mu[persona, item]`` is the stored language-model distribution
    (``persona_distribution``, matched by the persona's text hash and the item wording's
    hash; one ``(model, template)``: :func:`app.services.persona_models.prior_group`, the
    model of the study's newest generation job, so two models' answers never mix; the
    notice names it). An attribute item
    of a persona with a known value (``study_persona.attributes``: built from attribute
    shares or an imported respondent) is near one-hot on that value:
    ``1 − ε`` on it and ``ε / (O − 1)`` on each other option, ``ε =``
    :data:`PERSONA_ATTRIBUTE_EPSILON`, so answering an attribute moves the posterior to
    the personas with that value (``p(θ | a) ∝ p(θ) μ[θ, a, y]``). Other items without a
    distribution (free-text personas' attributes, unscored pairs) are uniform over their
    options. The prior over personas is the personas' weights, or fitted by EM on
    ``history`` when the study has any (:func:`models.persona_fit.fit_prior_em`), with the
    weights as a Dirichlet prior worth :data:`PERSONA_PRIOR_STRENGTH` respondents: the
    first few respondents do not undo a census table, and no persona drops to weight 0. A
    dictionary of more than 2,000 personas is compressed for the live step
    (:func:`models.persona_fit.compress_for_live`: 500 prototypes by Hellinger k-means;
    ``metrics["compressed_from"]``). Without stored distributions the model is a single
    uniform persona: every prediction is uniform until the study has history.
    ``metrics["notice"]`` says which, for the researcher and the JSON API.
    """
    bank = item_bank_of(items)
    mask = bank.option_mask().to(torch.float64)
    uniform = mask / mask.sum(-1, keepdim=True)
    personas = list(
        session.exec(
            select(StudyPersona).where(StudyPersona.study_id == study.id).order_by(StudyPersona.id)  # type: ignore[arg-type]
        ).all()
    )
    item_hash: dict[str, int] = {}
    for j, it in enumerate(items):
        try:
            item_hash[item_prompt_hash(it)] = j
        except Exception:  # an item the prompt builder refuses was never scored
            continue
    rows = []
    if personas and item_hash:
        rows = list(
            session.exec(
                select(PersonaDistribution).where(
                    PersonaDistribution.persona_hash.in_([p.text_hash for p in personas]),  # type: ignore[attr-defined]
                    PersonaDistribution.item_hash.in_(list(item_hash)),  # type: ignore[attr-defined]
                )
            ).all()
        )
    n_hist = int(history.shape[0]) if history is not None else 0
    if n_hist == 0:
        why = "no historical respondents"
    elif history is not None and not answers_a_question(history, items):
        why = f"{n_hist} respondents, none with an answer to a question or target item"
    else:
        why = "the belief_model setting"
    compressed = compression_seconds = None
    if not rows:
        mu = uniform.unsqueeze(0)
        model = PersonaMixture(bank, mu)
        model.metrics = {
            "prior": "uniform",
            "notice": (
                f"Uniform prior ({why}; no persona distributions stored): every prediction "
                "is uniform until a refit learns from live respondents (the calibration "
                "questions teach it the targets). To start better, import historical "
                "respondents or generate persona distributions, then fit the model again."
            ),
        }
    else:
        groups: dict[tuple[str, str], int] = {}
        for r in rows:
            groups[(r.model_id, r.template_version)] = (
                groups.get((r.model_id, r.template_version), 0) + 1
            )
        group = prior_group(study.id or 0, groups, session=session)
        assert group is not None
        model_id, version = group
        index = {p.text_hash: k for k, p in enumerate(personas)}
        mu = uniform.unsqueeze(0).repeat(len(personas), 1, 1)
        filled = 0
        for r in rows:
            if (r.model_id, r.template_version) != (model_id, version):
                continue
            j = item_hash[r.item_hash]
            probs = torch.tensor(r.probs, dtype=torch.float64)
            if probs.numel() != bank.n_options[j] or float(probs.sum()) <= 0:
                continue
            mu[index[r.persona_hash], j, : probs.numel()] = probs / probs.sum()
            filled += 1
        conditioned = _persona_attribute_rows(mu, personas, items, bank)
        weights = torch.tensor([max(p.weight, 0.0) for p in personas], dtype=torch.float64)
        log_prior = (weights / weights.sum()).log() if float(weights.sum()) > 0 else None
        model = PersonaMixture(bank, mu, log_prior, labels=[p.key for p in personas])
        prior_from = "the personas' weights"
        if n_hist and history is not None:
            log_prior, _ = fit_prior_em(
                model,
                history,
                base=weights if float(weights.sum()) > 0 else None,
                strength=PERSONA_PRIOR_STRENGTH,
            )
            model = PersonaMixture(bank, mu, log_prior, labels=[p.key for p in personas])
            prior_from = (
                f"EM on {n_hist} respondents, the personas' weights counting as "
                f"{PERSONA_PRIOR_STRENGTH:g}"
            )
        model = compress_for_live(model)
        compressed = model.metrics.get("compressed_from")
        compression_seconds = model.metrics.get("compression_seconds")
        model.metrics = {
            "prior": "persona",
            "n_personas": len(personas),
            "distributions": filled,
            "attribute_personas": conditioned,
            "llm": model_id,
            "template_version": version,
            "notice": (
                f"Persona prior ({why}): {len(personas)} language-model personas "
                f"scored by {model_id}, {filled} persona x item distributions, prior from "
                f"{prior_from}"
                + (
                    f"; distributions by {', '.join(others)} are stored too and not used"
                    if (others := sorted({m for m, _ in groups} - {model_id}))
                    else ""
                )
                + (
                    f"; {conditioned} personas conditioned on their attribute values"
                    if conditioned
                    else ""
                )
                + (
                    f"; compressed to {model.n_personas} prototypes for the live step"
                    if compressed
                    else ""
                )
                + "; other items uniform."
            ),
        }
        if compressed:
            model.metrics["compressed_from"] = compressed
    model.training_hash = (
        "prior:" + hashlib.sha256(mu.numpy().tobytes() + repr(model.metrics).encode()).hexdigest()
    )
    if compressed:  # a timing: recorded, not part of the training hash
        model.metrics["compression_seconds"] = compression_seconds
    return model


def _persona_attribute_rows(
    mu: torch.Tensor, personas: Sequence[StudyPersona], items: Sequence[Item], bank: ItemBank
) -> int:
    """Set ``mu[k, j]`` of each persona's known attribute values to the near one-hot row
    of :func:`persona_prior_model` (in place); returns how many personas have one."""
    eps = PERSONA_ATTRIBUTE_EPSILON
    position = {
        it.key: (j, [o[0] for o in it.options])
        for j, it in enumerate(items)
        if it.role == ItemRole.attribute.value
    }
    n = 0
    for k, persona in enumerate(personas):
        known = [
            (position[key], v) for key, v in (persona.attributes or {}).items() if key in position
        ]
        for (j, letters), letter in known:
            if letter not in letters:
                continue
            o = bank.n_options[j]
            row = torch.full((o,), eps / (o - 1) if o > 1 else 1.0, dtype=mu.dtype)
            row[letters.index(letter)] = 1 - eps if o > 1 else 1.0
            mu[k, j, :o] = row
        n += bool(known)
    return n


def _jsonable(metrics: dict[str, object]) -> dict[str, object]:
    return json.loads(json.dumps(metrics, default=float))


def active_model_row(study_id: int, *, session: Session) -> FittedModel | None:
    """The study's active fitted model row (newest if several are flagged), without its blob
    being needed by the caller."""
    return session.exec(
        select(FittedModel)
        .where(FittedModel.study_id == study_id, FittedModel.is_active)  # type: ignore[arg-type]
        .order_by(FittedModel.id.desc())  # type: ignore[union-attr]
    ).first()


def ensure_fitted_model(study: Study, *, session: Session) -> FittedModel:
    """The study's active fitted model, fitting the default one first if there is none."""
    assert study.id is not None
    row = active_model_row(study.id, session=session)
    if row is not None:
        return row
    return fit_study_model(study, session=session)


@dataclass(frozen=True)
class ActiveModelRef:
    """Identity of a stored model: the cache key (``id``, ``training_hash``)."""

    id: int
    training_hash: str


_CACHE: dict[tuple[int, str], object] = {}
_CACHE_LOCK = threading.Lock()
_CACHE_MAX = 16


def active_model_ref(study_id: int, *, session: Session) -> ActiveModelRef | None:
    """The active model's id and hash (a cheap query: the blob is not read)."""
    row = session.exec(
        select(FittedModel.id, FittedModel.training_hash)
        .where(FittedModel.study_id == study_id, FittedModel.is_active)  # type: ignore[arg-type]
        .order_by(FittedModel.id.desc())  # type: ignore[union-attr]
    ).first()
    if row is None:
        return None
    return ActiveModelRef(id=int(row[0] or 0), training_hash=str(row[1]))


def model_ref(study_id: int, model_id: int, *, session: Session) -> ActiveModelRef | None:
    """The id and hash of the study's stored model ``model_id`` (active or not; GNN rows
    excluded), or ``None`` when the study has no such model."""
    row = session.exec(
        select(FittedModel.id, FittedModel.training_hash).where(
            FittedModel.id == model_id,
            FittedModel.study_id == study_id,
            FittedModel.family != "gnn",
        )
    ).first()
    return None if row is None else ActiveModelRef(id=int(row[0] or 0), training_hash=str(row[1]))


def load_cached_model(ref: ActiveModelRef, *, session: Session):  # type: ignore[no-untyped-def]
    """The deserialised model of ``ref``; read from the database once per process."""
    model = cached_model(ref)
    if model is not None:
        return model
    return model_from_blob(ref, model_blob(ref, session=session))


def cached_model(ref: ActiveModelRef):  # type: ignore[no-untyped-def]
    """The model of ``ref`` if this process has deserialised it already, else ``None``."""
    with _CACHE_LOCK:
        return _CACHE.get((ref.id, ref.training_hash))


def model_blob(ref: ActiveModelRef, *, session: Session) -> bytes:
    """The stored bytes of the model ``ref`` (read; nothing is deserialised)."""
    return bytes(session.exec(select(FittedModel.blob).where(FittedModel.id == ref.id)).one())


def model_from_blob(ref: ActiveModelRef, blob: bytes):  # type: ignore[no-untyped-def]
    """Deserialise ``blob`` (the model ``ref``) into the per-process cache; returns the
    cached model (the first one stored when two threads raced). Called without holding a
    database connection: unpickling a model is CPU work."""
    _single_thread_torch()
    loaded = load_model(blob)
    with _CACHE_LOCK:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        cached = _CACHE.setdefault((ref.id, ref.training_hash), loaded)
    if cached is loaded:
        freeze_long_lived()  # the model lives as long as the process (or until evicted)
    return cached


@functools.cache
def _single_thread_torch() -> None:
    """Use one intra-op thread in a process that serves sessions.

    A session's torch work is a few tiny matrix products per request; a web process runs
    many requests at once (threads, several workers), so intra-op parallelism only adds
    contention (measured: the answer call is several times slower with the default thread
    pool on a loaded 2-core machine). ``PRIORLY_TORCH_THREADS``
    (:attr:`app.settings.Settings.torch_threads`) overrides it. Runs once per process.
    """
    torch.set_num_threads(get_settings().torch_threads)


def clear_model_cache() -> None:
    """Forget every cached model (tests)."""
    with _CACHE_LOCK:
        _CACHE.clear()


# ----- the fixed question order, stored with the model ----------------------------------------

log = logging.getLogger("priorly.belief")

FIXED_ORDERS_KEY = "fixed_orders"
"""Where the orders live in ``fitted_model.metrics``: ``{key: entry}``."""
MAX_STORED_ORDERS = 8
"""Orders kept per model row (the oldest is dropped): role edits each add one."""


class _ItemLike(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def options(self) -> Any: ...
    @property
    def role(self) -> str: ...


def order_roles(bank: Any, items: Sequence[_ItemLike]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(pool, targets)``: the keys of the study's question and target items that the model
    knows (same key, same number of options), in study order: exactly the candidates and
    targets a live session uses (:func:`app.session.load_runtime`)."""
    known = dict(zip(bank.keys, bank.n_options, strict=True))
    in_model = [it for it in items if known.get(it.key) == len(it.options)]
    pool = tuple(it.key for it in in_model if it.role == ItemRole.question.value)
    targets = tuple(it.key for it in in_model if it.role == ItemRole.target.value)
    return pool, targets


def fixed_order_params(criterion: Any) -> dict[str, Any]:
    """The :class:`elicitation.criteria.FixedOrder` parameters behind an order-based
    criterion object (``fixed`` itself, or the anchor of ``eig_anchored``)."""
    return dict(getattr(criterion, "fixed", criterion).params())


def fixed_order_key(
    training_hash: str, pool: Sequence[str], targets: Sequence[str], params: Mapping[str, Any]
) -> str:
    """The key of a stored order: sha256 of the model's training hash, the candidate pool
    and the targets (item keys, study order) and the order's parameters."""
    blob = json.dumps(
        {"model": training_hash, "pool": list(pool), "targets": list(targets), "params": params},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


ITEM_ANSWERS_KEY = "item_answers"
"""Where a fit records its data's observed answers per item in ``fitted_model.metrics``:
``{item key: count}`` over every respondent the fit saw (held-out ones included)."""


def stored_item_answers(metrics: Mapping[str, Any] | None) -> dict[str, int] | None:
    """The ``{item key: observed answers}`` a model row was fitted on, or ``None`` for a row
    stored without them (fitted before they were recorded)."""
    counts = (metrics or {}).get(ITEM_ANSWERS_KEY)
    if not isinstance(counts, dict):
        return None
    return {str(k): int(v) for k, v in counts.items() if isinstance(v, int)}


def stored_fixed_orders(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``{key: entry}`` orders stored in a model row's metrics (empty if none)."""
    orders = (metrics or {}).get(FIXED_ORDERS_KEY)
    return dict(orders) if isinstance(orders, dict) else {}


def compute_fixed_order(
    model: Any, pool: Sequence[str], targets: Sequence[str], params: Mapping[str, Any]
) -> dict[str, Any]:
    """Run the greedy :class:`elicitation.criteria.FixedOrder` search (CPU work: seconds
    to a minute); returns the entry stored under :func:`fixed_order_key`:
    ``{"order": [item keys], "expectation": [...], "params", "targets", "cpu_seconds"}``.

    Raises:
        elicitation.errors.ElicitationError: the model cannot be searched (no targets...).
    """
    bank = model.item_bank
    fixed = FixedOrder(**params)
    started = time.thread_time()
    fixed.prepare(model, [bank.index(k) for k in pool], [bank.index(k) for k in targets])
    return {
        "order": [bank.keys[i] for i in fixed.order],
        "expectation": fixed.expectation,
        "params": dict(params),
        "targets": list(targets),
        "cpu_seconds": round(time.thread_time() - started, 3),
    }


@dataclass(frozen=True)
class FixedOrderResult:
    """What :func:`ensure_fixed_order` did.

    Attributes:
        status: ``computed`` / ``stored`` (already there) / ``not_needed`` (the study's
            criterion needs no order) / ``not_applicable`` (no model, no candidates or no
            targets) / ``failed`` (the search refused the model; ``message`` says why).
        key: the order's key (``None`` unless an order applies).
        cpu_seconds: the search's CPU time when ``computed``.
        message: why, for ``failed``.
    """

    status: str
    key: str | None = None
    cpu_seconds: float | None = None
    message: str = ""


def ensure_fixed_order(
    study: Study, *, session: Session, row: FittedModel | None = None, model: Any = None
) -> FixedOrderResult:
    """Compute and store the fixed order of the study's active model (or ``row``) for its
    current pool and targets, when its criterion needs one and it is not stored yet.

    ``model`` is ``row``'s deserialised model when the caller has it (the fit). Commits.
    """
    assert study.id is not None
    try:
        selector = get_criterion(StudySettings.model_validate(study.settings or {}).criterion)
    except (ValueError, ElicitationError):
        return FixedOrderResult("not_needed")
    if not selector.uses_fixed_order:
        return FixedOrderResult("not_needed")
    row = row if row is not None else active_model_row(study.id, session=session)
    if row is None or row.id is None:
        return FixedOrderResult("not_applicable")
    if model is None:
        model = load_cached_model(ActiveModelRef(row.id, row.training_hash), session=session)
    pool, targets = order_roles(model.item_bank, _study_items(study.id, session=session))
    if not pool or not targets:
        return FixedOrderResult("not_applicable")
    params = fixed_order_params(selector)
    key = fixed_order_key(row.training_hash, pool, targets, params)
    if key in stored_fixed_orders(row.metrics):
        return FixedOrderResult("stored", key)
    try:
        entry = compute_fixed_order(model, pool, targets, params)
    except ElicitationError as exc:
        log.warning("study %s: no fixed order for model %s: %s", study.id, row.id, exc)
        return FixedOrderResult("failed", key, message=str(exc))
    # Read-modify-write of the JSON column under the row's lock (another job may store the
    # order of another pool at the same time).
    fresh = session.exec(
        select(FittedModel).where(FittedModel.id == row.id).with_for_update()
    ).one()
    session.refresh(fresh)
    orders = stored_fixed_orders(fresh.metrics)
    orders[key] = entry
    while len(orders) > MAX_STORED_ORDERS:
        orders.pop(next(iter(orders)))
    fresh.metrics = {**(fresh.metrics or {}), FIXED_ORDERS_KEY: orders}
    session.add(fresh)
    session.commit()
    session.refresh(fresh)
    return FixedOrderResult("computed", key, entry["cpu_seconds"])


def try_ensure_fixed_order(
    study: Study, *, session: Session, row: FittedModel | None = None, model: Any = None
) -> FixedOrderResult:
    """:func:`ensure_fixed_order` for a caller whose own work is done (a fit, the demo's
    preparation): an unexpected error is logged and reported as ``failed`` instead of
    failing that work; the live loop then serves ``eig`` and queues a ``fixed_order`` job,
    whose failure is stored in the job row where a researcher sees it."""
    try:
        return ensure_fixed_order(study, session=session, row=row, model=model)
    except Exception as exc:
        session.rollback()
        log.exception("study %s: computing the fixed order failed", study.id)
        return FixedOrderResult("failed", message=f"{type(exc).__name__}: {exc}")


FIXED_ORDER_JOB = "fixed_order"
_REQUESTED: set[tuple[str, int, str]] = set()
_PENDING: list[threading.Thread] = []
_REQUESTED_LOCK = threading.Lock()


def request_fixed_order(study_id: int, key: str, *, engine: Any) -> threading.Thread | None:
    """Queue a ``fixed_order`` job for the study (a missing order seen by the live loop).

    Never blocks the caller (it may hold a session's lock): a daemon thread writes the job
    row with its own connection and puts it on the queue of the process settings
    (:func:`app.settings.get_settings`, pointed at ``engine``'s database). Once per
    ``(database, study, key)`` per process; no second job while one is queued or running.
    Returns the thread (``None`` when already requested), so a caller can wait for it.
    """
    url = engine.url.render_as_string(hide_password=False)
    marker = (url, study_id, key)
    with _REQUESTED_LOCK:
        if marker in _REQUESTED:
            return None
        _REQUESTED.add(marker)
    thread = threading.Thread(
        target=_queue_fixed_order_job,
        args=(study_id, key, engine, url),
        daemon=True,
        name=f"fixed-order-{study_id}",
    )
    with _REQUESTED_LOCK:
        _PENDING.append(thread)
    thread.start()
    return thread


def wait_for_fixed_order_requests(timeout: float = 30.0) -> bool:
    """Join the threads started by :func:`request_fixed_order`; true when all finished
    within ``timeout`` seconds (tests, and a clean shutdown)."""
    deadline = time.monotonic() + timeout
    with _REQUESTED_LOCK:
        threads = list(_PENDING)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with _REQUESTED_LOCK:
        _PENDING[:] = [t for t in _PENDING if t.is_alive()]
        return not _PENDING


def _queue_fixed_order_job(study_id: int, key: str, engine: Any, url: str) -> None:
    try:
        settings = get_settings()
        if settings.database_url != url:
            settings = settings.model_copy(update={"database_url": url})
        with Session(engine) as db:
            study = db.get(Study, study_id)
            if study is None:
                return
            active = db.exec(
                select(Job.id).where(
                    Job.study_id == study_id,
                    Job.kind == FIXED_ORDER_JOB,
                    Job.status.in_(ACTIVE),  # type: ignore[attr-defined]
                )
            ).first()
            if active is None:
                start_job(
                    FIXED_ORDER_JOB,
                    study,
                    payload={"key": key},
                    researcher=None,
                    settings=settings,
                    session=db,
                )
    except Exception:  # a request must never fail because of this; the log says why
        log.exception("could not queue the fixed-order job of study %s", study_id)
        with _REQUESTED_LOCK:
            _REQUESTED.discard((url, study_id, key))


def forget_fixed_order_requests() -> None:
    """Forget which orders this process requested (tests)."""
    with _REQUESTED_LOCK:
        _REQUESTED.clear()
