"""The study designer: create studies, edit items and roles, budgets, texts, status; imports.

Imports reuse the project's importer (:func:`app.services.importer.import_dataset`, one
transaction, nothing written on error): either a dataset folder shipped with the server
(``datasets/``) or uploaded files (``responses.csv`` and ``codebook.jsonl``, plus
``dataset.json`` or the manifest fields typed in the form). :func:`preview_upload`
validates the files the same way and describes what would be imported, so the importer's
error messages are shown before anything is written.
"""

from __future__ import annotations

import csv
import json
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func
from sqlmodel import Session, col, select

from app.errors import ConflictError, InvalidInputError, NotFoundError
from app.schemas import StudySettings
from app.services.columns import reserved_key
from app.services.importer import ImportResult, check_storable, import_dataset, slugify
from app.services.setting_words import (
    BELIEF_MODEL_LABELS,
    CRITERION_NEEDS,
    criteria_for,
    criterion_runs_with,
)
from app.tables import (
    Answer,
    ElicitationSession,
    GroupRound,
    GroupRoundMember,
    GroupRoundStatus,
    Item,
    ItemRole,
    Researcher,
    Respondent,
    Study,
    StudyStatus,
)
from app.textguard import unsafe_in_name
from elicitation.criteria import criterion_names
from elicitation.datasets import (
    CODEBOOK_FILE,
    RESPONSES_FILE,
    Dataset,
    DatasetError,
    load_dataset,
    read_codebook,
)

MANIFEST_FILE = "dataset.json"
OPTIONAL_FILES = ("user_split.json", "runs.csv")
MAX_UPLOAD_BYTES = 50 * 1024 * 1024
_LETTER = re.compile(r"^[A-Za-z0-9]{1,32}$")


# ----- studies ---------------------------------------------------------------------------


NAME_MAX_LEN = 200
TEXT_MAX_LEN = 20_000
"""The longest study description and consent text (characters; about eight pages)."""
"""The longest study name (characters)."""


def check_name(name: str) -> str:
    """``name`` without surrounding spaces; InvalidInputError when it is empty, longer
    than :data:`NAME_MAX_LEN` (never cut) or has no letter or digit for the slug."""
    name = name.strip()
    if not name:
        raise InvalidInputError("the study needs a name")
    if len(name) > NAME_MAX_LEN:
        raise InvalidInputError(
            f"the study name has {len(name):,} characters; the limit is {NAME_MAX_LEN}"
        )
    if not slugify(name):
        raise InvalidInputError("the study name needs at least one letter or digit")
    problem = unsafe_in_name(name)
    if problem is not None:
        raise InvalidInputError(f"the study name contains {problem}")
    return name


def create_study(name: str, *, owner: Researcher, session: Session) -> Study:
    """A new empty draft study owned by ``owner``; its slug is :func:`slugify` of the name
    (``"Größe 2026"`` -> ``grosse-2026``, ``"Опрос"`` -> ``опрос``)."""
    name = check_name(name)
    slug = slugify(name)
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


def live_answer_count(item: Item, *, session: Session) -> int:
    """Live answers (skips included) given to ``item``."""
    return int(
        session.exec(
            select(func.count()).select_from(Answer).where(Answer.item_id == item.id)
        ).one()
    )


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
    name = check_name(name)
    for what, text in (("description", description), ("consent text", consent_text)):
        if len(text) > TEXT_MAX_LEN:
            raise InvalidInputError(
                f"the {what} has {len(text):,} characters; the limit is {TEXT_MAX_LEN:,}"
            )
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


SETTING_LABELS = {
    "criterion": "Criterion",
    "belief_model": "Belief model",
    "budgets.max_questions": "Max questions",
    "budgets.min_questions": "Min questions",
    "budgets.stop_eig_threshold": "Stop when best EIG below",
    "budgets.stop_entropy_threshold": "Stop when target entropy below",
    "budgets": "Questions",
    "calibration_items": "Calibration questions",
    "calibration_min_answers": "…until every item has this many answers",
    "drop_after_minutes": "Count as dropped after (minutes idle)",
    "language": "Language of the respondent pages",
    "refit_every": "Refit after this many new completed respondents",
    "group.rounds": "Rounds",
    "group.respondents_per_round": "Respondents per round",
    "group.respondents_share": "Share of the panel per round",
    "group.total_answers": "Total questions asked across rounds (members invited)",
    "group.max_questions_per_respondent": "Round questions per respondent (all rounds)",
    "group.panel": "Panel",
}
"""The study page's words for a settings field, for its validation errors."""

SETTING_FIELD_LABELS = {key.rsplit(".", 1)[-1]: label for key, label in SETTING_LABELS.items()}
""":data:`SETTING_LABELS` by the settings form's field names (``max_questions``)."""


def _settings_error(exc: ValidationError) -> str:
    """The first problem of a settings validation in the form's words, e.g.
    ``Stop when best EIG below: must be at least 0 (you typed -1)``."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    ctx = {k: f"{v:g}" if isinstance(v, float) else v for k, v in (first.get("ctx") or {}).items()}
    kind = first.get("type", "")
    msg = {
        "greater_than_equal": f"must be at least {ctx.get('ge')}",
        "greater_than": f"must be more than {ctx.get('gt')}",
        "less_than_equal": f"must be at most {ctx.get('le')}",
        "less_than": f"must be less than {ctx.get('lt')}",
        "int_parsing": "must be a whole number",
        "int_from_float": "must be a whole number",
        "float_parsing": "must be a number",
        "finite_number": "must be a finite number",
    }.get(kind, str(first.get("msg", "")).removeprefix("Value error, "))
    typed = first.get("input")
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        msg += f" (you typed {f'{typed:g}' if isinstance(typed, float) else typed})"
    label = SETTING_LABELS.get(where, where)
    return f"{label}: {msg}" if label else msg


def calibration_note(asked: int, stored: StudySettings) -> str:
    """What the settings form adds to its "settings saved" notice when it lowered the
    calibration questions ``asked`` for to leave one adaptive question ("" when it did
    not)."""
    if asked <= stored.calibration_items:
        return ""
    return (
        f"; calibration questions lowered to {stored.calibration_items} "
        f"(at most max questions − 1, so that one question at least is adaptive)"
    )


def group_size_note(study: Study, stored: StudySettings, *, session: Session) -> str:
    """What the settings form adds to its "settings saved" notice when "Respondents per
    round" is more than the study has respondents ("" otherwise): a round asks at most
    the panel's reachable members, so the number is kept but cannot be reached.

    Example: 99999 per round in a study of 5,369 respondents: "; 99999 respondents per
    round is more than the study's 5369 respondents: a round asks at most the panel's
    members who can be reached".
    """
    wanted = stored.group.respondents_per_round
    if wanted is None:
        return ""
    n = session.exec(
        select(func.count()).select_from(Respondent).where(Respondent.study_id == study.id)
    ).one()
    if wanted <= n:
        return ""
    return (
        f"; {wanted} respondents per round is more than the study's {n} respondents: a "
        "round asks at most the panel's members who can be reached"
    )


def update_settings(study: Study, values: dict[str, Any], *, session: Session) -> StudySettings:
    """Validate and store the criterion, budgets and group settings.

    ``values`` is the nested :class:`StudySettings` shape; a validation error names the
    field by its label on the study page (:data:`SETTING_LABELS`). A new cap on the round
    questions (``group.total_answers``) below what the rounds already asked is refused
    (:func:`_check_group_cap`). Calibration questions
    leave one adaptive question at least: more than ``max_questions - 1`` are stored as
    ``max_questions - 1`` (:func:`calibration_note` says so).
    """
    try:
        validated = StudySettings.model_validate(values)
    except ValidationError as exc:
        raise InvalidInputError(_settings_error(exc)) from None
    _check_group_cap(study, validated.group.total_answers, session=session)
    most = validated.budgets.max_questions - 1
    if validated.calibration_items > most:
        validated = validated.model_copy(update={"calibration_items": most})
    if validated.criterion not in criterion_names():
        raise InvalidInputError(
            f"criterion: unknown {validated.criterion!r} (known: {', '.join(criterion_names())})"
        )
    if not criterion_runs_with(validated.criterion, validated.belief_model):
        usable = ", ".join(criteria_for(validated.belief_model))
        raise InvalidInputError(
            f"criterion: {validated.criterion!r} cannot run with the belief model "
            f"{BELIEF_MODEL_LABELS.get(validated.belief_model, validated.belief_model)!r} "
            f"(it needs the model's {CRITERION_NEEDS[validated.criterion]}); choose one of: "
            f"{usable}"
        )
    study.settings = validated.model_dump(mode="json")
    session.add(study)
    session.commit()
    session.refresh(study)
    return validated


def open_round_number(study: Study, *, session: Session) -> int | None:
    """The number of the study's open group round, or ``None`` when none is open."""
    return session.exec(
        select(GroupRound.number).where(
            GroupRound.study_id == study.id, GroupRound.status == GroupRoundStatus.open.value
        )
    ).first()


def round_questions_asked(study: Study, *, session: Session) -> int:
    """The round questions the study's group rounds have asked: one per member of each
    round (open or closed), answered or not; what the setting ``group.total_answers``
    ("Total questions asked across rounds") caps, as :class:`elicitation.group.GroupBudget`
    counts it."""
    return int(
        session.exec(
            select(func.count())
            .select_from(GroupRoundMember)
            .join(GroupRound, col(GroupRound.id) == col(GroupRoundMember.round_id))
            .where(GroupRound.study_id == study.id)
        ).one()
    )


def _check_group_cap(study: Study, cap: int | None, *, session: Session) -> None:
    """Refuse a new cap on the round questions below what the rounds have already asked
    (a stored cap, even one already passed, is kept when the form sends it unchanged).

    Example: a cap of 100 after rounds that asked 2,000 members raises
    ``InvalidInputError("Total questions asked across rounds (members invited): 100 is
    less than the 2,000 round questions already asked (members invited, answered or not);
    enter at least 2,000, or leave it empty for no cap")``.
    """
    stored = StudySettings.model_validate(study.settings or {}).group.total_answers
    if cap is None or cap == stored:
        return
    used = round_questions_asked(study, session=session)
    if cap < used:
        raise InvalidInputError(
            f"{SETTING_LABELS['group.total_answers']}: {cap:,} is less than the {used:,} round "
            f"questions already asked (members invited, answered or not); enter at least "
            f"{used:,}, or leave it empty for no cap"
        )


def status_note(study: Study, *, session: Session) -> str:
    """What the status form adds to its "study closed" notice while a group round is
    open ("" otherwise): the round's member links take no answers until the study is
    published again (they work again then).

    Example: closing with round 2 open adds "; group round 2 is open: its members cannot
    answer while the study is closed (publish it again to let them)".
    """
    number = open_round_number(study, session=session)
    if number is None or study.status == StudyStatus.published.value:
        return ""
    return (
        f"; group round {number} is open: its members cannot answer while the study is "
        "closed (publish it again to let them)"
    )


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

    Lines are read as ``LETTER: label`` only when every line is (a letter code of 1-32
    letters or digits, a colon, a label that does not start with a digit right after the
    colon); otherwise every line is a label and the options get ``A``, ``B``, ... in order,
    so ``Other: please specify`` among plain labels, or ``10:30 am``, stays a label. Some
    lines with a one-letter code (``A: Yes``) and some without is refused, naming the first
    line without: half-coded options are a typing slip, not labels. At least two options;
    letters unique.

    Example: ``parse_options("Yes\nNo\nOther: please specify")`` gives
    ``[["A", "Yes"], ["B", "No"], ["C", "Other: please specify"]]``.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        raise InvalidInputError("an item needs at least two options, one per line")
    coded = [_coded_option(line) for line in lines]
    options: list[list[str]] = []
    if all(c is not None for c in coded):
        options = [list(c) for c in coded if c is not None]
    elif any(c is not None and len(c[0]) == 1 for c in coded):
        first = next(k for k, c in enumerate(coded) if c is None)
        raise InvalidInputError(
            f"option line {first + 1} ({lines[first][:40]!r}) has no letter code while "
            "others have one ('A: label'): code every line, or none"
        )
    else:
        if len(lines) > 26:
            raise InvalidInputError("more than 26 options: write 'LETTER: label' lines")
        options = [[chr(ord("A") + k), line] for k, line in enumerate(lines)]
    letters = [o[0] for o in options]
    dup = sorted({x for x in letters if letters.count(x) > 1})
    if dup:
        raise InvalidInputError(f"option letters used twice: {', '.join(dup)}")
    labels = [o[1].casefold() for o in options]
    twice = [o[1] for k, o in enumerate(options) if labels.index(labels[k]) < k]
    if twice:
        raise InvalidInputError(f"option label used twice: {twice[0]!r}")
    if len(options) > MAX_OPTIONS:
        raise InvalidInputError(f"{len(options)} options: at most {MAX_OPTIONS}")
    long = next((o[1] for o in options if len(o[1]) > MAX_LABEL_LEN), None)
    if long is not None:
        raise InvalidInputError(
            f"option label of {len(long):,} characters: at most {MAX_LABEL_LEN} ({long[:40]!r}…)"
        )
    return options


MAX_OPTIONS = 100
"""The most options of one item in the designer."""
MAX_LABEL_LEN = 500
"""The longest option label (characters) in the designer."""
MAX_QUESTION_LEN = 5000
"""The longest question text (characters) in the designer."""
MAX_TOPIC_LEN = 200
"""The longest topic (characters)."""


def _checked_texts(question: str, topic: str) -> tuple[str, str | None]:
    """``(question, topic or None)`` stripped, within :data:`MAX_QUESTION_LEN` and
    :data:`MAX_TOPIC_LEN` (InvalidInputError naming which)."""
    question, topic = question.strip(), topic.strip()
    if not question:
        raise InvalidInputError("the question text is empty")
    if len(question) > MAX_QUESTION_LEN:
        raise InvalidInputError(
            f"question: {len(question):,} characters, at most {MAX_QUESTION_LEN:,}"
        )
    if len(topic) > MAX_TOPIC_LEN:
        raise InvalidInputError(f"topic: {len(topic):,} characters, at most {MAX_TOPIC_LEN}")
    return question, topic or None


def _coded_option(line: str) -> tuple[str, str] | None:
    """``(letter, label)`` of a ``LETTER: label`` line, else ``None``."""
    letter, sep, label = line.partition(":")
    letter, rest = letter.strip(), label.strip()
    if not sep or not _LETTER.match(letter) or not rest:
        return None
    if label[:1].isdigit():  # "10:30 am" is a time, not option 10
        return None
    return letter, rest


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
    reserved = reserved_key(key)
    if reserved is not None:
        raise InvalidInputError(f"the item key {reserved}: choose another")
    question, topic_or_none = _checked_texts(question, topic)
    items = study_items(study, session=session)
    if any(it.key == key for it in items):
        raise ConflictError(f"the study already has an item {key!r}")
    item = Item(
        study_id=study.id or 0,
        key=key,
        question=question,
        options=parse_options(options_text),
        role=_check_role(role),
        topic=topic_or_none,
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
    missing: Sequence[str] = (),
) -> Item:
    """Edit an item: its wording, its options (the lines' order is the scale order; edit a
    label to reword it), role, topic and preference flag.

    ``missing`` lists option letters that are not answers (e.g. "Don't know/Refused"):
    they are dropped from the options, and imported answers with those letters then count
    as missing (the fit treats letters that are no option as missing). Option letters may
    be removed only while no live answer refers to them.
    """
    question, topic_or_none = _checked_texts(question, topic)
    role = _check_role(role)  # every check before the item is changed
    options = parse_options(options_text)
    drop = {m.strip() for m in missing if m.strip()}
    unknown = sorted(drop - {o[0] for o in options})
    if unknown:
        raise InvalidInputError(f"item {item.key}: no option {', '.join(unknown)} to mark missing")
    options = [o for o in options if o[0] not in drop]
    if len(options) < 2:
        raise InvalidInputError(
            f"item {item.key}: at least two options must remain answers after marking missing"
        )
    if options != item.options or role != item.role:
        _refuse_while_asked(item, "changing its options or role", session=session)
    if options != item.options and has_live_answers(study, session=session):
        old = {o[0] for o in item.options}
        if not old <= {o[0] for o in options}:
            raise ConflictError(
                "respondents have answered this study: option letters cannot be removed"
            )
    item.question = question
    item.options = options
    item.role = role
    item.topic = topic_or_none
    item.is_preference_criterion = is_preference_criterion
    session.add(item)
    session.commit()
    session.refresh(item)
    return item


def _refuse_while_asked(item: Item, what: str, *, session: Session) -> None:
    """:class:`ConflictError` when an open group round asks ``item``: its members are
    answering the options they were shown, and the round's plan holds the item's role."""
    number = session.exec(
        select(GroupRound.number).where(
            GroupRound.item_id == item.id, GroupRound.status == GroupRoundStatus.open.value
        )
    ).first()
    if number is not None:
        raise ConflictError(
            f"item {item.key}: group round {number} is asking this question; close the "
            f"round before {what}"
        )


def delete_item(study: Study, item: Item, *, session: Session) -> None:
    """Delete an item (refused once live respondents have answered the study, or while
    an open group round asks it)."""
    _refuse_while_asked(item, "deleting it", session=session)
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
        if _check_role(role) != items[key].role:
            _refuse_while_asked(items[key], "changing its role", session=session)
    for key, role in roles.items():
        items[key].role = role
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
        datasets_dir / name,
        session=session,
        study_name=check_name(study_name) if study_name.strip() else None,
    )
    _set_owner(result.study_id, owner, session=session)
    return result


def _set_owner(study_id: int, owner: Researcher, *, session: Session) -> None:
    study = session.get(Study, study_id)
    assert study is not None
    study.owner_id = owner.id
    session.add(study)
    session.commit()


UPLOAD_TTL_S = 3600.0
"""How long a previewed upload is kept for its import (seconds)."""

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{20,64}$")
_META_FILE = "upload-meta.json"


@dataclass(frozen=True)
class UploadPreview:
    """What an upload would import; ``token`` names the stored upload to import it."""

    name: str
    n_respondents: int
    n_items: int
    attributes: list[str]
    questions: list[str]
    has_split: bool
    n_runs: int
    head: list[list[str]]
    columns: list[str]
    token: str = ""
    notes: tuple[str, ...] = ()


def _write_upload(
    folder: Path, files: dict[str, bytes], manifest_fields: dict[str, str]
) -> list[str]:
    """Write the uploaded files into ``folder`` as a dataset folder; returns notes on what
    was left out (a split or runs file the manifest names but that was not uploaded) and
    on a study without history.

    Without ``responses.csv`` the codebook alone is the study: its items, no respondents
    (a header-only ``responses.csv`` is written for the loader)."""
    total = sum(len(v) for v in files.values())
    if total > MAX_UPLOAD_BYTES:
        raise InvalidInputError(f"the upload is larger than {MAX_UPLOAD_BYTES // 2**20} MiB")
    if CODEBOOK_FILE not in files:
        raise InvalidInputError(
            f"upload {CODEBOOK_FILE} (and {RESPONSES_FILE} if the study has past answers)"
        )
    for name, data in files.items():
        if not data.strip():
            raise DatasetError(name, "the file is empty")
    for name, data in files.items():
        if data and name in (RESPONSES_FILE, CODEBOOK_FILE, *OPTIONAL_FILES):
            (folder / name).write_bytes(data)
    notes: list[str] = []
    manifest: dict[str, Any] | None = None
    if files.get(MANIFEST_FILE):
        manifest = _uploaded_manifest(files[MANIFEST_FILE])
        for key, file in (("split", "user_split.json"), ("runs", "runs.csv")):
            if key not in manifest:
                continue
            if files.get(file):
                manifest[key] = file
            else:
                notes.append(
                    f"dataset.json names {key} file {manifest.pop(key)!r}: not uploaded, left out"
                )
    columns: list[str] = []
    if not files.get(RESPONSES_FILE):
        named = manifest.get("id_column") if manifest else manifest_fields.get("id_column")
        id_column = str(named or "").strip() or "respondent_id"
        columns = [id_column, *(item.id for item in read_codebook(folder))]
        with (folder / RESPONSES_FILE).open("w", encoding="utf-8", newline="") as out:
            csv.writer(out).writerow(columns)
    if manifest is None:
        where = f"an item of {CODEBOOK_FILE}" if columns else f"a column of {RESPONSES_FILE}"
        manifest = _manifest_from_fields(
            columns or _header(files[RESPONSES_FILE]), manifest_fields, where
        )
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    return notes


def _uploaded_manifest(data: bytes) -> dict[str, Any]:
    """The uploaded ``dataset.json`` as a dict (DatasetError when it is not a JSON object)."""
    try:
        manifest = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(MANIFEST_FILE, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise DatasetError(MANIFEST_FILE, "JSON nested too deeply to read") from None
    if not isinstance(manifest, dict):
        raise DatasetError(MANIFEST_FILE, "must be a JSON object")
    return manifest


def _header(responses: bytes) -> list[str]:
    """The column names of an uploaded ``responses.csv`` (DatasetError when it has no
    readable header or repeats a column)."""
    try:
        header = responses.decode("utf-8-sig").splitlines()[0]
    except (UnicodeDecodeError, IndexError):
        raise DatasetError(RESPONSES_FILE, "not UTF-8 text with a header line") from None
    columns = [c.strip() for c in next(csv.reader([header]), [])]
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:
        raise DatasetError(RESPONSES_FILE, f"the header repeats the column {twice[0]!r}")
    return columns


def _manifest_from_fields(
    columns: list[str], fields: dict[str, str], where: str = f"a column of {RESPONSES_FILE}"
) -> dict[str, Any]:
    """A ``dataset.json`` for a plain CSV's ``columns``: the id column (``fields["id_column"]``,
    default the first), the attributes (``fields["attributes"]``, comma-separated); the
    other columns ask. A named column that is not among ``columns`` is an
    InvalidInputError naming the form field (``where`` says what it should be)."""
    id_column = fields.get("id_column", "").strip() or columns[0]
    demographics = [c.strip() for c in fields.get("attributes", "").split(",") if c.strip()]
    if id_column not in columns:
        raise InvalidInputError(f"Id column: {id_column!r} is not {where}")
    unknown = [c for c in demographics if c not in columns]
    if unknown:
        raise InvalidInputError(
            f"Attribute columns: {', '.join(map(repr, unknown))} "
            f"{'is' if len(unknown) == 1 else 'are'} not {where}"
        )
    name = fields.get("name", "").strip() or "uploaded"
    questions = [c for c in columns if c != id_column and c not in demographics]
    return {
        "name": name,
        "id_column": id_column,
        "demographics": demographics,
        "questions": questions,
    }


def _describe(folder: Path, manifest_fields: dict[str, str], notes: list[str]) -> UploadPreview:
    ds: Dataset = _load(folder)
    if ds.n_respondents == 0:
        notes = [
            *notes,
            "No respondents: the study starts without history. Its prior is uniform until "
            "you add personas (Personas page) or its own respondents refit it.",
        ]
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
        notes=tuple(notes),
    )


def _load(folder: Path) -> Dataset:
    """``load_dataset(folder)`` with the import's own checks (:func:`check_storable`); an
    error names the uploaded file, never the server's folder."""
    try:
        ds = load_dataset(folder, allow_no_respondents=True)
        check_storable(ds)  # what the import would refuse, the preview refuses
        return ds
    except DatasetError as exc:
        raise InvalidInputError(str(exc).replace(str(folder), "the upload")) from None


def _import_folder(folder: Path, *, session: Session, study_name: str | None) -> ImportResult:
    """``import_dataset`` of an upload's folder; an error names the uploaded file, never
    the server's folder."""
    try:
        return import_dataset(
            folder, session=session, study_name=study_name, allow_no_respondents=True
        )
    except DatasetError as exc:
        raise InvalidInputError(str(exc).replace(str(folder), "the upload")) from None


def uploads_root(root: Path | None = None) -> Path:
    """Where previewed uploads wait for their import (``<temp>/priorly-uploads``)."""
    return root if root is not None else Path(tempfile.gettempdir()) / "priorly-uploads"


def remove_expired_uploads(root: Path | None = None, *, now: float | None = None) -> int:
    """Delete stored uploads older than :data:`UPLOAD_TTL_S`; returns how many."""
    base = uploads_root(root)
    if not base.is_dir():
        return 0
    now = time.time() if now is None else now
    n = 0
    for folder in base.iterdir():
        try:
            if folder.is_dir() and now - folder.stat().st_mtime > UPLOAD_TTL_S:
                shutil.rmtree(folder, ignore_errors=True)
                n += 1
        except OSError:
            continue
    return n


def preview_upload(
    files: dict[str, bytes],
    manifest_fields: dict[str, str],
    *,
    owner: Researcher | None = None,
    root: Path | None = None,
) -> UploadPreview:
    """Validate uploaded files exactly as the importer will and describe what they hold.

    With ``owner``, the upload is kept (under :func:`uploads_root`, in a folder named by a
    random token, for :data:`UPLOAD_TTL_S` seconds) so that :func:`import_stored_upload`
    imports it without the files being chosen again; the preview's ``token`` names it.

    Raises:
        DatasetError / InvalidInputError: the importer's message (file, row, column).
    """
    if owner is None:
        with tempfile.TemporaryDirectory(prefix="priorly-upload-") as tmp:
            notes = _write_upload(Path(tmp), files, manifest_fields)
            return _describe(Path(tmp), manifest_fields, notes)
    remove_expired_uploads(root)
    base = uploads_root(root)
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(24)
    folder = base / token
    folder.mkdir(mode=0o700)
    try:
        notes = _write_upload(folder, files, manifest_fields)
        preview = _describe(folder, manifest_fields, notes)
        meta = {"owner_id": owner.id, "fields": manifest_fields}
        (folder / _META_FILE).write_text(json.dumps(meta), encoding="utf-8")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return replace(preview, token=token)


def import_stored_upload(
    token: str,
    *,
    owner: Researcher,
    session: Session,
    study_name: str = "",
    root: Path | None = None,
) -> ImportResult:
    """Import the upload that :func:`preview_upload` kept under ``token`` (only for the
    researcher who previewed it), then delete it.

    Raises:
        NotFoundError: no such upload (expired, imported already, or another's).
    """
    folder = uploads_root(root) / token
    gone = NotFoundError(
        "this upload is no longer kept (imported already, or older than "
        f"{int(UPLOAD_TTL_S // 60)} minutes): choose the files again"
    )
    if not _TOKEN.match(token) or not (folder / _META_FILE).is_file():
        raise gone
    meta = json.loads((folder / _META_FILE).read_text(encoding="utf-8"))
    if meta.get("owner_id") != owner.id:
        raise gone
    name = study_name.strip() or str(meta.get("fields", {}).get("name", "")).strip() or None
    if name is not None:
        check_name(name)
    result = _import_folder(folder, session=session, study_name=name)
    shutil.rmtree(folder, ignore_errors=True)
    _set_owner(result.study_id, owner, session=session)
    return result


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
        result = _import_folder(
            folder, session=session, study_name=check_name(name) if name else None
        )
    _set_owner(result.study_id, owner, session=session)
    return result
