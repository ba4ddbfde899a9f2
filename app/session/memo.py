"""The step memo: answer steps already computed, shared by respondents of one study design.

A step (update the state with an answer, choose the next question) is a pure function of
the state before, the answers so far and the answer, once the study design is fixed (the
model, items, criterion, budgets and stored fixed orders: the key of :func:`step_memo_for`).
Respondents who gave the same answers share their steps: the adaptive design is a decision
tree, grown here on demand. :func:`app.session.decide.model_step` reads and fills it.

Example: with two-option questions a 10-question session has at most ``2**k`` histories at
depth ``k``, so a busy study soon computes no step twice.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MemoStep:
    """What :func:`app.session.decide.model_step` computes from a state and an answer: the new state's bytes
    and the next decision's stored columns (``scores`` already as JSON)."""

    state: bytes
    item_id: int | None
    criterion: str
    scores_json: str
    stop_reason: str | None


class StepMemo:
    """The answer steps one process has computed for one study design, least recently
    used first out beyond ``max_entries``.

    A step is a pure function of the state before, the answers so far and the answer: the
    model, items, criterion and budgets are fixed by the design (the key of
    :func:`step_memo_for`), and no criterion that uses the memo draws random numbers (the
    ``random`` criterion gets no memo). With many options or many attribute sets the deep
    steps rarely repeat and the memo costs one dictionary look-up and ``max_entries`` x
    ~5 KB. The stored bytes are those the step computed, so a session's cached state stays
    bit for bit the replay of its answers.

    Key: ``(blake2b of the state before, ((model item, option or None), ...) of the
    answers so far and this one)``.
    """

    def __init__(self, max_entries: int) -> None:
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


STEP_MEMO_DEFAULT = 2048
"""Answer steps a process keeps per study design unless configured (the setting
``step_memo_size``; 0 = none): about 5 KB each with the CES demo's 516-class model."""
STEP_MEMO_STATS = {"hits": 0, "misses": 0}


class _DesignMemos:
    """The process's step memos, one per study design (the first made goes first beyond
    ``max_designs``), each holding at most ``max_entries`` steps."""

    def __init__(self, max_entries: int, max_designs: int = 8) -> None:
        self.max_entries = max_entries
        self.max_designs = max_designs
        self._memos: dict[tuple[Any, ...], StepMemo] = {}
        self._lock = threading.Lock()

    def resize(self, max_entries: int) -> bool:
        """Set ``max_entries``; a new size forgets every memo. Returns whether it changed."""
        with self._lock:
            if max_entries == self.max_entries:
                return False
            self.max_entries = max_entries
            self._memos.clear()
            return True

    def get(self, design: tuple[Any, ...]) -> StepMemo | None:
        """The memo of ``design`` (created on first use), ``None`` when memos are off."""
        if self.max_entries <= 0:
            return None
        with self._lock:
            memo = self._memos.get(design)
            if memo is None:
                if len(self._memos) >= self.max_designs:
                    self._memos.pop(next(iter(self._memos)))
                memo = self._memos[design] = StepMemo(self.max_entries)
            return memo


_MEMOS = _DesignMemos(STEP_MEMO_DEFAULT)


def step_memo_size() -> int:
    """The steps each study design's memo keeps now (0: no memo)."""
    return _MEMOS.max_entries


def set_step_memo_size(max_entries: int) -> bool:
    """Set the steps each design's memo keeps; a new size forgets every memo. Returns
    whether the size changed (then the runtimes holding the old memos must go too:
    :func:`app.session.runtime.configure_step_memo`)."""
    return _MEMOS.resize(max_entries)


def step_memo_for(design: tuple[Any, ...]) -> StepMemo | None:
    """The process's memo for a study design (created on first use; ``None`` when the
    memo is off). ``design`` holds everything a step depends on besides its inputs: the
    model's id and training hash, the criterion, the pool, the targets, the items' options
    and model positions, the budgets and the stored fixed orders."""
    return _MEMOS.get(design)
