"""Benchmark methods ``llm_personas`` and ``mixed`` for ``priorly bench individual``.

Importing this module adds two rows to the method registry of
:mod:`elicitation.bench.methods` (nothing renamed):

* ``llm_personas`` — the dataset's cached LLM persona table
  (:mod:`inference_server.persona_table`) as a :class:`~models.persona.PersonaMixture`
  whose prior ``p(θ)`` is fitted by EM on the training users' non-target answers
  (METHODS.md section 1), with expected-information-gain selection;
* ``mixed`` — one mixture of the LLM personas and the data-fitted latent classes
  (the ``default`` method's model), its weights fitted by the same EM, so the data decide
  how much each component is worth.

The table is found by the item bank's hash, or given as
``fit_options={"llm_personas": {"path": FILE}}``; without one the fit raises a
:class:`~elicitation.errors.BenchmarkError` that says how to make it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from elicitation.bench.methods import FitContext, Method, fit_latent_class_model, register_method
from elicitation.criteria import SelectionCriterion, get_criterion
from elicitation.errors import BenchmarkError
from inference_server.persona_table import PersonaTable, find_table
from models.base import BeliefModel
from models.persona import PersonaMixture, fit_prior_em


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


def fit_mixed(ctx: FitContext) -> BeliefModel:
    """LLM personas + latent classes in one mixture, weights by EM (non-target answers)."""
    lc = fit_latent_class_model(ctx)
    if not isinstance(lc, PersonaMixture):
        raise BenchmarkError("the latent-class fit is not a persona mixture")
    return _em_mixture(ctx, torch.cat([_llm_mu(ctx), lc.mu], dim=0))


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
        "LLM personas and latent classes in one mixture, EM weights + EIG",
    )
)
