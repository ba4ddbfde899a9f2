"""Graded response model: exact probabilities, θ posterior, EPV, information, MML recovery."""

from __future__ import annotations

import math

import pytest
import torch

from models import DTYPE, ItemBank, ModelError, ShapeError, load_model
from models.irt import GradedResponseModel, fit_grm, grm_log_probs, normal_grid

N_OPT = (2, 3, 4, 5, 3, 2, 4, 5, 3, 4)


def params(seed: int) -> tuple[ItemBank, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    bank = ItemBank(tuple(f"q{i}" for i in range(len(N_OPT))), N_OPT)
    a = torch.rand(len(N_OPT), generator=gen, dtype=DTYPE) * 1.5 + 0.5
    a[3] = -a[3]  # an item running against the trait
    c = torch.zeros(len(N_OPT), 4, dtype=DTYPE)
    for i, o in enumerate(N_OPT):
        c[i, : o - 1] = torch.sort(torch.randn(o - 1, generator=gen, dtype=DTYPE) * 1.2).values
    return bank, a, c


def direct_prob(a: float, c: list[float], theta: float, k: int) -> float:
    """P(Y = k | θ) from the definition, with plain floats."""

    def above(j: int) -> float:
        if j == 0:
            return 1.0
        if j > len(c):
            return 0.0
        return 1.0 / (1.0 + math.exp(-(a * theta - c[j - 1])))

    return above(k) - above(k + 1)


def test_category_probabilities_equal_the_definition_and_sum_to_one() -> None:
    bank, a, c = params(0)
    grid = torch.tensor([-3.0, -0.7, 0.0, 1.3, 4.0], dtype=DTYPE)
    p = grm_log_probs(a, c, grid, bank).exp()
    for i, o in enumerate(N_OPT):
        for q, th in enumerate(grid.tolist()):
            for k in range(o):
                want = direct_prob(float(a[i]), c[i, : o - 1].tolist(), th, k)
                assert math.isclose(float(p[i, k, q]), want, rel_tol=1e-9, abs_tol=1e-15)
            assert float(p[i, o:, q].sum()) == 0.0
    torch.testing.assert_close(p.sum(1), torch.ones(len(N_OPT), 5, dtype=DTYPE))
    m = GradedResponseModel(bank, a, c)
    pred = m.predict(m.replay([(0, 1), (3, 4)]))
    torch.testing.assert_close(pred.sum(-1), torch.ones(len(N_OPT), dtype=DTYPE))


def test_theta_posterior_equals_direct_computation() -> None:
    bank, a, c = params(1)
    m = GradedResponseModel(bank, a, c, n_points=41, grid_max=4.0)
    answers = [(2, 3), (3, 0), (7, 2), (0, 1)]
    grid, w = m.theta_posterior(m.replay(answers, {9: 2}))
    assert grid.shape == (41,)
    want = []
    for th in grid.tolist():
        p = math.exp(-0.5 * th * th)
        for i, k in [*answers, (9, 2)]:
            p *= direct_prob(float(a[i]), c[i, : N_OPT[i] - 1].tolist(), th, k)
        want.append(p)
    total = sum(want)
    torch.testing.assert_close(w, torch.tensor([v / total for v in want], dtype=DTYPE))
    mean, var = m.theta_mean_var(m.replay(answers, {9: 2}))
    assert math.isclose(mean, float((w * grid).sum()), rel_tol=1e-12)
    # the prior is the normal density on the grid
    g2, lw = normal_grid(41, 4.0)
    torch.testing.assert_close(m.theta_posterior(m.initial_state())[1], lw.exp())


def test_expected_posterior_variance_equals_updating_each_answer() -> None:
    bank, a, c = params(2)
    m = GradedResponseModel(bank, a, c)
    state = m.replay([(1, 2), (4, 0)])
    cands = [0, 2, 3, 5, 9]
    epv = m.expected_posterior_variance(state, cands)
    p_x = m.predict(state, cands)
    for ci, x in enumerate(cands):
        want = sum(
            float(p_x[ci, k]) * m.theta_mean_var(m.update(state, x, k))[1] for k in range(N_OPT[x])
        )
        assert math.isclose(float(epv[ci]), want, rel_tol=1e-10)
    # a posterior variance cannot grow in expectation
    assert bool((epv <= m.theta_mean_var(state)[1] + 1e-12).all())
    batch = m.initial_batch(torch.tensor([[-1, 2, -1, -1, 0, -1, -1, -1, -1, -1]] * 2))
    torch.testing.assert_close(m.expected_posterior_variance_batch(batch, cands)[1], epv)
    torch.testing.assert_close(m.theta_posterior_batch(batch)[1][0], m.theta_posterior(state)[1])


def test_fisher_information_equals_numerical_derivative() -> None:
    bank, a, c = params(3)
    m = GradedResponseModel(bank, a, c)
    theta, h = 0.4, 1e-5
    info = m.item_information(theta)[0]
    for i, o in enumerate(N_OPT):
        ai, ci = float(a[i]), c[i, : o - 1].tolist()
        want = 0.0
        for k in range(o):
            p = direct_prob(ai, ci, theta, k)
            dp = (direct_prob(ai, ci, theta + h, k) - direct_prob(ai, ci, theta - h, k)) / (2 * h)
            want += dp * dp / p
        assert math.isclose(float(info[i]), want, rel_tol=1e-6)
    s = m.replay([(0, 1)])
    mean, _ = m.theta_mean_var(s)
    torch.testing.assert_close(
        m.information_at_posterior_mean(s, [2, 5]), m.item_information(mean, [2, 5])[0]
    )


def simulate(bank: ItemBank, a: torch.Tensor, c: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(n, generator=gen, dtype=DTYPE)
    p = grm_log_probs(a, c, theta, bank).exp()  # [I, O, N]
    y = torch.stack(
        [
            torch.multinomial(p[i, :o].T, 1, generator=gen)[:, 0]
            for i, o in enumerate(bank.n_options)
        ],
        1,
    )
    y[torch.rand(y.shape, generator=gen) < 0.1] = -1
    return y


def test_mml_recovers_item_parameters_and_never_changes_them_online() -> None:
    bank, a, c = params(4)
    y = simulate(bank, a, c, 2500, 5)
    m = fit_grm(y, bank, val_responses=simulate(bank, a, c, 300, 6))
    trace = m.metrics["train_trace"]
    assert all(b >= x - 1e-10 for x, b in zip(trace, trace[1:], strict=False))
    assert float(torch.corrcoef(torch.stack([m.slopes, a]))[0, 1]) > 0.9
    mask = torch.tensor([[j < o - 1 for j in range(4)] for o in N_OPT])
    assert float(torch.corrcoef(torch.stack([m.intercepts[mask], c[mask]]))[0, 1]) > 0.9
    assert float((m.slopes - a).abs().max()) < 0.5
    # the fitted model explains held-out data about as well as the true one
    true = GradedResponseModel(bank, a, c)
    val = simulate(bank, a, c, 300, 6)
    assert m.metrics["val_log_lik"] > float(true.log_marginal(val).mean()) - 0.05
    before = (m.slopes.clone(), m.intercepts.clone(), m.mu.clone())
    s = m.replay([(0, 1), (1, 2)])
    m.lookahead(s, [2, 3], [4])
    m.expected_posterior_variance(s, [2, 3])
    assert torch.equal(before[0], m.slopes) and torch.equal(before[1], m.intercepts)
    assert torch.equal(before[2], m.mu)
    m2 = load_model(m.to_bytes())
    assert isinstance(m2, GradedResponseModel) and m2.family == "irt_grm"
    torch.testing.assert_close(m2.predict(m2.replay([(0, 1)])), m.predict(m.replay([(0, 1)])))


def test_bad_parameters_are_rejected() -> None:
    bank, a, c = params(0)
    with pytest.raises(ShapeError, match="slopes"):
        GradedResponseModel(bank, a[:3], c)
    with pytest.raises(ShapeError, match="intercepts"):
        GradedResponseModel(bank, a, c[:, :2])
    bad = c.clone()
    bad[2, 1] = bad[2, 0] - 0.1
    with pytest.raises(ModelError, match="'q2'"):
        GradedResponseModel(bank, a, bad)
