"""``priorly import DATASET_DIR [--study NAME]``: import a canonical dataset as a study."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sqlmodel import Session

from app import db
from app.settings import get_settings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "import",
        help="import a dataset folder (canonical format) as a new study",
        description=(
            "Import DATASET_DIR (responses.csv, codebook.jsonl, dataset.json, optional "
            "user_split.json and runs.csv) as a new study. Everything is validated first; "
            "on any error nothing is written. Migrates the database first."
        ),
    )
    parser.add_argument("dataset_dir", metavar="DATASET_DIR", type=Path)
    parser.add_argument(
        "--study",
        metavar="NAME",
        help="study name; its slug must be new (default: the dataset name)",
    )
    parser.set_defaults(func=_import)


def _import(args: argparse.Namespace) -> int:
    from app.services.importer import import_dataset  # loads numpy: --help stays fast

    settings = get_settings()
    db.upgrade(settings.database_url)
    engine = db.make_engine(settings.database_url)
    try:
        with Session(engine) as session:
            result = import_dataset(args.dataset_dir, session=session, study_name=args.study)
    finally:
        engine.dispose()
    print(
        f"imported study {result.slug!r}: {result.n_items} items, "
        f"{result.n_respondents:,} respondents, {result.n_answers:,} answers "
        f"in {result.seconds:.1f} s"
    )
    if result.notice():
        print(result.notice())
    return 0
