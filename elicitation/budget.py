"""Budgets and stopping rules for one respondent.

A session stops, in this order of precedence:

1. ``no_candidates``: every candidate item has been asked or skipped;
2. ``max_questions``: ``max_questions`` questions were posed (answered or skipped);
3. never before ``min_questions`` questions were posed (unless 1 or 2);
4. ``low_entropy``: the mean predictive entropy of the target items is below
   ``stop_entropy_threshold`` (nats) — the targets are already predicted confidently;
5. ``low_gain``: the best expected information gain about the targets over the remaining
   candidates is below ``stop_eig_threshold`` (nats) — no question is worth asking.

A skipped question counts as posed (the respondent saw it) but gives no update, and it is
never asked again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from elicitation.errors import BudgetError


class StopReason(StrEnum):
    """Why a session stopped (stored with the decision)."""

    NO_CANDIDATES = "no_candidates"
    MAX_QUESTIONS = "max_questions"
    LOW_ENTROPY = "low_entropy"
    LOW_GAIN = "low_gain"


@dataclass(frozen=True)
class Budget:
    """How many questions one respondent may be asked, and when to stop early.

    Attributes:
        max_questions: the most questions posed (``None`` = no limit but the candidates).
        min_questions: never stop early before this many questions were posed.
        stop_eig_threshold: stop when the best expected gain (nats) is below this.
        stop_entropy_threshold: stop when the mean target entropy (nats) is below this.
    """

    max_questions: int | None = 10
    min_questions: int = 0
    stop_eig_threshold: float | None = None
    stop_entropy_threshold: float | None = None

    def __post_init__(self) -> None:
        if self.max_questions is not None and (
            isinstance(self.max_questions, bool)
            or int(self.max_questions) != self.max_questions
            or self.max_questions < 0
        ):
            raise BudgetError(
                f"budget: max_questions must be an integer >= 0, got {self.max_questions!r}"
            )
        if (
            isinstance(self.min_questions, bool)
            or int(self.min_questions) != self.min_questions
            or self.min_questions < 0
        ):
            raise BudgetError(
                f"budget: min_questions must be an integer >= 0, got {self.min_questions!r}"
            )
        if self.max_questions is not None and self.min_questions > self.max_questions:
            raise BudgetError(
                f"budget: min_questions ({self.min_questions}) exceeds max_questions "
                f"({self.max_questions})"
            )
        for name in ("stop_eig_threshold", "stop_entropy_threshold"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int | float) and v >= 0 and v == v):
                raise BudgetError(f"budget: {name} must be a number >= 0 or None, got {v!r}")

    @property
    def needs_gain(self) -> bool:
        """Whether the stopping rule needs the best expected gain."""
        return self.stop_eig_threshold is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Budget:
        """Build from a mapping; unknown keys are an error (a silently ignored option is a bug)."""
        unknown = sorted(set(d) - {f for f in cls.__dataclass_fields__})
        if unknown:
            raise BudgetError(f"budget: unknown settings {unknown}")
        return cls(**d)

    def forced_stop(self, n_posed: int, n_left: int) -> StopReason | None:
        """The stops that do not depend on the model: no candidates left, or the maximum."""
        if n_left <= 0:
            return StopReason.NO_CANDIDATES
        if self.max_questions is not None and n_posed >= self.max_questions:
            return StopReason.MAX_QUESTIONS
        return None

    def check(
        self,
        n_posed: int,
        n_left: int,
        *,
        target_entropy: float | None = None,
        best_gain: float | None = None,
    ) -> StopReason | None:
        """The stop reason for a respondent, or ``None`` to ask another question.

        Args:
            n_posed: questions posed so far (answered + skipped).
            n_left: candidate items neither asked nor skipped.
            target_entropy: current mean target predictive entropy (nats), if known.
            best_gain: best expected information gain about the targets, if known.
        """
        forced = self.forced_stop(n_posed, n_left)
        if forced is not None:
            return forced
        if n_posed < self.min_questions:
            return None
        if (
            self.stop_entropy_threshold is not None
            and target_entropy is not None
            and target_entropy < self.stop_entropy_threshold
        ):
            return StopReason.LOW_ENTROPY
        if (
            self.stop_eig_threshold is not None
            and best_gain is not None
            and best_gain < self.stop_eig_threshold
        ):
            return StopReason.LOW_GAIN
        return None
