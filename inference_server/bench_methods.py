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
  training users' non-target answers (:func:`elicitation.bench.methods.fit_block_weight`), so the data decide how
  much the LLM dictionary is worth without re-weighting the latent classes.

The table is found by the item bank's hash, or given as
``fit_options={"llm_personas": {"path": FILE}}``; without one the fit raises a
:class:`~elicitation.errors.BenchmarkError` that says how to make it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from elicitation.bench.methods import (
    FitContext,
    Method,
    fit_latent_class_model,
    fit_persona_em,
    mix_personas_with_classes,
    register_method,
    register_persona_source,
)
from elicitation.criteria import SelectionCriterion, get_criterion
from elicitation.errors import BenchmarkError
from inference_server.persona_table import PersonaTable, find_table
from models.base import BeliefModel


def _table_path(ctx: FitContext) -> Path | None:
    opt = ctx.options.get("llm_personas", {}).get("path")
    bank = ctx.item_bank
    path = Path(opt) if opt else find_table(bank.keys, bank.n_options)
    return path if path is not None and path.is_file() else None


def cached_table_mu(ctx: FitContext) -> torch.Tensor | None:
    """The dataset's cached persona table as ``mu [K, I, O]``, or ``None`` without one
    (the persona dictionary source of the benchmark's ``auto``)."""

    def build() -> torch.Tensor | None:
        path = _table_path(ctx)
        if path is None:
            return None
        bank = ctx.item_bank
        return PersonaTable.load(path).rows_for(bank.keys, bank.n_options)

    return ctx.cached("llm_persona_mu", build)


register_persona_source(cached_table_mu)


def _llm_mu(ctx: FitContext) -> torch.Tensor:
    mu = cached_table_mu(ctx)
    if mu is None:
        raise BenchmarkError(
            "no cached LLM persona table for this dataset's items: run "
            "`priorly personas table --dataset DIR` first"
        )
    return mu


def fit_llm_personas(ctx: FitContext) -> BeliefModel:
    """LLM personas with the EM prior on the training users' non-target answers."""
    return fit_persona_em(ctx, _llm_mu(ctx))


def fit_mixed(ctx: FitContext) -> BeliefModel:
    """LLM personas + latent classes: ``w · p_LLM + (1 − w) · p_LC``, ``w`` by maximum likelihood
    (:func:`elicitation.bench.methods.mix_personas_with_classes`).

    The latent-class model keeps its own prior (for the ensemble default, the validated
    equal-weight average of its fits); the LLM block has the ``llm_personas`` EM prior.
    """
    return mix_personas_with_classes(ctx, fit_latent_class_model(ctx), _llm_mu(ctx))


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
