"""The pure session transition that a live study calls after every answer.

Given a fitted model, the respondent's current state and what was asked or skipped,
:func:`decide` returns the next question (or why to stop) together with every
candidate's score, so that "why this question" can be stored and shown.
:func:`replay_state` rebuilds a state from stored answers; a cached state must equal it.

Nothing here touches a database: the web app stores the answer first, replays or updates
the state, calls :func:`decide`, then stores the decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elicitation.budget import Budget, StopReason
from elicitation.criteria import (
    ExpectedInformationGain,
    SelectionCriterion,
    best_index,
    mean_target_entropy,
)
from elicitation.errors import SessionError
from models.base import MISSING, BeliefModel


@dataclass(frozen=True)
class Decision:
    """The outcome of one selection step.

    Attributes:
        item: the item to ask next, or ``None`` when the session stops.
        stop_reason: why it stops (``None`` when an item is asked).
        scores: each remaining candidate's score under the criterion (higher = better).
        target_entropy: current mean target predictive entropy (nats; ``None``
            without targets).
        expected_target_entropy: expected mean target entropy after the chosen item's
            answer (``None`` when stopping or without targets).
        best_gain: the best expected information gain about the targets over the
            remaining candidates, when it was computed (EIG criterion, or a gain threshold).
        criterion: the criterion's name; ``criterion_params`` its parameters.
    """

    item: int | None
    stop_reason: StopReason | None
    scores: dict[int, float]
    target_entropy: float | None
    expected_target_entropy: float | None
    best_gain: float | None
    criterion: str
    criterion_params: dict[str, Any] = field(default_factory=dict)

    @property
    def stopped(self) -> bool:
        return self.item is None

    def to_dict(self, item_keys: Sequence[str] | None = None) -> dict[str, Any]:
        """JSON-able form; items are written as keys when ``item_keys`` is given."""

        def name(i: int) -> int | str:
            return item_keys[i] if item_keys is not None else i

        return {
            "item": None if self.item is None else name(self.item),
            "stop_reason": None if self.stop_reason is None else str(self.stop_reason),
            "scores": {str(name(i)): s for i, s in self.scores.items()},
            "target_entropy": self.target_entropy,
            "expected_target_entropy": self.expected_target_entropy,
            "best_gain": self.best_gain,
            "criterion": self.criterion,
            "criterion_params": self.criterion_params,
        }


def _items(model: BeliefModel, items: Iterable[int], what: str) -> list[int]:
    out: list[int] = []
    seen: set[int] = set()
    n = model.item_bank.n_items
    for raw in items:
        i = int(raw)
        if not 0 <= i < n:
            raise SessionError(f"{what}: unknown item index {i} (the model has {n} items)")
        if i not in seen:
            seen.add(i)
            out.append(i)
    return out


def decide(
    model: BeliefModel,
    state: Any,
    *,
    asked: Iterable[int],
    skipped: Iterable[int] = (),
    candidates: Iterable[int],
    targets: Iterable[int],
    criterion: SelectionCriterion,
    budget: Budget,
) -> Decision:
    """Choose the next item for one respondent, or decide to stop.

    Args:
        model: the fitted belief model.
        state: the respondent's state (``model.initial_state`` + answers).
        asked: items answered in this session.
        skipped: items posed and skipped (no update; never asked again).
        candidates: the study's askable items (the whole pool, in study order).
        targets: the study's target items (what the answers should predict).
        criterion: scores the remaining candidates.
        budget: how many questions, and when to stop early (see :mod:`elicitation.budget`).

    Returns:
        The :class:`Decision`; ties between scores go to the earlier candidate.

    Raises:
        SessionError: an unknown item, an item both asked and skipped, a target that is
            also a candidate, or a threshold on target quantities without targets.
    """
    asked_l = _items(model, asked, "asked")
    skipped_l = _items(model, skipped, "skipped")
    pool = _items(model, candidates, "candidates")
    tgt = _items(model, targets, "targets")
    both = sorted(set(asked_l) & set(skipped_l))
    if both:
        raise SessionError(f"items {both} are both answered and skipped")
    overlap = sorted(set(pool) & set(tgt))
    if overlap:
        raise SessionError(f"items {overlap} are both candidates and targets")
    if not tgt and (
        budget.stop_eig_threshold is not None or budget.stop_entropy_threshold is not None
    ):
        raise SessionError("the budget's stopping thresholds need at least one target item")

    done = set(asked_l) | set(skipped_l)
    remaining = [c for c in pool if c not in done]
    n_posed = len(done)
    h_now = float(mean_target_entropy(model.predict(state, tgt))) if tgt else None
    name, params = criterion.name, criterion.params()

    forced = budget.forced_stop(n_posed, len(remaining))
    if forced is not None:
        return Decision(None, forced, {}, h_now, None, None, name, params)

    criterion.prepare(model, pool, tgt)
    scores, gains = criterion.score_with_gains(model, state, remaining, tgt)
    best = best_index(scores)
    item = remaining[best]
    score_map = {c: float(s) for c, s in zip(remaining, scores.tolist(), strict=True)}

    if gains is None and budget.needs_gain:
        gains = ExpectedInformationGain().score(model, state, remaining, tgt)
    best_gain = float(gains.max()) if gains is not None else None
    if not tgt:
        chosen_gain = None
    elif gains is not None:
        chosen_gain = float(gains[best])
    else:
        chosen_gain = float(ExpectedInformationGain().score(model, state, [item], tgt)[0])

    stop = budget.check(n_posed, len(remaining), target_entropy=h_now, best_gain=best_gain)
    if stop is not None:
        return Decision(None, stop, score_map, h_now, None, best_gain, name, params)
    expected = None if (h_now is None or chosen_gain is None) else h_now - chosen_gain
    return Decision(item, None, score_map, h_now, expected, best_gain, name, params)


def replay_state(
    model: BeliefModel,
    attributes: Mapping[int, int] | None,
    answers: Sequence[tuple[int, int | None]],
) -> Any:
    """The state after the stored ``answers`` in order (``None`` or ``-1`` = skipped).

    Equals the state obtained by calling ``model.update`` after each answer; a skipped
    question changes nothing.

    Raises:
        SessionError: an item answered (or skipped) twice.
    """
    state = model.initial_state(dict(attributes) if attributes else None)
    seen: set[int] = set()
    for item, option in answers:
        i = int(item)
        if i in seen:
            raise SessionError(f"item {i} appears twice in the stored answers")
        seen.add(i)
        if option is None or int(option) == MISSING:
            continue
        state = model.update(state, i, int(option))
    return state
