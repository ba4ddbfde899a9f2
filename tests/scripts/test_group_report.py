"""scripts/group_report.py: the §4 tables of docs/group.md from bench result files."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "group_report", Path(__file__).resolve().parents[2] / "scripts" / "group_report.py"
)
assert _SPEC is not None and _SPEC.loader is not None
group_report = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(group_report)


def _method(runs: list[list[float]]) -> dict[str, list]:
    acc = [sum(r[i] for r in runs) / len(runs) for i in range(len(runs[0]))]
    return {
        "accuracy": acc,
        "accuracy_runs": runs,
        "brier_sum": [0.3] * len(acc),
        "perplexity": [1.5] * len(acc),
        "plan_seconds": [0.5, 1.5],
    }


def test_paired_difference_and_t() -> None:
    mean, t, up, down = group_report.paired([0.3, 0.5, 0.4], [0.2, 0.2, 0.4])
    # differences 0.1, 0.3, 0.0: mean 0.1333, sd 0.1528, t = mean / (sd / sqrt 3)
    assert mean == pytest.approx(0.4 / 3)
    assert t == pytest.approx((0.4 / 3) / (math.sqrt(0.07 / 3) / math.sqrt(3)))
    assert (up, down) == (2, 0)


def test_sign_flip_p_by_enumeration() -> None:
    # |d| = (0.1, 0.3, 0): signed sums 0.4, 0.4, 0.2, 0.2, -0.2, -0.2, -0.4, -0.4;
    # 2 of 8 reach the observed 0.4
    assert group_report.sign_flip_p([0.1, 0.3, 0.0]) == 0.25
    assert group_report.sign_flip_p([-0.1, -0.2]) == 1.0  # every sum >= -0.3
    assert group_report.sign_flip_p([0.5] * 10) == 1 / 1024
    # 0.1 + 0.2 - 0.3 is 5.6e-17 in floating point; the sums 0.6, 0.4, 0.2 and both
    # zeros reach it: 5 of 8 (4 of 8 if the zeros' last bits decided)
    assert group_report.sign_flip_p([0.1, 0.2, -0.3]) == 5 / 8
    with pytest.raises(ValueError, match="1..20 paired runs"):
        group_report.sign_flip_p([])


def test_report_marks_rounds_and_reference(tmp_path: Path) -> None:
    result = {
        "dataset": "toy",
        "respondent_budget": 0.1,
        "respondents_per_round": 3,
        "n_test_members": 30,
        "n_runs": 2,
        "rounds": 2,
        "methods": {
            "greedy_random": _method([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]),
            "default": _method([[0.5, 0.625, 0.75], [0.5, 0.5, 0.625]]),
            "other": _method([[0.5, 0.75, 0.625], [0.5, 0.625, 0.5]]),
        },
    }
    path = tmp_path / "toy_10.json"
    path.write_text(json.dumps(result))
    text = group_report.report(path, [0.5, 0.55, 0.7])
    assert "| **default** | 0.5000 | 0.5625 | 0.6875 | 0.3000 | 1.5000 | 1.00 |" in text
    assert "greedy_random: >>" in text and "other: <>" in text
    assert (
        "* default − other: r1 -0.1250 (t -inf, 0/2, p 0.250); r2 +0.1250 (t +inf, 2/0, p 1.000)"
        in text
    )
    # greedy_random: differences (0.125, 0) and (0.25, 0.125), p 2/4 and 1/4
    assert (
        "Against the paper's methods (2 cells, rounds 1..2): default ahead in 2 "
        "(0 with p < 0.05), behind in 0 (0 with p < 0.05)" in text
    )
    assert (
        "Against the other methods (2 cells, rounds 1..2): default ahead in 1 "
        "(0 with p < 0.05), behind in 1 (0 with p < 0.05, smallest p 0.250)" in text
    )
    assert "* default − greedy_random" not in text  # ahead in every round
    assert "(greedy_random, 0.5000): +37.50%" in text
    assert "above the reference at every round 1..2: False" in text  # 0.6875 < 0.7
