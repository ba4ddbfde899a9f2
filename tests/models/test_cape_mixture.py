"""``stacked_mixture`` (``auto``'s model): exact mixture algebra, contracts, weight fitting.

Every expectation is computed independently from the components: the mixture predictive
as ``sum_m softmax(theta[n] + gamma[n] L)_m p_m`` with ``L`` the components' own
log-probabilities of the answers, lookahead against one ``update`` per outcome.
"""

from __future__ import annotations

import math

import pytest
import torch

from models.base import DTYPE, MISSING, ItemBank, ModelError, ShapeError, load_model
from models.cape_common import AlreadyObservedError
from models.cape_mixture import StackedMixture, fit_stacking, stacked_log_loss
from tests.support.cape_cases import N_OPTIONS, bank, mixture


@pytest.fixture(autouse=True, scope="module")
def one_thread():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def by_hand(
    model: StackedMixture, answers: list[tuple[int, int]], items: list[int]
) -> torch.Tensor:
    """``sum_m softmax(theta[n] + gamma[n] L)_m p_m`` from the components' single-respondent API."""
    states = [c.initial_state({}) for c in model.components]
    loglik = torch.zeros(len(states), dtype=DTYPE)
    for item, option in answers:
        for m, c in enumerate(model.components):
            loglik[m] += math.log(float(c.predict(states[m], [item])[0, option]))
            states[m] = c.update(states[m], item, option)
    k = min(len(answers), model.log_weights.shape[0] - 1)
    w = torch.softmax(model.log_weights[k] + model.gamma[k] * loglik, 0)
    preds = torch.stack(
        [c.predict(s, items).to(DTYPE) for c, s in zip(model.components, states, strict=True)]
    )
    out = torch.einsum("m,mio->io", w, preds)
    for item, option in answers:  # answered items are one-hot (the CAPE convention)
        if item in items:
            out[items.index(item)] = 0.0
            out[items.index(item), option] = 1.0
    return out


ANSWERS = [(1, 2), (3, 0), (0, 1), (4, 2)]


def test_predict_equals_weighted_components_after_each_answer() -> None:
    model = mixture()
    state = model.initial_state({})
    items = list(range(len(N_OPTIONS)))
    assert torch.allclose(model.predict(state, items), by_hand(model, [], items), atol=1e-12)
    for k in range(1, len(ANSWERS) + 1):  # k = 4 reuses the last row of theta
        state = model.update(state, *ANSWERS[k - 1])
        got = model.predict(state, items)
        assert torch.allclose(got, by_hand(model, ANSWERS[:k], items), atol=1e-10)
        assert torch.allclose(got.sum(-1), torch.ones(len(items), dtype=DTYPE))
        for item, option in ANSWERS[:k]:  # answered items are one-hot
            assert float(got[item, option]) == pytest.approx(1.0)


def test_gamma_zero_weights_depend_only_on_number_of_answers() -> None:
    model = mixture(gamma=0.0)
    s1 = model.update(model.initial_state({}), 1, 0)
    s2 = model.update(model.initial_state({}), 3, 2)
    w_expected = torch.softmax(model.log_weights[1], 0)
    for s in (s1, s2):
        assert torch.allclose(model.mixture_weights(s)[0], w_expected, atol=1e-12)


def test_batched_equals_single_and_skip_changes_nothing() -> None:
    model = mixture()
    observed = torch.full((3, len(N_OPTIONS)), MISSING, dtype=torch.long)
    batch = model.initial_batch(observed)
    batch = model.update_batch(batch, torch.tensor([1, 3, 0]), torch.tensor([2, 0, -1]))
    batch = model.update_batch(batch, torch.tensor([4, 0, 2]), torch.tensor([1, 1, 1]))
    singles = [[(1, 2), (4, 1)], [(3, 0), (0, 1)], [(2, 1)]]  # row 2 skipped its first question
    pred = model.predict_batch(batch, list(range(len(N_OPTIONS))))
    for b, answers in enumerate(singles):
        expected = by_hand(model, answers, list(range(len(N_OPTIONS))))
        assert torch.allclose(pred[b], expected, atol=1e-10)
    assert batch.n_answers.tolist() == [2, 2, 1]


def test_lookahead_equals_one_update_per_outcome() -> None:
    model = mixture()
    state = model.update(model.initial_state({}), 1, 1)
    cand, tgt = [0, 3, 4], [2, 1]
    p_x, p_t = model.lookahead(state, cand, tgt)
    assert torch.allclose(p_x, model.predict(state, cand), atol=1e-12)
    base = model.predict(state, tgt)
    for c, x in enumerate(cand):
        for k in range(bank().max_options):
            if k < N_OPTIONS[x]:
                expected = model.predict(model.update(state, x, k), tgt)
            else:  # not an answer: the current predictive, zero weight in p_x
                expected = base
                assert float(p_x[c, k]) == 0.0
            assert torch.allclose(p_t[c, k], expected, atol=1e-10), (x, k)


def test_updates_never_change_fitted_parameters_and_round_trip() -> None:
    model = mixture()
    before = model.to_bytes()
    params = [
        {k: v.clone() for k, v in c.state_dict().items() if isinstance(v, torch.Tensor)}
        for c in model.components
    ]
    state = model.initial_state({})
    for item, option in ANSWERS:
        state = model.update(state, item, option)
        model.lookahead(state, [2], [1])
    for c, p in zip(model.components, params, strict=True):
        for k, v in c.state_dict().items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, p[k]), k
    assert torch.equal(model.log_weights, load_model(before).log_weights)
    again = load_model(model.to_bytes())
    assert isinstance(again, StackedMixture) and again.names == model.names
    s2 = again.replay(ANSWERS)
    assert torch.allclose(again.predict(s2), model.predict(state), atol=1e-12)


def test_clear_errors() -> None:
    model = mixture()
    state = model.update(model.initial_state({}), 1, 0)
    with pytest.raises(AlreadyObservedError, match="q1"):
        model.update(state, 1, 2)
    with pytest.raises(ModelError, match="option 5"):
        model.update(state, 2, 5)
    comps = model.components
    with pytest.raises(ShapeError, match="log_weights"):
        StackedMixture(bank(), comps, model.names, torch.zeros(2, 2))
    with pytest.raises(ModelError, match="gamma"):
        StackedMixture(bank(), comps, model.names, torch.zeros(1, 3), -1.0)
    with pytest.raises(ModelError, match="item bank"):
        other = ItemBank(("a", "b"), (2, 2))
        StackedMixture(other, comps, model.names, torch.zeros(1, 3))
    with pytest.raises(ModelError, match="no known target"):
        fit_stacking([torch.full((1, 2, 1, 2), 0.5)], torch.full((2, 1), -1), [torch.zeros(2, 1)])


def test_fit_stacking_finds_the_true_component_and_beats_every_component() -> None:
    """Targets drawn from component 0's predictive: the weights go to it; at every n the
    fitted loss is <= each component's own loss (the vertex is feasible)."""
    g = torch.Generator().manual_seed(5)
    b_users, t, o = 400, 3, 3
    good = torch.softmax(2.0 * torch.randn(b_users, t, o, generator=g, dtype=DTYPE), -1)
    truth = torch.multinomial(good.reshape(-1, o), 1, generator=g).reshape(b_users, t)
    truth[:7, 1] = MISSING  # unknown answers are left out
    preds, logliks = [], []
    for _ in range(3):
        noise = torch.softmax(2.0 * torch.randn(b_users, t, o, generator=g, dtype=DTYPE), -1)
        preds.append(torch.stack([good, noise, torch.full_like(good, 1.0 / o)]))
        logliks.append(torch.zeros(b_users, 3, dtype=DTYPE))
    theta, gamma, info = fit_stacking(preds, truth, logliks)
    w = torch.softmax(theta, -1)
    assert bool((w[:, 0] > 0.8).all()), w
    known = truth >= 0
    for n, p in enumerate(preds):
        for m in range(3):
            single = (
                -p[m].gather(-1, truth.clamp_min(0).unsqueeze(-1)).squeeze(-1)[known].log().mean()
            )
            assert info["log_loss"][n] <= float(single) + 1e-9
        users = known.nonzero(as_tuple=True)[0]
        idx = truth.clamp_min(0)[None, :, :, None].expand(3, -1, -1, 1)
        pt = p.gather(-1, idx).squeeze(-1)[:, known]
        val = stacked_log_loss(theta[n], float(gamma[n]), pt, users, logliks[n])
        assert float(val) == pytest.approx(info["log_loss"][n], abs=1e-12)


def test_fit_stacking_uses_answer_evidence_when_it_identifies_the_component() -> None:
    """Half the users follow component 0, half component 1, and each user's answer
    log-likelihood says which: a positive gamma must win over pure stacking."""
    g = torch.Generator().manual_seed(7)
    b_users, t, o = 600, 2, 2
    a = torch.tensor([0.9, 0.1], dtype=DTYPE).expand(b_users, t, o)
    c = torch.tensor([0.1, 0.9], dtype=DTYPE).expand(b_users, t, o)
    group = torch.arange(b_users) % 2
    truth_p = torch.where(group[:, None, None] == 0, a, c)
    truth = torch.multinomial(truth_p.reshape(-1, o), 1, generator=g).reshape(b_users, t)
    ll = torch.where(
        group[:, None] == 0,
        torch.tensor([[-0.5, -3.0]], dtype=DTYPE),
        torch.tensor([[-3.0, -0.5]], dtype=DTYPE),
    )
    preds = [torch.stack([a, c]), torch.stack([a, c])]
    logliks = [torch.zeros(b_users, 2, dtype=DTYPE), ll]
    theta, gamma, info = fit_stacking(preds, truth, logliks)
    assert float(gamma[0]) == 0.0  # no evidence yet: the smallest gamma ties and is kept
    assert float(gamma[1]) > 0.0
    assert info["log_loss"][1] < info["log_loss"][0] - 0.2
