"""A study's belief model: fit it from the study's historical respondents, store and load it.

A live session needs a fitted belief model (:mod:`models`). When a study has historical
(imported) respondents and no active fitted model, :func:`ensure_fitted_model` fits the
default one and stores it in ``fitted_model`` (active):

* **family**: latent classes (:func:`models.latent_class.fit_latent_classes`), i.e. a
  persona mixture whose personas are fitted by EM. It is a joint model of *every* item of
  the study (attributes, questions and targets), so any item can be conditioned on or
  predicted, whatever roles the designer later gives the items.
* **data**: the imported respondents' attributes and answers. Users of the ``val`` split
  choose the number of classes (validation log-likelihood, then a refit on train + val);
  everyone else (train, test, or no split) is training data: a live study should learn
  from all the history it has (the held-out ``test`` users matter to the benchmark
  harness, which fits its own models). Live respondents are not used.
* **classes**: :data:`DEFAULT_N_CLASSES` candidates, :data:`DEFAULT_RESTARTS` restarts.

The fitted model's ``training_hash`` identifies its data; :func:`load_active_model` keeps
one deserialised model per process, cached by ``(fitted_model.id, training_hash)``, so
a worker reads a model blob once, and a newly activated model (new id) is picked up on
the next request without any invalidation message between processes.

The job queue (another part of the app) can call :func:`fit_study_model` the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from sqlmodel import Session, select

from app.errors import ConflictError
from app.tables import FittedModel, Item, Respondent, RespondentSource, Study

DEFAULT_N_CLASSES: tuple[int, ...] = (8, 16, 32)
DEFAULT_RESTARTS = 1
DEFAULT_FAMILY = "persona_mixture"


class NoModelError(ConflictError):
    """The study has no fitted model and no historical respondents to fit one from."""

    code = "no_model"


def item_bank_of(items: Sequence[Item]):  # type: ignore[no-untyped-def]
    """The :class:`models.ItemBank` of a study's items (keys in ``items`` order)."""
    from models.base import ItemBank

    return ItemBank(tuple(i.key for i in items), tuple(len(i.options) for i in items))


def _study_items(study_id: int, *, session: Session) -> list[Item]:
    return list(
        session.exec(
            select(Item).where(Item.study_id == study_id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
        ).all()
    )


def historical_matrix(
    study_id: int, items: Sequence[Item], *, session: Session
) -> tuple[torch.Tensor, torch.Tensor]:
    """The imported respondents as response matrices ``(train [N, I], val [N_val, I])``.

    Cells are option indices in ``item.options`` order, ``-1`` where missing. Letters that
    are not an option of the item (possible only if the codebook was edited after the
    import) are treated as missing.
    """
    col = {it.key: j for j, it in enumerate(items)}
    letter_index = [{opt[0]: k for k, opt in enumerate(it.options)} for it in items]
    rows = session.exec(
        select(Respondent.attributes, Respondent.answers, Respondent.split).where(
            Respondent.study_id == study_id,
            Respondent.source == RespondentSource.import_.value,
        )
    ).all()
    train: list[list[int]] = []
    val: list[list[int]] = []
    for attributes, answers, split in rows:
        row = [-1] * len(items)
        for mapping in (attributes or {}, answers or {}):
            for key, letter in mapping.items():
                j = col.get(key)
                if j is not None:
                    row[j] = letter_index[j].get(letter, -1)
        (val if split == "val" else train).append(row)
    n = len(items)
    as_t = lambda r: torch.tensor(r, dtype=torch.long).reshape(-1, n)  # noqa: E731
    return as_t(train), as_t(val)


def fit_study_model(
    study: Study,
    *,
    session: Session,
    n_classes: Sequence[int] = DEFAULT_N_CLASSES,
    n_restarts: int = DEFAULT_RESTARTS,
    seed: int = 0,
) -> FittedModel:
    """Fit the default belief model on the study's history and store it as the active one.

    Previously active models of the study are deactivated in the same transaction.

    Raises:
        NoModelError: the study has no imported respondents.
    """
    from models.latent_class import fit_latent_classes

    assert study.id is not None
    items = _study_items(study.id, session=session)
    train, val = historical_matrix(study.id, items, session=session)
    if train.shape[0] == 0:
        raise NoModelError(
            f"study {study.slug!r} has no historical respondents to fit a belief model from"
        )
    bank = item_bank_of(items)
    model = fit_latent_classes(
        train,
        bank,
        val_responses=val if val.shape[0] else None,
        n_classes=n_classes,
        n_restarts=n_restarts,
        seed=seed,
    )
    for old in session.exec(
        select(FittedModel).where(FittedModel.study_id == study.id, FittedModel.is_active)  # type: ignore[arg-type]
    ).all():
        old.is_active = False
        session.add(old)
    row = FittedModel(
        study_id=study.id,
        family=model.family,
        blob=model.to_bytes(),
        training_hash=model.training_hash or "",
        metrics=_jsonable(model.metrics),
        is_active=True,
    )
    session.add(row)
    session.commit()
    session.refresh(row)
    return row


def _jsonable(metrics: dict[str, object]) -> dict[str, object]:
    import json

    return json.loads(json.dumps(metrics, default=float))


def active_model_row(study_id: int, *, session: Session) -> FittedModel | None:
    """The study's active fitted model row (newest if several are flagged), without its blob
    being needed by the caller."""
    return session.exec(
        select(FittedModel)
        .where(FittedModel.study_id == study_id, FittedModel.is_active)  # type: ignore[arg-type]
        .order_by(FittedModel.id.desc())  # type: ignore[union-attr]
    ).first()


def ensure_fitted_model(study: Study, *, session: Session) -> FittedModel:
    """The study's active fitted model, fitting the default one first if there is none."""
    assert study.id is not None
    row = active_model_row(study.id, session=session)
    if row is not None:
        return row
    return fit_study_model(study, session=session)


@dataclass(frozen=True)
class ActiveModelRef:
    """Identity of a stored model: the cache key (``id``, ``training_hash``)."""

    id: int
    training_hash: str


_CACHE: dict[tuple[int, str], object] = {}
_CACHE_LOCK = threading.Lock()
_CACHE_MAX = 16


def active_model_ref(study_id: int, *, session: Session) -> ActiveModelRef | None:
    """The active model's id and hash (a cheap query: the blob is not read)."""
    row = session.exec(
        select(FittedModel.id, FittedModel.training_hash)
        .where(FittedModel.study_id == study_id, FittedModel.is_active)  # type: ignore[arg-type]
        .order_by(FittedModel.id.desc())  # type: ignore[union-attr]
    ).first()
    if row is None:
        return None
    return ActiveModelRef(id=int(row[0] or 0), training_hash=str(row[1]))


def load_cached_model(ref: ActiveModelRef, *, session: Session):  # type: ignore[no-untyped-def]
    """The deserialised model of ``ref``; read from the database once per process."""
    model = cached_model(ref)
    if model is not None:
        return model
    return model_from_blob(ref, model_blob(ref, session=session))


def cached_model(ref: ActiveModelRef):  # type: ignore[no-untyped-def]
    """The model of ``ref`` if this process has deserialised it already, else ``None``."""
    with _CACHE_LOCK:
        return _CACHE.get((ref.id, ref.training_hash))


def model_blob(ref: ActiveModelRef, *, session: Session) -> bytes:
    """The stored bytes of the model ``ref`` (read; nothing is deserialised)."""
    return bytes(session.exec(select(FittedModel.blob).where(FittedModel.id == ref.id)).one())


def model_from_blob(ref: ActiveModelRef, blob: bytes):  # type: ignore[no-untyped-def]
    """Deserialise ``blob`` (the model ``ref``) into the per-process cache; returns the
    cached model (the first one stored when two threads raced). Called without holding a
    database connection: unpickling a model is CPU work."""
    import models  # noqa: F401  (registers every model family)
    from models.base import load_model

    _single_thread_torch()
    loaded = load_model(blob)
    with _CACHE_LOCK:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        return _CACHE.setdefault((ref.id, ref.training_hash), loaded)


_THREADS_SET = False


def _single_thread_torch() -> None:
    """Use one intra-op thread in a process that serves sessions.

    A session's torch work is a few tiny matrix products per request; a web process runs
    many requests at once (threads, several workers), so intra-op parallelism only adds
    contention (measured: the answer call is several times slower with the default thread
    pool on a loaded 2-core machine). Set ``PRIORLY_TORCH_THREADS`` to override.
    """
    global _THREADS_SET
    if _THREADS_SET:
        return
    import os

    torch.set_num_threads(max(1, int(os.environ.get("PRIORLY_TORCH_THREADS", "1"))))
    _THREADS_SET = True


def clear_model_cache() -> None:
    """Forget every cached model (tests)."""
    with _CACHE_LOCK:
        _CACHE.clear()
