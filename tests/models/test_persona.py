"""PersonaMixture: exact answers by brute-force enumeration on small random cases."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from models import (
    DTYPE,
    InvalidDistributionError,
    InvalidOptionError,
    ItemBank,
    ModelError,
    PersonaMixture,
    ShapeError,
    UnknownItemError,
    load_model,
)
from models.persona import PersonaState


def random_mixture(n_options: tuple[int, ...], k: int, seed: int) -> PersonaMixture:
    gen = torch.Generator().manual_seed(seed)
    bank = ItemBank(tuple(f"q{i}" for i in range(len(n_options))), n_options)
    mu = torch.zeros(k, len(n_options), max(n_options), dtype=DTYPE)
    for i, o in enumerate(n_options):
        g = torch.rand(k, o, generator=gen, dtype=DTYPE) + 0.05
        mu[:, i, :o] = g / g.sum(-1, keepdim=True)
    return PersonaMixture(bank, mu, torch.randn(k, generator=gen, dtype=DTYPE))


def brute_joint(m: PersonaMixture) -> dict[tuple[int, ...], float]:
    """p(y) for every full answer vector y, by enumeration over θ and y."""
    prior = m.log_prior.exp().tolist()
    mu = m.mu.tolist()
    out = {}
    for y in itertools.product(*(range(o) for o in m.item_bank.n_options)):
        p = 0.0
        for t in range(m.n_personas):
            term = prior[t]
            for i, yi in enumerate(y):
                term *= mu[t][i][yi]
            p += term
        out[y] = p
    return out


def brute_predictive(m: PersonaMixture, answers: dict[int, int], item: int) -> list[float]:
    joint = brute_joint(m)
    num = [0.0] * m.item_bank.max_options
    z = 0.0
    for y, p in joint.items():
        if all(y[i] == o for i, o in answers.items()):
            num[y[item]] += p
            z += p
    return [v / z for v in num]


def brute_posterior(m: PersonaMixture, answers: dict[int, int]) -> list[float]:
    prior = m.log_prior.exp()
    w = []
    for t in range(m.n_personas):
        p = float(prior[t])
        for i, o in answers.items():
            p *= float(m.mu[t, i, o])
        w.append(p)
    s = sum(w)
    return [v / s for v in w]


N_OPT = (2, 3, 3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_posterior_and_predictive_equal_enumeration(seed: int) -> None:
    m = random_mixture(N_OPT, 4, seed)
    gen = torch.Generator().manual_seed(100 + seed)
    for n_ans in range(3):
        items = torch.randperm(3, generator=gen)[:n_ans].tolist()
        answers = {i: int(torch.randint(N_OPT[i], (1,), generator=gen)) for i in items}
        state = m.initial_state()
        for i, o in answers.items():
            state = m.update(state, i, o)
        torch.testing.assert_close(
            m.latent_posterior(state), torch.tensor(brute_posterior(m, answers), dtype=DTYPE)
        )
        assert math.isclose(float(torch.logsumexp(state.log_post, 0)), 0.0, abs_tol=1e-12)
        pred = m.predict(state)
        for x in set(range(3)) - set(answers):  # a fresh answer to an unasked item
            torch.testing.assert_close(
                pred[x], torch.tensor(brute_predictive(m, answers, x), dtype=DTYPE)
            )
        # zeros beyond an item's own options, rows sum to 1
        assert float(pred[0, 2]) == 0.0
        torch.testing.assert_close(pred.sum(-1), torch.ones(3, dtype=DTYPE))


@pytest.mark.parametrize("seed", [0, 3])
def test_lookahead_equals_update_for_each_outcome(seed: int) -> None:
    m = random_mixture((2, 3, 4, 3, 2), 6, seed)
    state = m.initial_state({4: 1})
    for cands in ([0, 1, 2, 3], [2]):  # all-items path and gathered path
        targets = [3, 1]
        p_x, p_t = m.lookahead(state, cands, targets)
        assert p_x.shape == (len(cands), 4) and p_t.shape == (len(cands), 4, 2, 4)
        torch.testing.assert_close(p_x, m.predict(state, cands))
        for ci, x in enumerate(cands):
            for k in range(4):
                if k < m.item_bank.n_options[x]:
                    want = m.predict(m.update(state, x, k), targets)
                else:
                    want = m.predict(state, targets)
                    assert float(p_x[ci, k]) == 0.0
                torch.testing.assert_close(p_t[ci, k], want)


def deterministic_mixture(k: int = 24, seed: int = 0, eps: float = 0.1) -> PersonaMixture:
    """Personas with repeated target answers, so that the grouped lookahead is used."""
    gen = torch.Generator().manual_seed(seed)
    bank = ItemBank(tuple(f"q{i}" for i in range(6)), (3, 3, 2, 4, 2, 2))
    ans = torch.stack([torch.randint(o, (k,), generator=gen) for o in bank.n_options], 1)
    return PersonaMixture.from_deterministic(
        ans, bank, eps, torch.randn(k, generator=gen, dtype=DTYPE)
    )


def test_grouped_lookahead_equals_update() -> None:
    m = deterministic_mixture()
    targets = [4, 5]  # at most 4 distinct target rows among 24 personas → grouped path
    grp = m._target_groups(torch.tensor(targets))
    assert grp.order is not None
    state = m.update(m.initial_state({0: 2}), 1, 0)
    for cands in ([2, 3, 4, 5], [3]):  # all-items path and gathered path
        p_x, p_t = m.lookahead(state, cands, targets)
        torch.testing.assert_close(p_x, m.predict(state, cands))
        for ci, x in enumerate(cands):
            for k in range(m.item_bank.n_options[x]):
                want = m.predict(m.update(state, x, k), targets)
                torch.testing.assert_close(p_t[ci, k], want)


def test_from_deterministic_tables() -> None:
    bank = ItemBank(("a", "b", "c"), (2, 4, 1))
    m = PersonaMixture.from_deterministic(torch.tensor([[1, 3, 0], [0, -1, 0]]), bank, 0.3)
    torch.testing.assert_close(m.mu[0, 0], torch.tensor([0.3, 0.7, 0, 0], dtype=DTYPE))
    torch.testing.assert_close(m.mu[0, 1], torch.tensor([0.1, 0.1, 0.1, 0.7], dtype=DTYPE))
    torch.testing.assert_close(m.mu[1, 1], torch.full((4,), 0.25, dtype=DTYPE))
    torch.testing.assert_close(m.mu[1, 2], torch.tensor([1.0, 0, 0, 0], dtype=DTYPE))
    with pytest.raises(InvalidOptionError, match="responses\\[0, 0\\]"):
        PersonaMixture.from_deterministic(torch.tensor([[2, 0, 0]]), bank, 0.1)


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_forms_equal_single_forms(seed: int) -> None:
    m = random_mixture((2, 3, 4, 3, 2), 5, seed)
    observed = torch.tensor([[1, -1, -1, -1, 0], [-1, -1, -1, -1, -1], [0, 2, -1, -1, 1]])
    bstate = m.initial_batch(observed)
    singles = [
        m.initial_state({i: int(o) for i, o in enumerate(row.tolist()) if o >= 0})
        for row in observed
    ]
    items = torch.tensor([2, 3, 3])
    options = torch.tensor([3, -1, 0])  # respondent 1 skips
    bstate2 = m.update_batch(bstate, items, options)
    singles2 = [
        m.update(s, int(i), int(o)) if o >= 0 else s
        for s, i, o in zip(singles, items, options, strict=True)
    ]
    torch.testing.assert_close(bstate2.log_post[1], bstate.log_post[1], rtol=0, atol=0)
    assert bstate2.responses[1].tolist() == observed[1].tolist()
    assert bstate2.responses[2, 3] == 0 and bstate2.responses[0, 2] == 3
    cands, targets = [1, 2, 3], [0, 4]
    p_xb, p_tb = m.lookahead_batch(bstate2, cands, targets)
    predb = m.predict_batch(bstate2, [0, 1, 2, 3, 4])
    latent = m.latent_posterior_batch(bstate2)
    for b, s in enumerate(singles2):
        torch.testing.assert_close(bstate2.log_post[b], s.log_post)
        torch.testing.assert_close(predb[b], m.predict(s))
        torch.testing.assert_close(latent[b], m.latent_posterior(s))
        p_x, p_t = m.lookahead(s, cands, targets)
        torch.testing.assert_close(p_xb[b], p_x)
        torch.testing.assert_close(p_tb[b], p_t)


def test_batched_grouped_lookahead_equals_single() -> None:
    m = deterministic_mixture(k=30, seed=4)
    observed = torch.full((7, 6), -1, dtype=torch.long)
    observed[:, 0] = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    observed[3:, 1] = torch.tensor([2, 1, 0, 0])
    st = m.initial_batch(observed)
    p_xb, p_tb = m.lookahead_batch(st, [2, 3], [4, 5])
    for b in range(7):
        s = m.initial_state({i: int(o) for i, o in enumerate(observed[b].tolist()) if o >= 0})
        p_x, p_t = m.lookahead(s, [2, 3], [4, 5])
        torch.testing.assert_close(p_xb[b], p_x)
        torch.testing.assert_close(p_tb[b], p_t)


def test_replay_equals_incremental_and_parameters_unchanged() -> None:
    m = random_mixture((3, 3, 2, 4), 7, 5)
    before = {k: v.clone() for k, v in m.state_dict().items() if isinstance(v, torch.Tensor)}
    answers = [(3, 2), (0, 1), (2, 0)]
    s = m.initial_state({1: 2})
    for i, o in answers:
        s = m.update(s, i, o)
    r = m.replay(answers, {1: 2})
    torch.testing.assert_close(r.log_post, s.log_post, rtol=0, atol=1e-15)
    assert r.observed == s.observed == ((1, 2), (3, 2), (0, 1), (2, 0))
    for k, v in m.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, before[k]), k


def test_impossible_answer_gives_finite_normalised_posterior() -> None:
    bank = ItemBank(("a", "b"), (3, 2))
    mu = torch.zeros(3, 2, 3, dtype=DTYPE)
    mu[:, 0, :2] = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]], dtype=DTYPE)  # option 2: 0
    mu[:, 1, :2] = torch.tensor([[0.3, 0.7], [0.6, 0.4], [0.5, 0.5]], dtype=DTYPE)
    m = PersonaMixture(bank, mu)
    s = m.update(m.initial_state(), 0, 2)
    post = m.latent_posterior(s)
    assert bool(torch.isfinite(s.log_post).all())
    assert math.isclose(float(post.sum()), 1.0, abs_tol=1e-12)
    # every persona had the same (floored) likelihood: the posterior is the prior
    torch.testing.assert_close(post, m.log_prior.exp())
    p_x, p_t = m.lookahead(m.initial_state(), [0], [1])
    assert bool(torch.isfinite(p_t).all())
    torch.testing.assert_close(p_t[0, 2], m.predict(s, [1]))
    bs = m.update_batch(
        m.initial_batch(torch.full((1, 2), -1)), torch.tensor([0]), torch.tensor([2])
    )
    torch.testing.assert_close(bs.log_post[0], s.log_post)


def test_clear_errors() -> None:
    m = random_mixture((2, 3), 3, 0)
    bank = m.item_bank
    with pytest.raises(ShapeError, match=r"\[K, 2, 3\]"):
        PersonaMixture(bank, torch.full((3, 3, 3), 1 / 3, dtype=DTYPE))
    bad = m.mu.clone()
    bad[1, 1, 0] += 0.2
    with pytest.raises(InvalidDistributionError, match="persona 1, item 'q1'"):
        PersonaMixture(bank, bad)
    bad = m.mu.clone()
    bad[0, 0, 2] = 0.1
    with pytest.raises(InvalidDistributionError, match="option 2 of item 'q0'"):
        PersonaMixture(bank, bad)
    with pytest.raises(ShapeError, match="log_prior"):
        PersonaMixture(bank, m.mu, torch.zeros(4, dtype=DTYPE))
    s = m.initial_state()
    with pytest.raises(UnknownItemError, match="unknown item index 5"):
        m.update(s, 5, 0)
    with pytest.raises(InvalidOptionError, match="option 2 is out of range for item 'q0'"):
        m.update(s, 0, 2)
    with pytest.raises(UnknownItemError):
        m.predict(s, [0, 2])
    with pytest.raises(UnknownItemError):
        m.lookahead(s, [7], [0])
    with pytest.raises(InvalidOptionError):
        m.initial_state({0: 3})
    with pytest.raises(ModelError, match="already observed"):
        m.update(m.update(s, 0, 1), 0, 0)
    b = m.initial_batch(torch.tensor([[-1, 1], [0, -1]]))
    with pytest.raises(ShapeError):
        m.initial_batch(torch.tensor([[0, 1, 1]]))
    with pytest.raises(InvalidOptionError, match=r"options\[1\] = 2"):
        m.update_batch(b, torch.tensor([0, 0]), torch.tensor([1, 2]))
    with pytest.raises(UnknownItemError, match=r"items\[0\]"):
        m.update_batch(b, torch.tensor([3, 0]), torch.tensor([1, 0]))
    with pytest.raises(ShapeError):
        m.update_batch(b, torch.tensor([0]), torch.tensor([1]))
    with pytest.raises(ModelError, match="respondent 1 already has an answer"):
        m.update_batch(b, torch.tensor([0, 0]), torch.tensor([1, 1]))
    with pytest.raises(ShapeError):
        m.predict(PersonaState(torch.zeros(5, dtype=DTYPE)), [0])


def test_serialisation_round_trip() -> None:
    m = deterministic_mixture()
    m.metrics = {"val_ll": -1.5}
    m.training_hash = "abc"
    m2 = load_model(m.to_bytes())
    assert isinstance(m2, PersonaMixture)
    assert m2.metrics == {"val_ll": -1.5} and m2.training_hash == "abc"
    s, s2 = m.replay([(0, 1), (3, 2)]), m2.replay([(0, 1), (3, 2)])
    torch.testing.assert_close(m2.predict(s2), m.predict(s))
    torch.testing.assert_close(m2.log_prior, m.log_prior)
    with pytest.raises(ModelError, match="cannot read"):
        load_model(b"not a model")


@pytest.mark.parametrize("grouped", [True, False])
def test_batched_lookahead_in_several_chunks(
    monkeypatch: pytest.MonkeyPatch, grouped: bool
) -> None:
    """Chunking over respondents (to bound memory) does not change the result."""
    import models.persona as persona

    m = deterministic_mixture(k=30, seed=5) if grouped else random_mixture((2, 3, 4, 3, 2, 2), 9, 6)
    gen = torch.Generator().manual_seed(11)
    observed = torch.full((9, 6), -1, dtype=torch.long)
    observed[:, 0] = torch.randint(2, (9,), generator=gen)
    st = m.initial_batch(observed)
    cands, targets = [1, 2, 3], [4, 5]
    whole = m.lookahead_batch(st, cands, targets)
    monkeypatch.setattr(persona, "_CHUNK_ELEMS", 1)  # one respondent per chunk
    parts = m.lookahead_batch(st, cands, targets)
    torch.testing.assert_close(parts[0], whole[0], rtol=0, atol=1e-15)
    torch.testing.assert_close(parts[1], whole[1], rtol=1e-13, atol=1e-15)
    for b in (0, 8):
        s = m.initial_state({0: int(observed[b, 0])})
        p_x, p_t = m.lookahead(s, cands, targets)
        torch.testing.assert_close(parts[0][b], p_x)
        torch.testing.assert_close(parts[1][b], p_t)


def test_to_batch_and_branch_batch_equal_single_updates() -> None:
    m = random_mixture((2, 3, 4, 2), k=5, seed=11)
    state = m.update(m.initial_state({0: 1}), 2, 3)
    one = m.to_batch(state)
    assert one.batch_size == 1
    torch.testing.assert_close(one.log_post[0], state.log_post, rtol=0, atol=0)
    assert one.responses.tolist() == [[1, -1, 3, -1]]
    # rows 0, 0, 0 of the batch branch on item 1 (each option), row 0 of a 2-row batch
    batch = m.initial_batch(torch.tensor([[1, -1, 3, -1], [0, 2, -1, -1]]))
    br = m.branch_batch(
        batch, torch.tensor([0, 0, 0, 1]), torch.tensor([1, 1, 1, 3]), torch.tensor([0, 1, 2, -1])
    )
    for r, k in enumerate(range(3)):
        torch.testing.assert_close(br.log_post[r], m.update(state, 1, k).log_post)
        assert br.responses[r].tolist() == [1, k, 3, -1]
    torch.testing.assert_close(br.log_post[3], batch.log_post[1], rtol=0, atol=0)  # -1: no update
    with pytest.raises(ModelError, match="already has an answer"):
        m.branch_batch(batch, torch.tensor([0]), torch.tensor([2]), torch.tensor([0]))


def _enumerated_target_entropies(
    m: PersonaMixture, state: PersonaState, cands: list[int], targets: list[int]
) -> tuple[float, list[float]]:
    """``(H_now, E[c])`` by updating the state with every answer of every candidate."""

    def mean_h(p: torch.Tensor) -> float:
        return float(-torch.special.xlogy(p, p).sum(-1).mean())

    now = mean_h(m.predict(state, targets))
    p_x = m.predict(state, cands)
    expected = []
    for ci, x in enumerate(cands):
        e = 0.0
        for k in range(m.item_bank.n_options[x]):
            e += float(p_x[ci, k]) * mean_h(m.predict(m.update(state, x, k), targets))
        expected.append(e)
    return now, expected


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_target_entropy_lookahead_equals_enumeration(seed: int) -> None:
    # Mixed option counts (2..6): the padded lookahead carries 6 x 6 blocks per pair.
    m = random_mixture((2, 6, 3, 2, 4, 2), 9, seed)
    assert m._target_groups(torch.tensor([3, 5])).order is None  # the compact path
    state = m.update(m.initial_state({1: 4}), 2, 1)
    for cands, targets in (([0, 4], [3, 5]), ([4, 0], [5]), ([0], [3, 4, 5])):
        now, expected = m.target_entropy_lookahead(state, cands, targets)
        want_now, want = _enumerated_target_entropies(m, state, cands, targets)
        assert expected.shape == (len(cands),)
        assert float(now) == pytest.approx(want_now, rel=1e-12, abs=1e-14)
        assert expected.tolist() == pytest.approx(want, rel=1e-12, abs=1e-14)


def test_target_entropy_lookahead_with_active_floor_and_grouped_targets() -> None:
    # A zero probability below the floor: updates use max(mu, floor), p_x uses mu itself.
    bank = ItemBank(("a", "b", "c"), (3, 2, 2))
    mu = torch.zeros(3, 3, 3, dtype=DTYPE)
    mu[:, 0, :3] = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5], [0.6, 0.4, 0.0]], dtype=DTYPE)
    mu[:, 1, :2] = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.5, 0.5]], dtype=DTYPE)
    mu[:, 2, :2] = torch.tensor([[0.2, 0.8], [0.6, 0.4], [0.7, 0.3]], dtype=DTYPE)
    m = PersonaMixture(bank, mu, torch.tensor([0.1, -0.4, 0.3], dtype=DTYPE), floor=0.01)
    assert m._floor_active
    state = m.initial_state()
    now, expected = m.target_entropy_lookahead(state, [0, 1], [2])
    want_now, want = _enumerated_target_entropies(m, state, [0, 1], [2])
    assert float(now) == pytest.approx(want_now, rel=1e-12)
    assert expected.tolist() == pytest.approx(want, rel=1e-12)
    # Personas sharing their target rows: the grouped lookahead serves, same numbers.
    g = deterministic_mixture()
    assert g._target_groups(torch.tensor([4, 5])).order is not None
    gs = g.update(g.initial_state({0: 2}), 1, 0)
    now, expected = g.target_entropy_lookahead(gs, [2, 3], [4, 5])
    want_now, want = _enumerated_target_entropies(g, gs, [2, 3], [4, 5])
    assert float(now) == pytest.approx(want_now, rel=1e-12)
    assert expected.tolist() == pytest.approx(want, rel=1e-12)
    # No candidates left: only the current entropy.
    now, expected = m.target_entropy_lookahead(state, [], [2])
    want_now, _ = _enumerated_target_entropies(m, state, [0], [2])
    assert expected.shape == (0,) and float(now) == pytest.approx(want_now, rel=1e-12)
    with pytest.raises(ModelError, match="at least one target"):
        m.target_entropy_lookahead(state, [0], [])
