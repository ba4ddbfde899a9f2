"""Benchmark methods ``llm_personas`` and ``mixed`` for ``priorly bench individual``.

Importing this module adds two rows to the method registry of
:mod:`elicitation.bench.methods`:

* ``llm_personas`` — the dataset's cached LLM persona table
  (:mod:`inference_server.persona_table`) as a :class:`~models.persona.PersonaMixture`
  whose prior ``p(θ)`` is fitted by EM on the training users' non-target answers
  (docs/methods.md §1.3), with expected-information-gain selection;
* ``mixed`` — one mixture of the LLM personas and the data-fitted latent classes
  (the ``default`` method's model): ``p(θ) = w · p_LLM(θ) + (1 − w) · p_LC(θ)``, where
  ``p_LLM`` is the ``llm_personas`` prior, ``p_LC`` the latent-class model's own prior
  (e.g. its validated ensemble weights) and the block weight ``w`` is fitted by EM on the
  training users' non-target answers (:func:`fit_block_weight`), so the data decide how
  much the LLM dictionary is worth without re-weighting the latent classes.

The table is found by the item bank's hash, or given as
``fit_options={"llm_personas": {"path": FILE}}``; without one the fit raises a
:class:`~elicitation.errors.BenchmarkError` that says how to make it.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from elicitation.bench.methods import FitContext, Method, fit_latent_class_model, register_method
from elicitation.criteria import SelectionCriterion, get_criterion
from elicitation.errors import BenchmarkError
from inference_server.persona_table import PersonaTable, find_table
from models.base import BeliefModel
from models.persona import PersonaMixture
from models.persona_fit import fit_prior_em


def _llm_mu(ctx: FitContext) -> torch.Tensor:
    bank = ctx.item_bank

    def build() -> torch.Tensor:
        opt = ctx.options.get("llm_personas", {}).get("path")
        path = Path(opt) if opt else find_table(bank.keys, bank.n_options)
        if path is None or not path.is_file():
            raise BenchmarkError(
                "no cached LLM persona table for this dataset's items: run "
                "`priorly personas table --dataset DIR` first"
            )
        return PersonaTable.load(path).rows_for(bank.keys, bank.n_options)

    return ctx.cached("llm_persona_mu", build)


def _em_mixture(ctx: FitContext, mu: torch.Tensor) -> BeliefModel:
    log_prior, _ = fit_prior_em(mu, ctx.masked(ctx.train), item_bank=ctx.item_bank)
    return PersonaMixture(ctx.item_bank, mu, log_prior)


def fit_llm_personas(ctx: FitContext) -> BeliefModel:
    """LLM personas with the EM prior on the training users' non-target answers."""
    return _em_mixture(ctx, _llm_mu(ctx))


def fit_block_weight(log_a: torch.Tensor, log_b: torch.Tensor, *, tol: float = 1e-12) -> float:
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


def fit_mixed(ctx: FitContext) -> BeliefModel:
    """LLM personas + latent classes: ``w · p_LLM + (1 − w) · p_LC``, ``w`` by maximum likelihood.

    The latent-class model keeps its own prior (for the ensemble default, the validated
    equal-weight average of its fits); the LLM block has the ``llm_personas`` EM prior.
    """
    lc = fit_latent_class_model(ctx)
    if not isinstance(lc, PersonaMixture):
        raise BenchmarkError("the latent-class fit is not a persona mixture")
    llm = _em_mixture(ctx, _llm_mu(ctx))
    assert isinstance(llm, PersonaMixture)
    train = ctx.masked(ctx.train)
    w = fit_block_weight(llm.log_marginal(train), lc.log_marginal(train))
    with torch.no_grad():
        log_w = math.log(w) if w > 0 else -math.inf
        log_1w = math.log1p(-w) if w < 1 else -math.inf
        log_prior = torch.cat([llm.log_prior + log_w, lc.log_prior.to(llm.log_prior) + log_1w])
    model = PersonaMixture(ctx.item_bank, torch.cat([llm.mu, lc.mu.to(llm.mu)], dim=0), log_prior)
    model.metrics = {"llm_block_weight": w, "n_llm": int(llm.mu.shape[0])}
    return model


def _eig(ctx: FitContext) -> SelectionCriterion:
    return get_criterion("eig")


register_method(
    Method(
        "llm_personas",
        fit_llm_personas,
        _eig,
        "LLM persona dictionary (cached table) + EM prior on non-target answers + EIG",
    )
)
register_method(
    Method(
        "mixed",
        fit_mixed,
        _eig,
        "LLM personas and latent classes in one mixture, EM block weight + EIG",
    )
)
