"""Selection criteria against exact answers (enumeration) and constructed cases."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from elicitation.criteria import (
    FixedOrder,
    best_index,
    criterion_names,
    entropy,
    get_criterion,
)
from elicitation.errors import CriterionNotApplicableError, ElicitationError, UnknownCriterionError
from models.base import DTYPE, ItemBank
from models.irt import GradedResponseModel
from models.persona import PersonaMixture
from tests.support.criteria_cases import (
    brute_force_eig,
    entropy_of,
    enumerated_joint,
    mean_target_entropy,
)
from tests.support.elicitation_cases import informative_mixture, random_mixture


class _WithoutCompactLookahead:
    """A model seen without ``target_entropy_lookahead`` (criteria then use ``lookahead``)."""

    def __init__(self, model: PersonaMixture) -> None:
        self._model = model

    def __getattr__(self, name: str) -> object:
        if name == "target_entropy_lookahead":
            raise AttributeError(name)
        return getattr(self._model, name)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_eig_equals_enumeration(seed: int) -> None:
    model = random_mixture((2, 3, 2, 4, 3, 2), k=5, seed=seed)
    answers = [(1, 2)]
    targets = [4, 5]
    cands = [3, 0, 2]
    state = model.replay(answers)
    crit = get_criterion("eig")
    got = crit.score(model, state, cands, targets)
    want = torch.tensor([brute_force_eig(model, answers, x, targets) for x in cands], dtype=DTYPE)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert bool((got > 0).all())
    # the same model without its compact single-respondent form: lookahead + predict
    generic = crit.score(_WithoutCompactLookahead(model), state, cands, targets)
    torch.testing.assert_close(generic, want, rtol=1e-9, atol=1e-12)
    # batched form: two respondents with different histories
    obs = torch.full((2, 6), -1, dtype=torch.long)
    obs[0, 1] = 2
    obs[1, 0] = 1
    got_b = crit.score_batch(model, model.initial_batch(obs), cands, targets)
    want_1 = torch.tensor(
        [brute_force_eig(model, [(0, 1)], x, targets) for x in cands], dtype=DTYPE
    )
    torch.testing.assert_close(got_b[0], want, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got_b[1], want_1, rtol=1e-9, atol=1e-12)


def test_eig_matches_monte_carlo_on_a_larger_case() -> None:
    """EIG = H_now - E[H after]; the expectation estimated by sampling answers."""
    model = random_mixture(tuple([4] * 12), k=30, seed=7)
    state = model.replay([(0, 1), (1, 3)])
    cands, targets = [2, 3, 4, 5, 6, 7], [9, 10, 11]
    exact = get_criterion("eig").score(model, state, cands, targets)
    gen = torch.Generator().manual_seed(0)
    n = 4000
    post = model.latent_posterior(state)
    h_now = float(entropy(model.predict(state, targets)).mean())
    for ci, x in enumerate(cands):
        theta = torch.multinomial(post, n, replacement=True, generator=gen)
        ys = torch.multinomial(model.mu[theta, x, :4], 1, generator=gen).squeeze(1)
        samples = torch.empty(n, dtype=DTYPE)
        cache: dict[int, float] = {}
        for j, y in enumerate(ys.tolist()):
            if y not in cache:
                cache[y] = float(entropy(model.predict(model.update(state, x, y), targets)).mean())
            samples[j] = cache[y]
        est = h_now - float(samples.mean())
        se = float(samples.std()) / math.sqrt(n)
        assert abs(est - float(exact[ci])) < 4 * se + 1e-12, (x, est, float(exact[ci]), se)


CANDIDATES = [3, 1, 0, 2]  # the informative item 0 is neither first nor last


@pytest.mark.parametrize("name", ["eig", "eig2", "posterior_entropy", "fixed"])
def test_criterion_picks_the_perfectly_informative_item(name: str) -> None:
    model = informative_mixture()
    crit = get_criterion(name)
    state = model.initial_state()
    scores = crit.score(model, state, CANDIDATES, [4])
    assert CANDIDATES[best_index(scores)] == 0
    assert float(scores[2]) > float(scores[[0, 1, 3]].max()) + 1e-6
    batch = model.initial_batch(torch.full((3, 5), -1, dtype=torch.long))
    scores_b = crit.score_batch(model, batch, CANDIDATES, [4])
    assert scores_b.shape == (3, 4)
    assert (scores_b.argmax(1) == 2).all()


def test_noise_items_have_zero_gain() -> None:
    model = informative_mixture()
    scores = get_criterion("eig").score(model, model.initial_state(), CANDIDATES, [4])
    torch.testing.assert_close(scores[[0, 1, 3]], torch.zeros(3, dtype=DTYPE), atol=1e-12, rtol=0)
    # the informative item's gain is the whole target entropy minus what is left
    eps = 0.01
    h_left = entropy_of([1 - 2 * eps + 2 * eps**2, 2 * eps - 2 * eps**2])
    assert float(scores[2]) == pytest.approx(math.log(2) - h_left, rel=1e-9)


def test_posterior_entropy_equals_enumeration() -> None:
    model = random_mixture((3, 2, 3, 2), k=4, seed=3)
    state = model.replay([(1, 0)])
    post = model.latent_posterior(state)
    cands = [0, 2, 3]
    got = get_criterion("posterior_entropy").score(model, state, cands, [])
    for ci, x in enumerate(cands):
        want = entropy_of(post.tolist())
        for k in range(model.item_bank.n_options[x]):
            joint = post * model.mu[:, x, k]
            pk = float(joint.sum())
            want -= pk * entropy_of((joint / pk).tolist())
        assert float(got[ci]) == pytest.approx(want, rel=1e-9)


def test_random_is_reproducible_and_covers_items() -> None:
    model = informative_mixture()
    state = model.initial_state()
    a, b, c = (get_criterion("random", seed=s) for s in (5, 5, 6))
    sa = [a.score(model, state, CANDIDATES, [4]) for _ in range(3)]
    sb = [b.score(model, state, CANDIDATES, [4]) for _ in range(3)]
    sc = [c.score(model, state, CANDIDATES, [4]) for _ in range(3)]
    for x, y in zip(sa, sb, strict=True):
        assert torch.equal(x, y)
    assert not all(torch.equal(x, y) for x, y in zip(sa, sc, strict=True))
    counts = [0] * 4
    for _ in range(400):
        counts[best_index(a.score(model, state, CANDIDATES, [4]))] += 1
    assert min(counts) > 60, counts  # uniform: 100 expected per item
    batch = model.initial_batch(torch.full((500, 5), -1, dtype=torch.long))
    picks = get_criterion("random", seed=1).score_batch(model, batch, CANDIDATES, [4]).argmax(1)
    assert torch.bincount(picks, minlength=4).min() > 80


def _two_bit_mixture() -> PersonaMixture:
    """Personas = two independent bits (u1, u2); targets t1 = u1, t2 = u2.

    Items: A (0) reveals u1 exactly-ish, B (1) is a slightly noisier copy of A,
    C (2) reveals u2 with more noise. Greedy under the prior, *conditioned on earlier
    picks*, asks A then C (B adds almost nothing once A is known); ranking items by their
    unconditional gain would ask A then B.
    """
    bank = ItemBank(("A", "B", "C", "t1", "t2"), (2, 2, 2, 2, 2))
    mu = torch.zeros(4, 5, 2, dtype=DTYPE)
    bits = [(0, 0), (0, 1), (1, 0), (1, 1)]
    for th, (u1, u2) in enumerate(bits):
        for item, bit, acc in (
            (0, u1, 0.99),
            (1, u1, 0.97),
            (2, u2, 0.85),
            (3, u1, 0.99),
            (4, u2, 0.99),
        ):
            mu[th, item, bit] = acc
            mu[th, item, 1 - bit] = 1 - acc
    return PersonaMixture(bank, mu)


def _brute_expected_entropy(model: PersonaMixture, chosen: list[int], targets: list[int]) -> float:
    """E over answers to ``chosen`` of the mean target entropy, by enumeration."""
    total = 0.0
    for ys in itertools.product(*(range(model.item_bank.n_options[i]) for i in chosen)):
        state = model.initial_state()
        p_seq = 1.0
        for item, y in zip(chosen, ys, strict=True):
            p_seq *= float(model.predict(state, [item])[0, y])
            state = model.update(state, item, y)
        total += p_seq * float(entropy(model.predict(state, targets)).mean())
    return total


def test_fixed_order_conditions_on_earlier_picks() -> None:
    model = _two_bit_mixture()
    targets = [3, 4]
    crit = FixedOrder()
    crit.prepare(model, [1, 2, 0], targets)
    assert crit.order[:2] == [0, 2]
    assert crit.explain()["expectation"][:2] == ["exact", "exact"]
    # the exact expectations agree with brute force: the second pick minimises it
    e = {x: _brute_expected_entropy(model, [0, x], targets) for x in (1, 2)}
    assert e[2] < e[1]
    # the order ignores the state and scores earlier = higher
    s = crit.score(model, model.replay([(2, 1)]), [1, 2, 0], targets)
    assert best_index(s) == 2 and float(s[1]) > float(s[0])


def test_fixed_order_simulated_respondents_agree() -> None:
    model = _two_bit_mixture()
    crit = FixedOrder(max_enumeration=1, n_simulated=2000, seed=3)
    crit.prepare(model, [1, 2, 0], [3, 4])
    assert crit.order[:2] == [0, 2]
    assert crit.explain()["expectation"][1].startswith("simulated")


def test_fixed_order_recomputes_for_a_new_pool_only() -> None:
    model = _two_bit_mixture()
    crit = FixedOrder()
    crit.prepare(model, [0, 1, 2], [3, 4])
    first = crit.order
    crit.score(model, model.initial_state(), [1, 2], [3, 4])  # a subset: same cached order
    assert crit.order == first
    crit.score(model, model.initial_state(), [1, 2], [0, 4])  # other targets: recomputed
    assert set(crit.order) == {1, 2}


def test_registry_and_errors() -> None:
    assert {"eig", "eig2", "posterior_entropy", "random", "fixed", "irt"} <= set(criterion_names())
    with pytest.raises(UnknownCriterionError, match="unknown selection criterion 'nope'.*eig"):
        get_criterion("nope")
    with pytest.raises(ElicitationError, match="random"):
        get_criterion("random", sed=1)
    model = informative_mixture()
    with pytest.raises(CriterionNotApplicableError, match="target"):
        get_criterion("eig").score(model, model.initial_state(), [0], [])
    with pytest.raises(CriterionNotApplicableError, match="theta_posterior"):
        get_criterion("irt").score(model, model.initial_state(), [0], [4])
    explained = get_criterion("random", seed=4).explain()
    assert explained["name"] == "random" and explained["params"] == {"seed": 4}


def _grm(slopes: list[float]) -> GradedResponseModel:
    n = len(slopes)
    bank = ItemBank(tuple(f"i{j}" for j in range(n)), (3,) * n)
    intercepts = torch.tensor([[-0.5, 0.7]] * n, dtype=DTYPE)
    return GradedResponseModel(bank, torch.tensor(slopes, dtype=DTYPE), intercepts, n_points=31)


def test_irt_picks_the_most_discriminating_item() -> None:
    model = _grm([0.0, 0.05, 3.0, 0.0, 0.3])
    cands = [3, 1, 2, 0, 4]
    crit = get_criterion("irt")
    s = crit.score(model, model.initial_state(), cands, [])
    assert cands[best_index(s)] == 2
    batch = model.initial_batch(torch.full((4, 5), -1, dtype=torch.long))
    assert (crit.score_batch(model, batch, cands, []).argmax(1) == 2).all()


def test_irt_score_equals_enumeration() -> None:
    model = _grm([0.4, 1.2, 2.0, 0.8])
    state = model.replay([(0, 2)])
    cands = [1, 2, 3]
    got = get_criterion("irt").score(model, state, cands, [])
    grid, w = model.theta_posterior(state)

    def var(weights: torch.Tensor) -> float:
        m = float(weights @ grid)
        return float(weights @ (grid - m) ** 2)

    for ci, x in enumerate(cands):
        p_x = model.predict(state, [x])[0]
        after = sum(
            float(p_x[k]) * var(model.theta_posterior(model.update(state, x, k))[1])
            for k in range(3)
        )
        assert float(got[ci]) == pytest.approx(var(w) - after, rel=1e-8)


# ---- two-step lookahead (eig2) ------------------------------------------------------------
def brute_force_two_step(
    model: PersonaMixture,
    answers: list[tuple[int, int]],
    x: int,
    pool: list[int],
    targets: list[int],
) -> float:
    """``H_now - sum_k p(Y_x = k) min_{x' in pool, x' != x} E[H | answers, Y_x = k, Y_x']`` by enumeration."""
    n_opt = model.item_bank.n_options
    p_x = enumerated_joint(model, answers, [x])
    expected = 0.0
    for k in range(n_opt[x]):
        after = [*answers, (x, k)]
        best = math.inf
        for y in pool:
            if y == x:
                continue
            p_y = enumerated_joint(model, after, [y])
            e = sum(
                p_y[(j,)] * mean_target_entropy(model, [*after, (y, j)], targets)
                for j in range(n_opt[y])
            )
            best = min(best, e)
        expected += p_x[(k,)] * best
    return mean_target_entropy(model, answers, targets) - expected


@pytest.mark.parametrize("seed", [0, 1])
def test_eig2_equals_enumeration(seed: int) -> None:
    model = random_mixture((2, 3, 2, 4, 3, 2, 3), k=5, seed=seed)
    answers = [(1, 2)]
    targets = [5, 6]
    cands = [3, 0, 2, 4]
    state = model.replay(answers)
    crit = get_criterion("eig2", top_k=4, follow_k=4)
    got, gains = crit.score_with_gains(model, state, cands, targets)
    one = [brute_force_eig(model, answers, x, targets) for x in cands]
    two = [brute_force_two_step(model, answers, x, cands, targets) for x in cands]
    want = 0.5 * torch.tensor(one, dtype=DTYPE) + 0.5 * torch.tensor(two, dtype=DTYPE)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    # the one-step gains it reports are the eig scores
    assert gains is not None
    torch.testing.assert_close(gains, get_criterion("eig").score(model, state, cands, targets))
    # batched: the same respondent and another one; an already answered candidate keeps
    # its one-step value and is never a follow-up
    obs = torch.full((2, 7), -1, dtype=torch.long)
    obs[0, 1] = 2
    obs[1, 0] = 1
    got_b = crit.score_batch(model, model.initial_batch(obs), cands, targets)
    torch.testing.assert_close(got_b[0], want, rtol=1e-9, atol=1e-12)
    rest = [3, 2, 4]
    want_1 = [
        0.5 * brute_force_eig(model, [(0, 1)], x, targets)
        + 0.5 * brute_force_two_step(model, [(0, 1)], x, rest, targets)
        for x in rest
    ]
    torch.testing.assert_close(
        got_b[1, [0, 2, 3]], torch.tensor(want_1, dtype=DTYPE), rtol=1e-9, atol=1e-12
    )


def test_eig2_restricts_to_top_candidates_and_follow_ups() -> None:
    model = random_mixture((2, 3, 2, 4, 3, 2, 3), k=6, seed=4)
    answers = [(1, 0)]
    targets = [5, 6]
    cands = [3, 0, 2, 4]
    state = model.replay(answers)
    one = get_criterion("eig").score(model, state, cands, targets)
    rank = sorted(range(4), key=lambda c: -float(one[c]))
    got = get_criterion("eig2", top_k=2, follow_k=3).score(model, state, cands, targets)
    follow = [cands[c] for c in rank[:3]]
    for c in rank[:2]:
        g2 = brute_force_two_step(model, answers, cands[c], follow, targets)
        assert float(got[c]) == pytest.approx(0.5 * (float(one[c]) + g2), rel=1e-9)
    for c in rank[2:]:  # not in the top 2: the one-step gain
        assert float(got[c]) == pytest.approx(float(one[c]), rel=1e-12)
    # with top_k = 1 the pick is eig's pick
    assert best_index(get_criterion("eig2", top_k=1).score(model, state, cands, targets)) == rank[0]


def _xor_mixture(eps: float = 0.02) -> PersonaMixture:
    """Items a, b (fair coins), c (weakly tied to the target), target = a XOR b.

    Alone, a and b say nothing about the target (eig scores 0); c says a little. Asked
    together, a and b reveal the target: a two-step lookahead asks a (or b) first.
    """
    bank = ItemBank(("c", "a", "b", "target"), (2, 2, 2, 2))
    mu = torch.zeros(4, 4, 2, dtype=DTYPE)
    for theta, (a, b) in enumerate(itertools.product((0, 1), (0, 1))):
        t = a ^ b
        mu[theta, 1, a], mu[theta, 1, 1 - a] = 1 - eps, eps
        mu[theta, 2, b], mu[theta, 2, 1 - b] = 1 - eps, eps
        mu[theta, 3, t], mu[theta, 3, 1 - t] = 1 - eps, eps
        mu[theta, 0, t], mu[theta, 0, 1 - t] = 0.7, 0.3
    return PersonaMixture(bank, mu)


def test_eig2_looks_past_the_myopic_choice() -> None:
    model = _xor_mixture()
    state = model.initial_state()
    cands, targets = [0, 1, 2], [3]
    one = get_criterion("eig").score(model, state, cands, targets)
    assert best_index(one) == 0  # myopic: c
    torch.testing.assert_close(one[1:], torch.zeros(2, dtype=DTYPE), atol=1e-12, rtol=0)
    two = get_criterion("eig2").score(model, state, cands, targets)
    assert best_index(two) == 1  # a, then b reveals the target
    assert float(two[1]) > float(two[0]) + 0.1
    batch = model.initial_batch(torch.full((2, 4), -1, dtype=torch.long))
    assert get_criterion("eig2").score_batch(model, batch, cands, targets).argmax(1).tolist() == [
        1,
        1,
    ]


def test_eig2_errors_and_edge_cases() -> None:
    with pytest.raises(ElicitationError, match="follow_k"):
        get_criterion("eig2", follow_k=1)
    model = informative_mixture()
    with pytest.raises(CriterionNotApplicableError, match="target"):
        get_criterion("eig2").score(model, model.initial_state(), [0], [])
    # one candidate left: no follow-up, its score is the one-step gain
    state = model.initial_state()
    only = get_criterion("eig2").score(model, state, [0], [4])
    torch.testing.assert_close(only, get_criterion("eig").score(model, state, [0], [4]))
