"""scripts/group_report.py: the §4 tables of docs/group.md from bench result files."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "group_report", Path(__file__).resolve().parents[1] / "scripts" / "group_report.py"
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
    assert "* default − other: r1 -0.1250 (t -inf, 0/2); r2 +0.1250 (t +inf, 2/0)" in text
    assert "* default − greedy_random" not in text  # ahead in every round
    assert "(greedy_random, 0.5000): +37.50%" in text
    assert "above the reference at every round 1..2: False" in text  # 0.6875 < 0.7
