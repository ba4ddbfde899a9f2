"""A persona's (latent class's) most distinctive answers: what sets it apart in words.

For a persona mixture with class weights ``π = softmax(log_prior)`` (``[K]``) and answer
distributions ``μ[k, i, o]`` (``[K, I, O]``, zeros beyond an item's options), the overall
share of option ``o`` of item ``i`` is the prior predictive

    p(o | i) = Σ_k π_k · μ[k, i, o]

and the *lift* of that answer for class ``c`` is

    lift[c, i, o] = μ[c, i, o] / p(o | i).

Class ``c`` is described by its answers with the largest lift among those it gives often
(``μ[c, i, o] ≥ min_share``) and more often than the population (``lift > 1``), at most
one option per item (the item's largest lift), ordered by lift (then ``μ[c, i, o]``
descending, then item index), the first ``top``. So "Strongly agree on 'X' (82 % vs
31 % overall)" is ``μ = 0.82``, ``p = 0.31``, ``lift ≈ 2.65``.

Example (two classes, weights 0.5 each, one item with two options)::

    mu = [[[0.9, 0.1]], [[0.3, 0.7]]]      # overall: [0.6, 0.4]
    distinctive_answers(torch.tensor(mu), torch.log(torch.tensor([0.5, 0.5])), [0, 1])
    # class 0: item 0 option 0, 0.9 vs 0.6 (lift 1.5); class 1: item 0 option 1, 0.7 vs 0.4

Pure numerics (torch): no web framework, no database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from models.base import ShapeError

DEFAULT_TOP = 3
DEFAULT_MIN_SHARE = 0.4


@dataclass(frozen=True)
class DistinctiveAnswer:
    """One distinctive answer of a class.

    Attributes:
        item: item index (into the model's item bank); option: option index.
        share: ``μ[c, item, option]``, the class's probability of this answer.
        overall: ``p(option | item)`` under the mixture's prior.
        lift: ``share / overall``.
    """

    item: int
    option: int
    share: float
    overall: float
    lift: float


def distinctive_answers(
    mu: Tensor,
    log_prior: Tensor,
    classes: Sequence[int],
    *,
    top: int = DEFAULT_TOP,
    min_share: float = DEFAULT_MIN_SHARE,
    items: Sequence[int] | None = None,
) -> list[list[DistinctiveAnswer]]:
    """The most distinctive answers of each of ``classes`` (see the module docstring).

    Args:
        mu: ``[K, I, O]`` answer distributions per class (rows sum to 1 over valid options).
        log_prior: ``[K]`` log class weights (normalised here).
        classes: class indices to describe.
        top: at most this many answers per class.
        min_share: only answers the class gives with at least this probability.
        items: item indices that may describe a class (default: all).

    Returns:
        One list per entry of ``classes``, best first (possibly shorter than ``top``, or
        empty when no answer qualifies).

    Raises:
        ShapeError: ``mu`` is not 3-dimensional, ``log_prior`` does not match its ``K``,
            or a class or item index is out of range.
    """
    if mu.dim() != 3:
        raise ShapeError(f"mu must be [K, I, O], got shape {tuple(mu.shape)}")
    k_n, i_n, _ = mu.shape
    if log_prior.shape != (k_n,):
        raise ShapeError(f"log_prior must have shape ({k_n},), got {tuple(log_prior.shape)}")
    bad = [c for c in classes if not 0 <= c < k_n]
    if bad:
        raise ShapeError(f"class index {bad[0]} out of range [0, {k_n})")
    allowed = list(range(i_n)) if items is None else list(items)
    bad = [i for i in allowed if not 0 <= i < i_n]
    if bad:
        raise ShapeError(f"item index {bad[0]} out of range [0, {i_n})")
    mu = mu.to(torch.float64)
    weights = torch.softmax(log_prior.to(torch.float64), 0)
    overall = torch.einsum("k,kio->io", weights, mu)  # [I, O]
    out: list[list[DistinctiveAnswer]] = []
    for c in classes:
        share = mu[c]  # [I, O]
        lift = torch.where(overall > 0, share / overall.clamp_min(1e-300), 0.0)
        ok = (share >= min_share) & (lift > 1.0)
        best: list[DistinctiveAnswer] = []
        for i in allowed:
            opts = torch.nonzero(ok[i]).flatten().tolist()
            if not opts:
                continue
            o = max(opts, key=lambda j: (float(lift[i, j]), float(share[i, j]), -j))
            best.append(
                DistinctiveAnswer(i, o, float(share[i, o]), float(overall[i, o]), float(lift[i, o]))
            )
        best.sort(key=lambda a: (-a.lift, -a.share, a.item))
        out.append(best[:top])
    return out
