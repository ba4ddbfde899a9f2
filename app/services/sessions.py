"""The live loop of a respondent's adaptive session (ARCHITECTURE.md, "The way data flows").

Every answer goes through :func:`submit_answer`, in ONE database transaction that holds a
lock on the session row (``SELECT ... FOR UPDATE`` on PostgreSQL, ``BEGIN IMMEDIATE`` on
SQLite), so two tabs, a retried request or several worker processes are serialised per
session:

1. the answer row is stored first (unique per session and item, and per session and
   idempotency key — the database refuses a second row even if the lock were bypassed);
2. the state is updated: the cached state (``elicitation_session.state``) is used only
   when ``state_version`` equals the number of stored answers, else it is rebuilt by
   :func:`elicitation.session.replay_state`; either way it equals the replay of the
   stored answers;
3. the next item is chosen by :func:`elicitation.session.decide` with the study's
   criterion and budget, and the decision is stored with every candidate's score
   (``selection_decision``, unique per session and position);
4. the caller renders the returned :class:`SessionView`.

Idempotency: a request whose ``idempotency_key`` was already used in the session returns
the result of the first request (rebuilt from the stored decision that followed it);
the same key with a different item or option is a conflict (409). Answering an item that
was already answered with the same option (e.g. a second tab) returns the same result;
with a different option it is a conflict (409). Answering an item that is not the current
question is a conflict too (409), so no question is skipped or counted twice.

The position of a decision is the number of questions posed before it: decision 0 picks
the first question, decision ``n`` the question after ``n`` answers (or skips). A stopped
session's last decision has ``item_id`` NULL and a ``stop_reason``.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import pickle
import secrets
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from sqlalchemy import delete, func
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from app.errors import ConflictError, InvalidInputError, NotFoundError
from app.schemas import StudySettings
from app.services.belief import (
    NoModelError,
    active_model_ref,
    ensure_fitted_model,
    load_cached_model,
)
from app.tables import (
    Answer,
    ElicitationSession,
    ErasureRecord,
    Item,
    ItemRole,
    Respondent,
    RespondentSource,
    SelectionDecision,
    SessionStatus,
    Study,
    StudyStatus,
    utcnow,
)

TOKEN_BYTES = 32
IDEMPOTENCY_KEY_MAX = 128
PANEL_PARAMS_MAX = 20
PANEL_KEY_MAX = 64
PANEL_VALUE_MAX = 500
FALLBACK_CRITERION = "posterior_entropy"
"""Used instead of a target-based criterion when a study has no target items (recorded as
the decision's criterion, so it is visible in every explanation)."""
TOP_PERSONAS = 5
SESSION_CONCURRENCY = max(1, int(os.environ.get("PRIORLY_SESSION_CONCURRENCY", "4")))
"""How many session writes (model work + transaction) one process runs at once.

A write is mostly CPU (the model update and selection step) under the GIL; running many
at once in one process only makes each slower and lets them hold pooled connections
longer. Further requests wait here, before taking a connection (backpressure)."""
_WORK = threading.BoundedSemaphore(SESSION_CONCURRENCY)


# ----- errors with stable codes ---------------------------------------------------------


class SessionNotFoundError(NotFoundError):
    code = "session_not_found"


class StudyNotFoundError(NotFoundError):
    code = "study_not_found"


class ItemNotFoundError(NotFoundError):
    code = "item_not_found"


class InvalidAnswerError(InvalidInputError):
    code = "invalid_answer"


class InvalidAttributesError(InvalidInputError):
    code = "invalid_attributes"


class AnswerConflictError(ConflictError):
    """The item was already answered differently, or the idempotency key was reused."""

    code = "answer_conflict"


class NotCurrentQuestionError(ConflictError):
    """The item is not the question the session is waiting for."""

    code = "not_current_question"


class SessionClosedError(ConflictError):
    code = "session_closed"


class StudyClosedError(ConflictError):
    code = "study_not_open"


class ExternalIdTakenError(ConflictError):
    code = "external_id_taken"


class StudyMisconfiguredError(ConflictError):
    code = "study_misconfigured"


# ----- tokens -----------------------------------------------------------------------------


def new_token() -> str:
    """A session token (256 random bits, URL-safe): the respondent's credential."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def hash_token(token: str) -> str:
    """SHA-256 hex of a session token (only the hash is stored)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def completion_code(study: Study, session_id: int, secret: str) -> str:
    """The study's completion code, or a per-session code derived from the secret key.

    The derived code is ``HMAC-SHA256(secret, "<study id>:<session id>")`` in 10 upper-case
    hex characters: a researcher can recompute it to check a code a respondent reports.
    """
    if study.completion_code:
        return study.completion_code
    mac = hmac.new(secret.encode(), f"{study.id}:{session_id}".encode(), hashlib.sha256)
    return mac.hexdigest()[:10].upper()


# ----- the study at run time ---------------------------------------------------------------


@dataclass(frozen=True)
class ItemInfo:
    """A plain copy of an item row (safe to share between requests and threads)."""

    id: int
    key: str
    question: str
    options: list[list[str]]
    role: str
    topic: str | None


@dataclass
class StudyRuntime:
    """What a session of one study needs: its items, model, criterion name and budget.

    Attributes:
        study: the study row.
        items: every item of the study, in position order.
        model: the fitted belief model (shared, cached per process).
        model_index: item id -> index in ``model.item_bank`` (items the model knows with
            the same number of options; others cannot be asked or predicted).
        attributes: attribute items the model knows (asked first in the browser).
        candidates: askable question items the model knows, in study order.
        targets: target items the model knows.
        criterion: the criterion name used (``FALLBACK_CRITERION`` without targets).
        settings: the study's validated settings.
    """

    study_id: int
    slug: str
    items: list[ItemInfo]
    model: Any
    model_id: int
    model_index: dict[int, int]
    attributes: list[ItemInfo]
    candidates: list[ItemInfo]
    targets: list[ItemInfo]
    criterion: str
    settings: StudySettings
    by_id: dict[int, ItemInfo] = field(default_factory=dict)
    by_key: dict[str, ItemInfo] = field(default_factory=dict)

    @property
    def max_questions(self) -> int:
        """The most questions one respondent can be asked (budget, capped by the pool)."""
        return min(self.settings.budgets.max_questions, len(self.candidates))

    @property
    def allow_skip(self) -> bool:
        return self.settings.budgets.allow_skip


def study_settings(study: Study) -> StudySettings:
    """The study's settings, validated (a corrupt settings column is a configuration error)."""
    try:
        return StudySettings.model_validate(study.settings or {})
    except ValueError as exc:
        raise StudyMisconfiguredError(f"study {study.slug!r} has invalid settings: {exc}") from None


RUNTIME_TTL_S = 5.0
"""How long a process reuses a study's assembled runtime (items, roles, active model).

The key includes the study's settings and status, so new budgets or a closed study apply
at once; item edits (roles, texts) and a newly activated model apply within this many
seconds (the model itself is cached by id and hash, see :mod:`app.services.belief`). The
answers and states never come from this cache (they are read under the session lock)."""
_RUNTIME_CACHE: dict[tuple[str, int, str], tuple[float, StudyRuntime]] = {}
_RUNTIME_LOCK = threading.Lock()


def clear_runtime_cache() -> None:
    """Forget every cached study runtime (tests that edit items in place)."""
    with _RUNTIME_LOCK:
        _RUNTIME_CACHE.clear()


def load_runtime(study: Study, *, session: Session, fit_if_missing: bool = True) -> StudyRuntime:
    """Assemble the study's runtime; fits the default model first when there is none.

    Raises:
        NoModelError: no fitted model and no history to fit one (409 ``no_model``).
    """
    assert study.id is not None
    key = (
        str(session.get_bind().engine.url),  # one process may serve (or test) several databases
        study.id,
        json.dumps(study.settings, sort_keys=True) + study.status + study.slug,
    )
    now = time.monotonic()
    with _RUNTIME_LOCK:
        hit = _RUNTIME_CACHE.get(key)
    if hit is not None and now - hit[0] < RUNTIME_TTL_S:
        return hit[1]
    ref = active_model_ref(study.id, session=session)
    if ref is None:
        if not fit_if_missing:
            raise NoModelError(f"study {study.slug!r} has no fitted belief model")
        ensure_fitted_model(study, session=session)
        ref = active_model_ref(study.id, session=session)
        assert ref is not None
    rt = _build_runtime(study, ref, session=session)
    with _RUNTIME_LOCK:
        if len(_RUNTIME_CACHE) > 256:
            _RUNTIME_CACHE.clear()
        _RUNTIME_CACHE[key] = (now, rt)
    return rt


def _build_runtime(study: Study, ref: Any, *, session: Session) -> StudyRuntime:
    model = load_cached_model(ref, session=session)
    items = [
        ItemInfo(it.id or 0, it.key, it.question, list(it.options), it.role, it.topic)
        for it in session.exec(
            select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
        ).all()
    ]
    bank = model.item_bank
    known = dict(zip(bank.keys, bank.n_options, strict=True))
    model_index = {
        it.id: bank.index(it.key)
        for it in items
        if it.id is not None and known.get(it.key) == len(it.options)
    }
    in_model = [it for it in items if it.id in model_index]
    targets = [it for it in in_model if it.role == ItemRole.target.value]
    settings = study_settings(study)
    criterion = settings.criterion
    if not targets and criterion in ("eig",):
        criterion = FALLBACK_CRITERION
    return StudyRuntime(
        study_id=study.id or 0,
        slug=study.slug,
        items=items,
        model=model,
        model_id=ref.id,
        model_index=model_index,
        attributes=[it for it in in_model if it.role == ItemRole.attribute.value],
        candidates=[it for it in in_model if it.role == ItemRole.question.value],
        targets=targets,
        criterion=criterion,
        settings=settings,
        by_id={it.id: it for it in items if it.id is not None},
        by_key={it.key: it for it in items},
    )


# ----- views returned to the routes ------------------------------------------------------------


@dataclass(frozen=True)
class QuestionView:
    """The question a respondent is asked now.

    Attributes:
        number: 1-based number of this question in the session.
        options: ``[(letter, label), ...]`` in scale order.
    """

    item_id: int
    key: str
    text: str
    options: list[tuple[str, str]]
    number: int
    topic: str | None = None


@dataclass(frozen=True)
class SessionView:
    """Where a session stands.

    Attributes:
        status: ``active`` / ``completed`` / ...
        phase: ``attributes`` (the browser still asks the attribute questions),
            ``question`` (a question is waiting) or ``done``.
        n_posed: questions answered or skipped so far.
        max_questions: the most questions this session can pose (it may stop earlier).
        question: the current question, or ``None``.
        stop_reason: why the session stopped (``None`` while active).
    """

    session_id: int
    study_slug: str
    status: str
    phase: str
    n_posed: int
    max_questions: int
    allow_skip: bool
    question: QuestionView | None
    stop_reason: str | None


def _question_view(item: ItemInfo, number: int) -> QuestionView:
    return QuestionView(
        item_id=item.id or 0,
        key=item.key,
        text=item.question,
        options=[(str(o[0]), str(o[1])) for o in item.options],
        number=number,
        topic=item.topic,
    )


def _view_at(
    rt: StudyRuntime,
    sess: ElicitationSession,
    decision: SelectionDecision | None,
    position: int,
) -> SessionView:
    """The view after ``position`` questions were posed, given the decision at ``position``."""
    if decision is None:
        phase = "attributes"
        question = None
    elif decision.item_id is None:
        phase = "done"
        question = None
    else:
        phase = "question"
        question = _question_view(rt.by_id[decision.item_id], position + 1)
    status = sess.status if phase != "question" else SessionStatus.active.value
    return SessionView(
        session_id=sess.id or 0,
        study_slug=rt.slug,
        status=status if phase != "done" else SessionStatus.completed.value,
        phase=phase,
        n_posed=position,
        max_questions=rt.max_questions,
        allow_skip=rt.allow_skip,
        question=question,
        stop_reason=decision.stop_reason if decision is not None else None,
    )


# ----- state ----------------------------------------------------------------------------------


def _tensor_from_numpy(array: Any) -> torch.Tensor:
    return torch.from_numpy(array)


class _StatePickler(pickle.Pickler):
    """Pickles tensors as numpy arrays (bit-exact, and several times faster to load)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and not obj.requires_grad:
            return _tensor_from_numpy, (obj.detach().contiguous().numpy(),)
        return NotImplemented


def _dump_state(state: Any) -> bytes:
    buf = io.BytesIO()
    _StatePickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    return buf.getvalue()


def _load_state(blob: bytes) -> Any:
    # The blob was written by this module into the app's own database (never client input).
    return pickle.loads(blob)  # noqa: S301


def _attribute_indices(rt: StudyRuntime, attributes: Mapping[str, str]) -> dict[int, int]:
    """``{model item index: option index}`` of a respondent's stored attributes."""
    out: dict[int, int] = {}
    for key, letter in (attributes or {}).items():
        item = rt.by_key.get(key)
        if item is None or item.id not in rt.model_index:
            continue
        letters = [o[0] for o in item.options]
        if letter in letters:
            out[rt.model_index[item.id]] = letters.index(letter)  # type: ignore[index]
    return out


def _answers_of(session: Session, session_id: int) -> list[Answer]:
    return list(
        session.exec(
            select(Answer).where(Answer.session_id == session_id).order_by(Answer.id)  # type: ignore[arg-type]
        ).all()
    )


def _answer_pairs(rt: StudyRuntime, answers: Sequence[Answer]) -> list[tuple[int, int | None]]:
    pairs: list[tuple[int, int | None]] = []
    for a in answers:
        item = rt.by_id[a.item_id]
        idx = rt.model_index[a.item_id]
        if a.option is None:
            pairs.append((idx, None))
        else:
            pairs.append((idx, [o[0] for o in item.options].index(a.option)))
    return pairs


def replay(rt: StudyRuntime, respondent: Respondent, answers: Sequence[Answer]) -> Any:
    """The state from the stored attributes and answers (the source of truth)."""
    from elicitation.session import replay_state

    return replay_state(
        rt.model, _attribute_indices(rt, respondent.attributes), _answer_pairs(rt, answers)
    )


def current_state(
    rt: StudyRuntime, sess: ElicitationSession, respondent: Respondent, answers: Sequence[Answer]
) -> Any:
    """The cached state when it is current (``state_version == len(answers)``), else the replay."""
    if sess.state is not None and sess.state_version == len(answers):
        return _load_state(sess.state)
    return replay(rt, respondent, answers)


def states_equal(a: Any, b: Any) -> bool:
    """Whether two belief states are equal (tensors compared exactly, recursively)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if hasattr(a, "__dataclass_fields__") and type(a) is type(b):
        return all(states_equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    return bool(a == b)


# ----- decisions -------------------------------------------------------------------------------


def _budget(rt: StudyRuntime) -> Any:
    from elicitation.budget import Budget

    b = rt.settings.budgets
    return Budget(
        max_questions=b.max_questions,
        min_questions=b.min_questions,
        stop_eig_threshold=b.stop_eig_threshold,
        stop_entropy_threshold=b.stop_entropy_threshold,
    )


def _criterion(rt: StudyRuntime, session_id: int, position: int, seed: int | None = None) -> Any:
    """The study's criterion; ``random`` gets a seed per session and position (recorded in
    the decision's ``criterion_params``, so every order can be reproduced)."""
    from elicitation.criteria import get_criterion

    if rt.criterion == "random":
        return get_criterion(
            "random", seed=seed if seed is not None else session_id * 1009 + position
        )
    return get_criterion(rt.criterion)


def _decide(
    rt: StudyRuntime,
    state: Any,
    sess_id: int,
    answers: Sequence[Answer],
    seed: int | None = None,
) -> SelectionDecision:
    """Run the selection step and build (not store) its decision row."""
    from elicitation.errors import ElicitationError
    from elicitation.session import decide

    asked = [rt.model_index[a.item_id] for a in answers if a.option is not None]
    skipped = [rt.model_index[a.item_id] for a in answers if a.option is None]
    try:
        decision = decide(
            rt.model,
            state,
            asked=asked,
            skipped=skipped,
            candidates=[rt.model_index[c.id] for c in rt.candidates],  # type: ignore[index]
            targets=[rt.model_index[t.id] for t in rt.targets],  # type: ignore[index]
            criterion=_criterion(rt, sess_id, len(answers), seed),
            budget=_budget(rt),
        )
    except ElicitationError as exc:
        raise StudyMisconfiguredError(f"study {rt.slug!r}: {exc}") from None
    keys = list(rt.model.item_bank.keys)
    detail = decision.to_dict(keys)
    item_id = None if decision.item is None else rt.by_key[keys[decision.item]].id
    return SelectionDecision(
        session_id=sess_id,
        position=len(answers),
        item_id=item_id,
        criterion=decision.criterion,
        scores={
            "scores": detail["scores"],
            "target_entropy": detail["target_entropy"],
            "expected_target_entropy": detail["expected_target_entropy"],
            "best_gain": detail["best_gain"],
            "criterion_params": detail["criterion_params"],
            "model_id": rt.model_id,
        },
        stop_reason=detail["stop_reason"],
    )


# ----- locking ------------------------------------------------------------------------------------


@contextmanager
def locked_session(engine: Engine, session_id: int) -> Iterator[tuple[Session, ElicitationSession]]:
    """A new database session holding the write lock on one elicitation session.

    PostgreSQL: ``SELECT ... FOR UPDATE`` of the session row (other sessions proceed in
    parallel). SQLite: ``BEGIN IMMEDIATE`` (the database's single write lock, taken
    before anything is read, so no two writers interleave a read and a write). The caller
    commits; anything else rolls back.

    Raises:
        SessionNotFoundError: no such session.
    """
    with Session(engine, expire_on_commit=False) as db:
        try:
            if engine.dialect.name == "sqlite":
                db.connection().exec_driver_sql("BEGIN IMMEDIATE")
                sess = db.get(ElicitationSession, session_id)
            else:
                sess = db.exec(
                    select(ElicitationSession)
                    .where(ElicitationSession.id == session_id)
                    .with_for_update()
                ).first()
            if sess is None:
                raise SessionNotFoundError(f"no session {session_id}")
            yield db, sess
        except BaseException:
            db.rollback()
            raise


# ----- starting a session ---------------------------------------------------------------------


def clean_panel_params(params: Mapping[str, str]) -> dict[str, str] | None:
    """Validate panel parameters (e.g. ``PROLIFIC_PID``) from a link; ``None`` when empty."""
    if len(params) > PANEL_PARAMS_MAX:
        raise InvalidInputError(f"too many link parameters ({len(params)} > {PANEL_PARAMS_MAX})")
    out: dict[str, str] = {}
    for key, value in params.items():
        if not key or len(key) > PANEL_KEY_MAX:
            raise InvalidInputError(f"link parameter name {key[:80]!r} is empty or too long")
        if len(value) > PANEL_VALUE_MAX:
            raise InvalidInputError(f"link parameter {key!r} is longer than {PANEL_VALUE_MAX}")
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
) -> StartedSession:
    """Create a live respondent and its session; choose the first question.

    Args:
        study: a published study (or a draft when ``allow_draft``, for its owner's tests).
        attributes: known attributes ``{attribute key: letter}``.
        external_id: the caller's respondent id (unique per study).
        panel_params: link parameters to store with the respondent.
        ask_attributes: the browser flow: the first question is chosen only after the
            attribute questions (:func:`submit_attributes`).

    Raises:
        StudyClosedError, ExternalIdTakenError, InvalidAttributesError, NoModelError.
    """
    allowed = {StudyStatus.published.value} | ({StudyStatus.draft.value} if allow_draft else set())
    if study.status not in allowed:
        raise StudyClosedError(f"study {study.slug!r} is {study.status}, not open for responses")
    max_ext = Respondent.__table__.c.external_id.type.length  # type: ignore[attr-defined]
    if external_id is not None and (not external_id.strip() or len(external_id) > max_ext):
        raise InvalidInputError(f"external_id must be 1 to {max_ext} characters")
    params = clean_panel_params(panel_params or {})
    with _WORK:
        return _start(study, engine, attributes, external_id, params, ask_attributes)


def _start(
    study: Study,
    engine: Engine,
    attributes: Mapping[str, Any] | None,
    external_id: str | None,
    params: dict[str, str] | None,
    ask_attributes: bool,
) -> StartedSession:
    token = new_token()
    with Session(engine) as db:
        rt = load_runtime(study, session=db)
    attrs = validate_attributes(rt, attributes or {})
    first = None
    if not (ask_attributes and rt.attributes):
        # the model work happens before the write transaction (SQLite has one writer)
        first = _first_state_and_decision(rt, attrs)
    with Session(engine, expire_on_commit=False) as db:
        respondent = Respondent(
            study_id=study.id,  # type: ignore[arg-type]
            external_id=external_id,
            attributes=attrs,
            panel_params=params,
            source=RespondentSource.live.value,
        )
        db.add(respondent)
        try:
            db.flush()
        except IntegrityError:
            db.rollback()
            raise ExternalIdTakenError(
                f"a respondent with external_id {external_id!r} already exists in this study"
            ) from None
        sess = ElicitationSession(
            study_id=study.id,  # type: ignore[arg-type]
            respondent_id=respondent.id,  # type: ignore[arg-type]
            token_hash=hash_token(token),
        )
        db.add(sess)
        db.flush()
        assert sess.id is not None and respondent.id is not None
        if first is None:
            view = _view_at(rt, sess, None, 0)
        else:
            view = _store_first_decision(rt, db, sess, *first)
        db.commit()
        return StartedSession(sess.id, respondent.id, token, view)


def _first_state_and_decision(
    rt: StudyRuntime, attributes: Mapping[str, str]
) -> tuple[Any, SelectionDecision]:
    """The prior state given the attributes, and the first decision (not stored yet)."""
    from elicitation.session import replay_state

    state = replay_state(rt.model, _attribute_indices(rt, attributes), [])
    return state, _decide(rt, state, 0, [], seed=secrets.randbelow(2**31))


def _store_first_decision(
    rt: StudyRuntime,
    db: Session,
    sess: ElicitationSession,
    state: Any,
    row: SelectionDecision,
) -> SessionView:
    row.session_id = sess.id or 0
    db.add(row)
    sess.state = _dump_state(state)
    sess.state_version = 0
    sess.updated_at = utcnow()
    if row.item_id is None:
        sess.status = SessionStatus.completed.value
        sess.completed_at = utcnow()
    db.add(sess)
    db.flush()
    return _view_at(rt, sess, row, 0)


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
    with _WORK, locked_session(engine, session_id) as (db, sess):
        _check_study(sess, rt.study_id, rt.slug)
        if _decision_at(db, session_id, 0) is not None:
            view = _current_view(rt, db, sess)
            db.commit()
            return view
        respondent = db.get(Respondent, sess.respondent_id)
        assert respondent is not None
        respondent.attributes = attrs
        db.add(respondent)
        view = _store_first_decision(rt, db, sess, *_first_state_and_decision(rt, attrs))
        db.commit()
        return view


# ----- answering --------------------------------------------------------------------------------


def _check_study(sess: ElicitationSession, study_id: int, slug: str) -> None:
    if sess.study_id != study_id:
        raise SessionNotFoundError(f"no session {sess.id} in study {slug!r}")


def _decision_at(db: Session, session_id: int, position: int) -> SelectionDecision | None:
    return db.exec(
        select(SelectionDecision).where(
            SelectionDecision.session_id == session_id, SelectionDecision.position == position
        )
    ).first()


def _current_view(rt: StudyRuntime, db: Session, sess: ElicitationSession) -> SessionView:
    n = int(
        db.exec(select(func.count()).select_from(Answer).where(Answer.session_id == sess.id)).one()
    )
    return _view_at(rt, sess, _decision_at(db, sess.id or 0, n), n)


def _result_of(
    rt: StudyRuntime, db: Session, sess: ElicitationSession, answer: Answer
) -> SessionView:
    """The view that followed ``answer`` (what the request that stored it returned)."""
    earlier = int(
        db.exec(
            select(func.count())
            .select_from(Answer)
            .where(Answer.session_id == sess.id, Answer.id <= answer.id)  # type: ignore[operator]
        ).one()
    )
    return _view_at(rt, sess, _decision_at(db, sess.id or 0, earlier), earlier)


def submit_answer(
    study: Study,
    session_id: int,
    *,
    item_key: str,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
) -> SessionView:
    """Store an answer (``option`` ``None`` = "prefer not to answer") and choose the next item.

    Returns:
        The view after the answer: the next question, or completion.

    Raises:
        SessionNotFoundError, ItemNotFoundError (404); InvalidAnswerError (422: unknown
        option, skip not allowed, bad key); AnswerConflictError, NotCurrentQuestionError,
        SessionClosedError (409).
    """
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= IDEMPOTENCY_KEY_MAX:
        raise InvalidAnswerError(f"idempotency_key must be 1 to {IDEMPOTENCY_KEY_MAX} characters")
    with Session(engine) as db:
        rt = load_runtime(study, session=db, fit_if_missing=False)
    item = rt.by_key.get(item_key)
    if item is None:
        raise ItemNotFoundError(f"item {item_key!r} is not an item of study {study.slug!r}")
    if option is not None and option not in [o[0] for o in item.options]:
        letters = ", ".join(o[0] for o in item.options)
        raise InvalidAnswerError(
            f"option {option!r} is not an option of item {item_key!r} ({letters})"
        )
    if option is None and not rt.allow_skip:
        raise InvalidAnswerError(f"study {study.slug!r} does not allow skipping a question")
    with _WORK:
        pre = _precompute(rt, session_id, item, option, engine)
        for attempt in range(2):
            try:
                return _submit_locked(rt, session_id, item, option, idempotency_key, engine, pre)
            except IntegrityError:
                # A unique constraint caught a concurrent duplicate (only possible if the
                # lock was bypassed); the second attempt finds the stored row and answers
                # from it.
                if attempt == 1:
                    raise
    raise AssertionError("unreachable")


@dataclass
class _Precomputed:
    """State and decision computed before taking the lock, valid after ``n_before`` answers."""

    n_before: int
    state: Any
    decision: SelectionDecision


def _precompute(
    rt: StudyRuntime, session_id: int, item: ItemInfo, option: str | None, engine: Engine
) -> _Precomputed | None:
    """The new state and next decision, computed from an unlocked read.

    The model work (the update and the selection step, most of an answer's CPU time) is
    done here, outside the write lock, so the lock is held only for the inserts. It is
    valid only if the session still has exactly ``n_before`` answers under the lock
    (answers are append-only, so the first ``n`` never change); otherwise the locked path
    recomputes. ``None`` when this answer is not the straightforward case (retry,
    conflict, wrong item, ...): the locked path decides those.
    """
    with Session(engine) as db:
        sess = db.get(ElicitationSession, session_id)
        if sess is None or sess.status != SessionStatus.active.value:
            return None
        if sess.study_id != rt.study_id:
            return None
        answers = _answers_of(db, session_id)
        if any(a.item_id == item.id for a in answers):
            return None
        pending = _decision_at(db, session_id, len(answers))
        if pending is None or pending.item_id != item.id:
            return None
        respondent = db.get(Respondent, sess.respondent_id)
        if respondent is None:
            return None
        state = current_state(rt, sess, respondent, answers)
    if option is not None:
        idx = [o[0] for o in item.options].index(option)
        state = rt.model.update(state, rt.model_index[item.id], idx)
    new = Answer(session_id=session_id, item_id=item.id, option=option)
    decision = _decide(rt, state, session_id, [*answers, new])
    return _Precomputed(len(answers), state, decision)


def _submit_locked(
    rt: StudyRuntime,
    session_id: int,
    item: ItemInfo,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
    pre: _Precomputed | None = None,
) -> SessionView:
    with locked_session(engine, session_id) as (db, sess):
        _check_study(sess, rt.study_id, rt.slug)
        answers = _answers_of(db, session_id)
        if idempotency_key is not None:
            same_key = next((a for a in answers if a.idempotency_key == idempotency_key), None)
            if same_key is not None:
                if same_key.item_id != item.id or same_key.option != option:
                    raise AnswerConflictError(
                        f"idempotency_key {idempotency_key!r} was already used for a different "
                        f"answer in this session"
                    )
                view = _result_of(rt, db, sess, same_key)
                db.commit()
                return view
        previous = next((a for a in answers if a.item_id == item.id), None)
        if previous is not None:
            if previous.option != option:
                raise AnswerConflictError(
                    f"item {item.key!r} was already answered in this session "
                    f"({previous.option or 'skipped'}); an answer cannot be changed"
                )
            view = _result_of(rt, db, sess, previous)
            db.commit()
            return view
        if sess.status != SessionStatus.active.value:
            raise SessionClosedError(f"session {session_id} is {sess.status}")
        pending = _decision_at(db, session_id, len(answers))
        if pending is None:
            raise NotCurrentQuestionError(
                "this session has not chosen its first question yet (answer the attribute "
                "questions first)"
            )
        if pending.item_id != item.id:
            current = rt.by_id[pending.item_id].key if pending.item_id else None
            raise NotCurrentQuestionError(
                f"item {item.key!r} is not the current question"
                + (f" (the current question is {current!r})" if current else "")
            )
        row = Answer(
            session_id=session_id,
            item_id=item.id,
            option=option,
            idempotency_key=idempotency_key,
        )
        db.add(row)
        db.flush()  # the answer is stored first: the unique constraints apply here
        if pre is not None and pre.n_before == len(answers):
            state, decision = pre.state, pre.decision
            answers.append(row)
        else:  # another answer came in between: compute under the lock
            respondent = db.get(Respondent, sess.respondent_id)
            assert respondent is not None
            state = current_state(rt, sess, respondent, answers)
            if option is not None:
                idx = [o[0] for o in item.options].index(option)
                state = rt.model.update(state, rt.model_index[item.id], idx)
            answers.append(row)
            decision = _decide(rt, state, session_id, answers)
        db.add(decision)
        sess.state = _dump_state(state)
        sess.state_version = len(answers)
        sess.updated_at = utcnow()
        if decision.item_id is None:
            sess.status = SessionStatus.completed.value
            sess.completed_at = utcnow()
        db.add(sess)
        db.commit()
        return _view_at(rt, sess, decision, len(answers))


# ----- reading ------------------------------------------------------------------------------------


def get_session_by_token(token: str, *, session: Session) -> ElicitationSession:
    """The session whose token is ``token``; :class:`SessionNotFoundError` otherwise."""
    if not token or len(token) > 200:
        raise SessionNotFoundError("unknown session token")
    sess = session.exec(
        select(ElicitationSession).where(ElicitationSession.token_hash == hash_token(token))
    ).first()
    if sess is None:
        raise SessionNotFoundError("unknown session token")
    return sess


def session_view(study: Study, sess: ElicitationSession, *, session: Session) -> SessionView:
    """Where the session stands now."""
    rt = load_runtime(study, session=session, fit_if_missing=False)
    return _current_view(rt, session, sess)


@dataclass(frozen=True)
class AnswerRecord:
    item: str
    option: str | None
    answered_at: str


def session_answers(sess: ElicitationSession, *, session: Session) -> list[AnswerRecord]:
    """The stored answers of a session, in order (item keys and letters)."""
    rows = session.exec(
        select(Answer, Item.key)
        .join(Item, Item.id == Answer.item_id)  # type: ignore[arg-type]
        .where(Answer.session_id == sess.id)
        .order_by(Answer.id)  # type: ignore[arg-type]
    ).all()
    return [AnswerRecord(key, a.option, a.created_at.isoformat()) for a, key in rows]


@dataclass(frozen=True)
class Prediction:
    item: str
    role: str
    question: str
    distribution: dict[str, float]


@dataclass(frozen=True)
class Predictions:
    """Predictive distributions of every unasked item and every target, and top personas."""

    items: list[Prediction]
    targets: list[Prediction]
    personas: list[dict[str, Any]]
    n_answers: int


def predictions(study: Study, sess: ElicitationSession, *, session: Session) -> Predictions:
    """Predictions from the replayed state (never trusting the cache for a read)."""
    rt = load_runtime(study, session=session, fit_if_missing=False)
    respondent = session.get(Respondent, sess.respondent_id)
    assert respondent is not None
    answers = _answers_of(session, sess.id or 0)
    state = replay(rt, respondent, answers)
    answered = {a.item_id for a in answers}
    unasked = [it for it in rt.candidates if it.id not in answered]
    wanted = unasked + rt.targets
    probs = rt.model.predict(state, [rt.model_index[it.id] for it in wanted]) if wanted else None  # type: ignore[index]

    def pred(j: int, it: ItemInfo) -> Prediction:
        row = probs[j].tolist() if probs is not None else []
        return Prediction(
            item=it.key,
            role=it.role,
            question=it.question,
            distribution={str(o[0]): float(row[k]) for k, o in enumerate(it.options)},
        )

    out = [pred(j, it) for j, it in enumerate(wanted)]
    personas: list[dict[str, Any]] = []
    latent = getattr(rt.model, "latent_posterior", None)
    if callable(latent):
        w = latent(state)
        top = torch.topk(w, min(TOP_PERSONAS, int(w.numel())))
        labels = getattr(rt.model, "labels", None)
        for weight, idx in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            personas.append(
                {
                    "persona": int(idx),
                    "label": labels[idx] if labels else f"class {idx + 1}",
                    "weight": float(weight),
                }
            )
    return Predictions(
        items=out[: len(unasked)],
        targets=out[len(unasked) :],
        personas=personas,
        n_answers=len(answers),
    )


def explanation(study: Study, sess: ElicitationSession, *, session: Session) -> dict[str, Any]:
    """The last selection decision: the chosen item (or stop reason) and every score."""
    row = session.exec(
        select(SelectionDecision)
        .where(SelectionDecision.session_id == sess.id)
        .order_by(SelectionDecision.position.desc())  # type: ignore[attr-defined]
    ).first()
    if row is None:
        raise NotCurrentQuestionError("no question has been chosen in this session yet")
    item_key = None
    if row.item_id is not None:
        item = session.get(Item, row.item_id)
        item_key = item.key if item is not None else None
    detail = dict(row.scores or {})
    scores = detail.pop("scores", {})
    return {
        "position": row.position,
        "item": item_key,
        "stop_reason": row.stop_reason,
        "criterion": row.criterion,
        "scores": dict(sorted(scores.items(), key=lambda kv: -kv[1])),
        **{k: v for k, v in detail.items() if k != "model_id"},
    }


# ----- erasure --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErasureResult:
    respondent_id: int
    n_sessions: int
    n_answers: int


def erase_respondent(sess: ElicitationSession, *, engine: Engine) -> ErasureResult:
    """Delete the respondent of ``sess`` with every session, answer, decision and state.

    Only counts stay behind (:class:`app.tables.ErasureRecord`). Imported (historical)
    respondents are not erased this way (they belong to the dataset).
    """
    with Session(engine) as db:
        respondent = db.get(Respondent, sess.respondent_id)
        if respondent is None:
            raise SessionNotFoundError(f"no session {sess.id}")
        sessions = db.exec(
            select(ElicitationSession).where(ElicitationSession.respondent_id == respondent.id)
        ).all()
        ids = [s.id for s in sessions]
        n_answers = int(
            db.exec(
                select(func.count()).select_from(Answer).where(Answer.session_id.in_(ids))  # type: ignore[attr-defined]
            ).one()
        )
        n_completed = sum(1 for s in sessions if s.status == SessionStatus.completed.value)
        # explicit deletes, children first (not relying on ON DELETE CASCADE being enforced)
        db.exec(delete(SelectionDecision).where(SelectionDecision.session_id.in_(ids)))  # type: ignore[call-overload,attr-defined]
        db.exec(delete(Answer).where(Answer.session_id.in_(ids)))  # type: ignore[call-overload,attr-defined]
        db.exec(delete(ElicitationSession).where(ElicitationSession.id.in_(ids)))  # type: ignore[call-overload,union-attr]
        db.exec(delete(Respondent).where(Respondent.id == respondent.id))  # type: ignore[call-overload,arg-type]
        db.add(
            ErasureRecord(
                study_id=respondent.study_id,
                n_sessions=len(ids),
                n_completed=n_completed,
                n_answers=n_answers,
            )
        )
        db.commit()
        return ErasureResult(respondent.id or 0, len(ids), n_answers)
