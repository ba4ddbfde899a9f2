"""scripts/lifecycle_ceiling.py: the bound on what N arrivals can reach, on a small CES
copy (the masks checked cell by cell, the table and JSON written)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tests.support.data import write_small_dataset

REPO_ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location(
    "lifecycle_ceiling", REPO_ROOT / "scripts" / "lifecycle_ceiling.py"
)
assert _SPEC is not None and _SPEC.loader is not None
lifecycle_ceiling = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(lifecycle_ceiling)


def test_keep_leaves_only_the_given_columns() -> None:
    x = torch.tensor([[1, 2, 0], [0, -1, 1]])
    assert lifecycle_ceiling._keep(x, [0, 2]).tolist() == [[1, -1, 0], [0, -1, 1]]


def test_small_dataset_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = write_small_dataset(REPO_ROOT / "datasets" / "ces", tmp_path / "ces", 80)
    out = tmp_path / "c.json"
    code = lifecycle_ceiling.main(
        ["--dataset", str(small), "--arrivals", "20", "--runs", "1", "--budget", "2",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    table = capsys.readouterr().out
    assert "| full_history |" in table and "| complete |" in table and "| random10 |" in table
    assert "| complete_all |" in table
    result = json.loads(out.read_text())
    assert result["arrivals"] == 20
    assert set(result["curves"]) == {"full_history", "complete", "complete_all", "random10"}
    assert all(len(c) == 1 and len(c[0]) == 3 for c in result["curves"].values())
    with pytest.raises(SystemExit, match="--arrivals must be between 1 and"):
        lifecycle_ceiling.main(["--dataset", str(small), "--arrivals", "9999"])
