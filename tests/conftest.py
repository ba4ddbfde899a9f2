"""Shared pytest fixtures: paths of the shipped datasets and small dataset copies.

Fixtures here are used by several packages' tests; keep them cheap and free of state
shared between tests (every fixture that writes does so under ``tmp_path``).
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DATASETS_DIR = REPO_ROOT / "datasets"
CANONICAL_DATASETS = ("ces", "opinionqa")


def write_small_dataset(source: Path, dest: Path, n_respondents: int = 30) -> Path:
    """Copy a canonical dataset with only its first ``n_respondents`` respondents.

    The codebook, manifest and runs are copied unchanged; ``user_split.json`` keeps only
    the kept respondents (ids written exactly as in the source file). Returns ``dest``.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with (source / "responses.csv").open(newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    kept = rows[: n_respondents + 1]
    with (dest / "responses.csv").open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows(kept)
    for name in ("codebook.jsonl", "dataset.json", "runs.csv"):
        if (source / name).exists():
            shutil.copyfile(source / name, dest / name)
    split_path = source / "user_split.json"
    if split_path.exists():

        def norm(x: object) -> str:
            s = str(x)
            return s[:-2] if s.endswith(".0") else s

        keep = {norm(r[0]) for r in kept[1:]}
        split = json.loads(split_path.read_text(encoding="utf-8"))
        small = {k: [u for u in v if norm(u) in keep] for k, v in split.items()}
        (dest / "user_split.json").write_text(json.dumps(small), encoding="utf-8")
    return dest


@pytest.fixture(scope="session")
def datasets_dir() -> Path:
    """The folder of the datasets shipped with the project."""
    return DATASETS_DIR


@pytest.fixture
def small_dataset_factory(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``make(name="ces", n_respondents=30, folder="small")`` -> a fresh copy."""

    def make(name: str = "ces", n_respondents: int = 30, folder: str | None = None) -> Path:
        return write_small_dataset(
            DATASETS_DIR / name, tmp_path / (folder or f"{name}_{n_respondents}"), n_respondents
        )

    return make


@pytest.fixture
def small_dataset(small_dataset_factory: Callable[..., Path]) -> Path:
    """A 30-respondent copy of the CES dataset in a temporary folder (safe to corrupt)."""
    return small_dataset_factory("ces", 30)
