"""Empirical-Bayes persona prior (EM) and persona compression."""

from __future__ import annotations

import math

import pytest
import torch

from models import DTYPE, ItemBank, ModelError, PersonaMixture, compress, fit_prior_em
from models.persona_fit import js_distance_matrix


def dictionary(k: int, seed: int, n_opt: tuple[int, ...] = (2, 3, 4, 3, 2, 3)) -> PersonaMixture:
    gen = torch.Generator().manual_seed(seed)
    bank = ItemBank(tuple(f"q{i}" for i in range(len(n_opt))), n_opt)
    mu = torch.zeros(k, len(n_opt), max(n_opt), dtype=DTYPE)
    for i, o in enumerate(n_opt):
        g = torch.rand(k, o, generator=gen, dtype=DTYPE) ** 3 + 0.02
        mu[:, i, :o] = g / g.sum(-1, keepdim=True)
    return PersonaMixture(bank, mu)


def sample(m: PersonaMixture, prior: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    z = torch.multinomial(prior, n, replacement=True, generator=gen)
    cols = [
        torch.multinomial(m.mu[z, i, :o], 1, generator=gen)[:, 0]
        for i, o in enumerate(m.item_bank.n_options)
    ]
    return torch.stack(cols, 1)


def test_prior_em_increases_likelihood_and_reaches_fixed_point() -> None:
    m = dictionary(6, 0)
    true = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0, 0.0], dtype=DTYPE)
    y = sample(m, true, 800, 1)
    y[:, 5] = -1  # a masked target column
    y[torch.rand(y.shape, generator=torch.Generator().manual_seed(2)) < 0.1] = -1
    log_prior, trace = fit_prior_em(m, y, max_iter=400, tol=1e-12)
    t = torch.tensor(trace, dtype=DTYPE)
    assert bool((t[1:] - t[:-1] >= -1e-13).all())
    assert trace[-1] > trace[0] + 0.01
    # the trace is the mean log marginal likelihood under each prior (direct check)
    assert math.isclose(
        trace[-1], float(m.with_prior(log_prior).log_marginal(y).mean()), rel_tol=1e-12
    )
    # fixed point of EM = stationarity of the likelihood in the simplex:
    # mean_u p(y_u | θ) / p(y_u) = 1 wherever p(θ) > 0 (and <= 1 elsewhere)
    ll = m.log_likelihood_matrix(y)
    ratio = (ll - m.with_prior(log_prior).log_marginal(y).unsqueeze(1)).exp().mean(0)
    prior = log_prior.exp()
    active = prior > 1e-3
    torch.testing.assert_close(ratio[active], torch.ones_like(ratio[active]), atol=2e-3, rtol=0)
    assert math.isclose(float(prior.sum()), 1.0, abs_tol=1e-12)
    # closer to the truth than the uniform start
    assert float((prior - true).abs().sum()) < float((1 / 6 - true).abs().sum())


def test_prior_em_with_a_tensor_and_bad_input() -> None:
    m = dictionary(3, 4)
    y = sample(m, torch.tensor([0.2, 0.3, 0.5]), 50, 5)
    lp1, _ = fit_prior_em(m, y, max_iter=50)
    lp2, _ = fit_prior_em(m.mu, y, item_bank=m.item_bank, max_iter=50)
    torch.testing.assert_close(lp1, lp2)
    with pytest.raises(ModelError, match="item_bank"):
        fit_prior_em(m.mu, y)
    with pytest.raises(ModelError):
        fit_prior_em(m, y[:, :3])


def test_prior_em_map_keeps_the_base_and_solves_its_fixed_point() -> None:
    """With ``base`` worth ``s`` respondents, 2 respondents move the weights at most
    2 / (2 + s), none drops to 0, and the result solves the MAP fixed point
    ``p = (Σ_u γ_u + s b) / (N + s)``; many respondents override the base."""
    m = dictionary(3, 7)
    base = torch.tensor([0.6, 0.3, 0.1], dtype=DTYPE)
    y = sample(m, torch.tensor([0.0, 0.0, 1.0], dtype=DTYPE), 2, 8)
    ml, _ = fit_prior_em(m, y, max_iter=2000, tol=1e-14)
    lp, trace = fit_prior_em(m, y, base=base, strength=10.0, max_iter=2000, tol=1e-14)
    p = lp.exp()
    assert float(ml.exp().min()) < 1e-6  # maximum likelihood zeroes a persona
    assert bool(((p - base).abs() <= 2 / 12 + 1e-12).all()) and float(p.min()) >= 0.1 * 10 / 12
    t = torch.tensor(trace, dtype=DTYPE)
    assert bool((t[1:] - t[:-1] >= -1e-13).all())  # the MAP objective never falls
    ll = m.log_likelihood_matrix(y) + lp
    gamma = (ll - torch.logsumexp(ll, 1, keepdim=True)).exp()
    torch.testing.assert_close(p, (gamma.sum(0) + 10 * base) / 12, atol=1e-8, rtol=0)
    # trace[0] is the objective at the base itself
    z0 = torch.logsumexp(m.log_likelihood_matrix(y) + base.log(), 1).mean()
    assert trace[0] == pytest.approx(float(z0) + float((base * base.log()).sum()) * 10 / 2)
    many = sample(m, torch.tensor([0.0, 0.0, 1.0], dtype=DTYPE), 3000, 9)
    lp_many, _ = fit_prior_em(m, many, base=base, strength=10.0)
    assert float(lp_many.exp()[2]) > 0.9
    with pytest.raises(ModelError, match="strength"):
        fit_prior_em(m, y, strength=-1.0)
    with pytest.raises(ModelError, match="base"):
        fit_prior_em(m, y, base=torch.tensor([1.0, 1.0]), strength=1.0)


def test_js_distance_matches_direct_formula() -> None:
    m = dictionary(4, 6)
    d = js_distance_matrix(m.mu, m.mu)
    for a in range(4):
        for b in range(4):
            tot = 0.0
            for i, o in enumerate(m.item_bank.n_options):
                p, q = m.mu[a, i, :o].tolist(), m.mu[b, i, :o].tolist()
                for pj, qj in zip(p, q, strict=True):
                    mj = (pj + qj) / 2
                    tot += 0.5 * pj * math.log(pj / mj) + 0.5 * qj * math.log(qj / mj)
            assert math.isclose(float(d[a, b]), math.sqrt(tot / 6), rel_tol=1e-9, abs_tol=1e-7)


def test_compress_without_merging_reproduces_the_predictive() -> None:
    m = dictionary(7, 7).with_prior(torch.randn(7, dtype=DTYPE))
    c = compress(m, 7, min_prior=0.0)
    assert c.n_personas == 7
    assert math.isclose(float(c.log_prior.exp().sum()), 1.0, abs_tol=1e-12)
    for answers in ([], [(0, 1)], [(1, 2), (3, 0)]):
        torch.testing.assert_close(c.predict(c.replay(answers)), m.predict(m.replay(answers)))


def test_compress_drops_small_priors_and_merges_clusters() -> None:
    base = dictionary(3, 8)
    gen = torch.Generator().manual_seed(9)
    # 4 noisy copies of each of the 3 base personas, plus one with a negligible prior
    mu = base.mu.repeat_interleave(4, 0)
    noise = torch.rand(mu.shape, generator=gen, dtype=DTYPE) * 0.01 * (mu > 0)
    mu = (mu + noise) / (mu + noise).sum(-1, keepdim=True)
    mu = torch.cat([mu, base.mu[:1]])
    prior = torch.rand(13, generator=gen, dtype=DTYPE) + 0.5
    prior[12] = 1e-9
    prior = prior / prior.sum()
    m = PersonaMixture(base.item_bank, mu, prior.log())
    c = compress(m, 3, min_prior=1e-5, seed=0)
    assert c.n_personas == 3
    kept = prior[:12] / prior[:12].sum()
    mass = c.log_prior.exp()
    assert math.isclose(float(mass.sum()), 1.0, abs_tol=1e-12)
    groups = sorted(float(kept[4 * g : 4 * g + 4].sum()) for g in range(3))
    torch.testing.assert_close(torch.sort(mass).values, torch.tensor(groups, dtype=DTYPE))
    for g in range(3):
        # the prototype is the prior-weighted mean of its 4 members
        w = kept[4 * g : 4 * g + 4]
        centre = (w.view(-1, 1, 1) * mu[4 * g : 4 * g + 4]).sum(0) / w.sum()
        err = (c.mu - centre).abs().amax(dim=(1, 2)).min()
        assert float(err) < 1e-12
    with pytest.raises(ModelError):
        compress(m, 0)


def test_hellinger_distance_matches_its_formula() -> None:
    from models.persona_fit import hellinger_distance_matrix

    m = dictionary(5, seed=3)
    d = hellinger_distance_matrix(m.mu, m.mu[:2])
    a, b = m.mu[4], m.mu[1]
    h2 = sum(1 - float((a[i] * b[i]).sqrt().sum()) for i in range(a.shape[0])) / a.shape[0]
    assert float(d[4, 1]) == pytest.approx(math.sqrt(h2), abs=1e-12)
    assert float(d[1, 1]) == pytest.approx(0.0, abs=1e-7)


def test_hellinger_compression_recovers_planted_clusters() -> None:
    """Three tight clusters of personas (copies of three tables with tiny noise) compress
    to three prototypes whose priors are the clusters' masses and whose tables are the
    members' prior-weighted means."""
    centres = dictionary(3, seed=4)
    gen = torch.Generator().manual_seed(5)
    member = torch.tensor([0] * 6 + [1] * 3 + [2] * 9)
    noise = 1 + 0.001 * torch.rand(member.numel(), *centres.mu.shape[1:], generator=gen)
    mu = centres.mu[member] * noise
    mu = mu / mu.sum(-1, keepdim=True)
    full = PersonaMixture(centres.item_bank, mu)
    out = compress(full, 3, metric="hellinger")
    assert out.metrics == {"compressed_from": 18, "n_prototypes": 3, "metric": "hellinger"}
    masses = sorted(round(float(p), 9) for p in out.log_prior.exp())
    assert masses == [round(3 / 18, 9), round(6 / 18, 9), round(9 / 18, 9)]
    for p in range(3):
        # each prototype is one cluster's mean table
        c = int(js_distance_matrix(out.mu[p : p + 1], centres.mu).argmin())
        assert torch.allclose(out.mu[p], mu[member == c].mean(0), atol=1e-12)


def test_compress_for_live_only_above_the_threshold() -> None:
    from models.persona_fit import compress_for_live

    m = dictionary(12, seed=6)
    assert compress_for_live(m, above=12, n_prototypes=4) is m
    small = compress_for_live(m, above=11, n_prototypes=4)
    assert small.n_personas == 4 and small.metrics["compressed_from"] == 12
    assert float(small.log_prior.exp().sum()) == pytest.approx(1.0)
    with pytest.raises(ModelError, match="unknown compression metric"):
        compress(m, 2, metric="cosine")
