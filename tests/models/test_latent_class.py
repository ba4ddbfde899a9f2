"""Latent class model: EM monotonicity, exact objective, model choice, real CES data."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor

from models import DTYPE, InvalidOptionError, ItemBank, ModelError, PersonaMixture, load_model
from models.latent_class import fit_em, fit_independent, fit_latent_classes, mean_log_likelihood

ROOT = Path(__file__).resolve().parents[2]


def planted(n: int, seed: int, missing: float = 0.2) -> tuple[Tensor, ItemBank, Tensor]:
    """Respondents from 3 well-separated classes over 8 items (2-4 options), some missing."""
    gen = torch.Generator().manual_seed(seed)
    n_opt = (2, 3, 4, 2, 3, 2, 4, 3)
    bank = ItemBank(tuple(f"q{i}" for i in range(8)), n_opt)
    mu = torch.zeros(3, 8, 4, dtype=DTYPE)
    for c in range(3):
        for i, o in enumerate(n_opt):
            p = torch.full((o,), 0.1 / (o - 1), dtype=DTYPE)
            p[(c + i) % o] = 0.9
            mu[c, i, :o] = p
    z = torch.multinomial(torch.tensor([0.5, 0.3, 0.2]), n, replacement=True, generator=gen)
    y = torch.stack(
        [torch.multinomial(mu[z, i, : n_opt[i]], 1, generator=gen)[:, 0] for i in range(8)], 1
    )
    y[torch.rand(n, 8, generator=gen) < missing] = -1
    return y, bank, mu


def test_em_increases_penalised_likelihood_every_iteration() -> None:
    y, bank, _ = planted(300, 0)
    for k, seed in [(2, 0), (4, 1), (6, 2)]:
        fit = fit_em(y, bank, k, alpha=0.5, max_iter=80, tol=-1.0, seed=seed)
        trace = torch.tensor(fit.trace, dtype=DTYPE)
        assert len(fit.trace) == 81
        assert bool((trace[1:] - trace[:-1] >= -1e-12).all()), fit.trace
        assert float(trace[-1] - trace[0]) > 0.1  # it actually moved


def test_objective_equals_direct_computation() -> None:
    """The recorded F/N equals a loop over respondents, classes and observed answers."""
    y, bank, _ = planted(40, 3)
    alpha = 0.7
    fit = fit_em(y, bank, 3, alpha=alpha, max_iter=5, tol=0.0, seed=4)
    mu, pi = fit.mu.tolist(), fit.log_prior.exp().tolist()
    total = 0.0
    for row in y.tolist():
        p = 0.0
        for c in range(3):
            term = pi[c]
            for i, o in enumerate(row):
                if o >= 0:
                    term *= mu[c][i][o]
            p += term
        total += math.log(p)
    for c in range(3):
        for i, o in enumerate(bank.n_options):
            total += alpha * sum(math.log(mu[c][i][j]) for j in range(o))
    assert math.isclose(fit.trace[-1], total / 40, rel_tol=1e-10)
    # rows are distributions over the item's own options
    torch.testing.assert_close(fit.mu.sum(-1), torch.ones(3, 8, dtype=DTYPE))
    assert float(fit.mu[:, 0, 2:].abs().sum()) == 0.0


def test_m_step_is_the_smoothed_count_formula() -> None:
    """With K = 1 the fit is (count + α) / (n_observed + α O_i), in closed form."""
    y, bank, _ = planted(50, 5)
    alpha = 0.5
    m = fit_independent(y, bank, alpha=alpha)
    for i, o in enumerate(bank.n_options):
        col = y[:, i]
        obs = col[col >= 0]
        want = torch.tensor(
            [(float((obs == j).sum()) + alpha) / (obs.numel() + alpha * o) for j in range(o)],
            dtype=DTYPE,
        )
        torch.testing.assert_close(m.mu[0, i, :o], want)


def test_a_base_distribution_shapes_the_pseudo_counts_exactly() -> None:
    """With a base ``b``: K = 1 gives (count + α O_i b_k) / (n_observed + α O_i); an item
    nobody answered is ``b`` in every class; a uniform ``b`` is the symmetric default, bit
    for bit; the recorded objective is the loop over respondents plus Σ a log μ."""
    y, bank, _ = planted(60, 9)
    y[:, 1] = -1  # item q1 (3 options): never answered
    alpha = 0.5
    base = bank.option_mask().to(DTYPE)
    base = base / base.sum(-1, keepdim=True)
    uniform = fit_em(y, bank, 3, alpha=alpha, max_iter=20, tol=0.0, seed=1)
    same = fit_em(y, bank, 3, alpha=alpha, max_iter=20, tol=0.0, seed=1, base=base)
    assert torch.equal(uniform.mu, same.mu) and uniform.trace == same.trace
    base[0, :2] = torch.tensor([0.9, 0.1], dtype=DTYPE)
    base[1, :3] = torch.tensor([0.6, 0.3, 0.1], dtype=DTYPE)
    one = fit_em(y, bank, 1, alpha=alpha, max_iter=2, base=base)
    obs = y[:, 0][y[:, 0] >= 0]
    want = [(float((obs == j).sum()) + alpha * 2 * base[0, j]) / (obs.numel() + alpha * 2) for j in (0, 1)]
    torch.testing.assert_close(one.mu[0, 0, :2], torch.tensor(want, dtype=DTYPE))
    fit = fit_em(y, bank, 3, alpha=alpha, max_iter=10, tol=0.0, seed=2, base=base)
    torch.testing.assert_close(fit.mu[:, 1, :3], base[1, :3].expand(3, 3))
    mu, pi = fit.mu.tolist(), fit.log_prior.exp().tolist()
    total = 0.0
    for row in y.tolist():
        p = sum(
            pi[c] * math.prod(mu[c][i][o] for i, o in enumerate(row) if o >= 0) for c in range(3)
        )
        total += math.log(p)
    for c in range(3):
        for i, o in enumerate(bank.n_options):
            total += sum(alpha * o * float(base[i, j]) * math.log(mu[c][i][j]) for j in range(o))
    assert math.isclose(fit.trace[-1], total / 60, rel_tol=1e-10)
    with pytest.raises(ModelError, match="distribution"):
        fit_em(y, bank, 2, base=base * 2)


def test_choice_of_k_and_persona_mixture_output() -> None:
    y, bank, mu_true = planted(600, 7)
    val, _, _ = planted(200, 8)
    m = fit_latent_classes(
        y,
        bank,
        val_responses=val,
        n_classes=(1, 3, 6),
        n_restarts=2,
        patience=None,
        ensemble=False,
        seed=1,
    )
    assert isinstance(m, PersonaMixture) and m.family == "persona_mixture"
    by_k = m.metrics["val_log_lik_by_k"]
    assert by_k["3"] > by_k["1"] + 1.0
    assert m.metrics["n_classes"] in (3, 6)
    assert m.metrics["val_log_lik"] > m.metrics["val_log_lik_independent"]
    assert m.training_hash is not None and m.metrics["fit_users"] == 800
    trace = m.metrics["train_trace"]
    assert all(b >= a - 1e-12 for a, b in zip(trace, trace[1:], strict=False))
    # the planted classes are found: each true class has a fitted class close to it
    if m.metrics["n_classes"] == 3:
        for c in range(3):
            err = (m.mu - mu_true[c]).abs().amax(dim=(1, 2)).min()
            assert float(err) < 0.1
    m2 = load_model(m.to_bytes())
    assert m2.metrics["n_classes"] == m.metrics["n_classes"]
    torch.testing.assert_close(
        m2.predict(m2.initial_state({0: 1})), m.predict(m.initial_state({0: 1}))
    )


def test_bad_input_is_rejected() -> None:
    y, bank, _ = planted(20, 0)
    bad = y.clone()
    bad[3, 1] = 3  # item q1 has 3 options
    with pytest.raises(InvalidOptionError, match=r"responses\[3, 1\]"):
        fit_latent_classes(bad, bank, n_classes=(2,))
    with pytest.raises(ModelError):
        fit_latent_classes(y, bank, n_classes=(0,))
    with pytest.raises(ModelError):
        fit_em(y, bank, 2, alpha=-1.0)


def test_ces_latent_classes_beat_independent_marginals() -> None:
    """Real data: CES train users, validation users scored (South region split)."""
    from elicitation.datasets import load_dataset

    ds = load_dataset(ROOT / "datasets" / "ces")
    bank = ds.item_bank()
    assert ds.split is not None
    train = torch.from_numpy(ds.matrix(users=ds.split["train_users"]).astype("int64"))
    val = torch.from_numpy(ds.matrix(users=ds.split["val_users"]).astype("int64"))
    m = fit_latent_classes(
        train, bank, val_responses=val, n_classes=(8,), n_restarts=1, refit_with_validation=False
    )
    indep = mean_log_likelihood(fit_independent(train, bank), val)
    assert math.isclose(m.metrics["val_log_lik_independent"], indep, rel_tol=1e-12)
    assert m.metrics["val_log_lik"] > indep + 1.0  # per user, in nats
    assert math.isclose(m.metrics["val_log_lik"], mean_log_likelihood(m, val), rel_tol=1e-12)


def test_ensemble_is_the_average_of_its_fits_and_chosen_on_validation() -> None:
    y, bank, _ = planted(400, 9)
    val, _, _ = planted(150, 10)
    kw = {"n_classes": (2, 4), "n_restarts": 2, "patience": None, "seed": 3}
    m = fit_latent_classes(y, bank, val_responses=val, refit_with_validation=False, **kw)
    scores = m.metrics["val_log_lik_by_structure"]
    assert set(scores) == {"single:2", "restarts:2", "single:4", "restarts:4", "all"}
    assert m.metrics["val_log_lik"] == max(scores.values())
    assert math.isclose(m.metrics["val_log_lik"], mean_log_likelihood(m, val), rel_tol=1e-12)
    # "all" is the equal-weight average of the four fits: its predictive after an answer
    # is the posterior-weighted average of the fits' predictives (model averaging).
    fits = [
        fit_em(y, bank, k, alpha=0.5, max_iter=300, tol=1e-5, seed=3 + 1000 * k + r)
        for k in (2, 4)
        for r in range(2)
    ]
    from models.latent_class import _mixture

    avg = _mixture(fits, bank)
    singles = [PersonaMixture(bank, f.mu, f.log_prior) for f in fits]
    ev = torch.tensor(
        [
            float(s_.log_marginal(torch.tensor([[-1, 1, -1, 0, -1, -1, -1, -1]]))[0])
            for s_ in singles
        ]
    )
    post = torch.softmax(ev, 0)
    want = sum(
        p * s_.predict(s_.replay([(1, 1), (3, 0)])) for p, s_ in zip(post, singles, strict=True)
    )
    torch.testing.assert_close(avg.predict(avg.replay([(1, 1), (3, 0)])), want)
    if m.metrics["structure"] == "all":
        assert m.n_personas == 12 and m.metrics["classes_per_fit"] == [2, 2, 4, 4]
