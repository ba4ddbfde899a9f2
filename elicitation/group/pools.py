"""Pooling the belief model with the GNN: log-linear pools and their stacked form.

``pool``: ``p ∝ p_belief^(1-w) * p_gnn^w`` with ``w`` chosen on held-out answers by the
lower confidence bound of its log-score gain (:func:`choose_pool_weight`).
``stack``: ``p ∝ prod_k p_k^a_k`` over :data:`STACK_COMPONENTS` with free weights
``a >= 0`` fitted by maximum likelihood (:func:`fit_stack_weights`).
Predictives are ``[..., O]`` along the last axis (zeros outside an item's options).

Example::

    w, info = choose_pool_weight(p_belief, p_gnn, truth)  # [M, T, O], [M, T, O], [M, T]
    p = log_linear_pool(p_belief, p_gnn, w)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from elicitation.errors import GroupError

# ----------------------------------------------------------------------------------------
# pooling


def log_linear_pool(p_a: Tensor, p_b: Tensor, w: float) -> Tensor:
    """``p ∝ p_a^(1-w) * p_b^w`` along the last axis (zeros stay zeros).

    Args:
        p_a, p_b: ``[..., O]`` distributions with the same support.
        w: weight of ``p_b`` in ``[0, 1]``.
    """
    la = p_a.clamp_min(1e-12).log()
    lb = p_b.clamp_min(1e-12).log()
    lg = (1.0 - w) * la + w * lb
    support = (p_a > 0) | (p_b > 0)
    lg = lg.masked_fill(~support, float("-inf"))
    return torch.softmax(lg, -1)


def fit_pool_weight(
    p_belief: Tensor, p_gnn: Tensor, truth: Tensor, grid: int = 21
) -> tuple[float, dict[str, float]]:
    """The pool weight ``w`` with the lowest log loss on held-out answers (grid search).

    Args:
        p_belief, p_gnn: ``[M, T, O]`` predictives of the same (member, target) pairs.
        truth: ``[M, T]`` true options (``-1`` = not scored).
        grid: number of equally spaced weights in ``[0, 1]``.

    Returns:
        ``(w, {str(w): mean log loss})``.
    """
    ok = truth >= 0
    y = truth.clamp_min(0).unsqueeze(-1)
    losses: dict[str, float] = {}
    best_w, best = 0.0, float("inf")
    for j in range(grid):
        w = j / (grid - 1)
        p = log_linear_pool(p_belief, p_gnn, w).gather(-1, y).squeeze(-1)
        loss = float(-(p.clamp_min(1e-12).log()[ok]).mean())
        losses[f"{w:.2f}"] = loss
        if loss < best - 1e-12:
            best, best_w = loss, w
    return best_w, losses


POOL_GRID = 21


def pool_gain_rows(
    p_belief: Tensor, p_gnn: Tensor, truth: Tensor, *, grid: int = POOL_GRID
) -> tuple[Tensor, Tensor]:
    """Per-member log-score gains of the pool over the belief model alone, per weight.

    ``S[v, g] = sum_{t scored} [log p_pool(w_g)(y_vt) - log p_belief(y_vt)]`` with
    ``w_g = g / (grid - 1)``, and ``n[v]`` = the member's number of scored answers;
    members without a scored answer are left out.

    Args:
        p_belief, p_gnn: ``[M, T, O]`` predictives of the same (member, target) pairs.
        truth: ``[M, T]`` true options (``-1`` = not scored).
        grid: number of equally spaced weights in ``[0, 1]``.

    Returns:
        ``(S [M', grid], n [M'])`` float64.
    """
    ok = truth >= 0
    y = truth.clamp_min(0).unsqueeze(-1)
    n = ok.sum(-1)
    rows = n > 0
    lb = p_belief.gather(-1, y).squeeze(-1).clamp_min(1e-12).log()
    cols = []
    for j in range(grid):
        lp = log_linear_pool(p_belief, p_gnn, j / (grid - 1)).gather(-1, y).squeeze(-1)
        d = torch.where(ok, lp.clamp_min(1e-12).log() - lb, torch.zeros((), dtype=lb.dtype))
        cols.append(d.sum(-1)[rows])
    return torch.stack(cols, 1).double(), n[rows].double()


def pool_weight_from_gains(
    sums: Tensor, counts: Tensor, *, z: float = 2.0
) -> tuple[float, dict[str, Any]]:
    """The pool weight from held-out evidence (:func:`pool_gain_rows`): the weight whose
    gain has the highest lower confidence bound, or ``0`` when no bound is above zero.

    For each weight ``w``, the mean gain per answer and its standard error with the
    answers of one unit (a validation member, or one answer of a group member) kept
    together (ratio estimator, cluster-robust):

        g(w) = sum_v S_v(w) / sum_v n_v
        se(w) = sqrt(R / (R - 1) * sum_v (S_v(w) - n_v g(w))^2) / sum_v n_v
        w* = argmax_w [g(w) - z se(w)]   if that maximum is > 0,  else  0.

    So the GNN gets the largest weight whose benefit is still clear given the evidence
    (a weight fitted to noise, or to a population the group does not come from, is not
    used), and units count by how many answers they carry.

    Args:
        sums: ``[R, G]`` summed gains per unit and weight (``w_g = g / (G - 1)``).
        counts: ``[R]`` answers per unit.
        z: standard errors of pessimism.

    Returns:
        ``(w, {"w_best_mean", "gain", "gain_se", "lcb", "rows", "answers"})`` (gain,
        standard error and bound of the chosen weight; of the best-mean weight when
        ``w = 0``).
    """
    r, g = int(sums.shape[0]), int(sums.shape[1])
    weights = [j / (g - 1) for j in range(g)]
    total = float(counts.sum())
    if r < 2 or total <= 0:
        return 0.0, {
            "w_best_mean": 0.0,
            "gain": 0.0,
            "gain_se": float("inf"),
            "lcb": 0.0,
            "rows": r,
            "answers": total,
        }
    mean = sums.sum(0) / total  # [G]
    resid = sums - counts.unsqueeze(1) * mean.unsqueeze(0)
    se = (resid.pow(2).sum(0) * r / (r - 1)).sqrt() / total
    lcb = mean - z * se
    lcb[0] = 0.0  # w = 0 is the belief model itself
    best = int(torch.argmax(lcb))  # lowest weight on ties
    best_mean = int(torch.argmax(mean))
    pick = best if best > 0 else best_mean
    info = {
        "w_best_mean": weights[best_mean],
        "gain": float(mean[pick]),
        "gain_se": float(se[pick]),
        "lcb": float(lcb[pick]),
        "rows": r,
        "answers": total,
    }
    return (weights[best] if float(lcb[best]) > 0 else 0.0), info


def choose_pool_weight(
    p_belief: Tensor, p_gnn: Tensor, truth: Tensor, *, grid: int = POOL_GRID, z: float = 2.0
) -> tuple[float, dict[str, Any]]:
    """The GNN's pool weight, or ``0`` (the belief model alone) unless the GNN clearly helps.

    :func:`pool_gain_rows` on held-out answers, then :func:`pool_weight_from_gains`:
    the weight with the highest lower confidence bound ``g(w) - z se(w)`` of the gain in
    log score per answer (standard errors over members: members are independent, their
    answers are not), ``0`` when no bound is above zero.

    Args:
        p_belief, p_gnn: ``[M, T, O]`` predictives of the same (member, target) pairs.
        truth: ``[M, T]`` true options (``-1`` = not scored).
        grid: weights tried in ``[0, 1]``.
        z: standard errors of pessimism.

    Returns:
        ``(w, info)``: see :func:`pool_weight_from_gains`; also ``info["log_loss"]`` =
        mean log loss per weight over the scored answers, and ``info["gain_sums"]``,
        ``info["gain_counts"]`` = the evidence (for online use).
    """
    sums, counts = pool_gain_rows(p_belief, p_gnn, truth, grid=grid)
    w, info = pool_weight_from_gains(sums, counts, z=z)
    info["members"] = info["rows"]
    info["log_loss"] = fit_pool_weight(p_belief, p_gnn, truth, grid)[1]
    info["gain_sums"], info["gain_counts"] = sums, counts
    return w, info


# ----------------------------------------------------------------------------------------
# stacking: a log-linear pool with free weights (weight and temperature)

STACK_COMPONENTS = ("belief", "gnn", "belief_gnn_imputed")
"""The predictives the ``stack`` imputation combines, in the order of its weights."""


def stacked_pool(probs: Tensor, weights: Tensor | Sequence[float]) -> Tensor:
    """``p ∝ prod_k probs[k]^weights[k]`` along the last axis.

    Args:
        probs: ``[K, ..., O]`` predictives of the same pairs (zeros outside an item's
            options; an option no component supports gets probability 0).
        weights: ``[K]`` exponents ``>= 0`` (not normalised: their sum acts as an
            inverse temperature).

    Returns:
        ``[..., O]``.
    """
    a = torch.as_tensor(weights, dtype=probs.dtype).reshape(-1, *([1] * (probs.dim() - 1)))
    if a.shape[0] != probs.shape[0]:
        raise GroupError(f"{probs.shape[0]} predictives but {a.shape[0]} weights")
    logit = (a * probs.clamp_min(1e-12).log()).sum(0)
    support = (probs > 0).any(0)
    return torch.softmax(logit.masked_fill(~support, float("-inf")), -1)


def _stack_nll(logp: Tensor, support: Tensor, y: Tensor, a: Tensor) -> Tensor:
    """Summed negative log likelihood of the stacked pool (``logp [K, P, O]``, ``y [P]``)."""
    logit = torch.einsum("k,kpo->po", a, logp).masked_fill(~support, float("-inf"))
    return -(logit.gather(-1, y[:, None]).squeeze(-1) - torch.logsumexp(logit, -1)).sum()


def fit_stack_weights(
    probs: Tensor,
    truth: Tensor,
    *,
    init: Sequence[float] | None = None,
    max_iter: int = 100,
    tol: float = 1e-9,
) -> tuple[Tensor, dict[str, Any]]:
    """Maximum-likelihood weights ``a >= 0`` of :func:`stacked_pool` on held-out answers.

    Minimises ``L(a) = -sum_{(v,t) scored} log softmax_o(sum_k a_k log p_k[v, t, o])[y_vt]``,
    a convex function of ``a`` (log-sum-exp of a linear map minus a linear map), by a
    projected Newton method: gradient and Hessian of ``L`` in closed form
    (``dL/da_k = sum (E_pool[log p_k] - log p_k[y])``, Hessian = summed covariance of the
    ``log p_k`` under the pool), a Newton step on the weights that are free (positive, or
    at 0 with a negative gradient), a backtracking line search that keeps ``a >= 0``. A
    small ridge (1e-9 of the trace) makes identical components (e.g. the belief model and
    its imputed copy before any answer) solvable; their total weight is what matters.

    Args:
        probs: ``[K, M, T, O]`` predictives of the same (member, target) pairs.
        truth: ``[M, T]`` true options (``-1`` = not scored).
        init: starting weights (default: ``1`` for the first component, ``0`` else,
            i.e. the first predictor alone).
        max_iter: Newton iterations.
        tol: stop when the largest projected gradient per answer is below ``tol``.

    Returns:
        ``(a [K] float64, {"nll": mean NLL at a, "nll_first": mean NLL of the first
        component alone, "answers": scored answers, "iterations": n})``.
    """
    k = int(probs.shape[0])
    ok = truth >= 0
    n = int(ok.sum())
    a = torch.zeros(k, dtype=torch.float64)
    a[0] = 1.0
    if init is not None:
        a = torch.as_tensor(init, dtype=torch.float64).clamp_min(0.0).clone()
    if n == 0:
        return a, {"nll": float("nan"), "nll_first": float("nan"), "answers": 0, "iterations": 0}
    p = probs.to(torch.float64)[:, ok]  # [K, P, O]
    support = (p > 0).any(0)
    logp = p.clamp_min(1e-12).log().masked_fill(~support, 0.0)
    y = truth[ok].long()
    ly = logp.gather(-1, y.expand(k, -1)[..., None]).squeeze(-1)  # [K, P]
    first = torch.zeros(k, dtype=torch.float64)
    first[0] = 1.0
    nll0 = float(_stack_nll(logp, support, y, first)) / n
    f = _stack_nll(logp, support, y, a)
    it = 0
    while it < max_iter:
        it += 1
        logit = torch.einsum("k,kpo->po", a, logp).masked_fill(~support, float("-inf"))
        q = torch.softmax(logit, -1)  # [P, O]
        mean = torch.einsum("po,kpo->kp", q, logp)  # E_pool[log p_k]
        grad = (mean - ly).sum(1)  # [K]
        cen = logp - mean[..., None]
        hess = torch.einsum("po,kpo,jpo->kj", q, cen, cen)
        free = (a > 0) | (grad < 0)
        if not bool(free.any()) or float(grad[free].abs().max()) / n < tol:
            break
        h = hess[free][:, free]
        h = h + (1e-9 * float(h.diagonal().sum()) + 1e-12) * torch.eye(len(h), dtype=h.dtype)
        step = torch.zeros(k, dtype=torch.float64)
        step[free] = -torch.linalg.solve(h, grad[free])
        t, improved = 1.0, False
        for _ in range(40):
            cand = (a + t * step).clamp_min(0.0)
            fc = _stack_nll(logp, support, y, cand)
            if float(fc) < float(f):
                a, f, improved = cand, fc, True
                break
            t *= 0.5
        if not improved:
            break
    return a, {"nll": float(f) / n, "nll_first": nll0, "answers": n, "iterations": it}


def shrunk_stack_weights(direction: Tensor, lam: float) -> Tensor:
    """``lam * a + (1 - lam) * (1, 0, ..., 0)``: the stack shrunk toward the first
    predictor alone (``lam = 0``: the belief model, ``lam = 1``: the fitted stack)."""
    base = torch.zeros_like(direction)
    base[0] = 1.0
    return lam * direction + (1.0 - lam) * base


def stack_gain_rows(
    probs: Tensor, truth: Tensor, direction: Tensor, *, grid: int = POOL_GRID
) -> tuple[Tensor, Tensor]:
    """Per-unit log-score gains of the shrunk stack over the first predictor alone.

    ``S[v, g] = sum_{t scored} [log stack(shrunk(a, lam_g))(y_vt) - log probs[0, v, t, y_vt]]``
    with ``lam_g = g / (grid - 1)`` (:func:`shrunk_stack_weights`), ``n[v]`` = the unit's
    scored answers; units without a scored answer are left out. Same layout as
    :func:`pool_gain_rows`, for :func:`pool_weight_from_gains` (which then picks the
    shrinkage ``lam`` with the highest lower confidence bound).

    Args:
        probs: ``[K, M, T, O]`` predictives (component 0 = the belief model).
        truth: ``[M, T]`` true options (``-1`` = not scored).
        direction: ``[K]`` fitted stack weights.

    Returns:
        ``(S [M', grid], n [M'])`` float64.
    """
    ok = truth >= 0
    y = truth.clamp_min(0).unsqueeze(-1)
    n = ok.sum(-1)
    rows = n > 0
    lb = probs[0].gather(-1, y).squeeze(-1).clamp_min(1e-12).log()
    direction = torch.as_tensor(direction, dtype=torch.float64)
    cols = []
    for j in range(grid):
        w = shrunk_stack_weights(direction, j / (grid - 1))
        lp = stacked_pool(probs, w).gather(-1, y).squeeze(-1).clamp_min(1e-12).log()
        d = torch.where(ok, lp - lb, torch.zeros((), dtype=lb.dtype))
        cols.append(d.sum(-1)[rows])
    return torch.stack(cols, 1).double(), n[rows].double()
