"""Make an imported study answerable at once: targets, consent text, published, fitted.

``priorly serve`` imports the bundled demo dataset into an empty database and then calls
:func:`prepare_study_for_fielding`, so ``/s/<slug>`` works out of the box. Nothing here
knows a dataset by name: the targets come from the dataset's own benchmark runs (the first
run's held-out ``eval_qids``, the questions its authors chose to predict), and a study
without runs keeps no targets (sessions then use the target-free criterion, see
:mod:`app.services.sessions`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session, select

from app.services.belief import ensure_fitted_model
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
    """Choose targets (when none are chosen), add a consent text, fit a model, publish.

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
    published = False
    if study.status == StudyStatus.draft.value:
        study.status = StudyStatus.published.value
        session.add(study)
        session.commit()
        published = True
    return PreparedStudy(study.slug, sorted(targets), row.id or 0, published)
