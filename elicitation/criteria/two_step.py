"""Two-step expected information gain: ``eig2``, the question and then the best follow-up.

Example::

    scores = get_criterion("eig2", top_k=3).score_batch(model, states, candidates, targets)
"""

from __future__ import annotations

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
    require_method,
)
from elicitation.criteria.registry import register_criterion
from elicitation.errors import ElicitationError
from models.base import DTYPE, BeliefModel


@register_criterion
class TwoStepInformationGain(SelectionCriterion):
    """Expected information gain about the targets over the next two questions.

    The greedy ``eig`` rule values a question only by what its own answer tells; a
    question whose answer mostly helps to choose a good *next* question is undervalued.
    This rule looks one question further for the most promising candidates. With
    ``E(x | h) = sum_k p(Y_x = k | h) (1/|I*|) sum_t H(p(Y_t | h, Y_x = k))`` the expected
    mean target entropy after ``x`` (what ``eig`` minimises) and ``H_now`` the current one:

    ``G1(x) = H_now - E(x | h)`` (the ``eig`` score),
    ``G2(x) = H_now - sum_k p(Y_x = k | h) min_{x' in F, x' != x} E(x' | h, Y_x = k)``
    (asking ``x`` and then the best follow-up), and

    ``score(x) = (G1(x) + G2(x)) / 2``

    the mean entropy reduction over the next two questions: a session can stop after
    either, and the targets are predicted after every answer, so both count (with ``G2``
    alone, an uninformative question followed by an informative one would tie with the
    reverse order). The follow-up is searched in ``F``, the ``follow_k`` askable candidates
    with the highest ``G1`` now; ``score`` is computed for the ``top_k`` candidates with the
    highest ``G1``, the others score ``G1``. Another answer never increases the expected
    entropy, so ``G2(x) >= G1(x)`` and a top candidate's score is at least the ``G1`` of
    every other candidate: the pick is always one of the top candidates (ties to the
    earlier candidate). With ``top_k = 1`` the pick is ``eig``'s.

    A candidate without a follow-up (the last one left) scores ``G1``. The one-step gains
    are returned by :meth:`score_with_gains` for the stopping rules. Needs the batched
    lookahead and ``model.branch_batch`` (hypothetical next answers; persona mixtures and
    latent classes have it) and, for one respondent, ``model.to_batch``.

    Cost: one lookahead over all candidates plus one over ``F`` for each of the
    ``sum_{top x} O_x`` hypothetical answers.
    """

    name = "eig2"
    description = (
        "mean expected reduction of the mean target entropy over the next two questions "
        "(the question, then the best follow-up; nats)"
    )
    # Scores of the top candidates are two-question gains, not one-step gains.
    scores_are_target_gains = False

    def __init__(
        self,
        top_k: int = 3,
        follow_k: int = 8,
        chunk_rows: int = 256,
        first_weight: float = 0.5,
        follow_up: str = "adaptive",
    ) -> None:
        if top_k < 1 or follow_k < 2 or chunk_rows < 1:
            raise ElicitationError(
                f"criterion {self.name!r}: top_k and chunk_rows must be >= 1, follow_k >= 2"
            )
        self.top_k = int(top_k)
        self.follow_k = int(follow_k)
        self.chunk_rows = int(chunk_rows)
        if not 0 <= first_weight <= 1:
            raise ElicitationError(f"criterion {self.name!r}: first_weight must be in [0, 1]")
        self.first_weight = float(first_weight)
        if follow_up not in ("adaptive", "fixed"):
            raise ElicitationError(
                f"criterion {self.name!r}: follow_up must be 'adaptive' or 'fixed', got {follow_up!r}"
            )
        self.follow_up = follow_up

    def params(self) -> dict[str, Any]:
        return {
            "top_k": self.top_k,
            "follow_k": self.follow_k,
            "first_weight": self.first_weight,
            "follow_up": self.follow_up,
        }

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        return self.score_with_gains(model, state, candidates, targets)[0]

    def score_with_gains(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> tuple[Tensor, Tensor | None]:
        cand, tgt = as_items(candidates), as_items(targets)
        check_targets(self.name, tgt)
        if not cand:
            return torch.zeros(0, dtype=DTYPE), torch.zeros(0, dtype=DTYPE)
        to_batch = require_method(model, "to_batch", self.name, "a batch form of one state")
        scores, gains = self._scores(model, to_batch(state), cand, tgt)
        return scores[0], gains[0]

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand, tgt = as_items(candidates), as_items(targets)
        check_targets(self.name, tgt)
        return self._scores(model, states, cand, tgt)[0]

    def _scores(
        self, model: BeliefModel, states: Any, cand: list[int], tgt: list[int]
    ) -> tuple[Tensor, Tensor]:
        """``(scores [B, C], one-step gains [B, C])``."""
        branch = require_method(model, "branch_batch", self.name, "hypothetical next answers")
        p_x, p_t = model.lookahead_batch(states, cand, tgt)  # [B, C, O], [B, C, O, T, O]
        b, c_n = p_x.shape[0], len(cand)
        now = mean_target_entropy(model.predict_batch(states, tgt))  # [B]
        gains = now.unsqueeze(-1) - expected_target_entropy(p_x, p_t)  # [B, C]
        scores = gains.clone()
        cand_t = torch.tensor(cand, dtype=torch.long)
        responses = getattr(states, "responses", None)
        if isinstance(responses, Tensor) and responses.dim() == 2 and responses.shape[0] == b:
            askable = responses[:, cand_t] < 0  # [B, C]
        else:
            askable = torch.ones(b, c_n, dtype=torch.bool)
        ranked = gains.masked_fill(~askable, -math.inf)
        # Stable ranking: higher gain first, the earlier candidate on ties.
        order = torch.sort(-ranked, dim=1, stable=True).indices  # [B, C]
        top = order[:, : min(self.top_k, c_n)]  # [B, k]
        follow = order[:, : min(self.follow_k, c_n)]  # [B, F]
        n_ask = askable.sum(1)  # [B]
        n_opt = torch.tensor(model.item_bank.n_options, dtype=torch.long)
        # One hypothetical row per (respondent, top candidate, option of that candidate).
        k_n = top.shape[1]
        o_max = int(n_opt[cand_t].max())
        rb = torch.arange(b).view(b, 1, 1).expand(b, k_n, o_max)
        rj = torch.arange(k_n).view(1, k_n, 1).expand(b, k_n, o_max)
        ro = torch.arange(o_max).view(1, 1, o_max).expand(b, k_n, o_max)
        top_c = top.unsqueeze(2).expand(b, k_n, o_max)
        # a top candidate is scored only if it is askable and has a follow-up
        live = (
            (ro < n_opt[cand_t[top_c]])
            & askable.gather(1, top).unsqueeze(2)
            & (n_ask >= 2).view(b, 1, 1)
        )
        rb, rj, ro, rc = rb[live], rj[live], ro[live], top_c[live]
        if rb.numel() == 0:
            return scores, gains
        # Follow-up candidates: F of the row's respondent, without x itself (and askable).
        f_mask = torch.zeros(b, c_n, dtype=torch.bool)
        f_mask.scatter_(1, follow, True)
        f_mask &= askable
        f_cols = f_mask.any(0).nonzero().flatten()  # candidate columns needed by some row
        f_items = cand_t[f_cols].tolist()
        weight = p_x[rb, rc, ro]
        if self.follow_up == "adaptive":
            best = torch.empty(rb.numel(), dtype=DTYPE)
        else:  # E(x, x') = sum_k p(k) E(x' | h, Y_x = k), accumulated per (b, top x, x')
            joint = torch.zeros(b, k_n, f_cols.numel(), dtype=DTYPE)
        for s in range(0, rb.numel(), self.chunk_rows):
            sl = slice(s, s + self.chunk_rows)
            st = branch(states, rb[sl], cand_t[rc[sl]], ro[sl])
            px2, pt2 = model.lookahead_batch(st, f_items, tgt)
            e2 = expected_target_entropy(px2, pt2)  # [rows, |f_cols|]
            allowed = f_mask[rb[sl]][:, f_cols] & (f_cols.unsqueeze(0) != rc[sl].unsqueeze(1))
            if self.follow_up == "adaptive":
                best[sl] = e2.masked_fill(~allowed, math.inf).min(1).values
            else:
                e2 = e2.masked_fill(~allowed, math.inf) * weight[sl].unsqueeze(1)
                joint.index_put_(
                    (rb[sl], rj[sl]), torch.nan_to_num(e2, nan=math.inf), accumulate=True
                )
        if self.follow_up == "adaptive":
            two = torch.zeros(b, k_n, dtype=DTYPE).index_put_(
                (rb, rj), weight * best, accumulate=True
            )
        else:
            two = joint.min(2).values if f_cols.numel() else torch.zeros(b, k_n, dtype=DTYPE)
        scored = torch.zeros(b, k_n, dtype=torch.bool)
        scored[rb, rj] = True
        rows_s, cols_s = scored.nonzero(as_tuple=True)
        top_s = top[rows_s, cols_s]
        g2 = now[rows_s] - two[rows_s, cols_s]
        a = self.first_weight
        scores[rows_s, top_s] = a * gains[rows_s, top_s] + (1 - a) * g2
        return scores, gains
