"""Small constructed persona mixtures shared by the elicitation tests."""

from __future__ import annotations

import torch

from models.base import DTYPE, ItemBank
from models.persona import PersonaMixture


def random_mixture(
    n_options: tuple[int, ...], k: int, seed: int, concentration: float = 0.7
) -> PersonaMixture:
    """A mixture with Dirichlet-random answer tables and a random prior."""
    gen = torch.Generator().manual_seed(seed)
    bank = ItemBank(tuple(f"q{i}" for i in range(len(n_options))), n_options)
    mu = torch.zeros(k, len(n_options), max(n_options), dtype=DTYPE)
    for i, o in enumerate(n_options):
        g = torch._standard_gamma(torch.full((k, o), concentration, dtype=DTYPE), generator=gen)
        mu[:, i, :o] = g / g.sum(-1, keepdim=True)
    log_prior = torch.randn(k, generator=gen, dtype=DTYPE)
    return PersonaMixture(bank, mu, log_prior)


def informative_mixture(eps: float = 0.01) -> PersonaMixture:
    """Items: 0 = perfectly informative about the target, 1..3 = pure noise, 4 = target.

    Four personas in two groups (0,1 vs 2,3). Item 0 and the target item 4 both answer
    the group (1 - eps on it). Items 1, 2, 3 have the same distribution for every
    persona, so they carry no information about anything; item 3 has three options.
    """
    bank = ItemBank(("informative", "noise_a", "noise_b", "noise_c", "target"), (2, 2, 2, 3, 2))
    mu = torch.zeros(4, 5, 3, dtype=DTYPE)
    group = torch.tensor([0, 0, 1, 1])
    for item in (0, 4):
        mu[:, item, :2] = eps
        mu[torch.arange(4), item, group] = 1 - eps
    mu[:, 1, :2] = torch.tensor([0.3, 0.7], dtype=DTYPE)
    mu[:, 2, :2] = torch.tensor([0.5, 0.5], dtype=DTYPE)
    mu[:, 3, :3] = torch.tensor([0.2, 0.5, 0.3], dtype=DTYPE)
    return PersonaMixture(bank, mu)
