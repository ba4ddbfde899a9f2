"""Group rounds: budgets, respondent selectors, information gain, imputation, pooling."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from elicitation import group as group_module
from elicitation.errors import BudgetError
from elicitation.group import (
    GNNView,
    GroupBudget,
    GroupElicitation,
    GroupError,
    GroupMethod,
    choose_pool_weight,
    fit_pool_weight,
    fit_stack_weights,
    log_linear_pool,
    member_eig,
    member_lookahead_accuracy_gain,
    pool_gain_rows,
    pool_weight_from_gains,
    selectors,
    shrunk_stack_weights,
    stack_gain_rows,
    stacked_pool,
)
from models.base import ItemBank
from models.persona import PersonaMixture
from tests.support.group_cases import BANK, toy_group, toy_model


# ---- budgets and selectors ---------------------------------------------------------------
@pytest.mark.parametrize("respondents", ["random", "relational", "eig", "elook"])
@pytest.mark.parametrize(("budget", "expected"), [(7, 7), (0.25, 10), (1.0, 40)])
def test_selector_respects_budget_exactly_without_repeats(
    gnn_view: GNNView, respondents: str, budget: int | float, expected: int
) -> None:
    _, observed = toy_group()
    method = GroupMethod("eig", respondents, "none")
    ge = GroupElicitation(
        toy_model(), observed, [2, 3, 4], [5], method, GroupBudget(budget, 3), gnn=gnn_view
    )
    q, who, _ = ge.plan()
    assert q in (2, 3, 4)
    assert len(who) == expected
    assert len(set(who.tolist())) == expected
    assert bool(ge.eligible(q)[who].all())


@pytest.mark.parametrize("respondents", ["random", "relational", "eig", "elook"])
def test_per_member_and_total_caps(gnn_view: GNNView, respondents: str) -> None:
    truth, observed = toy_group()
    budget = GroupBudget(15, 4, total_answers=35, max_questions_per_respondent=1)
    ge = GroupElicitation(
        toy_model(),
        observed,
        [2, 3, 4],
        [5],
        GroupMethod("eig", respondents),
        budget,
        gnn=gnn_view,
    )
    seen: set[int] = set()
    sizes = []
    for _ in range(3):
        q, who, _ = ge.plan()
        assert not (set(who.tolist()) & seen)  # at most one question per member
        seen |= set(who.tolist())
        ge.apply(q, who, truth[who, q])
        sizes.append(len(who))
    assert sizes == [15, 15, 5]  # the total of 35 caps the last round
    with pytest.raises(BudgetError, match="no questions are left in the total budget"):
        ge.plan()


def test_budget_validation() -> None:
    with pytest.raises(BudgetError, match="share must be in"):
        GroupBudget(1.5, 4)
    with pytest.raises(BudgetError, match=">= 1"):
        GroupBudget(0, 4)
    with pytest.raises(BudgetError, match="rounds"):
        GroupBudget(3, -1)
    assert GroupBudget(0.1, 4).per_round(1072) == 107
    assert GroupBudget(0.5, 4).per_round(897) == 449  # 448.5 rounds half up


def test_unknown_selector_and_missing_gnn_are_refused() -> None:
    with pytest.raises(GroupError, match="unknown respondent selector"):
        GroupMethod("eig", "nearest")
    _, observed = toy_group()
    with pytest.raises(GroupError, match="needs a trained GNN"):
        GroupElicitation(
            toy_model(), observed, [2], [5], GroupMethod("eig", "relational"), GroupBudget(3, 1)
        )
    with pytest.raises(GroupError, match="both candidates and targets"):
        GroupElicitation(
            toy_model(), observed, [2, 5], [5], GroupMethod("eig", "random"), GroupBudget(3, 1)
        )


# ---- relational selection for large groups (two-level k-means) --------------------------
def test_allocate_proportional_largest_remainder_and_caps() -> None:
    alloc = group_module.allocate_proportional
    # 4 * (5, 3, 2) / 10 = (2, 1.2, 0.8): floors (2, 1, 0), the one slot left to remainder 0.8
    assert alloc(torch.tensor([5, 3, 2]), 4).tolist() == [2, 1, 1]
    # (0.5, 4.5): equal remainders, the lower group index first
    assert alloc(torch.tensor([1, 9]), 5).tolist() == [1, 4]
    # every slot: each group gets its size
    assert alloc(torch.tensor([3, 0, 4]), 7).tolist() == [3, 0, 4]
    assert alloc(torch.tensor([2, 2]), 0).tolist() == [0, 0]
    with pytest.raises(GroupError, match="cannot place 5 slots in groups of 4"):
        alloc(torch.tensor([2, 2]), 5)


def test_two_level_kmeans_picks_one_member_per_separated_cluster() -> None:
    # 9 tight clusters of 30 points on a 3 x 3 grid (spacing 10, sd 0.01): k = 9 gives
    # 3 coarse clusters made of whole clusters, 9 fine centroids, one pick in each cluster
    g = torch.Generator().manual_seed(3)
    centres = torch.tensor([[10.0 * i, 10.0 * j] for i in range(3) for j in range(3)])
    labels = torch.arange(9).repeat_interleave(30)
    x = (centres[labels] + 0.01 * torch.randn(270, 2, generator=g)).double()
    perm = torch.randperm(270, generator=g)
    x, labels = x[perm], labels[perm]
    picks = group_module.two_level_kmeans_pick(x, 9, torch.Generator().manual_seed(0))
    assert len(picks) == 9 and len(set(picks.tolist())) == 9
    assert sorted(labels[picks].tolist()) == list(range(9))


@pytest.mark.parametrize(("m", "k"), [(50, 37), (50, 50), (23, 1), (200, 20)])
def test_two_level_kmeans_returns_k_distinct_points(m: int, k: int) -> None:
    x = torch.randn(m, 3, generator=torch.Generator().manual_seed(m + k), dtype=torch.float64)
    picks = group_module.two_level_kmeans_pick(x, k, torch.Generator().manual_seed(1))
    assert len(picks) == k and len(set(picks.tolist())) == k
    assert int(picks.min()) >= 0 and int(picks.max()) < m


@pytest.mark.parametrize(("budget", "expected"), [(7, 7), (0.25, 10), (1.0, 40)])
def test_relational_selection_of_a_large_group_respects_the_budget(
    gnn_view: GNNView, monkeypatch: pytest.MonkeyPatch, budget: int | float, expected: int
) -> None:
    # the threshold at 0 sends this 40-member group down the large-group path
    monkeypatch.setattr(selectors, "KMEANS_EXACT_MAX", 0)
    called = []
    real = group_module.two_level_kmeans_pick
    monkeypatch.setattr(
        selectors,
        "two_level_kmeans_pick",
        lambda *a, **kw: called.append(1) or real(*a, **kw),
    )
    truth, observed = toy_group()
    ge = GroupElicitation(
        toy_model(),
        observed,
        [2, 3, 4],
        [5],
        GroupMethod("eig", "relational"),
        GroupBudget(budget, 3, max_questions_per_respondent=1),
        gnn=gnn_view,
    )
    q, who, _ = ge.plan()
    assert called
    assert len(who) == expected and len(set(who.tolist())) == expected
    assert bool(ge.eligible(q)[who].all())
    if expected < 40:  # a second round never asks a member twice (cap 1)
        ge.apply(q, who, truth[who, q])
        q2, who2, _ = ge.plan()
        assert not set(who2.tolist()) & set(who.tolist())
        assert len(who2) == min(expected, 40 - expected)


# ---- information gain ---------------------------------------------------------------------
def _brute_force_eig(
    model: PersonaMixture,
    answers: dict[int, int],
    x: int,
    targets: list[int],
    uncertainty: str = "entropy",
) -> float:
    """EIG (or, with ``uncertainty="error"``, the expected accuracy gain) by enumerating
    personas and answers from the definition."""
    prior = model.log_prior.exp()
    like = torch.ones(2, dtype=torch.float64)
    for i, k in answers.items():
        like = like * model.mu[:, i, k]
    post = prior * like / (prior * like).sum()

    def h_targets(w: torch.Tensor) -> float:
        total = 0.0
        for t in targets:
            p = (w.unsqueeze(1) * model.mu[:, t, :]).sum(0)
            if uncertainty == "error":
                total += 1.0 - max(float(v) for v in p)
            elif uncertainty == "quadratic":
                total += 1.0 - sum(float(v) ** 2 for v in p)
            else:
                total -= sum(float(v) * math.log(float(v)) for v in p if v > 0)
        return total

    now = h_targets(post)
    after = 0.0
    for k in range(BANK.n_options[x]):
        pk = float((post * model.mu[:, x, k]).sum())
        if pk > 0:
            after += pk * h_targets(post * model.mu[:, x, k] / pk)
    return now - after


def test_member_eig_equals_brute_force() -> None:
    model = toy_model()
    history = torch.full((4, 6), -1)
    history[1, 0] = 1
    history[2, 2] = 0
    history[3, [0, 3]] = torch.tensor([0, 1])
    eig = member_eig(model, history, [2, 3, 4], [5, 4], chunk=3)  # 2 chunks
    for v, x in itertools.product(range(4), range(3)):
        answers = {i: int(history[v, i]) for i in range(6) if history[v, i] >= 0}
        cand = [2, 3, 4][x]
        if cand in answers:
            continue
        assert float(eig[v, x]) == pytest.approx(
            _brute_force_eig(model, answers, cand, [5, 4]), abs=1e-9
        )


@pytest.mark.parametrize("uncertainty", ["error", "quadratic"])
def test_member_accuracy_and_brier_gain_equal_brute_force(uncertainty: str) -> None:
    """``uncertainty="error"``: E[max_k p(Y_t = k | h, Y_x)] - max_k p(Y_t = k | h);
    ``"quadratic"``: E[sum_k p_k^2 after] - sum_k p_k^2 now; summed over targets,
    enumerated; never negative; zero for an answered candidate."""
    model = toy_model()
    history = torch.full((4, 6), -1)
    history[1, 0] = 1
    history[2, 2] = 0
    history[3, [0, 3]] = torch.tensor([0, 1])
    gain = member_eig(model, history, [2, 3, 4], [5, 4], chunk=3, uncertainty=uncertainty)
    eig = member_eig(model, history, [2, 3, 4], [5, 4], chunk=3)
    assert not torch.allclose(gain, eig)
    assert float(gain.min()) >= -1e-12
    for v, x in itertools.product(range(4), range(3)):
        answers = {i: int(history[v, i]) for i in range(6) if history[v, i] >= 0}
        cand = [2, 3, 4][x]
        if cand in answers:
            assert float(gain[v, x]) == 0.0
            continue
        assert float(gain[v, x]) == pytest.approx(
            _brute_force_eig(model, answers, cand, [5, 4], uncertainty), abs=1e-9
        )
    with pytest.raises(GroupError, match="unknown uncertainty"):
        member_eig(model, history, [2], [5], uncertainty="variance")


def test_accuracy_respondents_skip_a_member_whose_answer_cannot_change_the_guess() -> None:
    """Information gain and accuracy gain disagree on a constructed case.

    Personas P0, P1, P2 (prior 0.375, 0.1875, 0.4375); candidate q0 tells P0 (answer 0)
    from P1 and P2 (answer 1); q1 tells P1 (0) from P2 (1); the target q2 is 0 for P0,
    a coin for P1, and 0 with 0.45 for P2. Member 0 answered q1 = 0 (posterior P0 / P1
    0.5 / 0.5): q0 moves its target to 1.0 or 0.5, EIG 0.216 nats, but the most likely
    target answer stays 0, so its expected accuracy stays 0.75 (gain 0). Member 1
    answered q1 = 1 (P0 / P2 0.3 / 0.7): EIG 0.184 nats, accuracy 0.615 -> 0.685 (gain
    0.07). ``eig`` asks member 0, ``eacc`` member 1."""
    model = _three_personas()
    observed = torch.full((2, 6), -1)
    observed[:, 3] = torch.tensor([0, 1])
    eig = member_eig(model, observed, [2], [4])[:, 0]
    acc = member_eig(model, observed, [2], [4], uncertainty="error")[:, 0]

    def h(p: float) -> float:
        return -(p * math.log(p) + (1 - p) * math.log(1 - p))

    assert float(eig[0]) == pytest.approx(h(0.75) - 0.5 * h(0.5), abs=1e-6)
    assert float(eig[1]) == pytest.approx(h(0.615) - 0.7 * h(0.55), abs=1e-6)
    assert float(acc[0]) == pytest.approx(0.0, abs=1e-6)
    assert float(acc[1]) == pytest.approx(0.07, abs=1e-6)
    picks = {}
    for resp in ("eig", "eacc"):
        ge = GroupElicitation(
            model, observed, [2], [4], GroupMethod("eig", resp), GroupBudget(1, 1)
        )
        picks[resp] = ge.plan()[1].tolist()
    assert picks == {"eig": [0], "eacc": [1]}


def _three_personas(
    target_zero: tuple[float, float, float] = (1.0, 0.5, 0.45),
    prior: tuple[float, float, float] = (0.375, 0.1875, 0.4375),
) -> PersonaMixture:
    """P0 / P1 / P2: q0 tells P0 (0) from P1 and P2 (1), q1 tells P1 (0) from P2 (1)
    (P0 a coin), the target q2 is 0 with ``target_zero[c]`` for persona ``c``; q3 is
    uninformative."""
    mu = torch.zeros(3, 6, 3, dtype=torch.float64)
    mu[:, 0, :2] = 0.5
    mu[:, 1, :3] = 1 / 3
    mu[:, 5, :3] = 1 / 3
    mu[:, 2, :2] = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    mu[:, 3, :2] = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]])
    t0 = torch.tensor(target_zero, dtype=torch.float64)
    mu[:, 4, :2] = torch.stack([t0, 1 - t0], 1)
    return PersonaMixture(BANK, mu, torch.tensor(prior, dtype=torch.float64).log())


def _brute_lookahead(
    model: PersonaMixture,
    answers: dict[int, int],
    x: int,
    cands: list[int],
    tgt: list[int],
    q: float,
    max_later: int | None = None,
) -> float:
    """(1 - q) G1 + q M of :func:`member_lookahead_accuracy_gain`, by enumeration; with
    ``max_later = L`` the second question ranges over the member's ``L`` other candidates
    with the lowest expected Brier score after them."""
    n_options = model.item_bank.n_options
    w0 = model.log_prior.exp()
    for i, k in answers.items():
        w0 = w0 * model.mu[:, i, k]
    w0 = w0 / w0.sum()

    def err(w: torch.Tensor) -> float:
        return sum(1.0 - float((w.unsqueeze(1) * model.mu[:, t, :]).sum(0).max()) for t in tgt)

    def quad(w: torch.Tensor) -> float:
        return sum(
            1.0 - float(((w.unsqueeze(1) * model.mu[:, t, :]).sum(0) ** 2).sum()) for t in tgt
        )

    def after(w: torch.Tensor, y: int, known: set[int], u=err) -> float:  # E_k u(w, y=k)
        if y in known:
            return u(w)
        total = 0.0
        for k in range(n_options[y]):
            pk = float((w * model.mu[:, y, k]).sum())
            if pk > 0:
                total += pk * u(w * model.mu[:, y, k] / pk)
        return total

    known = set(answers)
    others = [c for c in cands if c != x]
    g1 = err(w0) - after(w0, x, known)
    best_other = min(after(w0, c, known) for c in others)
    tried = sorted(others, key=lambda c: after(w0, c, known, quad))[:max_later]
    e2 = 0.0
    for k in range(n_options[x]):
        pk = float((w0 * model.mu[:, x, k]).sum())
        if pk > 0:
            wk = w0 * model.mu[:, x, k] / pk
            e2 += pk * min(after(wk, c, known | {x}) for c in tried)
    return (1 - q) * g1 + q * (best_other - e2)


@pytest.mark.parametrize("q", [0.0, 0.3, 1.0])
def test_lookahead_accuracy_gain_equals_brute_force(q: float) -> None:
    """Enumerated on three personas: a member whose next answer cannot flip its target
    alone gains from it once a later answer may follow (M > G1); ``q = 0`` is the
    accuracy gain exactly; answered candidates gain 0."""
    model = _three_personas()
    history = torch.full((4, 6), -1)
    history[0, 3] = 0
    history[1, 3] = 1
    history[3, 2] = 1
    cands, tgt = [2, 3, 5], [4]
    gain = member_lookahead_accuracy_gain(model, history, cands, tgt, q, chunk=3)
    for v, j in itertools.product(range(4), range(3)):
        answers = {i: int(history[v, i]) for i in range(6) if history[v, i] >= 0}
        if cands[j] in answers:
            assert float(gain[v, j]) == 0.0
            continue
        assert float(gain[v, j]) == pytest.approx(
            _brute_lookahead(model, answers, cands[j], cands, tgt, q), abs=1e-9
        )
    if q == 0.0:
        myopic = member_eig(model, history, cands, tgt, uncertainty="error")
        assert torch.allclose(gain, myopic, atol=1e-12)


def test_lookahead_values_an_answer_that_only_a_later_one_makes_useful() -> None:
    """P0 / P1 / P2 (prior 0.5, 0.35, 0.15): q0 tells P0 from P1 and P2, q1 tells P1
    from P2, the target is 0 unless P2. q0 alone never flips the guess (after q0 = 1 the
    target is still 0 with 0.7), so its accuracy gain is 0; followed by q1 it finds
    every P2: ``M = 0.1 > 0``, by enumeration."""
    model = _three_personas((1.0, 1.0, 0.0), (0.5, 0.35, 0.15))
    history = torch.full((1, 6), -1)
    myopic = member_eig(model, history, [2, 3], [4], uncertainty="error")
    one = member_lookahead_accuracy_gain(model, history, [2, 3], [4], 1.0)
    assert float(myopic[0, 0]) == pytest.approx(0.0, abs=1e-9)
    assert float(one[0, 0]) > 0.05
    history = torch.full((3, 6), -1)
    history[1, 3] = 0  # a member who answered q1 (P0 or P1)
    history[2, 0] = 1
    for q in (0.3, 1.0):
        gain = member_lookahead_accuracy_gain(model, history, [2, 3, 5], [4], q)
        for v, j in itertools.product(range(3), range(3)):
            answers = {i: int(history[v, i]) for i in range(6) if history[v, i] >= 0}
            x = [2, 3, 5][j]
            expected = (
                0.0 if x in answers else _brute_lookahead(model, answers, x, [2, 3, 5], [4], q)
            )
            assert float(gain[v, j]) == pytest.approx(expected, abs=1e-9)


def _random_mixture() -> PersonaMixture:
    """Four personas, seven items (2-3 options), answer probabilities drawn from a flat
    Dirichlet with a fixed seed: continuous, so gains have no ties."""
    bank = ItemBank(tuple(f"i{j}" for j in range(7)), (2, 3, 2, 3, 2, 2, 3))
    g = torch.Generator().manual_seed(7)
    mu = torch.zeros(4, 7, 3, dtype=torch.float64)
    for j, o in enumerate(bank.n_options):
        w = -torch.rand(4, o, generator=g, dtype=torch.float64).log()  # Dirichlet(1)
        mu[:, j, :o] = w / w.sum(1, keepdim=True)
    return PersonaMixture(bank, mu, torch.tensor([0.4, 0.3, 0.2, 0.1]).log())


def test_lookahead_over_each_members_best_second_questions_equals_brute_force() -> None:
    """``max_later = L``: the second question ranges over each member's ``L`` best other
    candidates by one-answer error, checked by enumeration on a random 4-persona mixture
    (continuous answer probabilities, so no ties in the ranking); ``L >= C - 1`` is the
    full lookahead exactly, and restricting never raises the gain above it."""
    model = _random_mixture()
    history = torch.full((6, 7), -1)
    history[1, 0] = 1
    history[2, 3] = 2
    history[3, 1] = 0
    history[3, 4] = 1
    history[5, 2] = 0
    cands, tgt = [0, 1, 2, 3, 4], [5, 6]
    full = member_lookahead_accuracy_gain(model, history, cands, tgt, 0.6)
    for L in (1, 2):
        gain = member_lookahead_accuracy_gain(model, history, cands, tgt, 0.6, max_later=L)
        for v, j in itertools.product(range(6), range(5)):
            answers = {i: int(history[v, i]) for i in range(7) if history[v, i] >= 0}
            expected = (
                0.0
                if cands[j] in answers
                else _brute_lookahead(model, answers, cands[j], cands, tgt, 0.6, L)
            )
            assert float(gain[v, j]) == pytest.approx(expected, abs=1e-9)
        assert bool((gain <= full + 1e-12).all())
        differs = not torch.allclose(gain, full, atol=1e-9)
        if L == 1:
            assert differs  # the restriction matters on this case
    wide = member_lookahead_accuracy_gain(model, history, cands, tgt, 0.6, max_later=4)
    assert torch.equal(wide, full)
    with pytest.raises(GroupError, match="max_later"):
        member_lookahead_accuracy_gain(model, history, cands, tgt, 0.6, max_later=0)


def test_lookahead_chance_per_member_and_response_probability() -> None:
    """A ``[B]`` chance gives each member its own ``(1 - q_v) G1 + q_v M``; in a group
    with response probabilities ``r_v`` the chance of one more answer is
    ``lookahead_q * r_v`` (asked again and answering), and the plan ranks
    ``r_v * gain_v`` (answering now)."""
    model = _random_mixture()
    observed = torch.full((8, 7), -1)
    observed[:3, 1] = 1
    observed[5:, 3] = 2
    cands, tgt = [0, 1, 2, 3, 4], [5, 6]
    q = torch.tensor([0.0, 0.1, 0.25, 0.5, 0.6, 0.8, 0.9, 1.0], dtype=torch.float64)
    per = member_lookahead_accuracy_gain(model, observed, cands, tgt, q, max_later=2, chunk=3)
    for v in range(8):
        one = member_lookahead_accuracy_gain(model, observed, cands, tgt, float(q[v]), max_later=2)
        assert torch.allclose(per[v], one[v], atol=1e-12)
    r = torch.tensor([1.0, 0.9, 0.2, 0.5, 1.0, 0.3, 0.7, 0.6], dtype=torch.float64)
    ge = GroupElicitation(
        model,
        observed,
        cands,
        tgt,
        GroupMethod("eacc2_budget", "eacc2"),
        GroupBudget(3, 3),
        response_prob=r,
    )
    base_q = ge.context().lookahead_q
    assert base_q == pytest.approx(min(1.0, 3 / 8 * 2))
    question, who, scores = ge.plan()
    gain = member_lookahead_accuracy_gain(model, observed, cands, tgt, base_q * r) * r.unsqueeze(1)
    assert torch.allclose(scores, torch.topk(gain, 3, dim=0).values.sum(0))
    ignoring_r = member_lookahead_accuracy_gain(model, observed, cands, tgt, base_q)
    assert not torch.allclose(gain, ignoring_r * r.unsqueeze(1), atol=1e-9)
    chosen = gain[:, cands.index(question)]
    assert sorted(who.tolist()) == sorted(torch.argsort(-chosen)[:3].tolist())
    with pytest.raises(GroupError, match=r"\[8\] of them"):
        member_lookahead_accuracy_gain(model, observed, cands, tgt, q[:5])
    with pytest.raises(GroupError, match="q must be"):
        member_lookahead_accuracy_gain(model, observed, cands, tgt, q * 2)


def test_lookahead_refuses_a_chance_outside_0_1() -> None:
    model = _three_personas()
    history = torch.full((4, 6), -1)
    cands, tgt = [2, 3, 5], [4]
    with pytest.raises(GroupError, match="q must be in"):
        member_lookahead_accuracy_gain(model, history, cands, tgt, 1.5)


@pytest.mark.parametrize(
    ("question", "respondents", "max_later"),
    [("eacc2_budget", "eacc2", None), ("elook_budget", "elook", 1)],
)
def test_lookahead_chance_follows_the_budget(
    monkeypatch: pytest.MonkeyPatch, question: str, respondents: str, max_later: int | None
) -> None:
    """``lookahead_q`` = share asked per round x rounds left after this one, at most 1;
    the question and respondents are the top gains at that ``q`` (``elook``: over each
    member's :data:`LOOKAHEAD_SECOND` best second questions, set to 1 here so that it
    differs from the full lookahead), on the random four-persona mixture; some members
    already answered, so the members' gains differ."""
    monkeypatch.setattr(selectors, "LOOKAHEAD_SECOND", 1)
    model = _random_mixture()
    observed = torch.full((10, 7), -1)
    observed[:4, 1] = 1
    observed[6:, 3] = 2
    cands, tgt = [0, 1, 2, 3, 4], [5, 6]
    for share, rounds, q in ((0.2, 3, 0.4), (0.5, 4, 1.0), (0.2, 1, 0.0)):
        ge = GroupElicitation(
            model,
            observed,
            cands,
            tgt,
            GroupMethod(question, respondents),
            GroupBudget(share, rounds),
        )
        assert ge.context().lookahead_q == pytest.approx(q)
        q_, who, scores = ge.plan()
        gain = member_lookahead_accuracy_gain(model, observed, cands, tgt, q, max_later=max_later)
        if max_later is not None and q > 0:
            full = member_lookahead_accuracy_gain(model, observed, cands, tgt, q)
            assert not torch.allclose(gain, full, atol=1e-9)
        top = torch.topk(gain, len(who), dim=0).values.sum(0)
        assert torch.allclose(scores, top)
        assert q_ == cands[int(top.argmax())]
        chosen = gain[:, cands.index(q_)]
        eligible = observed[:, q_] < 0
        left_out = eligible.clone()
        left_out[who] = False
        assert bool(eligible[who].all()) and len(set(who.tolist())) == len(who)
        assert len(who) == min(int(eligible.sum()), round(share * 10))
        assert float(chosen[who].min()) >= float(chosen[left_out].max()) - 1e-12
        assert float(chosen[eligible].max()) > float(chosen[eligible].min()) + 1e-6


def test_eig_respondents_pick_the_member_whose_answer_is_informative() -> None:
    # persona 0 answers q0..q2 with 0, persona 1 with 1 (no noise); target q2
    mu = torch.zeros(2, 6, 3, dtype=torch.float64)
    mu[:, 0, :2] = 0.5
    mu[:, 1, :3] = 1 / 3
    mu[:, 5, :3] = 1 / 3
    for c in range(2):
        mu[c, 2:5, c] = 1.0
    model = PersonaMixture(BANK, mu)
    observed = torch.full((5, 6), -1)
    observed[:, 0] = 0
    observed[[0, 1, 3, 4], 3] = torch.tensor([0, 1, 1, 0])  # everyone but member 2 is known
    ge = GroupElicitation(model, observed, [2], [4], GroupMethod("eig", "eig"), GroupBudget(1, 1))
    q, who, _ = ge.plan()
    assert q == 2 and who.tolist() == [2]
    eig = member_eig(model, observed, [2], [4])[:, 0]
    assert float(eig[2]) == pytest.approx(math.log(2))
    assert float(eig[[0, 1, 3, 4]].abs().max()) < 1e-6  # 0 up to the 1e-10 likelihood floor
    # with a member unlikely to answer, the expected gain moves to another uncertain one
    observed[4, 3] = -1
    prob = torch.tensor([1.0, 1.0, 0.3, 1.0, 0.9], dtype=torch.float64)
    ge = GroupElicitation(
        model, observed, [2], [4], GroupMethod("eig", "eig"), GroupBudget(1, 1), response_prob=prob
    )
    assert ge.plan()[1].tolist() == [4]


def test_group_eig_question_picks_the_informative_question() -> None:
    # q0 is informative about the target q2; q1 is noise
    mu = torch.zeros(2, 6, 3, dtype=torch.float64)
    mu[:, 0, :2] = 0.5
    mu[:, 1, :3] = 1 / 3
    mu[:, 3, :2] = 0.5
    mu[:, 5, :3] = 1 / 3
    for c in range(2):
        mu[c, 2, c], mu[c, 2, 1 - c] = 0.9, 0.1
        mu[c, 4, c], mu[c, 4, 1 - c] = 0.9, 0.1
    model = PersonaMixture(BANK, mu)
    observed = torch.full((6, 6), -1)
    for q_sel in ("eig", "eig_budget"):
        ge = GroupElicitation(
            model, observed, [3, 2, 5], [4], GroupMethod(q_sel, "eig"), GroupBudget(2, 1)
        )
        q, _, scores = ge.plan()
        assert q == 2, (q_sel, scores)
        assert float(scores[1]) > float(scores[0]) + 0.1


def test_budget_eig_question_on_a_member_subsample_estimates_the_exact_score() -> None:
    """Large groups: the question is scored on ``max_members`` random members, scaled."""
    from elicitation.group import BudgetEIGQuestion, RoundContext

    truth, observed = toy_group(n=600, seed=3)
    observed[:300, 2] = truth[:300, 2]  # half the group already answered q0
    ctx = RoundContext(
        toy_model(),
        observed,
        observed,
        [5],
        torch.ones(600, dtype=torch.float64),
        torch.Generator().manual_seed(0),
    )
    cands = [2, 3, 4]
    exact = BudgetEIGQuestion(max_members=None).scores(ctx, cands, 60)
    assert torch.equal(BudgetEIGQuestion(max_members=600).scores(ctx, cands, 60), exact)
    approx = BudgetEIGQuestion(max_members=150).scores(ctx, cands, 60)
    # exact: the top 60 gains of 600 members; subsample: the top 15 of 150, times 4
    torch.testing.assert_close(approx, exact, rtol=0.1, atol=0.0)
    assert int(torch.argmax(approx)) == int(torch.argmax(exact))
    with pytest.raises(GroupError, match="max_members"):
        BudgetEIGQuestion(max_members=0)


# ---- rounds, non-response, imputation -----------------------------------------------------
@pytest.mark.parametrize(
    ("imputation", "online"),
    [
        ("none", False),
        ("self", False),
        ("gnn", False),
        ("gnn_only", False),
        ("pool", False),
        ("pool", True),
        ("stack", False),
        ("stack", True),
    ],
)
def test_round_without_answers_leaves_predictions_unchanged(
    gnn_view: GNNView, imputation: str, online: bool
) -> None:
    truth, observed = toy_group()
    ge = GroupElicitation(
        toy_model(),
        observed,
        [2, 3, 4],
        [5],
        GroupMethod("eig", "random", imputation, online_pool=online),
        GroupBudget(10, 3),
        gnn=gnn_view,
        pool_weight=0.5,
        pool_z=0.0,
        stack_weights=[[0.6, 0.3, 0.2], [0.5, 0.3, 0.4], [0.4, 0.2, 0.6], [0.3, 0.3, 0.5]],
    )
    q, who, _ = ge.plan()
    ge.apply(q, who, truth[who, q])  # a first real round
    before = ge.predict_targets()
    w_before, rows_before = ge.pool_weight, ge.pool_group_gains.shape[0]
    stack_before, lam_before = ge.current_stack_weights(), ge.stack_lambda
    q2, who2, _ = ge.plan()
    ge.apply(q2, who2, torch.full_like(who2, -1))  # nobody answers
    assert torch.equal(ge.predict_targets(), before)
    assert ge.pool_weight == w_before and ge.pool_group_gains.shape[0] == rows_before
    assert torch.equal(ge.current_stack_weights(), stack_before)
    assert ge.stack_lambda == lam_before and len(ge.stack_group) == int(
        online and imputation == "stack"
    )
    assert ge.answers_used == 20 and len(ge.records) == 2
    # and a round with answers does change them
    q3, who3, _ = ge.plan()
    ge.apply(q3, who3, truth[who3, q3])
    assert not torch.equal(ge.predict_targets(), before)


def test_imputation_fills_members_not_asked(gnn_view: GNNView) -> None:
    truth, observed = toy_group()
    for mode in ("self", "gnn"):
        ge = GroupElicitation(
            toy_model(),
            observed,
            [2, 3, 4],
            [5],
            GroupMethod("random", "random", mode),
            GroupBudget(10, 1),
            gnn=gnn_view,
        )
        q, who, _ = ge.plan()
        ge.apply(q, who, truth[who, q])
        filled = ge.imputed[:, q] >= 0
        assert int(filled.sum()) == 30 and not bool(filled[who].any())
        # with the toy's strong camp signal both imputers mostly follow attribute a0
        agree = (ge.imputed[filled, q] == observed[filled, 0]).double().mean()
        assert float(agree) > 0.7, mode


def test_answers_are_validated() -> None:
    truth, observed = toy_group()
    ge = GroupElicitation(
        toy_model(), observed, [2, 3], [5], GroupMethod("random", "random"), GroupBudget(5, 2)
    )
    q, who, _ = ge.plan()
    with pytest.raises(GroupError, match="asked twice"):
        ge.apply(q, torch.tensor([1, 1]), torch.tensor([0, 1]))
    with pytest.raises(Exception, match="out of range"):
        ge.apply(q, torch.tensor([1]), torch.tensor([5]))
    assert ge.answers_used == 0 and not ge.records


# ---- pooling ---------------------------------------------------------------------------------
def test_log_linear_pool_exact() -> None:
    a = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    b = torch.tensor([[0.9, 0.1, 0.0]], dtype=torch.float64)
    p = log_linear_pool(a, b, 0.5)
    expected = torch.tensor([0.9**0.5 * 0.5**0.5, 0.1**0.5 * 0.5**0.5, 0.0])
    torch.testing.assert_close(p[0], (expected / expected.sum()).double())
    torch.testing.assert_close(log_linear_pool(a, b, 0.0), a)
    torch.testing.assert_close(log_linear_pool(a, b, 1.0), b)


def test_stacked_pool_exact_and_special_cases() -> None:
    a = torch.tensor([[0.5, 0.3, 0.2, 0.0]], dtype=torch.float64)
    b = torch.tensor([[0.1, 0.6, 0.3, 0.0]], dtype=torch.float64)
    c = torch.tensor([[0.2, 0.2, 0.6, 0.0]], dtype=torch.float64)
    probs = torch.stack([a, b, c])
    p = stacked_pool(probs, [2.0, 0.5, 1.0])
    expected = a[0] ** 2 * b[0] ** 0.5 * c[0]
    torch.testing.assert_close(p[0], expected / expected.sum())
    assert float(p[0, 3]) == 0.0  # an option no component supports stays impossible
    torch.testing.assert_close(stacked_pool(probs, [1.0, 0.0, 0.0]), a)
    torch.testing.assert_close(stacked_pool(probs, [0.0, 0.0, 1.0]), c)
    torch.testing.assert_close(stacked_pool(probs, [0.7, 0.3, 0.0]), log_linear_pool(a, b, 0.3))
    torch.testing.assert_close(
        shrunk_stack_weights(torch.tensor([0.2, 0.6, 0.4], dtype=torch.float64), 0.25),
        torch.tensor([0.8, 0.15, 0.1], dtype=torch.float64),
    )
    with pytest.raises(GroupError, match="weights"):
        stacked_pool(probs, [1.0, 0.0])


def _stack_case(weights: list[float], n: int = 3000, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Three random predictors and answers drawn from their stack with ``weights``."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.randn(3, n, 2, 4, generator=g, dtype=torch.float64).softmax(-1)
    probs[..., 3] = 0.0  # a padded option
    probs = probs / probs.sum(-1, keepdim=True)
    truth = torch.multinomial(stacked_pool(probs, weights).reshape(-1, 4), 1, generator=g)
    return probs, truth.reshape(n, 2)


def test_fit_stack_weights_recovers_the_generating_weights() -> None:
    # answers drawn from p ∝ p0^1.5 * p1^0.5: maximum likelihood finds (1.5, 0.5) and
    # puts exactly 0 (the bound) on the third, irrelevant predictor
    probs, truth = _stack_case([1.5, 0.5, 0.0])
    a, info = fit_stack_weights(probs, truth)
    torch.testing.assert_close(
        a[:2], torch.tensor([1.5, 0.5], dtype=torch.float64), atol=0.12, rtol=0
    )
    assert float(a[2]) < 0.05
    assert info["answers"] == truth.numel() and info["nll"] < info["nll_first"]

    # the optimum: no other weights (each predictor alone, the pool of the first two at
    # any weight, the generating weights) give a lower log loss on these answers
    def nll(w: list[float] | torch.Tensor) -> float:
        p = stacked_pool(probs, w).gather(-1, truth[..., None]).squeeze(-1)
        return float(-p.log().mean())

    assert nll(a) == pytest.approx(info["nll"], abs=1e-9)
    for w in ([1, 0, 0], [0, 1, 0], [0, 0, 1], [1.5, 0.5, 0.0], [0.7, 0.3, 0.0], [1.2, 0.6, 0.1]):
        assert info["nll"] <= nll(w) + 1e-12
    # and the gradient vanishes at the free weights (a stationary point of a convex loss)
    x = a.clone().requires_grad_(True)
    logit = torch.einsum("k,kpto->pto", x, probs.clamp_min(1e-12).log())
    logit = logit.masked_fill(probs[0] == 0, float("-inf"))
    loss = -torch.log_softmax(logit, -1).gather(-1, truth[..., None]).sum()
    (grad,) = torch.autograd.grad(loss, x)
    assert float(grad[:2].abs().max()) / truth.numel() < 1e-6
    assert float(grad[2]) >= -1e-6 or float(a[2]) > 0  # at the bound only if it pushes out


def test_fit_stack_weights_gives_the_belief_model_alone_when_it_is_the_truth() -> None:
    probs, truth = _stack_case([1.0, 0.0, 0.0], n=4000, seed=3)
    a, _ = fit_stack_weights(probs, truth)
    torch.testing.assert_close(
        a, torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), atol=0.08, rtol=0
    )
    # identical components: only their sum is identified, and it is found
    same = torch.stack([probs[0], probs[0], probs[1]])
    a2, _ = fit_stack_weights(same, truth)
    assert float(a2[0] + a2[1]) == pytest.approx(float(a[0]), abs=1e-3)


def test_stack_gain_rows_by_hand() -> None:
    probs, truth = _stack_case([1.0, 0.4, 0.2], n=50, seed=5)
    truth[0] = -1  # a unit without scored answers is left out
    truth[1, 0] = -1
    direction = torch.tensor([0.8, 0.5, 0.3], dtype=torch.float64)
    sums, counts = stack_gain_rows(probs, truth, direction, grid=5)
    assert sums.shape == (49, 5) and counts[0] == 1 and float(counts[1:].min()) == 2
    assert float(sums[:, 0].abs().max()) < 1e-12  # lam = 0: the belief model itself
    for j, lam in enumerate((0.0, 0.25, 0.5, 0.75, 1.0)):
        w = lam * direction + (1 - lam) * torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
        p = stacked_pool(probs[:, 1], w)  # member 1: only its second target is scored
        expected = math.log(float(p[1, truth[1, 1]])) - math.log(float(probs[0, 1, 1, truth[1, 1]]))
        assert float(sums[0, j]) == pytest.approx(expected, abs=1e-9)


def test_online_stack_shrinkage_is_the_rule_on_validation_and_group_units(
    gnn_view: GNNView,
) -> None:
    truth, observed = toy_group()
    g = torch.Generator().manual_seed(2)
    direction = [[0.6, 0.5, 0.1], [0.5, 0.4, 0.4]]
    evidence = [
        (
            torch.randn(30, 21, generator=g, dtype=torch.float64) * 0.05 + 0.02,
            torch.full((30,), 5.0),
        )
        for _ in direction
    ]
    ge = GroupElicitation(
        toy_model(),
        observed,
        [2, 3, 4],
        [5],
        GroupMethod("eig", "random", "stack", online_pool=True),
        GroupBudget(10, 2),
        gnn=gnn_view,
        stack_weights=direction,
        stack_evidence=evidence,
        pool_z=1.0,
    )
    lam0, _ = pool_weight_from_gains(*evidence[0], z=1.0)
    assert ge.stack_lambda == lam0
    q, who, _ = ge.plan()
    comps = ge.stack_components([q])[:, who]  # predicted before the answers arrive
    ge.apply(q, who, truth[who, q])
    rows, n = stack_gain_rows(comps, truth[who, q].reshape(-1, 1), torch.tensor(direction[1]))
    lam1, _ = pool_weight_from_gains(
        torch.cat([evidence[1][0], rows]), torch.cat([evidence[1][1], n]), z=1.0
    )
    assert ge.stack_lambda == lam1
    a = torch.tensor(direction[1], dtype=torch.float64)
    torch.testing.assert_close(ge.current_stack_weights(), shrunk_stack_weights(a, lam1))
    expected = stacked_pool(ge.stack_components(), shrunk_stack_weights(a, lam1))
    torch.testing.assert_close(ge.predict_targets(), expected)


def test_fit_pool_weight_prefers_the_better_predictor() -> None:
    g = torch.Generator().manual_seed(0)
    truth = torch.randint(0, 2, (200, 3), generator=g)
    sharp = torch.nn.functional.one_hot(truth, 2).double() * 0.8 + 0.1
    flat = torch.full((200, 3, 2), 0.5, dtype=torch.float64)
    assert fit_pool_weight(flat, sharp, truth)[0] == 1.0
    assert fit_pool_weight(sharp, flat, truth)[0] == 0.0
    w, losses = fit_pool_weight(flat, sharp, truth)
    assert losses["1.00"] == pytest.approx(-math.log(0.9))


def test_choose_pool_weight_keeps_a_helpful_gnn_and_drops_a_useless_one() -> None:
    g = torch.Generator().manual_seed(0)
    truth = torch.randint(0, 2, (200, 3), generator=g)
    sharp = torch.nn.functional.one_hot(truth, 2).double() * 0.8 + 0.1
    flat = torch.full((200, 3, 2), 0.5, dtype=torch.float64)
    # the GNN is right with 0.9 where the belief model says 0.5: the gain grows with w
    # and is the same for every member (standard error 0): full weight
    w, info = choose_pool_weight(flat, sharp, truth)
    assert w == 1.0 and info["w_best_mean"] == 1.0
    assert info["gain"] == pytest.approx(math.log(0.9 / 0.5)) and info["gain_se"] < 1e-12
    # a GNN equal to the belief model adds nothing: the pool is not used
    assert choose_pool_weight(sharp, sharp.clone(), truth)[0] == 0.0

    def mixed(wrong_prob: float, every: int) -> torch.Tensor:
        """Sharp and right (0.9) except for every ``every``-th member (``wrong_prob``)."""
        wrong = torch.nn.functional.one_hot(1 - truth, 2).double() * (1 - 2 * wrong_prob)
        wrong = wrong + wrong_prob
        return torch.where(torch.arange(200).reshape(200, 1, 1) % every != 0, sharp, wrong)

    belief = torch.nn.functional.one_hot(truth, 2).double() * 0.4 + 0.3  # right, 0.7
    # right for half of the members, wrong (0.45) for the other half: the best mean gain
    # on this sample is at w = 0.15, but no weight's gain is 2 standard errors above 0
    w, info = choose_pool_weight(belief, mixed(0.45, 2), truth)
    assert w == 0.0 and info["w_best_mean"] == pytest.approx(0.15)
    assert info["w_best_mean"] == fit_pool_weight(belief, mixed(0.45, 2), truth)[0]
    assert 0 < info["gain"] < 2 * info["gain_se"]
    # right for two members in three: the best mean is at 0.2, the highest lower bound at
    # the more cautious 0.1; gain and standard error as the ratio estimator by hand
    gnn = mixed(0.3, 3)
    w, info = choose_pool_weight(belief, gnn, truth)
    assert info["w_best_mean"] == pytest.approx(0.2) and w == pytest.approx(0.1)
    y = truth.unsqueeze(-1)
    d = (
        log_linear_pool(belief, gnn, 0.1).gather(-1, y).log() - belief.gather(-1, y).log()
    ).squeeze(-1)
    per_member = d.sum(1)  # 3 answers each
    mean = float(per_member.sum() / 600)
    se = math.sqrt(float(((per_member - 3 * mean) ** 2).sum()) * 200 / 199) / 600
    assert info["gain"] == pytest.approx(mean) and info["gain_se"] == pytest.approx(se)
    assert info["lcb"] == pytest.approx(mean - 2 * se) and info["lcb"] > 0
    # unscored members and targets are ignored
    t2 = truth.clone()
    t2[:100] = -1
    t2[100:, 0] = -1
    info = choose_pool_weight(flat, sharp, t2)[1]
    assert info["members"] == 100 and info["answers"] == 200


def test_online_pool_scores_each_answer_before_it_arrives(gnn_view: GNNView) -> None:
    """The group's answers are scored by the predictions made before them, one row each,
    and the weight is re-chosen from validation evidence + those rows."""
    truth, observed = toy_group()
    # validation evidence: 30 members with 5 answers each for whom no weight gains anything
    evidence = (torch.zeros(30, 21, dtype=torch.float64), torch.full((30,), 5.0))
    ge = GroupElicitation(
        toy_model(),
        observed,
        [2, 3, 4],
        [5],
        GroupMethod("eig_budget", "eig", "pool", online_pool=True),
        GroupBudget(12, 2),
        gnn=gnn_view,
        pool_weight=0.0,
        pool_evidence=evidence,
    )
    q, who, _ = ge.plan()
    p_b = ge.model.predict_batch(ge.state, [q])[who]
    p_g = gnn_view.predict(ge.observed, 6, 3)[who][:, [q], :]
    answers = truth[who, q].clone()
    answers[:2] = -1  # two members do not answer: no rows for them
    ge.apply(q, who, answers)
    got = answers >= 0
    expected_rows, counts = pool_gain_rows(p_b[got], p_g[got], answers[got].reshape(-1, 1))
    assert torch.equal(counts, torch.ones(10, dtype=torch.float64))
    assert ge.pool_group_gains.shape == (10, 21)
    torch.testing.assert_close(ge.pool_group_gains, expected_rows)
    w, _ = pool_weight_from_gains(
        torch.cat([evidence[0], expected_rows]), torch.cat([evidence[1], counts])
    )
    assert ge.pool_weight == w
    # the column of weight 0 is the belief model against itself: no gain (up to rounding)
    torch.testing.assert_close(
        ge.pool_group_gains[:, 0], torch.zeros(10, dtype=torch.float64), atol=1e-12, rtol=0
    )


def test_online_pool_needs_the_pool_imputation() -> None:
    with pytest.raises(GroupError, match="online_pool"):
        GroupMethod("eig", "eig", "none", online_pool=True)


# ---- group-level prior ------------------------------------------------------------------------
def test_adapted_prior_is_the_map_fixed_point_and_moves_toward_the_group() -> None:
    from elicitation.group import adapt_mixture_prior

    model = toy_model()  # uniform training weights
    history = torch.full((30, 6), -1)
    history[:, 2] = 1  # everyone answers q0 like camp 1 (p = 0.85 vs 0.15)
    history[:5, 2] = 0
    adapted = adapt_mixture_prior(model, history, strength=10.0, iters=500)
    pi = adapted.log_prior.exp()
    assert float(pi[1]) > 0.7
    # fixed point of the MAP EM update, computed by hand
    like = torch.stack([model.mu[:, 2, int(a)] for a in history[:, 2]])  # [N, K]
    g = pi * like / (pi * like).sum(1, keepdim=True)
    torch.testing.assert_close((g.sum(0) + 10.0 * 0.5) / (30 + 10.0), pi)
    # a strong prior keeps the training weights; components are unchanged
    stiff = adapt_mixture_prior(model, history, strength=1e9).log_prior.exp()
    torch.testing.assert_close(stiff, torch.full((2,), 0.5, dtype=torch.float64), atol=1e-6, rtol=0)
    assert torch.equal(adapted.mu, model.mu)


def test_adapted_group_round_without_answers_changes_nothing() -> None:
    truth, observed = toy_group()
    method = GroupMethod("eig_budget", "eig", "none", adapt_prior=True)
    ge = GroupElicitation(toy_model(), observed, [2, 3, 4], [5], method, GroupBudget(10, 2))
    before = ge.predict_targets()
    q, who, _ = ge.plan()
    ge.apply(q, who, torch.full_like(who, -1))
    assert torch.equal(ge.predict_targets(), before)
