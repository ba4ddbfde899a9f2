"""scripts/lifecycle_report.py: the lifecycle criteria from bench result files, checked
against differences worked out by hand."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "lifecycle_report", Path(__file__).resolve().parents[2] / "scripts" / "lifecycle_report.py"
)
assert _SPEC is not None and _SPEC.loader is not None
lifecycle_report = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(lifecycle_report)


def _method(per_run_last: list[list[float]]) -> dict:
    """Per run, the log loss after 1 question at each arrival count (0 questions: 0.7)."""
    return {
        "per_run": [
            {"seed": i, "log_loss": [[0.7, v] for v in run]} for i, run in enumerate(per_run_last)
        ]
    }


def _result(default: list[list[float]], fixed: list[list[float]], full: float) -> dict:
    return {
        "dataset": "toy",
        "arrivals": [0, 50, 200],
        "budget": 1,
        "protocol": {"calibration_items": 2, "calibration_min_answers": 300},
        "methods": {
            "default": _method(default),
            "uniform": _method([[0.69, 0.69, 0.69]] * 2),
            "fixed": _method(fixed),
            "full_history": _method([[full] * 3] * 2),
        },
    }


def test_paired_mean_and_standard_error() -> None:
    assert lifecycle_report.paired([1.0, 2.0], [0.5, 1.0]) == (0.75, 0.25)
    assert lifecycle_report.paired([1.0], [0.25]) == (0.75, 0.0)


def test_criteria_from_hand_worked_differences(tmp_path: Path) -> None:
    # default - fixed at 200: run differences +0.03 and +0.01 -> mean 0.02, SE 0.01:
    # 0.02 is not above 2 SE (0.02), so not worse beyond noise
    good = _result(
        [[0.69, 0.50, 0.40], [0.69, 0.52, 0.42]], [[0.69, 0.5, 0.37], [0.69, 0.5, 0.41]], 0.405
    )
    c = lifecycle_report.criteria(good, 1)
    assert c["falls"] and c["below_uniform"] and c["not_worse_than_fixed"]
    mean, se = c["fixed"][2]
    assert math.isclose(mean, 0.02) and math.isclose(se, 0.01)
    assert c["near_full_history"]  # 0.41 - 0.405 = 0.005 <= 0.01
    # +0.03 and +0.029 -> mean 0.0295, SE 0.0005: worse beyond 2 SE; gap 0.0295 + ... > 0.01
    bad = _result(
        [[0.69, 0.50, 0.40], [0.69, 0.52, 0.42]], [[0.69, 0.5, 0.37], [0.69, 0.5, 0.391]], 0.38
    )
    c = lifecycle_report.criteria(bad, 1)
    assert not c["not_worse_than_fixed"] and not c["near_full_history"]
    flat = _result([[0.69, 0.69, 0.69]] * 2, [[0.69, 0.69, 0.69]] * 2, 0.4)
    c = lifecycle_report.criteria(flat, 1)
    assert not c["falls"] and not c["below_uniform"] and c["not_worse_than_fixed"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(good))
    text = lifecycle_report.report(path)
    assert "| `default` | 0.6900 ± 0.0000 | 0.5100 ± 0.0100 | 0.4100 ± 0.0100 |" in text
    assert "| within 0.01 of `full_history` at 200 | +0.0050 (0.0100) | yes |" in text


def test_a_missing_file_is_a_one_line_error(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    import pytest

    with pytest.raises(SystemExit) as exc:
        lifecycle_report.main([str(tmp_path / "nope.json")])
    assert exc.value.code == 2
    assert "no such result file:" in capsys.readouterr().err


def test_other_result_files_in_the_glob_are_skipped(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # docs/benchmarks.md's command globs docs/bench/lifecycle_*.json, which also matches
    # the ceiling files (no "budget", no "methods")
    good = _result([[0.69, 0.50, 0.40]] * 2, [[0.69, 0.5, 0.4]] * 2, 0.4)
    (tmp_path / "lifecycle_a.json").write_text(json.dumps(good))
    (tmp_path / "lifecycle_ceiling_b.json").write_text(json.dumps({"dataset": "toy", "rows": []}))
    files = sorted(str(p) for p in tmp_path.glob("lifecycle_*.json"))
    assert lifecycle_report.main(files) == 0
    out = capsys.readouterr()
    assert "### toy: lifecycle_a.json" in out.out and "lifecycle_ceiling_b" not in out.out
    assert f"skipped {tmp_path / 'lifecycle_ceiling_b.json'}: not a priorly bench" in out.err
