"""Paths of the shipped datasets and small copies of them, for tests and fixtures."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
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
