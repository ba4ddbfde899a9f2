"""CAPE world models: exact answers on small cases, interface contracts, real-data quality.

Every comparison is against an independent computation: the Gaussian conditioning of
``cape_linear`` against a numpy inverse of the joint covariance, the importance-sampled
posterior of ``cape_factor`` against a grid posterior, ``cape_cooccurrence``'s statistics
against loops over respondents, lookahead against one ``update`` per outcome.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from models.base import (
    DTYPE,
    MISSING,
    BeliefModel,
    InvalidOptionError,
    ItemBank,
    ModelError,
    ShapeError,
    TooFewRespondentsError,
    UnknownItemError,
    load_model,
)
from models.cape_common import AlreadyObservedError, heldout_loglik
from models.cape_cooccurrence import CapeCooccurrence, population_statistics
from models.cape_factor import CapeFactor, fit_factor_parameters, sobol_normal
from models.cape_linear import CapeLinear, ReferenceCoding, em_factor_analysis

N_OPTIONS = (2, 3, 2, 4, 3, 2)


def synthetic_responses(n: int, seed: int, missing: float = 0.15) -> tuple[ItemBank, torch.Tensor]:
    """Answers drawn from a 2-d categorical factor model, with random missing cells."""
    gen = torch.Generator().manual_seed(seed)
    bank = ItemBank(tuple(f"q{i}" for i in range(len(N_OPTIONS))), N_OPTIONS)
    o = max(N_OPTIONS)
    w = 1.5 * torch.randn(len(N_OPTIONS), o, 2, generator=gen, dtype=DTYPE)
    b = 0.5 * torch.randn(len(N_OPTIONS), o, generator=gen, dtype=DTYPE)
    z = torch.randn(n, 2, generator=gen, dtype=DTYPE)
    logits = b + torch.einsum("iod,nd->nio", w, z)
    logits = logits.masked_fill(~bank.option_mask(), -math.inf)
    y = torch.distributions.Categorical(logits=logits).sample()
    drop = torch.rand(n, len(N_OPTIONS), generator=gen, dtype=DTYPE) < missing
    return bank, torch.where(drop, torch.full_like(y, MISSING), y)


@pytest.fixture(scope="module")
def data() -> tuple[ItemBank, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    bank, y = synthetic_responses(500, seed=1)
    return bank, y[:400], y[400:]


@pytest.fixture(scope="module")
def fitted(data: tuple[ItemBank, torch.Tensor, torch.Tensor]) -> dict[str, BeliefModel]:
    bank, train, val = data
    return {
        "cape_cooccurrence": CapeCooccurrence.fit(train, bank, validation=val),
        "cape_linear": CapeLinear.fit(train, bank, validation=val, dims=(1, 2)),
        "cape_factor": CapeFactor.fit(
            train, bank, validation=val, dims=(2,), steps=150, n_samples=512, progress=False
        ),
    }


FAMILIES = ("cape_cooccurrence", "cape_linear", "cape_factor")


@pytest.fixture(autouse=True, scope="module")
def one_thread():  # type: ignore[no-untyped-def]
    """One torch thread: on a shared 2-core machine, two threads oversubscribe the cores
    and make the small matrix products here 10x slower. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----- exact answers ------------------------------------------------------------------


def random_linear(seed: int, d: int = 2) -> CapeLinear:
    gen = torch.Generator().manual_seed(seed)
    bank = ItemBank(tuple(f"q{i}" for i in range(4)), (2, 3, 2, 3))
    k = ReferenceCoding.from_bank(bank).n_columns
    mu = torch.rand(k, generator=gen, dtype=DTYPE)
    w = torch.randn(k, d, generator=gen, dtype=DTYPE)
    psi = 0.1 + torch.rand(k, generator=gen, dtype=DTYPE)
    temp = torch.rand(4, generator=gen, dtype=DTYPE)
    off = torch.zeros(4, 3, dtype=DTYPE)
    return CapeLinear(bank, mu, w, psi, temp, off)


def test_linear_conditioning_equals_joint_covariance_schur_complement() -> None:
    model = random_linear(3)
    coding = model.coding
    answers = {0: 1, 2: 0, 1: 2}
    state = model.replay(list(answers.items()))
    mean, cov = model.coded_moments(state)

    sigma = model.joint_covariance().numpy()
    mu = model.mu.numpy()
    row = torch.full((1, 4), MISSING, dtype=torch.long)
    for i, o in answers.items():
        row[0, i] = o
    x, obs = coding.encode(row)
    o_idx = np.flatnonzero(obs[0].numpy() > 0)
    u_idx = np.flatnonzero(obs[0].numpy() == 0)
    s_oo_inv = np.linalg.inv(sigma[np.ix_(o_idx, o_idx)])
    s_uo = sigma[np.ix_(u_idx, o_idx)]
    direct_mean = mu[u_idx] + s_uo @ s_oo_inv @ (x[0].numpy()[o_idx] - mu[o_idx])
    direct_cov = sigma[np.ix_(u_idx, u_idx)] - s_uo @ s_oo_inv @ s_uo.T
    np.testing.assert_allclose(mean[0].numpy()[u_idx], direct_mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(
        cov[0].numpy()[np.ix_(u_idx, u_idx)], direct_cov, rtol=1e-10, atol=1e-12
    )
    # and the predictive of the unobserved item is the calibrated softmax of that mean
    f = np.array([1.0 - mean[0, u_idx].sum(), *mean[0, u_idx]])
    logits = model.temperature[3].item() * f + model.offset[3].numpy()
    expected = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(model.predict(state, [3])[0].numpy(), expected, rtol=1e-10)


def test_factor_analysis_em_never_decreases_the_likelihood(
    data: tuple[ItemBank, torch.Tensor, torch.Tensor],
) -> None:
    bank, train, _ = data
    x, obs = ReferenceCoding.from_bank(bank).encode(train)
    _, _, _, trace = em_factor_analysis(x, obs, 2, iters=40, tol=-math.inf)
    assert len(trace) == 40
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(trace))
    assert trace[-1] > trace[0] + 0.02


def test_factor_analysis_with_fewer_respondents_than_factors(
    data: tuple[ItemBank, torch.Tensor, torch.Tensor],
) -> None:
    """A young study: 3 respondents, 5 factors. The factors beyond the data's rank start
    at zero plus the jitter, EM still never decreases the likelihood, and ``CapeLinear``
    fits with its default grid of ``d`` (it failed with a shape error before)."""
    bank, train, _ = data
    x, obs = ReferenceCoding.from_bank(bank).encode(train[:3])
    mu, w, psi, trace = em_factor_analysis(x, obs, 5, iters=20, tol=-math.inf)
    assert w.shape == (x.shape[1], 5) and bool(torch.isfinite(w).all())
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(trace))
    model = CapeLinear.fit(train[:3], bank, validation=train[3:5])
    assert str(model.d) in model.metrics["by_d"]


def test_cape_fits_name_too_few_respondents(
    data: tuple[ItemBank, torch.Tensor, torch.Tensor],
) -> None:
    bank, train, _ = data
    with pytest.raises(TooFewRespondentsError, match="cape_linear needs at least 2 training"):
        CapeLinear.fit(train[:3], bank, validation=train[3:4])
    with pytest.raises(TooFewRespondentsError, match="cape_cooccurrence needs at least 2"):
        CapeCooccurrence.fit(train[:1], bank)


def grid_posterior_predictive(
    model: CapeFactor, answers: dict[int, int], item: int, d: int
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior predictive and posterior mean of z by quadrature on a regular grid."""
    axis = torch.linspace(-7, 7, 1401 if d == 1 else 201, dtype=DTYPE)
    grid = torch.cartesian_prod(*([axis] * d)).reshape(-1, d)
    logp = torch.log_softmax(
        (model.bias + torch.einsum("iod,gd->gio", model.weights, grid)).masked_fill(
            ~model.item_bank.option_mask(), -math.inf
        ),
        -1,
    )
    log_post = -0.5 * (grid**2).sum(1)
    for i, o in answers.items():
        log_post = log_post + logp[:, i, o]
    post = torch.softmax(log_post, 0)
    pred = post @ logp[:, item].exp()
    return pred.numpy(), (post @ grid).numpy()


@pytest.mark.parametrize("d", [1, 2])
def test_factor_importance_posterior_matches_grid_posterior(d: int) -> None:
    gen = torch.Generator().manual_seed(10 + d)
    bank = ItemBank(("a", "b", "c", "e"), (3, 2, 4, 3))
    w = 1.2 * torch.randn(4, 4, d, generator=gen, dtype=DTYPE)
    b = 0.5 * torch.randn(4, 4, generator=gen, dtype=DTYPE)
    model = CapeFactor(bank, w, b, sobol_normal(4096, d, seed=0))
    answers = {0: 2, 1: 0, 2: 3}
    state = model.replay(list(answers.items()))
    want_pred, want_mean = grid_posterior_predictive(model, answers, 3, d)
    got = model.predict(state, [3])[0, :3].numpy()
    np.testing.assert_allclose(got, want_pred[:3], atol=2e-3)
    np.testing.assert_allclose(model.posterior_mean_z(state)[0].numpy(), want_mean, atol=3e-2)
    # the weights really moved: the posterior differs from the prior predictive
    prior = model.predict(model.initial_state(), [3])[0, :3].numpy()
    assert np.abs(prior - want_pred[:3]).max() > 0.02


def test_cooccurrence_statistics_match_counting_loops() -> None:
    bank, y = synthetic_responses(60, seed=5, missing=0.3)
    stats = population_statistics(y, bank)
    cols = [(i, k) for i, o in enumerate(bank.n_options) for k in range(o)]
    yy = y.tolist()
    for a, c in itertools.product(range(len(cols)), repeat=2):
        (i, oi), (j, oj) = cols[a], cols[c]
        if i == j:
            assert stats.similarity[a, c] == 0 and stats.evidence[a, c] == 0
            continue
        n_a = sum(r[i] == oi for r in yy)
        n_c = sum(r[j] == oj for r in yy)
        n_ac = sum(r[i] == oi and r[j] == oj for r in yy)
        sim = n_ac / math.sqrt(n_a * n_c) if n_ac >= 3 else 0.0
        assert stats.similarity[a, c].item() == pytest.approx(sim, abs=1e-12)
        both = [r for r in yy if r[i] >= 0 and r[j] >= 0]
        with_a = [r for r in both if r[i] == oi]
        without = [r for r in both if r[i] != oi]
        p_c = stats.marginal[c].item()
        if len(with_a) >= 5 and len(without) >= 5:
            p1 = (sum(r[j] == oj for r in with_a) + p_c) / (len(with_a) + 1)
            p0 = (sum(r[j] == oj for r in without) + p_c) / (len(without) + 1)
            expected = math.log(p1) - math.log(p0)
        else:
            expected = 0.0
        assert stats.evidence[a, c].item() == pytest.approx(expected, abs=1e-12)
    # marginals with add-one smoothing
    answered = [r[1] for r in yy if r[1] >= 0]
    for k in range(3):
        want = (answered.count(k) + 1) / (len(answered) + 3)
        assert stats.marginal[2 + k].item() == pytest.approx(want)


def test_cooccurrence_naive_bayes_update_by_hand(
    data: tuple[ItemBank, torch.Tensor, torch.Tensor],
) -> None:
    bank, train, _ = data
    stats = population_statistics(train, bank)
    model = CapeCooccurrence(bank, stats, beta=0.7, eta=1.0, lam=0.0)
    state = model.replay([(0, 1), (3, 2)])
    a1, a2 = 0 + 1, 2 + 3 + 2 + 2  # columns of (q0, 1) and (q3, 2)
    cols = range(5, 7)  # item q2's two columns
    logit = [
        max(
            -10.0,
            min(
                10.0,
                math.log(stats.marginal[c] / (1 - stats.marginal[c]))
                + 0.7 * (stats.evidence[a1, c] + stats.evidence[a2, c]).item(),
            ),
        )
        for c in cols
    ]
    q = [1 / (1 + math.exp(-v)) for v in logit]
    expected = [v / sum(q) for v in q]
    np.testing.assert_allclose(model.predict(state, [2])[0, :2].numpy(), expected, rtol=1e-12)


# ----- interface contracts (all three families) ---------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_predictive_rows_are_distributions(family: str, fitted: dict[str, BeliefModel]) -> None:
    model = fitted[family]
    bank = model.item_bank
    state = model.replay([(1, 2), (4, 0)])
    pred = model.predict(state)
    assert pred.shape == (bank.n_items, bank.max_options)
    assert pred.dtype == DTYPE
    torch.testing.assert_close(pred.sum(-1), torch.ones(bank.n_items, dtype=DTYPE))
    assert bool((pred[~bank.option_mask()] == 0).all())
    assert bool((pred >= 0).all())
    # observed items are clamped to the observed option
    assert pred[1, 2].item() == 1.0 and pred[4, 0].item() == 1.0


@pytest.mark.parametrize("family", FAMILIES)
def test_online_updates_never_change_fitted_parameters(
    family: str, fitted: dict[str, BeliefModel], data: tuple[ItemBank, torch.Tensor, torch.Tensor]
) -> None:
    model = fitted[family]
    before = {
        k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()
    }
    _, _, val = data
    state = model.initial_batch(torch.full_like(val, MISSING))
    for item in range(model.item_bank.n_items):
        state = model.update_batch(state, torch.full((val.shape[0],), item), val[:, item])
        model.predict_batch(state, torch.arange(model.item_bank.n_items))
    model.lookahead_batch(model.initial_batch(val[:5].clone().fill_(MISSING)), [0, 1], [2, 3])
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k, v in before.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, after[k]), k
        else:
            assert v == after[k], k


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_equals_single_and_replay_order(
    family: str, fitted: dict[str, BeliefModel], data: tuple[ItemBank, torch.Tensor, torch.Tensor]
) -> None:
    model = fitted[family]
    _, _, val = data
    rows = val[:7]
    batch = model.initial_batch(rows)
    pred_batch = model.predict_batch(batch, torch.arange(model.item_bank.n_items))
    for b in range(rows.shape[0]):
        answers = [(i, int(o)) for i, o in enumerate(rows[b].tolist()) if o >= 0]
        single = model.replay(list(reversed(answers[1:])), attributes=dict(answers[:1]))
        torch.testing.assert_close(model.predict(single), pred_batch[b], rtol=1e-9, atol=1e-12)
    # incremental batched updates (with skips) equal the batched initial state
    state = model.initial_batch(torch.full_like(rows, MISSING))
    for item in range(model.item_bank.n_items):
        state = model.update_batch(state, torch.full((rows.shape[0],), item), rows[:, item])
    torch.testing.assert_close(
        model.predict_batch(state, torch.arange(model.item_bank.n_items)),
        pred_batch,
        rtol=1e-9,
        atol=1e-12,
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_lookahead_equals_update_per_outcome(family: str, fitted: dict[str, BeliefModel]) -> None:
    model = fitted[family]
    bank = model.item_bank
    state = model.replay([(2, 1)])
    cand, tgt = [0, 3, 1], [4, 5, 2, 3]  # target 2 observed, target 3 also a candidate
    p_x, p_t = model.lookahead(state, cand, tgt)
    assert p_x.shape == (3, bank.max_options)
    assert p_t.shape == (3, bank.max_options, 4, bank.max_options)
    torch.testing.assert_close(p_x, model.predict(state, cand))
    base = model.predict(state, tgt)
    for ci, x in enumerate(cand):
        for k in range(bank.max_options):
            want = model.predict(model.update(state, x, k), tgt) if k < bank.n_options[x] else base
            torch.testing.assert_close(p_t[ci, k], want, rtol=1e-9, atol=1e-12)
    # consistency: averaging the lookahead over the candidate's predictive gives the current
    # predictive (exact for the factor model's mixture, a check of the shapes for all)
    if family == "cape_factor":
        mixed = torch.einsum("ck,ckto->cto", p_x, p_t)
        torch.testing.assert_close(mixed, base.expand(3, -1, -1), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_lookahead_equals_single(family: str, fitted: dict[str, BeliefModel]) -> None:
    model = fitted[family]
    rows = torch.tensor([[0, -1, 1, -1, -1, -1], [-1, 2, -1, 3, -1, 1]])
    p_x, p_t = model.lookahead_batch(model.initial_batch(rows), [0, 3, 4], [5, 1])
    for b in range(2):
        answers = {i: int(o) for i, o in enumerate(rows[b].tolist()) if o >= 0}
        sx, st = model.lookahead(model.initial_state(answers), [0, 3, 4], [5, 1])
        torch.testing.assert_close(p_x[b], sx, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(p_t[b], st, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_serialisation_round_trip(family: str, fitted: dict[str, BeliefModel]) -> None:
    model = fitted[family]
    model.training_hash = "abc"
    loaded = load_model(model.to_bytes())
    assert type(loaded) is type(model) and loaded.family == family
    assert loaded.item_bank == model.item_bank
    assert loaded.metrics == model.metrics and loaded.training_hash == "abc"
    answers = [(0, 1), (3, 2)]
    torch.testing.assert_close(
        loaded.predict(loaded.replay(answers)),
        model.predict(model.replay(answers)),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_answers_move_predictions_and_fit_beats_marginals(
    family: str, fitted: dict[str, BeliefModel], data: tuple[ItemBank, torch.Tensor, torch.Tensor]
) -> None:
    """On data with strong latent structure every model must beat independent marginals."""
    model = fitted[family]
    bank, train, val = data
    assert heldout_loglik(model, val) > marginal_heldout(bank, train, val) + 0.05
    p0 = model.predict(model.initial_state(), [1])
    p1 = model.predict(model.replay([(0, 0), (3, 0)]), [1])
    p2 = model.predict(model.replay([(0, 1), (3, 3)]), [1])
    assert (p1 - p2).abs().max() > 0.05 and (p0 - p1).abs().max() > 0.01


@pytest.mark.parametrize("family", FAMILIES)
def test_bad_input_gives_clear_errors(family: str, fitted: dict[str, BeliefModel]) -> None:
    model = fitted[family]
    state = model.replay([(0, 1)])
    with pytest.raises(UnknownItemError, match="unknown item index 99"):
        model.update(state, 99, 0)
    with pytest.raises(InvalidOptionError, match="option 5 is out of range for item 'q1'"):
        model.update(state, 1, 5)
    with pytest.raises(AlreadyObservedError, match="'q0' is already observed"):
        model.update(state, 0, 0)
    with pytest.raises(UnknownItemError):
        model.predict(state, [0, 42])
    with pytest.raises(ShapeError, match=r"shape \[N, 6\], got \[3, 4\]"):
        model.initial_batch(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(InvalidOptionError, match=r"responses\[1, 2\] = 7"):
        model.initial_batch(torch.tensor([[0] * 6, [0, 0, 7, 0, 0, 0]]))
    batch = model.initial_batch(torch.full((2, 6), MISSING))
    with pytest.raises(ShapeError):
        model.update_batch(batch, torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0]))
    # a skipped question (-1) leaves that respondent unchanged
    after = model.update_batch(batch, torch.tensor([0, 1]), torch.tensor([MISSING, 2]))
    pred_before = model.predict_batch(batch, torch.arange(6))
    pred_after = model.predict_batch(after, torch.arange(6))
    torch.testing.assert_close(pred_after[0], pred_before[0], rtol=0, atol=0)
    assert not torch.equal(pred_after[1], pred_before[1])


def test_corrupt_parameters_are_refused() -> None:
    bank = ItemBank(("a", "b"), (2, 3))
    with pytest.raises(ModelError, match="cape_factor"):
        CapeFactor(bank, torch.zeros(2, 2, 1), torch.zeros(2, 3), torch.zeros(8, 1))
    with pytest.raises(ModelError, match="cape_linear"):
        CapeLinear(
            bank,
            torch.zeros(2),
            torch.zeros(2, 1),
            torch.ones(2),
            torch.zeros(2),
            torch.zeros(2, 3),
        )


def test_factor_svi_decreases_the_loss(data: tuple[ItemBank, torch.Tensor, torch.Tensor]) -> None:
    bank, train, _ = data
    _, _, losses = fit_factor_parameters(train, bank, 1, steps=120, seed=3, progress=False)
    first, last = np.mean(losses[:20]), np.mean(losses[-20:])
    assert last < first - 0.1


# ----- real data --------------------------------------------------------------------


def marginal_heldout(bank: ItemBank, train: torch.Tensor, val: torch.Tensor) -> float:
    """Held-out log-likelihood of independent per-item marginals (the same masks)."""
    from models.cape_common import marginal_probs, observation_masks

    marg = marginal_probs(bank, train)
    total, count = 0.0, 0
    for m in range(2):
        hidden = (val >= 0) & (observation_masks(val, 0.5, m) < 0)
        p = marg.unsqueeze(0).expand(val.shape[0], -1, -1)
        p = p.gather(2, val.clamp_min(0).unsqueeze(-1)).squeeze(-1)
        total += float(torch.log(p)[hidden].sum())
        count += int(hidden.sum())
    return total / count


@pytest.fixture(scope="module")
def ces(datasets_dir) -> tuple[ItemBank, torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    from elicitation.datasets import load_dataset

    ds = load_dataset(datasets_dir / "ces")
    assert ds.split is not None
    bank = ds.item_bank()
    train = torch.as_tensor(ds.matrix(users=ds.split["train_users"])).long()
    val = torch.as_tensor(ds.matrix(users=ds.split["val_users"])).long()
    return bank, train, val


@pytest.mark.parametrize("family", FAMILIES)
def test_real_data_beats_independent_marginals(
    family: str, ces: tuple[ItemBank, torch.Tensor, torch.Tensor]
) -> None:
    """CES: fit on train users, score validation users' hidden answers given the others."""
    bank, train, val = ces
    if family == "cape_cooccurrence":
        model: BeliefModel = CapeCooccurrence.fit(train, bank, validation=val)
    elif family == "cape_linear":
        model = CapeLinear.fit(train, bank, validation=val, dims=(2,), iters=40)
    else:
        model = CapeFactor.fit(
            train, bank, validation=val, dims=(2,), steps=200, n_samples=512, progress=False
        )
    base = marginal_heldout(bank, train, val)
    score = heldout_loglik(model, val)
    assert score > base + 0.1, (score, base)
