"""Import a dataset in the canonical format as a study.

The dataset is read and validated completely first (:func:`elicitation.datasets.load_dataset`),
then the study, its items, its respondents and their historical answers are written in ONE
transaction with bulk inserts: on any error nothing is written.

Roles: the manifest's ``demographics`` and ``region_column`` become ``attribute`` items;
``questions`` become ``question`` items; codebook items the manifest does not classify
are imported as ``question`` items too (the study designer can change any role later). No
item is a ``target`` after an import: choosing targets is the designer's decision.

Each imported respondent gets ``attributes`` ``{attribute key: letter}`` and ``answers``
``{other item key: letter}`` (non-missing cells only; together they are the dataset row)
and its split (``train`` / ``val`` / ``test``, or NULL).
"""

from __future__ import annotations

import json
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, Connection, insert, select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from app.errors import ConflictError, InvalidInputError
from app.schemas import StudySettings
from app.tables import (
    OPTION_MAX_LEN,
    Item,
    ItemRole,
    Respondent,
    RespondentSource,
    Study,
    StudyStatus,
    imported_external_id,
)
from app.textguard import bad_character, clip, unsafe_in_name
from elicitation.datasets import (
    CODEBOOK_FILE,
    MANIFEST_FILE,
    RESPONSES_FILE,
    Dataset,
    DatasetError,
    load_dataset,
)

SLUG_MAX_LEN = 100
_SPLIT_OF = {"train_users": "train", "val_users": "val", "test_users": "test"}


@dataclass(frozen=True)
class ImportResult:
    """What an import wrote."""

    study_id: int
    slug: str
    name: str
    n_items: int
    n_respondents: int
    n_answers: int
    seconds: float
    renamed_ids: int = 0
    """Respondent ids of the form ``r<number>`` stored as ``import-r<number>``
    (:func:`app.tables.imported_external_id`)."""

    def notice(self) -> str:
        """What the study page says after the import ("" when nothing needs saying)."""
        if not self.renamed_ids:
            return ""
        return (
            f"{self.renamed_ids:,} imported respondent id{'' if self.renamed_ids == 1 else 's'} "
            "of the form r<number> (the form of the ids priorly gives respondents without "
            "one) stored with the prefix import- (r12 is import-r12)"
        )


_TRANSLITERATE = str.maketrans(
    {
        "ß": "ss",
        "æ": "ae",
        "Æ": "ae",
        "ø": "o",
        "Ø": "o",
        "œ": "oe",
        "Œ": "oe",
        "ł": "l",
        "Ł": "l",
        "đ": "d",
        "Đ": "d",
        "þ": "th",
        "Þ": "th",
        "ð": "d",
        "ı": "i",
    }
)


def _is_mark(c: str) -> bool:
    """A combining mark (an accent, or a vowel sign of an Indic script)."""
    return unicodedata.category(c).startswith("M")


def slugify(text: str) -> str:
    """A URL slug: lower-case words joined by ``-``.

    Latin letters lose their accents (``"Größe Zürich"`` -> ``"grosse-zurich"``); letters
    of other scripts are kept as they are, so a Cyrillic or Chinese name gives a readable
    slug (``"Опрос 2026"`` -> ``"опрос-2026"``; browsers percent-encode it in the URL).
    Punctuation and spaces become one ``-``. At most :data:`SLUG_MAX_LEN` characters.

    Example::

        >>> slugify("CES 2024!")
        'ces-2024'
    """
    text = unicodedata.normalize("NFKC", text).translate(_TRANSLITERATE)
    kept: list[str] = []
    base = ""
    for c in unicodedata.normalize("NFD", text):
        if not _is_mark(c):
            base = c
        elif base.isascii():  # an accent on a Latin letter; other scripts keep their marks
            continue
        kept.append(c)
    text = unicodedata.normalize("NFC", "".join(kept)).lower()
    word = "".join(c if c.isalnum() or _is_mark(c) else " " for c in text)
    slug = "-".join(word.split())
    return slug[:SLUG_MAX_LEN].rstrip("-")


def _check_lengths(ds: Dataset) -> None:
    """Refuse values longer than the columns hold, and items with fewer than two options
    (nothing to ask; the designer refuses them too), checked before any write."""
    key_max = Item.__table__.c.key.type.length  # type: ignore[attr-defined]
    topic_max = Item.__table__.c.topic.type.length  # type: ignore[attr-defined]
    id_max = Respondent.__table__.c.external_id.type.length  # type: ignore[attr-defined]
    for line, item in enumerate(ds.codebook, start=1):
        if len(item.options) < 2:
            raise DatasetError(
                CODEBOOK_FILE,
                f"item {clip(item.id, 40)!r} has {len(item.options)} option: an item needs at "
                "least two",
                line=line,
            )
        if len(item.id) > key_max:
            raise DatasetError(
                CODEBOOK_FILE, f"item id {item.id[:40]!r}... is longer than {key_max}"
            )
        if item.topic is not None and len(item.topic) > topic_max:
            raise DatasetError(CODEBOOK_FILE, f"item {item.id!r}: topic is longer than {topic_max}")
        for letter in item.letters:
            if len(letter) > OPTION_MAX_LEN:
                raise DatasetError(
                    CODEBOOK_FILE,
                    f"item {item.id!r}: option {letter[:40]!r} is longer than {OPTION_MAX_LEN}",
                )
    for row, rid in enumerate(ds.respondent_ids, start=1):
        if len(rid) > id_max:
            raise DatasetError(
                RESPONSES_FILE,
                f"respondent id is longer than {id_max} characters",
                row=row,
                column=ds.id_column,
            )


def _check_text(ds: Dataset) -> None:
    """Refuse text no database column can store (a NUL character, a lone surrogate), and
    control or bidirectional control characters in names and ids
    (:func:`app.textguard.unsafe_in_name`), naming file and line or row (checked before
    any write; PostgreSQL's bulk ``COPY`` would otherwise fail with a driver error)."""
    problem = bad_character(ds.name) or unsafe_in_name(ds.name)
    if problem is not None:
        raise DatasetError(MANIFEST_FILE, f"the name contains {problem}", column="name")
    for line, item in enumerate(ds.codebook, start=1):
        problem = unsafe_in_name(item.id)
        if problem is not None:
            raise DatasetError(
                CODEBOOK_FILE, f"item id {clip(item.id, 40)!r} contains {problem}", line=line
            )
        texts = [("id", item.id), ("question", item.question), ("topic", item.topic or "")]
        texts += [(f"option {letter!r}", label) for letter, label in item.options]
        texts += [("option letter", letter) for letter, _ in item.options]
        for field, text in texts:
            problem = bad_character(text)
            if problem is not None:
                raise DatasetError(
                    CODEBOOK_FILE,
                    f"item {clip(item.id, 40)!r}: {field} contains {problem}",
                    line=line,
                )
    for row, rid in enumerate(ds.respondent_ids, start=1):
        problem = bad_character(rid) or unsafe_in_name(rid)
        if problem is not None:
            raise DatasetError(
                RESPONSES_FILE, f"respondent id contains {problem}", row=row, column=ds.id_column
            )


def check_storable(ds: Dataset) -> None:
    """What the import checks beyond the dataset format, before any write: lengths the
    columns hold, and text a database can store (so a preview refuses what the import
    would).

    Raises:
        DatasetError: naming the file and the line or row.
    """
    _check_lengths(ds)
    _check_text(ds)


def hide_folder(exc: DatasetError, folder: Path) -> DatasetError:
    """``exc`` with the server folder it names (an upload's temporary folder) replaced by
    "the uploaded files": an error shown in the browser does not reveal server paths."""
    exc.message = exc.message.replace(str(folder), "the uploaded files")
    return exc


def _roles(ds: Dataset) -> dict[str, str]:
    attributes = set(ds.demographics)
    if ds.region_column is not None:
        attributes.add(ds.region_column)
    return {
        item.id: ItemRole.attribute.value if item.id in attributes else ItemRole.question.value
        for item in ds.codebook
    }


def import_dataset(
    path: str | Path,
    *,
    session: Session,
    study_name: str | None = None,
    respondents: bool = True,
    allow_no_respondents: bool = False,
) -> ImportResult:
    """Import the dataset folder ``path`` as a new study, in one transaction.

    Args:
        path: a dataset folder in the canonical format.
        session: the database session; it is committed on success, rolled back on error.
        study_name: the study's name (default: the manifest's ``name``); the slug is
            :func:`slugify` of it.
        respondents: also import the respondents and their answers (``False``: the study
            and its items only, e.g. the lifecycle benchmark's study without history).
        allow_no_respondents: accept a ``responses.csv`` with a header and no rows (an
            uploaded codebook without past answers); otherwise that is a DatasetError.

    Raises:
        DatasetError: the dataset is invalid (names file, row, column); nothing written.
        ConflictError: a study with the same slug exists; nothing written.
        InvalidInputError: the name gives an empty slug.
    """
    start = time.perf_counter()
    ds = load_dataset(path, allow_no_respondents=allow_no_respondents)
    check_storable(ds)
    name = (study_name if study_name is not None else ds.name).strip()
    slug = slugify(name)
    if not slug:
        raise InvalidInputError(
            f"study name {name!r} gives an empty slug (use letters or digits, e.g. --study ces)"
        )
    try:
        result = _write(ds, name=name, slug=slug, session=session, respondents=respondents)
        session.commit()
    except IntegrityError as exc:
        session.rollback()
        if _is_slug_conflict(exc):
            raise ConflictError(f"a study with slug {slug!r} already exists") from None
        raise
    except BaseException:
        session.rollback()
        raise
    return ImportResult(**result, seconds=time.perf_counter() - start)


def _is_slug_conflict(exc: IntegrityError) -> bool:
    text = str(exc.orig).lower()
    return "uq_study_slug" in text or "study.slug" in text


def _bulk_insert(conn: Connection, table: Any, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` (dicts with the same keys) into ``table`` in the current transaction.

    PostgreSQL: ``COPY ... FROM STDIN`` through the psycopg connection of this transaction
    (an executemany of 200k rows takes ~30 s there, COPY well under a second). Other
    backends: one executemany.
    """
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(insert(table), rows)
        return
    columns = list(rows[0])
    json_cols = {c for c in columns if isinstance(table.__table__.c[c].type, JSON)}
    raw = conn.connection.driver_connection
    assert raw is not None
    cols_sql = ", ".join(f'"{c}"' for c in columns)
    with (
        raw.cursor() as cur,
        cur.copy(f'COPY "{table.__tablename__}" ({cols_sql}) FROM STDIN') as copy,
    ):
        for row in rows:
            copy.write_row(
                [
                    json.dumps(row[c]) if c in json_cols and row[c] is not None else row[c]
                    for c in columns
                ]
            )


def _write(
    ds: Dataset, *, name: str, slug: str, session: Session, respondents: bool = True
) -> dict[str, Any]:
    conn = session.connection()
    if conn.execute(select(Study.id).where(Study.slug == slug)).first() is not None:  # type: ignore[call-overload]
        raise ConflictError(f"a study with slug {slug!r} already exists")

    study = Study(
        slug=slug,
        name=name,
        status=StudyStatus.draft.value,
        description=f"Imported from the dataset {ds.name!r}.",
        settings=StudySettings().model_dump(mode="json"),
        benchmark_runs=[
            {"seed": r.seed, "cand_qids": list(r.cand_qids), "eval_qids": list(r.eval_qids)}
            for r in ds.runs
        ],
        source=ds.manifest.get("source"),
        license=ds.manifest.get("license"),
    )
    session.add(study)
    session.flush()
    study_id = study.id
    assert study_id is not None

    roles = _roles(ds)
    _bulk_insert(
        conn,
        Item,
        [
            {
                "study_id": study_id,
                "key": item.id,
                "question": item.question,
                "options": [[letter, label] for letter, label in item.options],
                "role": roles[item.id],
                "topic": item.topic,
                "position": position,
                "is_preference_criterion": False,
            }
            for position, item in enumerate(ds.codebook)
        ],
    )

    split_of: dict[str, str] = {}
    for part, users in (ds.split or {}).items():
        for user in users:
            split_of[user] = _SPLIT_OF[part]
    attr_cols = [j for j, item in enumerate(ds.codebook) if roles[item.id] == "attribute"]
    answer_cols = [j for j, item in enumerate(ds.codebook) if roles[item.id] != "attribute"]
    keys = [item.id for item in ds.codebook]
    letters = [item.letters for item in ds.codebook]
    now = study.created_at
    respondent_rows = []
    n_answers = renamed = 0
    taken = set(ds.respondent_ids)
    for rid, row in zip(ds.respondent_ids, ds.responses.tolist(), strict=True):
        if not respondents:
            break
        answers = {keys[j]: letters[j][row[j]] for j in answer_cols if row[j] >= 0}
        n_answers += len(answers)
        stored = imported_external_id(rid)
        if stored != rid:
            if stored in taken:
                raise DatasetError(
                    RESPONSES_FILE,
                    f"respondent id {rid!r} has the form r<number>, stored as {stored!r}, "
                    "which another respondent already has: rename one of them",
                )
            renamed += 1
        respondent_rows.append(
            {
                "study_id": study_id,
                "external_id": stored,
                "attributes": {keys[j]: letters[j][row[j]] for j in attr_cols if row[j] >= 0},
                "answers": answers,
                "panel_params": None,
                "source": RespondentSource.import_.value,
                "split": split_of.get(rid),
                "created_at": now,
            }
        )
    _bulk_insert(conn, Respondent, respondent_rows)

    return {
        "study_id": study_id,
        "slug": slug,
        "name": name,
        "n_items": len(ds.codebook),
        "n_respondents": len(respondent_rows),
        "n_answers": n_answers,
        "renamed_ids": renamed,
    }
