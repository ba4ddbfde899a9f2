"""scripts/resample_runs.py: new benchmark runs (study designs) on the same answers."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "resample_runs", Path(__file__).resolve().parents[2] / "scripts" / "resample_runs.py"
)
assert _SPEC is not None and _SPEC.loader is not None
resample_runs = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(resample_runs)


def _dataset(folder: Path, runs: list[tuple[list[str], list[str]]]) -> Path:
    folder.mkdir()
    (folder / "responses.csv").write_text("user_id,q1\n1,a\n")
    with (folder / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seed", "cand_qids", "eval_qids"])
        for i, (cand, tgt) in enumerate(runs):
            w.writerow([i, repr(cand), repr(tgt)])
    return folder


def test_new_runs_draw_the_same_sizes_from_the_runs_questions(tmp_path: Path) -> None:
    src = _dataset(tmp_path / "d", [(["a", "b", "c"], ["d"]), (["e", "a", "b"], ["c"])])
    out = tmp_path / "alt"
    assert resample_runs.main(["--dataset", str(src), "--out", str(out), "--runs", "6"]) == 0
    runs = resample_runs.read_runs(out / "runs.csv")
    assert len(runs) == 6
    for cand, tgt in runs:
        assert len(cand) == 3 and len(tgt) == 1 and not set(cand) & set(tgt)
        assert set(cand) | set(tgt) <= {"a", "b", "c", "d", "e"}
    assert len({tuple(c) + tuple(t) for c, t in runs}) > 1  # the runs differ
    assert (out / "responses.csv").read_text() == (src / "responses.csv").read_text()
    again = resample_runs.resample(resample_runs.read_runs(src / "runs.csv"), 1000, 6)
    assert [(c, t) for _, c, t in again] == runs  # the seed fixes the designs
    assert [s for s, _, _ in again] == list(range(100, 106))


def test_refuses_missing_unreadable_and_existing(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert (
        resample_runs.main(["--dataset", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    )
    assert "nope/runs.csv does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "runs.csv").write_text("seed,cand_qids,eval_qids\n0,[oops,['a']\n")
    assert resample_runs.main(["--dataset", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "line 2: cand_qids / eval_qids unreadable" in capsys.readouterr().err
    src = _dataset(tmp_path / "d", [(["a", "b"], ["c"])])
    assert resample_runs.main(["--dataset", str(src), "--out", str(bad)]) == 2
    assert "exists" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing half-written
