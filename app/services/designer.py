"""The study designer: create studies, edit items and roles, budgets, texts, status; imports.

Imports reuse the project's importer (:func:`app.services.importer.import_dataset`, one
transaction, nothing written on error): either a dataset folder shipped with the server
(``datasets/``) or uploaded files (``responses.csv`` and ``codebook.jsonl``, plus
``dataset.json`` or the manifest fields typed in the form). :func:`preview_upload`
validates the files the same way and describes what would be imported, so the importer's
error messages are shown before anything is written.
"""

from __future__ import annotations

import json
import re
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func
from sqlmodel import Session, col, select

from app.errors import ConflictError, InvalidInputError, NotFoundError
from app.schemas import StudySettings
from app.services.importer import ImportResult, hide_folder, import_dataset, slugify
from app.tables import (
    Answer,
    ElicitationSession,
    Item,
    ItemRole,
    Researcher,
    Study,
    StudyStatus,
)
from elicitation.criteria import criterion_names
from elicitation.datasets import (
    CODEBOOK_FILE,
    RESPONSES_FILE,
    Dataset,
    DatasetError,
    load_dataset,
)

MANIFEST_FILE = "dataset.json"
OPTIONAL_FILES = ("user_split.json", "runs.csv")
MAX_UPLOAD_BYTES = 50 * 1024 * 1024
_LETTER = re.compile(r"^[A-Za-z0-9]{1,32}$")


# ----- studies ---------------------------------------------------------------------------


def create_study(name: str, *, owner: Researcher, session: Session) -> Study:
    """A new empty draft study owned by ``owner``."""
    name = name.strip()
    slug = slugify(name)
    if not name or not slug:
        raise InvalidInputError("the study needs a name with letters or digits")
    if len(name) > 200:
        raise InvalidInputError("the study name is longer than 200 characters")
    if session.exec(select(Study).where(Study.slug == slug)).first() is not None:
        raise ConflictError(f"a study with slug {slug!r} already exists; choose another name")
    study = Study(
        slug=slug,
        name=name,
        owner_id=owner.id,
        settings=StudySettings().model_dump(mode="json"),
    )
    session.add(study)
    session.commit()
    session.refresh(study)
    return study


def study_items(study: Study, *, session: Session) -> list[Item]:
    return list(
        session.exec(
            select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
        ).all()
    )


def has_live_answers(study: Study, *, session: Session) -> bool:
    """Whether any respondent answered in a live session (then options are frozen)."""
    n = session.exec(
        select(func.count())
        .select_from(Answer)
        .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
        .where(ElicitationSession.study_id == study.id)
    ).one()
    return int(n) > 0


def update_texts(
    study: Study,
    *,
    session: Session,
    name: str,
    description: str,
    consent_text: str,
    completion_code: str,
    redirect_url: str,
) -> Study:
    """Set the study's name, description, consent text, completion code and redirect URL."""
    name = name.strip()
    if not name or len(name) > 200:
        raise InvalidInputError("the name must have 1 to 200 characters")
    code = completion_code.strip()
    if len(code) > 100:
        raise InvalidInputError("the completion code is longer than 100 characters")
    url = redirect_url.strip()
    if url and not re.match(r"^https?://[^\s]+$", url):
        raise InvalidInputError("the redirect URL must start with http:// or https://")
    if len(url) > 2000:
        raise InvalidInputError("the redirect URL is longer than 2000 characters")
    study.name = name
    study.description = description
    study.consent_text = consent_text
    study.completion_code = code or None
    study.redirect_url = url or None
    session.add(study)
    session.commit()
    session.refresh(study)
    return study


def update_settings(study: Study, values: dict[str, Any], *, session: Session) -> StudySettings:
    """Validate and store the criterion, budgets and group settings.

    ``values`` is the nested :class:`StudySettings` shape; a validation error names the
    field (e.g. ``budgets.min_questions``).
    """
    try:
        validated = StudySettings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        msg = str(first.get("msg", "")).removeprefix("Value error, ")
        raise InvalidInputError(f"{where}: {msg}" if where else msg) from None
    if validated.criterion not in criterion_names():
        raise InvalidInputError(
            f"criterion: unknown {validated.criterion!r} (known: {', '.join(criterion_names())})"
        )
    study.settings = validated.model_dump(mode="json")
    session.add(study)
    session.commit()
    session.refresh(study)
    return validated


def set_status(study: Study, status: str, *, session: Session) -> Study:
    """Publish (needs items, a question and a consent text) or close a study."""
    if status not in (StudyStatus.published.value, StudyStatus.closed.value):
        raise InvalidInputError(f"unknown status {status!r}")
    if status == StudyStatus.published.value:
        items = study_items(study, session=session)
        if not any(it.role == ItemRole.question.value for it in items):
            raise InvalidInputError("add at least one question item before publishing")
        if not study.consent_text.strip():
            raise InvalidInputError("write the consent text before publishing")
    study.status = status
    session.add(study)
    session.commit()
    session.refresh(study)
    return study


# ----- items -----------------------------------------------------------------------------


def parse_options(text: str) -> list[list[str]]:
    """Options from text, one per line: ``A: Strongly agree`` (or just the label).

    Lines without a letter get ``A``, ``B``, ... in order. At least two options; letters
    unique, 1-32 letters or digits.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        raise InvalidInputError("an item needs at least two options, one per line")
    options: list[list[str]] = []
    for k, line in enumerate(lines):
        letter, sep, label = line.partition(":")
        if sep and _LETTER.match(letter.strip()) and label.strip():
            options.append([letter.strip(), label.strip()])
        else:
            if k >= 26:
                raise InvalidInputError("more than 26 options: write 'LETTER: label' lines")
            options.append([chr(ord("A") + k), line])
    letters = [o[0] for o in options]
    dup = sorted({x for x in letters if letters.count(x) > 1})
    if dup:
        raise InvalidInputError(f"option letters used twice: {', '.join(dup)}")
    return options


def _check_role(role: str) -> str:
    if role not in {r.value for r in ItemRole}:
        raise InvalidInputError(f"role must be question, attribute or target, not {role!r}")
    return role


def add_item(
    study: Study,
    *,
    session: Session,
    key: str,
    question: str,
    options_text: str,
    role: str,
    topic: str = "",
    is_preference_criterion: bool = False,
) -> Item:
    """Add an item at the end of the study."""
    key = key.strip()
    if not re.match(r"^[A-Za-z0-9_.\-]{1,200}$", key):
        raise InvalidInputError("the item key must be 1-200 letters, digits, '_', '.' or '-'")
    if not question.strip():
        raise InvalidInputError("the question text is empty")
    items = study_items(study, session=session)
    if any(it.key == key for it in items):
        raise ConflictError(f"the study already has an item {key!r}")
    item = Item(
        study_id=study.id or 0,
        key=key,
        question=question.strip(),
        options=parse_options(options_text),
        role=_check_role(role),
        topic=topic.strip()[:200] or None,
        position=max((it.position for it in items), default=-1) + 1,
        is_preference_criterion=is_preference_criterion,
    )
    session.add(item)
    session.commit()
    session.refresh(item)
    return item


def get_item(study: Study, item_id: int, *, session: Session) -> Item:
    item = session.get(Item, item_id)
    if item is None or item.study_id != study.id:
        raise NotFoundError(f"no item {item_id} in this study")
    return item


def update_item(
    study: Study,
    item: Item,
    *,
    session: Session,
    question: str,
    options_text: str,
    role: str,
    topic: str,
    is_preference_criterion: bool,
) -> Item:
    """Edit an item. Its options may change only while no live answer refers to them."""
    if not question.strip():
        raise InvalidInputError("the question text is empty")
    options = parse_options(options_text)
    if options != item.options and has_live_answers(study, session=session):
        old = {o[0] for o in item.options}
        if not old <= {o[0] for o in options}:
            raise ConflictError(
                "respondents have answered this study: option letters cannot be removed"
            )
    item.question = question.strip()
    item.options = options
    item.role = _check_role(role)
    item.topic = topic.strip()[:200] or None
    item.is_preference_criterion = is_preference_criterion
    session.add(item)
    session.commit()
    session.refresh(item)
    return item


def delete_item(study: Study, item: Item, *, session: Session) -> None:
    """Delete an item (refused once live respondents have answered the study)."""
    if has_live_answers(study, session=session):
        raise ConflictError("respondents have answered this study: items cannot be deleted")
    session.delete(item)
    session.commit()


def set_roles(study: Study, roles: dict[str, str], *, session: Session) -> int:
    """Set the role of several items at once (``{item key: role}``); returns the count."""
    items = {it.key: it for it in study_items(study, session=session)}
    unknown = sorted(set(roles) - set(items))
    if unknown:
        raise InvalidInputError(f"unknown items: {', '.join(unknown[:5])}")
    for key, role in roles.items():
        items[key].role = _check_role(role)
        session.add(items[key])
    session.commit()
    return len(roles)


# ----- imports ---------------------------------------------------------------------------


def shipped_datasets(datasets_dir: Path) -> list[str]:
    """Names of the dataset folders shipped with the server (those with a codebook)."""
    if not datasets_dir.is_dir():
        return []
    return sorted(
        p.name
        for p in datasets_dir.iterdir()
        if p.is_dir() and (p / CODEBOOK_FILE).is_file() and (p / RESPONSES_FILE).is_file()
    )


def import_shipped(
    name: str, *, datasets_dir: Path, owner: Researcher, session: Session, study_name: str = ""
) -> ImportResult:
    """Import the shipped dataset ``name`` as a study owned by ``owner``."""
    if name not in shipped_datasets(datasets_dir):
        raise NotFoundError(f"no shipped dataset {name!r}")
    result = import_dataset(
        datasets_dir / name, session=session, study_name=study_name.strip() or None
    )
    _set_owner(result.study_id, owner, session=session)
    return result


def _set_owner(study_id: int, owner: Researcher, *, session: Session) -> None:
    study = session.get(Study, study_id)
    assert study is not None
    study.owner_id = owner.id
    session.add(study)
    session.commit()


@dataclass(frozen=True)
class UploadPreview:
    """What an upload would import."""

    name: str
    n_respondents: int
    n_items: int
    attributes: list[str]
    questions: list[str]
    has_split: bool
    n_runs: int
    head: list[list[str]]
    columns: list[str]


def _write_upload(folder: Path, files: dict[str, bytes], manifest_fields: dict[str, str]) -> None:
    total = sum(len(v) for v in files.values())
    if total > MAX_UPLOAD_BYTES:
        raise InvalidInputError(f"the upload is larger than {MAX_UPLOAD_BYTES // 2**20} MiB")
    for required in (RESPONSES_FILE, CODEBOOK_FILE):
        if not files.get(required):
            raise InvalidInputError(f"upload {required}")
    for name, data in files.items():
        if data and name in (RESPONSES_FILE, CODEBOOK_FILE, MANIFEST_FILE, *OPTIONAL_FILES):
            (folder / name).write_bytes(data)
    if not files.get(MANIFEST_FILE):
        (folder / MANIFEST_FILE).write_text(
            json.dumps(_manifest_from_fields(files[RESPONSES_FILE], manifest_fields)),
            encoding="utf-8",
        )


def _manifest_from_fields(responses: bytes, fields: dict[str, str]) -> dict[str, Any]:
    """A ``dataset.json`` for a plain CSV: id column, attributes; the other columns ask."""
    try:
        header = responses.decode("utf-8-sig").splitlines()[0]
    except (UnicodeDecodeError, IndexError):
        raise DatasetError(RESPONSES_FILE, "not UTF-8 text with a header line") from None
    columns = [c.strip() for c in header.split(",")]
    id_column = fields.get("id_column", "").strip() or columns[0]
    demographics = [c.strip() for c in fields.get("attributes", "").split(",") if c.strip()]
    name = fields.get("name", "").strip() or "uploaded"
    questions = [c for c in columns if c != id_column and c not in demographics]
    return {
        "name": name,
        "id_column": id_column,
        "demographics": demographics,
        "questions": questions,
    }


def preview_upload(files: dict[str, bytes], manifest_fields: dict[str, str]) -> UploadPreview:
    """Validate uploaded files exactly as the importer will; describe what they hold.

    Raises:
        DatasetError / InvalidInputError: the importer's message (file, row, column).
    """
    with tempfile.TemporaryDirectory(prefix="priorly-upload-") as tmp:
        folder = Path(tmp)
        _write_upload(folder, files, manifest_fields)
        try:
            ds: Dataset = load_dataset(folder)
        except DatasetError as exc:  # no server path in the browser
            raise hide_folder(exc, folder) from None
        head = ds.responses[:5].tolist()
        letters = [item.letters for item in ds.codebook]
        rows = [
            [ds.respondent_ids[i]] + [letters[j][v] if v >= 0 else "" for j, v in enumerate(row)]
            for i, row in enumerate(head)
        ]
        return UploadPreview(
            name=manifest_fields.get("name", "").strip() or ds.name,
            n_respondents=ds.n_respondents,
            n_items=len(ds.codebook),
            attributes=list(ds.demographics),
            questions=list(ds.questions),
            has_split=ds.split is not None,
            n_runs=len(ds.runs),
            head=rows,
            columns=[ds.id_column] + [item.id for item in ds.codebook],
        )


def import_upload(
    files: dict[str, bytes],
    manifest_fields: dict[str, str],
    *,
    owner: Researcher,
    session: Session,
) -> ImportResult:
    """Import uploaded files as a study owned by ``owner`` (one transaction)."""
    with tempfile.TemporaryDirectory(prefix=f"priorly-upload-{secrets.token_hex(4)}-") as tmp:
        folder = Path(tmp)
        _write_upload(folder, files, manifest_fields)
        name = manifest_fields.get("name", "").strip() or None
        try:
            result = import_dataset(folder, session=session, study_name=name)
        except DatasetError as exc:  # no server path in the browser
            raise hide_folder(exc, folder) from None
    _set_owner(result.study_id, owner, session=session)
    return result
