"""Reference answers for the selection criterion tests, by enumeration from a persona
mixture's raw tables (``mu`` and the prior) only: no model method is used, so they check
the criteria independently.

Example::

    model = random_mixture((2, 3, 2), k=4, seed=0)  # tests.support.elicitation_cases
    eig = brute_force_eig(model, [(0, 1)], 1, [2])  # EIG of item 1 for target 2
    joint = enumerated_joint(model, [(0, 1)], [1, 2])  # {(y1, y2): p}
"""

from __future__ import annotations

import itertools
import math

from models.persona import PersonaMixture


def entropy_of(p: list[float]) -> float:
    """Shannon entropy ``-sum_k p_k log p_k`` (nats) of a probability list (zeros skipped)."""
    return -sum(v * math.log(v) for v in p if v > 0)


def brute_force_eig(
    model: PersonaMixture, answers: list[tuple[int, int]], x: int, targets: list[int]
) -> float:
    """EIG by enumerating the joint of (persona, Y_x, Y_t1, ..., Y_tn) given the answers.

    Works from the raw tables ``mu`` and the prior only (no model method): the joint
    probability of every outcome tuple is summed directly, then marginals, conditionals
    and entropies are computed from those sums.
    """
    mu = model.mu
    prior = model.log_prior.exp()
    n_opt = model.item_bank.n_options
    k = mu.shape[0]
    joint: dict[tuple[int, ...], float] = {}
    for theta in range(k):
        w = float(prior[theta])
        for item, opt in answers:
            w *= float(mu[theta, item, opt])
        for ys in itertools.product(*(range(n_opt[i]) for i in [x, *targets])):
            p = w
            for item, y in zip([x, *targets], ys, strict=True):
                p *= float(mu[theta, item, y])
            joint[ys] = joint.get(ys, 0.0) + p
    z = sum(joint.values())
    joint = {ys: p / z for ys, p in joint.items()}

    def target_marginals(cond: dict[tuple[int, ...], float]) -> list[list[float]]:
        tot = sum(cond.values())
        out = []
        for ti, t in enumerate(targets):
            out.append(
                [sum(p for ys, p in cond.items() if ys[1 + ti] == j) / tot for j in range(n_opt[t])]
            )
        return out

    h_now = sum(entropy_of(m) for m in target_marginals(joint)) / len(targets)
    expected = 0.0
    for kx in range(n_opt[x]):
        cond = {ys: p for ys, p in joint.items() if ys[0] == kx}
        p_k = sum(cond.values())
        if p_k > 0:
            expected += p_k * sum(entropy_of(m) for m in target_marginals(cond)) / len(targets)
    return h_now - expected


def enumerated_joint(
    model: PersonaMixture, answers: list[tuple[int, int]], items: list[int]
) -> dict[tuple[int, ...], float]:
    """``p(Y_items = ys | answers)`` for every answer tuple, from the raw tables only."""
    mu, prior = model.mu, model.log_prior.exp()
    n_opt = model.item_bank.n_options
    out: dict[tuple[int, ...], float] = {}
    for theta in range(mu.shape[0]):
        w = float(prior[theta])
        for item, opt in answers:
            w *= float(mu[theta, item, opt])
        for ys in itertools.product(*(range(n_opt[i]) for i in items)):
            p = w
            for item, y in zip(items, ys, strict=True):
                p *= float(mu[theta, item, y])
            out[ys] = out.get(ys, 0.0) + p
    z = sum(out.values())
    return {ys: p / z for ys, p in out.items()}


def mean_target_entropy(
    model: PersonaMixture, answers: list[tuple[int, int]], targets: list[int]
) -> float:
    """Mean over ``targets`` of the entropy of ``p(Y_t | answers)``, by enumeration."""
    joint = enumerated_joint(model, answers, targets)
    n_opt = model.item_bank.n_options
    return sum(
        entropy_of([sum(p for ys, p in joint.items() if ys[ti] == j) for j in range(n_opt[t])])
        for ti, t in enumerate(targets)
    ) / len(targets)
