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
* the three sources of personas a researcher has without history:
  :func:`add_text_personas` (pasted or uploaded texts, one per line or JSONL),
  :func:`add_share_personas` (attribute profiles from population shares, e.g. a census
  table; both read by :mod:`app.services.persona_input`) and :func:`attribute_personas`
  (the imported respondents' distinct attribute profiles, weighted by their frequencies);
* :func:`save_study_personas`: add them to ``study_persona`` (one transaction), with the
  profile of an attribute persona (``attributes``, which the persona prior conditions on);
* :func:`make_persona_backend` and :func:`check_persona_backend`: the scoring backend
  (local model or OpenAI-compatible), checked before anything is stored;
* :func:`score_personas`: score every pair the database does not have yet, chunk by chunk,
  each chunk committed (resumable; :func:`inference_server.generate.generate`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from sqlmodel import Session, select

from app.errors import InvalidInputError
from app.services.learning import EARLY_REFIT, refit_every, refit_threshold
from app.services.persona_input import (
    MAX_PROFILE_PERSONAS,
    share_personas,
    shares_from_form,
    text_personas,
)
from app.services.persona_models import prior_group
from app.settings import Settings, get_settings
from app.tables import (
    FittedModel,
    Item,
    ItemRole,
    PersonaDistribution,
    Respondent,
    Study,
    StudyPersona,
)
from elicitation.datasets import CodebookItem
from inference_server.backends import make_backend
from inference_server.errors import InferenceError
from inference_server.generate import GenerationStats, PairKey, generate, pair_key
from inference_server.model_store import DEFAULT_MODEL
from inference_server.personas import (
    MAX_PERSONA_KEY_CHARS,
    Persona,
    profiles_from_matrix,
)
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


def item_prompt_hash(item: Item) -> str:
    """The hash its persona distributions are stored under: the item's key, wording and
    option labels (:class:`inference_server.prompts.PromptItem`); a reworded item or a
    changed option list has a new one."""
    return PromptItem(item.key, item.question, tuple(str(o[1]) for o in item.options)).hash


def personas_scored_on(item: Item, *, session: Session) -> int:
    """How many of the study's personas have a stored distribution for ``item`` as it is
    worded now."""
    hashes = session.exec(
        select(StudyPersona.text_hash).where(StudyPersona.study_id == item.study_id)
    ).all()
    if not hashes:
        return 0
    return len(
        set(
            session.exec(
                select(PersonaDistribution.persona_hash).where(
                    PersonaDistribution.item_hash == item_prompt_hash(item),
                    PersonaDistribution.persona_hash.in_(list(hashes)),  # type: ignore[attr-defined]
                )
            ).all()
        )
    )


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
    study_id: int,
    personas: Sequence[Persona],
    source: str,
    *,
    session: Session,
    attrs: Sequence[CodebookItem] = (),
    limit: int | None = None,
) -> int:
    """Add the personas the study does not have yet (by text hash), in one transaction;
    returns how many. A key the study already has gets a suffix (``persona-1`` of a
    second upload is stored as ``persona-1~2``: :func:`unique_key`). A persona's
    ``attributes`` (``{item id: option index}``) are stored as ``{item key: option
    letter}`` of ``attrs`` (the study's attribute items).

    Raises:
        InvalidInputError: the dictionary would hold more than ``limit`` personas
            (default: the setting ``PRIORLY_MAX_STUDY_PERSONAS``,
            :func:`check_dictionary_size`); nothing is stored.
    """
    letters = {a.id: [letter for letter, _ in a.options] for a in attrs}
    stored = session.exec(
        select(StudyPersona.text_hash, StudyPersona.key).where(StudyPersona.study_id == study_id)
    ).all()
    have = {h for h, _ in stored}
    keys = {k for _, k in stored}
    new = len({p.hash for p in personas} - have)
    check_dictionary_size(len(have), new, limit)
    added = 0
    try:
        for p in personas:
            if p.hash in have:
                continue
            if len(p.key) > MAX_PERSONA_KEY_CHARS:  # the column holds 200, with a suffix
                raise InvalidInputError(
                    f"persona {p.key[:40]}…: the key has {len(p.key):,} characters (at most "
                    f"{MAX_PERSONA_KEY_CHARS})"
                )
            key = unique_key(p.key, keys)
            keys.add(key)
            session.add(
                StudyPersona(
                    study_id=study_id,
                    key=key,
                    text=p.text,
                    text_hash=p.hash,
                    weight=p.weight,
                    source=source,
                    attributes={
                        k: letters[k][v]
                        for k, v in p.attributes.items()
                        if k in letters and 0 <= v < len(letters[k])
                    },
                )
            )
            have.add(p.hash)
            added += 1
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return added


def max_study_personas(settings: Settings | None = None) -> int:
    """The largest persona dictionary of a study (``PRIORLY_MAX_STUDY_PERSONAS``)."""
    return (settings or get_settings()).max_study_personas


def check_dictionary_size(stored: int, new: int, limit: int | None = None) -> None:
    """Refuse a dictionary of ``stored + new`` personas over ``limit`` (default
    :func:`max_study_personas`).

    Raises:
        InvalidInputError: naming the count and the limit, e.g. ``"the persona dictionary
            would hold 60,000 personas (0 stored, 60,000 new), more than the limit of 2,000
            per study ..."``.
    """
    limit = max_study_personas() if limit is None else limit
    if new and stored + new > limit:
        raise InvalidInputError(
            f"the persona dictionary would hold {stored + new:,} personas ({stored:,} stored, "
            f"{new:,} new), more than the limit of {limit:,} per study "
            "(PRIORLY_MAX_STUDY_PERSONAS): generating their distributions scores every "
            "persona × question pair; add fewer personas (a sample size for shares, the "
            "most frequent profiles of respondents)"
        )


def unique_key(key: str, taken: set[str]) -> str:
    """``key``, or ``key~2``, ``key~3``, ... the first not in ``taken``.

    Example: ``unique_key("persona-1", {"persona-1"}) == "persona-1~2"``."""
    if key not in taken:
        return key
    n = 2
    while f"{key}~{n}" in taken:
        n += 1
    return f"{key}~{n}"


def stored_persona_texts(study_id: int, *, session: Session) -> list[str]:
    """The texts of the study's persona dictionary, in creation order."""
    return list(
        session.exec(
            select(StudyPersona.text)
            .where(StudyPersona.study_id == study_id)
            .order_by(StudyPersona.id)  # type: ignore[arg-type]
        ).all()
    )


# ----- persona sources --------------------------------------------------------------------


def add_text_personas(
    study: Study,
    raw: str | bytes,
    *,
    filename: str | None = None,
    session: Session,
    settings: Settings | None = None,
) -> int:
    """Add the personas of pasted or uploaded texts
    (:func:`app.services.persona_input.text_personas`) to the study's dictionary; returns
    how many are new. Nothing is stored on an error."""
    assert study.id is not None
    return save_study_personas(
        study.id,
        text_personas(raw, filename=filename),
        "texts",
        session=session,
        limit=max_study_personas(settings),
    )


def add_share_personas(
    study: Study,
    shares: Mapping[str, Mapping[str, object]],
    *,
    sample: int | None = None,
    seed: int = 0,
    session: Session,
    settings: Settings | None = None,
) -> int:
    """Add the attribute-profile personas of population ``shares`` (:func:`share_personas`)
    with their profiles; returns how many are new. Nothing is stored on an error.

    Raises:
        InvalidInputError: the study has no attribute items, or bad shares.
    """
    assert study.id is not None
    attrs, _ = study_items(study.id, session=session)
    if not attrs:
        raise InvalidInputError("the study has no attribute items: set an item's role to attribute")
    limit = max_study_personas(settings)
    most = min(MAX_PROFILE_PERSONAS, limit)
    personas = share_personas(attrs, shares, sample=sample, seed=seed, max_personas=most)
    return save_study_personas(
        study.id, personas, "shares", session=session, attrs=attrs, limit=limit
    )


def add_respondent_personas(
    study: Study, *, n: int | None = None, session: Session, settings: Settings | None = None
) -> int:
    """Add the distinct attribute profiles of the study's imported respondents, weighted by
    how many respondents share each (the ``n`` most frequent when given); returns how many
    are new.

    Raises:
        InvalidInputError: no attribute items, or no respondent with any attribute.
    """
    assert study.id is not None
    attrs, _ = study_items(study.id, session=session)
    if not attrs:
        raise InvalidInputError("the study has no attribute items: set an item's role to attribute")
    limit = max_study_personas(settings)
    most = min(MAX_PROFILE_PERSONAS, limit)
    if n is not None and not 1 <= n <= most:
        raise InvalidInputError(f"profiles: give a number from 1 to {most}")
    try:
        personas = attribute_personas(
            study.id, attrs, mode="profiles", n=n, seed=0, session=session
        )
    except InferenceError as exc:
        raise InvalidInputError(f"imported respondents: {exc}") from None
    return save_study_personas(
        study.id, personas, "respondents", session=session, attrs=attrs, limit=limit
    )


def clear_personas(study: Study, *, session: Session) -> int:
    """Remove the study's persona dictionary (stored distributions stay: they are keyed by
    text, so adding the same persona again finds them); returns how many were removed."""
    rows = session.exec(select(StudyPersona).where(StudyPersona.study_id == study.id)).all()
    for row in rows:
        session.delete(row)
    session.commit()
    return len(rows)


def shares_from_fields(
    study: Study, fields: Sequence[tuple[str, str]], *, session: Session
) -> dict[str, dict[str, str]]:
    """:func:`app.services.persona_input.shares_from_form` on the study's attribute items
    (``fields``: the form's text fields, ``(name, text)``)."""
    assert study.id is not None
    attrs, _ = study_items(study.id, session=session)
    return shares_from_form(attrs, fields)


GENERATION_CHECKING = "checking the language model and the persona dictionary"
"""A persona generation job's first progress message; a job that fails with it failed in
its checks (configuration, server, dictionary), before scoring anything."""

BACKENDS = ("local", "openai")
"""The persona job's backends: the embedded model, the configured inference server."""

GENERATION_CHUNK = {"local": 8, "openai": 32}
"""Pairs scored and committed together by a job started from the personas page: what the
backend scores at once (one batch of 8 locally; 8 per request × 4 requests in flight on a
server), so that a cancel waits, and the progress stands still, for a few seconds at most
(docs/personas.md)."""


def generation_payload(
    backend: str, study: Study, *, session: Session, settings: Settings | None = None
) -> dict[str, Any]:
    """The payload of a persona generation job started from the personas page: ``backend``
    and ``chunk`` (:data:`GENERATION_CHUNK`); for ``openai`` also the server the page
    offered (``base_url``, ``model``) and ``api_key_set`` (whether ``PRIORLY_LLM_API_KEY``
    is set; never the key), which the worker uses
    (:func:`app.services.persona_models.job_server`).

    Raises:
        InvalidInputError: an unknown backend, ``openai`` without ``PRIORLY_LLM_BASE_URL``,
            a study without personas or without questions.
    """
    assert study.id is not None
    if backend not in BACKENDS:
        raise InvalidInputError("model: choose the embedded model or the inference server")
    settings = settings or get_settings()
    if backend == "openai" and not settings.llm_base_url:
        raise InvalidInputError(
            "model: no inference server is configured (set PRIORLY_LLM_BASE_URL and "
            "PRIORLY_LLM_MODEL)"
        )
    _, questions = study_items(study.id, session=session)
    if not questions:
        raise InvalidInputError("the study has no questions to score")
    if not stored_persona_texts(study.id, session=session):
        raise InvalidInputError("the persona dictionary is empty: add personas first")
    payload: dict[str, Any] = {"backend": backend, "chunk": GENERATION_CHUNK[backend]}
    if backend == "openai":
        payload |= {
            "base_url": settings.llm_base_url,
            "model": settings.llm_model or DEFAULT_MODEL,
            "api_key_set": settings.llm_api_key is not None,
        }
    return payload


UNIFORM_PRIOR_WARNING = (
    "This study's prior is uniform: it has no historical respondents and no persona "
    "distributions, so predictions are uniform and the first questions are chosen blindly "
    "until the first refits learn from live respondents ({refits}, with the calibration "
    "questions teaching the targets). What works for this study: add personas on the "
    "Personas tab (persona texts, or attribute shares from a census table), generate their "
    "distributions there, then “Refit now” on this study's Design page. Historical "
    "respondents cannot be added to this study: Import always creates a new study, so to "
    "start from history, import it as a new study."
)
"""The warning on the study page of a published study whose prior is uniform; ``{refits}``
is :func:`refit_schedule` of the study."""


def refit_schedule(every: int) -> str:
    """When a study with ``refit_every = every`` refits on its own, in words
    (:func:`app.services.learning.refit_threshold` from a model of 0 respondents).

    >>> refit_schedule(500)
    'after 25, 50, 100, 200, 400, 800 completed respondents, then every 500'
    >>> refit_schedule(3)
    'after every 3 completed respondents'
    >>> refit_schedule(0)
    'automatic refits are off: "Refit now" on the study page'
    """
    if every <= 0:
        return 'automatic refits are off: "Refit now" on the study page'
    if every <= EARLY_REFIT:
        return f"after every {every} completed respondents"
    marks, total = [], 0
    while (step := refit_threshold(every, total)) < every:
        total += step
        marks.append(f"{total:,}")
    return f"after {', '.join(marks)} completed respondents, then every {every:,}"


def uniform_prior_text(study: Study) -> str:
    """:data:`UNIFORM_PRIOR_WARNING` with the study's refit schedule."""
    return UNIFORM_PRIOR_WARNING.format(refits=refit_schedule(refit_every(study.settings)))


def uniform_prior_warning(study: Study, *, session: Session) -> str | None:
    """:func:`uniform_prior_text` when the study's prior is uniform: its active model
    says so (``metrics["prior"] == "uniform"``), or it has no active model, no respondents
    and no stored distribution for any of its personas; ``None`` otherwise."""
    model = session.exec(
        select(FittedModel.metrics)
        .where(FittedModel.study_id == study.id, FittedModel.is_active)  # type: ignore[arg-type]
        .order_by(FittedModel.id.desc())  # type: ignore[union-attr]
    ).first()
    if model is not None:
        return uniform_prior_text(study) if (model or {}).get("prior") == "uniform" else None
    if session.exec(select(Respondent.id).where(Respondent.study_id == study.id)).first():
        return None
    scored = session.exec(
        select(PersonaDistribution.id)
        .join(StudyPersona, StudyPersona.text_hash == PersonaDistribution.persona_hash)  # type: ignore[arg-type]
        .where(StudyPersona.study_id == study.id)
    ).first()
    return None if scored else uniform_prior_text(study)


def persona_page(
    study: Study, *, session: Session, settings: Settings | None = None
) -> dict[str, Any]:
    """The personas page's context: ``study``; ``attrs`` (the attribute items, for the
    shares table); ``personas`` (the first :data:`PERSONAS_SHOWN`) and ``n_personas``;
    ``n_profiled`` (personas with an attribute profile); ``prior_model``, the model whose
    distributions the persona prior uses (:func:`app.services.persona_models.prior_group`;
    ``None`` before any is stored) and ``other_models`` (``[(model, pairs scored)]`` of the
    other models with stored pairs); ``n_scored`` (personas with at least one stored
    distribution by ``prior_model``); ``n_pairs`` persona × question pairs of which
    ``n_pairs_scored`` have a distribution by ``prior_model`` for the question as worded now;
    ``weight_by_source`` (:func:`weight_by_source`); ``n_respondents`` with any attribute;
    ``llm`` (the
    configured server: ``base_url``, ``model``, or ``None``: the server option is then
    disabled); ``prior_warning`` (:func:`uniform_prior_warning`). The persona jobs are
    added by :func:`app.services.job_views.persona_overview`."""
    assert study.id is not None
    attrs, questions = study_items(study.id, session=session)
    rows = session.exec(
        select(StudyPersona).where(StudyPersona.study_id == study.id).order_by(StudyPersona.id)  # type: ignore[arg-type]
    ).all()
    hashes = [r.text_hash for r in rows]
    question_hashes = {q.hash for q in questions}
    stored: dict[tuple[str, str], set[tuple[str, str]]] = {}  # group -> (persona, item)
    for start in range(0, len(hashes), 500):
        for model_id, version, persona_hash, item_hash in session.exec(
            select(
                PersonaDistribution.model_id,
                PersonaDistribution.template_version,
                PersonaDistribution.persona_hash,
                PersonaDistribution.item_hash,
            ).where(PersonaDistribution.persona_hash.in_(hashes[start : start + 500]))  # type: ignore[attr-defined]
        ).all():
            stored.setdefault((model_id, version), set()).add((persona_hash, item_hash))
    pairs_of = {g: {pi for pi in v if pi[1] in question_hashes} for g, v in stored.items()}
    counts = {g: len(v) for g, v in pairs_of.items() if v}
    group = prior_group(study.id, counts, session=session)
    pairs = pairs_of.get(group, set()) if group else set()
    scored = {ph for ph, _ in stored.get(group, set())} if group else set()
    others: dict[str, int] = {}
    for g, n in counts.items():
        if group is None or g[0] != group[0]:
            others[g[0]] = max(others.get(g[0], 0), n)
    respondents = attribute_matrix(study.id, attrs, session=session) if attrs else None
    settings = settings or get_settings()
    return {
        "study": study,
        "attrs": attrs,
        "n_questions": len(questions),
        "personas": list(rows[:PERSONAS_SHOWN]),
        "n_personas": len(rows),
        "n_profiled": sum(1 for r in rows if r.attributes),
        "n_scored": len(scored),
        "weight_by_source": weight_by_source(rows),
        "n_pairs": len(set(hashes)) * len(set(question_hashes)),
        "n_pairs_scored": len(pairs),
        "prior_model": group[0] if group else None,
        "other_models": sorted(others.items()),
        "n_respondents": int((respondents >= 0).any(axis=1).sum())
        if respondents is not None
        else 0,
        "llm": (
            {"base_url": settings.llm_base_url, "model": settings.llm_model or DEFAULT_MODEL}
            if settings.llm_base_url
            else None
        ),
        "embedded_model": DEFAULT_MODEL,
        "max_profiles": min(MAX_PROFILE_PERSONAS, settings.max_study_personas),
        "max_personas": settings.max_study_personas,
        "prior_warning": uniform_prior_warning(study, session=session),
    }


SOURCE_WORDS = {
    "shares": "attribute shares",
    "texts": "persona texts",
    "respondents": "respondents' profiles",
}
"""The personas page's words for a persona's ``source``."""


def weight_by_source(rows: Sequence[StudyPersona]) -> list[tuple[str, float]]:
    """Each source's share of the prior's weight (``[(words, percent)]``, largest first),
    when the dictionary mixes sources (their weights are used as they are, so a source
    can hold more of the prior than the researcher meant); ``[]`` for one source.

    Example: 4 share personas (weights summing to 1) and 2 texts (weight 1 each) give
    ``[("persona texts", 66.7), ("attribute shares", 33.3)]``.
    """
    totals: dict[str, float] = {}
    for r in rows:
        totals[r.source] = totals.get(r.source, 0.0) + max(float(r.weight), 0.0)
    whole = sum(totals.values())
    if len(totals) < 2 or whole <= 0:
        return []
    out = [(SOURCE_WORDS.get(s, s), 100 * w / whole) for s, w in totals.items()]
    return sorted(out, key=lambda x: -x[1])


PERSONAS_SHOWN = 200
"""Personas listed on the personas page (the counts cover all of them)."""


def check_persona_backend(backend: Any) -> None:
    """Check the backend before anything is stored: an OpenAI-compatible server must
    answer ``GET /v1/models`` and serve the configured model.

    Raises:
        InvalidInputError: the server is down or serves another model (the message names
            the URL and the models it serves).
    """
    check = getattr(backend, "check", None)
    if check is None:
        return
    try:
        check()
    except InferenceError as exc:
        raise InvalidInputError(f"inference server: {exc}") from None


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


def format_seconds(seconds: float) -> str:
    """``75 → "1 min 15 s"``, ``3725 → "1 h 2 min"``, ``8 → "8 s"``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def generation_progress(
    total: int,
    report: Callable[[float, str], None],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[int, int], None]:
    """An ``on_progress(done, todo)`` for :func:`score_personas` that reports
    ``(fraction, message)`` over the whole persona × question grid of ``total`` pairs.

    Pairs stored before this run count as done (``total − todo`` at the first call); the
    rate counts this run's pairs only: ``rate = done / elapsed``, ``time left =
    (todo − done) / rate``. Message, e.g. ``"120 of 400 pairs scored (20 stored before),
    3.3 pairs/s, about 1 min 25 s left"``.
    """
    start = clock()
    before: list[int] = []

    def on_progress(done: int, todo: int) -> None:
        if not before:
            before.append(max(0, total - todo))
        have = before[0] + done
        msg = f"{have} of {total} pairs scored"
        if before[0]:
            msg += f" ({before[0]} stored before)"
        elapsed = clock() - start
        if done and elapsed > 0:
            rate = done / elapsed
            msg += f", {rate:.3g} pairs/s, about {format_seconds((todo - done) / rate)} left"
        report(have / max(1, total), msg)

    return on_progress


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
