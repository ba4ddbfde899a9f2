"""The one interface every backend implements, and the registry of backends by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from inference_server.errors import InferenceError
from inference_server.prompts import (
    DEFAULT_MASS_THRESHOLD,
    DEFAULT_TEMPLATE,
    LetterScore,
    PromptItem,
    PromptTemplate,
)


@dataclass(frozen=True)
class ScoreRequest:
    """One persona × item pair to score.

    Attributes:
        persona: the persona text (verbatim; it becomes the system message).
        item: the item with its options.
    """

    persona: str
    item: PromptItem


class Backend(ABC):
    """Turns persona × item pairs into answer distributions (:class:`LetterScore`).

    Implementations read the next-token probabilities of the option letters after the
    chat-templated prompt (see :mod:`inference_server.prompts`); they never generate text
    and never return a distribution they could not read in full — they raise
    :class:`~inference_server.errors.BackendError` instead.

    Attributes:
        name: the registry name (``"local"``, ``"openai"``).
        model_id: identifies the weights; part of a stored distribution's key.
        template: the prompt template (its ``version_id`` is part of the key).
        threshold: pairs with valid-letter mass below it are flagged.
    """

    name: ClassVar[str] = ""

    def __init__(
        self,
        *,
        model_id: str,
        template: PromptTemplate = DEFAULT_TEMPLATE,
        threshold: float = DEFAULT_MASS_THRESHOLD,
    ) -> None:
        if not 0 <= threshold <= 1:
            raise InferenceError(f"mass threshold must be in [0, 1], got {threshold}")
        self.model_id = model_id
        self.template = template
        self.threshold = threshold

    @abstractmethod
    def score(self, requests: Sequence[ScoreRequest]) -> list[LetterScore]:
        """The distribution of each request, in request order."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (HTTP clients, model memory)."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_BACKENDS: dict[str, Callable[..., Backend]] = {}


def register_backend(name: str) -> Callable[[Callable[..., Backend]], Callable[..., Backend]]:
    """Decorator: make a backend class constructible by :func:`make_backend` as ``name``."""

    def deco(cls: Callable[..., Backend]) -> Callable[..., Backend]:
        _BACKENDS[name] = cls
        return cls

    return deco


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def make_backend(name: str, **kwargs: Any) -> Backend:
    """Construct the backend registered as ``name`` with ``kwargs``.

    Raises:
        InferenceError: an unknown name (the message lists the known ones).
    """
    if name not in _BACKENDS:
        raise InferenceError(f"unknown backend {name!r} (known: {', '.join(backend_names())})")
    return _BACKENDS[name](**kwargs)
