"""Group elicitation rounds: whom to ask what (METHODS.md §3).

A *group* of ``N`` members (each with attributes and a few answers) is elicited in
rounds. Each round picks **one question** for the whole group and a **subset of
members** to ask it, under budgets; answers arrive (some members do not answer), and
the predictions of every member's answers to the group's **target** items are updated.

Pieces (each a small family with a registry, like :mod:`elicitation.criteria`):

* question selectors (:data:`QUESTION_SELECTORS`):
  ``random``; ``eig`` — expected information gain about the group's targets summed over
  all members (optionally a random subsample of them, the paper's 10%):
  ``EIG(x) = sum_v [ H_v - E_{Y_vx} H_v(. | Y_vx) ]`` with ``H_v = sum_t H(p(Y_vt | h_v))``;
  ``eig_budget`` — the same gain counted only for the members that would actually be
  asked: the ``b`` largest ``r_v * EIG_v(x)`` (``b`` = the round's respondent budget,
  ``r_v`` = the chance member ``v`` answers);
* respondent selectors (:data:`RESPONDENT_SELECTORS`): ``random``; ``relational`` —
  k-means (k = budget) over GNN member embeddings, the member nearest each centroid
  (two-level k-means for large groups, :func:`two_level_kmeans_pick`);
  ``eig`` — greedy by expected gain ``r_v * EIG_v(x)`` about the group targets (the
  belief models here treat members as independent given the fitted parameters, so the
  gains add up and the greedy choice is the top ``b``);
* imputation of members without an answer to the round's question
  (:data:`IMPUTATIONS`): ``none``; ``self`` — the predictor's own most likely answer
  joins the member's history; ``gnn`` — the GNN's most likely answer joins the history
  (the paper); ``gnn_only`` — target predictions come from the GNN alone; ``pool`` —
  the calibrated log-linear pool ``p ∝ p_belief^(1-w) * p_gnn^w`` of the belief model
  and the GNN, ``w`` fitted on validation members (:func:`fit_pool_weight`); ``stack`` —
  the stacked log-linear pool ``p ∝ p_belief^a * p_gnn^c * p_imputed^d`` of the belief
  model, the GNN and the belief model with the GNN's guesses imputed, weights ``>= 0``
  (free sum: they set the temperature too) fitted per round by maximum likelihood on
  validation members (:func:`fit_stack_weights`); it holds ``none`` ``(1, 0, 0)``,
  ``pool`` ``(1 - w, w, 0)``, ``gnn_only`` ``(0, 1, 0)`` and the target predictions of GNN
  imputation ``(0, 0, 1)`` as special cases.

A round in which nobody answers changes nothing: no new information arrived, so no
imputation is made and every prediction stays as it was.

Any belief model of :mod:`models.base` with batched forms (``initial_batch``,
``predict_batch``, ``lookahead_batch``) can be the predictor; states are recomputed from
the observed (and imputed) answers, so a state always equals the replay of its answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor

from elicitation.errors import BudgetError, ElicitationError
from gnn.train import TrainedGNN
from models.base import DTYPE, MISSING, BeliefModel


class GroupError(ElicitationError, ValueError):
    """Invalid group-elicitation input (unknown selector, bad member set, ...)."""


# ----------------------------------------------------------------------------------------
# budgets


@dataclass(frozen=True)
class GroupBudget:
    """Budgets of a group elicitation.

    Attributes:
        respondents: respondents asked per round: an ``int >= 1`` is a count, a ``float``
            in ``(0, 1]`` is a share of the group (rounded to the nearest count, >= 1).
        rounds: number of rounds (one question each).
        total_answers: cap on the number of members asked over all rounds (``None``: no cap).
        max_questions_per_respondent: a member is asked at most this many questions
            (``None``: no cap).
    """

    respondents: int | float
    rounds: int
    total_answers: int | None = None
    max_questions_per_respondent: int | None = None

    def __post_init__(self) -> None:
        r = self.respondents
        if isinstance(r, bool) or not isinstance(r, int | float):
            raise BudgetError(f"respondents must be a count or a share, got {r!r}")
        if isinstance(r, int) and r < 1:
            raise BudgetError(f"respondents per round must be >= 1, got {r}")
        if isinstance(r, float) and not 0.0 < r <= 1.0:
            raise BudgetError(f"a respondent share must be in (0, 1], got {r}")
        if self.rounds < 0:
            raise BudgetError(f"rounds must be >= 0, got {self.rounds}")
        if self.total_answers is not None and self.total_answers < 0:
            raise BudgetError(f"total_answers must be >= 0, got {self.total_answers}")
        if self.max_questions_per_respondent is not None and self.max_questions_per_respondent < 1:
            raise BudgetError(
                f"max_questions_per_respondent must be >= 1, got {self.max_questions_per_respondent}"
            )

    def per_round(self, n_members: int) -> int:
        """Respondents per round for a group of ``n_members``."""
        if isinstance(self.respondents, float):
            return max(1, int(math.floor(self.respondents * n_members + 0.5)))
        return int(self.respondents)


# ----------------------------------------------------------------------------------------
# information gain


def _entropy(p: Tensor) -> Tensor:
    return -torch.special.xlogy(p, p).sum(-1)


def _expected_error(p: Tensor) -> Tensor:
    return 1.0 - p.max(-1).values


def _quadratic(p: Tensor) -> Tensor:
    return 1.0 - (p * p).sum(-1)


UNCERTAINTIES: dict[str, Callable[[Tensor], Tensor]] = {
    "entropy": _entropy,
    "error": _expected_error,
    "quadratic": _quadratic,
}
"""Per-target uncertainty ``u(p)`` whose expected reduction a member gain measures:
``entropy`` (information gain, nats: the expected log-score gain), ``error``
(``1 - max_k p_k``, the chance the most likely answer is wrong: the gain is the expected
rise in target accuracy) or ``quadratic`` (``1 - sum_k p_k^2``: the gain is the expected
fall of the Brier score, proper like the log score but bounded)."""

LOOKAHEAD = "error_lookahead"
"""The gain name of :func:`member_lookahead_accuracy_gain` in :meth:`RoundContext.gains`
(not a per-target uncertainty: it depends on the later questions and their chance)."""

LOOKAHEAD_TOP = "error_lookahead_top"
"""The gain name of :func:`member_lookahead_accuracy_gain` with each member's
:data:`LOOKAHEAD_SECOND` best second questions only (``max_later``)."""


def member_eig(
    model: BeliefModel,
    history: Tensor,
    candidates: Sequence[int],
    targets: Sequence[int],
    *,
    chunk: int = 8192,
    uncertainty: str = "entropy",
) -> Tensor:
    """Expected information gain of each candidate about each member's targets.

    ``EIG_v(x) = sum_t H(p(Y_vt | h_v)) - sum_k p(Y_vx = k | h_v) sum_t H(p(Y_vt | h_v, Y_vx = k))``
    (nats; the sum of target entropies approximates ``H(U_v)`` as in the paper). With
    ``uncertainty="error"`` the entropy ``H`` is replaced by ``1 - max_k p_k``: the
    gain is then the expected rise in the number of targets whose most likely answer is
    right (the value of the answer under 0-1 loss, >= 0 by Jensen).
    Computed with the batched interface every belief model has: one ``update_batch``
    and one ``predict_batch`` per (candidate, option) for all members at once, so the
    cost is ``sum_x O_x`` batched updates, whatever the model family. A member who has
    already answered ``x`` gains nothing from it (``EIG_v(x) = 0``).

    Args:
        model: belief model (``initial_batch``, ``update_batch``, ``predict_batch``).
        history: ``[B, I]`` each member's answers so far (``-1`` none); states are
            rebuilt from it in chunks (a state equals the replay of its answers).
        candidates: ``C`` item indices.
        targets: ``T`` target item indices.
        chunk: members per batch.

    Returns:
        ``[B, C]`` float64, >= 0 up to rounding.
    """
    if uncertainty not in UNCERTAINTIES:
        raise GroupError(f"unknown uncertainty {uncertainty!r} (known: {sorted(UNCERTAINTIES)})")
    u = UNCERTAINTIES[uncertainty]
    cand = [int(c) for c in candidates]
    tgt = [int(t) for t in targets]
    n_opt = model.item_bank.n_options
    o_t = max((n_opt[t] for t in tgt), default=1)
    parts = []
    for s in range(0, int(history.shape[0]), chunk):
        hist = history[s : s + chunk]
        b = int(hist.shape[0])
        state = model.initial_batch(hist)
        now = u(model.predict_batch(state, tgt)[..., :o_t]).sum(-1)  # [b]
        out = torch.zeros(b, len(cand), dtype=DTYPE)
        for j, x in enumerate(cand):
            free = hist[:, x] < 0
            if not bool(free.any()):
                continue
            p_x = model.predict_batch(state, [x])[:, 0, : n_opt[x]]  # [b, O_x]
            after = torch.zeros(b, dtype=DTYPE)
            items = torch.full((b,), x, dtype=torch.long)
            for k in range(n_opt[x]):
                opts = torch.where(free, torch.full((b,), k), torch.full((b,), MISSING))
                nxt = model.update_batch(state, items, opts)
                h = u(model.predict_batch(nxt, tgt)[..., :o_t]).sum(-1)
                after += p_x[:, k] * h
            out[:, j] = torch.where(free, now - after, torch.zeros((), dtype=DTYPE))
        parts.append(out)
    if not parts:
        return torch.zeros(0, len(cand), dtype=DTYPE)
    return torch.cat(parts)


def _expected_after(
    model: BeliefModel, state: Any, x: int, free: Tensor, targets: list[int]
) -> tuple[Tensor, Tensor]:
    """``([B], [B])``: ``E_k err(h, x=k)`` and ``E_k quad(h, x=k)`` under ``state``
    (members with ``free`` false keep ``err(h)``, ``quad(h)``: their update is a no-op),
    ``err = sum_t (1 - max_k p_tk)``, ``quad = sum_t (1 - sum_k p_tk^2)``."""
    n_opt = model.item_bank.n_options
    o_t = max((n_opt[t] for t in targets), default=1)
    b = int(free.shape[0])
    p_x = model.predict_batch(state, [x])[:, 0, : n_opt[x]]
    err = torch.zeros(b, dtype=DTYPE)
    quad = torch.zeros(b, dtype=DTYPE)
    items = torch.full((b,), x, dtype=torch.long)
    for k in range(n_opt[x]):
        opts = torch.where(free, torch.full((b,), k), torch.full((b,), MISSING))
        p_t = model.predict_batch(model.update_batch(state, items, opts), targets)[..., :o_t]
        err += p_x[:, k] * _expected_error(p_t).sum(-1)
        quad += p_x[:, k] * _quadratic(p_t).sum(-1)
    return err, quad


LOOKAHEAD_SECOND = 3
"""How many second questions the lookahead gain tries per member (see ``max_later`` of
:func:`member_lookahead_accuracy_gain`): a cost bound, not fitted to any dataset."""


def _expected_error_after_each(
    model: BeliefModel, state: Any, ys: Tensor, p_y: Tensor, free: Tensor, targets: list[int]
) -> Tensor:
    """``[B]``: ``E_k err(h_v, y_v = k)`` with a different question ``ys[v]`` per member,
    ``p_y [B, O]`` its predictive under ``state`` (members with ``free`` false keep
    ``err(h_v)``), ``err = sum_t (1 - max_k p_tk)``."""
    n_opt = torch.tensor(model.item_bank.n_options)
    o_t = max((int(n_opt[t]) for t in targets), default=1)
    b = int(ys.shape[0])
    n_y = n_opt[ys]
    out = torch.zeros(b, dtype=DTYPE)
    for k in range(int(n_y.max())):
        ok = free & (k < n_y)
        opts = torch.where(ok, torch.full((b,), k), torch.full((b,), MISSING))
        nxt = model.update_batch(state, ys, opts)
        e = _expected_error(model.predict_batch(nxt, targets)[..., :o_t]).sum(-1)
        out += torch.where(k < n_y, p_y[:, k], torch.zeros((), dtype=DTYPE)) * e
    return out


def member_lookahead_accuracy_gain(
    model: BeliefModel,
    history: Tensor,
    candidates: Sequence[int],
    targets: Sequence[int],
    q: float | Tensor,
    *,
    later: Sequence[int] | None = None,
    max_later: int | None = None,
    chunk: int = 8192,
) -> Tensor:
    """Accuracy gain of each candidate when the member may answer once more later.

    The accuracy gain (:func:`member_eig` with ``uncertainty="error"``) is myopic: an
    answer that cannot flip the most likely option of a target is worth 0 although it
    moves the distribution toward a flip by a later answer. With
    ``err(h) = sum_t (1 - max_k p(Y_t = k | h))`` (expected wrong targets):

        G1(x) = err(h) - E_k err(h, x=k)                          (one answer)
        M(x)  = min_{x' != x} E_{k'} err(h, x'=k')
                - E_k min_{x' in S_v(x)} E_{k'} err(h, x=k, x'=k')  (x, then the best x')
        gain  = (1 - q) G1(x) + q M(x)

    ``M`` is the value of ``x`` to a member who will also answer the best other question
    ``x'`` of ``later`` (default: ``candidates``; chosen after seeing the answer to
    ``x``), against answering that one alone;
    ``q`` is the chance of that later answer (:attr:`RoundContext.lookahead_q`: the
    share asked per round times the rounds left after this one, at most 1). ``q = 0``
    gives the accuracy gain exactly (and skips the second answer).

    ``S_v(x)``: the questions of ``later`` other than ``x`` (then ``M >= 0``: two answers
    never raise the expected 0-1 risk); with ``max_later = L`` only the ``L`` of them with
    the highest one-answer Brier gain for this member, i.e. the lowest
    ``E_k' sum_t (1 - sum_k p(Y_t = k | h_v, x'=k')^2)`` (ties: order of ``later``). The
    Brier gain ranks them because the accuracy gain is 0 for every question that cannot
    flip a target alone, which are the ones the lookahead is for; the Brier gain still
    tells how far each moves the targets. ``M`` can then only be smaller than with all of
    ``later`` (and may fall below 0 when the best single question is not among them).

    Cost: ``sum_x O_x`` batched updates for ``G1``, plus ``sum_x O_x (L + 1) O_max``
    for ``M`` with ``max_later = L`` (``(C O)^2`` with all of ``later``).

    Args:
        model, history, candidates, targets, chunk: as :func:`member_eig`.
        q: chance of one more answer, in ``[0, 1]``: one for all members, or ``[B]``
            per member (e.g. times its chance of answering when asked).
        later: the questions that may follow (the round's remaining candidates), so a
            candidate's gain does not depend on which others are scored with it.
        max_later: ``L``, the number of second questions tried per member (``None``:
            all of ``later``).

    Returns:
        ``[B, C]`` float64.
    """
    if isinstance(q, Tensor):
        q = q.to(DTYPE).reshape(-1)
        if q.shape[0] != history.shape[0] or bool(((q < 0) | (q > 1)).any()):
            raise GroupError(f"q must be one chance in [0, 1] or [{history.shape[0]}] of them")
        lookahead = bool((q > 0).any())
    elif not 0.0 <= q <= 1.0:
        raise GroupError(f"q must be in [0, 1], got {q}")
    else:
        lookahead = q > 0.0
    if max_later is not None and max_later < 1:
        raise GroupError(f"max_later must be >= 1 or None, got {max_later}")
    cand = [int(c) for c in candidates]
    nxt_pool = cand if later is None else [int(c) for c in later]
    tgt = [int(t) for t in targets]
    n_opt = model.item_bank.n_options
    o_t = max((n_opt[t] for t in tgt), default=1)
    u = _expected_error
    pool_items = list(dict.fromkeys(nxt_pool))
    parts = []
    for s in range(0, int(history.shape[0]), chunk):
        hist = history[s : s + chunk]
        b = int(hist.shape[0])
        state = model.initial_batch(hist)
        q_b = q[s : s + chunk] if isinstance(q, Tensor) else q
        err0 = u(model.predict_batch(state, tgt)[..., :o_t]).sum(-1)
        free = {x: hist[:, x] < 0 for x in {*cand, *pool_items}}
        after = {x: _expected_after(model, state, x, free[x], tgt) for x in free}
        e1 = {x: a[0] for x, a in after.items()}  # [b] each
        g = torch.zeros(b, len(cand), dtype=DTYPE)
        if pool_items and lookahead:
            quad_pool = torch.stack([after[y][1] for y in pool_items], 1)  # [b, P]
            width = len(pool_items) if max_later is None else min(len(pool_items), max_later + 1)
            rank = torch.argsort(quad_pool, dim=1, stable=True)[:, :width]  # [b, W]
            slot_item = torch.tensor(pool_items)[rank]  # [b, W]
            slot_free = torch.stack([free[y] for y in pool_items], 1).gather(1, rank)
        for j, x in enumerate(cand):
            if not bool(free[x].any()):
                continue
            g1 = err0 - e1[x]
            if not lookahead:
                g[:, j] = torch.where(free[x], g1, torch.zeros((), dtype=DTYPE))
                continue
            others = [y for y in pool_items if y != x]
            best_other = torch.stack([e1[y] for y in others]).min(0).values if others else err0
            if others:
                # slot r is used iff its question is not x and fewer than L slots before it
                # are; every member has the same number of used slots (the same questions
                # in its own order), so they are packed to the left: [b, n_used]
                use = slot_item != x
                if max_later is not None:
                    use &= torch.cumsum(use.long(), 1) <= max_later
                n_used = int(use[0].sum())
                cols = torch.argsort((~use).to(torch.int8), dim=1, stable=True)[:, :n_used]
                items_x, free_x = slot_item.gather(1, cols), slot_free.gather(1, cols)
                pool_col = rank.gather(1, cols)  # [b, n_used] columns of pool_items
            p_x = model.predict_batch(state, [x])[:, 0, : n_opt[x]]
            items = torch.full((b,), x, dtype=torch.long)
            e2 = torch.zeros(b, dtype=DTYPE)
            for k in range(n_opt[x]):
                opts = torch.where(free[x], torch.full((b,), k), torch.full((b,), MISSING))
                st = model.update_batch(state, items, opts)
                if others:
                    # one prediction of every later question serves all slots
                    p_pool = model.predict_batch(st, pool_items)  # [b, P, O]
                    rows = torch.arange(b)
                    m = (
                        torch.stack(
                            [
                                _expected_error_after_each(
                                    model,
                                    st,
                                    items_x[:, r],
                                    p_pool[rows, pool_col[:, r]],
                                    free_x[:, r],
                                    tgt,
                                )
                                for r in range(n_used)
                            ]
                        )
                        .min(0)
                        .values
                    )
                else:
                    m = u(model.predict_batch(st, tgt)[..., :o_t]).sum(-1)
                e2 += p_x[:, k] * m
            g[:, j] = torch.where(
                free[x], (1 - q_b) * g1 + q_b * (best_other - e2), torch.zeros((), dtype=DTYPE)
            )
        parts.append(g)
    return torch.cat(parts) if parts else torch.zeros(0, len(cand), dtype=DTYPE)


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
    """Sum over members of ``EIG_v(x)`` (the paper), on a random subsample of members.

    Args:
        subsample: share of members scored (``1.0`` = all); the paper uses 0.1.
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


def kmeans(x: Tensor, k: int, gen: torch.Generator, iters: int = 25) -> Tensor:
    """Lloyd's k-means with k-means++ seeding; returns the ``[k, d]`` centroids.

    Args:
        x: ``[M, d]`` points (``M >= k``).
        k: number of clusters.
        gen: random generator (seeding).
        iters: Lloyd iterations (stops early when assignments no longer change).
    """
    m = x.shape[0]
    first = int(torch.randint(m, (1,), generator=gen))
    cent = [x[first]]
    d2 = ((x - x[first]) ** 2).sum(1)
    for _ in range(1, k):
        total = float(d2.sum())
        if total <= 0:
            nxt = int(torch.randint(m, (1,), generator=gen))
        else:
            nxt = int(torch.multinomial(d2 / total, 1, generator=gen))
        cent.append(x[nxt])
        d2 = torch.minimum(d2, ((x - x[nxt]) ** 2).sum(1))
    c = torch.stack(cent)
    assign = torch.full((m,), -1, dtype=torch.long)
    for _ in range(iters):
        new = torch.cdist(x, c).argmin(1)
        if torch.equal(new, assign):
            break
        assign = new
        sums = torch.zeros_like(c).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).unsqueeze(1)
        c = torch.where(counts > 0, sums / counts.clamp(min=1), c)
    return c


KMEANS_EXACT_MAX = 1 << 24
"""Relational selection runs exact k-means while ``members x k`` is at most this (16.8M
point-centroid pairs: 10,000 members at a 10% budget), and :func:`two_level_kmeans_pick`
above it. Exact Lloyd iterations cost ``O(M k d)`` each, and with ``k`` a share of ``M``
that is quadratic in the group (100,000 members at 10%: 10^9 distances per iteration,
8 GB for one distance matrix)."""


def nearest_distinct(cent: Tensor, x: Tensor) -> Tensor:
    """For each centroid in turn, the nearest point not taken by an earlier centroid.

    Args:
        cent: ``[k, d]`` centroids.
        x: ``[M, d]`` points (``M >= k``).

    Returns:
        ``[k]`` distinct row indices into ``x``, in centroid order.
    """
    dist = torch.cdist(cent, x)  # [k, M]
    chosen: list[int] = []
    taken = torch.zeros(x.shape[0], dtype=torch.bool)
    for j in range(cent.shape[0]):
        d = dist[j].masked_fill(taken, float("inf"))
        i = int(d.argmin())
        taken[i] = True
        chosen.append(i)
    return torch.tensor(chosen, dtype=torch.long)


def allocate_proportional(sizes: Tensor, k: int) -> Tensor:
    """Split ``k`` slots over groups in proportion to their ``sizes``, at most a group's size.

    Largest remainder: group ``c`` gets ``floor(k s_c / M)`` slots, and the
    ``k - sum floor(.)`` slots left go one each to the groups with the largest remainders
    ``k s_c / M - floor(.)`` (ties: lower group index). As ``k <= M``, ``k s_c / M <= s_c``,
    so a group with a positive remainder has room for its extra slot, and the remainders
    sum to the slots left, so at least that many are positive.

    Args:
        sizes: ``[C]`` group sizes (``>= 0``, sum ``M >= k``).
        k: slots to place.

    Returns:
        ``[C]`` slot counts, summing to ``k``, each ``<= sizes[c]``.
    """
    total = int(sizes.sum())
    if not 0 <= k <= total:
        raise GroupError(f"cannot place {k} slots in groups of {total} members")
    if k == 0:
        return torch.zeros_like(sizes)
    exact = sizes.double() * k / total
    alloc = exact.floor().long()
    order = torch.argsort(-(exact - exact.floor()), stable=True)
    alloc[order[: k - int(alloc.sum())]] += 1
    return alloc


COARSE_SAMPLE_PER_CLUSTER = 128
"""Points per coarse cluster that the first level of :func:`two_level_kmeans_pick` is
fitted on."""


def two_level_kmeans_pick(x: Tensor, k: int, gen: torch.Generator, iters: int = 25) -> Tensor:
    """``k`` distinct representative points of ``x`` by two-level k-means, ``O(M sqrt(k) d)``.

    1. k-means with ``k1 = floor(sqrt(k))`` coarse clusters, fitted on a random sample
       of at most ``COARSE_SAMPLE_PER_CLUSTER * k1`` points (a coarse partition needs no
       more); every point goes to its nearest coarse centroid.
    2. The ``k`` slots are split over the coarse clusters in proportion to their sizes
       (:func:`allocate_proportional`), so each cluster gets about ``k / k1`` and at most
       its size.
    3. Within each coarse cluster, k-means with its slots, and the nearest untaken
       member to each fine centroid (:func:`nearest_distinct`).

    Each fine k-means sees ``~M / k1`` points and ``~k / k1`` centroids, so one Lloyd
    iteration over all of them costs ``O(M k / k1 d) = O(M sqrt(k) d)`` instead of
    ``O(M k d)``; the coarse level costs ``O(128 k1^2 d) = O(k d)`` per iteration on its
    sample and one ``O(M k1 d)`` assignment. The centroids approximate a k-means of all points whose clusters do not
    straddle the coarse boundaries; the picks are the same kind of representatives the
    exact selection returns (one member nearest each of ``k`` cluster centres).

    Args:
        x: ``[M, d]`` points (``M >= k >= 1``).
        k: number of points to pick.
        gen: random generator (seeding of every k-means).
        iters: Lloyd iterations of each k-means.

    Returns:
        ``[k]`` distinct row indices into ``x``.
    """
    k1 = max(1, math.isqrt(k))
    m = x.shape[0]
    sample = torch.randperm(m, generator=gen)[: COARSE_SAMPLE_PER_CLUSTER * k1]
    coarse = kmeans(x[sample], k1, gen, iters)
    assign = torch.cdist(x, coarse).argmin(1)  # [M]
    alloc = allocate_proportional(torch.bincount(assign, minlength=k1), k)
    picks: list[Tensor] = []
    for c in range(k1):
        kc = int(alloc[c])
        if kc == 0:
            continue
        idx = (assign == c).nonzero().squeeze(1)
        pts = x[idx]
        picks.append(idx[nearest_distinct(kmeans(pts, kc, gen, iters), pts)])
    return torch.cat(picks)


class RelationalRespondents(RespondentSelector):
    """The paper's relational selection: k-means over GNN member embeddings (k = ``n``),
    then the eligible member nearest each centroid (each member at most once).

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

IMPUTATIONS = ("none", "self", "gnn", "gnn_only", "pool", "stack")


# ----------------------------------------------------------------------------------------
# pooling


def log_linear_pool(p_a: Tensor, p_b: Tensor, w: float) -> Tensor:
    """``p ∝ p_a^(1-w) * p_b^w`` along the last axis (zeros stay zeros).

    Args:
        p_a, p_b: ``[..., O]`` distributions with the same support.
        w: weight of ``p_b`` in ``[0, 1]``.
    """
    la = p_a.clamp_min(1e-12).log()
    lb = p_b.clamp_min(1e-12).log()
    lg = (1.0 - w) * la + w * lb
    support = (p_a > 0) | (p_b > 0)
    lg = lg.masked_fill(~support, float("-inf"))
    return torch.softmax(lg, -1)


def fit_pool_weight(
    p_belief: Tensor, p_gnn: Tensor, truth: Tensor, grid: int = 21
) -> tuple[float, dict[str, float]]:
    """The pool weight ``w`` with the lowest log loss on held-out answers (grid search).

    Args:
        p_belief, p_gnn: ``[M, T, O]`` predictives of the same (member, target) pairs.
        truth: ``[M, T]`` true options (``-1`` = not scored).
        grid: number of equally spaced weights in ``[0, 1]``.

    Returns:
        ``(w, {str(w): mean log loss})``.
    """
    ok = truth >= 0
    y = truth.clamp_min(0).unsqueeze(-1)
    losses: dict[str, float] = {}
    best_w, best = 0.0, float("inf")
    for j in range(grid):
        w = j / (grid - 1)
        p = log_linear_pool(p_belief, p_gnn, w).gather(-1, y).squeeze(-1)
        loss = float(-(p.clamp_min(1e-12).log()[ok]).mean())
        losses[f"{w:.2f}"] = loss
        if loss < best - 1e-12:
            best, best_w = loss, w
    return best_w, losses


POOL_GRID = 21


def pool_gain_rows(
    p_belief: Tensor, p_gnn: Tensor, truth: Tensor, *, grid: int = POOL_GRID
) -> tuple[Tensor, Tensor]:
    """Per-member log-score gains of the pool over the belief model alone, per weight.

    ``S[v, g] = sum_{t scored} [log p_pool(w_g)(y_vt) - log p_belief(y_vt)]`` with
    ``w_g = g / (grid - 1)``, and ``n[v]`` = the member's number of scored answers;
    members without a scored answer are left out.

    Args:
        p_belief, p_gnn: ``[M, T, O]`` predictives of the same (member, target) pairs.
        truth: ``[M, T]`` true options (``-1`` = not scored).
        grid: number of equally spaced weights in ``[0, 1]``.

    Returns:
        ``(S [M', grid], n [M'])`` float64.
    """
    ok = truth >= 0
    y = truth.clamp_min(0).unsqueeze(-1)
    n = ok.sum(-1)
    rows = n > 0
    lb = p_belief.gather(-1, y).squeeze(-1).clamp_min(1e-12).log()
    cols = []
    for j in range(grid):
        lp = log_linear_pool(p_belief, p_gnn, j / (grid - 1)).gather(-1, y).squeeze(-1)
        d = torch.where(ok, lp.clamp_min(1e-12).log() - lb, torch.zeros((), dtype=lb.dtype))
        cols.append(d.sum(-1)[rows])
    return torch.stack(cols, 1).double(), n[rows].double()


def pool_weight_from_gains(
    sums: Tensor, counts: Tensor, *, z: float = 2.0
) -> tuple[float, dict[str, Any]]:
    """The pool weight from held-out evidence (:func:`pool_gain_rows`): the weight whose
    gain has the highest lower confidence bound, or ``0`` when no bound is above zero.

    For each weight ``w``, the mean gain per answer and its standard error with the
    answers of one unit (a validation member, or one answer of a group member) kept
    together (ratio estimator, cluster-robust):

        g(w) = sum_v S_v(w) / sum_v n_v
        se(w) = sqrt(R / (R - 1) * sum_v (S_v(w) - n_v g(w))^2) / sum_v n_v
        w* = argmax_w [g(w) - z se(w)]   if that maximum is > 0,  else  0.

    So the GNN gets the largest weight whose benefit is still clear given the evidence
    (a weight fitted to noise, or to a population the group does not come from, is not
    used), and units count by how many answers they carry.

    Args:
        sums: ``[R, G]`` summed gains per unit and weight (``w_g = g / (G - 1)``).
        counts: ``[R]`` answers per unit.
        z: standard errors of pessimism.

    Returns:
        ``(w, {"w_best_mean", "gain", "gain_se", "lcb", "rows", "answers"})`` (gain,
        standard error and bound of the chosen weight; of the best-mean weight when
        ``w = 0``).
    """
    r, g = int(sums.shape[0]), int(sums.shape[1])
    weights = [j / (g - 1) for j in range(g)]
    total = float(counts.sum())
    if r < 2 or total <= 0:
        return 0.0, {
            "w_best_mean": 0.0,
            "gain": 0.0,
            "gain_se": float("inf"),
            "lcb": 0.0,
            "rows": r,
            "answers": total,
        }
    mean = sums.sum(0) / total  # [G]
    resid = sums - counts.unsqueeze(1) * mean.unsqueeze(0)
    se = (resid.pow(2).sum(0) * r / (r - 1)).sqrt() / total
    lcb = mean - z * se
    lcb[0] = 0.0  # w = 0 is the belief model itself
    best = int(torch.argmax(lcb))  # lowest weight on ties
    best_mean = int(torch.argmax(mean))
    pick = best if best > 0 else best_mean
    info = {
        "w_best_mean": weights[best_mean],
        "gain": float(mean[pick]),
        "gain_se": float(se[pick]),
        "lcb": float(lcb[pick]),
        "rows": r,
        "answers": total,
    }
    return (weights[best] if float(lcb[best]) > 0 else 0.0), info


def choose_pool_weight(
    p_belief: Tensor, p_gnn: Tensor, truth: Tensor, *, grid: int = POOL_GRID, z: float = 2.0
) -> tuple[float, dict[str, Any]]:
    """The GNN's pool weight, or ``0`` (the belief model alone) unless the GNN clearly helps.

    :func:`pool_gain_rows` on held-out answers, then :func:`pool_weight_from_gains`:
    the weight with the highest lower confidence bound ``g(w) - z se(w)`` of the gain in
    log score per answer (standard errors over members: members are independent, their
    answers are not), ``0`` when no bound is above zero.

    Args:
        p_belief, p_gnn: ``[M, T, O]`` predictives of the same (member, target) pairs.
        truth: ``[M, T]`` true options (``-1`` = not scored).
        grid: weights tried in ``[0, 1]``.
        z: standard errors of pessimism.

    Returns:
        ``(w, info)``: see :func:`pool_weight_from_gains`; also ``info["log_loss"]`` =
        mean log loss per weight over the scored answers, and ``info["gain_sums"]``,
        ``info["gain_counts"]`` = the evidence (for online use).
    """
    sums, counts = pool_gain_rows(p_belief, p_gnn, truth, grid=grid)
    w, info = pool_weight_from_gains(sums, counts, z=z)
    info["members"] = info["rows"]
    info["log_loss"] = fit_pool_weight(p_belief, p_gnn, truth, grid)[1]
    info["gain_sums"], info["gain_counts"] = sums, counts
    return w, info


# ----------------------------------------------------------------------------------------
# stacking: a log-linear pool with free weights (weight and temperature)

STACK_COMPONENTS = ("belief", "gnn", "belief_gnn_imputed")
"""The predictives the ``stack`` imputation combines, in the order of its weights."""


def stacked_pool(probs: Tensor, weights: Tensor | Sequence[float]) -> Tensor:
    """``p ∝ prod_k probs[k]^weights[k]`` along the last axis.

    Args:
        probs: ``[K, ..., O]`` predictives of the same pairs (zeros outside an item's
            options; an option no component supports gets probability 0).
        weights: ``[K]`` exponents ``>= 0`` (not normalised: their sum acts as an
            inverse temperature).

    Returns:
        ``[..., O]``.
    """
    a = torch.as_tensor(weights, dtype=probs.dtype).reshape(-1, *([1] * (probs.dim() - 1)))
    if a.shape[0] != probs.shape[0]:
        raise GroupError(f"{probs.shape[0]} predictives but {a.shape[0]} weights")
    logit = (a * probs.clamp_min(1e-12).log()).sum(0)
    support = (probs > 0).any(0)
    return torch.softmax(logit.masked_fill(~support, float("-inf")), -1)


def _stack_nll(logp: Tensor, support: Tensor, y: Tensor, a: Tensor) -> Tensor:
    """Summed negative log likelihood of the stacked pool (``logp [K, P, O]``, ``y [P]``)."""
    logit = torch.einsum("k,kpo->po", a, logp).masked_fill(~support, float("-inf"))
    return -(logit.gather(-1, y[:, None]).squeeze(-1) - torch.logsumexp(logit, -1)).sum()


def fit_stack_weights(
    probs: Tensor,
    truth: Tensor,
    *,
    init: Sequence[float] | None = None,
    max_iter: int = 100,
    tol: float = 1e-9,
) -> tuple[Tensor, dict[str, Any]]:
    """Maximum-likelihood weights ``a >= 0`` of :func:`stacked_pool` on held-out answers.

    Minimises ``L(a) = -sum_{(v,t) scored} log softmax_o(sum_k a_k log p_k[v, t, o])[y_vt]``,
    a convex function of ``a`` (log-sum-exp of a linear map minus a linear map), by a
    projected Newton method: gradient and Hessian of ``L`` in closed form
    (``dL/da_k = sum (E_pool[log p_k] - log p_k[y])``, Hessian = summed covariance of the
    ``log p_k`` under the pool), a Newton step on the weights that are free (positive, or
    at 0 with a negative gradient), a backtracking line search that keeps ``a >= 0``. A
    small ridge (1e-9 of the trace) makes identical components (e.g. the belief model and
    its imputed copy before any answer) solvable; their total weight is what matters.

    Args:
        probs: ``[K, M, T, O]`` predictives of the same (member, target) pairs.
        truth: ``[M, T]`` true options (``-1`` = not scored).
        init: starting weights (default: ``1`` for the first component, ``0`` else,
            i.e. the first predictor alone).
        max_iter: Newton iterations.
        tol: stop when the largest projected gradient per answer is below ``tol``.

    Returns:
        ``(a [K] float64, {"nll": mean NLL at a, "nll_first": mean NLL of the first
        component alone, "answers": scored answers, "iterations": n})``.
    """
    k = int(probs.shape[0])
    ok = truth >= 0
    n = int(ok.sum())
    a = torch.zeros(k, dtype=torch.float64)
    a[0] = 1.0
    if init is not None:
        a = torch.as_tensor(init, dtype=torch.float64).clamp_min(0.0).clone()
    if n == 0:
        return a, {"nll": float("nan"), "nll_first": float("nan"), "answers": 0, "iterations": 0}
    p = probs.to(torch.float64)[:, ok]  # [K, P, O]
    support = (p > 0).any(0)
    logp = p.clamp_min(1e-12).log().masked_fill(~support, 0.0)
    y = truth[ok].long()
    ly = logp.gather(-1, y.expand(k, -1)[..., None]).squeeze(-1)  # [K, P]
    first = torch.zeros(k, dtype=torch.float64)
    first[0] = 1.0
    nll0 = float(_stack_nll(logp, support, y, first)) / n
    f = _stack_nll(logp, support, y, a)
    it = 0
    while it < max_iter:
        it += 1
        logit = torch.einsum("k,kpo->po", a, logp).masked_fill(~support, float("-inf"))
        q = torch.softmax(logit, -1)  # [P, O]
        mean = torch.einsum("po,kpo->kp", q, logp)  # E_pool[log p_k]
        grad = (mean - ly).sum(1)  # [K]
        cen = logp - mean[..., None]
        hess = torch.einsum("po,kpo,jpo->kj", q, cen, cen)
        free = (a > 0) | (grad < 0)
        if not bool(free.any()) or float(grad[free].abs().max()) / n < tol:
            break
        h = hess[free][:, free]
        h = h + (1e-9 * float(h.diagonal().sum()) + 1e-12) * torch.eye(len(h), dtype=h.dtype)
        step = torch.zeros(k, dtype=torch.float64)
        step[free] = -torch.linalg.solve(h, grad[free])
        t, improved = 1.0, False
        for _ in range(40):
            cand = (a + t * step).clamp_min(0.0)
            fc = _stack_nll(logp, support, y, cand)
            if float(fc) < float(f):
                a, f, improved = cand, fc, True
                break
            t *= 0.5
        if not improved:
            break
    return a, {"nll": float(f) / n, "nll_first": nll0, "answers": n, "iterations": it}


def shrunk_stack_weights(direction: Tensor, lam: float) -> Tensor:
    """``lam * a + (1 - lam) * (1, 0, ..., 0)``: the stack shrunk toward the first
    predictor alone (``lam = 0``: the belief model, ``lam = 1``: the fitted stack)."""
    base = torch.zeros_like(direction)
    base[0] = 1.0
    return lam * direction + (1.0 - lam) * base


def stack_gain_rows(
    probs: Tensor, truth: Tensor, direction: Tensor, *, grid: int = POOL_GRID
) -> tuple[Tensor, Tensor]:
    """Per-unit log-score gains of the shrunk stack over the first predictor alone.

    ``S[v, g] = sum_{t scored} [log stack(shrunk(a, lam_g))(y_vt) - log probs[0, v, t, y_vt]]``
    with ``lam_g = g / (grid - 1)`` (:func:`shrunk_stack_weights`), ``n[v]`` = the unit's
    scored answers; units without a scored answer are left out. Same layout as
    :func:`pool_gain_rows`, for :func:`pool_weight_from_gains` (which then picks the
    shrinkage ``lam`` with the highest lower confidence bound).

    Args:
        probs: ``[K, M, T, O]`` predictives (component 0 = the belief model).
        truth: ``[M, T]`` true options (``-1`` = not scored).
        direction: ``[K]`` fitted stack weights.

    Returns:
        ``(S [M', grid], n [M'])`` float64.
    """
    ok = truth >= 0
    y = truth.clamp_min(0).unsqueeze(-1)
    n = ok.sum(-1)
    rows = n > 0
    lb = probs[0].gather(-1, y).squeeze(-1).clamp_min(1e-12).log()
    direction = torch.as_tensor(direction, dtype=torch.float64)
    cols = []
    for j in range(grid):
        w = shrunk_stack_weights(direction, j / (grid - 1))
        lp = stacked_pool(probs, w).gather(-1, y).squeeze(-1).clamp_min(1e-12).log()
        d = torch.where(ok, lp - lb, torch.zeros((), dtype=lb.dtype))
        cols.append(d.sum(-1)[rows])
    return torch.stack(cols, 1).double(), n[rows].double()


# ----------------------------------------------------------------------------------------
# group-level prior


def adapt_mixture_prior(
    model: BeliefModel, history: Tensor, strength: float = 100.0, iters: int = 50
) -> BeliefModel:
    """The mixture with its class weights re-fitted to the group (MAP EM).

    The group's members are a sample of one population (e.g. one region) whose class
    mix may differ from the training users'. With ``l[v, k] = log p(h_v | class k)``
    (observed answers and attributes of member ``v``):

        E-step  g[v, k] ∝ pi_k exp(l[v, k])
        M-step  pi_k = (sum_v g[v, k] + strength * pi0_k) / (N + strength)

    i.e. a Dirichlet prior centred on the training weights ``pi0`` worth ``strength``
    pseudo-members, so a small group moves the weights little and a large one a lot.

    Args:
        model: a mixture (``log_prior [K]``, ``log_likelihood_matrix``, ``with_prior``).
        history: ``[N, I]`` the group's observations (``-1`` none).
        strength: pseudo-members of the training weights.
        iters: EM iterations.

    Returns:
        A model with the same components and the group's weights.

    Raises:
        GroupError: the model is not a mixture.
    """
    log_pi0 = getattr(model, "log_prior", None)
    llm = getattr(model, "log_likelihood_matrix", None)
    with_prior = getattr(model, "with_prior", None)
    if not isinstance(log_pi0, Tensor) or llm is None or with_prior is None:
        raise GroupError(f"{type(model).__name__} is not a mixture: cannot adapt its prior")
    ll = llm(history)  # [N, K]
    pi0 = log_pi0.exp()
    log_pi = log_pi0
    n = ll.shape[0]
    for _ in range(iters):
        g = torch.softmax(ll + log_pi, -1)
        pi = (g.sum(0) + strength * pi0) / (n + strength)
        log_pi = pi.clamp_min(1e-300).log()
    return with_prior(log_pi)  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------------------
# the group elicitation


@dataclass
class RoundRecord:
    """What one round did (for audit and plots)."""

    question: int
    question_scores: list[float]
    asked: list[int]
    answered: list[int]
    plan_seconds: float


@dataclass
class GroupMethod:
    """A named combination of question selector, respondent selector and imputation.

    ``adapt_prior``: re-fit the mixture weights of the belief model to the group itself
    (:func:`adapt_mixture_prior`) at the start and after every round with answers; only
    for mixture models (with ``log_prior``, ``log_likelihood_matrix`` and ``with_prior``).

    ``online_pool`` (``pool`` or ``stack`` imputation): for ``stack``, the fitted stack
    of the round is shrunk toward the belief model by the factor ``lam`` with the
    highest lower confidence bound on its gain over the validation members of that
    round (``stack_evidence``) and every answer of the group so far, each scored by the
    components predicted before it arrived. For ``pool``, the pool weight is re-chosen after every
    round from the held-out evidence given to :class:`GroupElicitation`
    (``pool_evidence``, e.g. validation members) plus the group's own answers, each
    scored by the predictions made *before* it arrived (prequential evidence from the
    group's population, one unit per answer), with the same rule
    (:func:`pool_weight_from_gains`).
    """

    question: str
    respondents: str
    imputation: str = "none"
    subsample: float = 1.0
    adapt_prior: bool = False
    online_pool: bool = False

    def __post_init__(self) -> None:
        if self.question not in QUESTION_SELECTORS:
            raise GroupError(
                f"unknown question selector {self.question!r} (known: {sorted(QUESTION_SELECTORS)})"
            )
        if self.respondents not in RESPONDENT_SELECTORS:
            raise GroupError(
                f"unknown respondent selector {self.respondents!r} "
                f"(known: {sorted(RESPONDENT_SELECTORS)})"
            )
        if self.imputation not in IMPUTATIONS:
            raise GroupError(f"unknown imputation {self.imputation!r} (known: {list(IMPUTATIONS)})")
        if self.online_pool and self.imputation not in ("pool", "stack"):
            raise GroupError("online_pool needs the 'pool' or 'stack' imputation")

    def question_selector(self) -> QuestionSelector:
        if self.question == "eig":
            return GroupEIGQuestion(self.subsample)
        return QUESTION_SELECTORS[self.question]()

    def respondent_selector(self) -> RespondentSelector:
        return RESPONDENT_SELECTORS[self.respondents]()


class GroupElicitation:
    """The state of one group elicitation and its rounds.

    Args:
        model: the belief model (predictor) over the item bank.
        observed: ``[N, I]`` what is known of each member at the start (attributes and
            any answers; ``-1`` unknown).
        candidates: askable item indices.
        targets: target item indices (never asked).
        method: the selectors and imputation.
        budget: the budgets.
        gnn: GNN view (needed by ``relational``, ``gnn``, ``gnn_only``, ``pool``).
        pool_weight: ``w`` of the ``pool`` imputation (the starting weight when the
            method re-chooses it online).
        pool_evidence: ``(sums [R, G], counts [R])`` held-out gains of the pool weights
            (:func:`pool_gain_rows` on validation members), used with the group's
            answers (one unit per answer) by ``online_pool``.
        pool_z: standard errors the pool's gain must clear (:func:`pool_weight_from_gains`).
        stack_weights: weights of the ``stack`` imputation (:data:`STACK_COMPONENTS`
            order), one ``[3]`` row per number of rounds with answers so far (``0`` =
            before any answer; the last row is used beyond); default
            ``(1 - pool_weight, pool_weight, 0)``.
        stack_evidence: with ``online_pool`` and ``stack``: one ``(sums [R, G], counts
            [R])`` per row of ``stack_weights``, the held-out gains of that round's
            shrunk stack (:func:`stack_gain_rows` on validation members).
        response_prob: ``[N]`` chance each member answers (default: 1).
        seed: seed of the random choices.
    """

    def __init__(
        self,
        model: BeliefModel,
        observed: Tensor,
        candidates: Sequence[int],
        targets: Sequence[int],
        method: GroupMethod,
        budget: GroupBudget,
        *,
        gnn: GNNView | None = None,
        pool_weight: float = 0.5,
        pool_evidence: tuple[Tensor, Tensor] | None = None,
        pool_z: float = 2.0,
        stack_weights: Sequence[Sequence[float]] | Tensor | None = None,
        stack_evidence: Sequence[tuple[Tensor, Tensor]] | None = None,
        response_prob: Tensor | None = None,
        seed: int = 0,
    ) -> None:
        self.base_model = model
        self.model = model
        self.observed = model.item_bank.check_responses(observed).clone()
        n = self.observed.shape[0]
        if n == 0:
            raise GroupError("the group has no members")
        self.candidates = [model.item_bank.check_item(c) for c in candidates]
        self.targets = [model.item_bank.check_item(t) for t in targets]
        overlap = set(self.candidates) & set(self.targets)
        if overlap:
            keys = sorted(model.item_bank.keys[i] for i in overlap)
            raise GroupError(f"items are both candidates and targets: {keys}")
        if not self.targets:
            raise GroupError("the group needs at least one target item")
        needs_gnn = method.respondents == "relational" or method.imputation in (
            "gnn",
            "gnn_only",
            "pool",
            "stack",
        )
        if needs_gnn and gnn is None:
            raise GroupError(f"method {method} needs a trained GNN")
        if not 0.0 <= pool_weight <= 1.0:
            raise GroupError(f"pool_weight must be in [0, 1], got {pool_weight}")
        self.method = method
        self.budget = budget
        self.gnn = gnn
        self.pool_weight = float(pool_weight)
        self.pool_z = float(pool_z)
        if pool_evidence is None:
            ev_sums, ev_counts = torch.zeros(0, POOL_GRID, dtype=DTYPE), torch.zeros(0, dtype=DTYPE)
        else:
            ev_sums = torch.as_tensor(pool_evidence[0], dtype=DTYPE)
            ev_counts = torch.as_tensor(pool_evidence[1], dtype=DTYPE).reshape(-1)
            if ev_sums.dim() != 2 or ev_sums.shape[1] < 2 or ev_sums.shape[0] != len(ev_counts):
                raise GroupError("pool_evidence must be (sums [R, G >= 2], counts [R])")
        self.pool_evidence = (ev_sums, ev_counts)
        if stack_weights is None:
            sw = torch.tensor([[1.0 - self.pool_weight, self.pool_weight, 0.0]], dtype=DTYPE)
        else:
            sw = torch.as_tensor(stack_weights, dtype=DTYPE)
            if sw.dim() == 1:
                sw = sw.reshape(1, -1)
        if sw.dim() != 2 or sw.shape[0] < 1 or sw.shape[1] != len(STACK_COMPONENTS):
            raise GroupError(f"stack_weights must be [rounds, {len(STACK_COMPONENTS)}]")
        if bool((sw < 0).any()) or not bool(torch.isfinite(sw).all()):
            raise GroupError("stack_weights must be finite and >= 0")
        self.stack_weights = sw
        if stack_evidence is not None and len(stack_evidence) != sw.shape[0]:
            raise GroupError("stack_evidence needs one (sums, counts) per row of stack_weights")
        self.stack_evidence = (
            [
                (torch.as_tensor(a, dtype=DTYPE), torch.as_tensor(b, dtype=DTYPE))
                for a, b in stack_evidence
            ]
            if stack_evidence is not None
            else None
        )
        # the group's answers with the stack components predicted before they arrived
        self.stack_group: list[tuple[Tensor, Tensor]] = []  # ([3, n, 1, O], answers [n, 1])
        self.stack_lambda = 1.0
        self.stack_info: dict[str, Any] = {}
        # questions of the rounds in which somebody answered (a round without answers
        # changes nothing, so it is not counted by the ``stack`` imputation either)
        self.answered_items: list[int] = []
        self.pool_group_gains = torch.zeros(0, ev_sums.shape[1], dtype=DTYPE)
        self.pool_info: dict[str, Any] = {}
        self._gnn_cache: tuple[int, Tensor] | None = None
        self._observed_version = 0
        if response_prob is None:
            response_prob = torch.ones(n, dtype=DTYPE)
        response_prob = torch.as_tensor(response_prob, dtype=DTYPE).reshape(-1)
        if response_prob.shape != (n,) or bool(((response_prob < 0) | (response_prob > 1)).any()):
            raise GroupError(f"response_prob must be [{n}] probabilities")
        self.response_prob = response_prob
        self.imputed = torch.full_like(self.observed, MISSING)
        self.n_asked = torch.zeros(n, dtype=torch.long)
        self.answers_used = 0
        self.asked_items: list[int] = []
        self.records: list[RoundRecord] = []
        self.gen = torch.Generator().manual_seed(int(seed))
        self._qsel = method.question_selector()
        self._rsel = method.respondent_selector()
        if method.adapt_prior:
            self.model = adapt_mixture_prior(model, self.observed)
        self._state = self.model.initial_batch(self._history())
        if method.online_pool and method.imputation == "stack":
            self._choose_stack_lambda()

    # ----- state ------------------------------------------------------------
    def _history(self) -> Tensor:
        return torch.where(self.observed >= 0, self.observed, self.imputed)

    @property
    def state(self) -> Any:
        """Batched belief state of all members (observed + imputed answers)."""
        return self._state

    def context(self) -> RoundContext:
        return RoundContext(
            self.model,
            self._history(),
            self.observed,
            self.targets,
            self.response_prob,
            self.gen,
            self.gnn,
            lookahead_q=min(
                1.0,
                self.budget.per_round(self.observed.shape[0])
                / self.observed.shape[0]
                * max(0, self.rounds_left() - 1),
            ),
            later=[c for c in self.candidates if c not in self.asked_items],
        )

    def rounds_left(self) -> int:
        return self.budget.rounds - len(self.records)

    def eligible(self, question: int) -> Tensor:
        """``[N]``: members that may be asked ``question`` now."""
        ok = self.observed[:, question] < 0
        cap = self.budget.max_questions_per_respondent
        if cap is not None:
            ok &= self.n_asked < cap
        return ok

    def round_budget(self) -> int:
        """Respondents this round: the per-round budget, capped by the total left."""
        n = self.budget.per_round(self.observed.shape[0])
        if self.budget.total_answers is not None:
            n = min(n, self.budget.total_answers - self.answers_used)
        return max(0, n)

    # ----- planning ---------------------------------------------------------
    def plan(self, ctx: RoundContext | None = None) -> tuple[int, Tensor, Tensor]:
        """Choose the round's question and respondents (does not change the state).

        Args:
            ctx: the round context to use (default: a new :meth:`context`); pass one
                to read the member gains the selectors computed from its cache.

        Returns:
            ``(question, respondents [n], question_scores [C])``.

        Raises:
            BudgetError: no rounds or answers are left.
            GroupError: no candidate question is left.
        """
        if self.rounds_left() <= 0:
            raise BudgetError("no rounds are left in the budget")
        n = self.round_budget()
        if n <= 0:
            raise BudgetError("no answers are left in the total budget")
        left = [c for c in self.candidates if c not in self.asked_items]
        ctx = self.context() if ctx is None else ctx
        question, scores = self._qsel.select(ctx, left, n)
        who = self._rsel.select(ctx, question, n, self.eligible(question))
        return question, who, scores

    # ----- applying answers -------------------------------------------------
    def apply(
        self,
        question: int,
        asked: Tensor,
        answers: Tensor,
        *,
        scores: Tensor | None = None,
        plan_seconds: float = 0.0,
    ) -> RoundRecord:
        """Record a round: ``answers[j]`` of member ``asked[j]`` (``-1`` = no answer).

        Then imputes members without an answer to ``question`` (per the method), unless
        nobody answered (then nothing changes but the round count).
        """
        question = self.model.item_bank.check_item(question)
        asked = torch.as_tensor(asked, dtype=torch.long).reshape(-1)
        answers = torch.as_tensor(answers, dtype=torch.long).reshape(-1)
        if asked.shape != answers.shape:
            raise GroupError("asked and answers must have the same length")
        if len(set(asked.tolist())) != len(asked):
            raise GroupError("a member was asked twice in one round")
        if question in self.asked_items:
            raise GroupError(f"item {self.model.item_bank.keys[question]!r} was already asked")
        for m, a in zip(asked.tolist(), answers.tolist(), strict=True):
            if a >= 0:
                self.model.item_bank.check_answer(question, a)
            if self.observed[m, question] >= 0:
                raise GroupError(
                    f"member {m} already answered {self.model.item_bank.keys[question]!r}"
                )
        got = answers >= 0
        if self.method.online_pool and bool(got.any()):
            if self.method.imputation == "stack":
                comps = self.stack_components([question])[:, asked[got]]
                self.stack_group.append((comps, answers[got].reshape(-1, 1)))
            else:
                self._pool_evidence(question, asked[got], answers[got])
        self.observed[asked[got], question] = answers[got]
        self._observed_version += 1
        self.n_asked[asked] += 1
        self.answers_used += len(asked)
        self.asked_items.append(question)
        if bool(got.any()):
            self.answered_items.append(question)
            if self.method.online_pool and self.method.imputation == "stack":
                self._choose_stack_lambda()
            if self.method.adapt_prior:
                self.model = adapt_mixture_prior(self.base_model, self.observed)
            self._impute(question)
            self._state = self.model.initial_batch(self._history())
        rec = RoundRecord(
            question,
            [] if scores is None else [float(s) for s in scores],
            asked.tolist(),
            asked[got].tolist(),
            plan_seconds,
        )
        self.records.append(rec)
        return rec

    def _gnn_predict(self) -> Tensor:
        """GNN predictives ``[N, I, O]`` on the current observations (cached per version)."""
        assert self.gnn is not None
        if self._gnn_cache is None or self._gnn_cache[0] != self._observed_version:
            bank = self.model.item_bank
            p = self.gnn.predict(self.observed, bank.n_items, bank.max_options)
            self._gnn_cache = (self._observed_version, p)
        return self._gnn_cache[1]

    def _pool_evidence(self, question: int, who: Tensor, answers: Tensor) -> None:
        """Score the pre-answer predictions of ``question`` for the members who answered
        (one gain row per answer) and re-choose the pool weight from all evidence."""
        p_b = self.model.predict_batch(self._state, [question])[who]  # [n, 1, O]
        p_g = self._gnn_predict()[who][:, [question], : p_b.shape[-1]]
        ev_sums, ev_counts = self.pool_evidence
        rows, _ = pool_gain_rows(p_b, p_g, answers.reshape(-1, 1), grid=int(ev_sums.shape[1]))
        self.pool_group_gains = torch.cat([self.pool_group_gains, rows])
        sums = torch.cat([ev_sums, self.pool_group_gains])
        counts = torch.cat([ev_counts, torch.ones(len(self.pool_group_gains), dtype=DTYPE)])
        self.pool_weight, self.pool_info = pool_weight_from_gains(sums, counts, z=self.pool_z)

    def _impute(self, question: int) -> None:
        mode = self.method.imputation
        if mode not in ("self", "gnn"):
            return
        missing = self.observed[:, question] < 0
        if not bool(missing.any()):
            return
        if mode == "self":
            p = self.model.predict_batch(self._state, [question])[:, 0]
        else:
            p = self._gnn_predict()[:, question]
        guess = p.argmax(-1)
        self.imputed[missing, question] = guess[missing]

    # ----- predictions ------------------------------------------------------
    def stack_components(
        self, items: Sequence[int] | None = None, *, model: BeliefModel | None = None
    ) -> Tensor:
        """``[3, N, T, O]`` the predictives :data:`STACK_COMPONENTS` of ``items``
        (default: the targets): the belief model on the members' histories, the GNN on
        the observed graph, and the belief model on the histories in which every member
        without an answer to a question answered in an earlier round gets the GNN's
        most likely answer to it (what GNN imputation would condition on, from the
        GNN's current predictions; it does not change the state or the selections).
        ``model``: another belief model for the two belief components (e.g. a fit for
        which these members are held out); default: the group's own."""
        items = self.targets if items is None else [int(i) for i in items]
        if model is None:
            model = self.model
            p_b = self.model.predict_batch(self._state, items)
        else:
            p_b = model.predict_batch(model.initial_batch(self._history()), items)
        gnn_all = self._gnn_predict()
        p_g = gnn_all[:, items][..., : p_b.shape[-1]]
        if not self.answered_items:
            return torch.stack([p_b, p_g, p_b])
        hist = self._history().clone()
        for q in self.answered_items:
            miss = hist[:, q] < 0
            n_opt = self.model.item_bank.n_options[q]
            hist[miss, q] = gnn_all[miss, q, :n_opt].argmax(-1)
        p_i = model.predict_batch(model.initial_batch(hist), items)
        return torch.stack([p_b, p_g, p_i])

    def _stack_row(self) -> int:
        return min(len(self.answered_items), self.stack_weights.shape[0] - 1)

    def _choose_stack_lambda(self) -> None:
        """Shrinkage of this round's stack (``online_pool``): the highest lower confidence
        bound of the gain over validation members of the round + every group answer
        (:func:`pool_weight_from_gains`; ``0`` = the belief model alone)."""
        r = self._stack_row()
        direction = self.stack_weights[r]
        parts_s: list[Tensor] = []
        parts_n: list[Tensor] = []
        if self.stack_evidence is not None:
            parts_s.append(self.stack_evidence[r][0])
            parts_n.append(self.stack_evidence[r][1])
        for comps, ans in self.stack_group:
            s_rows, n_rows = stack_gain_rows(comps, ans, direction)
            parts_s.append(s_rows)
            parts_n.append(n_rows)
        if not parts_s:
            self.stack_lambda, self.stack_info = 1.0, {}
            return
        lam, info = pool_weight_from_gains(torch.cat(parts_s), torch.cat(parts_n), z=self.pool_z)
        self.stack_lambda, self.stack_info = lam, info

    def current_stack_weights(self) -> Tensor:
        """``[3]`` the ``stack`` weights in use: the row for the number of rounds with
        answers so far, shrunk by ``stack_lambda`` with ``online_pool``."""
        direction = self.stack_weights[self._stack_row()]
        if not self.method.online_pool:
            return direction
        return shrunk_stack_weights(direction, self.stack_lambda)

    def predict_targets(self) -> Tensor:
        """``[N, T, O]`` predictions of every member's target answers."""
        mode = self.method.imputation
        if mode == "stack":
            a = self.current_stack_weights()
            if float(a[2]) == 0.0 and float(a[1]) == 0.0:
                return stacked_pool(
                    self.model.predict_batch(self._state, self.targets)[None], a[:1]
                )
            return stacked_pool(self.stack_components(), a)
        p_b = self.model.predict_batch(self._state, self.targets)
        if mode in ("none", "self", "gnn"):
            return p_b
        p_g = self._gnn_predict()[:, self.targets][..., : p_b.shape[-1]]
        if mode == "gnn_only":
            return p_g
        return log_linear_pool(p_b, p_g, self.pool_weight)
