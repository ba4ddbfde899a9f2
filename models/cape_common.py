"""Shared pieces of the CAPE world-model belief models (``cape_*``).

CAPE (docs/methods.md §2) learns the correlation structure of a population's answers
once, offline, and infers a new respondent's whole profile from a few answers by Bayesian
updating, never retraining. The three families (:mod:`models.cape_cooccurrence`,
:mod:`models.cape_linear`, :mod:`models.cape_factor`) share:

* the **indicator coding** of categorical answers: every ``(item, option)`` pair is one
  binary "criterion" column (CAPE's "has criterion c" generalised from binary criteria to
  categorical and ordinal items), ``C = sum_i O_i`` columns in item order;
* a **batched state convention**: every state carries ``observed [B, I]`` (``-1`` = not
  observed) so that predictions of observed items are clamped to the observed option
  (CAPE clamps observed criteria) and a second answer to the same item is refused;
* :class:`CapeModel`, which implements the one-respondent methods of
  :class:`~models.base.BeliefModel` through the batched ones with ``B = 1`` (one code path
  for live sessions and the benchmark);
* the **validation score** used to choose hyper-parameters: mean log-likelihood of a
  respondent's held-out answers given a random half of their other answers
  (:func:`heldout_loglik`).

Pure numerics: no web framework, database or settings imports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from models.base import (
    DTYPE,
    MISSING,
    BeliefModel,
    InvalidOptionError,
    ItemBank,
    ModelError,
    ShapeError,
)

PROB_FLOOR = 1e-10
"""Smallest probability a CAPE predictive puts on a valid option before renormalising."""


class AlreadyObservedError(ModelError, ValueError):
    """An update for an item that the respondent has already answered."""


@dataclass(frozen=True)
class IndicatorCoding:
    """``(item, option)`` indicator columns of an item bank.

    Attributes:
        n_options: ``O_i`` per item.
        offsets: ``LongTensor [I]``: first column of item ``i``.
        n_columns: ``C = sum_i O_i``.
        column_item: ``LongTensor [C]``: the item of each column.
        column_option: ``LongTensor [C]``: the option of each column.
        max_options: ``O = max_i O_i``.
    """

    n_options: tuple[int, ...]
    offsets: Tensor
    n_columns: int
    column_item: Tensor
    column_option: Tensor
    max_options: int

    @classmethod
    def from_bank(cls, bank: ItemBank) -> IndicatorCoding:
        n_opt = torch.tensor(bank.n_options, dtype=torch.long)
        offsets = torch.cumsum(n_opt, 0) - n_opt
        column_item = torch.repeat_interleave(torch.arange(bank.n_items), n_opt)
        column_option = torch.arange(int(n_opt.sum())) - offsets[column_item]
        return cls(
            bank.n_options, offsets, int(n_opt.sum()), column_item, column_option, bank.max_options
        )

    def onehot(self, responses: Tensor) -> Tensor:
        """Indicator matrix ``[N, C]`` (float64) of ``responses [N, I]``; all-zero blocks
        for missing answers."""
        n = responses.shape[0]
        out = torch.zeros(n, self.n_columns, dtype=DTYPE)
        obs = responses >= 0
        rows, items = obs.nonzero(as_tuple=True)
        cols = self.offsets[items] + responses[rows, items]
        out[rows, cols] = 1.0
        return out

    def columns(self, items: Tensor, options: Tensor) -> Tensor:
        """Column index of ``(items, options)`` (same shapes; options must be valid)."""
        return self.offsets[items] + options

    def padded_index(self, items: Tensor) -> Tensor:
        """``LongTensor [n, O]``: column of ``(items[j], k)``; ``0`` where ``k >= O_i``
        (callers mask those entries)."""
        k = torch.arange(self.max_options)
        n_opt = torch.tensor(self.n_options, dtype=torch.long)[items]
        idx = self.offsets[items].unsqueeze(1) + k.unsqueeze(0)
        return torch.where(k.unsqueeze(0) < n_opt.unsqueeze(1), idx, torch.zeros_like(idx))

    def to_padded(self, values: Tensor, fill: float = 0.0) -> Tensor:
        """``[..., C]`` column values as ``[..., I, O]`` (``fill`` beyond ``O_i``)."""
        shape = (*values.shape[:-1], len(self.n_options), self.max_options)
        out = torch.full(shape, fill, dtype=values.dtype)
        out[..., self.column_item, self.column_option] = values
        return out


def option_mask(bank: ItemBank) -> Tensor:
    """Bool ``[I, O]``: valid options."""
    return bank.option_mask()


def normalise_rows(probs: Tensor, mask: Tensor) -> Tensor:
    """Floor valid entries at :data:`PROB_FLOOR`, zero invalid ones, renormalise the last axis.

    Args:
        probs: ``[..., n, O]`` non-negative scores.
        mask: ``[n, O]`` bool, valid options.
    """
    p = torch.where(mask, probs.clamp_min(PROB_FLOOR), torch.zeros((), dtype=probs.dtype))
    return p / p.sum(-1, keepdim=True)


def clamp_observed(pred: Tensor, observed: Tensor, items: Tensor) -> Tensor:
    """Replace the predictive of observed items by the one-hot of the observed option.

    Args:
        pred: ``[B, n, O]`` predictive rows of ``items``.
        observed: ``[B, I]`` observed options (``-1`` = not observed).
        items: ``LongTensor [n]``.

    Returns:
        ``[B, n, O]``: rows of observed items are one-hot.
    """
    obs = observed[:, items]  # [B, n]
    hit = obs >= 0
    if not bool(hit.any()):
        return pred
    onehot = torch.zeros_like(pred)
    onehot.scatter_(-1, obs.clamp_min(0).unsqueeze(-1), 1.0)
    return torch.where(hit.unsqueeze(-1), onehot, pred)


def clamp_lookahead(pred: Tensor, observed: Tensor, cand: Tensor, tgt: Tensor) -> Tensor:
    """Clamp lookahead target predictives as ``update`` + ``predict`` would.

    Args:
        pred: ``[B, C, K, T, O]``: target predictives after ``Y_cand[c] = k``.
        observed: ``[B, I]`` observed options before the hypothetical answer.
        cand: ``LongTensor [C]``; tgt: ``LongTensor [T]``.

    Returns:
        ``pred`` with rows of already-observed targets one-hot on their observed option, and
        the row of a target equal to the candidate one-hot on ``k``.
    """
    b, c, k, t, o = pred.shape
    out = clamp_observed(pred.reshape(b, c * k * t, o), observed, tgt.repeat(c * k))
    out = out.reshape(b, c, k, t, o)
    same = cand.unsqueeze(1) == tgt.unsqueeze(0)  # [C, T]
    if bool(same.any()):
        onehot = torch.zeros(k, o, dtype=pred.dtype)
        kk = torch.arange(min(k, o))
        onehot[kk, kk] = 1.0
        out = torch.where(same[None, :, None, :, None], onehot[None, None, :, None, :], out)
    return out


def as_items(bank: ItemBank, items: Tensor | Sequence[int] | None) -> Tensor:
    """Validated ``LongTensor [n]`` of item indices (all items when ``None``)."""
    if items is None:
        return torch.arange(bank.n_items)
    t = torch.as_tensor(items, dtype=torch.long).reshape(-1)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= bank.n_items):
        bad = int(t[(t < 0) | (t >= bank.n_items)][0])
        bank.check_item(bad)  # raises UnknownItemError naming the index
    return t


def check_observed(bank: ItemBank, observed: Tensor) -> Tensor:
    """Validate ``observed [B, I]`` (``-1`` = not observed); returns int64."""
    if not isinstance(observed, Tensor):
        observed = torch.as_tensor(observed)
    if observed.dim() != 2:
        raise ShapeError(
            f"observed must have shape [B, {bank.n_items}], got {list(observed.shape)}"
        )
    return bank.check_responses(observed)


def check_batch_update(
    bank: ItemBank, observed: Tensor, items: Tensor, options: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Validate a batched update; returns ``(items, options, active)``.

    ``active[b]`` is false where ``options[b] == -1`` (a skipped question: no update).

    Raises:
        ShapeError: ``items``/``options`` are not ``[B]``.
        UnknownItemError / InvalidOptionError: an index out of range (naming the row).
        AlreadyObservedError: a row already observed that item.
    """
    items = torch.as_tensor(items, dtype=torch.long).reshape(-1)
    options = torch.as_tensor(options, dtype=torch.long).reshape(-1)
    b = observed.shape[0]
    if items.shape[0] != b or options.shape[0] != b:
        raise ShapeError(
            f"items and options must have shape [{b}], got {list(items.shape)} and "
            f"{list(options.shape)}"
        )
    as_items(bank, items)
    n_opt = torch.tensor(bank.n_options, dtype=torch.long)[items]
    bad = (options < MISSING) | (options >= n_opt)
    if bool(bad.any()):
        r = int(bad.nonzero()[0, 0])
        raise InvalidOptionError(
            f"row {r}: option {int(options[r])} is out of range for item "
            f"{bank.keys[int(items[r])]!r} ({int(n_opt[r])} options)"
        )
    active = options >= 0
    again = active & (observed.gather(1, items.unsqueeze(1)).squeeze(1) >= 0)
    if bool(again.any()):
        r = int(again.nonzero()[0, 0])
        raise AlreadyObservedError(
            f"row {r}: item {bank.keys[int(items[r])]!r} is already observed"
        )
    return items, options, active


def attributes_row(bank: ItemBank, attributes: Mapping[int, int] | None) -> Tensor:
    """``observed [1, I]`` from ``{item: option}`` (validated)."""
    row = torch.full((1, bank.n_items), MISSING, dtype=torch.long)
    for item, option in (attributes or {}).items():
        i, o = bank.check_answer(item, option)
        row[0, i] = o
    return row


class CapeModel(BeliefModel):
    """Base of the CAPE families: one-respondent methods through the batched ones.

    A one-respondent state is the batched state with ``B = 1``; subclasses implement
    ``initial_batch``, ``update_batch``, ``predict_batch`` and ``lookahead_batch`` and
    keep their states immutable (``update_batch`` returns a new state).
    """

    def initial_state(self, attributes: Mapping[int, int] | None = None) -> Any:
        return self.initial_batch(attributes_row(self.item_bank, attributes))

    def update(self, state: Any, item: int, option: int) -> Any:
        item, option = self.item_bank.check_answer(item, option)
        return self.update_batch(state, torch.tensor([item]), torch.tensor([option]))

    def predict(self, state: Any, items: Sequence[int] | Tensor | None = None) -> Tensor:
        return self.predict_batch(state, as_items(self.item_bank, items))[0]

    def lookahead(
        self, state: Any, candidates: Sequence[int] | Tensor, targets: Sequence[int] | Tensor
    ) -> tuple[Tensor, Tensor]:
        p_x, p_t = self.lookahead_batch(state, candidates, targets)
        return p_x[0], p_t[0]


def lookahead_shapes(
    bank: ItemBank, candidates: Tensor | Sequence[int], targets: Tensor | Sequence[int]
) -> tuple[Tensor, Tensor, Tensor]:
    """Validated candidate and target indices and the candidates' option mask ``[C, O]``."""
    cand = as_items(bank, candidates)
    tgt = as_items(bank, targets)
    mask = bank.option_mask()[cand]
    return cand, tgt, mask


# ----- validation scoring ---------------------------------------------------------------


def observation_masks(responses: Tensor, observe_prob: float, seed: int) -> Tensor:
    """Random split of each respondent's answers: ``observed [N, I]`` (rest become hidden).

    Every answered cell is observed with probability ``observe_prob`` (seeded), so that a
    model is scored on predicting hidden answers from a varying number of observed ones.
    """
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(responses.shape, generator=g, dtype=DTYPE) < observe_prob
    return torch.where(keep & (responses >= 0), responses, torch.full_like(responses, MISSING))


def heldout_loglik(
    model: BeliefModel,
    responses: Tensor,
    *,
    observe_prob: float = 0.5,
    seed: int = 0,
    n_masks: int = 2,
    batch_size: int = 512,
) -> float:
    """Mean log-likelihood of hidden answers given the observed ones (per hidden answer).

    For each of ``n_masks`` seeded random splits (:func:`observation_masks`), every
    respondent's observed answers go into ``initial_batch`` and the model predicts the
    answered-but-hidden items: ``mean log p(y_hidden | y_observed)``.

    Args:
        model: a fitted belief model with batched methods.
        responses: ``[N, I]`` answers of scoring respondents (``-1`` = missing).
        observe_prob: share of each respondent's answers that is observed.
        seed: seed of the first split (split ``m`` uses ``seed + m``).
        n_masks: number of random splits averaged.
        batch_size: respondents per batch.
    """
    responses = model.item_bank.check_responses(responses)
    items = torch.arange(model.item_bank.n_items)
    total, count = 0.0, 0
    for m in range(n_masks):
        observed = observation_masks(responses, observe_prob, seed + m)
        hidden = (responses >= 0) & (observed < 0)
        for start in range(0, responses.shape[0], batch_size):
            sl = slice(start, start + batch_size)
            pred = model.predict_batch(model.initial_batch(observed[sl]), items)  # [b, I, O]
            h = hidden[sl]
            y = responses[sl].clamp_min(0)
            p = pred.gather(2, y.unsqueeze(-1)).squeeze(-1)
            total += float(torch.log(p.clamp_min(PROB_FLOOR))[h].sum())
            count += int(h.sum())
    if count == 0:
        raise ModelError("no hidden answers to score (the scoring respondents answered nothing)")
    return total / count


def marginal_probs(bank: ItemBank, responses: Tensor, smoothing: float = 1.0) -> Tensor:
    """Per-item option frequencies ``[I, O]`` with additive smoothing (zeros beyond O_i)."""
    coding = IndicatorCoding.from_bank(bank)
    counts = coding.onehot(responses).sum(0)  # [C]
    padded = coding.to_padded(counts + smoothing)
    mask = bank.option_mask()
    padded = torch.where(mask, padded, torch.zeros((), dtype=DTYPE))
    return padded / padded.sum(-1, keepdim=True)


def split_rows(n: int, share: float, seed: int) -> tuple[Tensor, Tensor]:
    """Seeded random split of ``range(n)`` into two index sets (``share`` in the first)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    k = max(1, min(n - 1, int(math.floor(n * share)))) if n > 1 else n
    return perm[:k], perm[k:]
