"""Scores of target predictions against the true answers.

For a respondent ``u`` and a target ``t`` with true answer ``y`` and predictive ``p`` over
the item's ``O_t`` options:

* accuracy: ``1[argmax_k p_k = y]`` (ties go to the lowest option);
* log loss: ``-log max(p_y, 1e-12)`` (nats);
* Brier, summed over options (as in the group paper, docs/methods.md [3]):
  ``sum_k (p_k - 1[k = y])^2``;
* Brier, averaged over options (as in the persona paper, docs/methods.md [1]): the sum
  divided by ``O_t``.

Pairs whose true answer is missing are left out; a metric is the mean over the scored
``(u, t)`` pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from models.base import DTYPE

METRICS = ("accuracy", "log_loss", "brier_mean", "brier_sum")
LOG_FLOOR = 1e-12


@dataclass
class MetricSums:
    """Sums of each metric over scored pairs, and the number of pairs (for pooling batches)."""

    accuracy: float = 0.0
    log_loss: float = 0.0
    brier_mean: float = 0.0
    brier_sum: float = 0.0
    count: int = 0

    def add(self, other: MetricSums) -> MetricSums:
        return MetricSums(
            self.accuracy + other.accuracy,
            self.log_loss + other.log_loss,
            self.brier_mean + other.brier_mean,
            self.brier_sum + other.brier_sum,
            self.count + other.count,
        )

    def means(self) -> dict[str, float]:
        """``{metric: mean over pairs}`` (NaN when nothing was scored)."""
        n = self.count
        return {m: (getattr(self, m) / n if n else float("nan")) for m in METRICS}


def score_predictions(pred: Tensor, truth: Tensor, n_options: Tensor) -> MetricSums:
    """Metric sums of target predictives against true answers.

    Args:
        pred: ``[B, T, O]`` predictive distributions (zero beyond each item's options).
        truth: ``LongTensor [B, T]`` true options, ``-1`` = missing (not scored).
        n_options: ``LongTensor [T]``: ``O_t`` of each target.

    Returns:
        The sums over the scored pairs and their number.
    """
    pred = pred.to(DTYPE)
    truth = truth.long()
    valid = truth >= 0
    y = truth.clamp_min(0)
    o_n = pred.shape[-1]
    opt_ok = torch.arange(o_n).view(1, 1, -1) < n_options.view(1, -1, 1)
    masked = torch.where(opt_ok, pred, torch.full_like(pred, -1.0))
    correct = (masked.argmax(-1) == y) & valid
    p_true = pred.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    log_loss = -p_true.clamp_min(LOG_FLOOR).log()
    onehot = torch.nn.functional.one_hot(y, o_n).to(DTYPE)
    sq = torch.where(opt_ok, (pred - onehot) ** 2, torch.zeros((), dtype=DTYPE)).sum(-1)
    v = valid.to(DTYPE)
    return MetricSums(
        accuracy=float(correct.sum()),
        log_loss=float((log_loss * v).sum()),
        brier_mean=float((sq / n_options.view(1, -1).to(DTYPE) * v).sum()),
        brier_sum=float((sq * v).sum()),
        count=int(valid.sum()),
    )
