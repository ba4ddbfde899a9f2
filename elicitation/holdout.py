"""Held-out scores of a fitted belief model: the log-likelihood of respondents' observed answers.

The learning loop (:mod:`app.services.learning`) promotes a newly fitted model only when
its :func:`mean_log_likelihood` on the study's held-out respondents beats the active
model's. The score is the observed-data log-likelihood: missing cells (questions never
asked) are left out, which is the right likelihood when which question was asked depends
only on earlier answers (missing at random; see docs/methods.md).

Pure: no web framework, database or settings imports.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from models.base import MISSING, BeliefModel

LOG_FLOOR = 1e-12
"""Probabilities below this count as this (a zero-probability answer is not ``-inf``)."""


def respondent_log_likelihood(model: BeliefModel, responses: Tensor) -> Tensor:
    """``[N]``: each respondent's log-likelihood of their observed answers under ``model``.

    ``responses [N, I]`` holds option indices in ``model.item_bank`` order, ``-1`` where
    missing. A family with a closed-form marginal (``log_marginal``, e.g. latent classes
    and persona mixtures: ``log sum_k p(k) prod_i mu[k, i, y_i]``) uses it; any other
    family uses the chain rule in item order,
    ``sum_i log p(y_i | y_<i observed)`` (predict, then update, one item at a time, all
    respondents at once), which equals the joint for any exchangeable model.

    Example: a one-class model with ``mu = [[0.25, 0.75]]`` scores the row ``[1]`` as
    ``log 0.75`` and the row ``[-1]`` as ``0``.
    """
    y = torch.as_tensor(responses, dtype=torch.long)
    if y.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float64)
    marginal = getattr(model, "log_marginal", None)
    if callable(marginal):
        return marginal(y).to(torch.float64)
    n, n_items = y.shape
    state = model.initial_batch(torch.full_like(y, MISSING))
    out = torch.zeros(n, dtype=torch.float64)
    for i in range(n_items):
        seen = y[:, i] >= 0
        if not bool(seen.any()):
            continue
        p = model.predict_batch(state, [i])[:, 0, :].to(torch.float64)
        p_obs = p.gather(1, y[:, i].clamp_min(0).unsqueeze(1)).squeeze(1)
        out += torch.where(seen, p_obs.clamp_min(LOG_FLOOR).log(), torch.zeros_like(out))
        state = model.update_batch(state, torch.full((n,), i, dtype=torch.long), y[:, i])
    return out


def mean_log_likelihood(model: BeliefModel, responses: Tensor) -> float | None:
    """The mean of :func:`respondent_log_likelihood` over respondents with at least one
    observed answer (nats per respondent; higher is better), or ``None`` without any."""
    y = torch.as_tensor(responses, dtype=torch.long)
    scored = (y >= 0).any(1) if y.shape[0] else torch.zeros(0, dtype=torch.bool)
    if not bool(scored.any()):
        return None
    value = float(respondent_log_likelihood(model, y[scored]).mean())
    return value if math.isfinite(value) else None
