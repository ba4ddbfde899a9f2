"""IRT baseline: the 1-D graded response model, calibrated by marginal maximum likelihood.

Graded response model (Samejima 1969, docs/methods.md [4]), slope-intercept form. For
item ``i`` with ``O_i`` options in scale order and ability ``θ ~ N(0, 1)``:

    P(Y_i >= k | θ) = σ(a_i θ − c_ik),   k = 1 .. O_i − 1,   c_i1 < c_i2 < ...
    P(Y_i = k | θ)  = P(Y_i >= k | θ) − P(Y_i >= k + 1 | θ)

(``P(Y >= 0) = 1``, ``P(Y >= O_i) = 0``). The usual thresholds are ``b_ik = c_ik / a_i``.
The slope ``a_i`` may be negative (an item whose options run against the trait), which is
why the intercepts rather than the thresholds are kept ordered. **Nominal items are
treated as ordered** in their codebook order: the model cannot represent a non-monotone
option order, which is one reason it is a baseline.

θ is discretised on a fixed grid of ``Q`` points on ``[−R, R]`` with weights proportional
to the standard normal density, so the online posterior over θ is a persona mixture with
one "persona" per grid point (``μ[q, i, k] = P(Y_i = k | θ_q)``, prior the normal weights):
all of :class:`~models.persona.PersonaMixture`'s closed-form machinery (update, predict,
lookahead, batches) applies unchanged.

Calibration is marginal maximum likelihood by EM (Bock & Aitkin 1981): the E-step gives
each respondent's posterior over the grid, ``r[i, k, q] = Σ_u p(θ_q | y_u) 1[y_ui = k]``;
the M-step maximises ``Σ_{i,k,q} r[i, k, q] log P(Y_i = k | θ_q) − Σ_i a_i² / (2 s²)`` by a
few L-BFGS steps in torch (the small Gaussian penalty on slopes, ``s`` =
``slope_prior_sd``, keeps near-deterministic items finite). Category probabilities are
computed in log space as
``log P_k = log σ(z_k) + log σ(−z_{k+1}) + log(1 − exp(z_{k+1} − z_k))`` with
``z_k = a θ − c_k``, which is stable in the tails.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from models.base import (
    DTYPE,
    ItemBank,
    ModelError,
    ShapeError,
    register_model,
    responses_hash,
)
from models.latent_class import _Encoded
from models.persona import DEFAULT_FLOOR, PersonaBatchState, PersonaMixture, PersonaState

DEFAULT_POINTS = 61
DEFAULT_RANGE = 5.0


def normal_grid(
    n_points: int = DEFAULT_POINTS, grid_max: float = DEFAULT_RANGE
) -> tuple[Tensor, Tensor]:
    """``(grid [Q], log_weights [Q])``: equally spaced points on ``[−R, R]``, N(0, 1) weights."""
    if n_points < 2 or grid_max <= 0:
        raise ModelError(f"need n_points >= 2 and grid_max > 0, got {n_points}, {grid_max}")
    grid = torch.linspace(-grid_max, grid_max, n_points, dtype=DTYPE)
    logw = -0.5 * grid**2
    return grid, logw - torch.logsumexp(logw, 0)


def _threshold_mask(item_bank: ItemBank) -> Tensor:
    """Bool ``[I, O − 1]``: intercept ``j`` (for ``P(Y >= j + 1)``) exists for item ``i``."""
    o = max(item_bank.max_options - 1, 1)
    return torch.arange(o).unsqueeze(0) < (torch.tensor(item_bank.n_options) - 1).unsqueeze(1)


def grm_log_probs(slopes: Tensor, intercepts: Tensor, grid: Tensor, item_bank: ItemBank) -> Tensor:
    """``log P(Y_i = k | θ_q)`` as ``[I, O, Q]`` (``−inf`` beyond each item's options).

    Args:
        slopes: ``a [I]``.
        intercepts: ``c [I, O − 1]``, strictly increasing along the valid entries of each row
            (entries beyond ``O_i − 1`` are ignored).
        grid: ``θ [Q]``.

    Differentiable in ``slopes`` and ``intercepts``. Uses
    ``log P_k = log σ(z_k) + log σ(−z_{k+1}) + log(−expm1(z_{k+1} − z_k))`` with
    ``z_0 = +∞``, ``z_{O_i} = −∞`` (the missing terms are 0).
    """
    i_n, o_n = item_bank.n_items, item_bank.max_options
    q_n = grid.shape[0]
    thr = _threshold_mask(item_bank)[:, : o_n - 1]  # [I, O-1]
    zero = torch.zeros((), dtype=DTYPE)
    if o_n == 1:
        return torch.zeros(i_n, 1, q_n, dtype=DTYPE)
    z = slopes.view(i_n, 1, 1) * grid.view(1, 1, q_n) - intercepts[:, : o_n - 1].unsqueeze(2)
    m = thr.unsqueeze(2)  # [I, O-1, 1]
    up = torch.where(m, F.logsigmoid(z), zero)  # log σ(z_j), j = 1..O-1
    down = torch.where(m, F.logsigmoid(-z), zero)  # log σ(−z_j)
    pad = torch.zeros(i_n, 1, q_n, dtype=DTYPE)
    a_term = torch.cat([pad, up], dim=1)  # [I, O, Q]: log σ(z_k), 0 for k = 0
    b_term = torch.cat([down, pad], dim=1)  # log σ(−z_{k+1}), 0 for the top category
    gap = intercepts[:, 1 : o_n - 1] - intercepts[:, : o_n - 2]  # c_{k+1} − c_k, [I, O-2]
    both = thr[:, 1:] & thr[:, :-1]  # both intercepts exist
    safe_gap = torch.where(both, gap, torch.ones((), dtype=DTYPE))
    g_term = torch.where(both, torch.log(-torch.expm1(-safe_gap)), zero)  # [I, O-2]
    g_full = torch.cat(
        [torch.zeros(i_n, 1, dtype=DTYPE), g_term, torch.zeros(i_n, 1, dtype=DTYPE)], 1
    )
    logp = a_term + b_term + g_full.unsqueeze(2)
    valid = item_bank.option_mask().unsqueeze(2)
    return torch.where(valid, logp, torch.full((), -math.inf, dtype=DTYPE))


def _check_params(slopes: Tensor, intercepts: Tensor, item_bank: ItemBank) -> tuple[Tensor, Tensor]:
    i_n, o_n = item_bank.n_items, item_bank.max_options
    slopes = torch.as_tensor(slopes).to(DTYPE)
    intercepts = torch.as_tensor(intercepts).to(DTYPE)
    if slopes.shape != (i_n,):
        raise ShapeError(f"slopes must have shape [{i_n}], got {list(slopes.shape)}")
    if intercepts.shape != (i_n, max(o_n - 1, 1)):
        raise ShapeError(
            f"intercepts must have shape [{i_n}, {max(o_n - 1, 1)}], got {list(intercepts.shape)}"
        )
    thr = _threshold_mask(item_bank)
    intercepts = torch.where(thr, intercepts, torch.zeros((), dtype=DTYPE))
    if not bool(torch.isfinite(slopes).all()) or not bool(torch.isfinite(intercepts).all()):
        raise ModelError("GRM parameters must be finite")
    if o_n > 2:
        bad = (thr[:, 1:] & thr[:, :-1]) & (intercepts[:, 1:] <= intercepts[:, :-1])
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ModelError(
                f"intercepts of item {item_bank.keys[i]!r} are not strictly increasing"
            )
    return slopes, intercepts


@register_model
class GradedResponseModel(PersonaMixture):
    """A calibrated 1-D GRM; its online state is the posterior over a θ grid.

    Args:
        item_bank: the items (options in scale order; nominal items are treated as ordered).
        slopes: ``a [I]``.
        intercepts: ``c [I, O − 1]`` (strictly increasing per item; unused entries ignored).
        n_points, grid_max: the θ grid (``Q`` points on ``[−R, R]``, N(0, 1) weights).

    States are :class:`~models.persona.PersonaState` over the ``Q`` grid points, so every
    persona-mixture method (``update``, ``predict``, ``lookahead``, batches) applies.
    """

    family = "irt_grm"

    def __init__(
        self,
        item_bank: ItemBank,
        slopes: Tensor,
        intercepts: Tensor,
        *,
        n_points: int = DEFAULT_POINTS,
        grid_max: float = DEFAULT_RANGE,
        floor: float = DEFAULT_FLOOR,
    ) -> None:
        slopes, intercepts = _check_params(slopes, intercepts, item_bank)
        grid, log_w = normal_grid(n_points, grid_max)
        logp = grm_log_probs(slopes, intercepts, grid, item_bank)  # [I, O, Q]
        mu = logp.exp().permute(2, 0, 1).contiguous()  # [Q, I, O]
        mu = mu / mu.sum(-1, keepdim=True)  # exact rows despite rounding
        super().__init__(item_bank, mu, log_w, floor=floor)
        self.slopes = slopes
        self.intercepts = intercepts
        self.grid = grid
        self.n_points = int(n_points)
        self.grid_max = float(grid_max)

    def with_prior(self, log_prior: Tensor) -> PersonaMixture:
        """Not supported: the GRM's prior over θ is the N(0, 1) grid weight by definition."""
        raise ModelError(
            "a graded response model's prior is N(0, 1) on its grid; it cannot be replaced"
        )

    @property
    def thresholds(self) -> Tensor:
        """``b [I, O − 1] = c / a`` (NaN beyond each item's thresholds or where ``a = 0``)."""
        b = self.intercepts / self.slopes.unsqueeze(1)
        return torch.where(
            _threshold_mask(self.item_bank), b, torch.full((), math.nan, dtype=DTYPE)
        )

    # ----- θ posterior ---------------------------------------------------------
    def theta_posterior(self, state: PersonaState) -> tuple[Tensor, Tensor]:
        """``(grid [Q], weights [Q])``: the posterior over θ on the grid."""
        return self.grid, self.latent_posterior(state)

    def theta_posterior_batch(self, state: PersonaBatchState) -> tuple[Tensor, Tensor]:
        """``(grid [Q], weights [B, Q])``."""
        return self.grid, self.latent_posterior_batch(state)

    def theta_mean_var(self, state: PersonaState) -> tuple[float, float]:
        """Posterior mean and variance of θ."""
        w = self.latent_posterior(state)
        mean = float(w @ self.grid)
        return mean, float(w @ (self.grid - mean) ** 2)

    def _epv(self, w: Tensor, cand: Tensor) -> Tensor:
        """Expected posterior variance for ``w [B, Q]``: ``[B, C]``.

        ``EPV(x) = Σ_k p(Y_x = k | h) Var(θ | h, Y_x = k)`` where the posterior after the
        answer uses the update likelihood ``max(μ, floor)`` (exactly what :meth:`update`
        does) and ``p(Y_x = k | h)`` the predictive.
        """
        c_n, o_n = int(cand.numel()), self.item_bank.max_options
        lik = self.lik_k[:, cand].reshape(self.n_personas, c_n * o_n)  # [Q, C*O]
        mu = self.mu[:, cand].reshape(self.n_personas, c_n * o_n)
        p_x = w @ mu  # [B, C*O]
        m0 = w @ lik
        m1 = (w * self.grid) @ lik
        m2 = (w * self.grid**2) @ lik
        pos = m0 > 0
        safe = torch.where(pos, m0, torch.ones((), dtype=DTYPE))
        var = torch.where(pos, m2 / safe - (m1 / safe) ** 2, torch.zeros((), dtype=DTYPE))
        return (p_x * var.clamp_min(0)).reshape(-1, c_n, o_n).sum(-1)

    def expected_posterior_variance(
        self, state: PersonaState, candidates: Sequence[int] | Tensor
    ) -> Tensor:
        """``[C]``: expected posterior variance of θ after answering each candidate."""
        self._check_state(state)
        cand = self._items(candidates)
        return self._epv(state.log_post.exp().unsqueeze(0), cand)[0]

    def expected_posterior_variance_batch(
        self, state: PersonaBatchState, candidates: Sequence[int] | Tensor
    ) -> Tensor:
        """``[B, C]``: batched :meth:`expected_posterior_variance`."""
        self._check_batch(state)
        return self._epv(state.log_post.exp(), self._items(candidates))

    def item_information(
        self, theta: Tensor | float, items: Sequence[int] | Tensor | None = None
    ) -> Tensor:
        """Fisher information ``I_i(θ) = Σ_k P'_ik(θ)² / P_ik(θ)``: ``[n_theta, n_items]``.

        With ``P*_k = σ(a θ − c_k)``, ``P*'_k = a P*_k (1 − P*_k)`` and
        ``P'_k = P*'_k − P*'_{k+1}`` (Samejima 1969, docs/methods.md [4]).
        """
        idx = self._items(items)
        th = torch.as_tensor(theta, dtype=DTYPE).reshape(-1)
        a = self.slopes[idx].view(1, -1, 1)
        c = self.intercepts[idx].unsqueeze(0)  # [1, n, O-1]
        thr = _threshold_mask(self.item_bank)[idx].unsqueeze(0)
        ps = torch.where(
            thr, torch.sigmoid(a * th.view(-1, 1, 1) - c), torch.zeros((), dtype=DTYPE)
        )
        dps = a * ps * (1 - ps)
        n_t, n_i = th.shape[0], idx.shape[0]
        ones, zeros = torch.ones(n_t, n_i, 1, dtype=DTYPE), torch.zeros(n_t, n_i, 1, dtype=DTYPE)
        p_full = torch.cat([ones, ps, zeros], -1)
        d_full = torch.cat([zeros, dps, zeros], -1)
        p = p_full[..., :-1] - p_full[..., 1:]  # [n_t, n, O]
        dp = d_full[..., :-1] - d_full[..., 1:]
        valid = self.item_bank.option_mask()[idx].unsqueeze(0) & (p > 0)
        terms = torch.where(
            valid,
            dp**2 / torch.where(valid, p, torch.ones((), dtype=DTYPE)),
            torch.zeros((), dtype=DTYPE),
        )
        return terms.sum(-1)

    def information_at_posterior_mean(
        self, state: PersonaState, candidates: Sequence[int] | Tensor
    ) -> Tensor:
        """``[C]``: Fisher information of each candidate at the posterior mean of θ."""
        mean, _ = self.theta_mean_var(state)
        return self.item_information(mean, candidates)[0]

    # ----- serialisation -------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "item_bank": self.item_bank.to_dict(),
            "slopes": self.slopes.clone(),
            "intercepts": self.intercepts.clone(),
            "n_points": self.n_points,
            "grid_max": self.grid_max,
            "floor": self.floor,
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> GradedResponseModel:
        return cls(
            ItemBank.from_dict(d["item_bank"]),
            d["slopes"],
            d["intercepts"],
            n_points=int(d["n_points"]),
            grid_max=float(d["grid_max"]),
            floor=float(d.get("floor", DEFAULT_FLOOR)),
        )


# ---------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------


def _initial_params(y: Tensor, item_bank: ItemBank) -> tuple[Tensor, Tensor]:
    """Slopes ``±1`` (sign of the first principal component of the item scores) and
    intercepts ``c_k = −logit P̂(Y >= k)`` from the marginals, as unconstrained
    ``(a [I], raw [I, O − 1])`` with ``raw[:, 0] = c_1`` and ``raw[:, j] = log(c_{j+1} − c_j)``.
    """
    i_n, o_n = item_bank.n_items, item_bank.max_options
    obs = y >= 0
    score = torch.where(obs, y, torch.zeros((), dtype=torch.long)).to(DTYPE)
    n_obs = obs.sum(0).clamp_min(1).to(DTYPE)
    mean = score.sum(0) / n_obs
    x = torch.where(obs, score - mean, torch.zeros((), dtype=DTYPE))
    sd = ((x**2).sum(0) / n_obs).sqrt().clamp_min(1e-6)
    x = x / sd
    if i_n > 1:
        _, _, v = torch.linalg.svd(x, full_matrices=False)
        pc = v[0]
        if float(pc.sum()) < 0:
            pc = -pc
        a = torch.where(pc < 0, -torch.ones(i_n, dtype=DTYPE), torch.ones(i_n, dtype=DTYPE))
    else:
        a = torch.ones(i_n, dtype=DTYPE)
    raw = torch.zeros(i_n, max(o_n - 1, 1), dtype=DTYPE)
    for i, o in enumerate(item_bank.n_options):
        col = y[obs[:, i], i]
        n = max(int(col.numel()), 1)
        prev = None
        for k in range(1, o):
            p = (float((col >= k).sum()) + 0.5) / (n + 1.0)
            c = -math.log(p / (1 - p))
            if prev is None:
                raw[i, 0] = c
            else:
                raw[i, k - 1] = math.log(max(c - prev, 1e-2))
                c = prev + max(c - prev, 1e-2)
            prev = c
    return a, raw


def _intercepts_from_raw(raw: Tensor) -> Tensor:
    """``c_1 = raw_0``, ``c_{j+1} = c_j + exp(raw_j)`` (strictly increasing)."""
    if raw.shape[1] == 1:
        return raw
    return torch.cat([raw[:, :1], raw[:, :1] + torch.cumsum(raw[:, 1:].exp(), dim=1)], dim=1)


def _m_step_optimizer(params: list[Tensor], m_steps: int) -> torch.optim.LBFGS:
    """L-BFGS with a strong-Wolfe line search, ``m_steps`` iterations per M-step."""
    return torch.optim.LBFGS(
        params,
        lr=1.0,
        max_iter=m_steps,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-10,
        tolerance_change=1e-14,
        history_size=20,
    )


def _oriented_model(
    item_bank: ItemBank,
    a: Tensor,
    raw: Tensor,
    y: Tensor,
    val_responses: Tensor | None,
    trace: list[float],
    converged: bool,
    n_points: int,
    grid_max: float,
    slope_prior_sd: float,
) -> GradedResponseModel:
    """The fitted :class:`GradedResponseModel` with ``sum_i a_i >= 0`` and the
    ``metrics`` of :func:`fit_grm`, from the fitted slopes ``a`` and raw intercepts
    ``raw`` (training data ``y [N, I]``)."""
    with torch.no_grad():
        slopes = a.detach().clone()
        intercepts = _intercepts_from_raw(raw.detach())
    if float(slopes.sum()) < 0:  # θ -> −θ leaves the model unchanged (symmetric prior)
        slopes = -slopes
    model = GradedResponseModel(item_bank, slopes, intercepts, n_points=n_points, grid_max=grid_max)
    model.training_hash = responses_hash(y, item_bank)
    metrics: dict[str, object] = {
        "model": "irt_grm",
        "train_trace": trace,
        "train_log_lik": float(model.log_marginal(y).mean()),
        "iterations": len(trace),
        "converged": converged,
        "n_points": n_points,
        "slope_prior_sd": slope_prior_sd,
    }
    if val_responses is not None and len(val_responses):
        metrics["val_log_lik"] = float(model.log_marginal(val_responses).mean())
    model.metrics = metrics
    return model


def fit_grm(
    responses: Tensor,
    item_bank: ItemBank,
    *,
    val_responses: Tensor | None = None,
    n_points: int = DEFAULT_POINTS,
    grid_max: float = DEFAULT_RANGE,
    max_iter: int = 200,
    tol: float = 1e-6,
    m_steps: int = 5,
    slope_prior_sd: float = 2.5,
    seed: int = 0,
) -> GradedResponseModel:
    """Calibrate a 1-D GRM by marginal maximum likelihood (EM over a θ grid).

    Args:
        responses: ``LongTensor [N, I]`` (``-1`` = missing; missing answers drop out).
        item_bank: the items (attributes are items too).
        val_responses: optional validation users; their mean log-likelihood is recorded.
        n_points, grid_max: the quadrature grid.
        max_iter: EM iterations at most; ``tol``: stop when the penalised mean
            log-likelihood improves by less than this.
        m_steps: L-BFGS iterations per M-step.
        slope_prior_sd: ``s`` of the ``N(0, s²)`` penalty on each slope.
        seed: unused by the deterministic initialisation; kept for a uniform signature.

    Returns:
        The fitted :class:`GradedResponseModel`, oriented so that ``Σ_i a_i >= 0``, with
        ``metrics``: ``train_trace`` (penalised mean log-likelihood per EM iteration,
        non-decreasing), ``train_log_lik``, ``val_log_lik`` (if validation data),
        ``iterations``, ``converged``.
    """
    del seed
    y = item_bank.check_responses(responses)
    if y.shape[0] == 0:
        raise ShapeError("responses has no rows")
    enc = _Encoded(y, item_bank)
    grid, log_w = normal_grid(n_points, grid_max)
    i_n, o_n = item_bank.n_items, item_bank.max_options
    valid = item_bank.option_mask().unsqueeze(2)  # [I, O, 1]
    a0, raw0 = _initial_params(y, item_bank)
    a = a0.clone().requires_grad_(True)
    raw = raw0.clone().requires_grad_(True)
    n = enc.n

    def log_probs() -> Tensor:
        return grm_log_probs(a, _intercepts_from_raw(raw), grid, item_bank)

    def penalty() -> Tensor:
        return (a**2).sum() / (2 * slope_prior_sd**2)

    def e_step() -> tuple[float, Tensor]:
        with torch.no_grad():
            logp = torch.where(valid, log_probs(), torch.zeros((), dtype=DTYPE))  # [I, O, Q]
            joint = enc.y @ logp.reshape(i_n * o_n, -1) + log_w  # [N, Q]
            log_z = torch.logsumexp(joint, dim=1, keepdim=True)
            obj = (float(log_z.sum()) - float(penalty())) / n
            post = (joint - log_z).exp()
            counts = (enc.yt @ post).reshape(i_n, o_n, -1)  # r[i, k, q]
        return obj, counts

    opt = _m_step_optimizer([a, raw], m_steps)
    trace: list[float] = []
    converged = False
    for _ in range(max_iter):
        obj, counts = e_step()
        trace.append(obj)
        if len(trace) > 1 and trace[-1] - trace[-2] < tol:
            converged = True
            break

        def closure(counts: Tensor = counts) -> Tensor:
            opt.zero_grad()
            lp = torch.where(valid, log_probs(), torch.zeros((), dtype=DTYPE))
            loss = -((counts * lp).sum() - penalty()) / n
            loss.backward()
            return loss

        opt.step(closure)
        opt.state.clear()  # the expected counts change: start each M-step afresh
    else:
        trace.append(e_step()[0])
    return _oriented_model(
        item_bank,
        a,
        raw,
        y,
        val_responses,
        trace,
        converged,
        n_points,
        grid_max,
        slope_prior_sd,
    )
