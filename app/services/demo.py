"""Make an imported study answerable at once: targets, consent text, published, fitted.

``priorly serve`` imports the bundled demo dataset into an empty database and then calls
:func:`prepare_study_for_fielding`, so ``/s/<slug>`` works out of the box. Nothing here
knows a dataset by name: the targets come from the dataset's own benchmark runs (the first
run's held-out ``eval_qids``, the questions its authors chose to predict), and a study
without runs keeps no targets (sessions then use the target-free criterion, see
:mod:`app.services.sessions`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import Session, select

from app import db
from app.services.belief import active_model_ref, ensure_fitted_model, try_ensure_fixed_order
from app.services.importer import slugify
from app.tables import Item, ItemRole, Study, StudyStatus

DEFAULT_CONSENT = (
    "This is a short adaptive survey: each question is chosen from your earlier answers. "
    "It takes a few minutes. Your answers are stored without your name and are used for "
    "research only. You may skip questions you prefer not to answer, stop at any time, and "
    "ask for your answers to be deleted."
)


@dataclass(frozen=True)
class PreparedStudy:
    slug: str
    targets: list[str]
    fitted_model_id: int
    published: bool


def prepare_study_for_fielding(study: Study, *, session: Session) -> PreparedStudy:
    """Choose targets (when none are chosen), add a consent text, fit a model, store its
    fixed question order (:func:`app.services.belief.try_ensure_fixed_order`), publish.

    Idempotent: a study that already has targets, a consent text, an active model or is
    published keeps them.
    """
    assert study.id is not None
    items = list(session.exec(select(Item).where(Item.study_id == study.id)).all())
    targets = [it.key for it in items if it.role == ItemRole.target.value]
    if not targets and study.benchmark_runs:
        wanted = {str(k) for k in study.benchmark_runs[0].get("eval_qids", [])}
        for it in items:
            if it.key in wanted and it.role == ItemRole.question.value:
                it.role = ItemRole.target.value
                session.add(it)
                targets.append(it.key)
    if not study.consent_text:
        study.consent_text = DEFAULT_CONSENT
    session.add(study)
    session.commit()
    row = ensure_fitted_model(study, session=session)
    # The targets may have been chosen just now, after the fit: store the fixed order of
    # this pool and these targets too, so the first respondent finds it.
    try_ensure_fixed_order(study, session=session, row=row)
    published = False
    if study.status == StudyStatus.draft.value:
        study.status = StudyStatus.published.value
        session.add(study)
        session.commit()
        published = True
    return PreparedStudy(study.slug, sorted(targets), row.id or 0, published)


def prepare_demo(
    dataset_dir: Path, *, session: Session, log: Callable[[str], object] = lambda _m: None
) -> PreparedStudy | None:
    """Make the demo study (imported from ``dataset_dir``) answerable, once.

    Called by ``priorly serve`` on every start: it does nothing when the demo study does
    not exist (``--no-demo``, another study list) or already has an active model; else it
    chooses targets, fits the model and publishes.
    """
    try:
        name = json.loads((Path(dataset_dir) / "dataset.json").read_text(encoding="utf-8"))["name"]
    except (OSError, ValueError, KeyError):
        return None
    study = session.exec(select(Study).where(Study.slug == slugify(str(name)))).first()
    if study is None or study.id is None or active_model_ref(study.id, session=session):
        return None
    log(f"fitting the belief model of the demo study {study.slug!r} (once; about a minute)")
    prepared = prepare_study_for_fielding(study, session=session)
    log(
        f"demo study ready at /s/{prepared.slug} (targets: {', '.join(prepared.targets) or 'none'})"
    )
    return prepared


def prepare_demo_database(settings: Any, *, log: Callable[[str], object] = print) -> None:
    """:func:`prepare_demo` on ``settings.database_url`` (``priorly serve`` calls it after
    the bootstrap import, so the first start fits the demo's model and publishes it)."""
    engine = db.make_engine(settings.database_url)
    try:
        with Session(engine) as session:
            prepare_demo(settings.demo_dataset, session=session, log=log)
    finally:
        engine.dispose()
