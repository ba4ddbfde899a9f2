"""The robust selection variants: ``eig_tempered`` and ``eig2`` with a fixed follow-up.

Checked against enumeration from the raw tables (``mu``, the prior) as the other
criterion tests are, and on the constructed case with one perfectly informative item.
"""

from __future__ import annotations

import math

import pytest
import torch

from elicitation.criteria import (
    DEFAULT_DELTA,
    DEFAULT_EVIDENCE_STRENGTH,
    best_index,
    get_criterion,
)
from elicitation.errors import ElicitationError
from models.base import DTYPE, ItemBank
from models.persona import PersonaMixture
from tests.support.criteria_cases import brute_force_eig, enumerated_joint, mean_target_entropy
from tests.support.elicitation_cases import informative_mixture, random_mixture


def _selection_prior(
    model: PersonaMixture, answers: list[tuple[int, int]], tau: float, w: float
) -> torch.Tensor:
    """``log((1 - w) post^tau / Z + w prior)`` with the posterior from the raw tables."""
    prior = model.log_prior.exp()
    post = prior.clone()
    for item, opt in answers:
        post = post * model.mu[:, item, opt]
    post = post / post.sum()
    flat = post**tau
    flat = flat / flat.sum()
    return ((1 - w) * flat + w * prior / prior.sum()).log()


@pytest.mark.parametrize(("tau", "w"), [(0.5, 0.0), (0.7, 0.3), (1.0, 0.5)])
def test_tempered_eig_equals_enumeration_under_the_selection_belief(tau: float, w: float) -> None:
    model = random_mixture((2, 3, 2, 4, 3, 2), k=5, seed=3)
    answers = [(1, 2), (0, 1)]
    targets, cands = [4, 5], [3, 2]
    state = model.replay(answers)
    got = get_criterion("eig_tempered", tau=tau, prior_weight=w).score(model, state, cands, targets)
    # the EIG of a model whose prior is the selection belief, with nothing answered
    sel = model.with_prior(_selection_prior(model, answers, tau, w))
    want = torch.tensor([brute_force_eig(sel, [], x, targets) for x in cands], dtype=DTYPE)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    # it is not eig (the test can fail): the flattened belief changes the scores
    plain = get_criterion("eig").score(model, state, cands, targets)
    assert float((got - plain).abs().max()) > 1e-4
    # batched: the same respondent twice and a fresh one
    obs = torch.full((3, 6), -1, dtype=torch.long)
    obs[0, 1], obs[0, 0] = 2, 1
    obs[1, 1], obs[1, 0] = 2, 1
    got_b = get_criterion("eig_tempered", tau=tau, prior_weight=w).score_batch(
        model, model.initial_batch(obs), cands, targets
    )
    torch.testing.assert_close(got_b[0], want, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got_b[1], want, rtol=1e-9, atol=1e-12)
    fresh = model.with_prior(_selection_prior(model, [], tau, w))
    want_2 = torch.tensor([brute_force_eig(fresh, [], x, targets) for x in cands], dtype=DTYPE)
    torch.testing.assert_close(got_b[2], want_2, rtol=1e-9, atol=1e-12)


def test_tempered_eig_with_tau_one_is_eig() -> None:
    model = random_mixture((2, 3, 2, 4, 3, 2), k=6, seed=5)
    state = model.replay([(2, 1)])
    a = get_criterion("eig_tempered", tau=1.0, prior_weight=0.0).score(model, state, [0, 1, 3], [5])
    b = get_criterion("eig").score(model, state, [0, 1, 3], [5])
    assert torch.equal(a, b)


def brute_force_pair(
    model: PersonaMixture,
    answers: list[tuple[int, int]],
    x: int,
    pool: list[int],
    targets: list[int],
) -> float:
    """``H_now - min_{x' != x} sum_{k, j} p(Y_x = k, Y_x' = j) H(targets | answers, k, j)``."""
    n_opt = model.item_bank.n_options
    best = math.inf
    for y in pool:
        if y == x:
            continue
        p_xy = enumerated_joint(model, answers, [x, y])
        e = sum(
            p_xy[(k, j)] * mean_target_entropy(model, [*answers, (x, k), (y, j)], targets)
            for k in range(n_opt[x])
            for j in range(n_opt[y])
        )
        best = min(best, e)
    return mean_target_entropy(model, answers, targets) - best


@pytest.mark.parametrize("seed", [0, 1])
def test_fixed_follow_up_equals_enumeration(seed: int) -> None:
    model = random_mixture((2, 3, 2, 4, 3, 2, 3), k=5, seed=seed)
    answers = [(1, 2)]
    targets, cands = [5, 6], [3, 0, 2, 4]
    state = model.replay(answers)
    crit = get_criterion("eig2", top_k=4, follow_k=4, follow_up="fixed")
    got, gains = crit.score_with_gains(model, state, cands, targets)
    one = [brute_force_eig(model, answers, x, targets) for x in cands]
    pair = [brute_force_pair(model, answers, x, cands, targets) for x in cands]
    want = 0.5 * torch.tensor(one, dtype=DTYPE) + 0.5 * torch.tensor(pair, dtype=DTYPE)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert gains is not None
    # a fixed follow-up is never better than an adaptive one: pair <= two-step value
    adaptive = get_criterion("eig2", top_k=4, follow_k=4).score(model, state, cands, targets)
    assert bool((got <= adaptive + 1e-12).all())
    # batched, with a respondent who already answered candidate 0 (never a follow-up)
    obs = torch.full((2, 7), -1, dtype=torch.long)
    obs[0, 1] = 2
    obs[1, 0] = 1
    got_b = crit.score_batch(model, model.initial_batch(obs), cands, targets)
    torch.testing.assert_close(got_b[0], want, rtol=1e-9, atol=1e-12)
    rest = [3, 2, 4]
    want_1 = [
        0.5 * brute_force_eig(model, [(0, 1)], x, targets)
        + 0.5 * brute_force_pair(model, [(0, 1)], x, rest, targets)
        for x in rest
    ]
    torch.testing.assert_close(
        got_b[1, [0, 2, 3]], torch.tensor(want_1, dtype=DTYPE), rtol=1e-9, atol=1e-12
    )


CANDIDATES = [3, 1, 0, 2]  # the informative item 0 is neither first nor last


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "eig_tempered", "tau": 0.5},
        {"name": "eig_tempered", "tau": 0.8, "prior_weight": 0.3},
        {"name": "eig2", "follow_up": "fixed"},
    ],
)
def test_robust_variants_pick_the_perfectly_informative_item(kwargs: dict) -> None:
    kw = dict(kwargs)
    crit = get_criterion(kw.pop("name"), **kw)
    model = informative_mixture()
    for state in (model.initial_state(), model.replay([(1, 0)])):
        scores = crit.score(model, state, CANDIDATES, [4])
        assert CANDIDATES[best_index(scores)] == 0
        assert float(scores[2]) > float(scores[[0, 1, 3]].max()) + 1e-6
    batch = model.initial_batch(torch.full((3, 5), -1, dtype=torch.long))
    assert (crit.score_batch(model, batch, CANDIDATES, [4]).argmax(1) == 2).all()


def test_tempered_errors() -> None:
    with pytest.raises(ElicitationError, match="tau"):
        get_criterion("eig_tempered", tau=0.0)
    with pytest.raises(ElicitationError, match="prior_weight"):
        get_criterion("eig_tempered", prior_weight=1.0)
    with pytest.raises(ElicitationError, match="follow_up"):
        get_criterion("eig2", follow_up="sometimes")


# ---- eig_anchored --------------------------------------------------------------------------
def test_anchored_is_eig_minus_delta_per_skipped_position() -> None:
    model = random_mixture((2, 3, 2, 4, 3, 2, 3), k=6, seed=2)
    cands, targets = [3, 0, 2, 4, 1], [5, 6]
    fixed = get_criterion("fixed")
    fixed.prepare(model, cands, targets)
    order = fixed.order
    # delta = 0 is eig exactly
    state = model.replay([(order[1], 1)])
    eig = get_criterion("eig").score(model, state, cands, targets)
    zero = get_criterion("eig_anchored", delta=0.0)
    zero.prepare(model, cands, targets)
    assert torch.equal(zero.score(model, state, cands, targets), eig)
    # r(x): candidates not answered yet that come before x in the fixed order
    crit = get_criterion("eig_anchored", delta=0.01)
    crit.prepare(model, cands, targets)
    got = crit.score(model, state, cands, targets)
    for ci, x in enumerate(cands):
        r = sum(1 for y in order[: order.index(x)] if y != order[1])
        assert float(got[ci]) == pytest.approx(float(eig[ci]) - 0.01 * r, abs=1e-12)
    # batched: same respondent and a fresh one
    obs = torch.full((2, 7), -1, dtype=torch.long)
    obs[0, order[1]] = 1
    got_b = crit.score_batch(model, model.initial_batch(obs), cands, targets)
    torch.testing.assert_close(got_b[0], got, rtol=0, atol=1e-12)
    eig_0 = get_criterion("eig").score(model, model.initial_state(), cands, targets)
    want_1 = torch.tensor(
        [float(eig_0[ci]) - 0.01 * order.index(x) for ci, x in enumerate(cands)], dtype=DTYPE
    )
    torch.testing.assert_close(got_b[1], want_1, rtol=0, atol=1e-12)
    # a huge delta follows the fixed order: the next unanswered item of the list
    big = get_criterion("eig_anchored", delta=1e3)
    big.prepare(model, cands, targets)
    assert cands[best_index(big.score(model, model.initial_state(), cands, targets))] == order[0]
    state0 = model.replay([(order[0], 0)])
    rest = [c for c in cands if c != order[0]]
    assert rest[best_index(big.score(model, state0, rest, targets))] == order[1]


def test_anchored_picks_the_perfectly_informative_item() -> None:
    model = informative_mixture()
    for kw in ({"delta": 0.002}, {"delta": 0.002, "tau": 0.6}):
        crit = get_criterion("eig_anchored", **kw)
        crit.prepare(model, CANDIDATES, [4])
        scores = crit.score(model, model.initial_state(), CANDIDATES, [4])
        assert CANDIDATES[best_index(scores)] == 0
        assert float(scores[2]) > float(scores[[0, 1, 3]].max()) + 1e-6
        batch = model.initial_batch(torch.full((3, 5), -1, dtype=torch.long))
        assert (crit.score_batch(model, batch, CANDIDATES, [4]).argmax(1) == 2).all()
    with pytest.raises(ElicitationError, match="delta"):
        get_criterion("eig_anchored", delta=-1.0)
    with pytest.raises(ElicitationError, match="evidence_strength"):
        get_criterion("eig_anchored", evidence_strength=-1.0)


def _measured(evidence_a: float, evidence_b: float) -> PersonaMixture:
    """Items A, B and target T, two equally likely classes; B looks more telling about T
    than A (0.8 vs 0.7 on the class's side), from ``evidence_b`` answers per class."""
    bank = ItemBank(("a", "b", "t"), (2, 2, 2))
    side = [(0.7, 0.3), (0.8, 0.2), (0.9, 0.1)]
    mu = torch.tensor([[list(p) for p in side], [list(reversed(p)) for p in side]], dtype=DTYPE)
    ev = torch.tensor([[evidence_a, evidence_b, 1e6]] * 2, dtype=DTYPE)
    return PersonaMixture(bank, mu, evidence=ev)


def test_anchored_computes_its_gains_under_the_evidence_view() -> None:
    """The gains are eig's under ``evidence_view(evidence_strength)``; the ranks and the
    state are the model's own. An item whose class distributions rest on 2 answers per
    class loses to a well-measured one it beats on its point estimates."""
    model = _measured(1000.0, 2.0)
    pool, targets = [0, 1], [2]
    state = model.initial_state()
    exact = get_criterion("eig").score(model, state, pool, targets)
    assert float(exact[1]) > float(exact[0])  # on the point estimates, B tells more
    for strength, pick in ((0.0, 1), (DEFAULT_EVIDENCE_STRENGTH, 0)):
        crit = get_criterion("eig_anchored", delta=0.0, evidence_strength=strength)
        crit.set_fixed_order(model, pool, targets, [0, 1])
        scores, gains = crit.score_with_gains(model, state, pool, targets)
        view = model.evidence_view(strength)
        want = get_criterion("eig").score(view, state, pool, targets)
        torch.testing.assert_close(gains, want, rtol=0, atol=1e-12)
        assert pool[best_index(scores)] == pick
        batch = model.initial_batch(torch.full((1, 3), -1, dtype=torch.long))
        torch.testing.assert_close(
            crit.score_batch(model, batch, pool, targets)[0], scores, rtol=0, atol=1e-12
        )
    # B measured as well as A: the point estimates are trusted again
    well = _measured(1000.0, 1000.0)
    crit = get_criterion("eig_anchored", delta=0.0)
    crit.set_fixed_order(well, pool, targets, [0, 1])
    assert pool[best_index(crit.score(well, well.initial_state(), pool, targets))] == 1


def test_default_method_selects_with_the_registered_defaults() -> None:
    """The benchmark's ``default`` is the app's default criterion (``StudySettings``), and
    ``eig_anchored`` / ``eig_tempered`` are what ``get_criterion`` builds with the
    registered defaults (the run's seed only seeds the fixed order's simulation)."""
    from app.schemas import StudySettings
    from elicitation.bench.methods import FitContext, get_method

    bank = informative_mixture().item_bank
    ctx = FitContext(bank, torch.zeros(0, 5), torch.zeros(0, 5), [], [0, 1, 2, 3], [4], seed=0)
    crit = get_method("default").criterion(ctx)  # type: ignore[misc]
    assert crit.name == StudySettings().criterion == "eig_anchored"
    assert crit.params() == get_criterion(StudySettings().criterion).params()
    assert crit.params()["delta"] == DEFAULT_DELTA > 0
    assert crit.params()["evidence_strength"] == DEFAULT_EVIDENCE_STRENGTH > 0
    # the old default stays measured under its own name
    eig = get_method("eig").criterion(ctx)  # type: ignore[misc]
    assert eig.name == "eig" and eig.params() == get_criterion("eig").params()
    anchored = get_method("eig_anchored").criterion(ctx)  # type: ignore[misc]
    assert anchored.params() == get_criterion("eig_anchored").params()
    assert anchored.params()["delta"] > 0
    tempered = get_method("eig_tempered").criterion(ctx)  # type: ignore[misc]
    assert tempered.params() == get_criterion("eig_tempered").params()
    assert tempered.params()["tau"] < 1.0


# ---- a fixed order handed over precomputed (what a live study stores with its model) ------
@pytest.mark.parametrize("name", ["fixed", "eig_anchored"])
def test_stored_fixed_order_is_used_and_never_recomputed(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from elicitation.criteria import FixedOrder

    model = random_mixture((2, 3, 2, 4, 3, 2, 3), k=6, seed=4)
    pool, targets = [3, 0, 2, 4, 1], [5, 6]
    computed = get_criterion(name)
    computed.prepare(model, pool, targets)
    order = computed.fixed.order if name == "eig_anchored" else computed.order
    # a deliberately different order (reversed), so the test fails if it were ignored
    stored_order = list(reversed(order))
    calls: list[int] = []

    def no_greedy(self: FixedOrder, *args: object) -> tuple[list[int], list[str]]:
        calls.append(1)
        raise AssertionError("the greedy order was recomputed")

    monkeypatch.setattr(FixedOrder, "_greedy", no_greedy)
    stored = get_criterion(name)
    stored.set_fixed_order(model, pool, targets, stored_order)
    stored.prepare(model, pool, targets)  # same model, pool, targets: nothing to do
    state = model.replay([(stored_order[1], 0)])
    rest = [c for c in pool if c != stored_order[1]]
    got = stored.score(model, state, rest, targets)
    if name == "fixed":
        want = torch.tensor([-float(stored_order.index(c)) for c in rest], dtype=DTYPE)
    else:
        eig = get_criterion("eig").score(model, state, rest, targets)
        r = torch.tensor(
            [sum(1 for y in stored_order[: stored_order.index(c)] if y in rest) for c in rest],
            dtype=DTYPE,
        )
        want = eig - get_criterion("eig_anchored").delta * r  # type: ignore[attr-defined]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    batch = model.initial_batch(torch.full((2, 7), -1, dtype=torch.long))
    stored.score_batch(model, batch, pool, targets)
    assert calls == []
    with pytest.raises(ElicitationError, match="exactly once"):
        get_criterion(name).set_fixed_order(model, pool, targets, order[:-1])
    with pytest.raises(ElicitationError, match="exactly once"):
        get_criterion(name).set_fixed_order(model, pool, targets, [*order[:-1], order[0]])


def test_anchored_returns_the_exact_gains_for_the_stopping_rule() -> None:
    from elicitation.budget import Budget
    from elicitation.session import decide

    model = random_mixture((2, 3, 2, 4, 3, 2, 3), k=6, seed=5)
    pool, targets = [3, 0, 2, 4, 1], [5, 6]
    crit = get_criterion("eig_anchored", delta=0.01)
    crit.prepare(model, pool, targets)
    state = model.replay([(2, 1)])
    rest = [3, 0, 4, 1]
    scores, gains = crit.score_with_gains(model, state, rest, targets)
    eig = get_criterion("eig").score(model, state, rest, targets)
    assert gains is not None
    torch.testing.assert_close(gains, eig, rtol=0, atol=0)
    assert torch.equal(scores, crit.score(model, state, rest, targets))
    # tempered gains are not target gains: none are returned
    assert (
        get_criterion("eig_anchored", tau=0.5).score_with_gains(model, state, rest, targets)[1]
        is None
    )
    d = decide(
        model,
        state,
        asked=[2],
        candidates=pool,
        targets=targets,
        criterion=crit,
        budget=Budget(max_questions=5, stop_eig_threshold=0.0),
    )
    assert d.item == rest[best_index(scores)]
    assert d.best_gain == pytest.approx(float(eig.max()), abs=1e-12)
