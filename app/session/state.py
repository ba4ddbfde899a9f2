"""Belief states: their stored bytes, and their replay from the stored answers.

The source of truth of a session is its respondent's stored attributes and answers;
:func:`replay` rebuilds the state from them (:func:`elicitation.session.replay_state`).
``elicitation_session.state`` caches the state after ``state_version`` answers
(:func:`dump_state` / :func:`load_state`), and :func:`current_state` uses the cache only
when ``state_version`` equals the number of stored answers.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from sqlmodel import Session, select

from app.session.errors import SessionNotFoundError
from app.session.runtime import StudyRuntime
from app.tables import Answer, ElicitationSession, Respondent
from elicitation.session import replay_state


def _tensor_from_numpy(array: Any) -> torch.Tensor:
    return torch.from_numpy(array)


class _StatePickler(pickle.Pickler):
    """Pickles tensors as numpy arrays (bit-exact, and several times faster to load)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and not obj.requires_grad:
            return _tensor_from_numpy, (obj.detach().contiguous().numpy(),)
        return NotImplemented


_REDUCER_PATHS = frozenset(
    {("app.session.state", "_tensor_from_numpy"), ("app.services.sessions", "_tensor_from_numpy")}
)
"""The module paths under which stored states name :func:`_tensor_from_numpy` (states in
a database keep the path of the module that wrote them)."""


class _StateUnpickler(pickle.Unpickler):
    """Loads what :class:`_StatePickler` wrote, whichever path names the tensor reducer."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _REDUCER_PATHS:
            return _tensor_from_numpy
        return super().find_class(module, name)


def dump_state(state: Any) -> bytes:
    """The bytes stored in ``elicitation_session.state`` for ``state``."""
    buf = io.BytesIO()
    _StatePickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    return buf.getvalue()


def load_state(blob: bytes) -> Any:
    """The state :func:`dump_state` wrote (bit for bit the same tensors)."""
    # The blob was written by this module into the app's own database (never client input).
    return _StateUnpickler(io.BytesIO(blob)).load()  # noqa: S301


def attribute_indices(rt: StudyRuntime, attributes: Mapping[str, str]) -> dict[int, int]:
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


def answers_of(session: Session, session_id: int) -> list[Answer]:
    """The stored answers of a session, in the order they were stored."""
    return list(
        session.exec(
            select(Answer).where(Answer.session_id == session_id).order_by(Answer.id)  # type: ignore[arg-type]
        ).all()
    )


def respondent_and_answers(
    session: Session, sess: ElicitationSession
) -> tuple[Respondent, list[Answer]]:
    """The respondent of ``sess`` and its stored answers, for a reader of the session.

    The answers are read first, then the respondent (by a query, never from the identity
    map). :func:`app.session.erasure.erase_respondent` deletes both in one transaction, so
    a respondent still found means the answers were read before any erasure committed:
    the pair is the session as it was. An erasure committed in between (the caller's
    authorization read the session before it) leaves no respondent.

    Raises:
        SessionNotFoundError: the session was erased (404).
    """
    answers = answers_of(session, sess.id or 0)
    respondent = session.exec(select(Respondent).where(Respondent.id == sess.respondent_id)).first()
    if respondent is None:
        raise SessionNotFoundError(f"no session {sess.id}")
    return respondent, answers


def known_answers(rt: StudyRuntime, answers: Sequence[Any]) -> list[tuple[int, Any]]:
    """``[(model item index, answer), ...]`` of the ``answers`` whose item the model knows.

    An answer to an item the model does not know (its options changed since the model was
    fitted: see :attr:`StudyRuntime.model_index`) tells the model nothing and is left out.
    """
    return [(rt.model_index[a.item_id], a) for a in answers if a.item_id in rt.model_index]


def answer_pairs(rt: StudyRuntime, answers: Sequence[Any]) -> list[tuple[int, int | None]]:
    """``[(model item index, option index or None for a skip), ...]`` of
    :func:`known_answers`."""
    pairs: list[tuple[int, int | None]] = []
    for idx, a in known_answers(rt, answers):
        item = rt.by_id[a.item_id]
        if a.option is None:
            pairs.append((idx, None))
        else:
            pairs.append((idx, [o[0] for o in item.options].index(a.option)))
    return pairs


def replay(rt: StudyRuntime, respondent: Respondent, answers: Sequence[Answer]) -> Any:
    """The state from the stored attributes and answers (the source of truth)."""
    return replay_state(
        rt.model, attribute_indices(rt, respondent.attributes), answer_pairs(rt, answers)
    )


def current_state(
    rt: StudyRuntime, sess: ElicitationSession, respondent: Respondent, answers: Sequence[Answer]
) -> Any:
    """The cached state when it is current (``state_version == len(answers)``), else the replay."""
    if sess.state is not None and sess.state_version == len(answers):
        return load_state(sess.state)
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
