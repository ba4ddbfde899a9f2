"""Criteria on the latent posterior rather than the targets: ``posterior_entropy``, ``irt``.

Example::

    scores = get_criterion("posterior_entropy").score(model, state, candidates, targets)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from elicitation.criteria.base import (
    ItemList,
    SelectionCriterion,
    answer_options,
    as_items,
    entropy,
    require_method,
)
from elicitation.criteria.registry import register_criterion
from models.base import DTYPE, BeliefModel


@register_criterion
class PosteriorEntropy(SelectionCriterion):
    """Expected reduction of the entropy of the latent (persona) posterior.

    ``score(x) = H(p(θ | h)) - sum_k p(Y_x = k | h) H(p(θ | h, Y_x = k))``
    (docs/methods.md §1, an alternative in [1]). Ignores the targets: it learns
    *who* the respondent is, not specifically what they answer to the targets. Needs
    ``model.latent_posterior(state) -> [K]``; the batched form also needs
    ``model.latent_posterior_batch(states) -> [B, K]``. The posterior after each
    hypothetical answer comes from ``model.update`` / ``model.update_batch``.
    """

    name = "posterior_entropy"
    description = "expected reduction of the latent-posterior entropy (nats)"

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        latent = require_method(model, "latent_posterior", self.name, "a latent posterior")
        cand = as_items(candidates)
        if not cand:
            return torch.zeros(0, dtype=DTYPE)
        now = entropy(latent(state).to(DTYPE))
        p_x = model.predict(state, cand)  # [C, O]
        out = torch.empty(len(cand), dtype=DTYPE)
        n_opt = model.item_bank.n_options
        for ci, x in enumerate(cand):
            after = torch.stack(
                [entropy(latent(model.update(state, x, k)).to(DTYPE)) for k in range(n_opt[x])]
            )
            out[ci] = now - (p_x[ci, : n_opt[x]] * after).sum()
        return out

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        latent = require_method(
            model, "latent_posterior_batch", self.name, "a batched latent posterior"
        )
        cand = as_items(candidates)
        post = latent(states).to(DTYPE)  # [B, K]
        b = post.shape[0]
        now = entropy(post)  # [B]
        p_x = model.predict_batch(states, cand)  # [B, C, O]
        out = torch.empty(b, len(cand), dtype=DTYPE)
        n_opt = model.item_bank.n_options
        items = torch.empty(b, dtype=torch.long)
        for ci, x in enumerate(cand):
            items.fill_(x)
            exp_h = torch.zeros(b, dtype=DTYPE)
            for k in range(n_opt[x]):
                opts = answer_options(states, x, k, b)
                exp_h += p_x[:, ci, k] * entropy(latent(model.update_batch(states, items, opts)))
            out[:, ci] = now - exp_h
        return out


@register_criterion
class IRTPosteriorVariance(SelectionCriterion):
    """Item response theory's adaptive-testing rule: expected posterior variance of θ.

    ``score(x) = Var(θ | h) - sum_k p(Y_x = k | h) Var(θ | h, Y_x = k)``
    (minimum expected posterior variance, as a non-negative reduction). Needs
    ``model.theta_posterior(state) -> (grid [Q], weights [Q])`` (a posterior on a
    quadrature grid, as in ``models.irt``); uses ``model.expected_posterior_variance``
    when the model provides it, else updates the state for each answer. The batched form
    uses ``model.theta_posterior_batch(states) -> (grid [Q], weights [B, Q])``.
    Ignores the targets (IRT's goal is θ itself).
    """

    name = "irt"
    description = "expected reduction of the posterior variance of the IRT ability θ"

    @staticmethod
    def _var(grid: Tensor, w: Tensor) -> Tensor:
        w = w.to(DTYPE)
        grid = grid.to(DTYPE)
        mean = (w * grid).sum(-1, keepdim=True)
        return (w * (grid - mean) ** 2).sum(-1)

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        theta = require_method(model, "theta_posterior", self.name, "a posterior over θ")
        cand = as_items(candidates)
        if not cand:
            return torch.zeros(0, dtype=DTYPE)
        grid, w = theta(state)
        now = self._var(grid, w)
        epv = getattr(model, "expected_posterior_variance", None)
        if callable(epv):
            return (now - torch.as_tensor(epv(state, cand), dtype=DTYPE)).reshape(-1)
        p_x = model.predict(state, cand)
        n_opt = model.item_bank.n_options
        out = torch.empty(len(cand), dtype=DTYPE)
        for ci, x in enumerate(cand):
            after = torch.stack(
                [self._var(*theta(model.update(state, x, k))) for k in range(n_opt[x])]
            )
            out[ci] = now - (p_x[ci, : n_opt[x]] * after).sum()
        return out

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        theta = require_method(
            model, "theta_posterior_batch", self.name, "a batched posterior over θ"
        )
        cand = as_items(candidates)
        grid, w = theta(states)
        b = w.shape[0]
        now = self._var(grid, w)
        epv = getattr(model, "expected_posterior_variance_batch", None)
        if callable(epv):
            return now.unsqueeze(-1) - torch.as_tensor(epv(states, cand), dtype=DTYPE)
        p_x = model.predict_batch(states, cand)
        n_opt = model.item_bank.n_options
        out = torch.empty(b, len(cand), dtype=DTYPE)
        items = torch.empty(b, dtype=torch.long)
        for ci, x in enumerate(cand):
            items.fill_(x)
            exp_v = torch.zeros(b, dtype=DTYPE)
            for k in range(n_opt[x]):
                opts = answer_options(states, x, k, b)
                g, wk = theta(model.update_batch(states, items, opts))
                exp_v += p_x[:, ci, k] * self._var(g, wk)
            out[:, ci] = now - exp_v
        return out
