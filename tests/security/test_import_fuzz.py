"""Malformed datasets against the importer: always a clear error, never a partial import.

Hypothesis (derandomized, a bounded number of examples) corrupts a small real dataset (the
first 12 CES respondents) in one of these ways, at a drawn place:

* a wrong option letter/code in a cell, and a huge (up to 200,000 characters) cell;
* a ragged row (a cell dropped or added);
* a duplicated respondent id;
* a wrong encoding (a Latin-1 or UTF-16 file instead of UTF-8);
* a broken, duplicated, empty or option-less codebook entry, or an empty codebook;
* a manifest that names an item the codebook does not have.

Each corrupted folder goes through ``app.services.importer.import_dataset`` (the
validation of ``elicitation.datasets`` plus the length checks and the one-transaction
write) on a migrated database. The error must be a user error whose message names the
file and, where it applies, the row and column or the line, exactly where the corruption
was made; and the row count of every table must be unchanged. (The codebook format has no
references between items, so there is no cycle to make; a manifest naming an unknown item
is the dangling-reference case.)
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect, text
from sqlmodel import Session

from app.errors import PriorlyError
from app.services.importer import import_dataset
from elicitation.datasets import DatasetError
from tests.support.data import DATASETS_DIR, write_small_dataset

N_RESPONDENTS = 12
EXAMPLES = 60


@dataclass
class Base:
    folder: Path
    header: list[str]
    rows: list[list[str]]
    codebook: list[str]
    letters: dict[str, list[str]]
    manifest: dict[str, Any]
    id_column: str


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    folder = write_small_dataset(
        DATASETS_DIR / "ces", tmp_path_factory.mktemp("import-fuzz") / "base", N_RESPONDENTS
    )
    with (folder / "responses.csv").open(newline="", encoding="utf-8") as fh:
        table = list(csv.reader(fh))
    codebook = [line for line in (folder / "codebook.jsonl").read_text().splitlines() if line]
    letters = {json.loads(line)["id"]: list(json.loads(line)["options"]) for line in codebook}
    manifest = json.loads((folder / "dataset.json").read_text())
    return Base(folder, table[0], table[1:], codebook, letters, manifest, manifest["id_column"])


def _row_counts(session: Session) -> dict[str, int]:
    names = inspect(session.get_bind()).get_table_names()
    return {
        n: int(session.execute(text(f'SELECT COUNT(*) FROM "{n}"')).scalar_one()) for n in names
    }


def _write_csv(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


@st.composite
def corruption(draw: Any, base: Base) -> tuple[dict[str, bytes], str, list[str]]:
    """A corrupted copy: ``(files to overwrite, kind, fragments the error must contain)``."""
    kind = draw(
        st.sampled_from(
            [
                "wrong_letter",
                "huge_cell",
                "ragged_row",
                "duplicate_id",
                "latin1",
                "utf16",
                "codebook_broken_json",
                "codebook_duplicate",
                "codebook_no_options",
                "codebook_empty",
                "manifest_unknown_item",
            ]
        )
    )
    rows = [list(r) for r in base.rows]
    header = list(base.header)
    r = draw(st.integers(0, len(rows) - 1))  # data row index; the file's row is r + 1
    item_cols = [j for j, name in enumerate(header) if name != base.id_column]
    j = draw(st.sampled_from(item_cols))
    col = header[j]
    if kind in ("wrong_letter", "huge_cell"):
        if kind == "wrong_letter":
            bad = draw(
                st.text(
                    st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")),
                    min_size=1,
                    max_size=12,
                )
            )
        else:
            bad = "Z" * draw(st.integers(10_000, 200_000))
        bad = bad.strip()
        if not bad or bad in base.letters[col]:
            bad = "??"
        rows[r][j] = bad
        return (
            {"responses.csv": _write_csv([header, *rows]).encode()},
            kind,
            ["responses.csv", f"row {r + 1}", f"column {col!r}", "unknown option"],
        )
    if kind == "ragged_row":
        if draw(st.booleans()):
            del rows[r][j]
        else:
            rows[r].append("A")
        return (
            {"responses.csv": _write_csv([header, *rows]).encode()},
            kind,
            ["responses.csv", f"row {r + 1}", "cells"],
        )
    if kind == "duplicate_id":
        other = draw(st.integers(0, len(rows) - 1).filter(lambda k: k != r))
        id_pos = header.index(base.id_column)
        rows[max(r, other)][id_pos] = rows[min(r, other)][id_pos]
        return (
            {"responses.csv": _write_csv([header, *rows]).encode()},
            kind,
            ["responses.csv", f"row {max(r, other) + 1}", "duplicate respondent id"],
        )
    if kind in ("latin1", "utf16"):
        rows[r][j] = rows[r][j] + "é"  # a non-ASCII character somewhere
        content = _write_csv([header, *rows])
        data = content.encode("latin-1") if kind == "latin1" else content.encode("utf-16")
        return ({"responses.csv": data}, kind, ["responses.csv", "not valid UTF-8"])
    lines = list(base.codebook)
    n = draw(st.integers(0, len(lines) - 1))
    if kind == "codebook_broken_json":
        cut = draw(st.integers(1, len(lines[n]) - 1))
        lines[n] = lines[n][:cut]
        want = ["codebook.jsonl", f"line {n + 1}"]
    elif kind == "codebook_duplicate":
        lines.insert(n + 1, lines[n])
        want = ["codebook.jsonl", f"line {n + 2}", "duplicate id"]
    elif kind == "codebook_no_options":
        entry = json.loads(lines[n])
        entry["options"] = draw(st.sampled_from([{}, [], None, "A"]))
        lines[n] = json.dumps(entry)
        want = ["codebook.jsonl", f"line {n + 1}", "options"]
    elif kind == "codebook_empty":
        lines = draw(st.sampled_from([[], ["", "  "]]))
        want = ["codebook.jsonl", "empty" if not lines else "no items"]
    else:  # manifest_unknown_item
        manifest = dict(base.manifest)
        ghost = draw(st.text("abcdefghij0123456789", min_size=3, max_size=8)).join("<>")
        manifest["questions"] = [*manifest["questions"], ghost]
        return (
            {"dataset.json": json.dumps(manifest).encode()},
            kind,
            ["dataset.json", repr(ghost)],
        )
    return ({"codebook.jsonl": "\n".join(lines).encode()}, kind, want)


def _check(base: Base, session: Session, files: dict[str, bytes], want: list[str]) -> str:
    folder = Path(tempfile.mkdtemp(dir=base.folder.parent))
    try:
        shutil.copytree(base.folder, folder, dirs_exist_ok=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        before = _row_counts(session)
        with pytest.raises((DatasetError, PriorlyError)) as info:
            import_dataset(folder, session=session)
        session.rollback()
        assert _row_counts(session) == before, "a failed import left rows behind"
        message = str(info.value)
        assert len(message) < 500, f"error message too long: {len(message)} characters"
        for fragment in want:
            assert fragment in message, f"{fragment!r} not in the error {message!r}"
        return message
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_malformed_datasets_give_located_errors_and_write_nothing(
    base: Base, backend: str, tmp_path: Path
) -> None:
    from app.db import make_engine, upgrade
    from tests.support.live_study import fresh_database_url

    urls = fresh_database_url(backend, tmp_path)
    url = next(urls)
    try:
        upgrade(url)
        engine = make_engine(url)
        kinds: set[str] = set()
        with Session(engine) as session:
            import_dataset(base.folder, session=session, study_name="already here")
            examples = EXAMPLES if backend == "sqlite" else EXAMPLES // 2

            @settings(
                max_examples=examples,
                derandomize=True,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(data=corruption(base))
            def run(data: tuple[dict[str, bytes], str, list[str]]) -> None:
                files, kind, want = data
                kinds.add(kind)
                _check(base, session, files, want)

            run()
            # The same (valid) dataset again under a taken name: a conflict, nothing written.
            before = _row_counts(session)
            with pytest.raises(PriorlyError, match="already exists"):
                import_dataset(base.folder, session=session, study_name="already here")
            assert _row_counts(session) == before
        engine.dispose()
        print(f"{backend}: corruption kinds drawn: {sorted(kinds)}")
        assert len(kinds) >= 7, f"too few corruption kinds were drawn: {sorted(kinds)}"
    finally:
        urls.close()
