"""``eig_anchored``: the one-step gain minus ``delta`` per position skipped in the fixed order.

``score(x) = G(x) - delta * r(x)``, ``G`` computed under the model's evidence view

Example::

    crit = get_criterion("eig_anchored", delta=DEFAULT_DELTA)
    crit.prepare(model, pool, targets)
    scores, gains = crit.score_with_gains(model, state, candidates, targets)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from elicitation.criteria.base import ItemList, SelectionCriterion, as_items, check_targets
from elicitation.criteria.information import ExpectedInformationGain, TemperedInformationGain
from elicitation.criteria.orders import FixedOrder
from elicitation.criteria.registry import register_criterion
from elicitation.errors import ElicitationError
from models.base import DTYPE, BeliefModel

DEFAULT_DELTA = 0.0005
"""Default ``delta`` (nats per position) of :class:`AnchoredInformationGain`, the app's
default criterion (``StudySettings.criterion``) and so the benchmark's ``default``: chosen
by 5-fold cross-validation over the training and validation users of the shipped
datasets, one value for every dataset (docs/benchmarks.md, "Selection rule")."""

DEFAULT_EVIDENCE_STRENGTH = 5.0
"""Default ``evidence_strength`` of :class:`AnchoredInformationGain` (answers of the
population's distribution added to each class's answers to an item before the gain is
computed): measured by ``priorly bench lifecycle`` on CES and OpinionQA against no view
(``0``), and against ``2`` in a screen (docs/benchmarks.md, "priorly bench lifecycle";
docs/decisions/0010-evidence-view-for-young-models.md)."""


@register_criterion
class AnchoredInformationGain(SelectionCriterion):
    """``eig`` anchored to the non-adaptive ``fixed`` order: adapt only when it pays.

    With ``G(x)`` the expected target-entropy reduction of ``x`` (``eig``, or
    ``eig_tempered`` with ``tau < 1``) and ``r(x)`` the number of candidates not yet
    answered by the respondent that come before ``x`` in the :class:`FixedOrder` list
    (``r = 0`` for the next question of the fixed order):

    ``score(x) = G(x) - delta * r(x)``

    so the respondent leaves the fixed order only where the model expects a question to
    tell more than the fixed order's next one by ``delta`` nats per position skipped.
    ``delta = 0`` is ``eig``; a very large ``delta`` is ``fixed``. The fixed order is a
    jointly good set under the population prior; the greedy adaptive pick is only
    greedy and trusts the posterior of a misspecified model, so the anchor hedges. The
    fixed order is computed in :meth:`prepare` (cached for a model, pool and targets), or
    handed over precomputed with :meth:`set_fixed_order` (a live study stores it with its
    fitted model; computing it costs seconds to a minute, scoring with it microseconds).

    The gains are computed under ``model.evidence_view(evidence_strength)``
    (:meth:`models.persona.PersonaMixture.evidence_view`): a class's answer distribution
    for an item is shrunk towards the population's by how few answers it was estimated
    from, ``μ' = w μ + (1 − w) p̄`` with ``w = e / (e + m)``. A model fitted on few
    respondents then leaves the fixed order only for a gain its data can vouch for; a
    model fitted on thousands (``e ≫ m``) is unchanged, and so is one without evidence
    (personas, CAPE, IRT). The posterior, the ranks and every prediction use the model
    itself.

    With ``tau = 1`` the gains ``G`` are the one-step target gains under that view (the
    exact gains without evidence or with ``evidence_strength = 0``), returned by
    :meth:`score_with_gains` so that a stopping rule needs no second lookahead.
    """

    name = "eig_anchored"
    description = "eig minus delta per position skipped in the non-adaptive fixed order"
    uses_fixed_order = True

    def __init__(
        self,
        delta: float = DEFAULT_DELTA,
        tau: float = 1.0,
        seed: int = 0,
        evidence_strength: float = DEFAULT_EVIDENCE_STRENGTH,
        **fixed_kwargs: Any,
    ) -> None:
        if delta < 0:
            raise ElicitationError(f"criterion {self.name!r}: delta must be >= 0")
        if not evidence_strength >= 0:
            raise ElicitationError(f"criterion {self.name!r}: evidence_strength must be >= 0")
        self.delta = float(delta)
        self.evidence_strength = float(evidence_strength)
        self._gain: SelectionCriterion = (
            ExpectedInformationGain() if tau == 1.0 else TemperedInformationGain(tau=tau)
        )
        self.tau = float(tau)
        self._fixed = FixedOrder(seed=seed, **fixed_kwargs)

    def params(self) -> dict[str, Any]:
        return {
            "delta": self.delta,
            "tau": self.tau,
            "evidence_strength": self.evidence_strength,
            **self._fixed.params(),
        }

    @property
    def fixed(self) -> FixedOrder:
        """The anchoring :class:`FixedOrder` (its ``params()`` identify the order)."""
        return self._fixed

    def prepare(self, model: BeliefModel, pool: ItemList, targets: ItemList) -> None:
        self._fixed.prepare(model, pool, targets)

    def set_fixed_order(
        self,
        model: BeliefModel,
        pool: ItemList,
        targets: ItemList,
        order: ItemList,
        expectation: Sequence[str] = (),
    ) -> None:
        """Anchor to a precomputed fixed ``order`` (see :meth:`FixedOrder.set_fixed_order`)."""
        self._fixed.set_fixed_order(model, pool, targets, order, expectation)

    def score_with_gains(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> tuple[Tensor, Tensor | None]:
        cand, tgt = as_items(candidates), as_items(targets)
        check_targets(self.name, tgt)
        if not cand:
            empty = torch.zeros(0, dtype=DTYPE)
            return empty, (empty if self.tau == 1.0 else None)
        done: frozenset[int] = getattr(state, "observed_items", frozenset())
        asked = torch.tensor([[c in done for c in cand]])
        gains = self._gain.score(self._view(model), state, cand, tgt)
        scores = gains - self.delta * self._ranks(model, cand, tgt, asked)[0]
        return scores, (gains if self.tau == 1.0 else None)

    def _view(self, model: BeliefModel) -> BeliefModel:
        """The model the gains are computed under (class docstring)."""
        view = getattr(model, "evidence_view", None)
        return model if view is None else view(self.evidence_strength)

    def _ranks(self, model: BeliefModel, cand: list[int], tgt: list[int], asked: Tensor) -> Tensor:
        """``r [B, C]``: unanswered candidates before each candidate in the fixed order."""
        pos = -self._fixed.score(model, None, cand, tgt)  # [C] positions in the order
        before = (pos.unsqueeze(0) < pos.unsqueeze(1)).to(DTYPE)  # [C, C]: j before i
        return (~asked).to(DTYPE) @ before.T  # [B, C]

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        return self.score_with_gains(model, state, candidates, targets)[0]

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand, tgt = as_items(candidates), as_items(targets)
        check_targets(self.name, tgt)
        gains = self._gain.score_batch(self._view(model), states, cand, tgt)
        responses = getattr(states, "responses", None)
        if isinstance(responses, Tensor) and responses.dim() == 2:
            asked = responses[:, torch.tensor(cand, dtype=torch.long)] >= 0
        else:
            asked = torch.zeros(gains.shape, dtype=torch.bool)
        return gains - self.delta * self._ranks(model, cand, tgt, asked)
