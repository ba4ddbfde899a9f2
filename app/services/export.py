"""Exports of a study: answers (CSV wide / long, SPSS ``.sav``, Stata ``.dta``), the codebook
(JSONL) and per-respondent predictions (CSV). UTF-8 throughout.

What is exported: the live respondents (one per session) and their ``answer`` rows; with
``include_imported`` also the imported (historical) respondents and their stored answers.
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
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from app.tables import Answer, ElicitationSession, Item, Respondent, RespondentSource, Study

SKIP_MARK = "<skip>"
SKIP_CODE = -1
META_COLUMNS = ("respondent_id", "session_id", "source", "status", "started_at", "completed_at")
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


def export_items(study: Study, *, session: Session) -> list[Item]:
    return list(
        session.exec(
            select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
        ).all()
    )


def _iso(ts: datetime | None) -> str:
    return ts.isoformat() if ts is not None else ""


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
                .where(ElicitationSession.study_id == study.id, col(ElicitationSession.id) > last)
                .order_by(col(ElicitationSession.id))
                .limit(BATCH)
            ).all()
        )
        if not batch:
            return
        yield batch
        last = batch[-1][0].id or 0


def _label(resp: Respondent) -> str:
    """The respondent id written to exports: the external id, else ``r<id>``."""
    return resp.external_id or f"r{resp.id}"


def iter_rows(
    study: Study, *, session: Session, include_imported: bool = False, after: int = 0
) -> Iterator[ExportRow]:
    """Respondents with their answers, in session id order (live) then id order (imported).

    ``after``: start after the live session with this id (keyset pagination, as the API's
    cursors do); the imported respondents are not affected by it.
    """
    keys_by_id = {it.id: it.key for it in export_items(study, session=session)}
    for batch in _session_batches(study, session, after=after):
        ids = [s.id for s, _ in batch]
        answers: dict[int, dict[str, str]] = {i or 0: {} for i in ids}
        for a in session.exec(select(Answer).where(col(Answer.session_id).in_(ids))).all():
            key = keys_by_id.get(a.item_id)
            if key is not None:
                answers[a.session_id][key] = a.option if a.option is not None else SKIP_MARK
        for sess, resp in batch:
            cells = dict(resp.attributes or {})
            cells.update(answers[sess.id or 0])
            yield ExportRow(
                respondent_id=_label(resp),
                session_id=sess.id,
                source=resp.source,
                status=sess.status,
                started_at=sess.created_at,
                completed_at=sess.completed_at,
                cells=cells,
            )
    if not include_imported:
        return
    last = 0
    while True:
        people = session.exec(
            select(Respondent)
            .where(
                Respondent.study_id == study.id,
                Respondent.source == RespondentSource.import_.value,
                col(Respondent.id) > last,
            )
            .order_by(col(Respondent.id))
            .limit(BATCH)
        ).all()
        if not people:
            break
        for resp in people:
            cells = dict(resp.attributes or {})
            cells.update(resp.answers or {})
            yield ExportRow(
                respondent_id=_label(resp),
                session_id=None,
                source=resp.source,
                status="imported",
                started_at=None,
                completed_at=None,
                cells=cells,
            )
        last = people[-1].id or 0


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


def _csv_line(values: list[Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([safe_cell(v) for v in values])
    return buf.getvalue()


def csv_wide(study: Study, *, session: Session, include_imported: bool = False) -> Iterator[str]:
    """CSV, one row per respondent: meta columns then one column per item key (letters)."""
    keys = [it.key for it in export_items(study, session=session)]
    yield "\ufeff" + _csv_line([*META_COLUMNS, *keys])
    for r in iter_rows(study, session=session, include_imported=include_imported):
        yield _csv_line(
            [
                r.respondent_id,
                r.session_id if r.session_id is not None else "",
                r.source,
                r.status,
                _iso(r.started_at),
                _iso(r.completed_at),
                *[r.cells.get(k, "") for k in keys],
            ]
        )


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


def csv_long(study: Study, *, session: Session) -> Iterator[str]:
    """CSV, one row per live answer (in answer order), with item text and option label."""
    items = {it.id: it for it in export_items(study, session=session)}
    yield "\ufeff" + _csv_line(list(LONG_COLUMNS))
    last = 0
    while True:
        batch = session.exec(
            select(Answer, ElicitationSession, Respondent)
            .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
            .join(Respondent, col(Respondent.id) == col(ElicitationSession.respondent_id))
            .where(ElicitationSession.study_id == study.id, col(Answer.id) > last)
            .order_by(col(Answer.id))
            .limit(BATCH)
        ).all()
        if not batch:
            return
        for a, sess, resp in batch:
            item = items.get(a.item_id)
            if item is None:
                continue
            labels = {o[0]: o[1] for o in item.options}
            yield _csv_line(
                [
                    _label(resp),
                    sess.id,
                    item.key,
                    item.role,
                    item.question,
                    a.option if a.option is not None else SKIP_MARK,
                    labels.get(a.option, "") if a.option is not None else "",
                    _iso(a.created_at),
                ]
            )
        last = batch[-1][0].id or 0


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


def variable_names(keys: list[str]) -> dict[str, str]:
    """Unique SPSS/Stata variable names (<= 32 characters, letter first) for item keys."""
    out: dict[str, str] = {}
    used = {m.lower() for m in META_COLUMNS}
    for key in keys:
        base = re.sub(r"[^A-Za-z0-9_]", "_", key)
        if not re.match(r"^[A-Za-z]", base):
            base = "q_" + base
        base = base[:28]
        name, n = base, 1
        while name.lower() in used:
            n += 1
            name = f"{base}_{n}"
        used.add(name.lower())
        out[key] = name
    return out


def labelled_frame(study: Study, *, session: Session, include_imported: bool = False) -> Any:
    """The wide table as a pandas DataFrame of option codes, with labels for pyreadstat.

    Returns:
        ``(frame, variable_labels {name: label}, value_labels {name: {code: label}})``.
    """
    import pandas as pd  # heavy: loaded only for the SPSS / Stata exports

    items = export_items(study, session=session)
    names = variable_names([it.key for it in items])
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
        }
        for it, code in zip(items, codes, strict=True):
            v = r.cells.get(it.key)
            rec[names[it.key]] = (
                float("nan")
                if v is None
                else float(SKIP_CODE if v == SKIP_MARK else code.get(v, "nan"))
            )
        records.append(rec)
    columns = [*META_COLUMNS, *(names[it.key] for it in items)]
    frame = pd.DataFrame.from_records(records, columns=columns)
    for c in META_COLUMNS:
        if c != "session_id":
            frame[c] = frame[c].astype(object).fillna("").astype(str)
    var_labels = {
        "respondent_id": "respondent id",
        "session_id": "session id",
        "source": "live or imported",
        "status": "session status",
        "started_at": "session started (UTC)",
        "completed_at": "session completed (UTC)",
    }
    value_labels: dict[str, dict[int, str]] = {}
    for it in items:
        var_labels[names[it.key]] = f"{it.key}: {it.question}"
        labels = {k + 1: f"{o[0]}: {o[1]}" for k, o in enumerate(it.options)}
        labels[SKIP_CODE] = "skipped"
        value_labels[names[it.key]] = labels
    return frame, var_labels, value_labels


def write_sav(
    study: Study, path: Path, *, session: Session, include_imported: bool = False
) -> Path:
    """Write the answers as an SPSS ``.sav`` with variable and value labels; skip = missing."""
    import pyreadstat  # heavy: loaded only for the SPSS / Stata exports

    frame, var_labels, value_labels = labelled_frame(
        study, session=session, include_imported=include_imported
    )
    missing: dict[str, list[Any]] = {name: [SKIP_CODE] for name in value_labels}
    pyreadstat.write_sav(
        frame,
        str(path),
        column_labels=var_labels,
        variable_value_labels=value_labels,
        missing_ranges=missing,
    )
    return path


def write_dta(
    study: Study, path: Path, *, session: Session, include_imported: bool = False
) -> Path:
    """Write the answers as a Stata ``.dta`` (version 15, UTF-8) with labels.

    Stata variable labels hold at most 80 characters: longer ones are cut (with ``…``);
    the full texts are in the codebook export.
    """
    import pyreadstat  # heavy: loaded only for the SPSS / Stata exports

    frame, var_labels, value_labels = labelled_frame(
        study, session=session, include_imported=include_imported
    )
    short = {
        k: (v if len(v) <= STATA_LABEL_MAX else v[: STATA_LABEL_MAX - 1] + "…")
        for k, v in var_labels.items()
    }
    pyreadstat.write_dta(
        frame,
        str(path),
        column_labels=short,
        variable_value_labels=value_labels,
        version=15,
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
)


@dataclass(frozen=True)
class TargetPrediction:
    """One target's predicted distribution ``probabilities[k]`` over ``options[k]``
    (``(letter, label)`` pairs in the item's order)."""

    key: str
    options: list[tuple[str, str]]
    probabilities: list[float]

    @property
    def predicted(self) -> int:
        """Index of the most probable option (the first one on a tie)."""
        return max(range(len(self.options)), key=lambda k: self.probabilities[k])


@dataclass(frozen=True)
class RespondentPredictions:
    """A live respondent's predictions for every target, given the stored answers."""

    respondent_id: str
    session_id: int
    status: str
    n_answers: int
    targets: list[TargetPrediction]


def iter_predictions(
    study: Study, *, session: Session, after: int = 0
) -> Iterator[RespondentPredictions]:
    """Per live session (id order, above ``after``): the targets' predicted distributions.

    States are replayed from the stored answers with the study's active model, which is
    loaded by this call (so a study without a model raises here, before any row). Nothing
    is yielded when the study has no targets.
    """
    # the live loop (torch, the model families) is loaded only when predictions are asked for
    from app import session as svc

    rt = svc.load_runtime(study, session=session, fit_if_missing=False)
    return _predictions(rt, svc.replay, study, session, after)


def _predictions(
    rt: Any, replay: Any, study: Study, session: Session, after: int
) -> Iterator[RespondentPredictions]:
    targets = rt.targets
    if not targets:
        return
    idx = [rt.model_index[t.id] for t in targets]
    for batch in _session_batches(study, session, after=after):
        for sess, resp in batch:
            answers = list(
                session.exec(
                    select(Answer).where(Answer.session_id == sess.id).order_by(col(Answer.id))
                ).all()
            )
            state = replay(rt, resp, answers)
            probs = rt.model.predict(state, idx)
            yield RespondentPredictions(
                respondent_id=_label(resp),
                session_id=sess.id or 0,
                status=sess.status,
                n_answers=len(answers),
                targets=[
                    TargetPrediction(
                        t.key, [(o[0], o[1]) for o in t.options], row[: len(t.options)]
                    )
                    for t, row in zip(targets, probs.tolist(), strict=True)
                ],
            )


def csv_predictions(study: Study, *, session: Session) -> Iterator[str]:
    """Per live respondent and target: the predicted distribution (one row per option).

    The rows of :func:`iter_predictions`; ``predicted`` is 1 on the most probable option.
    """
    rows = iter_predictions(study, session=session)
    yield "\ufeff" + _csv_line(list(PREDICTION_COLUMNS))
    for r in rows:
        for t in r.targets:
            best = t.predicted
            for k, (letter, _label_text) in enumerate(t.options):
                yield _csv_line(
                    [
                        r.respondent_id,
                        r.session_id,
                        r.status,
                        r.n_answers,
                        t.key,
                        letter,
                        f"{t.probabilities[k]:.6f}",
                        int(k == best),
                    ]
                )
