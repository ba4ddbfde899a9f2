"""``cape_cooccurrence``: CAPE's population statistics with naive-Bayes and item-based CF updates.

CAPE (docs/methods.md §2) works on binary criteria ("has c"). Here every
``(item, option)`` pair is a criterion ``c`` (an indicator column, see
:class:`~models.cape_common.IndicatorCoding`), so the same statistics and updates apply
to categorical and ordinal items. Statistics, from a training response matrix:

* marginals ``P(c) = (n(c) + 1) / (n_i + O_i)`` (per item, add-one smoothing);
* co-occurrence similarity ``sim(a, c) = n(a, c) / sqrt(n(a) n(c))``, kept when
  ``n(a, c) >= 3`` (else 0), zero within an item;
* conditionals ``P(c | a)`` and ``P(c | not a)`` among the respondents who answered both
  items, each with one pseudo-count at ``P(c)``, kept when both the ``a`` and the
  ``not a`` groups hold ``>= 5`` respondents (else the pair carries no evidence);
* value correlations: Pearson correlation of the option indices of two items over the
  respondents who answered both, kept with ``>= 3`` pairs (stored as population
  statistics and exposed as :attr:`CapeCooccurrence.value_correlation`; the predictive
  distributions below do not use them).

CAPE's "drop criteria held by >= 10% of users" filter is for sparse criteria spaces and
would drop every option of a survey item, so it is not applied.

Online update (no retraining) for an observed answer ``o`` to item ``i`` (the observed
"has" indicator ``a = (i, o)``; the "not" indicators of the item's other options carry
the same information and are not added a second time):

* naive Bayes: ``s_NB[c] += E[a, c]`` with ``E[a, c] = log P(c | a) - log P(c | not a)``;
  predictive ``q_NB(c) = sigmoid(clip(logit P(c) + beta * s_NB[c], -10, 10))``,
  renormalised over each item's options;
* item-based collaborative filtering: ``s_CF[c] += sim(a, c) - sum_o' P(i, o') sim((i, o'), c)``
  (similarity to the observed option minus its expectation under the prior), ``n += 1``;
  ``q_CF(c) = max(P(c) + eta * s_CF[c] / n, 1e-3)``, renormalised per item;
* hybrid: ``p = (1 - lam) * q_NB + lam * q_CF``.

``beta`` (an evidence temperature: 1 is CAPE's plain naive Bayes, smaller values temper
the double counting of correlated evidence), ``eta`` and ``lam`` are chosen on the
validation log-likelihood of hidden answers given observed ones. Everything is a sum of
precomputed rows, so an update is one gather and add, batched over respondents.

Reference: CAPE, cold-start preference elicitation with priors (docs/methods.md [2]).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from models.base import DTYPE, ItemBank, TooFewRespondentsError, register_model
from models.cape_common import (
    CapeModel,
    IndicatorCoding,
    as_items,
    check_batch_update,
    check_observed,
    clamp_lookahead,
    clamp_observed,
    lookahead_shapes,
    normalise_rows,
    observation_masks,
    split_rows,
)

MIN_COOCCURRENCE = 3
MIN_CONDITIONAL = 5
MIN_VALUE_PAIRS = 3
LOGIT_CLIP = 10.0
CF_FLOOR = 1e-3

BETA_GRID = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
ETA_GRID = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
LAMBDA_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class CooccurrenceState:
    """Batched state of :class:`CapeCooccurrence`.

    Attributes:
        observed: ``LongTensor [B, I]``, observed options (``-1`` = not observed).
        nb: ``[B, C]`` summed naive-Bayes evidence ``s_NB``.
        cf: ``[B, C]`` summed collaborative-filtering shifts ``s_CF``.
        count: ``[B]`` number of observed answers.
    """

    observed: Tensor
    nb: Tensor
    cf: Tensor
    count: Tensor


@dataclass(frozen=True)
class CooccurrenceStats:
    """The population statistics (all fitted offline, never changed online).

    Attributes:
        marginal: ``[C]`` ``P(c)``.
        similarity: ``[C, C]`` filtered co-occurrence similarity.
        evidence: ``[C, C]`` ``E[a, c] = log P(c|a) - log P(c|not a)`` (0 where filtered).
        cf_shift: ``[C, C]`` ``sim(a, c) - sum_o' P(i, o') sim((i, o'), c)`` for ``a = (i, o)``.
        value_correlation: ``[I, I]`` correlation of option indices (0 where filtered).
    """

    marginal: Tensor
    similarity: Tensor
    evidence: Tensor
    cf_shift: Tensor
    value_correlation: Tensor


def population_statistics(responses: Tensor, bank: ItemBank) -> CooccurrenceStats:
    """CAPE's population statistics of ``responses [N, I]`` over indicator columns.

    Counts (``X [N, C]`` indicators, ``M [N, C]`` "the column's item was answered"):
    ``n(a, c) = (X^T X)[a, c]``; ``n(a, item(c)) = (X^T M)[a, c]``;
    ``n(not a, c) = (M^T X)[a, c] - n(a, c)``; ``n(not a, item(c)) = (M^T M)[a, c] - n(a, item(c))``.
    """
    responses = bank.check_responses(responses)
    coding = IndicatorCoding.from_bank(bank)
    x = coding.onehot(responses)
    answered = (responses >= 0).to(DTYPE)
    m = answered[:, coding.column_item]
    n_c = x.sum(0)
    n_item = answered.sum(0)[coding.column_item]
    o_item = torch.tensor(bank.n_options, dtype=DTYPE)[coding.column_item]
    marginal = (n_c + 1.0) / (n_item + o_item)

    same_item = coding.column_item.unsqueeze(0) == coding.column_item.unsqueeze(1)
    n_ac = x.T @ x
    denom = torch.sqrt(n_c.unsqueeze(0) * n_c.unsqueeze(1)).clamp_min(1.0)
    similarity = torch.where((n_ac >= MIN_COOCCURRENCE) & ~same_item, n_ac / denom, 0.0)

    n_a_j = x.T @ m
    n_nota_c = m.T @ x - n_ac
    n_nota_j = m.T @ m - n_a_j
    p_c = marginal.unsqueeze(0)
    p_given_a = (n_ac + p_c) / (n_a_j + 1.0)
    p_given_nota = (n_nota_c + p_c) / (n_nota_j + 1.0)
    keep = (n_a_j >= MIN_CONDITIONAL) & (n_nota_j >= MIN_CONDITIONAL) & ~same_item
    evidence = torch.where(keep, torch.log(p_given_a) - torch.log(p_given_nota), 0.0)

    # CF shift: similarity to the observed option minus its prior expectation over the item.
    expected = torch.zeros(bank.n_items, coding.n_columns, dtype=DTYPE)
    expected.index_add_(0, coding.column_item, marginal.unsqueeze(1) * similarity)
    cf_shift = similarity - expected[coding.column_item]

    value_correlation = _value_correlation(responses)
    return CooccurrenceStats(marginal, similarity, evidence, cf_shift, value_correlation)


def _value_correlation(responses: Tensor) -> Tensor:
    """Pairwise Pearson correlation ``[I, I]`` of option indices over co-answering respondents
    (``>= MIN_VALUE_PAIRS`` pairs and non-zero variances, else 0; diagonal 0)."""
    v = responses.clamp_min(0).to(DTYPE)
    a = (responses >= 0).to(DTYPE)
    n = a.T @ a
    sx = (v * a).T @ a  # sum of v_i over pairs with j answered
    sxx = (v * v * a).T @ a
    sxy = (v * a).T @ (v * a)
    n_safe = n.clamp_min(1.0)
    cov = sxy / n_safe - (sx / n_safe) * (sx.T / n_safe)
    var_i = sxx / n_safe - (sx / n_safe) ** 2
    var_j = var_i.T
    ok = (n >= MIN_VALUE_PAIRS) & (var_i > 1e-12) & (var_j > 1e-12)
    corr = torch.where(ok, cov / torch.sqrt((var_i * var_j).clamp_min(1e-24)), 0.0)
    corr.fill_diagonal_(0.0)
    return corr.clamp(-1.0, 1.0)


@register_model
class CapeCooccurrence(CapeModel):
    """CAPE's co-occurrence world model (naive Bayes / item CF / hybrid), see the module doc.

    Args:
        item_bank: the items.
        stats: the fitted population statistics.
        beta: naive-Bayes evidence temperature.
        eta: collaborative-filtering step.
        lam: weight of the CF predictive in the hybrid (0 = naive Bayes only).
    """

    family = "cape_cooccurrence"

    def __init__(
        self, item_bank: ItemBank, stats: CooccurrenceStats, *, beta: float, eta: float, lam: float
    ) -> None:
        super().__init__(item_bank)
        self.coding = IndicatorCoding.from_bank(item_bank)
        self.stats = stats
        self.beta = float(beta)
        self.eta = float(eta)
        self.lam = float(lam)
        self._mask = item_bank.option_mask()
        self._prior_logit = torch.logit(stats.marginal)

    @property
    def value_correlation(self) -> Tensor:
        """``[I, I]`` filtered correlations of option indices (population statistic)."""
        return self.stats.value_correlation

    # ----- fitting --------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        responses: Tensor,
        item_bank: ItemBank,
        *,
        validation: Tensor | None = None,
        seed: int = 0,
        betas: tuple[float, ...] = BETA_GRID,
        etas: tuple[float, ...] = ETA_GRID,
        lams: tuple[float, ...] = LAMBDA_GRID,
    ) -> CapeCooccurrence:
        """Fit the statistics on ``responses`` and choose ``(beta, eta, lam)`` on validation.

        Args:
            responses: ``[N, I]`` training answers (``-1`` = missing).
            item_bank: the items.
            validation: ``[N_val, I]`` answers of validation respondents; when ``None``, 20%
                of ``responses`` (seeded) are held out for the choice and the final
                statistics use all rows.
            seed: seed of the validation split and of the observed/hidden masks.
            betas, etas, lams: the grids searched.

        Returns:
            The fitted model; ``metrics`` holds the validation log-likelihood of every
            grid point (``grid``) and of the chosen one (``val_loglik``).
        """
        responses = item_bank.check_responses(responses)
        if responses.shape[0] < 2:
            raise TooFewRespondentsError("cape_cooccurrence needs at least 2 training respondents")
        if validation is None:
            val_idx, fit_idx = split_rows(responses.shape[0], 0.2, seed)
            fit_rows, val_rows = responses[fit_idx], responses[val_idx]
        else:
            fit_rows, val_rows = responses, item_bank.check_responses(validation)
        stats = population_statistics(fit_rows, item_bank)
        probe = cls(item_bank, stats, beta=1.0, eta=1.0, lam=0.0)
        items = torch.arange(item_bank.n_items)
        scores: dict[tuple[float, float, float], float] = {}
        parts = []
        for m in range(2):
            observed = observation_masks(val_rows, 0.5, seed + m)
            hidden = (val_rows >= 0) & (observed < 0)
            parts.append((probe.initial_batch(observed), hidden))
        # p_mix(y) = (1 - lam) q_NB(y) + lam q_CF(y): gather both at the true options once
        # per beta / eta, then every lam is a cheap mix of two vectors.
        truth = val_rows.clamp_min(0).unsqueeze(-1)
        q_nb = {
            beta: torch.cat(
                [
                    probe._predict(st, items, beta=beta, eta=1.0, lam=0.0)
                    .gather(2, truth)
                    .squeeze(-1)[hid]
                    for st, hid in parts
                ]
            )
            for beta in betas
        }
        q_cf = {
            eta: torch.cat(
                [
                    probe._predict(st, items, beta=1.0, eta=eta, lam=1.0)
                    .gather(2, truth)
                    .squeeze(-1)[hid]
                    for st, hid in parts
                ]
            )
            for eta in etas
        }
        for beta, eta, lam in itertools.product(betas, etas, lams):
            mix = (1.0 - lam) * q_nb[beta] + lam * q_cf[eta]
            scores[(beta, eta, lam)] = float(torch.log(mix).mean())
        best = max(scores, key=lambda k: scores[k])
        final_stats = population_statistics(responses, item_bank) if validation is None else stats
        model = cls(item_bank, final_stats, beta=best[0], eta=best[1], lam=best[2])
        model.metrics = {
            "val_loglik": scores[best],
            "beta": best[0],
            "eta": best[1],
            "lam": best[2],
            "grid": [
                {"beta": b, "eta": e, "lam": la, "val_loglik": v}
                for (b, e, la), v in scores.items()
            ],
        }
        return model

    # ----- batched online inference ----------------------------------------------------
    def initial_batch(self, observed: Tensor) -> CooccurrenceState:
        """States of ``B`` respondents with ``observed [B, I]`` answers (one matmul each)."""
        observed = check_observed(self.item_bank, observed)
        x = self.coding.onehot(observed)
        return CooccurrenceState(
            observed=observed,
            nb=x @ self.stats.evidence,
            cf=x @ self.stats.cf_shift,
            count=(observed >= 0).sum(1).to(DTYPE),
        )

    def update_batch(
        self, state: CooccurrenceState, items: Tensor, options: Tensor
    ) -> CooccurrenceState:
        """Add the evidence rows of each respondent's answer (``-1`` = skipped, no change)."""
        items, options, active = check_batch_update(self.item_bank, state.observed, items, options)
        cols = self.coding.columns(items, options.clamp_min(0))
        w = active.to(DTYPE).unsqueeze(1)
        observed = state.observed.clone()
        rows = active.nonzero(as_tuple=True)[0]
        observed[rows, items[rows]] = options[rows]
        return CooccurrenceState(
            observed=observed,
            nb=state.nb + w * self.stats.evidence[cols],
            cf=state.cf + w * self.stats.cf_shift[cols],
            count=state.count + active.to(DTYPE),
        )

    def _scores(
        self,
        nb: Tensor,
        cf: Tensor,
        count: Tensor,
        items: Tensor,
        *,
        beta: float,
        eta: float,
        lam: float,
    ) -> Tensor:
        """Predictive ``[..., n, O]`` from accumulated ``nb``/``cf`` ``[..., C]`` and ``count [...]``."""
        mask = self._mask[items]
        idx = self.coding.padded_index(items)  # [n, O]
        logit = self._prior_logit[idx] + beta * nb[..., idx]
        q_nb = normalise_rows(torch.sigmoid(logit.clamp(-LOGIT_CLIP, LOGIT_CLIP)), mask)
        if lam == 0.0:
            return q_nb
        shift = cf[..., idx] / count.clamp_min(1.0)[..., None, None]
        q_cf = normalise_rows((self.stats.marginal[idx] + eta * shift).clamp_min(CF_FLOOR), mask)
        return (1.0 - lam) * q_nb + lam * q_cf

    def _predict(
        self, state: CooccurrenceState, items: Tensor, *, beta: float, eta: float, lam: float
    ) -> Tensor:
        pred = self._scores(state.nb, state.cf, state.count, items, beta=beta, eta=eta, lam=lam)
        return clamp_observed(pred, state.observed, items)

    def predict_batch(self, state: CooccurrenceState, items: Tensor | Any) -> Tensor:
        """Predictive ``[B, n, O]``; observed items are one-hot on the observed option."""
        items = as_items(self.item_bank, items)
        return self._predict(state, items, beta=self.beta, eta=self.eta, lam=self.lam)

    def lookahead_batch(
        self, state: CooccurrenceState, candidates: Tensor | Any, targets: Tensor | Any
    ) -> tuple[Tensor, Tensor]:
        """``p_x [B, C, O]`` and ``p_t [B, C, O, T, O]`` in closed form (no per-outcome loop).

        After ``Y_x = k`` the accumulators are ``nb + E[(x, k)]``, ``cf + shift[(x, k)]``,
        ``count + 1``; the target predictive follows from them exactly as in ``update``.
        """
        cand, tgt, cmask = lookahead_shapes(self.item_bank, candidates, targets)
        o_max = self.item_bank.max_options
        p_x = self.predict_batch(state, cand)
        base = self.predict_batch(state, tgt)  # [B, T, O]
        b = state.nb.shape[0]
        oc = int(cmask.sum(1).max()) if cand.numel() else 0
        p_t = base[:, None, None].expand(b, cand.numel(), o_max, *base.shape[1:]).clone()
        if oc == 0:
            return p_x, p_t
        opts = torch.arange(oc)
        cols = self.coding.offsets[cand].unsqueeze(1) + opts.clamp_max(
            torch.tensor(self.item_bank.n_options)[cand].unsqueeze(1) - 1
        )  # [C, oc]
        nb = state.nb[:, None, None, :] + self.stats.evidence[cols]  # [B, C, oc, Ccol]
        cf = state.cf[:, None, None, :] + self.stats.cf_shift[cols]
        count = (state.count + 1.0)[:, None, None].expand(b, cand.numel(), oc)
        pred = self._scores(nb, cf, count, tgt, beta=self.beta, eta=self.eta, lam=self.lam)
        pred = clamp_lookahead(pred, state.observed, cand, tgt)
        valid = cmask[:, :oc]  # [C, oc]
        p_t[:, :, :oc] = torch.where(valid[None, :, :, None, None], pred, p_t[:, :, :oc])
        return p_x, p_t

    # ----- serialisation ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        s = self.stats
        return {
            "item_bank": self.item_bank.to_dict(),
            "beta": self.beta,
            "eta": self.eta,
            "lam": self.lam,
            "marginal": s.marginal.clone(),
            "similarity": s.similarity.clone(),
            "evidence": s.evidence.clone(),
            "cf_shift": s.cf_shift.clone(),
            "value_correlation": s.value_correlation.clone(),
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> CapeCooccurrence:
        stats = CooccurrenceStats(
            d["marginal"], d["similarity"], d["evidence"], d["cf_shift"], d["value_correlation"]
        )
        return cls(
            ItemBank.from_dict(d["item_bank"]), stats, beta=d["beta"], eta=d["eta"], lam=d["lam"]
        )


__all__ = ["CapeCooccurrence", "CooccurrenceState", "CooccurrenceStats", "population_statistics"]
