"""Make an imported study answerable: targets, consent text, published, a model.

``priorly serve`` imports the bundled demo dataset into an empty database and then calls
:func:`queue_demo_preparation`: the demo study gets its targets and consent text, is
published, and its belief model is fitted by a ``fit_model`` job (the in-process worker
runs it), so the server answers at once. Until the model exists the survey at
``/s/<slug>`` shows a "preparing" page (:func:`survey_readiness`); nothing is fitted inside a
request.

Nothing here knows a dataset by name: the targets come from the dataset's own benchmark
runs (the first run's held-out ``eval_qids``, the questions its authors chose to predict),
and a study without runs keeps no targets (sessions then use the target-free criterion,
see :mod:`app.session`).

Example::

    >>> with Session(engine) as db:  # doctest: +SKIP
    ...     queue_demo_preparation(settings, session=db)
    DemoPreparation(slug='ces', state='queued', job_id=1)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlmodel import Session, select

from app.services.belief import active_model_ref, ensure_fitted_model, try_ensure_fixed_order
from app.services.importer import slugify
from app.services.learning import active_fit_job, failed_fit_job, queue_refit
from app.settings import Settings
from app.tables import FittedModel, Item, ItemRole, Study, StudyStatus

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


@dataclass(frozen=True)
class DemoPreparation:
    """What :func:`queue_demo_preparation` found or did.

    Attributes:
        slug: the demo study's slug.
        state: ``"ready"`` (it has an active model), ``"fitting"`` (a fit job was already
            queued or running) or ``"queued"`` (a fit job was queued now).
        job_id: the fit job, when one is queued or running.
    """

    slug: str
    state: Literal["ready", "fitting", "queued"]
    job_id: int | None = None


def open_for_fielding(study: Study, *, session: Session) -> tuple[list[str], bool]:
    """Choose targets (when none are chosen), add a consent text and publish ``study``;
    returns ``(target keys, whether it was published now)``. Fits nothing.

    Idempotent: a study that already has targets, a consent text or is published keeps them.
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
    published = study.status == StudyStatus.draft.value
    if published:
        study.status = StudyStatus.published.value
    session.add(study)
    session.commit()
    return sorted(targets), published


def prepare_study_for_fielding(study: Study, *, session: Session) -> PreparedStudy:
    """:func:`open_for_fielding`, then fit a model in this process (when the study has no
    active one) and store its fixed question order
    (:func:`app.services.belief.try_ensure_fixed_order`). For scripts and tests; the
    server queues the fit instead (:func:`queue_demo_preparation`)."""
    targets, published = open_for_fielding(study, session=session)
    row = ensure_fitted_model(study, session=session)
    # The targets may have been chosen after an earlier fit: store the fixed order of
    # this pool and these targets too, so the first respondent finds it.
    try_ensure_fixed_order(study, session=session, row=row)
    return PreparedStudy(study.slug, targets, row.id or 0, published)


def demo_study(dataset_dir: Path, *, session: Session) -> Study | None:
    """The study imported from the demo dataset ``dataset_dir`` (by its slug), if any."""
    try:
        name = json.loads((Path(dataset_dir) / "dataset.json").read_text(encoding="utf-8"))["name"]
    except (OSError, ValueError, KeyError):
        return None
    return session.exec(select(Study).where(Study.slug == slugify(str(name)))).first()


def queue_demo_preparation(
    settings: Settings, *, session: Session, log: Callable[[str], object] = lambda _m: None
) -> DemoPreparation | None:
    """Open the demo study (``settings.demo_dataset``) and queue the fit of its model, once.

    Called by ``priorly serve`` on every start: ``None`` when there is no demo study
    (``--no-demo``, another study list); ``ready`` when it has an active model;
    ``fitting`` when a fit job is already queued or running; else it chooses targets,
    publishes and queues a ``fit_model`` job (``queued``).
    """
    study = demo_study(settings.demo_dataset, session=session)
    if study is None or study.id is None:
        return None
    survey = f"http://{settings.host}:{settings.port}/s/{study.slug}"
    if active_model_ref(study.id, session=session) is not None:
        log(f"demo survey: {survey}")
        return DemoPreparation(study.slug, "ready")
    running = active_fit_job(study.id, session=session)
    if running is not None:
        log(f"demo survey: {survey} (its model is being fitted by job {running.id})")
        return DemoPreparation(study.slug, "fitting", running.id)
    targets, _ = open_for_fielding(study, session=session)
    job, _ = queue_refit(study, researcher=None, settings=settings, session=session,
                         reason="first model")  # fmt: skip
    log(
        f"demo survey: {survey} (targets: {', '.join(targets) or 'none'}); its model is "
        f"fitted by job {job.id} in the background, the survey says 'preparing' until then"
    )
    return DemoPreparation(study.slug, "queued", job.id)


Readiness = Literal["ready", "preparing", "fit_failed", "no_model"]


def survey_readiness(
    study: Study, *, session: Session, queue_fit: Settings | None = None
) -> Readiness:
    """Whether ``study``'s survey can start a session: ``ready`` (it has an active model),
    ``preparing`` (no model yet, a fit job is queued or running: the survey shows the
    "preparing" page), ``fit_failed`` (no model, and the last fit job failed: it waits
    for a researcher's refit, see :func:`~app.services.learning.failed_fit_job`) or
    ``no_model`` (no model and no fit job). With ``queue_fit`` (the process settings) a
    study without either gets its first ``fit_model`` job queued (imported history, or the
    persona / uniform prior without any) and is ``preparing``, as an API start does. A
    survey never fits a model while a respondent waits."""
    assert study.id is not None
    has_model = session.exec(
        select(FittedModel.id).where(FittedModel.study_id == study.id, FittedModel.is_active)  # type: ignore[arg-type]
    ).first()
    if has_model is not None:
        return "ready"
    if active_fit_job(study.id, session=session) is not None:
        return "preparing"
    if failed_fit_job(study.id, session=session) is not None:
        return "fit_failed"
    if queue_fit is None:
        return "no_model"
    queue_refit(study, researcher=None, settings=queue_fit, session=session,
                reason="first model")  # fmt: skip
    return "preparing"
