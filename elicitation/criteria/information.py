"""One-step expected information gain about the targets: ``eig`` and ``eig_tempered``.

``EIG(x) = (1/|I*|) sum_t H(p(Y_t | h)) - sum_k p(Y_x = k | h) (1/|I*|) sum_t H(p(Y_t | h, Y_x = k))``

Example::

    scores = get_criterion("eig").score(model, state, candidates, targets)  # [C] nats
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

from elicitation.criteria.base import (
    ItemList,
    SelectionCriterion,
    as_items,
    check_targets,
    expected_target_entropy,
    mean_target_entropy,
)
from elicitation.criteria.registry import register_criterion
from elicitation.errors import CriterionNotApplicableError, ElicitationError
from models.base import DTYPE, BeliefModel


@register_criterion
class ExpectedInformationGain(SelectionCriterion):
    """Expected information gain about the targets (greedy one-step lookahead).

    ``EIG(x) = (1/|I*|) sum_t H(p(Y_t | h)) - sum_k p(Y_x = k | h) (1/|I*|) sum_t H(p(Y_t | h, Y_x = k))``

    i.e. the current mean target entropy minus the expected mean target entropy after
    the answer to ``x`` (docs/methods.md §1, "Algorithm 2"; the subtraction of a
    constant does not change the argmax but makes the score a gain in nats, >= 0 for a
    coherent Bayesian model, usable by a stopping threshold). Computed from
    ``model.lookahead`` / ``model.lookahead_batch``, or for one respondent from
    ``model.target_entropy_lookahead(state, candidates, targets) -> (H_now, E [C])`` when
    the model has it (the same two quantities without materialising ``p_t``; see
    :meth:`models.persona.PersonaMixture.target_entropy_lookahead`).
    """

    name = "eig"
    description = "expected reduction of the mean target predictive entropy (nats)"
    scores_are_target_gains = True

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand, tgt = as_items(candidates), as_items(targets)
        check_targets(self.name, tgt)
        if not cand:
            return torch.zeros(0, dtype=DTYPE)
        compact = getattr(model, "target_entropy_lookahead", None)
        if compact is not None:  # the same numbers without the [C, O, T, O] padding
            now, expected = compact(state, cand, tgt)
            return (now - expected).to(DTYPE)
        p_x, p_t = model.lookahead(state, cand, tgt)
        now = mean_target_entropy(model.predict(state, tgt))
        return (now - expected_target_entropy(p_x, p_t)).to(DTYPE)

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand, tgt = as_items(candidates), as_items(targets)
        check_targets(self.name, tgt)
        p_x, p_t = model.lookahead_batch(states, cand, tgt)  # [B, C, O], [B, C, O, T, O]
        now = mean_target_entropy(model.predict_batch(states, tgt))  # [B]
        return (now.unsqueeze(-1) - expected_target_entropy(p_x, p_t)).to(DTYPE)


def _selection_state(
    model: BeliefModel, state: Any, tau: float, prior_weight: float, anchor: str = "uniform"
) -> Any:
    """The state a robust criterion *selects* with (predictions keep the exact posterior).

    With ``π(θ | h)`` the posterior over personas, ``π(θ)`` the model's population prior,
    ``τ`` = ``tau`` and ``w`` = ``prior_weight``:

    ``π_τ(θ) ∝ π(θ | h)^τ`` (``anchor = "uniform"``: the posterior flattened towards
    the uniform distribution over personas) or ``π_τ(θ) ∝ π(θ | h)^τ π(θ)^(1-τ)
    = π(θ) L(h | θ)^τ`` (``anchor = "prior"``: the power posterior, between the prior at
    ``τ = 0`` and the posterior at ``τ = 1``), then ``π_sel = (1 - w) π_τ + w π(θ)``.

    A less confident belief about who the respondent is. Needs a state with a normalised
    ``log_post`` (``[K]`` or ``[B, K]``) and, for ``w > 0`` or the prior anchor, a model
    with ``log_prior [K]``.
    """
    if tau == 1.0 and prior_weight == 0.0:
        return state
    log_post = getattr(state, "log_post", None)
    log_prior = getattr(model, "log_prior", None)
    need_prior = prior_weight > 0 or anchor == "prior"
    if not isinstance(log_post, Tensor) or (need_prior and not isinstance(log_prior, Tensor)):
        raise CriterionNotApplicableError(
            f"a tempered criterion needs a state with a persona posterior 'log_post' and a "
            f"model with 'log_prior'; {type(model).__name__} (family {model.family!r}) has none"
        )
    lp = log_post * tau
    if anchor == "prior":
        lp = lp + (1 - tau) * log_prior
    lp = lp - torch.logsumexp(lp, dim=-1, keepdim=True)
    if prior_weight > 0:
        lp = torch.logaddexp(lp + math.log1p(-prior_weight), log_prior + math.log(prior_weight))
        lp = lp - torch.logsumexp(lp, dim=-1, keepdim=True)
    return dataclasses.replace(state, log_post=lp)


DEFAULT_TAU = 0.5
"""Default power of :class:`TemperedInformationGain` (the benchmark method
``eig_tempered``): chosen by 5-fold cross-validation over the training and validation
users of the shipped datasets, one value for every dataset; the runner-up rule of
docs/benchmarks.md, "Selection rule of `default`"."""


@register_criterion
class TemperedInformationGain(ExpectedInformationGain):
    """``eig`` computed under a less confident belief (selection only).

    ``score(x) = EIG(x)`` of :class:`ExpectedInformationGain` with the persona posterior
    replaced by ``π_sel`` (see :func:`_selection_state`: posterior to the power ``tau``,
    mixed with the population prior with weight ``prior_weight``). The respondent's state
    and every prediction stay exact Bayes; only the choice of the next question hedges
    against a posterior that is overconfident because the model is misspecified (a
    finite mixture of independent categoricals; respondents from another population than
    the training users). ``tau = 1, prior_weight = 0`` is ``eig`` exactly. The score is
    a gain in nats under ``π_sel``, not under the posterior, so it is not used by the
    expected-gain stopping rule.
    """

    name = "eig_tempered"
    description = "expected target-entropy reduction under a flattened posterior (selection only)"
    scores_are_target_gains = False

    def __init__(
        self, tau: float = DEFAULT_TAU, prior_weight: float = 0.0, anchor: str = "uniform"
    ) -> None:
        if not 0 < tau <= 1:
            raise ElicitationError(f"criterion {self.name!r}: tau must be in (0, 1]")
        if not 0 <= prior_weight < 1:
            raise ElicitationError(f"criterion {self.name!r}: prior_weight must be in [0, 1)")
        if anchor not in ("uniform", "prior"):
            raise ElicitationError(
                f"criterion {self.name!r}: anchor must be 'uniform' or 'prior', got {anchor!r}"
            )
        self.tau = float(tau)
        self.prior_weight = float(prior_weight)
        self.anchor = anchor

    def params(self) -> dict[str, Any]:
        return {"tau": self.tau, "prior_weight": self.prior_weight, "anchor": self.anchor}

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        sel = _selection_state(model, state, self.tau, self.prior_weight, self.anchor)
        return super().score(model, sel, candidates, targets)

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        sel = _selection_state(model, states, self.tau, self.prior_weight, self.anchor)
        return super().score_batch(model, sel, candidates, targets)
