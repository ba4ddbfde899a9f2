"""k-means picks of representative members (relational respondent selection).

:func:`kmeans` fits ``k`` centroids (k-means++ seeding, Lloyd iterations);
:func:`nearest_distinct` takes the member nearest each centroid, each member once;
:func:`two_level_kmeans_pick` does both in ``O(M sqrt(k) d)`` for large groups.

Example::

    gen = torch.Generator().manual_seed(0)
    rows = nearest_distinct(kmeans(emb, 10, gen), emb)  # [10] distinct rows of emb [M, d]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from elicitation.errors import GroupError


def kmeans(x: Tensor, k: int, gen: torch.Generator, iters: int = 25) -> Tensor:
    """Lloyd's k-means with k-means++ seeding; returns the ``[k, d]`` centroids.

    Args:
        x: ``[M, d]`` points (``M >= k``).
        k: number of clusters.
        gen: random generator (seeding).
        iters: Lloyd iterations (stops early when assignments no longer change).
    """
    m = x.shape[0]
    first = int(torch.randint(m, (1,), generator=gen))
    cent = [x[first]]
    d2 = ((x - x[first]) ** 2).sum(1)
    for _ in range(1, k):
        total = float(d2.sum())
        if total <= 0:
            nxt = int(torch.randint(m, (1,), generator=gen))
        else:
            nxt = int(torch.multinomial(d2 / total, 1, generator=gen))
        cent.append(x[nxt])
        d2 = torch.minimum(d2, ((x - x[nxt]) ** 2).sum(1))
    c = torch.stack(cent)
    assign = torch.full((m,), -1, dtype=torch.long)
    for _ in range(iters):
        new = torch.cdist(x, c).argmin(1)
        if torch.equal(new, assign):
            break
        assign = new
        sums = torch.zeros_like(c).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).unsqueeze(1)
        c = torch.where(counts > 0, sums / counts.clamp(min=1), c)
    return c


def nearest_distinct(cent: Tensor, x: Tensor) -> Tensor:
    """For each centroid in turn, the nearest point not taken by an earlier centroid.

    Args:
        cent: ``[k, d]`` centroids.
        x: ``[M, d]`` points (``M >= k``).

    Returns:
        ``[k]`` distinct row indices into ``x``, in centroid order.
    """
    dist = torch.cdist(cent, x)  # [k, M]
    chosen: list[int] = []
    taken = torch.zeros(x.shape[0], dtype=torch.bool)
    for j in range(cent.shape[0]):
        d = dist[j].masked_fill(taken, float("inf"))
        i = int(d.argmin())
        taken[i] = True
        chosen.append(i)
    return torch.tensor(chosen, dtype=torch.long)


def allocate_proportional(sizes: Tensor, k: int) -> Tensor:
    """Split ``k`` slots over groups in proportion to their ``sizes``, at most a group's size.

    Largest remainder: group ``c`` gets ``floor(k s_c / M)`` slots, and the
    ``k - sum floor(.)`` slots left go one each to the groups with the largest remainders
    ``k s_c / M - floor(.)`` (ties: lower group index). As ``k <= M``, ``k s_c / M <= s_c``,
    so a group with a positive remainder has room for its extra slot, and the remainders
    sum to the slots left, so at least that many are positive.

    Args:
        sizes: ``[C]`` group sizes (``>= 0``, sum ``M >= k``).
        k: slots to place.

    Returns:
        ``[C]`` slot counts, summing to ``k``, each ``<= sizes[c]``.
    """
    total = int(sizes.sum())
    if not 0 <= k <= total:
        raise GroupError(f"cannot place {k} slots in groups of {total} members")
    if k == 0:
        return torch.zeros_like(sizes)
    exact = sizes.double() * k / total
    alloc = exact.floor().long()
    order = torch.argsort(-(exact - exact.floor()), stable=True)
    alloc[order[: k - int(alloc.sum())]] += 1
    return alloc


COARSE_SAMPLE_PER_CLUSTER = 128
"""Points per coarse cluster that the first level of :func:`two_level_kmeans_pick` is
fitted on."""


def two_level_kmeans_pick(x: Tensor, k: int, gen: torch.Generator, iters: int = 25) -> Tensor:
    """``k`` distinct representative points of ``x`` by two-level k-means, ``O(M sqrt(k) d)``.

    1. k-means with ``k1 = floor(sqrt(k))`` coarse clusters, fitted on a random sample
       of at most ``COARSE_SAMPLE_PER_CLUSTER * k1`` points (a coarse partition needs no
       more); every point goes to its nearest coarse centroid.
    2. The ``k`` slots are split over the coarse clusters in proportion to their sizes
       (:func:`allocate_proportional`), so each cluster gets about ``k / k1`` and at most
       its size.
    3. Within each coarse cluster, k-means with its slots, and the nearest untaken
       member to each fine centroid (:func:`nearest_distinct`).

    Each fine k-means sees ``~M / k1`` points and ``~k / k1`` centroids, so one Lloyd
    iteration over all of them costs ``O(M k / k1 d) = O(M sqrt(k) d)`` instead of
    ``O(M k d)``; the coarse level costs ``O(128 k1^2 d) = O(k d)`` per iteration on its
    sample and one ``O(M k1 d)`` assignment. The centroids approximate a k-means of all points whose clusters do not
    straddle the coarse boundaries; the picks are the same kind of representatives the
    exact selection returns (one member nearest each of ``k`` cluster centres).

    Args:
        x: ``[M, d]`` points (``M >= k >= 1``).
        k: number of points to pick.
        gen: random generator (seeding of every k-means).
        iters: Lloyd iterations of each k-means.

    Returns:
        ``[k]`` distinct row indices into ``x``.
    """
    k1 = max(1, math.isqrt(k))
    m = x.shape[0]
    sample = torch.randperm(m, generator=gen)[: COARSE_SAMPLE_PER_CLUSTER * k1]
    coarse = kmeans(x[sample], k1, gen, iters)
    assign = torch.cdist(x, coarse).argmin(1)  # [M]
    alloc = allocate_proportional(torch.bincount(assign, minlength=k1), k)
    picks: list[Tensor] = []
    for c in range(k1):
        kc = int(alloc[c])
        if kc == 0:
            continue
        idx = (assign == c).nonzero().squeeze(1)
        pts = x[idx]
        picks.append(idx[nearest_distinct(kmeans(pts, kc, gen, iters), pts)])
    return torch.cat(picks)
