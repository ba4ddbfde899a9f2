"""A stacked mixture of belief models: ``auto``'s model (model choice).

Several fitted belief models over the same item bank (latent classes, the CAPE world
models...) are combined into one predictive distribution

    p(Y_t = j | h) = sum_m w_m(h) p_m(Y_t = j | h),
    w(h) = softmax_m( theta[min(n, K), m] + gamma[min(n, K)] * L_m(h) ),

where ``n`` is the number of questions answered online (attributes given at the start do
not count), ``theta [K + 1, M]`` are stacking log-weights per number of answers,
``L_m(h) = sum_{answers} log p_m(y_step | h_{<step})`` is component ``m``'s sequential
log-likelihood of this respondent's own answers, and ``gamma[n] >= 0`` tempers that
evidence (``gamma = 0``: pure stacking, the weights depend only on ``n``; ``gamma = 1``:
Bayesian model averaging with the prior ``softmax(theta[n])``). ``theta`` and ``gamma``
are fitted on validation respondents (:func:`fit_stacking`), never on the respondents
scored.

Why a mixture and not the single best model: the log loss of a mixture is at most the
weighted average of its components' log losses (Jensen), and the stacking weights are
chosen to minimise the validation target log loss, so on validation the mixture is at
least as good as every single candidate at every ``n`` (a vertex of the simplex is a
feasible choice); in practice the components' errors are partly independent and the
mixture is better than each.

Online updates never touch a component's fitted parameters: each component updates its
own state, and the mixture adds ``log p_m(answer)`` to ``L``. Lookahead is exact for the
mixture: ``p(Y_x = k) = sum_m w_m p_m(Y_x = k)`` and after ``Y_x = k`` the target
predictive is ``sum_m w'_m(k) p_m(Y_t | h, Y_x = k)`` with
``w'(k) = softmax(theta[n + 1] + gamma[n + 1] (L + log p_m(Y_x = k)))``.

Pure numerics: no web framework, database or settings imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from models.base import (
    DTYPE,
    BeliefModel,
    ItemBank,
    ModelError,
    ShapeError,
    load_model,
    register_model,
)
from models.cape_common import (
    CapeModel,
    as_items,
    check_batch_update,
    check_observed,
    clamp_lookahead,
    clamp_observed,
    lookahead_shapes,
)

LOG_FLOOR = 1e-30
"""Probability floor before a log (a component giving an answer probability 0)."""


@dataclass(frozen=True)
class MixtureState:
    """Batched state of :class:`StackedMixture`.

    Attributes:
        observed: ``LongTensor [B, I]`` (``-1`` = not observed).
        components: one batched state per component.
        n_answers: ``LongTensor [B]`` questions answered online.
        loglik: ``[B, M]`` each component's log-likelihood of those answers.
    """

    observed: Tensor
    components: tuple[Any, ...]
    n_answers: Tensor
    loglik: Tensor


@register_model
class StackedMixture(CapeModel):
    """Mixture of belief models with stacking weights per number of answers.

    Args:
        item_bank: shared by all components.
        components: ``M`` fitted belief models with batched methods.
        names: one label per component (e.g. ``"latent_classes"``).
        log_weights: ``theta [K + 1, M]`` (row ``n`` is used after ``n`` answers; rows
            beyond ``K`` reuse row ``K``); normalised by softmax, so any real values.
        gamma: evidence temperatures ``[K + 1]`` (or one float for every ``n``), ``>= 0``.
    """

    family = "stacked_mixture"

    def __init__(
        self,
        item_bank: ItemBank,
        components: Sequence[BeliefModel],
        names: Sequence[str],
        log_weights: Tensor,
        gamma: float | Tensor = 0.0,
    ) -> None:
        super().__init__(item_bank)
        comps = list(components)
        if not comps:
            raise ModelError("stacked_mixture needs at least one component")
        if len(names) != len(comps):
            raise ShapeError(f"{len(names)} names for {len(comps)} components")
        for name, c in zip(names, comps, strict=True):
            if c.item_bank.to_dict() != item_bank.to_dict():
                raise ModelError(f"component {name!r} has a different item bank")
        lw = torch.as_tensor(log_weights, dtype=DTYPE)
        if lw.dim() != 2 or lw.shape[1] != len(comps) or lw.shape[0] < 1:
            raise ShapeError(
                f"log_weights must have shape [K + 1, {len(comps)}], got {list(lw.shape)}"
            )
        if not bool(torch.isfinite(lw).all()):
            raise ModelError("log_weights must be finite")
        g = torch.as_tensor(gamma, dtype=DTYPE).reshape(-1)
        if g.numel() == 1:
            g = g.expand(lw.shape[0]).clone()
        if g.shape != (lw.shape[0],):
            raise ShapeError(f"gamma must be one value or [{lw.shape[0]}], got {list(g.shape)}")
        if not bool((g >= 0).all()) or not bool(torch.isfinite(g).all()):
            raise ModelError(f"gamma must be finite and >= 0, got {g.tolist()}")
        self.components = comps
        self.names = [str(n) for n in names]
        self.log_weights = lw
        self.gamma = g
        self._mask = item_bank.option_mask()

    @property
    def n_components(self) -> int:
        return len(self.components)

    def logits(self, n_answers: Tensor, loglik: Tensor) -> Tensor:
        """``theta[min(n, K)] + gamma[min(n, K)] * L`` ``[B, M]``."""
        idx = n_answers.clamp(0, self.log_weights.shape[0] - 1)
        return self.log_weights[idx] + self.gamma[idx].unsqueeze(-1) * loglik

    def mixture_weights(self, state: MixtureState) -> Tensor:
        """Current component weights ``w [B, M]`` (rows sum to 1)."""
        return torch.softmax(self.logits(state.n_answers, state.loglik), -1)

    # ----- batched online inference --------------------------------------------------
    def initial_batch(self, observed: Tensor) -> MixtureState:
        observed = check_observed(self.item_bank, observed)
        b = observed.shape[0]
        return MixtureState(
            observed,
            tuple(c.initial_batch(observed) for c in self.components),
            torch.zeros(b, dtype=torch.long),
            torch.zeros(b, self.n_components, dtype=DTYPE),
        )

    def _answer_logprob(
        self, comp: BeliefModel, cstate: Any, items: Tensor, options: Tensor
    ) -> Tensor:
        """``log p_m(Y_items[b] = options[b])`` ``[B]`` (0 where ``options[b] == -1``)."""
        uniq, inv = torch.unique(items, return_inverse=True)
        pred = comp.predict_batch(cstate, uniq)  # [B, U, O]
        rows = torch.arange(items.shape[0])
        p = pred[rows, inv, options.clamp_min(0)]
        return torch.where(options >= 0, p.clamp_min(LOG_FLOOR).log(), torch.zeros_like(p))

    def update_batch(self, state: MixtureState, items: Tensor, options: Tensor) -> MixtureState:
        """Each component updates its own state; ``L_m += log p_m(answer)``; ``n += 1``.

        ``options[b] == -1`` (a skipped question) leaves respondent ``b`` unchanged.
        """
        items, options, active = check_batch_update(self.item_bank, state.observed, items, options)
        rows = active.nonzero(as_tuple=True)[0]
        observed = state.observed.clone()
        observed[rows, items[rows]] = options[rows]
        add = torch.stack(
            [
                self._answer_logprob(c, s, items, options)
                for c, s in zip(self.components, state.components, strict=True)
            ],
            1,
        )  # [B, M]
        comps = tuple(
            c.update_batch(s, items, options)
            for c, s in zip(self.components, state.components, strict=True)
        )
        return MixtureState(observed, comps, state.n_answers + active.long(), state.loglik + add)

    def component_predictions(self, state: MixtureState, items: Tensor | Any) -> Tensor:
        """Each component's predictive ``[M, B, n, O]`` (for fitting the weights)."""
        items = as_items(self.item_bank, items)
        return torch.stack(
            [
                c.predict_batch(s, items)
                for c, s in zip(self.components, state.components, strict=True)
            ]
        ).to(DTYPE)

    def predict_batch(self, state: MixtureState, items: Tensor | Any) -> Tensor:
        """``sum_m w_m p_m`` ``[B, n, O]``; observed items one-hot (the CAPE convention,
        whatever the components do with an answered item)."""
        items = as_items(self.item_bank, items)
        p = self.component_predictions(state, items)  # [M, B, n, O]
        w = self.mixture_weights(state)  # [B, M]
        return clamp_observed(torch.einsum("bm,mbno->bno", w, p), state.observed, items)

    def lookahead_batch(
        self, state: MixtureState, candidates: Tensor | Any, targets: Tensor | Any
    ) -> tuple[Tensor, Tensor]:
        """Exact mixture lookahead from the components' lookaheads (module docstring)."""
        cand, tgt, cmask = lookahead_shapes(self.item_bank, candidates, targets)
        looks = [
            c.lookahead_batch(s, cand, tgt)
            for c, s in zip(self.components, state.components, strict=True)
        ]
        px = torch.stack([lk[0] for lk in looks]).to(DTYPE)  # [M, B, C, O]
        pt = torch.stack([lk[1] for lk in looks]).to(DTYPE)  # [M, B, C, O, T, O]
        w = self.mixture_weights(state)  # [B, M]
        p_x = torch.einsum("bm,mbco->bco", w, px)
        n1 = state.n_answers + 1
        nxt = self.logits(n1, state.loglik)  # [B, M]
        g1 = self.gamma[n1.clamp(0, self.log_weights.shape[0] - 1)]  # [B]
        logit = nxt.T[:, :, None, None] + g1[None, :, None, None] * px.clamp_min(LOG_FLOOR).log()
        w_after = torch.softmax(logit, 0)  # [M, B, C, O]
        p_t = torch.einsum("mbck,mbckto->bckto", w_after, pt)
        p_t = clamp_lookahead(p_t, state.observed, cand, tgt)
        base = self.predict_batch(state, tgt)  # [B, T, O]
        pad = ~cmask  # [C, O] answers that do not exist: the current predictive
        if bool(pad.any()):
            p_t = torch.where(pad[None, :, :, None, None], base[:, None, None].expand_as(p_t), p_t)
        return p_x, p_t

    # ----- serialisation -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "item_bank": self.item_bank.to_dict(),
            "components": [c.to_bytes() for c in self.components],
            "names": list(self.names),
            "log_weights": self.log_weights.clone(),
            "gamma": self.gamma.clone(),
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> StackedMixture:
        return cls(
            ItemBank.from_dict(d["item_bank"]),
            [load_model(b) for b in d["components"]],
            d["names"],
            d["log_weights"],
            d["gamma"],
        )


# ----- fitting the weights ------------------------------------------------------------


def _target_probs(preds: Tensor, truth: Tensor) -> tuple[Tensor, Tensor]:
    """``p_m(truth)`` ``[M, P]`` over the known (user, target) pairs, and their user ``[P]``.

    Args:
        preds: ``[M, B, T, O]``; truth: ``LongTensor [B, T]`` (``-1`` = unknown).
    """
    known = truth >= 0
    users = known.nonzero(as_tuple=True)[0]
    p = preds.gather(-1, truth.clamp_min(0)[None, :, :, None].expand(preds.shape[0], -1, -1, 1))
    return p.squeeze(-1)[:, known].clamp_min(LOG_FLOOR), users


def stacked_log_loss(
    theta: Tensor, gamma: float, p_truth: Tensor, users: Tensor, loglik: Tensor
) -> Tensor:
    """Mean ``-log sum_m softmax(theta + gamma L[user])_m p_m(truth)`` over pairs.

    Args:
        theta: ``[M]`` log-weights; p_truth: ``[M, P]``; users: ``LongTensor [P]``;
        loglik: ``[B, M]`` components' log-likelihoods of each user's answers so far.
    """
    logw = torch.log_softmax(theta[None, :] + gamma * loglik[users], -1)  # [P, M]
    return -torch.logsumexp(logw + p_truth.T.log(), -1).mean()


def _fit_theta(
    p_truth: Tensor, users: Tensor, loglik: Tensor, gamma: float, ridge: float
) -> Tensor:
    """``argmin_theta stacked_log_loss + ridge |theta|^2`` by L-BFGS from ``theta = 0``.

    scipy's L-BFGS-B with the gradient from autograd (``torch.optim`` would import
    torch's compiler stack, ~30 s on a loaded machine, for a problem of ``M`` variables).
    """
    from scipy.optimize import minimize  # heavy (seconds): imported where used

    def fun(x: Any) -> tuple[float, Any]:
        theta = torch.as_tensor(x, dtype=DTYPE).requires_grad_(True)
        loss = stacked_log_loss(theta, gamma, p_truth, users, loglik)
        loss = loss + ridge * (theta * theta).sum()
        (grad,) = torch.autograd.grad(loss, theta)
        return float(loss.detach()), grad.numpy()

    res = minimize(fun, x0=[0.0] * p_truth.shape[0], jac=True, method="L-BFGS-B")
    return torch.as_tensor(res.x, dtype=DTYPE)


VERTEX_LOGIT = 40.0
"""``theta`` of a single component kept alone: the others get weight ``~e^-40``."""


def fit_stacking(
    preds: Sequence[Tensor],
    truth: Tensor,
    logliks: Sequence[Tensor],
    *,
    gammas: Sequence[float] = (0.0, 0.25, 0.5, 1.0, 2.0),
    ridge: float = 1e-6,
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """Fit ``theta [K + 1, M]`` and ``gamma [K + 1]`` minimising validation target log loss.

    For each ``n`` and each ``gamma`` in ``gammas``, ``theta[n]`` minimises
    ``stacked_log_loss + ridge * |theta[n]|^2`` (L-BFGS from equal weights; the tiny ridge
    only pins the softmax's free offset and keeps weights finite when a component is
    useless); per ``n`` the ``gamma`` with the lowest loss is kept (ties: the smaller).
    Each single component (``gamma = 0``, ``theta`` at a vertex, weight ``1 - O(e^-40)``)
    is a candidate too, so the fitted mixture's validation loss at each ``n`` is at most
    every component's.

    Args:
        preds: ``K + 1`` tensors ``[M, B, T, O]``: each component's target predictive after
            ``n = 0..K`` questions (all components conditioned on the same answers).
        truth: ``LongTensor [B, T]`` the validation users' target answers (``-1`` = unknown).
        logliks: ``K + 1`` tensors ``[B, M]``: ``L_m`` after ``n`` answers.
        gammas: evidence temperatures tried (each ``>= 0``).
        ridge: L2 penalty on ``theta``.

    Returns:
        ``(theta, gamma, info)``; ``info["log_loss"]`` is the fitted mixture's validation
        loss per ``n``, ``info["by_gamma"]`` each gamma's loss per ``n``.

    Raises:
        ModelError: no known target answer, mismatched lengths or a negative gamma.
    """
    if len(preds) != len(logliks) or not preds:
        raise ModelError("fit_stacking: preds and logliks need the same, non-zero length")
    if not gammas or any(not (g >= 0) for g in gammas):
        raise ModelError("fit_stacking: gammas must be a non-empty list of values >= 0")
    truth = torch.as_tensor(truth, dtype=torch.long)
    tables = [_target_probs(p.to(DTYPE), truth) for p in preds]
    if tables[0][1].numel() == 0:
        raise ModelError("fit_stacking: no known target answer")
    thetas, chosen, losses = [], [], []
    by_gamma: dict[str, list[float]] = {str(float(g)): [] for g in gammas}
    for (p_truth, users), ll in zip(tables, logliks, strict=True):
        llv = ll.to(DTYPE)
        best: tuple[float, float, Tensor] | None = None
        for g in sorted(float(x) for x in gammas):
            th = _fit_theta(p_truth, users, llv, g, ridge)
            loss = float(stacked_log_loss(th, g, p_truth, users, llv))
            by_gamma[str(g)].append(loss)
            if best is None or loss < best[0] - 1e-12:
                best = (loss, g, th)
        for m in range(p_truth.shape[0]):  # a single component, exactly (no ridge pull)
            th = torch.zeros(p_truth.shape[0], dtype=DTYPE)
            th[m] = VERTEX_LOGIT
            loss = float(stacked_log_loss(th, 0.0, p_truth, users, llv))
            assert best is not None
            if loss < best[0] - 1e-12:
                best = (loss, 0.0, th)
        assert best is not None
        losses.append(best[0])
        chosen.append(best[1])
        thetas.append(best[2])
    theta = torch.stack(thetas)
    info = {
        "gamma": chosen,
        "by_gamma": by_gamma,
        "log_loss": losses,
        "weights_by_n": torch.softmax(theta, -1).tolist(),
    }
    return theta, torch.tensor(chosen, dtype=DTYPE), info


__all__ = ["MixtureState", "StackedMixture", "fit_stacking", "stacked_log_loss"]
