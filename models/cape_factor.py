"""``cape_factor``: a Pyro latent-preference model; online posterior by importance sampling.

CAPE's "structured world model of preference correlations ... using latent variables"
(docs/methods.md §2), as a categorical factor model::

    z_u ~ N(0, I_d)                                  (latent preferences of respondent u)
    logits[i, k] = b[i, k] + W[i, k] . z_u           (W: [I, O, d], b: [I, O])
    Y_ui ~ Categorical(softmax over the O_i options of item i)

Offline fit (Pyro, SVI). ``W`` and ``b`` have weak Normal priors and an ``AutoDelta`` guide
(MAP estimates). ``z`` is **marginalised, not amortised**: each SVI step estimates every
respondent's marginal likelihood with ``S`` fresh prior samples,
``log p(y_u) ~ log (1/S) sum_s p(y_u | z_s)`` (an importance-weighted lower bound with the
prior as proposal, Burda et al. 2016, docs/methods.md [5]), entered with ``pyro.factor``
in a subsampled respondent plate. Unanswered items simply contribute nothing. A tqdm bar
shows progress.

Online (no gradient steps, parameters frozen). A fixed set of ``S`` quasi-random prior
samples ``z_1..z_S`` (scrambled Sobol points mapped through the normal quantile, seeded)
is drawn once at fit time; the posterior over ``z`` is the self-normalised importance
weighting of those samples::

    log w_s = sum_{(i, y) observed} log p(Y_i = y | z_s)       (+ const),
    p(Y_j = k | answers) = sum_s softmax(log w)_s p(Y_j = k | z_s).

The state is the weight vector ``log w [B, S]``: an answer adds one precomputed row
(exactly a persona mixture over the sampled ``z``), and lookahead is closed form.
``d`` is chosen on the validation log-likelihood of hidden answers given observed ones,
computed with this same online posterior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDelta
from pyro.optim import ClippedAdam
from torch import Tensor
from tqdm.auto import tqdm

from models.base import DTYPE, ItemBank, ModelError, TooFewRespondentsError, register_model
from models.cape_common import (
    CapeModel,
    IndicatorCoding,
    as_items,
    check_batch_update,
    check_observed,
    clamp_lookahead,
    clamp_observed,
    heldout_loglik,
    lookahead_shapes,
    normalise_rows,
    split_rows,
)

DIMS = (1, 2, 4)
N_SAMPLES = 1024
TRAIN_SAMPLES = 128
STEPS = 1000
BATCH = 256
W_SCALE = 1.0
B_SCALE = 5.0


@dataclass(frozen=True)
class FactorState:
    """Batched state of :class:`CapeFactor`.

    Attributes:
        observed: ``LongTensor [B, I]`` (``-1`` = not observed).
        log_weight: ``[B, S]`` unnormalised log importance weights of the fixed samples.
    """

    observed: Tensor
    log_weight: Tensor


def sobol_normal(n: int, d: int, seed: int) -> Tensor:
    """``[n, d]`` scrambled-Sobol quasi-random standard-normal points (deterministic)."""
    engine = torch.quasirandom.SobolEngine(d, scramble=True, seed=seed)
    u = engine.draw(n, dtype=DTYPE).clamp(1e-7, 1 - 1e-7)
    return torch.special.ndtri(u)


def option_log_probs(weights: Tensor, bias: Tensor, z: Tensor, mask: Tensor) -> Tensor:
    """``log p(Y_i = k | z_s)`` ``[S, I, O]`` (``-inf`` beyond ``O_i``).

    Args:
        weights: ``[I, O, d]``; bias: ``[I, O]``; z: ``[S, d]``; mask: bool ``[I, O]``.
    """
    logits = bias + torch.einsum("iod,sd->sio", weights, z)
    return torch.log_softmax(logits.masked_fill(~mask, -math.inf), -1)


class _PyroFactorModel:
    """The Pyro model of the module doc over a fixed response matrix (for SVI)."""

    def __init__(self, bank: ItemBank, responses: Tensor, d: int, seed: int) -> None:
        self.bank = bank
        self.d = d
        self.coding = IndicatorCoding.from_bank(bank)
        self.onehot = self.coding.onehot(responses).float()  # [N, C]
        self.mask = bank.option_mask()
        self.gen = torch.Generator().manual_seed(seed)
        self.batch = min(BATCH, responses.shape[0])

    def model(self) -> None:
        i, o, d = self.bank.n_items, self.bank.max_options, self.d
        weights = pyro.sample(
            "W", dist.Normal(torch.zeros(i, o, d), W_SCALE * torch.ones(i, o, d)).to_event(3)
        )
        bias = pyro.sample(
            "b", dist.Normal(torch.zeros(i, o), B_SCALE * torch.ones(i, o)).to_event(2)
        )
        z = torch.randn(TRAIN_SAMPLES, d, generator=self.gen)
        logp = option_log_probs(weights, bias, z, self.mask)  # [S, I, O]
        cols = logp[:, self.coding.column_item, self.coding.column_option]  # [S, C]
        n = self.onehot.shape[0]
        with pyro.plate("respondents", n, subsample_size=self.batch) as idx:
            ll = self.onehot[idx] @ cols.T  # [b, S]
            pyro.factor("answers", torch.logsumexp(ll, -1) - math.log(TRAIN_SAMPLES))


def fit_factor_parameters(
    responses: Tensor,
    bank: ItemBank,
    d: int,
    *,
    steps: int = STEPS,
    lr: float = 0.05,
    seed: int = 0,
    progress: bool = True,
) -> tuple[Tensor, Tensor, list[float]]:
    """SVI (AutoDelta = MAP of ``W``, ``b``; ``z`` marginalised by prior sampling).

    Returns:
        ``(W [I, O, d], b [I, O], losses)`` with ``losses`` the per-step loss per
        respondent (negative subsampled objective divided by ``N``).
    """
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    pm = _PyroFactorModel(bank, responses, d, seed)
    guide = AutoDelta(pm.model, init_loc_fn=_init_small(seed))
    svi = SVI(pm.model, guide, ClippedAdam({"lr": lr, "lrd": 0.1 ** (1 / steps)}), Trace_ELBO())
    losses: list[float] = []
    bar = tqdm(range(steps), desc=f"cape_factor d={d}", disable=not progress, leave=False)
    for _ in bar:
        losses.append(float(svi.step()) / responses.shape[0])
        if len(losses) % 50 == 0:
            bar.set_postfix(loss=f"{sum(losses[-50:]) / 50:.3f}")
    med = guide.median()
    weights = med["W"].detach().to(DTYPE)
    bias = med["b"].detach().to(DTYPE)
    mask = bank.option_mask()
    weights = torch.where(mask.unsqueeze(-1), weights, torch.zeros((), dtype=DTYPE))
    bias = torch.where(mask, bias, torch.zeros((), dtype=DTYPE))
    pyro.clear_param_store()
    return weights, bias, losses


def _init_small(seed: int):  # type: ignore[no-untyped-def]
    """AutoDelta init: small random loadings (breaks the symmetry), zero biases."""
    gen = torch.Generator().manual_seed(seed + 7)

    def init(site: dict[str, Any]) -> Tensor:
        shape = site["fn"].shape()
        if site["name"] == "W":
            return 0.1 * torch.randn(shape, generator=gen)
        return torch.zeros(shape)

    return init


@register_model
class CapeFactor(CapeModel):
    """Categorical latent-factor belief model with an importance-sampled posterior.

    Args:
        item_bank: the items.
        weights: ``[I, O, d]`` loadings; bias: ``[I, O]`` (zero beyond ``O_i``).
        samples: ``[S, d]`` the fixed prior samples of the online posterior.
    """

    family = "cape_factor"

    def __init__(self, item_bank: ItemBank, weights: Tensor, bias: Tensor, samples: Tensor) -> None:
        super().__init__(item_bank)
        i, o = item_bank.n_items, item_bank.max_options
        if weights.dim() != 3 or weights.shape[:2] != (i, o) or bias.shape != (i, o):
            raise ModelError(f"cape_factor: parameters do not match the item bank ([{i}, {o}, d])")
        if samples.dim() != 2 or samples.shape[1] != weights.shape[2]:
            raise ModelError("cape_factor: samples must have shape [S, d]")
        self.weights, self.bias = weights.to(DTYPE), bias.to(DTYPE)
        self.samples = samples.to(DTYPE)
        self.d = int(weights.shape[2])
        self._mask = item_bank.option_mask()
        logp = option_log_probs(self.weights, self.bias, self.samples, self._mask)  # [S, I, O]
        self._logp = logp.masked_fill(~self._mask, 0.0)  # finite table for gathers
        self._prob = logp.exp()  # [S, I, O], zeros beyond O_i

    @property
    def n_samples(self) -> int:
        return int(self.samples.shape[0])

    # ----- fitting --------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        responses: Tensor,
        item_bank: ItemBank,
        *,
        validation: Tensor | None = None,
        dims: tuple[int, ...] = DIMS,
        n_samples: int = N_SAMPLES,
        steps: int = STEPS,
        seed: int = 0,
        progress: bool = True,
    ) -> CapeFactor:
        """Fit by SVI for each ``d`` in ``dims``; keep the best validation log-likelihood.

        Args:
            responses: ``[N, I]`` training answers; validation: ``[N_val, I]`` (when
                ``None``, 20% of ``responses``, seeded, are held out for the choice).
            dims: latent dimensions tried; n_samples: ``S`` of the online posterior;
            steps: SVI steps per fit; seed: seeds SVI, the Sobol points and the masks;
            progress: show a tqdm bar.
        """
        responses = item_bank.check_responses(responses)
        if validation is None:
            val_idx, fit_idx = split_rows(responses.shape[0], 0.2, seed)
            fit_rows, val_rows = responses[fit_idx], responses[val_idx]
        else:
            fit_rows, val_rows = responses, item_bank.check_responses(validation)
        if fit_rows.shape[0] < 2 or val_rows.shape[0] < 1:
            raise TooFewRespondentsError(
                "cape_factor needs at least 2 training and 1 validation respondent"
            )
        scores: dict[int, float] = {}
        models: dict[int, CapeFactor] = {}
        final_loss: dict[int, float] = {}
        for d in dims:
            w, b, losses = fit_factor_parameters(
                fit_rows, item_bank, d, steps=steps, seed=seed, progress=progress
            )
            model = cls(item_bank, w, b, sobol_normal(n_samples, d, seed))
            scores[d] = heldout_loglik(model, val_rows, seed=seed)
            final_loss[d] = sum(losses[-50:]) / max(1, len(losses[-50:]))
            models[d] = model
        best_model = models[max(scores, key=lambda k: scores[k])]
        best_model.metrics = {
            "val_loglik": scores[best_model.d],
            "d": best_model.d,
            "by_d": {str(k): v for k, v in scores.items()},
            "svi_final_loss": final_loss[best_model.d],
            "n_samples": n_samples,
            "steps": steps,
        }
        return best_model

    # ----- batched online inference ----------------------------------------------------
    def initial_batch(self, observed: Tensor) -> FactorState:
        """``log w = sum_{observed (i, y)} log p(Y_i = y | z_s)`` ``[B, S]``."""
        observed = check_observed(self.item_bank, observed)
        coding = IndicatorCoding.from_bank(self.item_bank)
        table = self._logp[:, coding.column_item, coding.column_option]  # [S, C]
        return FactorState(observed, coding.onehot(observed) @ table.T)

    def update_batch(self, state: FactorState, items: Tensor, options: Tensor) -> FactorState:
        """Add ``log p(Y_item = option | z_s)`` to each row (``option == -1``: no change)."""
        items, options, active = check_batch_update(self.item_bank, state.observed, items, options)
        rows = active.nonzero(as_tuple=True)[0]
        observed = state.observed.clone()
        observed[rows, items[rows]] = options[rows]
        add = self._logp[:, items, options.clamp_min(0)].T  # [B, S]
        return FactorState(observed, state.log_weight + active.to(DTYPE).unsqueeze(1) * add)

    def posterior_weights(self, state: FactorState) -> Tensor:
        """Normalised importance weights ``[B, S]``."""
        return torch.softmax(state.log_weight, -1)

    def effective_sample_size(self, state: FactorState) -> Tensor:
        """``1 / sum_s w_s^2`` ``[B]``: how many of the ``S`` samples carry the posterior."""
        w = self.posterior_weights(state)
        return 1.0 / (w * w).sum(-1)

    def posterior_mean_z(self, state: FactorState) -> Tensor:
        """``E[z | answers]`` ``[B, d]``."""
        return self.posterior_weights(state) @ self.samples

    def predict_batch(self, state: FactorState, items: Tensor | Any) -> Tensor:
        """Mixture predictive ``[B, n, O]``; observed items one-hot."""
        items = as_items(self.item_bank, items)
        w = self.posterior_weights(state)
        o = self.item_bank.max_options
        prob = self._prob[:, items].reshape(self.n_samples, -1)  # [S, n*O]
        pred = (w @ prob).reshape(w.shape[0], items.numel(), o)
        pred = normalise_rows(pred, self._mask[items])
        return clamp_observed(pred, state.observed, items)

    def lookahead_batch(
        self, state: FactorState, candidates: Tensor | Any, targets: Tensor | Any
    ) -> tuple[Tensor, Tensor]:
        """Closed form: ``p(Y_t = j | Y_x = k) = sum_s w_s P[s,x,k] P[s,t,j] / sum_s w_s P[s,x,k]``.

        The joint is one matmul ``w [B, S] @ Q [S, C*K*T*O]`` with
        ``Q[s, (x, k, t, j)] = P[s, x, k] P[s, t, j]`` (independent of the state).
        """
        cand, tgt, cmask = lookahead_shapes(self.item_bank, candidates, targets)
        o_max = self.item_bank.max_options
        p_x = self.predict_batch(state, cand)
        base = self.predict_batch(state, tgt)
        b, c, t = state.log_weight.shape[0], cand.numel(), tgt.numel()
        p_t = base[:, None, None].expand(b, c, o_max, *base.shape[1:]).clone()
        if c == 0 or t == 0:
            return p_x, p_t
        oc = int(cmask.sum(1).max())
        w = self.posterior_weights(state)
        px = self._prob[:, cand, :oc]  # [S, C, oc]
        pt = self._prob[:, tgt]  # [S, T, O]
        q = (px.reshape(-1, c * oc, 1) * pt.reshape(-1, 1, t * o_max)).reshape(
            -1, c * oc * t * o_max
        )
        joint = (w @ q).reshape(b, c, oc, t, o_max)
        marg = (w @ px.reshape(-1, c * oc)).reshape(b, c, oc, 1, 1)
        pred = normalise_rows(joint / marg.clamp_min(1e-300), self._mask[tgt])
        pred = clamp_lookahead(pred, state.observed, cand, tgt)
        valid = cmask[:, :oc]
        p_t[:, :, :oc] = torch.where(valid[None, :, :, None, None], pred, p_t[:, :, :oc])
        return p_x, p_t

    # ----- serialisation ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "item_bank": self.item_bank.to_dict(),
            "weights": self.weights.clone(),
            "bias": self.bias.clone(),
            "samples": self.samples.clone(),
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> CapeFactor:
        return cls(ItemBank.from_dict(d["item_bank"]), d["weights"], d["bias"], d["samples"])


__all__ = ["CapeFactor", "FactorState", "fit_factor_parameters", "option_log_probs", "sobol_normal"]
