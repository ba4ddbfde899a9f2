"""Budgets of a group elicitation: respondents per round, rounds and caps.

Example::

    >>> GroupBudget(respondents=0.1, rounds=4).per_round(250)
    25
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from elicitation.errors import BudgetError


@dataclass(frozen=True)
class GroupBudget:
    """Budgets of a group elicitation.

    Attributes:
        respondents: respondents asked per round: an ``int >= 1`` is a count, a ``float``
            in ``(0, 1]`` is a share of the group (rounded to the nearest count, >= 1).
        rounds: number of rounds (one question each).
        total_answers: cap on the number of members asked over all rounds (``None``: no cap).
        max_questions_per_respondent: a member is asked at most this many questions
            (``None``: no cap).
    """

    respondents: int | float
    rounds: int
    total_answers: int | None = None
    max_questions_per_respondent: int | None = None

    def __post_init__(self) -> None:
        r = self.respondents
        if isinstance(r, bool) or not isinstance(r, int | float):
            raise BudgetError(f"respondents must be a count or a share, got {r!r}")
        if isinstance(r, int) and r < 1:
            raise BudgetError(f"respondents per round must be >= 1, got {r}")
        if isinstance(r, float) and not 0.0 < r <= 1.0:
            raise BudgetError(f"a respondent share must be in (0, 1], got {r}")
        if self.rounds < 0:
            raise BudgetError(f"rounds must be >= 0, got {self.rounds}")
        if self.total_answers is not None and self.total_answers < 0:
            raise BudgetError(f"total_answers must be >= 0, got {self.total_answers}")
        if self.max_questions_per_respondent is not None and self.max_questions_per_respondent < 1:
            raise BudgetError(
                f"max_questions_per_respondent must be >= 1, got {self.max_questions_per_respondent}"
            )

    def per_round(self, n_members: int) -> int:
        """Respondents per round for a group of ``n_members``."""
        if isinstance(self.respondents, float):
            return max(1, int(math.floor(self.respondents * n_members + 0.5)))
        return int(self.respondents)
