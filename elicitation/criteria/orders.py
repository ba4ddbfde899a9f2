"""Non-adaptive orders: ``random`` (seeded random scores) and ``fixed`` (one greedy order).

Example::

    fixed = get_criterion("fixed")
    fixed.prepare(model, pool, targets)
    fixed.order  # the items of pool, most informative under the prior first
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from elicitation.criteria.base import (
    ItemList,
    SelectionCriterion,
    as_items,
    check_targets,
    expected_target_entropy,
)
from elicitation.criteria.registry import register_criterion
from elicitation.errors import ElicitationError
from models.base import DTYPE, MISSING, BeliefModel


@register_criterion
class RandomOrder(SelectionCriterion):
    """Uniformly random scores from a seeded generator (a fresh random order per call).

    Reproducible: two instances with the same ``seed`` give the same scores for the same
    sequence of calls. ``argmax`` of i.i.d. uniform scores is a uniformly random candidate.
    """

    name = "random"
    description = "uniformly random order (seeded)"

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)

    def params(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        return torch.rand(len(as_items(candidates)), generator=self._gen, dtype=DTYPE)

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        b = model.predict_batch(states, as_items(targets)[:1] or [0]).shape[0]
        return torch.rand(b, len(as_items(candidates)), generator=self._gen, dtype=DTYPE)


@register_criterion
class FixedOrder(SelectionCriterion):
    """A non-adaptive question order, chosen greedily under the population prior.

    "Algorithm 1" of docs/methods.md §1: one list for everybody. With ``S`` the items
    already in the list, the next item is

    ``x* = argmin_x E_{Y_S, Y_x ~ p} [ (1/|I*|) sum_t H(p(Y_t | Y_S, Y_x)) ]``

    where ``p`` is the model's prior predictive with no attribute observed (a respondent
    drawn from the whole population). The expectation over ``Y_x`` is always exact (the
    model's lookahead); the expectation over the answers ``Y_S`` to the earlier picks is

    * exact while the number of answer sequences of ``S`` is at most ``max_enumeration``:
      every sequence is enumerated with its prior probability
      ``p(Y_S) = prod_j p(Y_{s_j} | Y_{s_<j})``;
    * after that, a Monte Carlo average over ``n_simulated`` respondents simulated from
      the model (ancestral sampling: when the switch happens, sequences are drawn from the
      exact weighted enumeration; afterwards each simulated respondent draws its answer
      to every new pick from its own predictive), seeded by ``seed``.

    The order is computed in :meth:`prepare` (or at the first :meth:`score` call) on the
    candidate pool and cached for that model, pool and targets; it ignores the
    respondent's state. ``score`` is ``-position`` in the order (earlier = higher), so a
    caller that drops unavailable items asks the next available one in the list.
    ``length`` caps the greedy order (items after it keep the pool order).
    """

    name = "fixed"
    description = "one non-adaptive order chosen greedily under the prior (score = -position)"
    adaptive = False
    uses_fixed_order = True

    def __init__(
        self,
        max_enumeration: int = 1024,
        n_simulated: int = 1024,
        seed: int = 0,
        length: int | None = None,
        chunk_size: int = 256,
    ) -> None:
        if max_enumeration < 1 or n_simulated < 1 or chunk_size < 1:
            raise ElicitationError(
                "criterion 'fixed': max_enumeration, n_simulated and chunk_size must be >= 1"
            )
        if length is not None and length < 0:
            raise ElicitationError("criterion 'fixed': length must be >= 0")
        self.max_enumeration = int(max_enumeration)
        self.n_simulated = int(n_simulated)
        self.seed = int(seed)
        self.length = length
        self.chunk_size = int(chunk_size)
        self._model: BeliefModel | None = None
        self._pool: tuple[int, ...] = ()
        self._targets: tuple[int, ...] = ()
        self._order: list[int] = []
        self._modes: list[str] = []
        self._rank: dict[int, int] = {}

    def params(self) -> dict[str, Any]:
        return {
            "max_enumeration": self.max_enumeration,
            "n_simulated": self.n_simulated,
            "seed": self.seed,
            "length": self.length,
        }

    def explain(self) -> dict[str, Any]:
        out = super().explain()
        out["order"] = list(self._order)
        out["expectation"] = list(self._modes)
        return out

    @property
    def order(self) -> list[int]:
        """The cached order (empty before :meth:`prepare`)."""
        return list(self._order)

    @property
    def expectation(self) -> list[str]:
        """How each pick's expectation was computed (``exact`` / ``simulated(M)``)."""
        return list(self._modes)

    def prepare(self, model: BeliefModel, pool: ItemList, targets: ItemList) -> None:
        pool_t, tgt = tuple(as_items(pool)), tuple(as_items(targets))
        if self._model is model and self._pool == pool_t and self._targets == tgt:
            return
        check_targets(self.name, list(tgt))
        order, modes = self._greedy(model, list(pool_t), list(tgt))
        self._set(model, pool_t, tgt, order, modes)

    def set_fixed_order(
        self,
        model: BeliefModel,
        pool: ItemList,
        targets: ItemList,
        order: ItemList,
        expectation: Sequence[str] = (),
    ) -> None:
        """Use a precomputed ``order`` of ``pool`` (e.g. stored with a fitted model).

        Afterwards :meth:`prepare` with the same ``model`` object, ``pool`` (same items in
        the same order) and ``targets`` does nothing, and scoring never runs the greedy
        search. ``order`` must be a permutation of ``pool`` (what :meth:`prepare` would
        cache); the caller is responsible for it having been computed for this model,
        pool, targets and :meth:`params`.

        Raises:
            ElicitationError: ``order`` is not a permutation of ``pool``, or no targets.
        """
        pool_t, tgt, order_l = tuple(as_items(pool)), tuple(as_items(targets)), as_items(order)
        check_targets(self.name, list(tgt))
        if sorted(order_l) != sorted(pool_t) or len(set(order_l)) != len(order_l):
            raise ElicitationError(
                f"criterion {self.name!r}: a stored order must list every item of the pool "
                f"exactly once (pool {list(pool_t)}, order {order_l})"
            )
        self._set(model, pool_t, tgt, order_l, list(expectation))

    def _set(
        self,
        model: BeliefModel,
        pool: tuple[int, ...],
        tgt: tuple[int, ...],
        order: list[int],
        modes: list[str],
    ) -> None:
        self._order, self._modes = order, modes
        self._rank = {item: pos for pos, item in enumerate(order)}
        self._model, self._pool, self._targets = model, pool, tgt

    def _positions(self, model: BeliefModel, cand: list[int], tgt: list[int]) -> Tensor:
        if not (
            self._model is model and self._targets == tuple(tgt) and set(cand) <= set(self._pool)
        ):
            self.prepare(model, cand, tgt)
        rank = self._rank
        return torch.tensor([-float(rank[c]) for c in cand], dtype=DTYPE)

    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand = as_items(candidates)
        if not cand:
            return torch.zeros(0, dtype=DTYPE)
        return self._positions(model, cand, as_items(targets))

    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        cand, tgt = as_items(candidates), as_items(targets)
        b = model.predict_batch(states, tgt[:1] or [0]).shape[0]
        if not cand:
            return torch.zeros(b, 0, dtype=DTYPE)
        return self._positions(model, cand, tgt).unsqueeze(0).expand(b, -1).clone()

    # ---- the greedy construction -------------------------------------------------
    def _expected(
        self, model: BeliefModel, obs: Tensor, logw: Tensor, remaining: list[int], tgt: list[int]
    ) -> tuple[Tensor, Tensor]:
        """Weighted expected target entropy ``[C]`` and each sequence's ``p_x [M, C, O]``."""
        w = torch.softmax(logw, 0)
        total = torch.zeros(len(remaining), dtype=DTYPE)
        p_xs = []
        for lo in range(0, obs.shape[0], self.chunk_size):
            states = model.initial_batch(obs[lo : lo + self.chunk_size])
            p_x, p_t = model.lookahead_batch(states, remaining, tgt)
            total += (w[lo : lo + self.chunk_size, None] * expected_target_entropy(p_x, p_t)).sum(0)
            p_xs.append(p_x)
        return total, torch.cat(p_xs)

    def _greedy(
        self, model: BeliefModel, pool: list[int], tgt: list[int]
    ) -> tuple[list[int], list[str]]:
        n_opt = model.item_bank.n_options
        gen = torch.Generator().manual_seed(self.seed)
        n_steps = len(pool) if self.length is None else min(self.length, len(pool))
        obs = torch.full((1, model.item_bank.n_items), MISSING, dtype=torch.long)
        logw = torch.zeros(1, dtype=DTYPE)
        remaining = list(pool)
        order: list[int] = []
        modes: list[str] = []
        exact = True
        for step in range(n_steps):
            modes.append("exact" if exact else f"simulated({obs.shape[0]})")
            score, p_x = self._expected(model, obs, logw, remaining, tgt)
            best = int(torch.argmin(score))
            x = remaining.pop(best)
            order.append(x)
            if step == n_steps - 1:
                break
            px = p_x[:, best, : n_opt[x]].clamp_min(0)  # [M, O_x]
            m = obs.shape[0]
            if exact and m * n_opt[x] <= self.max_enumeration:
                obs = obs.repeat_interleave(n_opt[x], 0)
                obs[:, x] = torch.arange(n_opt[x]).repeat(m)
                logw = (logw.unsqueeze(1) + px.clamp_min(1e-300).log()).reshape(-1)
                keep = px.reshape(-1) > 0
                obs, logw = obs[keep], logw[keep]
            else:
                if exact:  # switch: draw sequences from the exact weighted enumeration
                    idx = torch.multinomial(
                        torch.softmax(logw, 0), self.n_simulated, replacement=True, generator=gen
                    )
                    obs, px = obs[idx], px[idx]
                    logw = torch.zeros(self.n_simulated, dtype=DTYPE)
                    exact = False
                obs = obs.clone()
                obs[:, x] = torch.multinomial(px, 1, generator=gen).squeeze(1)
        order.extend(remaining)
        return order, modes
