"""Starting a session: a live respondent, its session and the first decision.

:func:`start_session` checks the study and the caller's input (:func:`check_start`,
:func:`validate_attributes`), computes the prior state and first decision before any
write (:func:`plan_start`), and stores respondent, session and decision in one
transaction (on PostgreSQL one statement, :data:`~app.session.sql.PG_START`). The
browser flow asks the attribute questions first: its first decision is chosen by
:func:`submit_attributes`. The session token is returned once; only its hash is stored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.errors import InvalidInputError
from app.services.belief import NoModelError
from app.services.learning import model_preparing
from app.session.decide import first_state_and_decision
from app.session.errors import ExternalIdTakenError, InvalidAttributesError, StudyClosedError
from app.session.locked import locked_session, write_slots
from app.session.runtime import StudyRuntime, load_runtime
from app.session.sql import (
    INSERT_FIRST_DECISION,
    INSERT_RESPONDENT,
    INSERT_SESSION,
    PG_START,
    DecisionRow,
    StudyHead,
    dbapi_connection,
    driver_sql,
    timestamp_param,
)
from app.session.state import dump_state
from app.session.tokens import hash_token, mark_completed, new_token
from app.session.views import (
    SessionView,
    check_study,
    current_view,
    decision_at,
    plain_view,
    view_at,
)
from app.tables import (
    ElicitationSession,
    ItemRole,
    Respondent,
    SessionStatus,
    Study,
    StudyStatus,
    utcnow,
)
from app.textguard import unsafe_in_name

PANEL_PARAMS_MAX = 20
PANEL_KEY_MAX = 64
PANEL_VALUE_MAX = 500
"""Link parameters stored with a respondent: at most this many, names and values at most
this long."""


PANEL_KEY = re.compile(r"[A-Za-z0-9_.\-]+")
"""What a link parameter's name may hold: it becomes an export column (``panel.NAME``)."""


def clean_panel_params(params: Mapping[str, str]) -> dict[str, str] | None:
    """Validate panel parameters (e.g. ``PROLIFIC_PID``) from a link; ``None`` when empty.

    A name is 1-64 letters, digits, ``_``, ``.`` or ``-``; a value at most 500 characters
    without control or bidirectional control characters (it is written into the exports).

    Raises:
        InvalidInputError: too many parameters, or a name or value as above, named.
    """
    if len(params) > PANEL_PARAMS_MAX:
        raise InvalidInputError(f"too many link parameters ({len(params)} > {PANEL_PARAMS_MAX})")
    out: dict[str, str] = {}
    for key, value in params.items():
        if not key or len(key) > PANEL_KEY_MAX or not PANEL_KEY.fullmatch(key):
            raise InvalidInputError(
                f"link parameter name {key[:80]!r}: use 1-{PANEL_KEY_MAX} letters, digits, "
                "'_', '.' or '-'"
            )
        if len(value) > PANEL_VALUE_MAX:
            raise InvalidInputError(f"link parameter {key!r} is longer than {PANEL_VALUE_MAX}")
        if (bad := unsafe_in_name(value)) is not None:
            raise InvalidInputError(f"link parameter {key!r} holds {bad}")
        out[key] = value
    return out or None


def validate_attributes(rt: StudyRuntime, attributes: Mapping[str, Any]) -> dict[str, str]:
    """Check ``{attribute key: option letter}``; returns it as plain strings.

    Raises:
        InvalidAttributesError: an unknown key, a key that is not an attribute item, or a
            letter that is not one of the item's options.
    """
    out: dict[str, str] = {}
    for key, letter in attributes.items():
        item = rt.by_key.get(key)
        if item is None or item.role != ItemRole.attribute.value:
            known = ", ".join(a.key for a in rt.attributes) or "none"
            raise InvalidAttributesError(
                f"attributes.{key}: not an attribute item of study {rt.slug!r} "
                f"(attribute items: {known})"
            )
        letters = [o[0] for o in item.options]
        if not isinstance(letter, str) or letter not in letters:
            raise InvalidAttributesError(
                f"attributes.{key}: {letter!r} is not an option (options: {', '.join(letters)})"
            )
        out[key] = letter
    return out


@dataclass(frozen=True)
class StartedSession:
    """A new session: its token is returned once (only its hash is stored)."""

    session_id: int
    respondent_id: int
    token: str
    view: SessionView


def start_session(
    study: Study,
    *,
    engine: Engine,
    attributes: Mapping[str, Any] | None = None,
    external_id: str | None = None,
    panel_params: Mapping[str, str] | None = None,
    ask_attributes: bool = False,
    allow_draft: bool = False,
    earlier_starts: int = 0,
) -> StartedSession:
    """Create a live respondent and its session; choose the first question.

    Args:
        study: a published study (or a draft when ``allow_draft``, for its owner's tests).
        attributes: known attributes ``{attribute key: letter}``.
        external_id: the caller's respondent id (unique per study).
        panel_params: link parameters to store with the respondent.
        ask_attributes: the browser flow: the first question is chosen only after the
            attribute questions (:func:`submit_attributes`).
        earlier_starts: respondents this browser started in the study before (stored
            with the respondent, shown to the researcher as a repeated start).

    Raises:
        StudyClosedError, ExternalIdTakenError, InvalidAttributesError; InvalidInputError
        (an external id or link parameter :func:`check_start` refuses); ModelPreparingError
        (409: no model yet, a fit job was queued: retry later).
    """
    params = check_start(study, external_id, panel_params, allow_draft)
    with write_slots():
        return _start(
            study, engine, attributes, external_id, params, ask_attributes, earlier_starts
        )


def check_start(
    study: Study | StudyHead,
    external_id: str | None,
    panel_params: Mapping[str, str] | None,
    allow_draft: bool,
) -> dict[str, str] | None:
    """The checks of :func:`start_session` that need no model; returns the cleaned panel
    parameters. Raises: StudyClosedError, InvalidInputError."""
    allowed = {StudyStatus.published.value} | ({StudyStatus.draft.value} if allow_draft else set())
    if study.status not in allowed:
        raise StudyClosedError(f"study {study.slug!r} is {study.status}, not open for responses")
    max_ext = Respondent.__table__.c.external_id.type.length  # type: ignore[attr-defined]
    if external_id is not None and (not external_id.strip() or len(external_id) > max_ext):
        raise InvalidInputError(f"external_id must be 1 to {max_ext} characters")
    problem = None if external_id is None else unsafe_in_name(external_id)
    if problem is not None:
        raise InvalidInputError(f"external_id contains {problem}")
    return clean_panel_params(panel_params or {})


@dataclass
class StartPlan:
    """A session start prepared before its write: what :func:`_start` and the event-loop
    start of :mod:`app.session.async_path` store with :data:`PG_START` (or the SQLite
    statements), then turn into a :class:`StartedSession` with :meth:`started`."""

    rt: StudyRuntime
    token: str
    decision: DecisionRow | None
    values: dict[str, Any]

    def started(self, sid: int, rid: int) -> StartedSession:
        """The started session once stored as session ``sid`` of respondent ``rid``."""
        rt, decision = self.rt, self.decision
        if decision is None:
            view = SessionView(
                session_id=sid,
                study_slug=rt.slug,
                status=SessionStatus.active.value,
                phase="attributes",
                n_posed=0,
                max_questions=rt.max_questions,
                allow_skip=rt.allow_skip,
                question=None,
                stop_reason=None,
            )
        else:
            view = plain_view(rt, sid, decision.item_id, decision.stop_reason, 0)
        return StartedSession(sid, rid, self.token, view)


def plan_start(
    rt: StudyRuntime,
    study_id: int,
    attributes: Mapping[str, Any] | None,
    external_id: str | None,
    params: dict[str, str] | None,
    ask_attributes: bool,
    dialect: str,
    earlier_starts: int = 0,
) -> StartPlan:
    """Validate the attributes, compute the prior state and the first decision (model work,
    before any write: SQLite has one writer) and the statement's parameters.

    Raises:
        InvalidAttributesError: see :func:`validate_attributes`.
    """
    attrs = validate_attributes(rt, attributes or {})
    first = None
    if not (ask_attributes and rt.attributes):
        first = first_state_and_decision(rt, attrs)
    state, decision = first if first is not None else (None, None)
    done = decision is not None and decision.item_id is None
    token = new_token()
    now = timestamp_param(dialect, utcnow())
    values = {
        "study_id": study_id,
        "external_id": external_id,
        "attributes": json.dumps(attrs),
        "panel_params": json.dumps(params) if params is not None else None,
        "earlier_starts": max(0, int(earlier_starts)),
        "now": now,
        "token_hash": hash_token(token),
        "status": SessionStatus.completed.value if done else SessionStatus.active.value,
        "state": dump_state(state) if first is not None else None,
        "completed_at": now if done else None,
        "completes": done,
        "has_decision": decision is not None,
        "d_item_id": decision.item_id if decision is not None else None,
        "criterion": decision.criterion if decision is not None else "",
        "scores": json.dumps(decision.scores if decision is not None else {}),
        "stop_reason": decision.stop_reason if decision is not None else None,
        "model_id": rt.model_id if decision is not None else None,
        "asked_attributes": bool(ask_attributes and rt.attributes),
    }
    return StartPlan(rt, token, decision, values)


def external_id_taken(external_id: str | None) -> ExternalIdTakenError:
    """The error of a start whose insert hit the unique (study, external id) constraint."""
    return ExternalIdTakenError(
        f"a respondent with external_id {external_id!r} already exists in this study"
    )


def _start(
    study: Study,
    engine: Engine,
    attributes: Mapping[str, Any] | None,
    external_id: str | None,
    params: dict[str, str] | None,
    ask_attributes: bool,
    earlier_starts: int,
) -> StartedSession:
    """Respondent, session and first decision in one transaction (raw statements)."""
    try:
        rt = load_runtime(study, engine=engine)
    except NoModelError:  # never fitted in a request: queue the fit, ask to retry
        raise model_preparing(study.id or 0, study.slug, engine=engine) from None
    plan = plan_start(
        rt,
        study.id or 0,
        attributes,
        external_id,
        params,
        ask_attributes,
        engine.dialect.name,
        earlier_starts,
    )
    values = plan.values
    with dbapi_connection(engine) as (raw, dialect):
        cur = raw.cursor()
        try:
            if dialect == "postgresql":
                cur.execute(driver_sql(dialect, PG_START), values)
                sid, rid = cur.fetchone()
            else:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    cur.execute(INSERT_RESPONDENT, values)
                    rid = cur.lastrowid
                    cur.execute(INSERT_SESSION, {**values, "respondent_id": rid})
                    sid = cur.lastrowid
                    if plan.decision is not None:
                        cur.execute(INSERT_FIRST_DECISION, {**values, "sid": sid})
                    raw.commit()
                except BaseException:
                    raw.rollback()
                    raise
        except engine.dialect.dbapi.IntegrityError:  # type: ignore[union-attr]
            if external_id is None:
                raise
            raise external_id_taken(external_id) from None
        finally:
            cur.close()
    return plan.started(int(sid), int(rid))


def _store_first_decision(
    rt: StudyRuntime,
    db: Session,
    sess: ElicitationSession,
    state: Any,
    decision: DecisionRow,
) -> SessionView:
    """Add the first decision and the prior state to ``sess`` (flushed, not committed)."""
    decision.session_id = sess.id or 0
    row = decision.to_row()
    db.add(row)
    sess.state = dump_state(state)
    sess.state_version = 0
    sess.model_id = rt.model_id
    sess.updated_at = utcnow()
    if row.item_id is None:
        mark_completed(db, sess, sess.updated_at)
    db.add(sess)
    db.flush()
    return view_at(rt, sess, row, 0)


def submit_attributes(
    study: Study, session_id: int, attributes: Mapping[str, Any], *, engine: Engine
) -> SessionView:
    """Store the attribute answers of a browser session and choose its first question.

    Attributes left out (or ``None``) were not answered ("prefer not to answer"). Repeating
    the call after the first question was chosen returns the current view unchanged.
    """
    with Session(engine) as db:
        rt = load_runtime(study, session=db, fit_if_missing=False)
    attrs = validate_attributes(rt, {k: v for k, v in attributes.items() if v is not None})
    with write_slots(), locked_session(engine, session_id) as (db, sess):
        check_study(sess, rt.study_id, rt.slug)
        if decision_at(db, session_id, 0) is not None:
            view = current_view(rt, db, sess)
            db.commit()
            return view
        respondent = db.get(Respondent, sess.respondent_id)
        assert respondent is not None
        respondent.attributes = attrs
        db.add(respondent)
        view = _store_first_decision(rt, db, sess, *first_state_and_decision(rt, attrs))
        db.commit()
        return view


def store_attribute_page(
    study: Study, session_id: int, answers: Mapping[str, str | None], *, engine: Engine
) -> dict[str, str]:
    """Store one page of attribute answers of a browser session (no question is chosen).

    ``answers`` maps each attribute key of the page to a letter, or ``None`` (not
    answered: an answer stored before for that key is removed). Returns every attribute
    answer stored so far; once the first question was chosen nothing changes.

    Raises:
        InvalidAttributesError: see :func:`validate_attributes`.
    """
    with Session(engine) as db:
        rt = load_runtime(study, session=db, fit_if_missing=False)
    given = validate_attributes(rt, {k: v for k, v in answers.items() if v is not None})
    with write_slots(), locked_session(engine, session_id) as (db, sess):
        check_study(sess, rt.study_id, rt.slug)
        respondent = db.get(Respondent, sess.respondent_id)
        assert respondent is not None
        stored = dict(respondent.attributes or {})
        if decision_at(db, session_id, 0) is None:
            for key in answers:
                stored.pop(key, None)
            stored.update(given)
            respondent.attributes = stored
            db.add(respondent)
        db.commit()
        return stored
