"""The round context and the selectors: which question, and whom to ask it.

A :class:`RoundContext` holds what one round may look at (the belief model, every
member's answers, the targets, response chances, the GNN) and caches member gains.
A :class:`QuestionSelector` scores the unasked candidates and picks the best
(:data:`QUESTION_SELECTORS`); a :class:`RespondentSelector` picks up to ``n`` eligible
members (:data:`RESPONDENT_SELECTORS`).

Example::

    ctx = RoundContext(model, history, observed, targets, response_prob, gen)
    question, scores = QUESTION_SELECTORS["eig_budget"]().select(ctx, candidates, n_ask=25)
    members = RESPONDENT_SELECTORS["eig"]().select(ctx, question, 25, eligible)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from elicitation.errors import GroupError
from elicitation.group.clustering import kmeans, nearest_distinct, two_level_kmeans_pick
from elicitation.group.gains import (
    LOOKAHEAD,
    LOOKAHEAD_SECOND,
    LOOKAHEAD_TOP,
    member_eig,
    member_lookahead_accuracy_gain,
)
from models.base import DTYPE, BeliefModel

if TYPE_CHECKING:
    from gnn.train import TrainedGNN

# ----------------------------------------------------------------------------------------
# the round context


@dataclass
class GNNView:
    """A trained GNN seen through a belief model's item bank.

    Attributes:
        gnn: the trained GNN.
        attribute_items: bank index of each GNN attribute column (``A`` entries).
        question_items: bank index of each GNN question (``Q`` entries).
    """

    gnn: TrainedGNN
    attribute_items: list[int]
    question_items: list[int]

    def _split(self, observed: Tensor) -> tuple[Tensor, Tensor]:
        return observed[:, self.attribute_items], observed[:, self.question_items]

    def predict(self, observed: Tensor, n_items: int, max_options: int) -> Tensor:
        """``[N, n_items, max_options]`` GNN predictives in bank space (zeros elsewhere)."""
        a, r = self._split(observed)
        p = self.gnn.predict(a, r)
        out = torch.zeros(observed.shape[0], n_items, max_options, dtype=DTYPE)
        out[:, self.question_items, : p.shape[-1]] = p
        return out

    def embeddings(self, observed: Tensor) -> Tensor:
        a, r = self._split(observed)
        return self.gnn.embeddings(a, r)


@dataclass
class RoundContext:
    """What the selectors of one round may look at.

    Attributes:
        model: the belief model.
        history: ``[N, I]`` answers the belief model conditions on (observed + imputed).
        observed: ``[N, I]`` real observations (attributes and answers; ``-1`` none).
        targets: target item indices.
        response_prob: ``[N]`` chance each member answers when asked.
        gen: random generator of this group elicitation.
        gnn: the GNN view, or ``None``.
        eig_cache: ``{(uncertainty, item): [N] gain_v(item)}`` filled on demand.
        lookahead_q: chance that a member asked now is asked once more in a later round
            (the :data:`LOOKAHEAD` gain; times the member's ``response_prob`` it is the
            chance of one more answer).
        later: the questions that may still follow (the round's remaining candidates;
            ``None``: the items scored).
    """

    model: BeliefModel
    history: Tensor
    observed: Tensor
    targets: list[int]
    response_prob: Tensor
    gen: torch.Generator
    gnn: GNNView | None = None
    eig_cache: dict[tuple[str, int], Tensor] = field(default_factory=dict)
    lookahead_q: float = 0.0
    later: list[int] | None = None

    @property
    def n_members(self) -> int:
        return int(self.observed.shape[0])

    def gains(
        self,
        history: Tensor,
        items: Sequence[int],
        uncertainty: str,
        response: Tensor | None = None,
    ) -> Tensor:
        """``[B, len(items)]`` member gains for ``history`` (no cache):
        :func:`member_eig` with ``uncertainty``, or for :data:`LOOKAHEAD` /
        :data:`LOOKAHEAD_TOP` :func:`member_lookahead_accuracy_gain` over :attr:`later`
        (all of it / each member's :data:`LOOKAHEAD_SECOND` best) with each member's
        chance of one more answer, :attr:`lookahead_q` times ``response`` (``[B]``, the
        rows' response probabilities; ``None``: 1)."""
        if uncertainty in (LOOKAHEAD, LOOKAHEAD_TOP):
            q: float | Tensor = self.lookahead_q
            if response is not None and not bool((response == 1).all()):
                q = self.lookahead_q * response.to(DTYPE)
            return member_lookahead_accuracy_gain(
                self.model,
                history,
                items,
                self.targets,
                q,
                later=self.later,
                max_later=LOOKAHEAD_SECOND if uncertainty == LOOKAHEAD_TOP else None,
            )
        return member_eig(self.model, history, items, self.targets, uncertainty=uncertainty)

    def eig(self, items: Sequence[int], uncertainty: str = "entropy") -> Tensor:
        """``[N, len(items)]`` member gain of each item (:meth:`gains` with
        ``uncertainty``; computed once per item and uncertainty)."""
        todo = [int(i) for i in items if (uncertainty, int(i)) not in self.eig_cache]
        if todo:
            m = self.gains(self.history, todo, uncertainty, self.response_prob)
            for j, i in enumerate(todo):
                self.eig_cache[(uncertainty, i)] = m[:, j]
        return torch.stack([self.eig_cache[(uncertainty, int(i))] for i in items], 1)


# ----------------------------------------------------------------------------------------
# question selectors


class QuestionSelector:
    """Chooses the round's question among the unasked candidates."""

    def scores(self, ctx: RoundContext, candidates: list[int], n_ask: int) -> Tensor:
        """``[C]`` scores (higher is better)."""
        raise NotImplementedError

    def select(self, ctx: RoundContext, candidates: list[int], n_ask: int) -> tuple[int, Tensor]:
        """The best candidate (lowest index on ties) and all scores."""
        if not candidates:
            raise GroupError("no candidate question is left to ask")
        s = self.scores(ctx, candidates, n_ask)
        return candidates[int(torch.argmax(s))], s


class RandomQuestion(QuestionSelector):
    """A uniformly random candidate (random scores)."""

    def scores(self, ctx: RoundContext, candidates: list[int], n_ask: int) -> Tensor:
        return torch.rand(len(candidates), generator=ctx.gen, dtype=DTYPE)


class GroupEIGQuestion(QuestionSelector):
    """Sum over members of ``EIG_v(x)`` (docs/methods.md [3]), on a random subsample of
    members.

    Args:
        subsample: share of members scored (``1.0`` = all); [3] uses 0.1.
    """

    def __init__(self, subsample: float = 1.0) -> None:
        if not 0.0 < subsample <= 1.0:
            raise GroupError(f"subsample must be in (0, 1], got {subsample}")
        self.subsample = subsample

    def scores(self, ctx: RoundContext, candidates: list[int], n_ask: int) -> Tensor:
        if self.subsample >= 1.0:
            return ctx.eig(candidates).sum(0)
        n = ctx.n_members
        m = max(1, int(round(self.subsample * n)))
        rows = torch.randperm(n, generator=ctx.gen)[:m]
        return member_eig(ctx.model, ctx.history[rows], candidates, ctx.targets).sum(0)


class BudgetEIGQuestion(QuestionSelector):
    """Gain of the members that would be asked: the top ``n_ask`` of ``r_v EIG_v(x)``.

    Choosing the question and respondents jointly: a question that is very informative
    for a few members beats one that is mildly informative for everyone when only a few
    can be asked.

    Args:
        max_members: groups above this are scored on a subsample (see :meth:`scores`).
        uncertainty: the member gain, one of the :data:`SELECTOR_GAINS` values
            (``entropy``: EIG; see :meth:`RoundContext.gains`).
    """

    def __init__(self, max_members: int | None = 4096, uncertainty: str = "entropy") -> None:
        if max_members is not None and max_members < 1:
            raise GroupError(f"max_members must be >= 1, got {max_members}")
        self.max_members = max_members
        self.uncertainty = _check_gain(uncertainty)

    def scores(self, ctx: RoundContext, candidates: list[int], n_ask: int) -> Tensor:
        """Top-``n_ask`` sum of ``r_v EIG_v(x)`` per candidate.

        Groups larger than ``max_members`` are scored on a uniform random subsample of
        ``m = max_members`` members: the top ``round(n_ask m / N)`` of the subsample,
        times ``N / m`` (the same share of the best members, scaled to the group). The
        cost of choosing the question is then bounded by ``m`` members whatever the
        group size; the respondents are still chosen among all members (one EIG pass
        for the chosen question only).
        """
        n = ctx.n_members
        if self.max_members is None or n <= self.max_members:
            gain = ctx.eig(candidates, self.uncertainty)  # [N, C]
            rows = torch.arange(n)
            scale, k = 1.0, n_ask
        else:
            m = self.max_members
            rows = torch.randperm(n, generator=ctx.gen)[:m]
            gain = ctx.gains(
                ctx.history[rows], candidates, self.uncertainty, ctx.response_prob[rows]
            )
            scale, k = n / m, int(round(n_ask * m / n))
        gain = gain * ctx.response_prob[rows].unsqueeze(1)
        not_yet = torch.stack([ctx.observed[rows, c] < 0 for c in candidates], 1)
        gain = torch.where(not_yet, gain, torch.zeros((), dtype=DTYPE))
        k = max(1, min(k, gain.shape[0]))
        return torch.topk(gain, k, dim=0).values.sum(0) * scale


SELECTOR_GAINS: dict[str, str] = {
    "eig": "entropy",
    "eacc": "error",
    "ebrier": "quadratic",
    "eacc2": LOOKAHEAD,
    "elook": LOOKAHEAD_TOP,
}
"""The member gains the budget-aware question selectors (``<name>_budget``) and the
respondent selectors (``<name>``) rank by: information gain, expected accuracy gain,
expected Brier gain, the lookahead accuracy gain over all second questions and over each
member's :data:`LOOKAHEAD_SECOND` best (:meth:`RoundContext.gains`)."""


def _check_gain(uncertainty: str) -> str:
    if uncertainty not in SELECTOR_GAINS.values():
        raise GroupError(
            f"unknown member gain {uncertainty!r} (known: {sorted(SELECTOR_GAINS.values())})"
        )
    return uncertainty


QUESTION_SELECTORS: dict[str, Callable[..., QuestionSelector]] = {
    "random": RandomQuestion,
    "eig": GroupEIGQuestion,
    **{f"{k}_budget": partial(BudgetEIGQuestion, uncertainty=u) for k, u in SELECTOR_GAINS.items()},
}


# ----------------------------------------------------------------------------------------
# respondent selectors


class RespondentSelector:
    """Chooses which members to ask the round's question."""

    def select(self, ctx: RoundContext, question: int, n: int, eligible: Tensor) -> Tensor:
        """Up to ``n`` distinct eligible members (exactly ``n`` when enough are eligible).

        Args:
            ctx: round context.
            question: the round's item.
            n: respondent budget of the round.
            eligible: ``[N]`` bool mask of members that may be asked.

        Returns:
            ``LongTensor [min(n, #eligible)]`` member indices, distinct.
        """
        pool = eligible.nonzero().reshape(-1)
        n = min(int(n), len(pool))
        if n <= 0:
            return torch.zeros(0, dtype=torch.long)
        return self._pick(ctx, question, n, pool)

    def _pick(self, ctx: RoundContext, question: int, n: int, pool: Tensor) -> Tensor:
        raise NotImplementedError


class RandomRespondents(RespondentSelector):
    """``n`` members uniformly at random, without replacement."""

    def _pick(self, ctx: RoundContext, question: int, n: int, pool: Tensor) -> Tensor:
        return pool[torch.randperm(len(pool), generator=ctx.gen)[:n]]


KMEANS_EXACT_MAX = 1 << 24
"""Relational selection runs exact k-means while ``members x k`` is at most this (16.8M
point-centroid pairs: 10,000 members at a 10% budget), and :func:`two_level_kmeans_pick`
above it. Exact Lloyd iterations cost ``O(M k d)`` each, and with ``k`` a share of ``M``
that is quadratic in the group (100,000 members at 10%: 10^9 distances per iteration,
8 GB for one distance matrix)."""


class RelationalRespondents(RespondentSelector):
    """The relational selection of docs/methods.md [3]: k-means over GNN member
    embeddings (k = ``n``), then the eligible member nearest each centroid (each member at
    most once).

    Above :data:`KMEANS_EXACT_MAX` point-centroid pairs the k-means is the two-level
    approximation of :func:`two_level_kmeans_pick` (large groups)."""

    def _pick(self, ctx: RoundContext, question: int, n: int, pool: Tensor) -> Tensor:
        if ctx.gnn is None:
            raise GroupError("relational respondent selection needs a trained GNN")
        emb = ctx.gnn.embeddings(ctx.observed)[pool]
        if len(pool) * n > KMEANS_EXACT_MAX:
            return pool[two_level_kmeans_pick(emb, n, ctx.gen)]
        cent = kmeans(emb, n, ctx.gen)
        return pool[nearest_distinct(cent, emb)]


class EIGRespondents(RespondentSelector):
    """Greedy by expected gain about the group targets, ``r_v * EIG_v(question)``.

    The expected gain of asking member ``v`` is the gain if it answers times the chance
    ``r_v`` that it does (a non-answer brings nothing). Under a belief model whose
    members are independent given its parameters the gains of different members add up,
    so the greedy choice is the ``n`` largest (ties: lowest member index). With another
    ``uncertainty`` (a :data:`SELECTOR_GAINS` value) the member gain is that one.
    """

    def __init__(self, uncertainty: str = "entropy") -> None:
        self.uncertainty = _check_gain(uncertainty)

    def _pick(self, ctx: RoundContext, question: int, n: int, pool: Tensor) -> Tensor:
        gain = ctx.eig([question], self.uncertainty)[:, 0] * ctx.response_prob
        g = gain[pool]
        # stable: sort by -gain then by index
        order = torch.argsort(-g, stable=True)
        return pool[order[:n]]


RESPONDENT_SELECTORS: dict[str, Callable[..., RespondentSelector]] = {
    "random": RandomRespondents,
    "relational": RelationalRespondents,
    **{k: partial(EIGRespondents, uncertainty=u) for k, u in SELECTOR_GAINS.items()},
}
