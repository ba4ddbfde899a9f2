"""The live planner (:func:`elicitation.group.plan_round`): who can be asked, the replay
of closed rounds, the selections and their explanations."""

from __future__ import annotations

import pytest
import torch

from elicitation.errors import GroupError
from elicitation.group import (
    ClosedRound,
    GNNView,
    GroupBudget,
    GroupElicitation,
    GroupState,
    PlannerModels,
    plan_round,
    replay,
    validation_pool,
)
from tests.support.group_cases import toy_data, toy_group, toy_model


@pytest.mark.parametrize("selection", ["elook", "relational"])
def test_members_who_cannot_be_asked_are_never_chosen(gnn_view: GNNView, selection: str) -> None:
    truth, observed = toy_group(40)
    askable = torch.zeros(40, dtype=torch.bool)
    askable[::4] = True  # 10 members can be reached
    models = PlannerModels(toy_model(), gnn_view, 0.3)
    state = GroupState(observed, [2, 3, 4], [5], askable=askable)
    closed: list[ClosedRound] = []
    for _ in range(2):
        plan = plan_round(
            models,
            GroupState(observed, [2, 3, 4], [5], closed, askable=askable),
            GroupBudget(4, 3),
            selection=selection,
        )
        assert len(plan.members) == 4 and bool(askable[plan.members].all())
        assert float(plan.member_gain[~askable].abs().max()) == 0.0
        assert len(plan.explanations) == 4
        closed.append(ClosedRound(plan.question, plan.members, truth[plan.members, plan.question]))
    if selection == "relational":  # each chosen member stands for a cluster of the askable
        sizes = [e["cluster_size"] for e in plan.explanations]
        assert (
            all(n >= 1 for n in sizes)
            and sum(sizes) == int((askable & (observed[:, plan.question] < 0)).sum()) - 0
        )  # the pool the k-means ran on
    # the state holds: the replay of the closed rounds has them applied
    ge = replay(
        models, GroupState(observed, [2, 3, 4], [5], closed, askable=askable), GroupBudget(4, 3)
    )
    assert len(ge.records) == 2 and int(ge.n_asked.sum()) == 8
    assert state.rounds == ()


def test_replayed_plans_equal_one_running_elicitation(gnn_view: GNNView) -> None:
    """Planning from a replay of the closed rounds (the app, ``live``) makes the same
    choices and predictions as one elicitation run through its rounds (``default``)."""
    truth, observed = toy_group(40)
    models = PlannerModels(toy_model(), gnn_view, 0.3)
    budget = GroupBudget(0.2, 3)
    ge = GroupElicitation(
        models.model,
        observed,
        [2, 3, 4],
        [5],
        replay(models, GroupState(observed, [2, 3, 4], [5]), budget).method,
        budget,
        gnn=gnn_view,
        pool_weight=0.3,
    )
    closed: list[ClosedRound] = []
    for _ in range(3):
        plan = plan_round(models, GroupState(observed, [2, 3, 4], [5], closed), budget)
        q, who, _ = ge.plan()
        assert (plan.question, plan.members.tolist()) == (q, who.tolist())
        ans = truth[who, q]
        ge.apply(q, who, ans)
        closed.append(ClosedRound(q, who, ans))
    again = replay(models, GroupState(observed, [2, 3, 4], [5], closed), budget)
    assert torch.equal(again.predict_targets(), ge.predict_targets())
    assert again.pool_weight == ge.pool_weight


def test_relational_needs_a_gnn_and_no_gnn_means_the_belief_model() -> None:
    _, observed = toy_group(20)
    models = PlannerModels(toy_model(), gnn_note="no GNN trained")
    state = GroupState(observed, [2, 3, 4], [5])
    with pytest.raises(GroupError, match="needs the study's trained GNN .no GNN trained."):
        plan_round(models, state, GroupBudget(3, 2), selection="relational")
    plan = plan_round(models, state, GroupBudget(3, 2))
    assert not plan.uses_gnn and plan.method.imputation == "none" and plan.pool_weight == 0.0
    with pytest.raises(GroupError, match="unknown respondent selection"):
        plan_round(models, state, GroupBudget(3, 2), selection="nearest")


def test_validation_pool_gives_a_weight_and_evidence(gnn_view: GNNView) -> None:
    val = toy_data(30, seed=11)
    w, info = validation_pool(toy_model(), gnn_view, val)
    assert 0.0 <= w <= 1.0
    rows = info["gain_sums"].shape[0]  # members with at least one scored answer
    assert 0 < rows <= 30 and info["gain_counts"].shape[0] == rows == info["members"]
