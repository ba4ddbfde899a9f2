"""Persona tables and the ``llm_personas`` / ``mixed`` benchmark fits on small constructed cases."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from elicitation.bench.methods import FitContext, fit_block_weight, get_method
from elicitation.errors import BenchmarkError
from inference_server import bench_methods
from inference_server.persona_table import PersonaTable, find_table, table_dir
from models.base import ItemBank

BANK = ItemBank(("d", "q1", "q2"), (2, 2, 3))


def table() -> PersonaTable:
    mu = torch.tensor(
        [
            [[0.9, 0.1, 0.0], [0.8, 0.2, 0.0], [0.7, 0.2, 0.1]],
            [[0.1, 0.9, 0.0], [0.3, 0.7, 0.0], [0.1, 0.1, 0.8]],
        ],
        dtype=torch.float64,
    )
    return PersonaTable(
        item_keys=BANK.keys,
        n_options=BANK.n_options,
        mu=mu,
        texts=("a", "b"),
        weights=(3.0, 1.0),
        valid_mass=torch.ones(2, 3, dtype=torch.float64),
        model_id="m",
        template_version="v1-x",
    )


def ctx(train: torch.Tensor, **options: dict) -> FitContext:
    return FitContext(
        item_bank=BANK,
        train=train,
        val=train[:0],
        demographics=[0],
        candidates=[1],
        targets=[2],
        seed=0,
        options=dict(options),
    )


def test_rows_for_reorders_and_fills_unknown_items() -> None:
    t = table()
    out = t.rows_for(("q2", "new", "d"), (3, 4, 2))
    assert torch.equal(out[:, 0, :3], t.mu[:, 2, :3])
    assert torch.equal(out[:, 2, :2], t.mu[:, 0, :2])
    assert torch.allclose(out[:, 1, :4], torch.full((2, 4), 0.25, dtype=torch.float64))
    # an item whose option count changed is not taken from the table
    assert torch.allclose(
        t.rows_for(("q1",), (3,))[:, 0], torch.full((2, 3), 1 / 3, dtype=torch.float64)
    )


def test_save_load_and_find(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIORLY_CACHE_DIR", str(tmp_path))
    assert find_table(BANK.keys, BANK.n_options) is None
    folder = table_dir(BANK.keys, BANK.n_options)
    table().save(folder / "m__v1-x__K2.pt")
    table().save(folder / "m__v1-x__K10.pt")
    assert find_table(BANK.keys, BANK.n_options) == folder / "m__v1-x__K10.pt"
    back = PersonaTable.load(folder / "m__v1-x__K2.pt")
    assert torch.equal(back.mu, table().mu) and back.texts == ("a", "b")


def test_llm_personas_em_prior_matches_enumeration(tmp_path: Path) -> None:
    path = table().save(tmp_path / "t.pt")
    # 3 users: answers to d and q1; q2 is a target (masked for the prior fit)
    train = torch.tensor([[0, 0, 2], [0, 1, 2], [1, 1, 0]])
    model = get_method("llm_personas").fit(ctx(train, llm_personas={"path": str(path)}))
    prior = model.log_prior.exp()
    # exact EM fixed point by brute-force iteration on the 2-persona likelihoods
    mu = table().mu
    lik = torch.tensor(
        [[float(mu[k, 0, u[0]] * mu[k, 1, u[1]]) for k in range(2)] for u in train.tolist()],
        dtype=torch.float64,
    )
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    for _ in range(5000):
        g = lik * p
        p = (g / g.sum(1, keepdim=True)).mean(0)
    assert torch.allclose(prior, p, atol=1e-3)  # EM stops at a log-likelihood tolerance
    assert math.isclose(float(prior.sum()), 1.0, abs_tol=1e-12)


def test_mixed_has_both_components(tmp_path: Path) -> None:
    path = table().save(tmp_path / "t.pt")
    g = torch.Generator().manual_seed(0)
    train = torch.stack(
        [
            torch.randint(0, 2, (40,), generator=g),
            torch.randint(0, 2, (40,), generator=g),
            torch.randint(0, 3, (40,), generator=g),
        ],
        dim=1,
    )
    c = ctx(train, llm_personas={"path": str(path)}, latent_classes={"n_classes": (2,)})
    model = get_method("mixed").fit(c)
    lc = c.cache["latent_classes"]
    assert model.mu.shape[0] == 2 + lc.mu.shape[0]
    assert torch.equal(model.mu[:2], table().mu)
    assert math.isclose(float(model.log_prior.exp().sum()), 1.0, abs_tol=1e-9)
    # p(θ) = w · p_LLM ⊕ (1 − w) · p_LC: the latent classes keep their own prior ...
    w = model.metrics["llm_block_weight"]
    assert 0.0 < w < 1.0
    llm = get_method("llm_personas").fit(c)
    assert torch.allclose(model.log_prior[:2].exp(), w * llm.log_prior.exp(), atol=1e-12)
    assert torch.allclose(model.log_prior[2:].exp(), (1 - w) * lc.log_prior.exp(), atol=1e-12)
    # ... and w maximises the training users' mean log-likelihood (non-target answers)
    masked = c.masked(c.train)
    la, lb = llm.log_marginal(masked), lc.log_marginal(masked)
    assert w == pytest.approx(_argmax_block_weight(la, lb), abs=1e-6)


def _argmax_block_weight(la: torch.Tensor, lb: torch.Tensor) -> float:
    """Brute force: a grid of 10^4 weights, then a 10^4 grid around the best one."""

    def best(grid: torch.Tensor) -> float:
        f = torch.logaddexp(
            grid.log().unsqueeze(1) + la, torch.log1p(-grid).unsqueeze(1) + lb
        ).mean(1)
        return float(grid[int(f.argmax())])

    w0 = best(torch.linspace(1e-6, 1 - 1e-6, 10_001, dtype=torch.float64))
    lo, hi = max(w0 - 2e-4, 1e-9), min(w0 + 2e-4, 1 - 1e-9)
    return best(torch.linspace(lo, hi, 10_001, dtype=torch.float64))


def test_block_weight_is_the_maximum_likelihood_weight() -> None:
    # per-user likelihoods under blocks A and B: (a, b) pairs chosen by hand
    a = torch.tensor([0.02, 0.30, 0.10, 0.05, 0.40], dtype=torch.float64)
    b = torch.tensor([0.20, 0.10, 0.10, 0.30, 0.05], dtype=torch.float64)
    w = fit_block_weight(a.log(), b.log())
    assert w == pytest.approx(_argmax_block_weight(a.log(), b.log()), abs=1e-6)
    # a block that explains every user worse gets weight 0 in the limit
    assert fit_block_weight((b / 10).log(), b.log()) < 1e-3
    # equal likelihoods: every w is optimal and EM stays where it starts
    assert fit_block_weight(b.log(), b.log()) == 0.5
    with pytest.raises(BenchmarkError, match="fit_block_weight"):
        fit_block_weight(a.log(), b[:3].log())


def test_missing_table_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIORLY_CACHE_DIR", str(tmp_path))
    train = torch.tensor([[0, 0, 2]])
    with pytest.raises(BenchmarkError, match="priorly personas table"):
        bench_methods.fit_llm_personas(ctx(train))
