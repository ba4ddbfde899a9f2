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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from elicitation.criteria import DEFAULT_DELTA, DEFAULT_TAU, SelectionCriterion, get_criterion
from elicitation.errors import BenchmarkError
from models.base import MISSING, BeliefModel, ItemBank
from models.irt import fit_grm
from models.latent_class import fit_latent_classes


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
        persona dictionary, METHODS.md section 1).
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
        f"about the targets minus {DEFAULT_DELTA} nats per position skipped in the fixed "
        "order; the app's default criterion (StudySettings.criterion), what a live study uses",
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
