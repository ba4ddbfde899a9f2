"""The live loop of a respondent's adaptive session (ARCHITECTURE.md, "The way data flows").

Every answer goes through :func:`submit_answer`. Its invariants hold on SQLite and
PostgreSQL with any number of worker processes:

1. the answer row is stored first — in the same transaction as the state and the
   decision that follow from it, so nothing is acknowledged before all three are
   committed (unique per session and item, and per session and idempotency key: the
   database refuses a second row whatever happens above it);
2. the cached state (``elicitation_session.state``) always equals the replay of the
   stored answers (:func:`elicitation.session.replay_state`): ``state_version`` counts
   the answers it includes, and a state whose version is not the number of answers is
   never used;
3. the next item is chosen by :func:`elicitation.session.decide` with the study's
   criterion and budget, and the decision is stored with every candidate's score
   (``selection_decision``, unique per session and position);
4. the caller renders the returned :class:`SessionView`.

Two ways through, with the same results:

* the **fast path** (:func:`_submit_fast`, the common case of answering the pending
  question): two unlocked reads, the model step, and ONE write conditional on
  ``state_version`` being unchanged (optimistic concurrency: every answer increments it
  in the same transaction, so an unchanged version means no answer was stored in
  between); written with raw DB-API statements, on PostgreSQL as one statement;
* the **locked path** (:func:`_submit_locked`) for everything else (retries, conflicts,
  a lost race of the fast path): one ORM transaction holding the session's lock
  (``SELECT ... FOR UPDATE`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite).

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
import re
import secrets
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
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
    cached_model,
    ensure_fitted_model,
    fixed_order_key,
    fixed_order_params,
    model_blob,
    model_from_blob,
    request_fixed_order,
    stored_fixed_orders,
)
from app.tables import (
    Answer,
    ElicitationSession,
    ErasureRecord,
    FittedModel,
    Item,
    ItemRole,
    Respondent,
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
TARGET_CRITERIA = frozenset({"eig", "eig_anchored", "eig_tempered", "eig2", "fixed"})
"""Criteria that score the targets: replaced by :data:`FALLBACK_CRITERION` without any."""
ORDER_FALLBACK_CRITERION = "eig"
"""Used while an order-based criterion (``eig_anchored``, ``fixed``) has no stored fixed
order for the study's model, pool and targets (the order is being computed by a
``fixed_order`` job); the decision records ``eig`` and ``requested_criterion``."""
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
    """A session token (256 random bits, URL-safe): the respondent's credential.

    Never starts with the API keys' prefix (``pk_``): the JSON API tells the two kinds of
    bearer credential apart by that prefix, and a random token starts with it once in
    64**3 = 262,144 draws (it happened in a 6,389-session load test: that respondent got
    401 "invalid API key"). Redrawing keeps the remaining tokens uniformly random.
    """
    from app.services.apikeys import KEY_PREFIX

    while True:
        token = secrets.token_urlsafe(TOKEN_BYTES)
        if not token.startswith(KEY_PREFIX):
            return token


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
        criterion: the criterion name used (``FALLBACK_CRITERION`` without targets,
            ``ORDER_FALLBACK_CRITERION`` while a needed fixed order is missing).
        settings: the study's validated settings.
        selector: the criterion object, built once per runtime (an order-based one holds
            the stored fixed order); ``None`` for ``random`` (seeded per decision) or a
            criterion that could not be built (the decision raises the error).
        requested_criterion: the study's criterion when ``criterion`` replaces it for a
            missing fixed order, else ``None``.
        missing_order_key: the key of that missing order (:func:`belief.fixed_order_key`).
        first_decisions: the prior state and first decision per set of known attributes
            (:func:`_first_state_and_decision`; lives as long as this runtime).
        step_memo: the answer steps already computed for this study design
            (:class:`StepMemo`; shared by the runtimes of the same design, so it outlives
            the :data:`RUNTIME_TTL_S` rebuilds); ``None`` for ``random`` or when off.
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
    selector: Any = None
    requested_criterion: str | None = None
    missing_order_key: str | None = None
    first_decisions: dict[tuple[tuple[str, str], ...], tuple[Any, DecisionRow]] = field(
        default_factory=dict, repr=False, compare=False
    )
    step_memo: StepMemo | None = field(default=None, repr=False, compare=False)

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
_BUILD_LOCKS: dict[tuple[str, int, str], threading.Lock] = {}


def clear_runtime_cache() -> None:
    """Forget every cached study runtime (tests that edit items in place)."""
    with _RUNTIME_LOCK:
        _RUNTIME_CACHE.clear()


def load_runtime(
    study: Study | StudyHead,
    *,
    session: Session | None = None,
    engine: Engine | None = None,
    fit_if_missing: bool = True,
) -> StudyRuntime:
    """Assemble the study's runtime; fits the default model first when there is none.

    Give ``session`` or ``engine`` (with an engine, a session is opened only to rebuild the
    runtime, and closed before the model is deserialised, so no pooled connection is held
    during CPU work). ``fit_if_missing`` needs the study's ORM row.

    One build per key at a time (single flight): when the cached runtime is older than
    :data:`RUNTIME_TTL_S`, one request rebuilds it while concurrent requests keep using the
    previous one; without any cached runtime, concurrent requests wait for the one build.

    Raises:
        NoModelError: no active fitted model and ``fit_if_missing`` is false (or only a
            study head was given) (409 ``no_model``).
    """
    assert study.id is not None
    bind = engine if engine is not None else session.get_bind().engine  # type: ignore[union-attr]
    key = _runtime_key(bind, study)
    with _RUNTIME_LOCK:
        hit = _RUNTIME_CACHE.get(key)
        build_lock = _BUILD_LOCKS.setdefault(key, threading.Lock())
        if len(_BUILD_LOCKS) > 1024:
            _BUILD_LOCKS.clear()
    if hit is not None and time.monotonic() - hit[0] < RUNTIME_TTL_S:
        return hit[1]
    if hit is not None:
        if not build_lock.acquire(blocking=False):
            return hit[1]  # another request is refreshing it
    else:
        build_lock.acquire()
    try:
        with _RUNTIME_LOCK:
            again = _RUNTIME_CACHE.get(key)
        if again is not None and time.monotonic() - again[0] < RUNTIME_TTL_S:
            return again[1]
        if session is None:
            with Session(bind) as db:
                ref, model, blob, items, orders = _runtime_rows(study, db, fit_if_missing)
        else:
            ref, model, blob, items, orders = _runtime_rows(study, session, fit_if_missing)
        if model is None:  # deserialised with no connection held (CPU work)
            model = model_from_blob(ref, blob)  # type: ignore[arg-type]
        rt = _build_runtime(study, ref, model, items, orders)
        with _RUNTIME_LOCK:
            if len(_RUNTIME_CACHE) > 256:
                _RUNTIME_CACHE.clear()
            _RUNTIME_CACHE[key] = (time.monotonic(), rt)
        if rt.missing_order_key is not None:
            request_fixed_order(rt.study_id, rt.missing_order_key, engine=bind)
        return rt
    finally:
        build_lock.release()


def _runtime_key(bind: Engine, study: StudyHead | Study) -> tuple[str, int, str]:
    return (
        str(bind.url),  # one process may serve (or test) several databases
        study.id or 0,
        json.dumps(study.settings, sort_keys=True) + study.status + study.slug,
    )


def peek_runtime(study: StudyHead | Study, *, engine: Engine) -> tuple[StudyRuntime | None, bool]:
    """``(the study's cached runtime or None, whether it is fresh)``: no I/O, never
    blocks. A stale runtime may still serve while :func:`load_runtime` rebuilds it (the
    same rule as :func:`load_runtime`'s own single flight)."""
    with _RUNTIME_LOCK:
        hit = _RUNTIME_CACHE.get(_runtime_key(engine, study))
    if hit is None:
        return None, False
    return hit[1], time.monotonic() - hit[0] < RUNTIME_TTL_S


def _runtime_rows(
    study: Study | StudyHead, session: Session, fit_if_missing: bool
) -> tuple[Any, Any, bytes | None, list[ItemInfo], dict[str, Any]]:
    """The active model's reference (fitting one first if allowed and needed), the model
    if this process has it already or else its blob, the study's items and the fixed
    orders stored with the model: everything read from the database for a runtime."""
    ref = active_model_ref(study.id, session=session)
    if ref is None:
        if not fit_if_missing or not isinstance(study, Study):
            raise NoModelError(f"study {study.slug!r} has no fitted belief model")
        ensure_fitted_model(study, session=session)
        ref = active_model_ref(study.id, session=session)
        assert ref is not None
    model = cached_model(ref)
    blob = model_blob(ref, session=session) if model is None else None
    items = [
        ItemInfo(it.id or 0, it.key, it.question, list(it.options), it.role, it.topic)
        for it in session.exec(
            select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
        ).all()
    ]
    metrics = session.exec(select(FittedModel.metrics).where(FittedModel.id == ref.id)).first()
    return ref, model, blob, items, stored_fixed_orders(metrics)


def _build_runtime(
    study: Study | StudyHead,
    ref: Any,
    model: Any,
    items: list[ItemInfo],
    orders: Mapping[str, Any] | None = None,
) -> StudyRuntime:
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
    if not targets and criterion in TARGET_CRITERIA:
        criterion = FALLBACK_CRITERION
    candidates = [it for it in in_model if it.role == ItemRole.question.value]
    selector, used, missing = _selector(
        criterion, model, ref, candidates, targets, model_index, orders or {}
    )
    design = (
        ref.id,
        ref.training_hash,
        used,
        criterion,
        missing,
        tuple(c.id for c in candidates),
        tuple(t.id for t in targets),
        tuple(sorted(model_index.items())),
        tuple((it.id, tuple(o[0] for o in it.options)) for it in in_model),
        settings.budgets.model_dump_json(),
        json.dumps(orders or {}, sort_keys=True, default=str),
    )
    return StudyRuntime(
        study_id=study.id or 0,
        slug=study.slug,
        items=items,
        model=model,
        model_id=ref.id,
        model_index=model_index,
        attributes=[it for it in in_model if it.role == ItemRole.attribute.value],
        candidates=candidates,
        targets=targets,
        criterion=used,
        settings=settings,
        by_id={it.id: it for it in items if it.id is not None},
        by_key={it.key: it for it in items},
        selector=selector,
        requested_criterion=None if used == criterion else criterion,
        missing_order_key=missing,
        step_memo=None if selector is None else step_memo_for(design),
    )


def _selector(
    criterion: str,
    model: Any,
    ref: Any,
    candidates: list[ItemInfo],
    targets: list[ItemInfo],
    model_index: dict[int, int],
    orders: Mapping[str, Any],
) -> tuple[Any, str, str | None]:
    """``(criterion object or None, name used, key of a missing fixed order or None)``.

    Built once per runtime, so nothing expensive runs per decision. An order-based
    criterion gets the order stored with the model under the key of this model, pool and
    targets; without one the runtime uses :data:`ORDER_FALLBACK_CRITERION` and reports the
    missing key (the caller queues its computation). ``random`` is seeded per decision
    (``None`` here); a name the registry refuses is left to the decision to report.
    """
    from elicitation.criteria import get_criterion
    from elicitation.errors import ElicitationError

    if criterion == "random":
        return None, criterion, None
    try:
        selector: Any = get_criterion(criterion)
    except ElicitationError:
        return None, criterion, None
    if not selector.uses_fixed_order or not candidates or not targets:
        return selector, criterion, None
    # the runtime's candidates and targets are belief.order_roles of the study's items
    pool, tgt = [c.key for c in candidates], [t.key for t in targets]
    key = fixed_order_key(ref.training_hash, pool, tgt, fixed_order_params(selector))
    entry = orders.get(key)
    bank = model.item_bank
    if isinstance(entry, dict):
        try:
            selector.set_fixed_order(
                model,
                [model_index[c.id] for c in candidates],  # type: ignore[index]
                [model_index[t.id] for t in targets],  # type: ignore[index]
                [bank.index(k) for k in entry.get("order", [])],
                entry.get("expectation", []),
            )
            return selector, criterion, None
        except (ElicitationError, KeyError, ValueError):
            pass  # a corrupt entry is treated as missing (the job stores a new one)
    return get_criterion(ORDER_FALLBACK_CRITERION), ORDER_FALLBACK_CRITERION, key


# ----- the answer steps already computed ----------------------------------------------------------


@dataclass(frozen=True)
class MemoStep:
    """What :func:`fast_step` computes from a state and an answer: the new state's bytes
    and the next decision's stored columns (``scores`` already as JSON)."""

    state: bytes
    item_id: int | None
    criterion: str
    scores_json: str
    stop_reason: str | None


class StepMemo:
    """The answer steps one process has computed for one study design, least recently
    used first out beyond ``max_entries``.

    Why: a step (update the state with the answer, choose the next question) is a pure
    function of the state before, the answers so far and the answer: the model, items,
    criterion and budgets are fixed by the design (the key of :func:`step_memo_for`), and
    no criterion that uses the memo draws random numbers. Respondents who gave the same
    answers share their steps (the adaptive design is a decision tree, grown here on
    demand): with two-option questions a 10-question session has at most 2**k histories
    at depth k, so a busy study soon computes none; with many options or many attribute
    sets the deep steps rarely repeat and the memo costs one dictionary look-up and
    ``max_entries`` x ~5 KB. The stored bytes are those the step computed, so a session's
    cached state stays bit for bit the replay of its answers (tested).

    Key: ``(blake2b of the state before, ((model item, option or None), ...) of the
    answers so far and this one)``.
    """

    def __init__(self, max_entries: int) -> None:
        from collections import OrderedDict

        self.max_entries = max_entries
        self._steps: OrderedDict[tuple[bytes, tuple[tuple[int, str | None], ...]], MemoStep] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    @staticmethod
    def key(
        state: bytes, answers: Sequence[tuple[int, str | None]]
    ) -> tuple[bytes, tuple[tuple[int, str | None], ...]]:
        return hashlib.blake2b(state, digest_size=16).digest(), tuple(answers)

    def get(self, key: tuple[bytes, tuple[tuple[int, str | None], ...]]) -> MemoStep | None:
        with self._lock:
            step = self._steps.get(key)
            if step is None:
                STEP_MEMO_STATS["misses"] += 1
                return None
            self._steps.move_to_end(key)
            STEP_MEMO_STATS["hits"] += 1
            return step

    def put(self, key: tuple[bytes, tuple[tuple[int, str | None], ...]], step: MemoStep) -> None:
        with self._lock:
            self._steps[key] = step
            self._steps.move_to_end(key)
            while len(self._steps) > self.max_entries:
                self._steps.popitem(last=False)

    def __len__(self) -> int:
        return len(self._steps)


STEP_MEMO_MAX = 2048
"""Answer steps a process keeps per study design (``PRIORLY_STEP_MEMO_SIZE``; 0 = none):
about 5 KB each with the CES demo's 516-class model."""
STEP_MEMO_STATS = {"hits": 0, "misses": 0}
_STEP_MEMOS: dict[tuple[Any, ...], StepMemo] = {}
_STEP_MEMOS_MAX = 8


def configure_step_memo(max_entries: int) -> None:
    """Set :data:`STEP_MEMO_MAX` (the app's settings call this); a new size forgets the
    memos and the runtimes holding them."""
    global STEP_MEMO_MAX
    with _RUNTIME_LOCK:
        if max_entries == STEP_MEMO_MAX:
            return
        STEP_MEMO_MAX = max_entries
        _STEP_MEMOS.clear()
        _RUNTIME_CACHE.clear()


def step_memo_for(design: tuple[Any, ...]) -> StepMemo | None:
    """The process's memo for a study design (created on first use; ``None`` when the
    memo is off). ``design`` holds everything a step depends on besides its inputs: the
    model's id and training hash, the criterion, the pool, the targets, the items' options
    and model positions, the budgets and the stored fixed orders."""
    if STEP_MEMO_MAX <= 0:
        return None
    with _RUNTIME_LOCK:
        memo = _STEP_MEMOS.get(design)
        if memo is None:
            if len(_STEP_MEMOS) >= _STEP_MEMOS_MAX:
                _STEP_MEMOS.pop(next(iter(_STEP_MEMOS)))
            memo = _STEP_MEMOS[design] = StepMemo(STEP_MEMO_MAX)
        return memo


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
    decision: SelectionDecision | DecisionRow | None,
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
    """The study's criterion: the runtime's object (built once, holding any stored fixed
    order); ``random`` gets a seed per session and position (recorded in the decision's
    ``criterion_params``, so every order can be reproduced)."""
    from elicitation.criteria import get_criterion

    if rt.criterion == "random":
        return get_criterion(
            "random", seed=seed if seed is not None else session_id * 1009 + position
        )
    if rt.selector is not None:
        return rt.selector
    return get_criterion(rt.criterion)


@dataclass
class DecisionRow:
    """The column values of a ``selection_decision`` row (a plain object: building the ORM
    row costs more than the rest of the bookkeeping, and the fast path writes with Core)."""

    session_id: int
    position: int
    item_id: int | None
    criterion: str
    scores: dict[str, Any]
    stop_reason: str | None

    def to_row(self) -> SelectionDecision:
        return SelectionDecision(
            session_id=self.session_id,
            position=self.position,
            item_id=self.item_id,
            criterion=self.criterion,
            scores=self.scores,
            stop_reason=self.stop_reason,
        )


def _decide(
    rt: StudyRuntime,
    state: Any,
    sess_id: int,
    answers: Sequence[Answer],
    seed: int | None = None,
) -> DecisionRow:
    """Run the selection step; returns the decision's column values (not stored)."""
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
    return DecisionRow(
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
            **(
                {"requested_criterion": rt.requested_criterion}
                if rt.requested_criterion is not None
                else {}
            ),
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
    params = check_start(study, external_id, panel_params, allow_draft)
    with _WORK:
        return _start(study, engine, attributes, external_id, params, ask_attributes)


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
    return clean_panel_params(panel_params or {})


_INSERT_RESPONDENT = """
    INSERT INTO respondent
        (study_id, external_id, attributes, answers, panel_params, source, split, created_at)
    VALUES (:study_id, :external_id, :attributes, '{}', :panel_params, 'live', NULL, :now)
"""
_INSERT_SESSION = """
    INSERT INTO elicitation_session (study_id, respondent_id, token_hash, status, state,
        state_version, created_at, updated_at, completed_at)
    VALUES (:study_id, :respondent_id, :token_hash, :status, :state, 0, :now, :now,
        :completed_at)
"""
_INSERT_FIRST_DECISION = """
    INSERT INTO selection_decision
        (session_id, position, item_id, criterion, scores, stop_reason, created_at)
    VALUES (:sid, 0, :d_item_id, :criterion, :scores, :stop_reason, :now)
"""
# PostgreSQL: respondent, session and (when chosen) the first decision in one statement.
PG_START = """
    WITH r AS (
        INSERT INTO respondent
            (study_id, external_id, attributes, answers, panel_params, source, split,
             created_at)
        VALUES (:study_id, :external_id, CAST(:attributes AS json), CAST('{}' AS json),
            CAST(:panel_params AS json), 'live', NULL, :now)
        RETURNING id
    ), s AS (
        INSERT INTO elicitation_session (study_id, respondent_id, token_hash, status, state,
            state_version, created_at, updated_at, completed_at)
        SELECT :study_id, r.id, :token_hash, :status, :state, 0, :now, :now, :completed_at
        FROM r
        RETURNING id, respondent_id
    ), d AS (
        INSERT INTO selection_decision
            (session_id, position, item_id, criterion, scores, stop_reason, created_at)
        SELECT s.id, 0, :d_item_id, :criterion, CAST(:scores AS json), :stop_reason, :now
        FROM s WHERE :has_decision
    )
    SELECT id, respondent_id FROM s
"""


@dataclass
class StartPlan:
    """A session start prepared before its write: what :func:`_start` and the event-loop
    start of :mod:`app.services.answer_async` store with :data:`PG_START` (or the SQLite
    statements), then turn into a :class:`StartedSession` with :meth:`started`."""

    rt: StudyRuntime
    token: str
    decision: DecisionRow | None
    values: dict[str, Any]

    def started(self, sid: int, rid: int) -> StartedSession:
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
            view = _plain_view(rt, sid, decision.item_id, decision.stop_reason, 0)
        return StartedSession(sid, rid, self.token, view)


def plan_start(
    rt: StudyRuntime,
    study_id: int,
    attributes: Mapping[str, Any] | None,
    external_id: str | None,
    params: dict[str, str] | None,
    ask_attributes: bool,
    dialect: str,
) -> StartPlan:
    """Validate the attributes, compute the prior state and the first decision (model work,
    before any write: SQLite has one writer) and the statement's parameters.

    Raises:
        InvalidAttributesError: see :func:`validate_attributes`.
    """
    attrs = validate_attributes(rt, attributes or {})
    first = None
    if not (ask_attributes and rt.attributes):
        first = _first_state_and_decision(rt, attrs)
    state, decision = first if first is not None else (None, None)
    done = decision is not None and decision.item_id is None
    token = new_token()
    now = _timestamp(dialect, utcnow())
    values = {
        "study_id": study_id,
        "external_id": external_id,
        "attributes": json.dumps(attrs),
        "panel_params": json.dumps(params) if params is not None else None,
        "now": now,
        "token_hash": hash_token(token),
        "status": SessionStatus.completed.value if done else SessionStatus.active.value,
        "state": _dump_state(state) if first is not None else None,
        "completed_at": now if done else None,
        "has_decision": decision is not None,
        "d_item_id": decision.item_id if decision is not None else None,
        "criterion": decision.criterion if decision is not None else "",
        "scores": json.dumps(decision.scores if decision is not None else {}),
        "stop_reason": decision.stop_reason if decision is not None else None,
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
) -> StartedSession:
    """Respondent, session and first decision in one transaction (raw statements: this is
    once per session, a tenth of the load of a 10-question session)."""
    rt = load_runtime(study, engine=engine)
    plan = plan_start(
        rt, study.id or 0, attributes, external_id, params, ask_attributes, engine.dialect.name
    )
    values = plan.values
    with _dbapi(engine) as (raw, dialect):
        cur = raw.cursor()
        try:
            if dialect == "postgresql":
                cur.execute(_sql(dialect, PG_START), values)
                sid, rid = cur.fetchone()
            else:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    cur.execute(_INSERT_RESPONDENT, values)
                    rid = cur.lastrowid
                    cur.execute(_INSERT_SESSION, {**values, "respondent_id": rid})
                    sid = cur.lastrowid
                    if plan.decision is not None:
                        cur.execute(_INSERT_FIRST_DECISION, {**values, "sid": sid})
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


def _first_state_and_decision(
    rt: StudyRuntime, attributes: Mapping[str, str]
) -> tuple[Any, DecisionRow]:
    """The prior state given the attributes, and the first decision (not stored yet).

    Both are a function of the runtime (model, items, criterion, budget) and the known
    attributes only, so they are computed once per attribute set and runtime and then
    copied (:data:`FIRST_DECISIONS_MAX` sets per runtime): a burst of session starts then
    costs no model work. Not for ``random``, whose first pick is seeded per session.
    """
    from elicitation.session import replay_state

    key = tuple(sorted(attributes.items()))
    cache = rt.criterion != "random"
    hit = rt.first_decisions.get(key) if cache else None
    if hit is not None:
        state, decision = hit
        return state, replace(decision, scores=dict(decision.scores))
    state = replay_state(rt.model, _attribute_indices(rt, attributes), [])
    decision = _decide(rt, state, 0, [], seed=secrets.randbelow(2**31))
    if cache and len(rt.first_decisions) < FIRST_DECISIONS_MAX:
        rt.first_decisions[key] = (state, replace(decision, scores=dict(decision.scores)))
    return state, decision


FIRST_DECISIONS_MAX = 1024
"""Attribute sets whose first decision one study runtime keeps (beyond it, computed each
time; the runtime itself is rebuilt every :data:`RUNTIME_TTL_S` seconds)."""


def _store_first_decision(
    rt: StudyRuntime,
    db: Session,
    sess: ElicitationSession,
    state: Any,
    decision: DecisionRow,
) -> SessionView:
    decision.session_id = sess.id or 0
    row = decision.to_row()
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
    study: Study | StudyHead,
    session_id: int,
    *,
    item_key: str,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
    snapshot: SessionSnapshot | None = None,
) -> SessionView:
    """Store an answer (``option`` ``None`` = "prefer not to answer") and choose the next item.

    Args:
        snapshot: the session row as the caller's authorization read it (saves a read);
            read here when ``None``. It is only a hint: the write is conditional on it.

    Returns:
        The view after the answer: the next question, or completion.

    Raises:
        SessionNotFoundError, ItemNotFoundError (404); InvalidAnswerError (422: unknown
        option, skip not allowed, bad key); AnswerConflictError, NotCurrentQuestionError,
        SessionClosedError (409).
    """
    check_idempotency_key(idempotency_key)
    rt = load_runtime(study, engine=engine, fit_if_missing=False)
    item = answered_item(rt, item_key, option)
    with _WORK:
        view = _submit_fast(rt, session_id, item, option, idempotency_key, engine, snapshot)
        if view is not None:
            return view
        for attempt in range(2):
            try:
                return _submit_locked(rt, session_id, item, option, idempotency_key, engine)
            except IntegrityError:
                # A unique constraint caught a concurrent duplicate (only possible if the
                # lock was bypassed); the second attempt finds the stored row and answers
                # from it.
                if attempt == 1:
                    raise
    raise AssertionError("unreachable")


def check_idempotency_key(idempotency_key: str | None) -> None:
    """Raise :class:`InvalidAnswerError` for an idempotency key of a bad length."""
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= IDEMPOTENCY_KEY_MAX:
        raise InvalidAnswerError(f"idempotency_key must be 1 to {IDEMPOTENCY_KEY_MAX} characters")


def answered_item(rt: StudyRuntime, item_key: str, option: str | None) -> ItemInfo:
    """The item ``item_key`` of the study, checked against ``option`` (``None`` = skip).

    Raises:
        ItemNotFoundError (404); InvalidAnswerError (422: unknown option, skip not allowed).
    """
    item = rt.by_key.get(item_key)
    if item is None:
        raise ItemNotFoundError(f"item {item_key!r} is not an item of study {rt.slug!r}")
    if option is not None and option not in [o[0] for o in item.options]:
        letters = ", ".join(o[0] for o in item.options)
        raise InvalidAnswerError(
            f"option {option!r} is not an option of item {item_key!r} ({letters})"
        )
    if option is None and not rt.allow_skip:
        raise InvalidAnswerError(f"study {rt.slug!r} does not allow skipping a question")
    return item


# ----- the fast path: two reads, the model step, one conditional write ------------------------
#
# These few statements run on every answer, so they go straight to the pooled DB-API
# connection (psycopg / sqlite3): through SQLAlchemy Core each cost ~0.5 ms of CPU, raw
# ~0.03-0.1 ms (measured on this machine). They are written once with ``:name``
# parameters and translated for psycopg; everything else in the app uses the ORM.


@dataclass(frozen=True)
class StudyHead:
    """The columns of a study row that a live session needs (a plain, cacheable copy)."""

    id: int
    slug: str
    status: str
    settings: dict[str, Any]
    owner_id: int | None


@dataclass(frozen=True)
class SessionSnapshot:
    """One read of an ``elicitation_session`` row with its study's head (no lock held).

    ``state`` is the cached belief state after ``state_version`` answers. A snapshot is
    never trusted for a write: the write is conditional on ``state_version`` being
    unchanged (see :func:`_submit_fast`).
    """

    id: int
    study_id: int
    respondent_id: int
    token_hash: str
    status: str
    state: bytes | None
    state_version: int
    study: StudyHead


_SNAPSHOT_SQL = """
    SELECT s.id, s.study_id, s.respondent_id, s.token_hash, s.status, s.state,
           s.state_version, st.slug, st.status, st.settings, st.owner_id
    FROM elicitation_session s JOIN study st ON st.id = s.study_id
    WHERE {where}
"""
_SNAPSHOT_BY_ID = _SNAPSHOT_SQL.format(where="s.id = :sid")
_SNAPSHOT_BY_TOKEN = _SNAPSHOT_SQL.format(where="s.token_hash = :token_hash")
# The answers of a session (kind 0, in order) and its decision at ``pos`` (kind 1).
HISTORY = """
    SELECT 0 AS kind, id AS n, item_id, option, idempotency_key
    FROM answer WHERE session_id = :sid
    UNION ALL
    SELECT 1, position, item_id, NULL, NULL
    FROM selection_decision WHERE session_id = :sid AND position = :pos
    ORDER BY 1, 2
"""
# PostgreSQL: the snapshot by token and the rows of :data:`HISTORY` at the snapshot's
# ``state_version`` in one round trip (column 11: a JSON array of ``[kind, n, item_id,
# option, idempotency_key]``, ``null`` without rows). The answer call's two reads were two
# statements; each costs the worker a few hundred microseconds of driver and event-loop
# work, which at 200 answers/s on 2 cores is queueing (docs/reliability.md).
PG_SNAPSHOT_AND_HISTORY_BY_TOKEN = """
    SELECT s.id, s.study_id, s.respondent_id, s.token_hash, s.status, s.state,
           s.state_version, st.slug, st.status, st.settings, st.owner_id,
           (SELECT json_agg(json_build_array(h.kind, h.n, h.item_id, h.option,
                                             h.idempotency_key) ORDER BY h.kind, h.n)
            FROM (SELECT 0 AS kind, a.id AS n, a.item_id, a.option, a.idempotency_key
                  FROM answer a WHERE a.session_id = s.id
                  UNION ALL
                  SELECT 1, d.position, d.item_id, NULL, NULL
                  FROM selection_decision d
                  WHERE d.session_id = s.id AND d.position = s.state_version) h)
    FROM elicitation_session s JOIN study st ON st.id = s.study_id
    WHERE s.token_hash = :token_hash
"""
_UPDATE_IF_UNCHANGED = """
    UPDATE elicitation_session
    SET state = :state, state_version = :v1, status = :new_status,
        updated_at = :now, completed_at = :completed_at
    WHERE id = :sid AND state_version = :v0 AND status = 'active'
"""
_INSERT_ANSWER = """
    INSERT INTO answer (session_id, item_id, option, idempotency_key, created_at)
    VALUES (:sid, :item_id, :option, :idempotency_key, :now)
"""
_INSERT_DECISION = """
    INSERT INTO selection_decision
        (session_id, position, item_id, criterion, scores, stop_reason, created_at)
    VALUES (:sid, :v1, :d_item_id, :criterion, :scores, :stop_reason, :now)
"""
# PostgreSQL: the conditional update and both inserts in ONE statement (one round trip,
# atomic without BEGIN/COMMIT): the inserts select from the update's RETURNING, so nothing
# is inserted when the session changed since it was read.
PG_WRITE = """
    WITH s AS (
        UPDATE elicitation_session
        SET state = :state, state_version = :v1, status = :new_status,
            updated_at = :now, completed_at = :completed_at
        WHERE id = :sid AND state_version = :v0 AND status = 'active'
        RETURNING id
    ), a AS (
        INSERT INTO answer (session_id, item_id, option, idempotency_key, created_at)
        SELECT id, :item_id, :option, :idempotency_key, :now FROM s
        RETURNING id
    )
    INSERT INTO selection_decision
        (session_id, position, item_id, criterion, scores, stop_reason, created_at)
    SELECT s.id, :v1, :d_item_id, :criterion, CAST(:scores AS json), :stop_reason, :now
    FROM s JOIN a ON true
    RETURNING id
"""
_PARAM = re.compile(r"(?<![:\w]):(\w+)")
_PG_SQL: dict[str, str] = {}


def _sql(dialect: str, statement: str) -> str:
    """``statement`` with ``:name`` parameters in the driver's style (psycopg: ``%(name)s``)."""
    if dialect != "postgresql":
        return statement  # sqlite3 takes :name
    out = _PG_SQL.get(statement)
    if out is None:
        out = _PG_SQL[statement] = _PARAM.sub(r"%(\1)s", statement)
    return out


@contextmanager
def _dbapi(engine: Engine) -> Iterator[tuple[Any, str]]:
    """A pooled DB-API connection and the dialect name; PostgreSQL in autocommit mode (each
    statement its own transaction: no BEGIN/ROLLBACK round trips for the reads)."""
    fairy = engine.raw_connection()
    dialect = engine.dialect.name
    raw = fairy.dbapi_connection
    try:
        if dialect == "postgresql":
            raw.autocommit = True  # type: ignore[union-attr]
        yield raw, dialect
    finally:
        try:
            if dialect == "postgresql":
                raw.autocommit = False  # type: ignore[union-attr]
        finally:
            fairy.close()  # back to the pool (which rolls back anything left open)


def _timestamp(dialect: str, when: datetime) -> Any:
    """A timestamp parameter as SQLAlchemy's ``DateTime`` stores it on this backend."""
    if dialect == "sqlite":
        return when.strftime("%Y-%m-%d %H:%M:%S.%f")
    return when


def _snapshot_of(row: Sequence[Any]) -> SessionSnapshot:
    settings = row[9]
    if isinstance(settings, str | bytes):
        settings = json.loads(settings)
    return SessionSnapshot(
        id=int(row[0]),
        study_id=int(row[1]),
        respondent_id=int(row[2]),
        token_hash=str(row[3]),
        status=str(row[4]),
        state=bytes(row[5]) if row[5] is not None else None,
        state_version=int(row[6]),
        study=StudyHead(
            id=int(row[1]),
            slug=str(row[7]),
            status=str(row[8]),
            settings=dict(settings or {}),
            owner_id=row[10],
        ),
    )


def _read_snapshot(raw: Any, dialect: str, statement: str, params: dict[str, Any]) -> Any:
    cur = raw.cursor()
    try:
        cur.execute(_sql(dialect, statement), params)
        return cur.fetchone()
    finally:
        cur.close()


def read_session(session_id: int, *, engine: Engine) -> SessionSnapshot | None:
    """The session ``session_id`` with its study's head (one statement, no lock)."""
    with _dbapi(engine) as (raw, dialect):
        row = _read_snapshot(raw, dialect, _SNAPSHOT_BY_ID, {"sid": session_id})
    return None if row is None else _snapshot_of(row)


def read_session_by_token(token: str, *, engine: Engine) -> SessionSnapshot | None:
    """The session whose token is ``token`` (by its SHA-256; one statement, no lock)."""
    if not token or len(token) > 200:
        return None
    with _dbapi(engine) as (raw, dialect):
        row = _read_snapshot(raw, dialect, _SNAPSHOT_BY_TOKEN, {"token_hash": hash_token(token)})
    return None if row is None else _snapshot_of(row)


@dataclass(frozen=True)
class _AnswerRow:
    """A stored answer as the fast path reads it (duck-types :class:`Answer` for replays)."""

    item_id: int
    option: str | None
    idempotency_key: str | None


def _submit_fast(
    rt: StudyRuntime,
    session_id: int,
    item: ItemInfo,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
    snap: SessionSnapshot | None,
) -> SessionView | None:
    """The common case in one conditional write; ``None`` hands over to the locked path.

    1. reads (no lock): the session row (unless the caller's authorization read it), then
       its answers and the pending decision in one statement;
    2. anything unusual — a known idempotency key, an item already answered, a closed
       session, an item that is not the pending question, a cached state that is not
       current — returns ``None`` (the locked path answers those);
    3. the model step (update, selection) runs without any lock;
    4. one write, conditional on ``state_version`` still being ``n`` (every answer
       increments it in the same transaction, so an unchanged version means no answer
       was stored in between): the session's new state and version, the answer row and
       the decision row, atomically. PostgreSQL: one statement; SQLite: ``BEGIN
       IMMEDIATE`` and three short statements. When the condition fails (a concurrent
       answer won) or a unique constraint fires, nothing was written and ``None`` is
       returned.

    Steps 2-3 are :func:`fast_step` (shared with the event-loop path of
    :mod:`app.services.answer_async`).
    """
    with _dbapi(engine) as (raw, dialect):
        if snap is None or snap.id != session_id:
            row = _read_snapshot(raw, dialect, _SNAPSHOT_BY_ID, {"sid": session_id})
            if row is None:
                return None
            snap = _snapshot_of(row)
        if not fast_snapshot_usable(rt, snap):
            return None
        cur = raw.cursor()
        try:
            cur.execute(_sql(dialect, HISTORY), {"sid": session_id, "pos": snap.state_version})
            history = cur.fetchall()
        finally:
            cur.close()
    step = fast_step(rt, snap, item, option, idempotency_key, history, dialect)
    if step is None:
        return None
    with _dbapi(engine) as (raw, dialect):
        cur = raw.cursor()
        try:
            if dialect == "postgresql":
                cur.execute(_sql(dialect, PG_WRITE), step.params)
                if cur.fetchone() is None:
                    return None
            else:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    cur.execute(_UPDATE_IF_UNCHANGED, step.params)
                    if cur.rowcount != 1:
                        raw.rollback()
                        return None
                    cur.execute(_INSERT_ANSWER, step.params)
                    cur.execute(_INSERT_DECISION, step.params)
                    raw.commit()
                except BaseException:
                    raw.rollback()
                    raise
        except engine.dialect.dbapi.IntegrityError:  # type: ignore[union-attr]
            return None
        finally:
            cur.close()
    return step.view(rt)


def fast_snapshot_usable(rt: StudyRuntime, snap: SessionSnapshot) -> bool:
    """Whether the fast path may start from ``snap`` (an active session of this study
    with a cached state); otherwise the locked path answers."""
    return (
        snap.study_id == rt.study_id
        and snap.status == SessionStatus.active.value
        and snap.state is not None
    )


@dataclass(frozen=True)
class FastStep:
    """The outcome of the fast path's model step: the write's parameters (for
    :data:`PG_WRITE` or the SQLite statements) and what to show once it succeeded."""

    params: dict[str, Any]
    session_id: int
    next_item_id: int | None
    stop_reason: str | None
    n_posed: int

    def view(self, rt: StudyRuntime) -> SessionView:
        return _plain_view(rt, self.session_id, self.next_item_id, self.stop_reason, self.n_posed)


def fast_step(
    rt: StudyRuntime,
    snap: SessionSnapshot,
    item: ItemInfo,
    option: str | None,
    idempotency_key: str | None,
    history: Sequence[Sequence[Any]],
    dialect: str,
) -> FastStep | None:
    """Steps 2-3 of :func:`_submit_fast` (no I/O): check ``history`` (the rows of
    :data:`HISTORY` read after ``snap``), update the cached state with the answer, choose
    the next item, and build the conditional write; ``None`` when anything is unusual
    (the locked path answers it)."""
    n0 = snap.state_version
    answers = [_AnswerRow(r[2], r[3], r[4]) for r in history if r[0] == 0]
    pending = [r[2] for r in history if r[0] == 1]
    if (
        len(answers) != n0
        or pending != [item.id]
        or any(a.item_id == item.id for a in answers)
        or (
            idempotency_key is not None
            and any(a.idempotency_key == idempotency_key for a in answers)
        )
    ):
        return None
    assert snap.state is not None
    answers.append(_AnswerRow(item.id, option, idempotency_key))
    step = _step(rt, snap.state, snap.id, answers, item, option)
    n1 = n0 + 1
    done = step.item_id is None
    now = _timestamp(dialect, utcnow())
    params = {
        "sid": snap.id,
        "v0": n0,
        "v1": n1,
        "state": step.state,
        "new_status": SessionStatus.completed.value if done else SessionStatus.active.value,
        "now": now,
        "completed_at": now if done else None,
        "item_id": item.id,
        "option": option,
        "idempotency_key": idempotency_key,
        "d_item_id": step.item_id,
        "criterion": step.criterion,
        "scores": step.scores_json,
        "stop_reason": step.stop_reason,
    }
    return FastStep(params, snap.id, step.item_id, step.stop_reason, n1)


def _step(
    rt: StudyRuntime,
    state_before: bytes,
    session_id: int,
    answers: Sequence[_AnswerRow],
    item: ItemInfo,
    option: str | None,
) -> MemoStep:
    """The model step of :func:`fast_step`: ``state_before`` updated with the answer to
    ``item`` (the last of ``answers``), and the next decision; from the runtime's
    :class:`StepMemo` when this step was computed before."""
    memo = rt.step_memo
    key = None
    if memo is not None:
        key = StepMemo.key(state_before, [(rt.model_index[a.item_id], a.option) for a in answers])
        hit = memo.get(key)
        if hit is not None:
            return hit
    state = _load_state(state_before)
    if option is not None:
        idx = [o[0] for o in item.options].index(option)
        state = rt.model.update(state, rt.model_index[item.id], idx)
    decision = _decide(rt, state, session_id, answers)
    step = MemoStep(
        _dump_state(state),
        decision.item_id,
        decision.criterion,
        json.dumps(decision.scores),
        decision.stop_reason,
    )
    if memo is not None and key is not None:
        memo.put(key, step)
    return step


def _plain_view(
    rt: StudyRuntime, session_id: int, item_id: int | None, stop_reason: str | None, n: int
) -> SessionView:
    """The view after ``n`` questions posed, whose next decision chose ``item_id``."""
    if item_id is None:
        return SessionView(
            session_id=session_id,
            study_slug=rt.slug,
            status=SessionStatus.completed.value,
            phase="done",
            n_posed=n,
            max_questions=rt.max_questions,
            allow_skip=rt.allow_skip,
            question=None,
            stop_reason=stop_reason,
        )
    return SessionView(
        session_id=session_id,
        study_slug=rt.slug,
        status=SessionStatus.active.value,
        phase="question",
        n_posed=n,
        max_questions=rt.max_questions,
        allow_skip=rt.allow_skip,
        question=_question_view(rt.by_id[item_id], n + 1),
        stop_reason=None,
    )


def _submit_locked(
    rt: StudyRuntime,
    session_id: int,
    item: ItemInfo,
    option: str | None,
    idempotency_key: str | None,
    engine: Engine,
) -> SessionView:
    """The general case under the session's lock (retries, conflicts, races, replays)."""
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
        respondent = db.get(Respondent, sess.respondent_id)
        assert respondent is not None
        state = current_state(rt, sess, respondent, answers)
        if option is not None:
            idx = [o[0] for o in item.options].index(option)
            state = rt.model.update(state, rt.model_index[item.id], idx)
        answers.append(row)
        decision = _decide(rt, state, session_id, answers).to_row()
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
