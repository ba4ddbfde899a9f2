"""Tests of elicitation.datasets: the shipped datasets load exactly, every malformed case
fails with a DatasetError naming the file (and row / line / column)."""

from __future__ import annotations

import ast
import csv
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from elicitation.datasets import (
    BenchmarkRun,
    DatasetError,
    load_dataset,
    normalise_id,
)

# ---------------------------------------------------------------------------------------
# the shipped datasets, compared cell by cell with an independent reading of the files


def _norm(value: str) -> str:
    return value[:-2] if value.endswith(".0") else value


@pytest.mark.parametrize("name", ["ces", "opinionqa"])
def test_shipped_dataset_matches_files(datasets_dir: Path, name: str) -> None:
    folder = datasets_dir / name
    ds = load_dataset(folder)
    manifest = json.loads((folder / "dataset.json").read_text())
    codebook = [json.loads(x) for x in (folder / "codebook.jsonl").read_text().splitlines() if x]
    with (folder / "responses.csv").open(newline="") as fh:
        records = list(csv.DictReader(fh))

    assert ds.name == manifest["name"]
    assert [c.id for c in ds.codebook] == [c["id"] for c in codebook]
    for item, entry in zip(ds.codebook, codebook, strict=True):
        assert item.question == entry["question"]
        assert item.options == tuple(entry["options"].items())
        assert item.topic == entry.get("topic")
    assert ds.demographics == manifest["demographics"]
    assert ds.questions == manifest["questions"]
    assert ds.region_column == manifest["region_column"]
    assert ds.respondent_ids == [_norm(r[manifest["id_column"]]) for r in records]
    assert ds.responses.dtype == np.int16
    assert ds.responses.shape == (len(records), len(codebook))
    # every cell: the option index of the letter in the file, -1 when empty
    for i, record in enumerate(records):
        for j, entry in enumerate(codebook):
            cell = record[entry["id"]]
            expected = -1 if cell == "" else list(entry["options"]).index(cell)
            assert ds.responses[i, j] == expected

    split = json.loads((folder / "user_split.json").read_text())
    assert ds.split is not None
    assert ds.split == {k: [_norm(str(u)) for u in v] for k, v in split.items()}
    for part in ("train_users", "val_users", "test_users"):
        rows = ds.user_indices(part)
        assert [ds.respondent_ids[r] for r in rows] == ds.split[part]

    with (folder / "runs.csv").open(newline="") as fh:
        runs = [
            BenchmarkRun(
                int(r["seed"]),
                tuple(ast.literal_eval(r["cand_qids"])),
                tuple(ast.literal_eval(r["eval_qids"])),
            )
            for r in csv.DictReader(fh)
        ]
    assert ds.runs == runs
    assert len(ds.runs) == 10


def test_known_sizes(datasets_dir: Path) -> None:
    """The README's table: 5,369 CES respondents and 3,866 OpinionQA respondents."""
    ces = load_dataset(datasets_dir / "ces")
    opq = load_dataset(datasets_dir / "opinionqa")
    assert ces.n_respondents == 5369 and opq.n_respondents == 3866
    assert (len(ces.demographics), len(ces.questions)) == (8, 30)
    assert all(ces.item(q).n_options == 2 for q in ces.questions)
    assert {opq.item(q).n_options for q in opq.questions} <= set(range(2, 13))


def test_item_bank_matrix_and_lookups(small_dataset: Path) -> None:
    ds = load_dataset(small_dataset)
    bank = ds.item_bank()
    assert list(bank.keys) == ds.demographics + ds.questions
    assert list(bank.n_options) == [ds.item(k).n_options for k in bank.keys]
    sub = ds.item_bank(["327a", "race"])
    assert sub.keys == ("327a", "race") and sub.n_options == (2, ds.item("race").n_options)

    full = ds.matrix()
    assert full.shape == (30, len(bank.keys))
    for c, key in enumerate(bank.keys):
        assert np.array_equal(full[:, c], ds.responses[:, ds.column(key)])
    users = [ds.respondent_ids[3], ds.respondent_ids[0] + ".0"]  # ".0" is normalised
    part = ds.matrix(["327b", "birthyr"], users)
    assert part.tolist() == [
        [ds.responses[3, ds.column("327b")], ds.responses[3, ds.column("birthyr")]],
        [ds.responses[0, ds.column("327b")], ds.responses[0, ds.column("birthyr")]],
    ]
    with pytest.raises(DatasetError, match="unknown item 'nope'"):
        ds.item("nope")
    with pytest.raises(DatasetError, match="unknown respondent id '42'"):
        ds.matrix(users=["42"])
    with pytest.raises(DatasetError, match="unknown split 'train'"):
        ds.user_indices("train")


def test_normalise_id() -> None:
    assert normalise_id("100260.0") == "100260"
    assert normalise_id(100260.0) == "100260"
    assert normalise_id(" 7 ") == "7"
    assert normalise_id("1.05") == "1.05"
    assert normalise_id("A.0") == "A"


def test_error_string_format() -> None:
    err = DatasetError(
        "responses.csv", "unknown option 'Z' (expected one of A, B)", row=12, column="327a"
    )
    assert (
        str(err)
        == "responses.csv, row 12, column '327a': unknown option 'Z' (expected one of A, B)"
    )
    assert (err.file, err.row, err.column) == ("responses.csv", 12, "327a")


def test_optional_split_and_runs(small_dataset: Path) -> None:
    manifest = json.loads((small_dataset / "dataset.json").read_text())
    del manifest["split"], manifest["runs"]
    (small_dataset / "dataset.json").write_text(json.dumps(manifest))
    (small_dataset / "user_split.json").unlink()
    (small_dataset / "runs.csv").unlink()
    ds = load_dataset(small_dataset)
    assert ds.split is None and ds.runs == []
    with pytest.raises(DatasetError, match="has no user split"):
        ds.user_indices("train_users")


def test_empty_cells_are_missing(small_dataset: Path) -> None:
    path = small_dataset / "responses.csv"
    rows = list(csv.reader(path.open(newline="")))
    col = rows[0].index("327a")
    rows[2][col] = ""
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    ds = load_dataset(small_dataset)
    assert ds.responses[1, ds.column("327a")] == -1
    assert (ds.responses == -1).sum() == 1


# ---------------------------------------------------------------------------------------
# malformed datasets: each corruption and the exact place the error must name


def _rewrite_csv(path: Path, edit: Callable[[list[list[str]]], None]) -> None:
    rows = list(csv.reader(path.open(newline="")))
    edit(rows)
    with path.open("w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)


def _rewrite_json(path: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _rewrite_codebook(path: Path, edit: Callable[[list[dict]], None]) -> None:
    entries = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    edit(entries)
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))


def _set_cell(rows: list[list[str]], row: int, column: str, value: str) -> None:
    rows[row][rows[0].index(column)] = value


def _c_missing_responses(d: Path) -> None:
    (d / "responses.csv").unlink()


def _c_empty_responses(d: Path) -> None:
    (d / "responses.csv").write_text("")


def _c_header_only(d: Path) -> None:
    _rewrite_csv(d / "responses.csv", lambda rows: rows.__delitem__(slice(1, None)))


def _c_empty_codebook(d: Path) -> None:
    (d / "codebook.jsonl").write_text("\n")


def _c_malformed_codebook(d: Path) -> None:
    lines = (d / "codebook.jsonl").read_text().splitlines()
    lines[2] = lines[2][:-1]  # drop the closing brace of line 3
    (d / "codebook.jsonl").write_text("\n".join(lines) + "\n")


def _c_malformed_manifest(d: Path) -> None:
    (d / "dataset.json").write_text('{\n  "name": "x",\n  "id_column": caseid\n}\n')


def _c_huge_number_codebook(d: Path) -> None:
    lines = (d / "codebook.jsonl").read_text().splitlines()
    lines[2] = lines[2][:-1] + ', "position": ' + "9" * 5000 + "}"
    (d / "codebook.jsonl").write_text("\n".join(lines) + "\n")


def _c_huge_number_split(d: Path) -> None:
    (d / "user_split.json").write_text('{"train_users": [' + "9" * 5000 + "]}")


def _c_codebook_no_id(d: Path) -> None:
    _rewrite_codebook(d / "codebook.jsonl", lambda e: e[4].pop("id"))


def _c_codebook_no_options(d: Path) -> None:
    _rewrite_codebook(d / "codebook.jsonl", lambda e: e[5].pop("options"))


def _c_codebook_duplicate(d: Path) -> None:
    def edit(entries: list[dict]) -> None:
        entries[6]["id"] = entries[1]["id"]

    _rewrite_codebook(d / "codebook.jsonl", edit)


def _c_column_not_in_codebook(d: Path) -> None:
    def edit(rows: list[list[str]]) -> None:
        rows[0].append("extra_col")
        for r in rows[1:]:
            r.append("A")

    _rewrite_csv(d / "responses.csv", edit)


def _c_unknown_option(d: Path) -> None:
    _rewrite_csv(d / "responses.csv", lambda rows: _set_cell(rows, 12, "327a", "Z"))


def _c_ragged_row(d: Path) -> None:
    _rewrite_csv(d / "responses.csv", lambda rows: rows[7].pop())


def _c_duplicate_id(d: Path) -> None:
    def edit(rows: list[list[str]]) -> None:
        rows[9][0] = rows[4][0]

    _rewrite_csv(d / "responses.csv", edit)


def _c_duplicate_id_dot0(d: Path) -> None:
    def edit(rows: list[list[str]]) -> None:
        rows[9][0] = rows[4][0] + ".0"

    _rewrite_csv(d / "responses.csv", edit)


def _c_empty_id(d: Path) -> None:
    _rewrite_csv(d / "responses.csv", lambda rows: _set_cell(rows, 3, "caseid", ""))


def _c_missing_id_column(d: Path) -> None:
    _rewrite_json(d / "dataset.json", lambda m: m.__setitem__("id_column", "respondent"))


def _c_unknown_demographic(d: Path) -> None:
    _rewrite_json(d / "dataset.json", lambda m: m["demographics"].append("shoe_size"))


def _c_unknown_question(d: Path) -> None:
    _rewrite_json(d / "dataset.json", lambda m: m["questions"].append("999z"))


def _c_unknown_region(d: Path) -> None:
    _rewrite_json(d / "dataset.json", lambda m: m.__setitem__("region_column", "zone"))


def _c_manifest_no_questions(d: Path) -> None:
    _rewrite_json(d / "dataset.json", lambda m: m.pop("questions"))


def _c_split_unknown_id(d: Path) -> None:
    _rewrite_json(d / "user_split.json", lambda s: s["test_users"].append("999"))


def _c_split_user_twice(d: Path) -> None:
    _rewrite_json(d / "user_split.json", lambda s: s["val_users"].append(s["train_users"][0]))


def _c_split_bad_part(d: Path) -> None:
    _rewrite_json(d / "user_split.json", lambda s: s.__setitem__("training", []))


def _c_split_named_missing(d: Path) -> None:
    (d / "user_split.json").unlink()


def _c_runs_named_missing(d: Path) -> None:
    (d / "runs.csv").unlink()


def _c_runs_bad_literal(d: Path) -> None:
    _rewrite_csv(d / "runs.csv", lambda rows: _set_cell(rows, 3, "cand_qids", "['327a', "))


def _c_runs_bad_seed(d: Path) -> None:
    _rewrite_csv(d / "runs.csv", lambda rows: _set_cell(rows, 2, "seed", "two"))


def _c_runs_unknown_item(d: Path) -> None:
    _rewrite_csv(d / "runs.csv", lambda rows: _set_cell(rows, 4, "eval_qids", "['327a', 'x9']"))


def _c_runs_missing_header(d: Path) -> None:
    _rewrite_csv(d / "runs.csv", lambda rows: rows[0].__setitem__(2, "targets"))


def _c_runs_ragged(d: Path) -> None:
    _rewrite_csv(d / "runs.csv", lambda rows: rows[5].append("extra"))


def _c_runs_overlap(d: Path) -> None:
    def edit(rows: list[list[str]]) -> None:
        cand = ast.literal_eval(rows[1][1])
        _set_cell(rows, 1, "eval_qids", repr([cand[0]]))

    _rewrite_csv(d / "runs.csv", edit)


# (corruption, file, row, column, line, message fragment)
CASES = [
    (_c_missing_responses, "responses.csv", None, None, None, "file not found"),
    (_c_empty_responses, "responses.csv", None, None, None, "the file is empty"),
    (_c_header_only, "responses.csv", None, None, None, "no respondents"),
    (_c_empty_codebook, "codebook.jsonl", None, None, None, "the file is empty"),
    (_c_malformed_codebook, "codebook.jsonl", None, None, 3, "malformed JSON"),
    (_c_malformed_manifest, "dataset.json", None, None, 3, "malformed JSON"),
    (_c_huge_number_codebook, "codebook.jsonl", None, None, 3, "more than 4,300 digits"),
    (_c_huge_number_split, "user_split.json", None, None, 1, "more than 4,300 digits"),
    (_c_codebook_no_id, "codebook.jsonl", None, None, 5, "without an 'id'"),
    (_c_codebook_no_options, "codebook.jsonl", None, None, 6, "has no 'options'"),
    (_c_codebook_duplicate, "codebook.jsonl", None, None, 7, "duplicate id"),
    (_c_column_not_in_codebook, "responses.csv", 0, "extra_col", None, "not in codebook.jsonl"),
    (
        _c_unknown_option,
        "responses.csv",
        12,
        "327a",
        None,
        "unknown option 'Z' (expected one of A, B)",
    ),
    (_c_ragged_row, "responses.csv", 7, None, None, "39 cells, the header has 40"),
    (_c_duplicate_id, "responses.csv", 9, "caseid", None, "duplicate respondent id"),
    (_c_duplicate_id_dot0, "responses.csv", 9, "caseid", None, "(first in row 4)"),
    (_c_empty_id, "responses.csv", 3, "caseid", None, "empty respondent id"),
    (_c_missing_id_column, "responses.csv", 0, None, None, "'respondent'"),
    (_c_unknown_demographic, "dataset.json", None, "demographics", None, "'shoe_size'"),
    (_c_unknown_question, "dataset.json", None, "questions", None, "'999z'"),
    (_c_unknown_region, "dataset.json", None, "region_column", None, "'zone'"),
    (_c_manifest_no_questions, "dataset.json", None, "questions", None, "missing"),
    (
        _c_split_unknown_id,
        "user_split.json",
        None,
        "test_users",
        None,
        "unknown respondent id '999'",
    ),
    (_c_split_user_twice, "user_split.json", None, "val_users", None, "also in 'train_users'"),
    (_c_split_bad_part, "user_split.json", None, "training", None, "unknown part"),
    (_c_split_named_missing, "user_split.json", None, None, None, "named by dataset.json"),
    (_c_runs_named_missing, "runs.csv", None, None, None, "named by dataset.json"),
    (_c_runs_bad_literal, "runs.csv", 3, "cand_qids", None, "not a list literal"),
    (_c_runs_bad_seed, "runs.csv", 2, "seed", None, "not an integer"),
    (_c_runs_unknown_item, "runs.csv", 4, "eval_qids", None, "unknown item 'x9'"),
    (_c_runs_missing_header, "runs.csv", 0, None, None, "lacks eval_qids"),
    (_c_runs_ragged, "runs.csv", 5, None, None, "4 cells, the header has 3"),
    (_c_runs_overlap, "runs.csv", 1, "eval_qids", None, "both candidates and targets"),
]


@pytest.mark.parametrize(
    ("corrupt", "file", "row", "column", "line", "fragment"),
    CASES,
    ids=[c[0].__name__[3:] for c in CASES],
)
def test_malformed_dataset(
    small_dataset: Path,
    corrupt: Callable[[Path], None],
    file: str,
    row: int | None,
    column: str | None,
    line: int | None,
    fragment: str,
) -> None:
    load_dataset(small_dataset)  # valid before the corruption
    corrupt(small_dataset)
    with pytest.raises(DatasetError) as info:
        load_dataset(small_dataset)
    err = info.value
    assert (err.file, err.row, err.column, err.line) == (file, row, column, line), str(err)
    assert fragment in err.message
    assert str(err).startswith(file)


def test_header_only_responses_load_as_no_respondents_when_allowed(small_dataset: Path) -> None:
    _c_header_only(small_dataset)
    (small_dataset / "user_split.json").write_text("{}")  # it named the respondents removed
    ds = load_dataset(small_dataset, allow_no_respondents=True)
    assert ds.respondent_ids == [] and ds.responses.shape == (0, len(ds.codebook))
    assert ds.n_respondents == 0


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="dataset folder not found"):
        load_dataset(tmp_path / "absent")


def test_works_on_other_dataset(small_dataset_factory: Callable[..., Path]) -> None:
    """The OpinionQA copy has ids written ``123.0`` in responses.csv and ``123`` in the split."""
    ds = load_dataset(small_dataset_factory("opinionqa", 25))
    assert ds.n_respondents == 25
    assert all(not r.endswith(".0") for r in ds.respondent_ids)
    assert ds.split is not None
    assert sum(len(v) for v in ds.split.values()) > 0
