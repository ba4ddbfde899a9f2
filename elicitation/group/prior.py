"""The group-level prior: a mixture's class weights re-fitted to the group.

Example::

    model = adapt_mixture_prior(model, observed)  # observed [N, I], -1 = none
"""

from __future__ import annotations

import torch
from torch import Tensor

from elicitation.errors import GroupError
from models.base import BeliefModel


def adapt_mixture_prior(
    model: BeliefModel, history: Tensor, strength: float = 100.0, iters: int = 50
) -> BeliefModel:
    """The mixture with its class weights re-fitted to the group (MAP EM).

    The group's members are a sample of one population (e.g. one region) whose class
    mix may differ from the training users'. With ``l[v, k] = log p(h_v | class k)``
    (observed answers and attributes of member ``v``):

        E-step  g[v, k] ∝ pi_k exp(l[v, k])
        M-step  pi_k = (sum_v g[v, k] + strength * pi0_k) / (N + strength)

    i.e. a Dirichlet prior centred on the training weights ``pi0`` worth ``strength``
    pseudo-members, so a small group moves the weights little and a large one a lot.

    Args:
        model: a mixture (``log_prior [K]``, ``log_likelihood_matrix``, ``with_prior``).
        history: ``[N, I]`` the group's observations (``-1`` none).
        strength: pseudo-members of the training weights.
        iters: EM iterations.

    Returns:
        A model with the same components and the group's weights.

    Raises:
        GroupError: the model is not a mixture.
    """
    log_pi0 = getattr(model, "log_prior", None)
    llm = getattr(model, "log_likelihood_matrix", None)
    with_prior = getattr(model, "with_prior", None)
    if not isinstance(log_pi0, Tensor) or llm is None or with_prior is None:
        raise GroupError(f"{type(model).__name__} is not a mixture: cannot adapt its prior")
    ll = llm(history)  # [N, K]
    pi0 = log_pi0.exp()
    log_pi = log_pi0
    n = ll.shape[0]
    for _ in range(iters):
        g = torch.softmax(ll + log_pi, -1)
        pi = (g.sum(0) + strength * pi0) / (n + strength)
        log_pi = pi.clamp_min(1e-300).log()
    return with_prior(log_pi)  # type: ignore[no-any-return]
