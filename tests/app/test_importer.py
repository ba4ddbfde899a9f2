"""The dataset importer: CES round trip on a real database, one transaction on errors."""

from __future__ import annotations

import ast
import csv
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel, select

import app.services.importer as importer
from app.db import make_engine
from app.errors import ConflictError, InvalidInputError
from app.schemas import StudySettings
from app.services.importer import import_dataset, slugify
from app.tables import Item, Respondent, Study
from elicitation.datasets import DatasetError


def _counts(engine: Engine) -> dict[str, int]:
    with Session(engine) as s:
        return {
            name: int(s.exec(select(func.count()).select_from(table)).one())
            for name, table in SQLModel.metadata.tables.items()
        }


def test_ces_round_trip(engine: Engine, datasets_dir: Path) -> None:
    """Every cell of CES read back from the database equals the file."""
    folder = datasets_dir / "ces"
    with Session(engine) as s:
        result = import_dataset(folder, session=s)
    assert (result.slug, result.n_items, result.n_respondents) == ("ces", 39, 5369)

    manifest = json.loads((folder / "dataset.json").read_text())
    codebook = [json.loads(x) for x in (folder / "codebook.jsonl").read_text().splitlines() if x]
    with (folder / "responses.csv").open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = list(reader)
    split = json.loads((folder / "user_split.json").read_text())
    part_of = {u: p.removesuffix("_users") for p, users in split.items() for u in users}

    with Session(engine) as s:
        study = s.exec(select(Study)).one()
        assert study.name == "ces" and study.status == "draft"
        assert study.source == manifest["source"] and study.license == manifest["license"]
        assert StudySettings.model_validate(study.settings) == StudySettings()
        with (folder / "runs.csv").open(newline="") as fh:
            runs = [
                {
                    "seed": int(r["seed"]),
                    "cand_qids": ast.literal_eval(r["cand_qids"]),
                    "eval_qids": ast.literal_eval(r["eval_qids"]),
                }
                for r in csv.DictReader(fh)
            ]
        assert study.benchmark_runs == runs

        items = s.exec(select(Item).where(Item.study_id == study.id).order_by(Item.position)).all()
        assert [i.key for i in items] == [c["id"] for c in codebook]
        attribute_keys = set(manifest["demographics"]) | {manifest["region_column"]}
        for item, entry in zip(items, codebook, strict=True):
            assert item.question == entry["question"]
            assert item.options == [[k, v] for k, v in entry["options"].items()]
            assert item.topic == entry.get("topic")
            assert item.role == ("attribute" if entry["id"] in attribute_keys else "question")
            assert item.is_preference_criterion is False

        people = {r.external_id: r for r in s.exec(select(Respondent)).all()}
    assert len(people) == len(rows) == 5369
    n_cells = 0
    for row in rows:
        person = people[row[0]]
        assert person.source == "import" and person.split == part_of.get(row[0])
        assert set(person.attributes) <= attribute_keys
        assert not set(person.answers) & attribute_keys
        stored = {**person.attributes, **person.answers}
        for key, cell in zip(header[1:], row[1:], strict=True):
            assert stored.get(key, "") == cell
            n_cells += cell != ""
        assert len(stored) == sum(c != "" for c in row[1:])
    assert n_cells == result.n_answers + sum(len(p.attributes) for p in people.values())


def test_import_opinionqa_small(engine: Engine, small_dataset_factory: Callable[..., Path]) -> None:
    """Ids written ``123.0`` in responses.csv are stored normalised; the split is kept."""
    folder = small_dataset_factory("opinionqa", 40)
    with Session(engine) as s:
        result = import_dataset(folder, session=s, study_name="Pew panel (small)")
    assert result.slug == "pew-panel-small" and result.n_respondents == 40
    with Session(engine) as s:
        ids = s.exec(select(Respondent.external_id)).all()
        splits = s.exec(select(Respondent.split)).all()
    assert all(i is not None and not i.endswith(".0") for i in ids)
    split = json.loads((folder / "user_split.json").read_text())
    assert sum(x is not None for x in splits) == sum(len(v) for v in split.values())


def test_slugify() -> None:
    assert slugify("CES 2024!") == "ces-2024"
    assert slugify("  Ünïcode — study ") == "unicode-study"
    assert slugify("***") == ""


# ----- bad input leaves the database unchanged ----------------------------------------


def _corrupt_csv(path: Path, row: int, column: str, value: str) -> None:
    rows = list(csv.reader(path.open(newline="")))
    rows[row][rows[0].index(column)] = value
    with path.open("w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)


def _unknown_option(d: Path) -> None:
    _corrupt_csv(d / "responses.csv", 5, "327a", "Q")


def _duplicate_id(d: Path) -> None:
    rows = list(csv.reader((d / "responses.csv").open(newline="")))
    _corrupt_csv(d / "responses.csv", 6, "caseid", rows[2][0])


def _column_not_in_codebook(d: Path) -> None:
    lines = (d / "codebook.jsonl").read_text().splitlines()
    kept = [x for x in lines if json.loads(x)["id"] != "355e"]
    (d / "codebook.jsonl").write_text("\n".join(kept) + "\n")
    manifest = json.loads((d / "dataset.json").read_text())
    manifest["questions"].remove("355e")
    (d / "dataset.json").write_text(json.dumps(manifest))
    (d / "runs.csv").unlink()
    del manifest["runs"]
    (d / "dataset.json").write_text(json.dumps(manifest))


def _malformed_json(d: Path) -> None:
    (d / "dataset.json").write_text('{"name": "x", ')


def _split_unknown_id(d: Path) -> None:
    split = json.loads((d / "user_split.json").read_text())
    split["train_users"].append("not-a-respondent")
    (d / "user_split.json").write_text(json.dumps(split))


def _empty_file(d: Path) -> None:
    (d / "codebook.jsonl").write_text("")


def _too_long_option(d: Path) -> None:
    lines = (d / "codebook.jsonl").read_text().splitlines()
    entry = json.loads(lines[0])
    entry["options"] = {**entry["options"], "X" * 40: "long"}
    lines[0] = json.dumps(entry)
    (d / "codebook.jsonl").write_text("\n".join(lines) + "\n")


def _rename(d: Path, old: str, new: str) -> None:
    """Replace the id or key ``old`` by ``new`` in every file of the dataset."""
    for path in d.iterdir():
        if path.is_file():
            text = path.read_text()
            path.write_text(re.sub(rf"(?<![\w.]){re.escape(old)}(?![\w.])", new, text))


def test_an_item_keyed_like_an_export_column_imports_and_exports_apart(
    sqlite_engine: Engine, small_dataset_factory: Callable[..., Path]
) -> None:
    """A survey's own item ``status`` imports as it is (a benchmark imports surveys it
    has never seen); the wide CSV names the item's column ``status_2`` after the meta
    column ``status`` and keeps its answers there. A respondent id ``r12``, the form of
    the ids live respondents without one get, is stored as ``import-r12`` and said so."""
    from app.services.export import csv_wide

    d = small_dataset_factory("ces", 10, "clash")
    rows = list(csv.reader((d / "responses.csv").open(newline="")))
    _rename(d, rows[4][0], "r12")
    _rename(d, "327a", "status")
    answers = {r[0]: r[rows[0].index("327a")] for r in rows[1:]}
    with Session(sqlite_engine) as s:
        result = import_dataset(d, session=s, study_name="clash")
        study = s.get(Study, result.study_id)
        assert study is not None
        lines = list(csv.reader("".join(csv_wide(study, session=s, include_imported=True))
                                .lstrip("\ufeff").splitlines()))  # fmt: skip
    header = lines[0]
    assert header.count("status") == 1 and "status_2" in header
    col = header.index("status_2")
    ids = [r[0] for r in lines[1:]]
    assert "import-r12" in ids and "r12" not in ids
    assert result.renamed_ids == 1 and "stored with the prefix import-" in result.notice()
    by_id = {r[0]: r[col] for r in lines[1:]}
    original = {("import-r12" if k == rows[4][0] else k): v for k, v in answers.items()}
    assert by_id == original


def test_an_id_renamed_on_import_may_not_meet_another(
    sqlite_engine: Engine, small_dataset_factory: Callable[..., Path]
) -> None:
    d = small_dataset_factory("ces", 10, "clash2")
    rows = list(csv.reader((d / "responses.csv").open(newline="")))
    _rename(d, rows[4][0], "r12")
    _rename(d, rows[5][0], "import-r12")
    with Session(sqlite_engine) as s, pytest.raises(DatasetError, match="already has"):
        import_dataset(d, session=s, study_name="clash2")
    assert _counts(sqlite_engine)["respondent"] == 0


BAD_INPUTS: list[tuple[Callable[[Path], None], str]] = [
    (_unknown_option, "responses.csv, row 5, column '327a': unknown option 'Q'"),
    (_duplicate_id, "responses.csv, row 6, column 'caseid': duplicate respondent id"),
    (_column_not_in_codebook, "responses.csv, row 0, column '355e': column '355e' is not in"),
    (_malformed_json, "dataset.json, line 1: malformed JSON"),
    (_split_unknown_id, "user_split.json, column 'train_users': unknown respondent id"),
    (_empty_file, "codebook.jsonl: the file is empty"),
    (_too_long_option, "codebook.jsonl: item 'birthyr': option"),
]


@pytest.fixture
def sqlite_engine(migrated_sqlite_url: str) -> Iterator[Engine]:
    """The invalid datasets fail before any write: one backend is enough for them (the
    rollback of a failure during the write is tested on both backends below)."""
    eng = make_engine(migrated_sqlite_url)
    yield eng
    eng.dispose()


@pytest.mark.parametrize(
    ("corrupt", "message"), BAD_INPUTS, ids=[c.__name__ for c, _ in BAD_INPUTS]
)
def test_bad_input_writes_nothing(
    sqlite_engine: Engine,
    small_dataset_factory: Callable[..., Path],
    corrupt: Callable[[Path], None],
    message: str,
) -> None:
    with Session(sqlite_engine) as s:  # an existing study, so "unchanged" is not "empty"
        import_dataset(small_dataset_factory("ces", 10, "existing"), session=s, study_name="a")
    before = _counts(sqlite_engine)
    bad = small_dataset_factory("ces", 30, "bad")
    corrupt(bad)
    with Session(sqlite_engine) as s, pytest.raises(DatasetError) as info:
        import_dataset(bad, session=s, study_name="b")
    assert str(info.value).startswith(message), str(info.value)
    assert _counts(sqlite_engine) == before


def test_duplicate_slug_writes_nothing(engine: Engine, small_dataset: Path) -> None:
    with Session(engine) as s:
        import_dataset(small_dataset, session=s, study_name="Same")
    before = _counts(engine)
    with Session(engine) as s, pytest.raises(ConflictError, match="slug 'same' already exists"):
        import_dataset(small_dataset, session=s, study_name="SAME!")
    assert _counts(engine) == before


def test_empty_slug_is_refused(engine: Engine, small_dataset: Path) -> None:
    before = _counts(engine)
    with Session(engine) as s, pytest.raises(InvalidInputError, match="empty slug"):
        import_dataset(small_dataset, session=s, study_name="???")
    assert _counts(engine) == before


def test_failure_mid_write_rolls_back(
    engine: Engine, small_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after the study and items were written leaves nothing behind."""
    with Session(engine) as s:
        import_dataset(small_dataset, session=s, study_name="first")
    before = _counts(engine)
    real = importer._bulk_insert
    calls: list[str] = []

    def failing(conn: Any, table: Any, rows: list[dict[str, Any]]) -> None:
        calls.append(table.__tablename__)
        if table is Respondent:
            raise RuntimeError("disk full (injected)")
        real(conn, table, rows)

    monkeypatch.setattr(importer, "_bulk_insert", failing)
    with Session(engine) as s, pytest.raises(RuntimeError, match="injected"):
        import_dataset(small_dataset, session=s, study_name="second")
    assert calls == ["item", "respondent"]  # the study and its items were written first
    assert _counts(engine) == before
    monkeypatch.setattr(importer, "_bulk_insert", real)
    with Session(engine) as s:  # the slug is free: nothing of the failed import remains
        assert import_dataset(small_dataset, session=s, study_name="second").n_respondents == 30


def test_codebook_items_without_column_import_as_missing(
    engine: Engine, small_dataset: Path
) -> None:
    shutil.copyfile(small_dataset / "responses.csv", small_dataset / "full.csv")
    rows = list(csv.reader((small_dataset / "responses.csv").open(newline="")))
    drop = rows[0].index("355a")
    with (small_dataset / "responses.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows([r[:drop] + r[drop + 1 :] for r in rows])
    with Session(engine) as s:
        import_dataset(small_dataset, session=s)
        people = s.exec(select(Respondent)).all()
        assert s.exec(select(Item).where(Item.key == "355a")).one().role == "question"
    assert all("355a" not in p.answers for p in people)
    assert all(len(p.answers) == 29 for p in people)
