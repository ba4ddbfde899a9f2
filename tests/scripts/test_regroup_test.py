"""scripts/regroup_test.py: a dataset copy whose test group is a region no split uses."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "regroup_test", Path(__file__).resolve().parents[2] / "scripts" / "regroup_test.py"
)
assert _SPEC is not None and _SPEC.loader is not None
regroup_test = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(regroup_test)

ROWS = [("1", "C"), ("2", "C"), ("3", "D"), ("4", "A"), ("5", "B"), ("6", "A"), ("7", "D")]


def _dataset(folder: Path) -> Path:
    folder.mkdir()
    lines = ["uid,reg,q1"] + [f"{u},{r},A" for u, r in ROWS]
    (folder / "responses.csv").write_text("\n".join(lines) + "\n")
    codebook = [
        {
            "id": "reg",
            "question": "Region?",
            "options": {"A": "North", "B": "East", "C": "South", "D": "West"},
        },
        {"id": "q1", "question": "Q?", "options": {"A": "yes", "B": "no"}},
    ]
    (folder / "codebook.jsonl").write_text("\n".join(json.dumps(c) for c in codebook) + "\n")
    manifest = {
        "name": "toy",
        "id_column": "uid",
        "region_column": "reg",
        "region_split": {"train": "South", "test": "West"},
        "demographics": [],
        "questions": ["q1"],
    }
    (folder / "dataset.json").write_text(json.dumps(manifest))
    # ids written as floats, as the format allows
    split = {"train_users": ["1.0"], "val_users": ["2"], "test_users": ["3", "7"]}
    (folder / "user_split.json").write_text(json.dumps(split))
    (folder / "runs.csv").write_text("seed,cand_qids,eval_qids\n0,['q1'],['q1']\n")
    return folder


@pytest.mark.parametrize("region", ["North", "A"])
def test_test_group_becomes_the_regions_users(tmp_path: Path, region: str) -> None:
    src = _dataset(tmp_path / "d")
    out = tmp_path / "north"
    assert regroup_test.main(["--dataset", str(src), "--region", region, "--out", str(out)]) == 0
    split = json.loads((out / "user_split.json").read_text())
    assert split == {"train_users": ["1.0"], "val_users": ["2"], "test_users": ["4", "6"]}
    manifest = json.loads((out / "dataset.json").read_text())
    assert manifest["region_split"] == {"train": "South", "test": "North"}
    for name in ("responses.csv", "codebook.jsonl", "runs.csv"):
        assert (out / name).read_text() == (src / name).read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "north"]  # no temp folder left


def test_refuses_fitted_users_unknown_regions_and_existing(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    src = _dataset(tmp_path / "d")
    out = tmp_path / "o"
    # user "1.0" trains: the South is refused although the split writes its id as a float
    assert regroup_test.main(["--dataset", str(src), "--region", "South", "--out", str(out)]) == 2
    assert "2 users of South are training or validation users (first: 1)" in capsys.readouterr().err
    assert regroup_test.main(["--dataset", str(src), "--region", "Mars", "--out", str(out)]) == 2
    assert "'Mars' is not an option of 'reg': A (North), B (East)" in capsys.readouterr().err
    assert not out.exists()
    (tmp_path / "taken").mkdir()
    assert (
        regroup_test.main(
            ["--dataset", str(src), "--region", "A", "--out", str(tmp_path / "taken")]
        )
        == 2
    )
    assert "exists" in capsys.readouterr().err
    manifest = json.loads((src / "dataset.json").read_text())
    del manifest["region_column"]
    (src / "dataset.json").write_text(json.dumps(manifest))
    assert regroup_test.main(["--dataset", str(src), "--region", "A", "--out", str(out)]) == 2
    assert "no region_column" in capsys.readouterr().err
    assert not out.exists()
