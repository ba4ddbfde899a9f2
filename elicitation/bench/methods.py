"""Benchmark methods: a registry from a method name to (how to fit, how to select).

A :class:`Method` pairs a fit function (training data of one benchmark run → a fitted
:class:`models.base.BeliefModel`) with a criterion factory (→ a
:class:`elicitation.criteria.SelectionCriterion`), or observes every answered candidate
(``full``). Adding a method (``llm_personas``, ``mixed``, ``cape_*``, ``auto``...) is one
:func:`register_method` call; the harness needs nothing else.

Fits that do not depend on the run's targets are cached in :attr:`FitContext.cache`
(shared by all runs and methods of one benchmark), so e.g. the latent-class model is
fitted once per dataset and shared by ``default``, ``random``, ``fixed`` and ``full`` —
those methods then differ only in which questions they ask.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from elicitation.criteria import DEFAULT_DELTA, DEFAULT_TAU, SelectionCriterion, get_criterion
from elicitation.errors import BenchmarkError, ElicitationError
from models.base import DTYPE, MISSING, BeliefModel, ItemBank
from models.irt import fit_grm
from models.latent_class import fit_latent_classes
from models.persona import PersonaMixture
from models.persona_fit import fit_prior_em


@dataclass
class FitContext:
    """What a fit function may use for one benchmark run (never the test users).

    Attributes:
        item_bank: the model's items (demographics, then questions).
        train: ``LongTensor [N_train, I]`` answers of the training users (``-1`` = missing).
        val: ``LongTensor [N_val, I]`` answers of the validation users (for choosing
            hyperparameters such as the number of latent classes).
        demographics: item indices observed for free.
        candidates: the run's askable items. targets: the run's target items.
        seed: the run's seed (for seeded criteria and fits).
        base_seed: the benchmark's seed (for fits shared by all runs).
        cache: shared by all runs and methods of one benchmark (``cached``).
        options: per-fit keyword arguments, e.g. ``{"latent_classes": {"n_classes":
            (4, 8)}}`` (keys: ``latent_classes``, ``irt``; a fit uses only its own key).
            ``{"personas": {"mu": Tensor [K, I, O]}}`` gives the persona dictionary
            (:func:`persona_dictionary`).
    """

    item_bank: ItemBank
    train: Tensor
    val: Tensor
    demographics: list[int]
    candidates: list[int]
    targets: list[int]
    seed: int
    base_seed: int = 0
    cache: dict[str, Any] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def masked(self, responses: Tensor) -> Tensor:
        """A copy of ``responses`` with the run's target columns set to ``-1``.

        For fits that must see only non-target answers (e.g. an EM prior over a fixed
        persona dictionary, docs/methods.md §1).
        """
        out = responses.clone()
        out[:, self.targets] = MISSING
        return out

    def cached(self, key: str, build: Callable[[], Any]) -> Any:
        """``cache[key]``, built once with ``build()``."""
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]


FitFn = Callable[[FitContext], BeliefModel]
CriterionFactory = Callable[[FitContext], SelectionCriterion]


@dataclass(frozen=True)
class Method:
    """One benchmark method.

    Attributes:
        name: the method's name on the command line and in ``result.json``.
        fit: builds the belief model for a run.
        criterion: builds the selection criterion for a run (``None`` when ``observe_all``).
        description: one line for the docs and ``--help``.
        observe_all: observe every candidate the user answered (the ``full`` reference).
    """

    name: str
    fit: FitFn
    criterion: CriterionFactory | None
    description: str
    observe_all: bool = False


_METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add (or replace) ``method`` in the registry."""
    if method.criterion is None and not method.observe_all:
        raise BenchmarkError(f"method {method.name!r} needs a criterion or observe_all=True")
    _METHODS[method.name] = method
    return method


def method_names() -> list[str]:
    """Registered method names, in registration order (the default benchmark order)."""
    return list(_METHODS)


def get_method(name: str) -> Method:
    try:
        return _METHODS[name]
    except KeyError:
        raise BenchmarkError(
            f"unknown benchmark method {name!r} (known: {', '.join(method_names())})"
        ) from None


# ---- persona dictionaries ----------------------------------------------------------------
class MissingInputError(ElicitationError):
    """A fit's inputs are missing (e.g. no persona dictionary for the item bank): a model
    choice skips that candidate and records the message as the reason."""


PersonaSource = Callable[[FitContext], Tensor | None]
_PERSONA_SOURCES: list[PersonaSource] = []


def register_persona_source(source: PersonaSource) -> PersonaSource:
    """Add a way to find a persona dictionary ``mu [K, I, O]`` for a run's item bank
    (``None`` when it has none); e.g. the benchmark's cached persona tables."""
    if source not in _PERSONA_SOURCES:
        _PERSONA_SOURCES.append(source)
    return source


def persona_dictionary(ctx: FitContext) -> Tensor:
    """The persona dictionary ``mu [K, I, O]`` of a run: ``ctx.options["personas"]["mu"]``
    (the app: the study's stored persona distributions), else the first registered
    source that has one (the benchmark: the dataset's cached persona table).

    Raises:
        MissingInputError: no dictionary for this item bank.
    """
    given = ctx.options.get("personas", {}).get("mu")
    if given is not None:
        return torch.as_tensor(given, dtype=torch.float64)
    for source in _PERSONA_SOURCES:
        mu = source(ctx)
        if mu is not None:
            return mu
    raise MissingInputError(
        "no persona dictionary for these items (a study: generate persona distributions; "
        "a dataset: `priorly personas table --dataset DIR`)"
    )


def fit_persona_em(ctx: FitContext, mu: Tensor) -> PersonaMixture:
    """The persona mixture over ``mu [K, I, O]`` with its prior fitted by EM on the
    training users' non-target answers (docs/methods.md §1.3)."""
    log_prior, _ = fit_prior_em(mu, ctx.masked(ctx.train), item_bank=ctx.item_bank)
    return PersonaMixture(ctx.item_bank, mu, log_prior)


def fit_block_weight(log_a: Tensor, log_b: Tensor, *, tol: float = 1e-12) -> float:
    """Maximum-likelihood weight ``w`` of block A in ``w · p_A(x_u) + (1 − w) · p_B(x_u)``.

    ``log_a``, ``log_b``: ``[N]`` log marginal likelihoods of each user's answers under the
    two blocks (each a mixture with its own prior). The EM update for ``w`` is
    ``r_u = w p_A / (w p_A + (1 − w) p_B)``, ``w ← mean_u r_u``; its fixed point is the
    maximum of the concave ``f(w) = mean_u log(w p_A(x_u) + (1 − w) p_B(x_u))``. EM
    converges only linearly (slowly near 0 or 1), so the fixed point is found directly by
    bisection on the score ``f'(w) = mean_u (p_A − p_B) / (w p_A + (1 − w) p_B)``, which
    decreases in ``w``: ``w = 0`` when ``f'(0) ≤ 0``, ``1`` when ``f'(1) ≥ 0``, else the
    root to ``tol``. Equal likelihoods for every user carry no information: ``w = 1/2``.

    Example: block A explains one user twice as well and the other half as well::

        fit_block_weight(torch.log(torch.tensor([0.2, 0.05])), torch.log(torch.tensor([0.1, 0.1])))
        # 0.5: f'(w) = ((0.2 - 0.1) / (0.1 w + 0.1) + (0.05 - 0.1) / (0.1 - 0.05 w)) / 2 = 0 at w = 1/2
    """
    if log_a.shape != log_b.shape or log_a.dim() != 1 or log_a.numel() == 0:
        raise BenchmarkError("fit_block_weight: two [N] log-likelihood vectors, N > 0")
    d = (log_b - log_a).to(torch.float64)  # log p_B − log p_A
    if bool((d == 0).all()):
        return 0.5
    pos = d > 0
    e = torch.where(pos, torch.exp(-d.clamp_min(0)), torch.exp(d.clamp_max(0)))  # ≤ 1

    def score(w: float) -> float:
        # p_A/p_B = e where d > 0, p_B/p_A = e where d ≤ 0; numerator and denominator
        # both divided by the larger likelihood (no overflow)
        num = torch.where(pos, e - 1.0, 1.0 - e)
        den = torch.where(pos, w * e + (1.0 - w), w + (1.0 - w) * e)
        return float((num / den).mean())

    if score(0.0) <= 0.0:
        return 0.0
    if score(1.0) >= 0.0:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if score(mid) > 0.0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def mix_personas_with_classes(ctx: FitContext, lc: BeliefModel, mu: Tensor) -> PersonaMixture:
    """Persona dictionary + latent classes in one mixture (``mixed``).

    ``p(θ) = w · p_P(θ) + (1 − w) · p_LC(θ)``: ``p_P`` is the :func:`fit_persona_em`
    prior over ``mu``, ``p_LC`` the latent-class model's own prior, ``w`` fitted by
    :func:`fit_block_weight` on the training users' non-target answers. ``metrics``:
    ``llm_block_weight`` (``w``) and ``n_llm`` (``K`` of ``mu``).
    """
    if not isinstance(lc, PersonaMixture):
        raise BenchmarkError("the latent-class fit is not a persona mixture")
    llm = fit_persona_em(ctx, mu)
    train = ctx.masked(ctx.train)
    w = fit_block_weight(llm.log_marginal(train), lc.log_marginal(train))
    with torch.no_grad():
        log_w = math.log(w) if w > 0 else -math.inf
        log_1w = math.log1p(-w) if w < 1 else -math.inf
        log_prior = torch.cat([llm.log_prior + log_w, lc.log_prior.to(llm.log_prior) + log_1w])
    evidence = None
    if lc.evidence is not None:  # the personas' distributions are given: infinite evidence
        given = torch.full((llm.mu.shape[0], lc.evidence.shape[1]), math.inf, dtype=DTYPE)
        evidence = torch.cat([given, lc.evidence.to(DTYPE)])
    model = PersonaMixture(
        ctx.item_bank, torch.cat([llm.mu, lc.mu.to(llm.mu)], dim=0), log_prior, evidence=evidence
    )
    model.metrics = {"llm_block_weight": w, "n_llm": int(llm.mu.shape[0])}
    return model


# ---- fit functions ---------------------------------------------------------------------
def fit_latent_class_model(ctx: FitContext) -> BeliefModel:
    """The data-fitted latent-class mixture (what a live study with history uses).

    Fitted on the training users' answers (all items: the test users' targets are
    hidden, the training users' are not), the number of classes chosen on the validation
    users' log-likelihood (``models.latent_class.fit_latent_classes``). Independent of
    the run, so fitted once per benchmark.
    """

    def build() -> BeliefModel:
        val = ctx.val if ctx.val.shape[0] else None
        kw = dict(ctx.options.get("latent_classes", {}))
        return fit_latent_classes(
            ctx.train, ctx.item_bank, val_responses=val, seed=ctx.base_seed, **kw
        )

    return ctx.cached("latent_classes", build)


def fit_irt_model(ctx: FitContext) -> BeliefModel:
    """A 1-D graded response model calibrated by marginal maximum likelihood on train+val.

    Attributes (demographics) are items of the model like the questions (observed for
    free, as for every method). Fitted once per benchmark.
    """

    def build() -> BeliefModel:
        data = torch.cat([ctx.train, ctx.val]) if ctx.val.shape[0] else ctx.train
        kw = dict(ctx.options.get("irt", {}))
        return fit_grm(data, ctx.item_bank, seed=ctx.base_seed, **kw)

    return ctx.cached("irt_grm", build)


def _criterion(name: str, **kw: Any) -> CriterionFactory:
    def make(ctx: FitContext) -> SelectionCriterion:
        args = {k: (ctx.seed if v is _SEED else v) for k, v in kw.items()}
        return get_criterion(name, **args)

    return make


_SEED = object()  # placeholder: the run's seed

register_method(
    Method(
        "default",
        fit_latent_class_model,
        _criterion("eig_anchored", delta=DEFAULT_DELTA, seed=_SEED),
        "latent classes (K chosen on validation) + eig_anchored: expected information gain "
        "about the targets under the model's evidence view minus "
        f"{DEFAULT_DELTA} nats per position skipped in the fixed order; the app's default "
        "criterion (StudySettings.criterion), what a live study uses",
    )
)
register_method(
    Method(
        "eig",
        fit_latent_class_model,
        _criterion("eig"),
        "latent classes + expected information gain about the targets under the exact "
        "posterior (greedy one-step lookahead)",
    )
)
register_method(
    Method(
        "eig_anchored",
        fit_latent_class_model,
        _criterion("eig_anchored", delta=DEFAULT_DELTA, seed=_SEED),
        "latent classes + expected information gain about the targets minus "
        f"{DEFAULT_DELTA} nats per position skipped in the fixed order (the same rule as "
        "default, kept by name)",
    )
)
register_method(
    Method(
        "eig_tempered",
        fit_latent_class_model,
        _criterion("eig_tempered", tau=DEFAULT_TAU),
        "latent classes + expected information gain about the targets under the "
        f"posterior to the power {DEFAULT_TAU} (selection only)",
    )
)
register_method(
    Method(
        "eig2",
        fit_latent_class_model,
        _criterion("eig2"),
        "latent classes + expected information gain over the next two questions "
        "(two-step lookahead over the top candidates)",
    )
)
register_method(
    Method(
        "random",
        fit_latent_class_model,
        _criterion("random", seed=_SEED),
        "latent classes + a random order per user (seeded by the run)",
    )
)
register_method(
    Method(
        "fixed",
        fit_latent_class_model,
        _criterion("fixed", seed=_SEED),
        "latent classes + one non-adaptive order chosen greedily under the prior",
    )
)
register_method(
    Method(
        "irt",
        fit_irt_model,
        _criterion("irt"),
        "1-D graded response model + minimum expected posterior variance of θ",
    )
)
register_method(
    Method(
        "full",
        fit_latent_class_model,
        None,
        "latent classes with every answered candidate observed (a constant reference line)",
        observe_all=True,
    )
)
