"""A small stacked mixture (``models.cape_mixture``) and its components, on five items with
2 to 4 options, for the model and the export tests.

Example::

    model = mixture()  # components f1 (2 factors), persona, f3 (1 factor)
    state = model.update(model.initial_state({}), 1, 2)
    p = model.predict(state, list(range(len(N_OPTIONS))))  # (5, 4)
"""

from __future__ import annotations

import torch

from models.base import DTYPE, ItemBank
from models.cape_factor import CapeFactor, sobol_normal
from models.cape_mixture import StackedMixture
from models.persona import PersonaMixture

N_OPTIONS = (2, 3, 2, 4, 3)
"""Options per item of :func:`bank`."""


def bank() -> ItemBank:
    """The item bank ``q0`` .. ``q4`` with :data:`N_OPTIONS` options."""
    return ItemBank(tuple(f"q{i}" for i in range(len(N_OPTIONS))), N_OPTIONS)


def factor_model(seed: int, d: int = 2, s: int = 64) -> CapeFactor:
    """A random ``d``-factor CAPE model on :func:`bank` (``s`` Sobol points, fixed ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    b = bank()
    o = b.max_options
    w = 1.2 * torch.randn(b.n_items, o, d, generator=g, dtype=DTYPE)
    bias = 0.5 * torch.randn(b.n_items, o, generator=g, dtype=DTYPE)
    return CapeFactor(b, w, bias, sobol_normal(s, d, seed))


def persona_model(seed: int, p: int = 4) -> PersonaMixture:
    """A random ``p``-persona mixture on :func:`bank` (random tables and prior, fixed ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    b = bank()
    mu = torch.rand(p, b.n_items, b.max_options, generator=g, dtype=DTYPE) + 0.05
    mu = mu * b.option_mask()
    mu = mu / mu.sum(-1, keepdim=True)
    return PersonaMixture(b, mu, torch.log_softmax(torch.randn(p, generator=g, dtype=DTYPE), 0))


def mixture(gamma: float | torch.Tensor = 0.7) -> StackedMixture:
    """Three components (factor d=2, persona, factor d=1), ``theta`` for n = 0, 1, 2+ answers."""
    theta = torch.tensor([[0.0, 0.5, -0.3], [0.2, -0.4, 0.1], [1.0, 0.0, -1.0]], dtype=DTYPE)
    comps = [factor_model(1), persona_model(2), factor_model(3, d=1)]
    return StackedMixture(bank(), comps, ["f1", "persona", "f3"], theta, gamma)
