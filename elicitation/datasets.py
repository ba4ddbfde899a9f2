"""Loader and validator of the canonical survey-dataset format.

A dataset is one folder (see ``datasets/README.md``)::

    responses.csv     one row per respondent; the id column plus one column per item;
                      a cell is an option letter from the codebook, or empty (missing)
    codebook.jsonl    one JSON object per line: id, question, options {letter: label}
                      in scale order, optional topic
    dataset.json      manifest: name, id_column, demographics, questions, optional
                      region_column, split (file name), runs (file name), source, license
    user_split.json   optional: {"train_users": [...], "val_users": [...], "test_users": [...]}
    runs.csv          optional: seed,cand_qids,eval_qids (Python-list literals of item ids)

:func:`load_dataset` reads and validates everything and returns a :class:`Dataset` whose
``responses`` matrix holds option indices (``int16 [N, n_codebook_items]``, ``-1`` for a
missing answer). Every problem is reported as a :class:`DatasetError` that names the file
and, where it applies, the 1-based data row (or line) and the column, so a researcher can
fix the file without reading code.

This module is pure: it imports only the standard library, numpy and
:class:`models.base.ItemBank` (never a web framework, database layer or settings), so the
importer, the benchmark harness and the tests all share one definition of "valid".
"""

from __future__ import annotations

import ast
import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # imported where used: models.base pulls in torch (seconds to import)
    from models.base import ItemBank

MISSING_CODE = -1
"""Code of a missing answer in :attr:`Dataset.responses`."""

SPLIT_NAMES = ("train_users", "val_users", "test_users")
"""The keys a ``user_split.json`` may have."""

DEFAULT_SPLIT_FILE = "user_split.json"
DEFAULT_RUNS_FILE = "runs.csv"
RESPONSES_FILE = "responses.csv"
CODEBOOK_FILE = "codebook.jsonl"
MANIFEST_FILE = "dataset.json"


class DatasetError(Exception):
    """A dataset file is missing or invalid.

    Attributes:
        file: the file name relative to the dataset folder (e.g. ``"responses.csv"``),
            or ``None`` when the problem is the folder itself.
        row: 1-based data row of a CSV file (the header is row 0), or ``None``.
        column: the CSV column (or JSON field) concerned, or ``None``.
        message: what is wrong, in words.
        line: 1-based line of a JSON / JSON-lines file, or ``None``.

    ``str(err)`` reads like
    ``responses.csv, row 12, column '327a': unknown option 'Z' (expected one of A, B)``.
    """

    def __init__(
        self,
        file: str | None,
        message: str,
        *,
        row: int | None = None,
        column: str | None = None,
        line: int | None = None,
    ) -> None:
        self.file = file
        self.row = row
        self.column = column
        self.line = line
        self.message = message
        super().__init__(self._format())

    def _format(self) -> str:
        where: list[str] = []
        if self.file is not None:
            where.append(self.file)
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.column is not None:
            where.append(f"column {_clip(self.column, 60)}")
        return f"{', '.join(where)}: {self.message}" if where else self.message

    def __str__(self) -> str:
        return self._format()


def _clip(value: object, limit: int = 40) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters of a long value
    (a huge cell must not become a huge message); the length is said instead."""
    text = str(value)
    if len(text) <= limit:
        return repr(value)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def normalise_id(value: object) -> str:
    """A respondent id as a string, with surrounding spaces and a trailing ``.0`` removed.

    Ids are written ``123`` in one file and ``123.0`` in another (a float round trip in the
    tools that produced them); both mean the same respondent.
    """
    text = str(value).strip()
    if text.endswith(".0") and len(text) > 2:
        text = text[:-2]
    return text


@dataclass(frozen=True)
class CodebookItem:
    """One item of the codebook.

    Attributes:
        id: the item key (a column of ``responses.csv``).
        question: the text shown to people.
        options: ``(letter, label)`` pairs in scale order; option index ``k`` is
            ``options[k]``.
        topic: optional short topic.
    """

    id: str
    question: str
    options: tuple[tuple[str, str], ...]
    topic: str | None = None

    @property
    def n_options(self) -> int:
        return len(self.options)

    @property
    def letters(self) -> tuple[str, ...]:
        return tuple(letter for letter, _ in self.options)

    def option_index(self, letter: str) -> int:
        """Index of an option letter; raises ``KeyError`` for an unknown letter."""
        for k, (code, _) in enumerate(self.options):
            if code == letter:
                return k
        raise KeyError(letter)


@dataclass(frozen=True)
class BenchmarkRun:
    """One benchmark protocol run from ``runs.csv``.

    Attributes:
        seed: the run's seed.
        cand_qids: candidate (askable) question ids, in file order.
        eval_qids: held-out target question ids scored by the benchmark.
    """

    seed: int
    cand_qids: tuple[str, ...]
    eval_qids: tuple[str, ...]


@dataclass
class Dataset:
    """A validated dataset in memory.

    Attributes:
        name: the manifest's ``name``.
        path: the dataset folder.
        id_column: the respondent-id column of ``responses.csv``.
        region_column: the codebook item that holds the region, or ``None``.
        codebook: all items, in codebook file order.
        demographics: item ids that are respondent attributes (manifest order).
        questions: askable item ids (manifest order).
        respondent_ids: normalised ids in ``responses.csv`` row order.
        responses: ``int16 [N, len(codebook)]`` option indices, ``-1`` = missing; column
            ``j`` is ``codebook[j]``.
        split: ``{"train_users": [...], "val_users": [...], "test_users": [...]}`` of
            normalised ids, or ``None`` when the dataset has no split.
        runs: the benchmark runs (empty when the dataset has none).
        manifest: the parsed ``dataset.json``.
    """

    name: str
    path: Path
    id_column: str
    region_column: str | None
    codebook: list[CodebookItem]
    demographics: list[str]
    questions: list[str]
    respondent_ids: list[str]
    responses: np.ndarray
    split: dict[str, list[str]] | None
    runs: list[BenchmarkRun]
    manifest: dict[str, Any]
    _columns: dict[str, int] = field(init=False, repr=False, compare=False)
    _rows: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._columns = {item.id: j for j, item in enumerate(self.codebook)}
        self._rows = {rid: i for i, rid in enumerate(self.respondent_ids)}

    @property
    def n_respondents(self) -> int:
        return len(self.respondent_ids)

    def column(self, key: str) -> int:
        """Column of item ``key`` in :attr:`responses` (its codebook position)."""
        try:
            return self._columns[key]
        except KeyError:
            raise DatasetError(CODEBOOK_FILE, f"unknown item {_clip(key)}") from None

    def item(self, key: str) -> CodebookItem:
        """The codebook entry of ``key``; raises :class:`DatasetError` if unknown."""
        return self.codebook[self.column(key)]

    def default_keys(self) -> list[str]:
        """Demographics then questions: the items a belief model is fitted on."""
        return [*self.demographics, *self.questions]

    def item_bank(self, keys: Sequence[str] | None = None) -> ItemBank:
        """An :class:`ItemBank` of ``keys`` (default: demographics + questions) in that order."""
        from models.base import ItemBank  # torch is slow to import: only where used

        keys = self.default_keys() if keys is None else list(keys)
        return ItemBank(tuple(keys), tuple(self.item(k).n_options for k in keys))

    def rows(self, users: Sequence[str]) -> np.ndarray:
        """Row indices (``int64 [len(users)]``) of respondent ids (normalised on the way)."""
        out = np.empty(len(users), dtype=np.int64)
        for i, user in enumerate(users):
            rid = normalise_id(user)
            try:
                out[i] = self._rows[rid]
            except KeyError:
                raise DatasetError(RESPONSES_FILE, f"unknown respondent id {_clip(rid)}") from None
        return out

    def matrix(
        self, keys: Sequence[str] | None = None, users: Sequence[str] | None = None
    ) -> np.ndarray:
        """Option codes ``int16 [n_users, n_keys]`` (``-1`` = missing).

        Args:
            keys: item ids, in the column order wanted (default: demographics + questions,
                matching :meth:`item_bank`).
            users: respondent ids, in the row order wanted (default: all, file order).
        """
        keys = self.default_keys() if keys is None else list(keys)
        cols = np.asarray([self.column(k) for k in keys], dtype=np.int64)
        if users is None:
            return self.responses[:, cols].copy()
        return self.responses[np.ix_(self.rows(users), cols)]

    def user_indices(self, split_name: str) -> np.ndarray:
        """Row indices (``int64``) of the users of one split part, in the split file's order.

        Raises:
            DatasetError: if the dataset has no split or ``split_name`` is not one of
                ``train_users``, ``val_users``, ``test_users``.
        """
        if self.split is None:
            raise DatasetError(None, f"dataset {self.name!r} has no user split")
        if split_name not in SPLIT_NAMES:
            raise DatasetError(
                None, f"unknown split {split_name!r} (expected one of {', '.join(SPLIT_NAMES)})"
            )
        return self.rows(self.split.get(split_name, []))


# ---------------------------------------------------------------------------------------
# reading helpers


def _read_text(folder: Path, name: str) -> str:
    path = folder / name
    if not path.is_file():
        raise DatasetError(name, f"file not found in {folder}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(name, f"not valid UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise DatasetError(name, f"cannot read: {exc.strerror}") from None
    if not text.strip():
        raise DatasetError(name, "the file is empty")
    return text


def _reject_duplicate_keys(file: str, line: int | None):  # type: ignore[no-untyped-def]
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise DatasetError(file, f"duplicate JSON key {_clip(key)}", line=line)
            out[key] = value
        return out

    return hook


def _parse_json(file: str, text: str, line: int | None = None) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicate_keys(file, line))
    except json.JSONDecodeError as exc:
        at = exc.lineno if line is None else line
        raise DatasetError(
            file, f"malformed JSON: {exc.msg} (column {exc.colno})", line=at
        ) from None
    except RecursionError:
        raise DatasetError(file, "JSON nested too deeply to read", line=line or 1) from None
    except ValueError:  # Python's int conversion limit (4,300 digits)
        raise DatasetError(
            file, "holds a number of more than 4,300 digits: write a shorter one", line=line or 1
        ) from None


def _string_list(file: str, field_name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise DatasetError(file, "must be a list of non-empty strings", column=field_name)
    dup = sorted({v for v in value if value.count(v) > 1})
    if dup:
        raise DatasetError(file, f"repeats {', '.join(map(repr, dup))}", column=field_name)
    return list(value)


def _read_manifest(folder: Path) -> dict[str, Any]:
    manifest = _parse_json(MANIFEST_FILE, _read_text(folder, MANIFEST_FILE))
    if not isinstance(manifest, dict):
        raise DatasetError(MANIFEST_FILE, "must be a JSON object")
    for key in ("name", "id_column"):
        if not isinstance(manifest.get(key), str) or not manifest[key].strip():
            raise DatasetError(MANIFEST_FILE, "missing or not a non-empty string", column=key)
    if "questions" not in manifest:
        raise DatasetError(MANIFEST_FILE, "missing", column="questions")
    _string_list(MANIFEST_FILE, "questions", manifest["questions"])
    if not manifest["questions"]:
        raise DatasetError(MANIFEST_FILE, "names no questions", column="questions")
    _string_list(MANIFEST_FILE, "demographics", manifest.get("demographics", []))
    for key in ("region_column", "split", "runs"):
        value = manifest.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise DatasetError(MANIFEST_FILE, "must be a non-empty string", column=key)
    return manifest


def read_codebook(folder: str | Path) -> list[CodebookItem]:
    """The items of ``folder/codebook.jsonl``, in file order (DatasetError naming the line
    of the first malformed entry)."""
    text = _read_text(Path(folder), CODEBOOK_FILE)
    items: list[CodebookItem] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        entry = _parse_json(CODEBOOK_FILE, raw, line=lineno)
        if not isinstance(entry, dict):
            raise DatasetError(CODEBOOK_FILE, "an entry must be a JSON object", line=lineno)
        item_id = entry.get("id")
        if not isinstance(item_id, str) or not item_id.strip():
            raise DatasetError(CODEBOOK_FILE, "entry without an 'id' string", line=lineno)
        if item_id in seen:
            raise DatasetError(
                CODEBOOK_FILE,
                f"duplicate id {_clip(item_id)} (first on line {seen[item_id]})",
                line=lineno,
            )
        seen[item_id] = lineno
        question = entry.get("question")
        if not isinstance(question, str) or not question.strip():
            raise DatasetError(
                CODEBOOK_FILE, f"item {_clip(item_id)} has no 'question' text", line=lineno
            )
        options = entry.get("options")
        if not isinstance(options, dict) or not options:
            raise DatasetError(
                CODEBOOK_FILE,
                f"item {_clip(item_id)} has no 'options' object {{letter: label}}",
                line=lineno,
            )
        pairs: list[tuple[str, str]] = []
        for letter, label in options.items():
            if not letter.strip() or letter != letter.strip() or not isinstance(label, str):
                raise DatasetError(
                    CODEBOOK_FILE,
                    f"item {_clip(item_id)}: option {_clip(letter)} must be a non-empty letter "
                    "without spaces, with a text label",
                    line=lineno,
                )
            pairs.append((letter, label))
        topic = entry.get("topic")
        if topic is not None and not isinstance(topic, str):
            raise DatasetError(
                CODEBOOK_FILE, f"item {_clip(item_id)}: 'topic' must be text", line=lineno
            )
        items.append(CodebookItem(item_id, question, tuple(pairs), topic or None))
    if not items:
        raise DatasetError(CODEBOOK_FILE, "the file has no items")
    return items


def _read_responses(
    folder: Path, id_column: str, codebook: list[CodebookItem], *, allow_empty: bool = False
) -> tuple[list[str], np.ndarray]:
    text = _read_text(folder, RESPONSES_FILE)
    reader = csv.reader(text.splitlines())
    try:
        header = [h.strip() for h in next(reader)]
    except csv.Error as exc:
        raise DatasetError(RESPONSES_FILE, f"malformed CSV header: {exc}", row=0) from None
    if id_column not in header:
        raise DatasetError(
            RESPONSES_FILE,
            f"the id column {_clip(id_column)} (dataset.json) is not in the header",
            row=0,
        )
    seen: set[str] = set()
    for name in header:
        if not name:
            raise DatasetError(RESPONSES_FILE, "the header has an empty column name", row=0)
        if name in seen:
            raise DatasetError(RESPONSES_FILE, "duplicate column", row=0, column=name)
        seen.add(name)
    col_of = {item.id: j for j, item in enumerate(codebook)}
    for name in header:
        if name != id_column and name not in col_of:
            raise DatasetError(
                RESPONSES_FILE,
                f"column {_clip(name)} is not in {CODEBOOK_FILE}",
                row=0,
                column=name,
            )
    id_pos = header.index(id_column)
    # per csv column: (codebook column, {letter: index}, expected-letters text)
    lookup: list[tuple[int, dict[str, int], str] | None] = []
    for name in header:
        if name == id_column:
            lookup.append(None)
            continue
        item = codebook[col_of[name]]
        lookup.append(
            (col_of[name], {c: k for k, c in enumerate(item.letters)}, ", ".join(item.letters))
        )

    ids: list[str] = []
    first_row: dict[str, int] = {}
    rows: list[list[int]] = []
    width = len(header)
    n_cols = len(codebook)
    try:
        for record in reader:
            row = reader.line_num - 1
            if not record or (len(record) == 1 and not record[0].strip()):
                continue  # blank line
            if len(record) != width:
                raise DatasetError(
                    RESPONSES_FILE, f"has {len(record)} cells, the header has {width}", row=row
                )
            rid = normalise_id(record[id_pos])
            if not rid:
                raise DatasetError(RESPONSES_FILE, "empty respondent id", row=row, column=id_column)
            if rid in first_row:
                raise DatasetError(
                    RESPONSES_FILE,
                    f"duplicate respondent id {_clip(rid)} (first in row {first_row[rid]})",
                    row=row,
                    column=id_column,
                )
            first_row[rid] = row
            codes = [MISSING_CODE] * n_cols
            for pos, cell in enumerate(record):
                spec = lookup[pos]
                if spec is None:
                    continue
                value = cell.strip()
                if not value:
                    continue
                col, letters, expected = spec
                try:
                    codes[col] = letters[value]
                except KeyError:
                    raise DatasetError(
                        RESPONSES_FILE,
                        f"unknown option {_clip(value)} (expected one of {expected})",
                        row=row,
                        column=header[pos],
                    ) from None
            ids.append(rid)
            rows.append(codes)
    except csv.Error as exc:
        raise DatasetError(
            RESPONSES_FILE, f"malformed CSV: {exc}", row=reader.line_num - 1
        ) from None
    if not ids and not allow_empty:
        raise DatasetError(RESPONSES_FILE, "the file has a header but no respondents")
    return ids, np.asarray(rows, dtype=np.int16).reshape(len(ids), n_cols)


def _read_split(folder: Path, file: str, known: dict[str, int]) -> dict[str, list[str]]:
    data = _parse_json(file, _read_text(folder, file))
    if not isinstance(data, dict):
        raise DatasetError(file, "must be a JSON object {train_users: [...], ...}")
    out: dict[str, list[str]] = {}
    owner: dict[str, str] = {}
    for name, users in data.items():
        if name not in SPLIT_NAMES:
            raise DatasetError(
                file, f"unknown part (expected {', '.join(SPLIT_NAMES)})", column=name
            )
        if not isinstance(users, list):
            raise DatasetError(file, "must be a list of respondent ids", column=name)
        part: list[str] = []
        for position, user in enumerate(users, start=1):
            if not isinstance(user, str | int | float) or isinstance(user, bool):
                raise DatasetError(
                    file, f"entry {position} is not a respondent id: {_clip(user)}", column=name
                )
            rid = normalise_id(user)
            if rid not in known:
                raise DatasetError(
                    file, f"unknown respondent id {_clip(rid)} (entry {position})", column=name
                )
            if rid in owner:
                where = "twice" if owner[rid] == name else f"also in {owner[rid]!r}"
                raise DatasetError(
                    file,
                    f"respondent {_clip(rid)} is listed {where} (entry {position})",
                    column=name,
                )
            owner[rid] = name
            part.append(rid)
        out[name] = part
    for name in SPLIT_NAMES:
        out.setdefault(name, [])
    return out


def _parse_id_list(file: str, row: int, column: str, cell: str) -> tuple[str, ...]:
    try:
        value = ast.literal_eval(cell.strip())
    except (ValueError, SyntaxError):
        raise DatasetError(
            file, f"not a list literal like ['a', 'b']: {cell[:60]!r}", row=row, column=column
        ) from None
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise DatasetError(file, "must be a list of item ids (strings)", row=row, column=column)
    if not value:
        raise DatasetError(file, "the list is empty", row=row, column=column)
    dup = sorted({v for v in value if value.count(v) > 1})
    if dup:
        raise DatasetError(file, f"repeats {', '.join(map(repr, dup))}", row=row, column=column)
    return tuple(value)


def _read_runs(
    folder: Path, file: str, questions: set[str], codebook_ids: set[str]
) -> list[BenchmarkRun]:
    text = _read_text(folder, file)
    reader = csv.reader(text.splitlines())
    try:
        header = [h.strip() for h in next(reader)]
        required = ("seed", "cand_qids", "eval_qids")
        missing = [c for c in required if c not in header]
        if missing:
            raise DatasetError(
                file,
                f"the header lacks {', '.join(missing)} (expected seed,cand_qids,eval_qids)",
                row=0,
            )
        pos = {c: header.index(c) for c in required}
        runs: list[BenchmarkRun] = []
        seeds: dict[int, int] = {}
        for record in reader:
            row = reader.line_num - 1
            if not record or (len(record) == 1 and not record[0].strip()):
                continue
            if len(record) != len(header):
                raise DatasetError(
                    file, f"has {len(record)} cells, the header has {len(header)}", row=row
                )
            try:
                seed = int(record[pos["seed"]].strip())
            except ValueError:
                raise DatasetError(
                    file, f"not an integer: {record[pos['seed']]!r}", row=row, column="seed"
                ) from None
            if seed in seeds:
                raise DatasetError(
                    file, f"seed {seed} repeats row {seeds[seed]}", row=row, column="seed"
                )
            seeds[seed] = row
            lists: dict[str, tuple[str, ...]] = {}
            for column in ("cand_qids", "eval_qids"):
                ids = _parse_id_list(file, row, column, record[pos[column]])
                for qid in ids:
                    if qid not in codebook_ids:
                        raise DatasetError(
                            file, f"unknown item {_clip(qid)}", row=row, column=column
                        )
                    if qid not in questions:
                        raise DatasetError(
                            file,
                            f"item {_clip(qid)} is not one of the manifest's questions",
                            row=row,
                            column=column,
                        )
                lists[column] = ids
            both = sorted(set(lists["cand_qids"]) & set(lists["eval_qids"]))
            if both:
                raise DatasetError(
                    file,
                    f"items {', '.join(map(repr, both))} are both candidates and targets",
                    row=row,
                    column="eval_qids",
                )
            runs.append(BenchmarkRun(seed, lists["cand_qids"], lists["eval_qids"]))
    except csv.Error as exc:
        raise DatasetError(file, f"malformed CSV: {exc}", row=reader.line_num - 1) from None
    if not runs:
        raise DatasetError(file, "the file has a header but no runs")
    return runs


def _optional_file(folder: Path, manifest: dict[str, Any], key: str, default: str) -> str | None:
    """The file named by ``manifest[key]`` (must exist), else ``default`` if present."""
    named = manifest.get(key)
    if named is not None:
        if Path(named).is_absolute() or ".." in Path(named).parts:
            raise DatasetError(
                MANIFEST_FILE,
                f"{_clip(named)} must be a file name inside the dataset folder",
                column=key,
            )
        if not (folder / named).is_file():
            raise DatasetError(named, f"file not found in {folder} (named by {MANIFEST_FILE})")
        return str(named)
    return default if (folder / default).is_file() else None


def load_dataset(path: str | Path, *, allow_no_respondents: bool = False) -> Dataset:
    """Read and validate a dataset folder in the canonical format.

    Args:
        path: the dataset folder.
        allow_no_respondents: accept a ``responses.csv`` that has a header and no rows (a
            study's items without history); otherwise that is an error.

    Returns:
        The validated :class:`Dataset`.

    Raises:
        DatasetError: naming the file (and row / line / column) of the first problem found:
            a missing or empty file, malformed JSON, a codebook entry without id or options
            or a duplicate id, a ``responses.csv`` column not in the codebook, an unknown
            option letter, a ragged row, a duplicate respondent id, a manifest naming
            unknown items, a split naming unknown ids or a user in two parts, a malformed
            ``runs.csv`` or one naming unknown items.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise DatasetError(None, f"dataset folder not found: {folder}")
    manifest = _read_manifest(folder)
    codebook = read_codebook(folder)
    ids_in_codebook = {item.id for item in codebook}

    id_column: str = manifest["id_column"]
    demographics: list[str] = list(manifest.get("demographics", []))
    questions: list[str] = list(manifest["questions"])
    region = manifest.get("region_column")
    for key, names in (("demographics", demographics), ("questions", questions)):
        unknown = [n for n in names if n not in ids_in_codebook]
        if unknown:
            raise DatasetError(
                MANIFEST_FILE,
                f"names items not in {CODEBOOK_FILE}: {', '.join(map(repr, unknown))}",
                column=key,
            )
    both = sorted(set(demographics) & set(questions))
    if both:
        raise DatasetError(
            MANIFEST_FILE,
            f"items {', '.join(map(repr, both))} are both demographics and questions",
            column="questions",
        )
    if region is not None:
        if region not in ids_in_codebook:
            raise DatasetError(
                MANIFEST_FILE,
                f"{_clip(region)} is not an item of {CODEBOOK_FILE}",
                column="region_column",
            )
        if region in questions:
            raise DatasetError(
                MANIFEST_FILE,
                f"{_clip(region)} is also listed as a question",
                column="region_column",
            )
    if id_column in ids_in_codebook:
        raise DatasetError(
            MANIFEST_FILE,
            f"the id column {_clip(id_column)} is also a codebook item",
            column="id_column",
        )

    respondent_ids, responses = _read_responses(
        folder, id_column, codebook, allow_empty=allow_no_respondents
    )
    known_rows = {rid: i for i, rid in enumerate(respondent_ids)}

    split_file = _optional_file(folder, manifest, "split", DEFAULT_SPLIT_FILE)
    split = _read_split(folder, split_file, known_rows) if split_file else None
    runs_file = _optional_file(folder, manifest, "runs", DEFAULT_RUNS_FILE)
    runs = _read_runs(folder, runs_file, set(questions), ids_in_codebook) if runs_file else []

    return Dataset(
        name=manifest["name"],
        path=folder,
        id_column=id_column,
        region_column=region,
        codebook=codebook,
        demographics=demographics,
        questions=questions,
        respondent_ids=respondent_ids,
        responses=responses,
        split=split,
        runs=runs,
        manifest=manifest,
    )
