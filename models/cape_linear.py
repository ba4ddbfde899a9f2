"""``cape_linear``: a linear-Gaussian latent factor model with exact Gaussian conditioning.

CAPE's "even simple belief models (e.g. linear regression)" (docs/methods.md §2): the
coded answers of a respondent are a noisy linear function of ``d`` latent preferences.

Coding. Item ``i`` with ``O_i`` options is coded by ``O_i - 1`` indicator columns (options
``1 .. O_i - 1``; option 0 is the reference, all zeros), ``K = sum_i (O_i - 1)`` columns in
all. Dropping the reference column avoids exactly collinear columns (one-hot columns of an
item sum to one), which a diagonal-noise model would count twice.

Model (factor analysis)::

    z ~ N(0, I_d),   x = mu + W z + eps,   eps ~ N(0, diag(psi))        x: [K], W: [K, d]

so ``x ~ N(mu, Sigma)`` with ``Sigma = W W^T + diag(psi)``. Fitted offline by EM with
missing answers marginalised (an unanswered item removes its columns from that
respondent's likelihood; the E-step uses only the observed columns; Ghahramani & Hinton
1996 with the missing-data extension). ``d`` is chosen on validation log-likelihood.

Online (no retraining): observing columns ``o`` gives the exact Gaussian posterior of
``z`` in information form::

    P = I + W_o^T diag(psi_o)^-1 W_o,      h = W_o^T diag(psi_o)^-1 (x_o - mu_o),
    E[z | x_o] = P^-1 h,                  E[x_u | x_o] = mu_u + W_u P^-1 h,

which equals the Schur-complement formula ``mu_u + Sigma_uo Sigma_oo^-1 (x_o - mu_o)``
(Woodbury). An answer adds a fixed per-(item, option) block to ``(P, h)``: the state is
``P [B, d, d]`` and ``h [B, d]``, an update is one gather and add.

Calibration. The conditional mean of an item's coded columns, completed with the
reference option (``1 - sum``), is a vector ``f_i`` of "expected indicators" that can leave
``[0, 1]``. It is mapped to option probabilities by a per-item softmax calibration
``p(Y_i = k) = softmax_k(a_i f_ik + c_ik)`` (``a_i`` a temperature, ``c_i`` per-option
offsets) fitted on validation respondents' hidden answers given random halves of their
other answers (a convex problem, solved by L-BFGS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from models.base import DTYPE, ItemBank, ModelError, TooFewRespondentsError, register_model
from models.cape_common import (
    PROB_FLOOR,
    CapeModel,
    as_items,
    check_batch_update,
    check_observed,
    clamp_lookahead,
    clamp_observed,
    lookahead_shapes,
    marginal_probs,
    observation_masks,
    split_rows,
)

DIMS = (1, 2, 4, 8, 12)
PSI_FLOOR = 5e-3
EM_ITERS = 100
EM_TOL = 1e-4


@dataclass(frozen=True)
class LinearState:
    """Batched state of :class:`CapeLinear`.

    Attributes:
        observed: ``LongTensor [B, I]`` (``-1`` = not observed).
        precision: ``[B, d, d]`` posterior precision ``P`` of ``z``.
        shift: ``[B, d]`` information vector ``h`` (``E[z] = P^-1 h``).
    """

    observed: Tensor
    precision: Tensor
    shift: Tensor


@dataclass(frozen=True)
class ReferenceCoding:
    """Reference (dummy) coding: ``O_i - 1`` columns per item (option 0 = all zeros).

    Attributes:
        col_item: ``LongTensor [K]`` item of each column.
        col_option: ``LongTensor [K]`` option (``>= 1``) of each column.
        n_columns: ``K``.
    """

    col_item: Tensor
    col_option: Tensor
    n_columns: int

    @classmethod
    def from_bank(cls, bank: ItemBank) -> ReferenceCoding:
        n_cols = torch.tensor(bank.n_options, dtype=torch.long) - 1
        col_item = torch.repeat_interleave(torch.arange(bank.n_items), n_cols)
        first = torch.cumsum(n_cols, 0) - n_cols
        col_option = torch.arange(int(n_cols.sum())) - first[col_item] + 1
        return cls(col_item, col_option, int(n_cols.sum()))

    def encode(self, responses: Tensor) -> tuple[Tensor, Tensor]:
        """``(x [N, K], observed [N, K])`` of ``responses [N, I]`` (x = 0 where missing)."""
        ans = responses[:, self.col_item]
        obs = ans >= 0
        x = ((ans == self.col_option.unsqueeze(0)) & obs).to(DTYPE)
        return x, obs.to(DTYPE)


def em_factor_analysis(
    x: Tensor,
    obs: Tensor,
    d: int,
    *,
    iters: int = EM_ITERS,
    tol: float = EM_TOL,
    seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor, list[float]]:
    """Factor analysis by EM with missing columns.

    Args:
        x: ``[N, K]`` data (values where ``obs`` is 0 are ignored).
        obs: ``[N, K]`` 1 where observed.
        d: number of factors.
        iters: maximum EM iterations; tol: stop when the mean log-likelihood gains less.
        seed: seed of the initial loadings' jitter.

    Returns:
        ``(mu [K], W [K, d], psi [K], trace)`` with ``trace`` the observed-data mean
        log-likelihood per respondent before each iteration's M-step (non-decreasing).
    """
    n, k = x.shape
    cnt = obs.sum(0).clamp_min(1.0)
    mu = (x * obs).sum(0) / cnt
    xc = (x - mu) * obs
    var = (xc**2).sum(0) / cnt
    g = torch.Generator().manual_seed(seed)
    # PCA of the mean-imputed data as a start, plus a small jitter.
    u, s, vt = torch.linalg.svd(xc / math.sqrt(n), full_matrices=False)
    w = vt[:d].T * s[:d]
    if w.shape[1] < d:  # fewer respondents or columns than factors: the rest start at 0
        w = torch.cat([w, torch.zeros(k, d - w.shape[1], dtype=DTYPE)], 1)
    w = w + 0.01 * torch.randn(k, d, generator=g, dtype=DTYPE)
    psi = (var - (w**2).sum(1)).clamp_min(PSI_FLOOR).clamp_min(0.1 * var).clamp_min(PSI_FLOOR)
    trace: list[float] = []
    eye = torch.eye(d, dtype=DTYPE)
    for _ in range(iters):
        # E-step: posterior of z per respondent from its observed columns.
        a = obs / psi  # [N, K]
        ww = (w.unsqueeze(2) * w.unsqueeze(1)).reshape(k, d * d)
        prec = eye + (a @ ww).reshape(n, d, d)
        h = ((x - mu) * a) @ w  # [N, d]
        chol = torch.linalg.cholesky(prec)
        m = torch.cholesky_solve(h.unsqueeze(-1), chol).squeeze(-1)
        cov = torch.cholesky_inverse(chol)
        ll = _observed_loglik(x, obs, mu, psi, chol, h, m)
        trace.append(ll)
        if len(trace) > 1 and trace[-1] - trace[-2] < tol:
            break
        # M-step per column: regress x_k on [z, 1] with expected sufficient statistics.
        ez = torch.cat([m, torch.ones(n, 1, dtype=DTYPE)], 1)  # [N, d+1]
        ezz = torch.zeros(n, d + 1, d + 1, dtype=DTYPE)
        ezz[:, :d, :d] = cov + m.unsqueeze(2) * m.unsqueeze(1)
        ezz[:, :d, d] = m
        ezz[:, d, :d] = m
        ezz[:, d, d] = 1.0
        s_k = (obs.T @ ezz.reshape(n, -1)).reshape(k, d + 1, d + 1)
        s_k = s_k + 1e-8 * torch.eye(d + 1, dtype=DTYPE)
        r_k = (obs * x).T @ ez
        wt = torch.linalg.solve(s_k, r_k.unsqueeze(-1)).squeeze(-1)  # [K, d+1]
        w, mu = wt[:, :d], wt[:, d]
        sq = (obs * x * x).sum(0)
        psi = ((sq - (wt * r_k).sum(1)) / cnt).clamp_min(PSI_FLOOR)
    return mu, w, psi, trace


def _observed_loglik(
    x: Tensor, obs: Tensor, mu: Tensor, psi: Tensor, chol: Tensor, h: Tensor, m: Tensor
) -> float:
    """Mean over respondents of ``log N(x_o; mu_o, W_o W_o^T + diag psi_o)``.

    Determinant lemma: ``log|Sigma_oo| = log|P| + sum_o log psi``; Woodbury:
    ``r^T Sigma_oo^-1 r = sum_o r^2 / psi - h^T P^-1 h``.
    """
    r = (x - mu) * obs
    quad = (r * r / psi).sum(1) - (h * m).sum(1)
    logdet = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1) + (
        obs * torch.log(psi)
    ).sum(1)
    n_obs = obs.sum(1)
    ll = -0.5 * (quad + logdet + n_obs * math.log(2 * math.pi))
    return float(ll.mean())


@register_model
class CapeLinear(CapeModel):
    """Linear-Gaussian latent factor belief model (see the module doc).

    Args:
        item_bank: the items.
        mu: ``[K]`` column means; loadings: ``[K, d]``; psi: ``[K]`` noise variances.
        temperature: ``[I]`` calibration slopes ``a_i``; offset: ``[I, O]`` ``c_ik``.
    """

    family = "cape_linear"

    def __init__(
        self,
        item_bank: ItemBank,
        mu: Tensor,
        loadings: Tensor,
        psi: Tensor,
        temperature: Tensor,
        offset: Tensor,
    ) -> None:
        super().__init__(item_bank)
        self.coding = ReferenceCoding.from_bank(item_bank)
        k = self.coding.n_columns
        if mu.shape != (k,) or loadings.dim() != 2 or loadings.shape[0] != k or psi.shape != (k,):
            raise ModelError(
                f"cape_linear: parameters do not match the item bank's {k} coded columns"
            )
        self.mu, self.loadings, self.psi = mu.to(DTYPE), loadings.to(DTYPE), psi.to(DTYPE)
        self.temperature, self.offset = temperature.to(DTYPE), offset.to(DTYPE)
        self.d = int(loadings.shape[1])
        self._mask = item_bank.option_mask()
        # coded column of (item, option >= 1); option 0 and invalid options -> column K,
        # an appended zero column (zero loading, zero mean)
        pad = torch.full((item_bank.n_items, item_bank.max_options), k, dtype=torch.long)
        pad[self.coding.col_item, self.coding.col_option] = torch.arange(k)
        self._pad_index = pad
        self._w_ext = torch.cat([self.loadings, torch.zeros(1, self.d, dtype=DTYPE)])
        self._mu_ext = torch.cat([self.mu, torch.zeros(1, dtype=DTYPE)])
        self._tables()

    def _tables(self) -> None:
        """Per-item precision blocks ``G [I, d, d]`` and per-(item, option) shifts ``H [I, O, d]``."""
        bank, w, d = self.item_bank, self.loadings, self.d
        wp = w / self.psi.unsqueeze(1)  # [K, d]
        g = torch.zeros(bank.n_items, d, d, dtype=DTYPE)
        g.index_add_(0, self.coding.col_item, wp.unsqueeze(2) * w.unsqueeze(1))
        hh = torch.zeros(bank.n_items, bank.max_options, d, dtype=DTYPE)
        for o in range(bank.max_options):
            xo = (self.coding.col_option == o).to(DTYPE)  # coded value of option o
            contrib = wp * (xo - self.mu).unsqueeze(1)  # [K, d]
            valid = (torch.tensor(bank.n_options)[self.coding.col_item] > o).to(DTYPE)
            hh[:, o].index_add_(0, self.coding.col_item, contrib * valid.unsqueeze(1))
        self._g, self._h = g, hh

    # ----- fitting --------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        responses: Tensor,
        item_bank: ItemBank,
        *,
        validation: Tensor | None = None,
        dims: tuple[int, ...] = DIMS,
        seed: int = 0,
        iters: int = EM_ITERS,
    ) -> CapeLinear:
        """Fit by EM for each ``d`` in ``dims``; keep the best calibrated validation fit.

        Validation respondents are split in two halves: the calibration is fitted on one
        and ``d`` is scored on the other; the chosen model is then recalibrated on all
        validation respondents. Without ``validation``, 20% of ``responses`` (seeded)
        take its role and are left out of the factor fit.

        Returns:
            The model; ``metrics`` holds ``val_loglik`` per ``d`` and the chosen ``d``.
        """
        responses = item_bank.check_responses(responses)
        if validation is None:
            val_idx, fit_idx = split_rows(responses.shape[0], 0.2, seed)
            fit_rows, val_rows = responses[fit_idx], responses[val_idx]
        else:
            fit_rows, val_rows = responses, item_bank.check_responses(validation)
        if fit_rows.shape[0] < 2 or val_rows.shape[0] < 2:
            raise TooFewRespondentsError(
                "cape_linear needs at least 2 training and 2 validation respondents"
            )
        coding = ReferenceCoding.from_bank(item_bank)
        x, obs = coding.encode(fit_rows)
        half_a, half_b = split_rows(val_rows.shape[0], 0.5, seed + 1)
        marg = marginal_probs(item_bank, fit_rows)
        scores: dict[int, float] = {}
        fitted: dict[int, tuple[Tensor, Tensor, Tensor, list[float]]] = {}
        for d in dims:
            mu, w, psi, trace = em_factor_analysis(x, obs, d, iters=iters, seed=seed)
            fitted[d] = (mu, w, psi, trace)
            model = cls._calibrated(item_bank, mu, w, psi, val_rows[half_a], marg, seed)
            scores[d] = model._score(val_rows[half_b], seed)
        best = max(scores, key=lambda k: scores[k])
        mu, w, psi, trace = fitted[best]
        model = cls._calibrated(item_bank, mu, w, psi, val_rows, marg, seed)
        model.metrics = {
            "val_loglik": scores[best],
            "d": best,
            "by_d": {str(d): v for d, v in scores.items()},
            "em_loglik": trace[-1],
            "em_iters": len(trace),
        }
        return model

    @classmethod
    def _calibrated(
        cls,
        bank: ItemBank,
        mu: Tensor,
        w: Tensor,
        psi: Tensor,
        rows: Tensor,
        marg: Tensor,
        seed: int,
    ) -> CapeLinear:
        """The model with ``(a, c)`` fitted on ``rows``' hidden answers (2 random masks)."""
        temperature = torch.zeros(bank.n_items, dtype=DTYPE)
        offset = torch.log(marg.clamp_min(PROB_FLOOR))
        model = cls(bank, mu, w, psi, temperature, offset)
        feats, items, truth = [], [], []
        for m in range(2):
            observed = observation_masks(rows, 0.5, seed + 100 + m)
            hidden = (rows >= 0) & (observed < 0)
            f = model._features(model.initial_batch(observed), torch.arange(bank.n_items))
            r, i = hidden.nonzero(as_tuple=True)
            feats.append(f[r, i])
            items.append(i)
            truth.append(rows[r, i])
        f_all, i_all, y_all = torch.cat(feats), torch.cat(items), torch.cat(truth)
        mask = bank.option_mask()[i_all]
        a = torch.zeros(bank.n_items, dtype=DTYPE, requires_grad=True)
        c = offset.clone().requires_grad_(True)
        opt = torch.optim.LBFGS([a, c], lr=1.0, max_iter=60, line_search_fn="strong_wolfe")

        def closure() -> Tensor:
            opt.zero_grad()
            logits = a[i_all].unsqueeze(1) * f_all + c[i_all]
            logits = logits.masked_fill(~mask, -math.inf)
            loss = -torch.log_softmax(logits, -1).gather(1, y_all.unsqueeze(1)).mean()
            loss = loss + 1e-4 * (a**2).sum() / bank.n_items
            loss.backward()
            return loss

        if y_all.numel():
            opt.step(closure)
        masked_c = torch.where(bank.option_mask(), c.detach(), torch.zeros((), dtype=DTYPE))
        return cls(bank, mu, w, psi, a.detach(), masked_c)

    def _score(self, rows: Tensor, seed: int) -> float:
        """Mean log-likelihood of ``rows``' hidden answers given random halves (2 masks)."""
        total, count = 0.0, 0
        items = torch.arange(self.item_bank.n_items)
        for m in range(2):
            observed = observation_masks(rows, 0.5, seed + 200 + m)
            hidden = (rows >= 0) & (observed < 0)
            pred = self.predict_batch(self.initial_batch(observed), items)
            p = pred.gather(2, rows.clamp_min(0).unsqueeze(-1)).squeeze(-1)
            total += float(torch.log(p.clamp_min(PROB_FLOOR))[hidden].sum())
            count += int(hidden.sum())
        return total / max(count, 1)

    # ----- Gaussian conditioning --------------------------------------------------------
    def joint_covariance(self) -> Tensor:
        """``Sigma = W W^T + diag(psi)`` ``[K, K]`` of the coded columns."""
        return self.loadings @ self.loadings.T + torch.diag(self.psi)

    def posterior_z(self, state: LinearState) -> tuple[Tensor, Tensor]:
        """``(E[z | x_o] [B, d], Cov[z | x_o] [B, d, d])``."""
        chol = torch.linalg.cholesky(state.precision)
        mean = torch.cholesky_solve(state.shift.unsqueeze(-1), chol).squeeze(-1)
        return mean, torch.cholesky_inverse(chol)

    def coded_moments(self, state: LinearState) -> tuple[Tensor, Tensor]:
        """Conditional mean ``[B, K]`` and covariance ``[B, K, K]`` of all coded columns.

        ``E[x | x_o] = mu + W E[z|x_o]``, ``Cov[x | x_o] = W Cov[z|x_o] W^T + diag(psi)`` (for
        the unobserved columns; observed columns are known exactly in truth).
        """
        mean, cov = self.posterior_z(state)
        x_mean = self.mu + mean @ self.loadings.T
        x_cov = self.loadings @ cov @ self.loadings.T + torch.diag(self.psi)
        return x_mean, x_cov

    def _features(self, state: LinearState, items: Tensor) -> Tensor:
        """Expected indicators ``f [B, n, O]`` of ``items`` (option 0 = ``1 - sum``)."""
        mean, _ = self.posterior_z(state)
        return self._features_from_z(mean, items)

    def _features_from_z(self, z_mean: Tensor, items: Tensor) -> Tensor:
        """``f [..., n, O]`` from posterior means ``z_mean [..., d]``."""
        idx = self._pad_index[items]  # [n, O], K = the zero column
        w = self._w_ext[idx]  # [n, O, d]
        f = self._mu_ext[idx] + torch.einsum("...d,nod->...no", z_mean, w)
        f[..., 0] = 1.0 - f[..., 1:].sum(-1)
        return f

    def _calibrate(self, feats: Tensor, items: Tensor) -> Tensor:
        """``softmax_k(a_i f_ik + c_ik)`` over valid options: ``[..., n, O]``."""
        mask = self._mask[items]
        logits = self.temperature[items].unsqueeze(-1) * feats + self.offset[items]
        logits = logits.masked_fill(~mask, -math.inf)
        p = torch.softmax(logits, -1)
        p = torch.where(mask, p.clamp_min(PROB_FLOOR), torch.zeros((), dtype=DTYPE))
        return p / p.sum(-1, keepdim=True)

    # ----- batched online inference ----------------------------------------------------
    def initial_batch(self, observed: Tensor) -> LinearState:
        """``P = I + sum G_i``, ``h = sum H[i, y_i]`` over each respondent's observed items."""
        observed = check_observed(self.item_bank, observed)
        b = observed.shape[0]
        answered = (observed >= 0).to(DTYPE)
        g = self._g.reshape(self.item_bank.n_items, -1)
        prec = torch.eye(self.d, dtype=DTYPE) + (answered @ g).reshape(b, self.d, self.d)
        rows, items = (observed >= 0).nonzero(as_tuple=True)
        shift = torch.zeros(b, self.d, dtype=DTYPE)
        shift.index_add_(0, rows, self._h[items, observed[rows, items]])
        return LinearState(observed, prec, shift)

    def update_batch(self, state: LinearState, items: Tensor, options: Tensor) -> LinearState:
        """Add ``G_item`` and ``H[item, option]`` (``option == -1``: no change)."""
        items, options, active = check_batch_update(self.item_bank, state.observed, items, options)
        w = active.to(DTYPE)
        observed = state.observed.clone()
        rows = active.nonzero(as_tuple=True)[0]
        observed[rows, items[rows]] = options[rows]
        return LinearState(
            observed,
            state.precision + w[:, None, None] * self._g[items],
            state.shift + w[:, None] * self._h[items, options.clamp_min(0)],
        )

    def predict_batch(self, state: LinearState, items: Tensor | Any) -> Tensor:
        """Calibrated predictive ``[B, n, O]``; observed items one-hot."""
        items = as_items(self.item_bank, items)
        pred = self._calibrate(self._features(state, items), items)
        return clamp_observed(pred, state.observed, items)

    def lookahead_batch(
        self, state: LinearState, candidates: Tensor | Any, targets: Tensor | Any
    ) -> tuple[Tensor, Tensor]:
        """``p_x [B, C, O]``, ``p_t [B, C, O, T, O]``: per candidate one Cholesky of
        ``P + G_x`` (the same for all its options), then ``E[z] = (P + G_x)^-1 (h + H[x, k])``."""
        cand, tgt, cmask = lookahead_shapes(self.item_bank, candidates, targets)
        o_max = self.item_bank.max_options
        p_x = self.predict_batch(state, cand)
        base = self.predict_batch(state, tgt)
        b, c = state.shift.shape[0], cand.numel()
        p_t = base[:, None, None].expand(b, c, o_max, *base.shape[1:]).clone()
        if c == 0:
            return p_x, p_t
        oc = int(cmask.sum(1).max())
        chol = torch.linalg.cholesky(state.precision[:, None] + self._g[cand])  # [B, C, d, d]
        h = state.shift[:, None, None, :] + self._h[cand, :oc]  # [B, C, oc, d]
        z = torch.cholesky_solve(h.transpose(-1, -2), chol).transpose(-1, -2)  # [B, C, oc, d]
        pred = self._calibrate(self._features_from_z(z, tgt), tgt)  # [B, C, oc, T, O]
        pred = clamp_lookahead(pred, state.observed, cand, tgt)
        valid = cmask[:, :oc]
        p_t[:, :, :oc] = torch.where(valid[None, :, :, None, None], pred, p_t[:, :, :oc])
        return p_x, p_t

    # ----- serialisation ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "item_bank": self.item_bank.to_dict(),
            "mu": self.mu.clone(),
            "loadings": self.loadings.clone(),
            "psi": self.psi.clone(),
            "temperature": self.temperature.clone(),
            "offset": self.offset.clone(),
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> CapeLinear:
        return cls(
            ItemBank.from_dict(d["item_bank"]),
            d["mu"],
            d["loadings"],
            d["psi"],
            d["temperature"],
            d["offset"],
        )


__all__ = ["CapeLinear", "LinearState", "ReferenceCoding", "em_factor_analysis"]
