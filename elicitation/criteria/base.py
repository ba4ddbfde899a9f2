"""The base of the selection criteria: the abstract criterion and shared entropy helpers.

A criterion scores candidate items ``x`` for a respondent whose belief state is ``state``
under a fitted :class:`models.base.BeliefModel`; the next question is the highest score
(:func:`best_index`). Notation: ``h`` the answers so far, ``I*`` the target items,
``H(p) = -sum_j p_j log p_j`` (nats, ``0 log 0 = 0``).

Example::

    >>> entropy(torch.tensor([0.5, 0.5], dtype=torch.float64))
    tensor(0.6931, dtype=torch.float64)
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from elicitation.errors import CriterionNotApplicableError
from models.base import DTYPE, MISSING, BeliefModel

ItemList = Sequence[int] | Tensor


def as_items(items: ItemList) -> list[int]:
    return [int(i) for i in torch.as_tensor(items, dtype=torch.long).reshape(-1).tolist()]


def entropy(p: Tensor, dim: int = -1) -> Tensor:
    """Shannon entropy in nats along ``dim``: ``H(p) = -sum_j p_j log p_j`` with ``0 log 0 = 0``.

    Args:
        p: probabilities ``[..., O, ...]`` (zeros allowed, e.g. padding beyond ``O_i``).
        dim: the option dimension.

    Returns:
        ``p`` with ``dim`` removed.
    """
    return -torch.special.xlogy(p, p).sum(dim)


def expected_target_entropy(p_x: Tensor, p_t: Tensor) -> Tensor:
    """Expected mean target entropy after answering each candidate (docs/methods.md §1).

    ``E(x) = sum_k p(Y_x = k | h) * (1/|I*|) sum_{t in I*} H(p(Y_t | h, Y_x = k))``.

    Args:
        p_x: ``[..., C, O]`` candidate predictives (zero beyond ``O_x``).
        p_t: ``[..., C, O, T, O]`` target predictives after each candidate answer.

    Returns:
        ``[..., C]``.
    """
    h = entropy(p_t).mean(-1)  # [..., C, O]
    return (p_x * h).sum(-1)


def mean_target_entropy(p_targets: Tensor) -> Tensor:
    """``(1/|I*|) sum_t H(p(Y_t | h))`` for predictives ``[..., T, O]``; returns ``[...]``."""
    return entropy(p_targets).mean(-1)


def check_targets(name: str, targets: list[int]) -> None:
    if not targets:
        raise CriterionNotApplicableError(
            f"criterion {name!r} needs at least one target item (none were given)"
        )


class SelectionCriterion(ABC):
    """Scores candidate items; the selected item is the one with the highest score.

    Subclasses set ``name`` (the registry key) and implement :meth:`score` (one
    respondent) and :meth:`score_batch` (``B`` respondents sharing candidates and targets).

    Attributes:
        name: registry name.
        scores_are_target_gains: true when a score is the expected information gain about
            the targets (nats), so a stopping rule on the expected gain can use it directly.
        adaptive: false for a criterion whose order ignores the respondent's answers.
        uses_fixed_order: true for a criterion that needs the non-adaptive
            :class:`FixedOrder` list of the pool (``fixed``, ``eig_anchored``): the list
            is expensive (a greedy search under the prior), so a live study computes it
            once per fitted model, pool and targets and hands it over with
            ``set_fixed_order`` instead of letting :meth:`prepare` compute it.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    scores_are_target_gains: ClassVar[bool] = False
    adaptive: ClassVar[bool] = True
    uses_fixed_order: ClassVar[bool] = False

    def prepare(self, model: BeliefModel, pool: ItemList, targets: ItemList) -> None:
        """Precompute what does not depend on the respondent (default: nothing).

        Called with the full candidate pool of a study (or a benchmark run) before any
        respondent is scored, so that a non-adaptive order is computed once, on the pool,
        and not re-derived from whatever candidates remain later.
        """
        return None

    @abstractmethod
    def score(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        """Scores ``[C]`` (float64) for ``candidates`` of one respondent; higher is better."""

    @abstractmethod
    def score_batch(
        self, model: BeliefModel, states: Any, candidates: ItemList, targets: ItemList
    ) -> Tensor:
        """Scores ``[B, C]`` for a batch state of ``B`` respondents."""

    def score_with_gains(
        self, model: BeliefModel, state: Any, candidates: ItemList, targets: ItemList
    ) -> tuple[Tensor, Tensor | None]:
        """``(scores [C], one-step target gains [C] or None)`` for one respondent.

        The gains are the ``eig`` scores when the criterion computed them anyway (so a
        stopping rule on the expected gain needs no second lookahead); ``None`` otherwise.
        """
        scores = self.score(model, state, candidates, targets)
        return scores, (scores if self.scores_are_target_gains else None)

    def params(self) -> dict[str, Any]:
        """The constructor parameters (for :meth:`explain` and for storing a decision)."""
        return {}

    def explain(self) -> dict[str, Any]:
        """A JSON-able description: name, what the score means, and parameters."""
        return {"name": self.name, "description": self.description, "params": self.params()}


def require_method(model: BeliefModel, attr: str, criterion: str, what: str) -> Callable[..., Any]:
    fn = getattr(model, attr, None)
    if not callable(fn):
        raise CriterionNotApplicableError(
            f"criterion {criterion!r} needs {what} (method {attr!r}); "
            f"{type(model).__name__} (family {model.family!r}) has none"
        )
    return fn


def answer_options(states: Any, item: int, option: int, b: int) -> Tensor:
    """Options ``[B]`` for a hypothetical batched update: ``option``, or ``-1`` (no update)
    for respondents whose state already holds an answer to ``item``.

    Batch states that record observed answers (a ``responses [B, I]`` attribute, as the
    persona-mixture states do) refuse a second answer to an item; their score for that
    item is meaningless anyway (callers mask items already asked).
    """
    opts = torch.full((b,), option, dtype=torch.long)
    responses = getattr(states, "responses", None)
    if isinstance(responses, Tensor) and responses.dim() == 2 and responses.shape[0] == b:
        opts = torch.where(responses[:, item] >= 0, torch.full_like(opts, MISSING), opts)
    return opts


def best_index(scores: Tensor) -> int:
    """Index of the highest score (the first one on ties); ``-1`` for an empty tensor."""
    if scores.numel() == 0:
        return -1
    s = torch.nan_to_num(scores.to(DTYPE), nan=-math.inf)
    return int(torch.argmax(s))
