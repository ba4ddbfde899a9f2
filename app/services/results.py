"""A study's results for other products: the studies a researcher may see, and a study's
responses and per-respondent predictions one page at a time.

The rows are the exports' own (:mod:`app.services.export`): :func:`~app.services.export.iter_rows`
for responses (one row per live respondent, the wide CSV's row) and
:func:`~app.services.export.iter_predictions` for predictions (one row per live respondent,
the predictions CSV's numbers), so the API and the files never disagree. The studies a key
lists are the admin UI's (:func:`app.services.studies.visible_study_summaries`: owner,
shared with, or admin).

Pages use keyset pagination over the respondents' database ids; a page holds at most ``limit`` rows above the cursor's id, in id order. A
cursor is opaque to clients: ``base64url("<listing>:<study id>:<last id>")``, e.g. the
cursor after respondent 42 of study 7's predictions is ``cHJlZGljdGlvbnM6Nzo0Mg``
(``predictions:7:42``). Rows added while a client pages appear on a later page (their ids
are larger); none is returned twice.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from sqlmodel import Session

from app.errors import InvalidInputError
from app.services import learning
from app.services.belief import NoModelError
from app.services.export import (
    SKIP_MARK,
    ExportRow,
    RespondentPredictions,
    TargetPrediction,
    export_items,
    iter_predictions,
    iter_rows,
)
from app.session import study_settings
from app.tables import Study, iso_utc

MAX_ID = 2**31 - 1
"""Ids are 32-bit INTEGER columns: a cursor past this is refused instead of overflowing."""

CURSOR_RE = re.compile(r"^[A-Za-z0-9_-]{1,96}$")


@dataclass(frozen=True)
class Listing:
    """A paged listing: its name in cursors and its page size bounds."""

    name: str
    default_limit: int
    max_limit: int


RESPONSES = Listing("responses", default_limit=100, max_limit=500)
PREDICTIONS = Listing("predictions", default_limit=50, max_limit=200)
"""Predictions replay each respondent's answers through the model: smaller pages."""


@dataclass(frozen=True)
class Page:
    """Rows of one page and the cursor of the next one (``None`` after the last page)."""

    rows: list[dict[str, Any]]
    next_cursor: str | None


def encode_cursor(listing: Listing, study: Study, after: int) -> str:
    raw = f"{listing.name}:{study.id}:{after}".encode("ascii")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(listing: Listing, study: Study, cursor: str | None) -> int:
    """The last session id of the previous page (0 for no cursor).

    Raises:
        InvalidInputError: the cursor is not one this listing of this study returned.
    """
    if cursor is None or cursor == "":
        return 0
    bad = InvalidInputError(
        f"cursor: {cursor[:40]!r} is not a cursor of this study's {listing.name}; pass the "
        "next_cursor of the previous page, or no cursor for the first page"
    )
    if not CURSOR_RE.match(cursor):
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise bad from None
    name, _, rest = raw.partition(":")
    study_id, _, after = rest.partition(":")
    if name != listing.name or study_id != str(study.id) or not after.isdigit():
        raise bad
    value = int(after)
    if value > MAX_ID:
        raise bad
    return value


def check_limit(listing: Listing, limit: int | None) -> int:
    """``limit`` within ``1..listing.max_limit`` (the default when ``None``)."""
    if limit is None:
        return listing.default_limit
    if not 1 <= limit <= listing.max_limit:
        raise InvalidInputError(
            f"limit: {limit} is outside 1..{listing.max_limit} for {listing.name}"
        )
    return limit


def _page(
    listing: Listing,
    study: Study,
    rows: Iterator[Any],
    limit: int,
    render: Any,
    position: Any,
) -> Page:
    """The first ``limit`` of ``rows`` rendered, and the cursor after the last of them
    (``position(row)``) when at least one more row follows."""
    taken = list(islice(rows, limit + 1))
    more = len(taken) > limit
    taken = taken[:limit]
    out = [render(r) for r in taken]
    if not more:
        return Page(out, None)
    return Page(out, encode_cursor(listing, study, position(taken[-1])))


def responses_page(
    study: Study, *, session: Session, cursor: str | None, limit: int | None
) -> Page:
    """One page of the study's live respondents: the wide export's rows with option labels.

    Each row: ``respondent_id`` (the export's: external id, else ``r<id>``), ``respondent``
    (the respondent's database id: unique, the ``respondent_id`` of the session's
    creation), ``session_id`` (the first session), ``source``, ``status``, ``started_at``,
    ``completed_at`` (ISO 8601 in UTC or ``None``), ``earlier_starts``, ``panel`` (the link
    parameters, the CSV's ``panel.K`` columns, ``{}`` for none) and ``answers``, one entry
    per answered item or known attribute in the study's item order:
    ``{"item", "role", "option", "label"}``; a skipped question has ``option`` and ``label``
    ``None`` (the CSV's ``<skip>``).
    """
    after = decode_cursor(RESPONSES, study, cursor)
    n = check_limit(RESPONSES, limit)
    items = export_items(study, session=session)

    def render(row: ExportRow) -> dict[str, Any]:
        answers = []
        for it in items:
            value = row.cells.get(it.key)
            if value is None:
                continue
            skipped = value == SKIP_MARK
            labels = {o[0]: o[1] for o in it.options}
            answers.append(
                {
                    "item": it.key,
                    "role": it.role,
                    "option": None if skipped else value,
                    "label": None if skipped else labels.get(value),
                }
            )
        return {
            "respondent_id": row.respondent_id,
            "respondent": row.respondent_pk,
            "session_id": row.session_id,
            "source": row.source,
            "status": row.status,
            "started_at": iso_utc(row.started_at),
            "completed_at": iso_utc(row.completed_at),
            "earlier_starts": row.earlier_starts,
            "panel": dict(row.panel),
            "answers": answers,
        }

    rows = iter_rows(study, session=session, after=after)
    return _page(RESPONSES, study, rows, n, render, lambda r: r.respondent_pk)


def predictions_page(
    study: Study, *, session: Session, cursor: str | None, limit: int | None
) -> Page:
    """One page of per-respondent predictions: the predictions export's numbers.

    Each row: ``respondent_id``, ``respondent``, ``session_id`` (their first session),
    ``status``,
    ``answers`` (their answer rows), ``model_id`` (the fitted model used: the one their
    session in progress uses, else the active model), ``targets``, one entry per target item:
    ``{"item", "distribution": {letter: probability}, "predicted", "label", "status",
    "answer"}`` (the most probable option's letter and label; whether the respondent
    answered it, and their own letter when they did), and ``items``, the same (without
    ``answer``) for every item without
    an answer (never asked, skipped or declined; targets included), in study order, each
    with its ``probability`` (of the predicted option).

    Raises:
        ModelPreparingError: the study has no fitted belief model yet and a fit job is
            fitting its first one (409 ``model_preparing``, retry later).
        NoModelError: the study has no fitted belief model and none is being fitted.
    """
    after = decode_cursor(PREDICTIONS, study, cursor)
    n = check_limit(PREDICTIONS, limit)

    def entry(t: TargetPrediction, target: bool = False) -> dict[str, Any]:
        best = t.options[t.predicted]
        out: dict[str, Any] = {
            "item": t.key,
            "distribution": {
                letter: p for (letter, _), p in zip(t.options, t.probabilities, strict=True)
            },
            "predicted": best[0],
            "label": best[1],
            "status": t.status,
        }
        if target:
            out["answer"] = t.answer or None
        else:
            out["probability"] = t.probabilities[t.predicted]
        return out

    def render(row: RespondentPredictions) -> dict[str, Any]:
        return {
            "respondent_id": row.respondent_id,
            "respondent": row.respondent_pk,
            "session_id": row.session_id,
            "status": row.status,
            "answers": row.n_answers,
            "model_id": row.model_id,
            "targets": [entry(t, target=True) for t in row.targets],
            "items": [entry(t) for t in row.items],
        }

    try:
        rows = iter_predictions(study, session=session, after=after)
    except NoModelError:
        job = learning.active_fit_job(study.id or 0, session=session)
        if job is None:
            raise
        raise learning.ModelPreparingError(
            f"study {study.slug!r} has no fitted belief model yet: it is being fitted by "
            f"job {job.id}; retry when the job has finished"
        ) from None
    return _page(PREDICTIONS, study, rows, n, render, lambda r: r.respondent_pk)


def study_description(study: Study, *, session: Session) -> dict[str, Any]:
    """What a client needs to run a study's sessions: its status, question budget and
    items in study order, each ``{"key", "role", "question", "topic", "options":
    [{"letter", "label"}]}`` (``role``: ``attribute`` items are sent as a session's
    ``attributes``; ``question`` items are asked; ``target`` items are predicted).

    Example: ``{"slug": "ces", "status": "published", "max_questions": 10, "allow_skip":
    true, "items": [{"key": "gender4", "role": "attribute", ...}, ...]}``.
    """
    settings = study_settings(study)
    return {
        "slug": study.slug,
        "name": study.name,
        "status": study.status,
        "max_questions": settings.budgets.max_questions,
        "allow_skip": settings.budgets.allow_skip,
        "items": [
            {
                "key": it.key,
                "role": it.role,
                "question": it.question,
                "topic": it.topic,
                "options": [{"letter": str(o[0]), "label": str(o[1])} for o in it.options],
            }
            for it in export_items(study, session=session)
        ],
    }
