"""One group elicitation: its state, its rounds and its target predictions.

:class:`GroupMethod` names a question selector, a respondent selector and an
imputation; :class:`GroupElicitation` plans each round (:meth:`GroupElicitation.plan`),
records its answers (:meth:`GroupElicitation.apply`) and predicts every member's target
answers (:meth:`GroupElicitation.predict_targets`, ``[N, T, O]``).

Example::

    ge = GroupElicitation(model, observed, candidates, targets,
                          GroupMethod("elook_budget", "elook"), GroupBudget(0.1, rounds=4))
    while ge.rounds_left() > 0:
        question, who, scores = ge.plan()
        ge.apply(question, who, answers_of(who, question), scores=scores)
    p = ge.predict_targets()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from elicitation.errors import BudgetError, GroupError
from elicitation.group.budget import GroupBudget
from elicitation.group.pools import (
    POOL_GRID,
    STACK_COMPONENTS,
    log_linear_pool,
    pool_gain_rows,
    pool_weight_from_gains,
    shrunk_stack_weights,
    stack_gain_rows,
    stacked_pool,
)
from elicitation.group.prior import adapt_mixture_prior
from elicitation.group.selectors import (
    QUESTION_SELECTORS,
    RESPONDENT_SELECTORS,
    GNNView,
    GroupEIGQuestion,
    QuestionSelector,
    RespondentSelector,
    RoundContext,
)
from models.base import DTYPE, MISSING, BeliefModel

IMPUTATIONS = ("none", "self", "gnn", "gnn_only", "pool", "stack")


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


def _checked_items(
    model: BeliefModel, candidates: Sequence[int], targets: Sequence[int]
) -> tuple[list[int], list[int]]:
    """``(candidates, targets)`` as bank indices: disjoint, at least one target."""
    cand = [model.item_bank.check_item(c) for c in candidates]
    tgt = [model.item_bank.check_item(t) for t in targets]
    overlap = set(cand) & set(tgt)
    if overlap:
        keys = sorted(model.item_bank.keys[i] for i in overlap)
        raise GroupError(f"items are both candidates and targets: {keys}")
    if not tgt:
        raise GroupError("the group needs at least one target item")
    return cand, tgt


def _needs_gnn(method: GroupMethod) -> bool:
    """Whether ``method`` reads the GNN (relational selection, or an imputation using it)."""
    return method.respondents == "relational" or method.imputation in (
        "gnn",
        "gnn_only",
        "pool",
        "stack",
    )


def _checked_pool_evidence(pool_evidence: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """``(sums [R, G], counts [R])`` float64; no evidence is ``R = 0`` rows of
    :data:`POOL_GRID` weights."""
    if pool_evidence is None:
        return torch.zeros(0, POOL_GRID, dtype=DTYPE), torch.zeros(0, dtype=DTYPE)
    ev_sums = torch.as_tensor(pool_evidence[0], dtype=DTYPE)
    ev_counts = torch.as_tensor(pool_evidence[1], dtype=DTYPE).reshape(-1)
    if ev_sums.dim() != 2 or ev_sums.shape[1] < 2 or ev_sums.shape[0] != len(ev_counts):
        raise GroupError("pool_evidence must be (sums [R, G >= 2], counts [R])")
    return ev_sums, ev_counts


def _checked_stack_weights(
    stack_weights: Sequence[Sequence[float]] | Tensor | None, pool_weight: float
) -> Tensor:
    """``[rounds, 3]`` finite weights ``>= 0``; default one row ``(1 - w, w, 0)``."""
    if stack_weights is None:
        sw = torch.tensor([[1.0 - pool_weight, pool_weight, 0.0]], dtype=DTYPE)
    else:
        sw = torch.as_tensor(stack_weights, dtype=DTYPE)
        if sw.dim() == 1:
            sw = sw.reshape(1, -1)
    if sw.dim() != 2 or sw.shape[0] < 1 or sw.shape[1] != len(STACK_COMPONENTS):
        raise GroupError(f"stack_weights must be [rounds, {len(STACK_COMPONENTS)}]")
    if bool((sw < 0).any()) or not bool(torch.isfinite(sw).all()):
        raise GroupError("stack_weights must be finite and >= 0")
    return sw


def _checked_stack_evidence(
    stack_evidence: Sequence[tuple[Tensor, Tensor]] | None, rows: int
) -> list[tuple[Tensor, Tensor]] | None:
    """One float64 ``(sums [R, G], counts [R])`` per row of the stack weights, or ``None``."""
    if stack_evidence is not None and len(stack_evidence) != rows:
        raise GroupError("stack_evidence needs one (sums, counts) per row of stack_weights")
    return (
        [
            (torch.as_tensor(a, dtype=DTYPE), torch.as_tensor(b, dtype=DTYPE))
            for a, b in stack_evidence
        ]
        if stack_evidence is not None
        else None
    )


def _checked_response_prob(response_prob: Tensor | None, n: int) -> Tensor:
    """``[n]`` float64 chances in ``[0, 1]`` (default: every member answers)."""
    if response_prob is None:
        response_prob = torch.ones(n, dtype=DTYPE)
    response_prob = torch.as_tensor(response_prob, dtype=DTYPE).reshape(-1)
    if response_prob.shape != (n,) or bool(((response_prob < 0) | (response_prob > 1)).any()):
        raise GroupError(f"response_prob must be [{n}] probabilities")
    return response_prob


def _checked_askable(askable: Tensor | None, n: int) -> Tensor:
    """``[n]`` bool (default: every member can be asked)."""
    if askable is None:
        return torch.ones(n, dtype=torch.bool)
    askable = torch.as_tensor(askable).reshape(-1)
    if askable.shape != (n,):
        raise GroupError(f"askable must be [{n}] booleans")
    return askable.to(torch.bool)


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
        askable: ``[N]`` bool, the members who can receive a question at all (default:
            all). A member who cannot is never chosen and its chance of answering is 0
            (so no question is scored by a gain it cannot bring); it stays in the group
            for the predictions.
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
        askable: Tensor | None = None,
        seed: int = 0,
    ) -> None:
        self.base_model = model
        self.model = model
        self.observed = model.item_bank.check_responses(observed).clone()
        n = self.observed.shape[0]
        if n == 0:
            raise GroupError("the group has no members")
        self.candidates, self.targets = _checked_items(model, candidates, targets)
        if _needs_gnn(method) and gnn is None:
            raise GroupError(f"method {method} needs a trained GNN")
        if not 0.0 <= pool_weight <= 1.0:
            raise GroupError(f"pool_weight must be in [0, 1], got {pool_weight}")
        self.method = method
        self.budget = budget
        self.gnn = gnn
        self.pool_weight = float(pool_weight)
        self.pool_z = float(pool_z)
        self.pool_evidence = _checked_pool_evidence(pool_evidence)
        self.stack_weights = _checked_stack_weights(stack_weights, self.pool_weight)
        self.stack_evidence = _checked_stack_evidence(stack_evidence, self.stack_weights.shape[0])
        # the group's answers with the stack components predicted before they arrived
        self.stack_group: list[tuple[Tensor, Tensor]] = []  # ([3, n, 1, O], answers [n, 1])
        self.stack_lambda = 1.0
        self.stack_info: dict[str, Any] = {}
        # questions of the rounds in which somebody answered (a round without answers
        # changes nothing, so it is not counted by the ``stack`` imputation either)
        self.answered_items: list[int] = []
        self.pool_group_gains = torch.zeros(0, self.pool_evidence[0].shape[1], dtype=DTYPE)
        self.pool_info: dict[str, Any] = {}
        self._gnn_cache: tuple[int, Tensor] | None = None
        self._observed_version = 0
        self.askable = _checked_askable(askable, n)
        self.response_prob = _checked_response_prob(response_prob, n) * self.askable.to(DTYPE)
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
        ok = (self.observed[:, question] < 0) & self.askable
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
            BudgetError: no rounds or questions (members asked, :attr:`GroupBudget.total_answers`) are left.
            GroupError: no candidate question is left.
        """
        if self.rounds_left() <= 0:
            raise BudgetError("no rounds are left in the budget")
        n = self.round_budget()
        if n <= 0:
            raise BudgetError(
                "no questions are left in the total budget (members asked, all rounds)"
            )
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
