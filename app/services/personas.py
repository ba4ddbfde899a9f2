"""A study's language-model personas: the persona dictionary and its answer distributions.

A *persona* is a short text describing a respondent (an attribute profile of the study's
respondents, or a researcher's text); a *distribution* is a language model's answer
probabilities for one persona × question pair, stored in ``persona_distribution`` under
``(model id, template version, persona hash, item hash)``
(:class:`inference_server.generate.PairKey`). The study's persona prior
(:func:`app.services.belief.persona_prior_model`) reads them.

``priorly personas generate`` (:mod:`app.commands.personas`) and the
``persona_generation`` job (:mod:`app.jobs.tasks`) both use these functions:

* :func:`study_items`: the study's attribute items and question prompts;
* :func:`attribute_personas`: the most frequent (or sampled) attribute profiles;
* :func:`save_study_personas`: add them to ``study_persona``;
* :func:`make_persona_backend`: the scoring backend (local model or OpenAI-compatible);
* :func:`score_personas`: score every pair the database does not have yet, chunk by chunk,
  each chunk committed (resumable; :func:`inference_server.generate.generate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sqlmodel import Session, select

from app.errors import InvalidInputError
from app.settings import get_settings
from app.tables import Item, ItemRole, PersonaDistribution, Respondent, StudyPersona
from elicitation.datasets import CodebookItem
from inference_server.backends import make_backend
from inference_server.generate import GenerationStats, PairKey, generate, pair_key
from inference_server.model_store import DEFAULT_MODEL
from inference_server.personas import Persona, profiles_from_matrix
from inference_server.prompts import PromptItem


class SqlDistributionStore:
    """:class:`inference_server.generate.DistributionStore` on ``persona_distribution``."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def existing(self, keys: Sequence[PairKey]) -> set[PairKey]:
        """The subset of ``keys`` already stored (one query per 500 persona hashes)."""
        found: set[PairKey] = set()
        by_group: dict[tuple[str, str], list[PairKey]] = {}
        for k in keys:
            by_group.setdefault((k.model_id, k.template_version), []).append(k)
        for (model_id, version), group in by_group.items():
            persona_hashes = sorted({k.persona_hash for k in group})
            for start in range(0, len(persona_hashes), 500):
                rows = self.session.exec(
                    select(PersonaDistribution.persona_hash, PersonaDistribution.item_hash).where(
                        PersonaDistribution.model_id == model_id,
                        PersonaDistribution.template_version == version,
                        PersonaDistribution.persona_hash.in_(  # type: ignore[attr-defined]
                            persona_hashes[start : start + 500]
                        ),
                    )
                ).all()
                found.update(PairKey(model_id, version, ph, ih) for ph, ih in rows)
        return found & set(keys)

    def save(self, rows: Sequence[tuple[PairKey, Any]]) -> None:
        """Store ``rows`` (key, :class:`inference_server.prompts.LetterScore`) in one
        transaction; nothing is stored when any row fails."""
        try:
            for key, score in rows:
                self.session.add(
                    PersonaDistribution(
                        model_id=key.model_id,
                        template_version=key.template_version,
                        persona_hash=key.persona_hash,
                        item_hash=key.item_hash,
                        probs=[float(p) for p in score.probs],
                        valid_mass=float(score.valid_mass),
                        flagged=bool(score.flagged),
                    )
                )
            self.session.commit()
        except BaseException:
            self.session.rollback()
            raise


def study_items(study_id: int, *, session: Session) -> tuple[list[CodebookItem], list[PromptItem]]:
    """``(attribute codebook items, question prompt items)`` of a study, in position order.

    Questions are the items of role ``question`` or ``target``.
    """
    rows = session.exec(
        select(Item).where(Item.study_id == study_id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
    ).all()
    attrs, questions = [], []
    for it in rows:
        opts = tuple((str(letter), str(label)) for letter, label in it.options)
        if it.role == ItemRole.attribute.value:
            attrs.append(
                CodebookItem(id=it.key, question=it.question, options=opts, topic=it.topic)
            )
        elif it.role in (ItemRole.question.value, ItemRole.target.value):
            questions.append(PromptItem(it.key, it.question, tuple(lb for _, lb in opts)))
    return attrs, questions


def attribute_matrix(
    study_id: int, attrs: Sequence[CodebookItem], *, session: Session
) -> np.ndarray:
    """``int64 [N, A]`` option indices of the study's respondents' attributes (-1 missing)."""
    index = [{letter: k for k, (letter, _) in enumerate(a.options)} for a in attrs]
    rows = session.exec(select(Respondent.attributes).where(Respondent.study_id == study_id)).all()
    out = np.full((len(rows), len(attrs)), -1, dtype=np.int64)
    for r, values in enumerate(rows):
        for j, a in enumerate(attrs):
            letter = (values or {}).get(a.id)
            if letter is not None and letter in index[j]:
                out[r, j] = index[j][letter]
    return out


def attribute_personas(
    study_id: int,
    attrs: Sequence[CodebookItem],
    *,
    mode: str,
    n: int | None,
    seed: int,
    session: Session,
) -> list[Persona]:
    """Personas from the study's respondents' attribute profiles
    (:func:`inference_server.personas.profiles_from_matrix`: ``mode`` ``profiles`` = the
    ``n`` most frequent, ``sample`` = ``n`` sampled with ``seed``)."""
    matrix = attribute_matrix(study_id, attrs, session=session)
    return profiles_from_matrix(list(attrs), matrix, mode=mode, n=n, seed=seed)


def save_study_personas(
    study_id: int, personas: Sequence[Persona], source: str, *, session: Session
) -> int:
    """Add the personas the study does not have yet (by text hash); returns how many."""
    have = set(
        session.exec(select(StudyPersona.text_hash).where(StudyPersona.study_id == study_id)).all()
    )
    added = 0
    for p in personas:
        if p.hash in have:
            continue
        session.add(
            StudyPersona(
                study_id=study_id,
                key=p.key[:200],
                text=p.text,
                text_hash=p.hash,
                weight=p.weight,
                source=source,
            )
        )
        have.add(p.hash)
        added += 1
    session.commit()
    return added


def make_persona_backend(
    kind: str,
    *,
    base_url: str | None = None,
    model: str | None = None,
    batch_size: int = 8,
    concurrency: int = 4,
    threshold: float = 0.5,
    threads: int | None = None,
) -> Any:
    """The scoring backend: ``local`` (the embedded model, or the model folder ``model``)
    or ``openai`` (an OpenAI-compatible server at ``base_url`` serving ``model``; unset
    values come from the settings ``PRIORLY_LLM_BASE_URL``, ``PRIORLY_LLM_MODEL`` and
    ``PRIORLY_LLM_API_KEY``, the model defaulting to
    :data:`inference_server.model_store.DEFAULT_MODEL`). Loading a local model is lazy.

    Raises:
        InvalidInputError: ``openai`` without ``base_url`` nor ``PRIORLY_LLM_BASE_URL``.
    """
    if kind == "openai":
        settings = get_settings()
        base_url = base_url or settings.llm_base_url
        if not base_url:
            raise InvalidInputError("--backend openai needs --base-url or PRIORLY_LLM_BASE_URL")
        key = settings.llm_api_key
        return make_backend(
            "openai",
            base_url=base_url,
            model=model or settings.llm_model or DEFAULT_MODEL,
            api_key=key.get_secret_value() if key is not None else None,
            batch_size=batch_size,
            concurrency=concurrency,
            threshold=threshold,
        )
    return make_backend(
        "local", model=model, batch_size=batch_size, threshold=threshold, num_threads=threads
    )


def score_personas(
    texts: Sequence[str],
    questions: Sequence[PromptItem],
    backend: Any,
    *,
    session: Session,
    chunk_size: int = 32,
    limit: int | None = None,
    first_pairs: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> GenerationStats:
    """Score and store every persona × question pair not stored yet (resumable).

    ``limit``: compute at most this many new pairs. ``first_pairs``: compute only the
    missing pairs among the first ``first_pairs`` of the persona × question grid (in
    :func:`inference_server.generate.generate`'s order), so that a run retried after an
    interruption ends with exactly the pairs of an uninterrupted one. Give at most one.
    """
    store = SqlDistributionStore(session)
    if first_pairs is not None:
        grid = list(dict.fromkeys(pair_key(backend, t, q) for t in texts for q in questions))
        limit = first_pairs - len(store.existing(grid[:first_pairs]))
    return generate(
        texts,
        questions,
        backend,
        store,
        chunk_size=chunk_size,
        limit=limit,
        on_progress=on_progress,
    )
