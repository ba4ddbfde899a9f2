"""Budgets and the precedence of the stopping rules."""

from __future__ import annotations

import pytest

from elicitation.budget import Budget, StopReason
from elicitation.errors import BudgetError


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_questions": -1}, "max_questions"),
        ({"max_questions": 2.5}, "max_questions"),
        ({"min_questions": -2}, "min_questions"),
        ({"max_questions": 2, "min_questions": 3}, "exceeds"),
        ({"stop_eig_threshold": -0.1}, "stop_eig_threshold"),
        ({"stop_entropy_threshold": float("nan")}, "stop_entropy_threshold"),
        ({"stop_entropy_threshold": "low"}, "stop_entropy_threshold"),
    ],
)
def test_invalid_budgets_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(BudgetError, match=match):
        Budget(**kwargs)


def test_from_dict_refuses_unknown_settings() -> None:
    assert Budget.from_dict({"max_questions": 3}).max_questions == 3
    with pytest.raises(BudgetError, match="unknown settings.*max_question"):
        Budget.from_dict({"max_question": 3})
    b = Budget(5, 1, 0.01, 0.2)
    assert Budget.from_dict(b.to_dict()) == b


def test_forced_stops_come_first() -> None:
    b = Budget(max_questions=3, min_questions=3, stop_eig_threshold=1.0, stop_entropy_threshold=1.0)
    assert b.check(0, 0) is StopReason.NO_CANDIDATES
    assert b.check(3, 5, target_entropy=9, best_gain=9) is StopReason.MAX_QUESTIONS
    assert b.check(1, 0, target_entropy=9, best_gain=9) is StopReason.NO_CANDIDATES


def test_min_questions_blocks_early_stops() -> None:
    b = Budget(
        max_questions=10, min_questions=2, stop_eig_threshold=0.05, stop_entropy_threshold=0.1
    )
    assert b.check(0, 5, target_entropy=0.0, best_gain=0.0) is None
    assert b.check(1, 5, target_entropy=0.0, best_gain=0.0) is None
    assert b.check(2, 5, target_entropy=0.0, best_gain=0.0) is StopReason.LOW_ENTROPY


def test_thresholds() -> None:
    b = Budget(max_questions=None, stop_eig_threshold=0.05, stop_entropy_threshold=0.1)
    assert b.check(50, 5, target_entropy=0.5, best_gain=0.5) is None
    assert b.check(50, 5, target_entropy=0.09, best_gain=0.5) is StopReason.LOW_ENTROPY
    assert b.check(50, 5, target_entropy=0.5, best_gain=0.04) is StopReason.LOW_GAIN
    assert b.check(50, 5, target_entropy=0.1, best_gain=0.05) is None  # strictly below
    assert Budget(max_questions=0).check(0, 5) is StopReason.MAX_QUESTIONS
