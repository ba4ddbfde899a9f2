"""The study runtime: what a live session of one study needs, assembled once per process.

:func:`load_runtime` reads the study's items, its active fitted model and the fixed orders
stored with it, and builds a :class:`StudyRuntime`: the items the model knows split by role
(attributes, askable candidates, targets), the criterion object (:func:`criterion_selector`)
and the step memo of the study design. Runtimes are cached per process for
:data:`RUNTIME_TTL_S` seconds and rebuilt by one request at a time (single flight).

Criterion fallbacks (recorded in every decision, so each explanation shows them):

* a target-based criterion (:data:`TARGET_CRITERIA`) in a study without target items is
  replaced by :data:`FALLBACK_CRITERION`;
* an order-based criterion (``eig_anchored``, ``fixed``) without a stored fixed order for
  the model, pool and targets is replaced by :data:`ORDER_FALLBACK_CRITERION` while a
  ``fixed_order`` job computes the order (the runtime reports its key);
* ``random`` has no prebuilt object (it is seeded per decision), and a name the registry
  refuses is left to the decision to report.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

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
    model_ref,
    request_fixed_order,
    stored_fixed_orders,
    stored_item_answers,
)
from app.session.errors import StudyMisconfiguredError
from app.session.memo import StepMemo, set_step_memo_size, step_memo_for
from app.session.sql import DecisionRow, StudyHead
from app.tables import FittedModel, Item, ItemRole, Study
from elicitation.criteria import get_criterion
from elicitation.errors import ElicitationError

FALLBACK_CRITERION = "posterior_entropy"
"""Used instead of a target-based criterion when a study has no target items (recorded as
the decision's criterion, so it is visible in every explanation)."""
TARGET_CRITERIA = frozenset({"eig", "eig_anchored", "eig_tempered", "eig2", "fixed"})
"""Criteria that score the targets: replaced by :data:`FALLBACK_CRITERION` without any."""
ORDER_FALLBACK_CRITERION = "eig"
"""Used while an order-based criterion (``eig_anchored``, ``fixed``) has no stored fixed
order for the study's model, pool and targets (the order is being computed by a
``fixed_order`` job); the decision records ``eig`` and ``requested_criterion``."""


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
        item_answers: item id -> observed answers in the data the model was fitted on
            (``None`` for a model stored without them: counted as learned).
        first_decisions: the prior state and first decision per set of known attributes
            (:func:`app.session.decide.first_state_and_decision`; lives as long as this runtime).
        step_memo: the answer steps already computed for this study design
            (:class:`~app.session.memo.StepMemo`; shared by the runtimes of the same design, so it outlives
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
    item_answers: Mapping[int, int] | None = None
    first_decisions: dict[tuple[tuple[str, str], ...], tuple[Any, DecisionRow]] = field(
        default_factory=dict, repr=False, compare=False
    )
    step_memo: StepMemo | None = field(default=None, repr=False, compare=False)

    @cached_property
    def under_observed(self) -> list[ItemInfo]:
        """The question and target items with fewer than ``calibration_min_answers``
        observed answers in the model's data, in study order: all of them with a
        threshold of 0, none without counts (a model stored without them counts as
        learned). Computed once per runtime (the answer loop reads it at every step).

        Example: threshold 300 and counts ``{1: 500, 2: 40}`` give the item with id 2."""
        pool = self.candidates + self.targets
        floor = self.settings.calibration_min_answers
        if not floor:
            return pool
        if self.item_answers is None:
            return []
        return [it for it in pool if self.item_answers.get(it.id, 0) < floor]

    @cached_property
    def calibration_items(self) -> int:
        """The calibration places of a session started now: the study's
        ``calibration_items`` while some item is :attr:`under_observed` (else 0), at most
        ``max_questions - 1``.

        Example: ``calibration_items = 2``, ``max_questions = 10``, a target with 40 answers
        and ``calibration_min_answers = 300``: 2 (8 adaptive questions, then 2 calibration).
        """
        n_cal = min(self.settings.calibration_items, self.settings.budgets.max_questions - 1)
        return n_cal if n_cal > 0 and self.under_observed else 0

    @property
    def max_questions(self) -> int:
        """The most questions one respondent can be asked (budget, capped by the pool:
        the candidates, then up to :attr:`calibration_items` calibration questions, which
        may also be targets; no item is asked twice).

        Example: 4 candidates, 2 targets, ``max_questions = 10`` and 5 calibration items:
        6 (at most 4 adaptive questions, and the calibration draws the rest of the 6)."""
        m, n_cal = self.settings.budgets.max_questions, self.calibration_items
        if not n_cal:
            return min(m, len(self.candidates))
        pool = len(self.candidates) + len(self.targets)
        return min(m, min(m - n_cal, len(self.candidates)) + n_cal, pool)

    @property
    def allow_skip(self) -> bool:
        """Whether a respondent may answer "prefer not to answer"."""
        return self.settings.budgets.allow_skip


def study_settings(study: Study | StudyHead) -> StudySettings:
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
    fit_if_missing: bool = False,
    model_id: int | None = None,
) -> StudyRuntime:
    """Assemble the study's runtime with its active model (or the model ``model_id``).

    Give ``session`` or ``engine`` (with an engine, a session is opened only to rebuild the
    runtime, and closed before the model is deserialised, so no pooled connection is held
    during CPU work). ``fit_if_missing`` (scripts and tests only: a request never fits)
    fits the default model first when there is none; it needs the study's ORM row.
    ``model_id``: the stored model of a session in progress (:func:`session_runtime`); a
    model that is not the study's (or no longer stored) gives the active one.

    One build per key at a time (single flight): when the cached runtime is older than
    :data:`RUNTIME_TTL_S`, one request rebuilds it while concurrent requests keep using the
    previous one; without any cached runtime, concurrent requests wait for the one build.

    Raises:
        NoModelError: no active fitted model and ``fit_if_missing`` is false (or only a
            study head was given) (409 ``no_model``).
    """
    assert study.id is not None
    bind = engine if engine is not None else session.get_bind().engine  # type: ignore[union-attr]
    key = runtime_key(bind, study, model_id)
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
                ref, model, blob, items, metrics = runtime_rows(study, db, fit_if_missing, model_id)
        else:
            ref, model, blob, items, metrics = runtime_rows(
                study, session, fit_if_missing, model_id
            )
        if model is None:  # deserialised with no connection held (CPU work)
            model = model_from_blob(ref, blob)  # type: ignore[arg-type]
        rt = build_runtime(study, ref, model, items, metrics)
        with _RUNTIME_LOCK:
            if len(_RUNTIME_CACHE) > 256:
                _RUNTIME_CACHE.clear()
            _RUNTIME_CACHE[key] = (time.monotonic(), rt)
        if rt.missing_order_key is not None:
            request_fixed_order(rt.study_id, rt.missing_order_key, engine=bind)
        return rt
    finally:
        build_lock.release()


def runtime_key(
    bind: Engine, study: StudyHead | Study, model_id: int | None = None
) -> tuple[str, int, str]:
    """The cache key of a study's runtime: database, study id, and its settings, status
    and slug (a change of any of them builds a new runtime at once), and the pinned model
    of :func:`session_runtime` (none for the active model)."""
    return (
        str(bind.url),  # one process may serve (or test) several databases
        study.id or 0,
        json.dumps(study.settings, sort_keys=True)
        + study.status
        + study.slug
        + ("" if model_id is None else f"#model={model_id}"),
    )


def session_runtime(
    rt: StudyRuntime,
    study: Study | StudyHead,
    model_id: int | None,
    *,
    session: Session | None = None,
    engine: Engine | None = None,
) -> StudyRuntime:
    """The runtime of a session in progress: ``rt`` (the study's active runtime) when the
    session's stored ``model_id`` is that model or not set yet, else the runtime of the
    session's own model, so that a session keeps the model it started with when a refit
    promotes another one (its cached states belong to that model)."""
    if model_id is None or model_id == rt.model_id:
        return rt
    return load_runtime(study, session=session, engine=engine, model_id=model_id)


def peek_runtime(study: StudyHead | Study, *, engine: Engine) -> tuple[StudyRuntime | None, bool]:
    """``(the study's cached runtime or None, whether it is fresh)``: no I/O, never
    blocks. A stale runtime may still serve while :func:`load_runtime` rebuilds it (the
    same rule as :func:`load_runtime`'s own single flight)."""
    with _RUNTIME_LOCK:
        hit = _RUNTIME_CACHE.get(runtime_key(engine, study))
    if hit is None:
        return None, False
    return hit[1], time.monotonic() - hit[0] < RUNTIME_TTL_S


def runtime_rows(
    study: Study | StudyHead, session: Session, fit_if_missing: bool, model_id: int | None = None
) -> tuple[Any, Any, bytes | None, list[ItemInfo], dict[str, Any]]:
    """The model's reference (``model_id`` when it is a model of the study, else the active
    one, fitting one first if allowed and needed), the model if this process has it
    already or else its blob, the study's items and the model row's metrics (its fixed
    orders and observed answers per item): everything read from the database for a
    runtime."""
    ref = None
    if model_id is not None:
        ref = model_ref(study.id, model_id, session=session)
    if ref is None:
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
    return ref, model, blob, items, dict(metrics or {})


def model_item_index(bank: Any, items: list[ItemInfo]) -> dict[int, int]:
    """``{item id: index in bank}`` of the items the model knows: same key and the same
    number of options (the others cannot be asked or predicted with this model).

    Example: a bank ``("a", "b")`` with 2 options each and items ``a`` (2 options, id 7),
    ``b`` (3 options, id 8), ``c`` (id 9) gives ``{7: 0}``.
    """
    known = dict(zip(bank.keys, bank.n_options, strict=True))
    return {
        it.id: bank.index(it.key)
        for it in items
        if it.id is not None and known.get(it.key) == len(it.options)
    }


def build_runtime(
    study: Study | StudyHead,
    ref: Any,
    model: Any,
    items: list[ItemInfo],
    metrics: Mapping[str, Any] | None = None,
) -> StudyRuntime:
    """The runtime of ``study`` from its rows (no I/O); ``metrics`` are the model row's
    (its stored fixed orders and observed answers per item).

    Items count for the model when it knows their key with the same number of options;
    the criterion follows the fallbacks of this module's overview, and the step memo is the
    one of this exact design (model, criterion, pool, targets, options, budgets, orders).
    """
    orders = stored_fixed_orders(metrics)
    answers_by_key = stored_item_answers(metrics)
    bank = model.item_bank
    model_index = model_item_index(bank, items)
    in_model = [it for it in items if it.id in model_index]
    targets = [it for it in in_model if it.role == ItemRole.target.value]
    settings = study_settings(study)
    criterion = settings.criterion
    if not targets and criterion in TARGET_CRITERIA:
        criterion = FALLBACK_CRITERION
    candidates = [it for it in in_model if it.role == ItemRole.question.value]
    selector, used, missing = criterion_selector(
        criterion, model, ref, candidates, targets, model_index, orders or {}
    )
    item_answers = (
        None
        if answers_by_key is None
        else {it.id: answers_by_key.get(it.key, 0) for it in in_model}
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
        settings.calibration_items,
        settings.calibration_min_answers,
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
        item_answers=item_answers,
        step_memo=None if selector is None else step_memo_for(design),
    )


def criterion_selector(
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


def configure_step_memo(max_entries: int) -> None:
    """Set the step memo's size per study design (the app's ``step_memo_size`` setting;
    0 turns it off); a new size forgets the memos and the runtimes holding them."""
    if set_step_memo_size(max_entries):
        clear_runtime_cache()
