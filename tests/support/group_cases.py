"""A small real group setting for the group elicitation tests: 2 attributes and 4
questions, members drawn from two latent camps, and the persona mixture that generated them.

Items (:data:`BANK`): ``a0`` (2 options, the camp with probability 0.8), ``a1`` (3 options,
uniform noise), ``q0`` .. ``q2`` (2 options, the camp with probability 0.85) and ``q3`` (3
options: camp ``c`` answers ``c`` or ``c + 1`` with probability 0.5 each).

Example::

    truth, observed = toy_group(40)  # (40, 6) answers; observed: only the attributes
    model = toy_model()  # the exact generating model
"""

from __future__ import annotations

import torch

from models.base import ItemBank
from models.persona import PersonaMixture

BANK = ItemBank(("a0", "a1", "q0", "q1", "q2", "q3"), (2, 3, 2, 2, 2, 3))
"""The six items: attributes ``a0``, ``a1``, then questions ``q0`` .. ``q3``."""


def toy_data(n: int, seed: int) -> torch.Tensor:
    """``n`` members' answers to the items of :data:`BANK` (``(n, 6)`` long), camps at random."""
    g = torch.Generator().manual_seed(seed)
    camp = torch.randint(0, 2, (n,), generator=g)
    y = torch.empty(n, 6, dtype=torch.long)
    y[:, 0] = torch.where(torch.rand(n, generator=g) < 0.8, camp, 1 - camp)
    y[:, 1] = torch.randint(0, 3, (n,), generator=g)
    for j in range(2, 5):
        y[:, j] = torch.where(torch.rand(n, generator=g) < 0.85, camp, 1 - camp)
    y[:, 5] = camp + (torch.rand(n, generator=g) < 0.5).long()
    return y


def toy_model() -> PersonaMixture:
    """Two personas matching the camps of :func:`toy_data` (exact generating model)."""
    mu = torch.zeros(2, 6, 3, dtype=torch.float64)
    for c in range(2):
        mu[c, 0, c], mu[c, 0, 1 - c] = 0.8, 0.2
        mu[c, 1, :3] = 1 / 3
        for j in range(2, 5):
            mu[c, j, c], mu[c, j, 1 - c] = 0.85, 0.15
        mu[c, 5, c], mu[c, 5, c + 1] = 0.5, 0.5
    return PersonaMixture(BANK, mu)


def toy_group(n: int = 40, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """``(truth, observed)``: :func:`toy_data` and a copy with only the attributes (else -1)."""
    truth = toy_data(n, seed)
    observed = torch.full_like(truth, -1)
    observed[:, :2] = truth[:, :2]
    return truth, observed
