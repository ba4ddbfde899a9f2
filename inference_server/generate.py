"""Resumable generation of persona × item distributions into a store.

Every distribution is stored under :class:`PairKey` ``(model id, template version, persona
hash, item hash)``. :func:`generate` asks the store which keys it already has, scores only
the others, chunk by chunk, and saves each chunk as soon as it is scored (one
transaction per chunk in a database store). So a killed run loses at most the chunk in
flight and a rerun continues where it stopped, never recomputing a stored pair; a backend
error stops the run before anything of the failing chunk is saved.

The store is a protocol: ``app`` implements it on the database; tests use a dict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from inference_server.backends.base import Backend, ScoreRequest
from inference_server.personas import persona_hash
from inference_server.prompts import LetterScore, PromptItem


@dataclass(frozen=True)
class PairKey:
    """The storage key of one distribution."""

    model_id: str
    template_version: str
    persona_hash: str
    item_hash: str


class DistributionStore(Protocol):
    """Where distributions are kept."""

    def existing(self, keys: Sequence[PairKey]) -> set[PairKey]:
        """The subset of ``keys`` already stored."""
        ...

    def save(self, rows: Sequence[tuple[PairKey, LetterScore]]) -> None:
        """Store ``rows`` atomically (all or none)."""
        ...


@dataclass(frozen=True)
class GenerationStats:
    """What a run did.

    Attributes:
        total: distinct persona × item pairs asked for.
        already_stored: pairs found in the store (not recomputed).
        computed: pairs scored and saved by this run.
        flagged: of those, pairs whose valid-letter mass was below the threshold.
        seconds: wall time of the scoring and saving.
    """

    total: int
    already_stored: int
    computed: int
    flagged: int
    seconds: float

    @property
    def rate(self) -> float:
        """Computed pairs per second."""
        return self.computed / self.seconds if self.seconds > 0 else 0.0


def pair_key(backend: Backend, persona_text: str, item: PromptItem) -> PairKey:
    return PairKey(
        backend.model_id, backend.template.version_id, persona_hash(persona_text), item.hash
    )


def generate(
    personas: Iterable[str],
    items: Sequence[PromptItem],
    backend: Backend,
    store: DistributionStore,
    *,
    chunk_size: int = 64,
    limit: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> GenerationStats:
    """Score every persona × item pair that the store does not have yet.

    Args:
        personas: persona texts (verbatim).
        items: the items.
        backend: the scoring backend (its model id and template version go in the key).
        store: the distribution store.
        chunk_size: pairs scored and saved together.
        limit: compute at most this many new pairs in this run (``None``: all).
        on_progress: called as ``on_progress(done, todo)`` after each saved chunk.

    Returns:
        The run's :class:`GenerationStats`.

    Raises:
        BackendError: from the backend; the chunks saved before it stay saved.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    pairs: dict[PairKey, ScoreRequest] = {}
    for text in personas:
        for item in items:
            key = pair_key(backend, text, item)
            pairs.setdefault(key, ScoreRequest(text, item))
    keys = list(pairs)
    have = store.existing(keys)
    todo = [k for k in keys if k not in have]
    if limit is not None:
        todo = todo[: max(limit, 0)]
    done = flagged = 0
    t0 = time.perf_counter()
    if on_progress is not None:
        on_progress(0, len(todo))
    for start in range(0, len(todo), chunk_size):
        chunk = todo[start : start + chunk_size]
        scores = backend.score([pairs[k] for k in chunk])
        store.save(list(zip(chunk, scores, strict=True)))
        done += len(chunk)
        flagged += sum(s.flagged for s in scores)
        if on_progress is not None:
            on_progress(done, len(todo))
    return GenerationStats(
        total=len(keys),
        already_stored=len(have),
        computed=done,
        flagged=flagged,
        seconds=time.perf_counter() - t0,
    )
