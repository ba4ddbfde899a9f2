"""Exports of a study: answers (CSV wide / long, SPSS ``.sav``, Stata ``.dta``), the codebook
(JSONL) and per-respondent predictions (CSV). UTF-8 throughout.

What is exported: the live respondents (one row per respondent, all their sessions
merged: a survey and a group round) with their attributes and ``answer`` rows; with
``include_imported`` also the imported (historical) respondents and their stored answers.
A declined attribute (demographic) is :data:`SKIP_MARK` like a skipped question.
Preview sessions (a researcher's "preview as respondent") are left out.
Cells hold option *letters* (CSV) or option *codes* ``1..K`` in scale order (SPSS, Stata,
with value labels ``"A: label"``); a skipped question is :data:`SKIP_MARK` in CSV and
:data:`SKIP_CODE` (labelled ``skipped``) in SPSS/Stata; an item never asked is empty.

CSV exports are streamed (rows are produced while the database is read in batches);
SPSS/Stata need a whole file, written by pyreadstat to a temporary file that is then
streamed and deleted.

Variable names in SPSS/Stata must be identifiers: :func:`variable_names` maps item keys to
unique names (``327a`` -> ``q_327a``); the variable label holds the key and the question.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain
from pathlib import Path
from typing import Any

from sqlalchemy import true
from sqlmodel import Session, col, select

from app.services.columns import (
    META_COLUMNS,
    PANEL_PREFIX,
    PRED_SUFFIX,
    PROB_SUFFIX,
    unique_columns,
)
from app.tables import (
    Answer,
    ElicitationSession,
    Item,
    ItemRole,
    Respondent,
    RespondentSource,
    SelectionDecision,
    Study,
    iso_utc,
    respondent_label,
)

SKIP_MARK = "<skip>"
SKIP_CODE = -1
STATA_SKIP = "a"
"""A skipped question in the Stata export: the extended missing value ``.a``."""
BATCH = 500
STATA_LABEL_MAX = 80


@dataclass(frozen=True)
class ExportRow:
    """One respondent: identifiers, session status and ``{item key: letter or SKIP_MARK}``."""

    respondent_id: str
    session_id: int | None
    source: str
    status: str
    started_at: datetime | None
    completed_at: datetime | None
    cells: dict[str, str]
    respondent_pk: int = 0
    """The respondent's database id (the API's responses cursor)."""
    earlier_starts: int = 0
    """Respondents the same browser had started in this study before this one."""
    n_answers: int = 0
    """The respondent's live answer rows (skips included)."""
    answer_order: tuple[str, ...] = ()
    """The keys of ``cells`` that hold answers (not attributes, not skips) in the order
    given: an imported respondent's stored answers first (study order), then the live
    answers (a key answered again takes its later place); :func:`_order`."""
    panel: dict[str, str] = field(default_factory=dict)
    """The link parameters the respondent arrived with (``respondent.panel_params``)."""


def export_items(study: Study, *, session: Session) -> list[Item]:
    return list(
        session.exec(
            select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
        ).all()
    )


def panel_keys(study: Study, *, session: Session) -> list[str]:
    """The link parameter names any live respondent of ``study`` arrived with, sorted.

    Example: respondents from ``?PROLIFIC_PID=...&STUDY_ID=...`` and from ``?src=mail``
    give ``["PROLIFIC_PID", "STUDY_ID", "src"]``.
    """
    keys: set[str] = set()
    for params in session.exec(
        select(Respondent.panel_params).where(
            Respondent.study_id == study.id, col(Respondent.panel_params).is_not(None)
        )
    ):
        keys.update(str(k) for k in (params or {}))
    return sorted(keys)


def panel_text(params: Mapping[str, Any] | None) -> str:
    """Link parameters as one cell: ``"PROLIFIC_PID=5f3a; src=mail"`` (``""`` for none)."""
    return "; ".join(f"{k}={v}" for k, v in sorted((params or {}).items()))


def _iso(ts: datetime | None) -> str:
    return iso_utc(ts) or ""


def _session_batches(
    study: Study, session: Session, *, after: int = 0
) -> Iterator[list[tuple[ElicitationSession, Respondent]]]:
    """The study's sessions with id above ``after`` with their respondents, in id order,
    ``BATCH`` at a time (keyset pagination: memory stays bounded for large studies)."""
    last = after
    while True:
        batch = list(
            session.exec(
                select(ElicitationSession, Respondent)
                .join(Respondent, col(Respondent.id) == col(ElicitationSession.respondent_id))
                .where(
                    ElicitationSession.study_id == study.id,
                    col(ElicitationSession.id) > last,
                    col(ElicitationSession.is_preview).is_(False),
                )
                .order_by(col(ElicitationSession.id))
                .limit(BATCH)
            ).all()
        )
        if not batch:
            return
        yield batch
        last = batch[-1][0].id or 0


def _label(resp: Respondent) -> str:
    """The respondent id written to exports (:func:`app.tables.respondent_label`)."""
    return respondent_label(resp.external_id, resp.id)


@dataclass(frozen=True)
class _Person:
    """A respondent with sessions, their sessions (id order), every answer of those
    sessions (answer order) and whether they were asked the attribute items."""

    respondent: Respondent
    sessions: list[ElicitationSession]
    answers: list[Answer]
    asked_attributes: bool


def _people(
    study: Study, session: Session, *, after: int = 0, only: int | None = None
) -> Iterator[_Person]:
    """The study's respondents that have at least one session, in respondent id order
    from the first id above ``after``, read ``BATCH`` respondents at a time (keyset
    pagination); with ``only``, just the respondent with that id (if it has a session).

    A respondent was asked the attribute items when one of their sessions asked them
    (``asked_attributes``; for a session stored before that was recorded, when the study
    asks them, ``settings["ask_attributes"]``, default on) and got past the attribute step
    (it has a first decision): an attribute missing from their ``attributes`` was then
    declined. An API session given some attributes asked none: the others are unknown.
    """
    asks = bool((study.settings or {}).get("ask_attributes", True))
    has_session = (
        select(ElicitationSession.id)
        .where(
            col(ElicitationSession.respondent_id) == col(Respondent.id),
            col(ElicitationSession.is_preview).is_(False),
        )
        .exists()
    )
    last = after
    while True:
        people = list(
            session.exec(
                select(Respondent)
                .where(Respondent.study_id == study.id, col(Respondent.id) > last, has_session)
                .where(true() if only is None else col(Respondent.id) == only)
                .order_by(col(Respondent.id))
                .limit(BATCH)
            ).all()
        )
        if not people:
            return
        rids = [p.id for p in people]
        sessions: dict[int, list[ElicitationSession]] = {p.id or 0: [] for p in people}
        for sess in session.exec(
            select(ElicitationSession)
            .where(
                col(ElicitationSession.respondent_id).in_(rids),
                col(ElicitationSession.is_preview).is_(False),
            )
            .order_by(col(ElicitationSession.id))
        ).all():
            sessions[sess.respondent_id].append(sess)
        sids = [s.id for group in sessions.values() for s in group]
        owner = {s.id: s.respondent_id for group in sessions.values() for s in group}
        answers: dict[int, list[Answer]] = {p.id or 0: [] for p in people}
        for a in session.exec(
            select(Answer).where(col(Answer.session_id).in_(sids)).order_by(col(Answer.id))
        ).all():
            answers[owner[a.session_id]].append(a)
        started = set(
            session.exec(
                select(SelectionDecision.session_id).where(
                    col(SelectionDecision.session_id).in_(sids), SelectionDecision.position == 0
                )
            ).all()
        )
        for p in people:
            mine = sessions[p.id or 0]
            if not mine:  # erased between the two reads (READ COMMITTED)
                continue
            yield _Person(
                respondent=p,
                sessions=mine,
                answers=answers[p.id or 0],
                asked_attributes=any(
                    s.id in started and (asks if s.asked_attributes is None else s.asked_attributes)
                    for s in mine
                ),
            )
        last = people[-1].id or 0


def _attribute_cells(person: _Person, attribute_keys: list[str]) -> dict[str, str]:
    """The respondent's attribute letters; :data:`SKIP_MARK` for one they declined."""
    given = dict(person.respondent.attributes or {})
    if person.asked_attributes:
        for key in attribute_keys:
            given.setdefault(key, SKIP_MARK)
    return given


def _person_cells(
    person: _Person,
    by_id: dict[int | None, Item],
    attribute_keys: list[str],
    *,
    include_imported: bool,
) -> dict[str, str]:
    """``{item key: letter or SKIP_MARK}`` of one respondent: attributes, then (with
    ``include_imported``, for an imported respondent) the stored answers, then the answers
    of every session (a later answer replaces an earlier one, a later skip never replaces
    an answer)."""
    resp = person.respondent
    cells = _attribute_cells(person, attribute_keys)
    if include_imported and resp.source == RespondentSource.import_.value:
        cells.update(resp.answers or {})
    for a in person.answers:
        item = by_id.get(a.item_id)
        if item is None:
            continue
        if a.option is not None:
            cells[item.key] = a.option
        elif cells.get(item.key) in (None, SKIP_MARK):
            cells[item.key] = SKIP_MARK
    return cells


def _order(
    resp: Respondent, answers: list[Answer], items: list[Item], *, include_imported: bool
) -> tuple[str, ...]:
    """:attr:`ExportRow.answer_order` of a respondent (``items`` in study order)."""
    order: dict[str, None] = {}
    if include_imported and resp.source == RespondentSource.import_.value:
        stored = resp.answers or {}
        order.update((it.key, None) for it in items if it.key in stored)
    keys = {it.id: it.key for it in items}
    for a in answers:
        key = keys.get(a.item_id)
        if key is not None and a.option is not None:
            order.pop(key, None)
            order[key] = None
    return tuple(order)


def _evidence(pred: Any, pk: int, cells: dict[str, str], order: tuple[str, ...], model: Any) -> Any:
    """The :class:`app.services.predictions.Evidence` of one row: attributes (the cells
    that are neither answers nor skips), answers in ``order``, skips."""
    answered = set(order)
    return pred.Evidence(
        respondent_pk=pk,
        attributes={k: v for k, v in cells.items() if v != SKIP_MARK and k not in answered},
        answers=[(k, cells[k]) for k in order],
        skipped=frozenset(k for k, v in cells.items() if v == SKIP_MARK),
        model_id=model,
    )


def _has_live(person: _Person) -> bool:
    """Whether ``person`` has something live: not an imported respondent whose sessions
    hold no answer (invited to a group round, never answered), which no live export lists."""
    return bool(person.answers) or person.respondent.source != RespondentSource.import_.value


def iter_rows(
    study: Study,
    *,
    session: Session,
    include_imported: bool = False,
    after: int = 0,
    only: int | None = None,
) -> Iterator[ExportRow]:
    """One row per respondent: those with sessions in respondent id order, then (with
    ``include_imported``) the imported respondents without a session, in id order.

    An imported respondent whose sessions hold no answer (invited to a group round, never
    answered) has nothing live: it is left out of the live rows, and with
    ``include_imported`` it is a plain ``imported`` row where its id comes.

    A respondent with several sessions (a survey and a group round) is one row: the first
    session gives the meta columns, the answers of every session fill the cells (a later
    answer replaces an earlier one, a later skip never replaces an answer). An imported
    respondent's stored answers are included only with ``include_imported``.

    ``after``: start after the respondent with this database id (keyset pagination, as
    the API's cursors do; ``ExportRow.respondent_pk``); ``only``: just the respondent
    with this database id (one profile).
    """
    items = export_items(study, session=session)
    by_id = {it.id: it for it in items}
    attribute_keys = [it.key for it in items if it.role == ItemRole.attribute.value]
    for person in _people(study, session, after=after, only=only):
        resp = person.respondent
        if not _has_live(person):
            if include_imported:
                yield _imported_row(resp, items)
            continue
        cells = _person_cells(person, by_id, attribute_keys, include_imported=include_imported)
        first = person.sessions[0]
        yield ExportRow(
            respondent_id=_label(resp),
            session_id=first.id,
            source=resp.source,
            status=first.status,
            started_at=first.created_at,
            completed_at=first.completed_at,
            cells=cells,
            respondent_pk=resp.id or 0,
            earlier_starts=resp.earlier_starts,
            n_answers=len(person.answers),
            answer_order=_order(resp, person.answers, items, include_imported=include_imported),
            panel={str(k): str(v) for k, v in (resp.panel_params or {}).items()},
        )
    if not include_imported:
        return
    no_session = ~(
        select(ElicitationSession.id)
        .where(col(ElicitationSession.respondent_id) == col(Respondent.id))
        .exists()
    )
    last = 0
    while True:
        people = session.exec(
            select(Respondent)
            .where(
                Respondent.study_id == study.id,
                Respondent.source == RespondentSource.import_.value,
                col(Respondent.id) > last,
                no_session,
            )
            .where(true() if only is None else col(Respondent.id) == only)
            .order_by(col(Respondent.id))
            .limit(BATCH)
        ).all()
        if not people:
            break
        for resp in people:
            yield _imported_row(resp, items)
        last = people[-1].id or 0


def _imported_row(resp: Respondent, items: list[Item]) -> ExportRow:
    """The row of an imported respondent with nothing live: its stored attributes and
    answers, status ``imported``, no session."""
    cells = dict(resp.attributes or {})
    cells.update(resp.answers or {})
    return ExportRow(
        respondent_id=_label(resp),
        session_id=None,
        source=resp.source,
        status="imported",
        started_at=None,
        completed_at=None,
        cells=cells,
        respondent_pk=resp.id or 0,
        earlier_starts=resp.earlier_starts,
        answer_order=_order(resp, [], items, include_imported=True),
    )


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""First characters that make a spreadsheet read a cell as a formula (OWASP CSV injection)."""
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def safe_cell(value: Any) -> Any:
    """``value`` for a CSV cell a spreadsheet opens: a text starting with ``= + - @``, a
    tab or a carriage return gets a leading ``'`` (so ``=HYPERLINK(...)`` is shown as
    text, not run), unless it is a plain number such as ``-0.5``. Other values unchanged.

    >>> safe_cell("=HYPERLINK(1)"), safe_cell("-0.5"), safe_cell("B"), safe_cell(3)
    ("'=HYPERLINK(1)", '-0.5', 'B', 3)
    """
    if isinstance(value, str) and value.startswith(FORMULA_START) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def csv_line(values: list[Any]) -> str:
    """One CSV line (newline-terminated) of ``values``, each through :func:`safe_cell`."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([safe_cell(v) for v in values])
    return buf.getvalue()


def _chunks(rows: Iterator[Any], n: int = BATCH) -> Iterator[list[Any]]:
    """``rows`` in lists of at most ``n``."""
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def predicted_rows(
    study: Study,
    *,
    session: Session,
    include_imported: bool = False,
    after: int = 0,
    only: int | None = None,
) -> Iterator[tuple[ExportRow, Any]]:
    """The rows of :func:`iter_rows`, each with its respondent's predictions
    (:class:`app.services.predictions.RespondentPrediction`), computed :data:`BATCH`
    respondents at a time (the model: :mod:`app.services.predictions`, "Which model").

    Raises:
        NoModelError: the study has no active fitted model (before any row).
    """
    # the belief models (torch) are loaded only when predictions are asked for
    from app.services import predictions as pred

    models = pred.ModelSet(study, session=session)
    rows = iter_rows(
        study, session=session, include_imported=include_imported, after=after, only=only
    )
    for chunk in _chunks(rows):
        used = pred.session_models(
            [r.respondent_pk for r in chunk if r.session_id is not None], session=session
        )
        evidence = [
            _evidence(pred, r.respondent_pk, r.cells, r.answer_order, used.get(r.respondent_pk))
            for r in chunk
        ]
        found = pred.predict_respondents(study, evidence, session=session, models=models)
        yield from zip(chunk, found, strict=True)


def _meta(r: ExportRow) -> list[Any]:
    return [
        r.respondent_id,
        r.session_id if r.session_id is not None else "",
        r.source,
        r.status,
        _iso(r.started_at),
        _iso(r.completed_at),
        r.earlier_starts,
    ]


def _prob(p: float) -> str:
    return f"{p:.6f}"


def csv_wide(
    study: Study, *, session: Session, include_imported: bool = False, predictions: bool = False
) -> Iterator[str]:
    """CSV, one row per respondent: meta columns, a ``panel.K`` column per link parameter
    ``K`` any respondent arrived with (:func:`panel_keys`), then one column per item key
    (letters); a name used by an earlier column (an imported item ``status``) gets ``_2``
    (:func:`~app.services.columns.unique_columns`).

    With ``predictions``: then, per item, ``<key>__pred`` and ``<key>__p``: the most likely
    option and its probability for an item without an answer (never asked, skipped or
    declined; :func:`predicted_rows`), empty for an answered item or one the model does
    not know.
    """
    keys = [it.key for it in export_items(study, session=session)]
    panel = panel_keys(study, session=session)
    extra = [f"{k}{s}" for k in keys for s in (PRED_SUFFIX, PROB_SUFFIX)] if predictions else []
    header = [*META_COLUMNS, *(PANEL_PREFIX + k for k in panel), *keys, *extra]
    yield "\ufeff" + csv_line(unique_columns(header))

    def start(r: ExportRow) -> list[Any]:
        return [*_meta(r), *[r.panel.get(k, "") for k in panel]]

    if not predictions:
        for r in iter_rows(study, session=session, include_imported=include_imported):
            yield csv_line([*start(r), *[r.cells.get(k, "") for k in keys]])
        return
    from app.services.predictions import ANSWERED  # loaded with the predictions (torch)

    for r, found in predicted_rows(study, session=session, include_imported=include_imported):
        by_key = {p.key: p for p in found.items if p.status != ANSWERED}
        cells: list[Any] = []
        for k in keys:
            p = by_key.get(k)
            cells += [p.letter, _prob(p.probability)] if p is not None else ["", ""]
        yield csv_line([*start(r), *[r.cells.get(k, "") for k in keys], *cells])


LONG_COLUMNS = (
    "respondent_id",
    "session_id",
    "item",
    "role",
    "question",
    "option",
    "option_label",
    "answered_at",
)


LONG_PREDICTION_COLUMNS = ("kind", "probability")
"""With predictions, the long CSV adds ``kind`` (``answered``, ``skipped`` or
``predicted``) and ``probability`` (of a predicted row's option)."""


def csv_long(study: Study, *, session: Session, predictions: bool = False) -> Iterator[str]:
    """CSV, one row per live answer, with item text and option label: respondent by
    respondent (as :func:`iter_rows`: an imported respondent invited to a group round who
    never answered has no rows), each one's attribute items first (a declined one is
    :data:`SKIP_MARK`; dated by their first session's start, undated for an imported
    respondent, whose attributes came with the import), then their answers in the order
    given (every session of theirs).

    With ``predictions``: the columns ``kind`` and ``probability``, and after each
    respondent's answers one ``predicted`` row per item without an answer (never asked,
    skipped or declined; in study order) holding the most likely option, its label and its
    probability (:func:`app.services.predictions.predict_respondents`; ``answered_at`` empty).
    """
    items = export_items(study, session=session)
    by_id = {it.id: it for it in items}
    by_key = {it.key: it for it in items}
    attributes = [it for it in items if it.role == ItemRole.attribute.value]
    attribute_keys = [it.key for it in attributes]

    def line(
        resp: Respondent, sid: int | None, item: Item, option: str | None, at: Any, p: Any = None
    ) -> str:
        labels = {o[0]: o[1] for o in item.options}
        shown = option if option is not None else SKIP_MARK
        values = [
            _label(resp),
            sid,
            item.key,
            item.role,
            item.question,
            shown,
            labels.get(shown, "") if shown != SKIP_MARK else "",
            _iso(at),
        ]
        if predictions:
            kind = "predicted" if p is not None else "skipped" if option is None else "answered"
            values += [kind, _prob(p) if p is not None else ""]
        return csv_line(values)

    def given(person: _Person) -> Iterator[str]:
        resp, first = person.respondent, person.sessions[0]
        cells = _attribute_cells(person, attribute_keys)
        # an imported respondent's attributes came with the import: no live time
        at = None if resp.source == RespondentSource.import_.value else first.created_at
        for item in attributes:
            if item.key in cells:
                value = cells[item.key]
                option = None if value == SKIP_MARK else value
                yield line(resp, first.id, item, option, at)
        for a in person.answers:
            asked = by_id.get(a.item_id)
            if asked is not None:
                yield line(resp, a.session_id, asked, a.option, a.created_at)

    header = [*LONG_COLUMNS, *LONG_PREDICTION_COLUMNS] if predictions else list(LONG_COLUMNS)
    yield "\ufeff" + csv_line(header)
    if not predictions:
        for person in _people(study, session):
            if not _has_live(person):
                continue
            yield from given(person)
        return
    # the belief models (torch) are loaded only when predictions are asked for
    from app.services import predictions as pred

    models = pred.ModelSet(study, session=session)
    for chunk in _chunks(p for p in _people(study, session) if _has_live(p)):
        used = pred.session_models([p.respondent.id or 0 for p in chunk], session=session)
        evidence = []
        for person in chunk:
            pk = person.respondent.id or 0
            cells = _person_cells(person, by_id, attribute_keys, include_imported=False)
            order = _order(person.respondent, person.answers, items, include_imported=False)
            evidence.append(_evidence(pred, pk, cells, order, used.get(pk)))
        found = pred.predict_respondents(study, evidence, session=session, models=models)
        for person, result in zip(chunk, found, strict=True):
            yield from given(person)
            first = person.sessions[0]
            for p in result.unanswered:
                yield line(
                    person.respondent, first.id, by_key[p.key], p.letter, None, p.probability
                )


def codebook_jsonl(study: Study, *, session: Session) -> Iterator[str]:
    """The codebook in the canonical format (``id``, ``question``, ``options``, ``topic``)
    plus the study's ``role``, ``is_preference_criterion`` and ``position``; one JSON per line."""
    for it in export_items(study, session=session):
        yield (
            json.dumps(
                {
                    "id": it.key,
                    "question": it.question,
                    "options": {o[0]: o[1] for o in it.options},
                    "topic": it.topic,
                    "role": it.role,
                    "is_preference_criterion": it.is_preference_criterion,
                    "position": it.position,
                },
                ensure_ascii=False,
            )
            + "\n"
        )


def variable_names(keys: list[str]) -> list[str]:
    """Unique SPSS/Stata variable names for column ``keys`` (link parameters and items), in
    the same order, none equal to a meta column (:data:`META_COLUMNS`) or to another name,
    compared without case (SPSS and Stata names are case-insensitive).

    A name is the key with every character but ``A-Z a-z 0-9 _`` replaced by ``_``,
    ``q_`` before it unless it starts with a letter, cut to 28 characters, and ``_2``,
    ``_3``, ... after it when it would equal an earlier one. Positional: two equal keys
    (an item ``panel.K`` and the link parameter ``K``'s column) get two names.

    Example: ``variable_names(["327a", "a-b", "a_b", "A_B", "status"])`` is
    ``["q_327a", "a_b", "a_b_2", "A_B_3", "status_2"]``.
    """
    bases = []
    for key in keys:
        base = re.sub(r"[^A-Za-z0-9_]", "_", key)
        if not re.match(r"^[A-Za-z]", base):
            base = "q_" + base
        bases.append(base[:28])
    return unique_columns(bases, taken=META_COLUMNS, fold=str.lower)


def labelled_frame(study: Study, *, session: Session, include_imported: bool = False) -> Any:
    """The wide table as a pandas DataFrame of option codes, with labels for pyreadstat.

    Returns:
        ``(frame, variable_labels {name: label}, value_labels {name: {code: label}})``.
    """
    import pandas as pd  # heavy: loaded only for the SPSS / Stata exports

    items = export_items(study, session=session)
    panel = panel_keys(study, session=session)
    names = variable_names([*(PANEL_PREFIX + k for k in panel), *(it.key for it in items)])
    panel_names, item_names = names[: len(panel)], names[len(panel) :]
    records: list[dict[str, Any]] = []
    codes = [{o[0]: k + 1 for k, o in enumerate(it.options)} for it in items]
    for r in iter_rows(study, session=session, include_imported=include_imported):
        rec: dict[str, Any] = {
            "respondent_id": r.respondent_id,
            "session_id": float(r.session_id) if r.session_id is not None else float("nan"),
            "source": r.source,
            "status": r.status,
            "started_at": _iso(r.started_at),
            "completed_at": _iso(r.completed_at),
            "earlier_starts": float(r.earlier_starts),
        }
        for k, name in zip(panel, panel_names, strict=True):
            rec[name] = r.panel.get(k, "")
        for it, name, code in zip(items, item_names, codes, strict=True):
            v = r.cells.get(it.key)
            rec[name] = (
                float("nan")
                if v is None
                else float(SKIP_CODE if v == SKIP_MARK else code.get(v, "nan"))
            )
        records.append(rec)
    texts = set(panel_names)
    columns = [*META_COLUMNS, *panel_names, *item_names]
    frame = pd.DataFrame.from_records(records, columns=columns)
    for c in columns:  # typed even without rows (an empty frame's columns are objects)
        if c in texts or (c in META_COLUMNS and c not in ("session_id", "earlier_starts")):
            frame[c] = frame[c].astype(object).fillna("").astype(str)
        else:
            frame[c] = frame[c].astype("float64")
    var_labels = {
        "respondent_id": "respondent id",
        "session_id": "session id",
        "source": "live or imported",
        "status": "session status",
        "started_at": "session started (UTC)",
        "completed_at": "session completed (UTC)",
        "earlier_starts": "earlier starts from the same browser",
    }
    for k, name in zip(panel, panel_names, strict=True):
        var_labels[name] = f"link parameter {k}"
    value_labels: dict[str, dict[int, str]] = {}
    for it, name in zip(items, item_names, strict=True):
        var_labels[name] = f"{it.key}: {it.question}"
        labels = {k + 1: f"{o[0]}: {o[1]}" for k, o in enumerate(it.options)}
        labels[SKIP_CODE] = "skipped"
        value_labels[name] = labels
    return frame, var_labels, value_labels


def write_sav(
    study: Study, path: Path, *, session: Session, include_imported: bool = False
) -> Path:
    """Write the answers as an SPSS ``.sav`` with variable and value labels; skip = the
    user-missing code :data:`SKIP_CODE`. Codes and counts are whole numbers (``F8.0``);
    items are ordinal (options in scale order), ids and texts nominal, counts scale."""
    import pyreadstat  # heavy: loaded only for the SPSS / Stata exports

    frame, var_labels, value_labels = labelled_frame(
        study, session=session, include_imported=include_imported
    )
    missing: dict[str, list[Any]] = {name: [SKIP_CODE] for name in value_labels}
    numbers = {"session_id": "scale", "earlier_starts": "scale"}
    measure = {
        c: "ordinal" if c in value_labels else numbers.get(c, "nominal") for c in frame.columns
    }
    whole = {c: "F8.0" for c in frame.columns if c in value_labels or c in numbers}
    pyreadstat.write_sav(
        frame,
        str(path),
        column_labels=var_labels,
        variable_value_labels=value_labels,
        missing_ranges=missing,
        variable_measure=measure,
        variable_format=whole,
    )
    return path


def write_dta(
    study: Study, path: Path, *, session: Session, include_imported: bool = False
) -> Path:
    """Write the answers as a Stata ``.dta`` (format 118: Stata 14 and later, UTF-8) with
    labels.

    A skipped question is the extended missing value ``.a`` (:data:`STATA_SKIP`, labelled
    ``skipped``), so Stata's ``mean`` and ``tab`` leave it out as SPSS does its
    user-missing ``-1``. Stata variable labels hold at most 80 characters: longer ones are
    cut (with ``…``); the full texts are in the codebook export.
    """
    import pyreadstat  # heavy: loaded only for the SPSS / Stata exports

    frame, var_labels, value_labels = labelled_frame(
        study, session=session, include_imported=include_imported
    )
    for name, labels in value_labels.items():
        skipped = frame[name] == SKIP_CODE
        if bool(skipped.any()):
            frame[name] = frame[name].astype(object).where(~skipped, STATA_SKIP)
        labels[STATA_SKIP] = labels.pop(SKIP_CODE)  # type: ignore[index]
    short = {
        k: (v if len(v) <= STATA_LABEL_MAX else v[: STATA_LABEL_MAX - 1] + "…")
        for k, v in var_labels.items()
    }
    pyreadstat.write_dta(
        frame,
        str(path),
        column_labels=short,
        variable_value_labels=value_labels,
        missing_user_values={name: [STATA_SKIP] for name in value_labels},
        version=14,
    )
    return path


PREDICTION_COLUMNS = (
    "respondent_id",
    "session_id",
    "status",
    "n_answers",
    "target",
    "option",
    "probability",
    "predicted",
    "target_status",
    "answer",
    "model_id",
)
"""``target_status`` is ``answered``, ``skipped`` or ``not asked``; ``answer`` is the
respondent's own option letter for an answered target (else empty), beside the model's
posterior predictive of the same target; ``model_id`` is the fitted model of the numbers
(the one a session in progress uses, else the study's active model)."""


@dataclass(frozen=True)
class TargetPrediction:
    """One item's predicted distribution ``probabilities[k]`` over ``options[k]``
    (``(letter, label)`` pairs in the item's order), with the item's ``status`` for the
    respondent (``answered``, ``skipped``, ``not asked``) and their ``answer`` (its letter
    when answered, else empty)."""

    key: str
    options: list[tuple[str, str]]
    probabilities: list[float]
    status: str = ""
    answer: str = ""

    @property
    def predicted(self) -> int:
        """Index of the most probable option (the first one on a tie)."""
        return max(range(len(self.options)), key=lambda k: self.probabilities[k])


@dataclass(frozen=True)
class RespondentPredictions:
    """A live respondent's predictions: every target, and every item without an answer.

    Attributes:
        session_id, status: the respondent's first session's (as in the wide export).
        n_answers: the respondent's answer rows (skips included).
        targets: every target the model knows (answered or not).
        items: every item the model knows without an answer (never asked, skipped or
            declined), study order.
        model_id: the fitted model the predictions come from.
    """

    respondent_id: str
    session_id: int
    status: str
    n_answers: int
    targets: list[TargetPrediction]
    items: list[TargetPrediction] = field(default_factory=list)
    model_id: int | None = None
    respondent_pk: int = 0


def iter_predictions(
    study: Study, *, session: Session, after: int = 0
) -> Iterator[RespondentPredictions]:
    """Per live respondent (respondent id order, above ``after``): the predicted
    distributions of the targets and of every item without an answer.

    The respondents of :func:`iter_rows` with :func:`predicted_rows`' predictions: the
    posterior given everything they answered (the model: :func:`predicted_rows`).

    Raises:
        NoModelError: the study has no fitted model (before any row).
    """
    rows = predicted_rows(study, session=session, after=after)
    # predicted_rows raises for a missing model only when iterated: check now, before any row
    first = next(rows, None)
    return _predictions(first, rows)


def _as_target(p: Any, answer: str) -> TargetPrediction:
    return TargetPrediction(p.key, list(p.options), list(p.probabilities), p.status, answer)


def _predictions(first: Any, rows: Iterator[Any]) -> Iterator[RespondentPredictions]:
    from app.services.predictions import ANSWERED  # loaded with the predictions (torch)

    if first is None:
        return
    for r, found in chain([first], rows):
        yield RespondentPredictions(
            respondent_id=r.respondent_id,
            session_id=r.session_id or 0,
            status=r.status,
            n_answers=r.n_answers,
            targets=[
                _as_target(p, r.cells.get(p.key, "") if p.status == ANSWERED else "")
                for p in found.items
                if p.role == ItemRole.target.value
            ],
            items=[_as_target(p, "") for p in found.items if p.status != ANSWERED],
            model_id=found.model_id,
            respondent_pk=r.respondent_pk,
        )


def csv_predictions(study: Study, *, session: Session) -> Iterator[str]:
    """Per live respondent and target: the predicted distribution (one row per option).

    The rows of :func:`iter_predictions`; ``predicted`` is 1 on the most probable option;
    ``target_status`` and ``answer`` say whether and what the respondent answered
    (:data:`PREDICTION_COLUMNS`).
    """
    rows = iter_predictions(study, session=session)
    yield "\ufeff" + csv_line(list(PREDICTION_COLUMNS))
    for r in rows:
        for t in r.targets:
            best = t.predicted
            for k, (letter, _label_text) in enumerate(t.options):
                yield csv_line(
                    [
                        r.respondent_id,
                        r.session_id,
                        r.status,
                        r.n_answers,
                        t.key,
                        letter,
                        f"{t.probabilities[k]:.6f}",
                        int(k == best),
                        t.status,
                        t.answer,
                        r.model_id,
                    ]
                )
