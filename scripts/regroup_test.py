"""Copy a dataset folder with another test group: the users of a region that no split uses.

    python scripts/regroup_test.py --dataset datasets/ces --region Midwest --out /tmp/g/reg/ces_midwest

The published protocol trains and validates on the users of one region and tests on
those of another (`region_split` in dataset.json); the users of the other regions are in
responses.csv but in no split, so no method was ever chosen on them. This copies the
folder with `test_users` replaced by the users whose `region_column` answer is the given
region (its codebook label, e.g. `Midwest`, or its option letter), and
`region_split.test` set to that label. Training and validation users, answers and runs
are unchanged, so the fitted models are the same; only the group differs.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import tempfile
from pathlib import Path

from elicitation.datasets import normalise_id


def region_option(codebook: Path, region_column: str, region: str) -> tuple[str, str]:
    """``(option letter, label)`` of ``region`` (a label or a letter) in the region item."""
    with codebook.open() as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{codebook}, line {n}: not JSON ({exc.msg})") from None
            if item.get("id") != region_column:
                continue
            options = item.get("options") or {}
            for letter, label in options.items():
                if region in (letter, label):
                    return letter, str(label)
            known = ", ".join(f"{k} ({v})" for k, v in options.items())
            raise ValueError(f"region {region!r} is not an option of {region_column!r}: {known}")
    raise ValueError(f"{codebook}: no item {region_column!r} (the region_column)")


def regroup(dataset: Path, region: str) -> tuple[dict, dict, int]:
    """The new ``(user_split, manifest)`` of ``dataset`` with ``region``'s users as the test
    group, and how many they are."""
    manifest = json.loads((dataset / "dataset.json").read_text())
    column = manifest.get("region_column")
    if not column:
        raise ValueError(f"{dataset / 'dataset.json'}: no region_column")
    letter, label = region_option(dataset / "codebook.jsonl", column, region)
    split_file = dataset / manifest.get("split", "user_split.json")
    split = json.loads(split_file.read_text())
    id_column = manifest["id_column"]
    with (dataset / "responses.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or column not in reader.fieldnames:
            raise ValueError(f"{dataset / 'responses.csv'}: no column {column!r}")
        users = [row[id_column] for row in reader if row[column] == letter]
    if not users:
        raise ValueError(f"no user has {column} = {letter} ({label})")
    fitted = {normalise_id(u) for part in ("train_users", "val_users") for u in split.get(part, [])}
    overlap = [u for u in users if normalise_id(u) in fitted]
    if overlap:
        raise ValueError(
            f"{len(overlap)} users of {label} are training or validation users "
            f"(first: {overlap[0]}); choose a region that no split uses"
        )
    new_split = dict(split)
    new_split["test_users"] = users
    new_manifest = dict(manifest)
    new_manifest["region_split"] = {**(manifest.get("region_split") or {}), "test": label}
    return new_split, new_manifest, len(users)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, type=Path)
    p.add_argument("--region", required=True, help="codebook label or option letter")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    if not (args.dataset / "dataset.json").is_file():
        print(f"error: {args.dataset / 'dataset.json'} does not exist", file=sys.stderr)
        return 2
    if args.out.exists():
        print(f"error: {args.out} exists", file=sys.stderr)
        return 2
    try:
        split, manifest, n = regroup(args.dataset, args.region)
    except (ValueError, KeyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # written beside the target and renamed into place: no half-written folder
    tmp = Path(tempfile.mkdtemp(dir=args.out.parent, prefix=f".{args.out.name}."))
    try:
        shutil.copytree(args.dataset, tmp / "d")
        (tmp / "d" / manifest.get("split", "user_split.json")).write_text(json.dumps(split))
        (tmp / "d" / "dataset.json").write_text(json.dumps(manifest, indent=2) + "\n")
        (tmp / "d").rename(args.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {args.out} ({n} test users from {manifest['region_split']['test']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
