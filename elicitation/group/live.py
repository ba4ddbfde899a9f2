"""The live planner: the one function that plans a group round.

The admin "plan round" job (:func:`app.services.group_rounds.plan_next_round`) and the
benchmark method ``live`` of ``priorly bench group`` both call :func:`plan_round`: the same
code path and the same choices as the benchmark's ``default``.

Inputs (:class:`PlannerModels`, :class:`GroupState`, a :class:`GroupBudget`):

* the fitted belief model; optionally the trained GNN (as a :class:`GNNView`) with its
  pool weight ``w`` and held-out evidence (``pool_gain_rows`` of validation members,
  :func:`validation_pool`);
* the members' states: ``observed [N, I]`` at the start (attributes and answers given
  outside rounds, ``-1`` unknown), the candidates and targets, every closed round
  (:class:`ClosedRound`: question, members asked, their answers or ``-1``), who can be
  asked at all (``askable [N]``) and the chances of answering (``response_prob [N]``).

:func:`replay` builds the :class:`GroupElicitation` and applies the closed rounds in order
(the state is the replay of its rounds, so a plan depends on nothing else);
:func:`plan_round` then chooses the question and members.

Selections (:data:`SELECTIONS`):

* ``elook`` (default): question ``elook_budget``, members ``elook`` -- the expected rise
  in correct target answers with one more answer ahead at the chance the budget gives --
  and, with a GNN, the ``pool`` imputation re-chosen online (``w`` with the highest lower
  confidence bound on its gain; 0 = the belief model alone); this is ``default`` of
  :data:`elicitation.group_bench.GROUP_METHODS`. Without a GNN: the same selectors with
  the belief model alone (``elook_elook_none``).
* ``relational``: ``greedy_relational_gnn``, the method of docs/methods.md [3] --
  question by the group EIG, members by k-means (k = the round's budget) over GNN member
  embeddings, the member nearest each centroid, GNN imputation. Needs a GNN.

Example::

    models = PlannerModels(model, gnn=view, pool_weight=w, pool_evidence=(sums, counts))
    state = GroupState(observed, candidates, targets, rounds=[ClosedRound(q, asked, ans)])
    plan = plan_round(models, state, GroupBudget(0.1, rounds=4))
    plan.question, plan.members, plan.member_gain[plan.members]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from elicitation.errors import GroupError
from elicitation.group.budget import GroupBudget
from elicitation.group.elicitation import GroupElicitation, GroupMethod
from elicitation.group.pools import choose_pool_weight
from elicitation.group.selectors import SELECTOR_GAINS, GNNView
from models.base import BeliefModel

SELECTIONS: dict[str, tuple[GroupMethod, GroupMethod | None]] = {
    "elook": (
        GroupMethod("elook_budget", "elook", "pool", online_pool=True),
        GroupMethod("elook_budget", "elook", "none"),
    ),
    "relational": (GroupMethod("eig", "relational", "gnn"), None),
}
"""``selection -> (method with a GNN, method without one or None = needs a GNN)``."""

SELECTION_LABELS = {
    "elook": "expected gain in correct target answers (question and members)",
    "relational": (
        "relational: one member for each group of similar members "
        "(k-means over the GNN's member embeddings)"
    ),
}


@dataclass(frozen=True)
class PlannerModels:
    """The fitted models a plan uses.

    Attributes:
        model: the fitted belief model (its item bank indexes ``observed``'s columns).
        gnn: the trained GNN seen through the model's bank, or ``None``.
        pool_weight: the starting weight of the GNN in the pool (``[0, 1]``).
        pool_evidence: ``(sums [R, G], counts [R])`` held-out gains of the pool weights.
        gnn_note: why there is no GNN (shown to the researcher), ``""`` when there is.
    """

    model: BeliefModel
    gnn: GNNView | None = None
    pool_weight: float = 0.0
    pool_evidence: tuple[Tensor, Tensor] | None = None
    gnn_note: str = ""


@dataclass(frozen=True)
class ClosedRound:
    """One closed round: ``answers[j]`` of member ``asked[j]`` to ``question`` (``-1``:
    no answer)."""

    question: int
    asked: Tensor
    answers: Tensor


@dataclass(frozen=True)
class GroupState:
    """The members' states: start observations, items, closed rounds, who can be asked."""

    observed: Tensor
    candidates: Sequence[int]
    targets: Sequence[int]
    rounds: Sequence[ClosedRound] = ()
    askable: Tensor | None = None
    response_prob: Tensor | None = None


@dataclass
class RoundPlan:
    """A planned round.

    Attributes:
        question: bank index of the question.
        members: ``[n]`` member rows to ask, in the selector's order.
        question_scores: ``[C']`` scores of :attr:`left` (the candidates not asked yet).
        left: the candidates not asked yet.
        member_gain: ``[N]`` each member's expected gain in correct target answers if
            asked ``question`` (times its chance of answering; what ``elook`` ranks by).
        method: the :class:`GroupMethod` that planned.
        uses_gnn: whether the GNN is part of the plan.
        pool_weight: the GNN's pool weight in use (``elook`` with a GNN; else ``0``).
        explanations: per chosen member, why (``{"reason": str, ...}``).
        group: the replayed elicitation (predictions after the closed rounds).
    """

    question: int
    members: Tensor
    question_scores: Tensor
    left: list[int]
    member_gain: Tensor
    method: GroupMethod
    uses_gnn: bool
    pool_weight: float
    explanations: list[dict[str, Any]] = field(default_factory=list)
    group: GroupElicitation | None = None


def live_method(selection: str, models: PlannerModels) -> GroupMethod:
    """The :class:`GroupMethod` of ``selection`` with the models at hand.

    Raises:
        GroupError: unknown selection, or one that needs a GNN when there is none.
    """
    if selection not in SELECTIONS:
        raise GroupError(
            f"unknown respondent selection {selection!r} (known: {sorted(SELECTIONS)})"
        )
    with_gnn, without = SELECTIONS[selection]
    if models.gnn is not None:
        return with_gnn
    if without is None:
        raise GroupError(
            f"the {selection} selection needs the study's trained GNN"
            + (f" ({models.gnn_note})" if models.gnn_note else "")
        )
    return without


def replay(
    models: PlannerModels,
    state: GroupState,
    budget: GroupBudget,
    *,
    selection: str = "elook",
    seed: int = 0,
) -> GroupElicitation:
    """The group elicitation with every closed round of ``state`` applied in order."""
    ge = GroupElicitation(
        models.model,
        state.observed,
        state.candidates,
        state.targets,
        live_method(selection, models),
        budget,
        gnn=models.gnn,
        pool_weight=models.pool_weight,
        pool_evidence=models.pool_evidence,
        response_prob=state.response_prob,
        askable=state.askable,
        seed=seed,
    )
    for rnd in state.rounds:
        ge.apply(rnd.question, rnd.asked, rnd.answers)
    return ge


def _relational_explanations(ge: GroupElicitation, members: Tensor, question: int) -> list[dict]:
    """Each chosen member with the eligible members nearest to it in GNN embedding space
    (the cluster it stands for) and its distance to them."""
    assert ge.gnn is not None
    pool = ge.eligible(question).nonzero().reshape(-1)
    if len(members) == 0 or len(pool) == 0:
        return []
    emb = ge.gnn.embeddings(ge.observed)
    d = torch.cdist(emb[pool], emb[members])  # [P, n]
    nearest = d.argmin(1)
    for j, m in enumerate(members.tolist()):  # a chosen member stands for itself (ties)
        nearest[pool == m] = j
    out = []
    for j in range(len(members)):
        mine = nearest == j
        size = int(mine.sum())
        spread = float(d[mine, j].mean()) if size else 0.0
        out.append(
            {
                "cluster_size": size,
                "cluster_spread": spread,
                "reason": (
                    f"stands for {size} of the {len(pool)} members who can be asked "
                    f"(those nearest to it in the GNN's member embedding; mean distance "
                    f"{spread:.2f})"
                ),
            }
        )
    return out


def plan_round(
    models: PlannerModels,
    state: GroupState,
    budget: GroupBudget,
    *,
    selection: str = "elook",
    seed: int = 0,
) -> RoundPlan:
    """Plan the next round: :func:`replay` the closed rounds, then choose.

    Raises:
        BudgetError: no rounds or answers are left. GroupError: no candidate is left,
            or the selection needs a GNN that is not given.
    """
    ge = replay(models, state, budget, selection=selection, seed=seed)
    ctx = ge.context()
    question, who, scores = ge.plan(ctx)
    method = ge.method
    # the expected gain in correct target answers (what ``elook`` ranks by; for the
    # relational selection, which ranks by none, the same figure for the researcher)
    gain = ctx.eig([question], SELECTOR_GAINS["elook"])[:, 0] * ge.response_prob
    left = [c for c in ge.candidates if c not in ge.asked_items]
    if method.respondents == "relational":
        explanations = _relational_explanations(ge, who, question)
    else:
        explanations = [
            {
                "reason": f"among the {len(who)} largest expected gains of the members who can be asked"
            }
            for _ in range(len(who))
        ]
    return RoundPlan(
        question=question,
        members=who,
        question_scores=scores,
        left=left,
        member_gain=gain,
        method=method,
        uses_gnn=models.gnn is not None,
        pool_weight=float(ge.pool_weight) if method.imputation == "pool" else 0.0,
        explanations=explanations,
        group=ge,
    )


def calibration_sample(
    responses: Tensor, attribute_cols: Sequence[int], question_cols: Tensor, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Validation members as they look in group rounds, for fitting the pool weight.

    Each member keeps its attributes and ``k ~ U{0..4}`` random answered questions; the
    other questions are its targets (truth kept, the rest ``-1``).

    Returns:
        ``(observed [M, I], truth [M, I])``.
    """
    obs = torch.full_like(responses, -1)
    truth = torch.full_like(obs, -1)
    cols = list(attribute_cols)
    obs[:, cols] = responses[:, cols]
    for j in range(responses.shape[0]):
        perm = question_cols[torch.randperm(len(question_cols), generator=gen)]
        k = int(torch.randint(0, 5, (1,), generator=gen))
        shown, tgt = perm[:k], perm[k:]
        obs[j, shown] = responses[j, shown]
        truth[j, tgt] = responses[j, tgt]
    return obs, truth


def validation_pool(
    model: BeliefModel, gnn: GNNView, responses: Tensor, *, seed: int = 0
) -> tuple[float, dict[str, Any]]:
    """The GNN's pool weight on validation members ``responses [V, I]`` (bank columns):
    :func:`calibration_sample`, then :func:`choose_pool_weight` on the GNN's questions.

    Returns:
        ``(w, info)`` with ``info["gain_sums"]``, ``info["gain_counts"]`` (the evidence
        for :class:`PlannerModels`), ``gain``, ``gain_se``, ``lcb``, ``members``.
    """
    bank = model.item_bank
    q = torch.tensor(gnn.question_items, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed + 17)
    obs, truth = calibration_sample(responses, gnn.attribute_items, q, gen)
    p_b = model.predict_batch(model.initial_batch(obs), list(range(bank.n_items)))
    p_g = gnn.predict(obs, bank.n_items, bank.max_options)
    return choose_pool_weight(p_b[:, q], p_g[:, q], truth[:, q])
