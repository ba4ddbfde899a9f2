"""The app side of "which question next": one selection step for a session.

:func:`decide_next` runs :func:`elicitation.session.decide` on a belief state with the
study runtime's candidates, targets, criterion object (:func:`criterion_for`) and budget,
and returns the ``selection_decision`` row's values (:class:`~app.session.sql.DecisionRow`)
with every candidate's score. :func:`model_step` is the answer's whole model step (update
the state with the answer, then :func:`decide_next`), read from and written to the step
memo; :func:`first_state_and_decision` is the prior state and first decision of a start,
cached per attribute set.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from app.session.errors import StudyMisconfiguredError
from app.session.memo import MemoStep, StepMemo
from app.session.runtime import ItemInfo, StudyRuntime
from app.session.sql import AnswerRow, DecisionRow
from app.session.state import attribute_indices, dump_state, known_answers, load_state
from app.tables import Answer
from elicitation.budget import Budget
from elicitation.criteria import get_criterion
from elicitation.errors import ElicitationError
from elicitation.session import decide, replay_state


def _budget(rt: StudyRuntime) -> Budget:
    """The study's stopping rules as the adaptive selection step takes them: the last
    :attr:`~app.session.runtime.StudyRuntime.calibration_items` places of ``max_questions``
    are left to the calibration."""
    b = rt.settings.budgets
    adaptive = b.max_questions - rt.calibration_items
    return Budget(
        max_questions=adaptive,
        min_questions=min(b.min_questions, adaptive),
        stop_eig_threshold=b.stop_eig_threshold,
        stop_entropy_threshold=b.stop_entropy_threshold,
    )


CALIBRATION = "calibration"
"""The criterion recorded in a calibration question's decision."""


def calibration_start(rt: StudyRuntime) -> int | None:
    """The first calibration place: ``max_questions - calibration_items``, or the number
    of candidates when there are fewer (the adaptive part has asked them all); ``None``
    without calibration questions (none set, or every item observed
    ``calibration_min_answers`` times: :attr:`~app.session.runtime.StudyRuntime.calibration_items`)."""
    n_cal = rt.calibration_items
    if not n_cal:
        return None
    return min(rt.settings.budgets.max_questions - n_cal, len(rt.candidates))


def calibration_decision(
    rt: StudyRuntime, sess_id: int, answers: Sequence[Answer | AnswerRow]
) -> DecisionRow | None:
    """The calibration question at position ``len(answers)``, or ``None`` when this is not
    a calibration place.

    With ``calibration_items = c`` and ``max_questions = m``, places ``m - c .. m - 1``
    (earlier when the study has fewer than ``m - c`` candidates: :func:`calibration_start`)
    ask an item chosen uniformly at random among the question and target items the model
    knows that were not posed yet and are still
    :attr:`~app.session.runtime.StudyRuntime.under_observed` (among all the unposed ones
    when the respondent was asked every under-observed item already); the pool is in study
    order and the draw is seeded by the session and its answers so far: respondents who
    answer alike get different items, and a replay of the session gets the same pick.
    Nothing left to ask stops the session. Example: ``m = 10, c = 1``: nine adaptive
    questions, then one random item, a target if only the targets have fewer than
    ``calibration_min_answers`` answers.
    """
    start = calibration_start(rt)
    position = len(answers)
    if start is None or position < start:
        return None
    scores: dict[str, Any] = {"model_id": rt.model_id, "calibration": True}
    if position >= rt.max_questions:
        return DecisionRow(sess_id, position, None, CALIBRATION, scores, "max_questions")
    posed = {a.item_id for a in answers}
    pool = [it.id for it in rt.under_observed if it.id not in posed] or [
        it.id for it in rt.candidates + rt.targets if it.id not in posed
    ]
    if not pool:
        return DecisionRow(sess_id, position, None, CALIBRATION, scores, "no items left")
    seed = hashlib.sha256(
        json.dumps([sess_id, [[a.item_id, a.option] for a in answers]]).encode()
    ).digest()
    pick = pool[int.from_bytes(seed[:8], "big") % len(pool)]
    scores["pool"] = len(pool)
    return DecisionRow(sess_id, position, pick, CALIBRATION, scores, None)


def criterion_for(rt: StudyRuntime, session_id: int, position: int, seed: int | None = None) -> Any:
    """The study's criterion: the runtime's object (built once, holding any stored fixed
    order); ``random`` gets a seed per session and position (recorded in the decision's
    ``criterion_params``, so every order can be reproduced)."""
    if rt.criterion == "random":
        return get_criterion(
            "random", seed=seed if seed is not None else session_id * 1009 + position
        )
    if rt.selector is not None:
        return rt.selector
    return get_criterion(rt.criterion)


def decide_next(
    rt: StudyRuntime,
    state: Any,
    sess_id: int,
    answers: Sequence[Answer | AnswerRow],
    seed: int | None = None,
) -> DecisionRow:
    """The decision after ``answers`` (position ``len(answers)``) from ``state``.

    Args:
        state: the belief state after the attributes and ``answers``.
        answers: the session's answers so far (anything with ``item_id`` and ``option``;
            ``option`` ``None`` is a skip).
        seed: the ``random`` criterion's seed (default: from session and position).

    Returns:
        The decision's column values (not stored): the chosen item id or ``None`` with a
        stop reason, the criterion used, and in ``scores`` every candidate's score, the
        target entropies, the criterion's parameters and the model id.

    Raises:
        StudyMisconfiguredError: the selection step refused the study's setup.
    """
    calibration = calibration_decision(rt, sess_id, answers)
    if calibration is not None:
        return calibration
    known = known_answers(rt, answers)
    asked = [idx for idx, a in known if a.option is not None]
    skipped = [idx for idx, a in known if a.option is None]
    try:
        decision = decide(
            rt.model,
            state,
            asked=asked,
            skipped=skipped,
            candidates=[rt.model_index[c.id] for c in rt.candidates],  # type: ignore[index]
            targets=[rt.model_index[t.id] for t in rt.targets],  # type: ignore[index]
            criterion=criterion_for(rt, sess_id, len(answers), seed),
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


def first_state_and_decision(
    rt: StudyRuntime, attributes: Mapping[str, str]
) -> tuple[Any, DecisionRow]:
    """The prior state given the attributes, and the first decision (not stored yet).

    Both are a function of the runtime (model, items, criterion, budget) and the known
    attributes only, so they are computed once per attribute set and runtime and then
    copied (:data:`FIRST_DECISIONS_MAX` sets per runtime): a burst of session starts then
    costs no model work. Not for ``random``, whose first pick is seeded per session.
    """
    key = tuple(sorted(attributes.items()))
    cache = rt.criterion != "random"
    hit = rt.first_decisions.get(key) if cache else None
    if hit is not None:
        state, decision = hit
        return state, replace(decision, scores=dict(decision.scores))
    state = replay_state(rt.model, attribute_indices(rt, attributes), [])
    decision = decide_next(rt, state, 0, [], seed=secrets.randbelow(2**31))
    if cache and len(rt.first_decisions) < FIRST_DECISIONS_MAX:
        rt.first_decisions[key] = (state, replace(decision, scores=dict(decision.scores)))
    return state, decision


FIRST_DECISIONS_MAX = 1024
"""Attribute sets whose first decision one study runtime keeps (beyond it, computed each
time; the runtime itself is rebuilt every
:data:`app.session.runtime.RUNTIME_TTL_S` seconds)."""


def model_step(
    rt: StudyRuntime,
    state_before: bytes,
    session_id: int,
    answers: Sequence[AnswerRow],
    item: ItemInfo,
    option: str | None,
) -> MemoStep:
    """An answer's model step: ``state_before`` (stored bytes) updated with the answer
    ``option`` to ``item`` (the last of ``answers``), and the next decision.

    Read from the runtime's :class:`~app.session.memo.StepMemo` when this step was computed
    before, else computed and stored there; either way the result is the same bytes (the
    step is a pure function of its inputs and the study design; at a calibration place the
    pick is drawn for ``session_id``, :func:`calibration_decision`)."""
    memo = rt.step_memo
    key = None
    if memo is not None:
        pairs = [(idx, a.option) for idx, a in known_answers(rt, answers)]
        key = StepMemo.key(state_before, pairs)
        hit = memo.get(key)
        if hit is not None:
            return _own_calibration(rt, hit, session_id, answers)
    state = load_state(state_before)
    if option is not None:
        idx = [o[0] for o in item.options].index(option)
        state = rt.model.update(state, rt.model_index[item.id], idx)
    decision = decide_next(rt, state, session_id, answers)
    step = MemoStep(
        dump_state(state),
        decision.item_id,
        decision.criterion,
        json.dumps(decision.scores),
        decision.stop_reason,
    )
    if memo is not None and key is not None:
        memo.put(key, step)
    return step


def _own_calibration(
    rt: StudyRuntime, step: MemoStep, session_id: int, answers: Sequence[AnswerRow]
) -> MemoStep:
    """``step`` from the memo, its decision drawn again for this session at a calibration
    place (the memo holds the draw of the session that computed the step)."""
    calibration = calibration_decision(rt, session_id, answers)
    if calibration is None:
        return step
    return replace(
        step,
        item_id=calibration.item_id,
        criterion=calibration.criterion,
        scores_json=json.dumps(calibration.scores),
        stop_reason=calibration.stop_reason,
    )
