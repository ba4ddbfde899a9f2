"""The learning loop of a study's model: training data, held-out split, promotion, refits.

**Training data** (:func:`study_training_data`): the study's imported respondents and its
live ones (browser and API; completed and partial; never preview sessions, and an erased
respondent's rows no longer exist), as response matrices over the study's items
(``-1`` = not asked or skipped). A live respondent's row is its attributes and the answers
of its sessions, so the adaptive pattern of missing answers is kept as it is: the fits use
the observed-data likelihood, which is valid because which question was asked depends
only on earlier answers (docs/methods.md, "Learning from adaptive data").

**The split** (:func:`respondent_part`), stable across refits:

* an imported respondent with a dataset split keeps it: ``train`` fits, ``val`` is the
  fit's own selection set (the number of latent classes, ``auto``'s choice), ``test`` is
  held out;
* every other respondent (live, or imported without a split) goes by
  :func:`split_bucket`, ``sha256("<study id>:<respondent id>") mod 100``: below
  :data:`HOLDOUT_PERCENT` held out, below ``HOLDOUT_PERCENT + SELECTION_PERCENT`` the
  selection set, else training.

Held-out respondents are never fitted on. **Promotion** (:func:`judge`): a new fit is
promoted to the study's active model only when its mean log-likelihood per held-out
respondent (:func:`elicitation.holdout.mean_log_likelihood`) beats the active model's on
the same respondents; otherwise it is stored with status ``rejected`` and both scores.

**Refits** (:func:`maybe_queue_refit`, :func:`queue_refit`): the study setting
``refit_every`` queues a ``fit_model`` job after that many new completed live sessions
since the last fit job; "Refit now" on the study page queues one at once. Nothing is ever
fitted inside a respondent's request, and one fit job per study at a time.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import torch
from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.errors import ConflictError
from app.schemas import StudySettings
from app.services.jobs import ACTIVE, JobAlreadyActiveError, start_job
from app.services.setting_words import FAMILY_LABELS
from app.settings import Settings, get_settings
from app.tables import (
    Answer,
    ElicitationSession,
    FittedModel,
    Item,
    Job,
    JobStatus,
    ModelStatus,
    Researcher,
    Respondent,
    RespondentSource,
    SessionStatus,
    Study,
)
from elicitation.holdout import mean_log_likelihood
from models.base import BeliefModel, load_model

log = logging.getLogger("priorly.learning")

HOLDOUT_PERCENT = 20
"""Share (percent) of the respondents without a dataset split held out for promotion."""
SELECTION_PERCENT = 15
"""Share (percent) of them used as the fit's own selection set (inside the training part)."""
FIT_JOB = "fit_model"

Part = Literal["train", "selection", "holdout"]


def split_bucket(study_id: int, respondent_id: int) -> int:
    """``sha256("<study_id>:<respondent_id>")`` as a number mod 100: a respondent's stable
    bucket in ``[0, 100)``. Example: ``split_bucket(1, 1)`` is always the same number."""
    digest = hashlib.sha256(f"{study_id}:{respondent_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100


def respondent_part(study_id: int, respondent_id: int, dataset_split: str | None) -> Part:
    """Where a respondent goes: ``train``, ``selection`` (the fit's own validation, part of
    the training data) or ``holdout`` (never fitted on; scores the promotion).

    A dataset split is kept (``train`` -> train, ``val`` -> selection, ``test`` ->
    holdout); otherwise :func:`split_bucket` decides (:data:`HOLDOUT_PERCENT`,
    :data:`SELECTION_PERCENT`)."""
    if dataset_split == "train":
        return "train"
    if dataset_split == "val":
        return "selection"
    if dataset_split == "test":
        return "holdout"
    bucket = split_bucket(study_id, respondent_id)
    if bucket < HOLDOUT_PERCENT:
        return "holdout"
    return "selection" if bucket < HOLDOUT_PERCENT + SELECTION_PERCENT else "train"


@dataclass(frozen=True)
class TrainingData:
    """A study's respondents as matrices ``[N, I]`` over its items (option indices in
    ``item.options`` order, ``-1`` missing), split by :func:`respondent_part`.

    Attributes:
        train / selection / holdout: the three parts (``fit_on`` = train + selection).
        counts: ``{part: {"imported": n, "live": n}}``.
    """

    train: torch.Tensor
    selection: torch.Tensor
    holdout: torch.Tensor
    counts: dict[str, dict[str, int]]

    @property
    def n_imported(self) -> int:
        """Imported respondents fitted on (train + selection)."""
        return self.counts["train"]["imported"] + self.counts["selection"]["imported"]

    @property
    def n_live(self) -> int:
        """Live respondents fitted on (train + selection)."""
        return self.counts["train"]["live"] + self.counts["selection"]["live"]

    @property
    def n_holdout(self) -> int:
        return int(self.holdout.shape[0])


def live_rows(study_id: int, items: Sequence[Item], *, session: Session) -> dict[int, list[int]]:
    """``{respondent id: row}`` of the study's live respondents with a non-preview session:
    row ``j`` is the option index of item ``items[j]`` (``-1`` where missing) from their
    attributes and the answered (not skipped) questions of all their sessions, respondent
    id order. Letters that are not an option of the item are treated as missing.

    Example: items ``(x, a, t)`` with options ``A, B``; a respondent who gave ``x = B``
    and answered ``a = A`` has the row ``[1, 0, -1]``.
    """
    col_of = {it.key: j for j, it in enumerate(items)}
    id_col = {it.id: j for j, it in enumerate(items)}
    letter_index = [{opt[0]: k for k, opt in enumerate(it.options)} for it in items]
    n = len(items)
    live_ids = select(ElicitationSession.respondent_id).where(
        ElicitationSession.study_id == study_id, col(ElicitationSession.is_preview).is_(False)
    )
    live = session.exec(
        select(Respondent.id, Respondent.attributes)
        .where(
            Respondent.study_id == study_id,
            Respondent.source == RespondentSource.live.value,
            col(Respondent.id).in_(live_ids),
        )
        .order_by(col(Respondent.id))
    ).all()
    out: dict[int, list[int]] = {}
    for rid, attributes in live:
        row = [-1] * n
        for key, letter in (attributes or {}).items():
            j = col_of.get(key)
            if j is not None:
                row[j] = letter_index[j].get(letter, -1)
        out[int(rid or 0)] = row
    answers = session.exec(
        select(ElicitationSession.respondent_id, Answer.item_id, Answer.option)
        .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
        .where(
            ElicitationSession.study_id == study_id,
            col(ElicitationSession.is_preview).is_(False),
            col(Answer.option).is_not(None),
        )
    ).all()
    for rid, item_id, option in answers:
        row = out.get(int(rid))
        j = id_col.get(item_id)
        if row is not None and j is not None:
            row[j] = letter_index[j].get(option or "", -1)
    return out


def imported_rows(
    study_id: int, items: Sequence[Item], *, session: Session
) -> list[tuple[int, list[int], str | None]]:
    """``(respondent id, row, dataset split)`` of the study's imported respondents, id
    order: row ``j`` is the option index of item ``items[j]`` (``-1`` where missing) from
    their attributes and stored answers; letters that are not an option are missing.

    Example: items ``(x, a)`` with options ``A, B``; an imported respondent with ``x = B``
    and no answer to ``a`` has the row ``[1, -1]``.
    """
    col_of = {it.key: j for j, it in enumerate(items)}
    letter_index = [{opt[0]: k for k, opt in enumerate(it.options)} for it in items]
    out: list[tuple[int, list[int], str | None]] = []
    for rid, attributes, answers, split in session.exec(
        select(Respondent.id, Respondent.attributes, Respondent.answers, Respondent.split)
        .where(
            Respondent.study_id == study_id,
            Respondent.source == RespondentSource.import_.value,
        )
        .order_by(col(Respondent.id))
    ).all():
        row = [-1] * len(items)
        for mapping in (attributes or {}, answers or {}):
            for key, letter in mapping.items():
                j = col_of.get(key)
                if j is not None:
                    row[j] = letter_index[j].get(letter, -1)
        out.append((int(rid or 0), row, split))
    return out


def study_training_data(study_id: int, items: Sequence[Item], *, session: Session) -> TrainingData:
    """The study's imported and live respondents as :class:`TrainingData`.

    A live respondent counts when it has a non-preview session and at least one observed
    cell (an attribute or an answered question); its row holds its attributes and the
    answered (not skipped) questions of its sessions (:func:`imported_rows`,
    :func:`live_rows`).
    """
    n = len(items)
    rows: dict[Part, list[list[int]]] = {"train": [], "selection": [], "holdout": []}
    counts = {p: {"imported": 0, "live": 0} for p in rows}

    def add(part: Part, source: str, row: list[int]) -> None:
        if any(v >= 0 for v in row):
            rows[part].append(row)
            counts[part][source] += 1

    for rid, row, split in imported_rows(study_id, items, session=session):
        add(respondent_part(study_id, rid, split), "imported", row)

    for rid, row in live_rows(study_id, items, session=session).items():
        add(respondent_part(study_id, rid, None), "live", row)

    def as_t(part: Part) -> torch.Tensor:
        return torch.tensor(rows[part], dtype=torch.long).reshape(-1, n)

    return TrainingData(as_t("train"), as_t("selection"), as_t("holdout"), counts)


# ----- promotion -------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` decided about a new fit.

    Attributes:
        status: ``promoted`` or ``rejected``.
        reason: why, in words (shown on the study page).
        score: the new fit's mean held-out log-likelihood per respondent (``None``
            without held-out respondents).
        active_score: the active model's on the same respondents (``None`` without an
            active model, or when it cannot be compared).
    """

    status: str
    reason: str
    score: float | None
    active_score: float | None


def _same_items(a: BeliefModel, b: BeliefModel) -> bool:
    return tuple(a.item_bank.keys) == tuple(b.item_bank.keys) and tuple(
        a.item_bank.n_options
    ) == tuple(b.item_bank.n_options)


def judge(
    candidate: BeliefModel,
    active: BeliefModel | None,
    holdout: torch.Tensor,
    *,
    force: bool = False,
    unscored_replaces: bool = False,
) -> Verdict:
    """Promote ``candidate`` over ``active`` or reject it, by the mean log-likelihood per
    held-out respondent of their observed answers (higher wins; a tie keeps the active).

    Promoted without a comparison: the first model of a study, a fit ``force``-d by the
    caller, an active model over other items (the study's items changed since it was
    fitted), or, while the study has no held-out respondents yet, a candidate that may
    replace the active model unscored (``unscored_replaces``: the active model is the
    uniform prior, which knows nothing, or the candidate learned from no respondent, a
    prior rebuilt from the researcher's inputs). Without held-out respondents any other
    active model (a persona prior, an earlier fit) stays: nothing shows that the
    candidate is better.
    """
    score = mean_log_likelihood(candidate, holdout)
    if active is None:
        return Verdict(ModelStatus.promoted.value, "first model of the study", score, None)
    if not _same_items(candidate, active):
        return Verdict(
            ModelStatus.promoted.value,
            "the study's items changed since the active model was fitted",
            score,
            None,
        )
    active_score = mean_log_likelihood(active, holdout)
    if force:
        return Verdict(ModelStatus.promoted.value, "promoted on request", score, active_score)
    if (score is None or active_score is None) and unscored_replaces:
        return Verdict(
            ModelStatus.promoted.value,
            "no held-out respondents to compare on, and nothing learned from respondents "
            "is replaced",
            score,
            active_score,
        )
    if score is None or active_score is None:
        return Verdict(
            ModelStatus.rejected.value,
            "no held-out respondents to compare on yet, so the active model stays (a refit "
            "is promoted once held-out respondents show it predicts better)",
            score,
            active_score,
        )
    if score > active_score:
        return Verdict(
            ModelStatus.promoted.value,
            f"beats the active model on {int(holdout.shape[0])} held-out respondents "
            f"({-score:.3f} vs {-active_score:.3f} nats of log loss per respondent)",
            score,
            active_score,
        )
    if score == active_score:  # e.g. a refit without new respondents: the same model
        return Verdict(
            ModelStatus.rejected.value,
            f"ties with the active model on {int(holdout.shape[0])} held-out respondents "
            f"({-score:.3f} nats of log loss per respondent; nothing new was learned), so "
            "the active model stays",
            score,
            active_score,
        )
    return Verdict(
        ModelStatus.rejected.value,
        f"does not beat the active model on {int(holdout.shape[0])} held-out respondents "
        f"({-score:.3f} vs {-active_score:.3f} nats of log loss per respondent)",
        score,
        active_score,
    )


def load_row_model(row: FittedModel | None) -> BeliefModel | None:
    """The deserialised model of a stored row (``None`` for ``None``)."""
    return None if row is None else load_model(bytes(row.blob))


# ----- model versions (the study page) --------------------------------------------------


@dataclass(frozen=True)
class ModelVersion:
    """One fitted model of a study as the study page lists it.

    ``label`` is the family in words (e.g. ``latent classes, 12 classes``);
    ``val_log_loss`` is ``-val_log_lik`` (nats per held-out respondent; lower is better);
    ``choice`` the candidates ``auto`` compared (``metrics["model_choice"]``: ``name``,
    ``log_loss_0``, ``log_loss_T``, ``mean_log_loss``, ``chosen``), empty for other fits,
    and ``choice_respondents`` the validation respondents it rests on
    (``metrics["model_choice_respondents"]``, ``None`` when not recorded).
    """

    id: int
    family: str
    label: str
    created_at: datetime
    is_active: bool
    status: str | None
    reason: str | None
    n_imported: int
    n_live: int
    n_validation: int
    val_log_loss: float | None
    active_val_log_loss: float | None
    choice: list[dict[str, Any]] = field(default_factory=list)
    choice_respondents: int | None = None


def _family_label(family: str, metrics: dict[str, Any] | None) -> str:
    """The model versions table's words for a fit, e.g. ``"latent classes, 16 classes"``,
    ``"latent classes, the average of 6 fits (96 classes in all)"`` (the ensemble of
    :func:`models.latent_class.fit_latent_classes`), ``"uniform prior"``."""
    m = metrics or {}
    if m.get("prior") == "uniform":
        return "uniform prior"
    parts = [
        "latent classes" if m.get("model") == "latent_class" else FAMILY_LABELS.get(family, family)
    ]
    fits = m.get("classes_per_fit")
    if isinstance(fits, list) and len(fits) > 1 and isinstance(m.get("n_classes"), int):
        parts.append(f"the average of {len(fits)} fits ({m['n_classes']:,} classes in all)")
    elif isinstance(m.get("n_classes"), int):
        parts.append(f"{m['n_classes']:,} classes")
    chosen = [r for r in m.get("model_choice") or [] if isinstance(r, dict) and r.get("chosen")]
    if chosen:
        parts.append(f"auto: {chosen[0].get('name')}")
    return ", ".join(parts)


def model_versions(study_id: int, *, session: Session, limit: int = 20) -> list[ModelVersion]:
    """The study's belief-model versions, newest first (GNN rows left out)."""
    rows = session.exec(
        select(
            FittedModel.id,
            FittedModel.family,
            FittedModel.created_at,
            FittedModel.is_active,
            FittedModel.status,
            FittedModel.reason,
            FittedModel.n_imported,
            FittedModel.n_live,
            FittedModel.n_validation,
            FittedModel.val_log_lik,
            FittedModel.active_val_log_lik,
            FittedModel.metrics,
        )
        .where(FittedModel.study_id == study_id, FittedModel.family != "gnn")
        .order_by(col(FittedModel.id).desc())
        .limit(limit)
    ).all()
    return [
        ModelVersion(
            id=int(r[0] or 0),
            family=str(r[1]),
            label=_family_label(str(r[1]), r[11]),
            created_at=r[2],
            is_active=bool(r[3]),
            status=r[4],
            reason=r[5],
            n_imported=int(r[6] or 0),
            n_live=int(r[7] or 0),
            n_validation=int(r[8] or 0),
            val_log_loss=None if r[9] is None else -float(r[9]),
            active_val_log_loss=None if r[10] is None else -float(r[10]),
            choice=[c for c in (r[11] or {}).get("model_choice") or [] if isinstance(c, dict)],
            choice_respondents=(r[11] or {}).get("model_choice_respondents"),
        )
        for r in rows
    ]


# ----- refits ------------------------------------------------------------------------------


def active_fit_job(study_id: int, *, session: Session) -> Job | None:
    """The study's queued or running ``fit_model`` job, if any."""
    return session.exec(
        select(Job)
        .where(Job.study_id == study_id, Job.kind == FIT_JOB, col(Job.status).in_(ACTIVE))
        .order_by(col(Job.id).desc())
    ).first()


def failed_fit_job(study_id: int, *, session: Session) -> Job | None:
    """The study's latest ``fit_model`` job if it failed. A study without a model whose
    last fit failed waits for a researcher ("Refit now" after fixing what the job's error
    names): no survey visit or API start queues another fit that would fail the same way."""
    job = session.exec(
        select(Job)
        .where(Job.study_id == study_id, Job.kind == FIT_JOB)
        .order_by(col(Job.id).desc())
    ).first()
    return job if job is not None and job.status == JobStatus.failed.value else None


def queue_refit(
    study: Study,
    *,
    researcher: Researcher | None,
    settings: Settings,
    session: Session,
    reason: str = "refit now",
) -> tuple[Job, bool]:
    """Queue a ``fit_model`` job for ``study`` unless one is queued or running;
    returns ``(the job, whether it was queued now)``."""
    assert study.id is not None
    running = active_fit_job(study.id, session=session)
    if running is not None:
        return running, False
    try:
        job = start_job(
            FIT_JOB, study, payload={"reason": reason}, researcher=researcher,
            settings=settings, session=session,
        )  # fmt: skip
    except JobAlreadyActiveError as exc:  # queued by another request since the check
        return exc.job, False
    return job, True


def completed_since_last_fit(study_id: int, *, session: Session) -> int:
    """Completed live (non-preview) sessions of the study since its last ``fit_model`` job
    was created (all of them when it never had one)."""
    last = session.exec(
        select(func.max(Job.created_at)).where(Job.study_id == study_id, Job.kind == FIT_JOB)
    ).one()
    query = select(func.count()).where(
        ElicitationSession.study_id == study_id,
        ElicitationSession.status == SessionStatus.completed.value,
        col(ElicitationSession.is_preview).is_(False),
    )
    if last is not None:
        query = query.where(col(ElicitationSession.completed_at) > last)
    return int(session.exec(query).one())


class ModelPreparingError(ConflictError):
    """The study has no model yet; a ``fit_model`` job is fitting it (409
    ``model_preparing``: retry once the job has finished)."""

    code = "model_preparing"
    retry_after = 30
    """Seconds a client should wait before retrying (the API's ``Retry-After``)."""


class ModelFitFailedError(ConflictError):
    """The study has no model and its last ``fit_model`` job failed (409
    ``model_fit_failed``: a researcher fixes the study and refits; retrying does not help)."""

    code = "model_fit_failed"


def model_preparing(study_id: int, slug: str, *, engine: Engine) -> ConflictError:
    """Queue the first fit of a study without a model (unless one is queued or running,
    or the last one failed) and return the error telling the caller to retry, or that the
    fit failed: a request never fits a model."""
    with Session(engine) as db:
        study = db.get(Study, study_id)
        job = active_fit_job(study_id, session=db)
        failed = failed_fit_job(study_id, session=db) if job is None else None
        if failed is not None:
            reason = (failed.error or "no reason recorded").strip().splitlines()[0][:300]
            return ModelFitFailedError(
                f"study {slug!r} has no fitted belief model: its last fit (job {failed.id}) "
                f"failed: {reason}. A researcher must fix the study and refit it (admin "
                "study page, Refit now); retrying the start does not help"
            )
        if job is None and study is not None:
            job, _ = queue_refit(
                study, researcher=None, settings=_settings_for(engine), session=db,
                reason="first model",
            )  # fmt: skip
    which = f" by job {job.id}" if job is not None else ""
    return ModelPreparingError(
        f"study {slug!r} has no fitted belief model yet: it is being fitted{which}; "
        "retry when the job has finished"
    )


def _settings_for(engine: Engine) -> Settings:
    """The process settings pointed at ``engine``'s database (for the job queue)."""
    url = engine.url.render_as_string(hide_password=False)
    settings = get_settings()
    return (
        settings
        if settings.database_url == url
        else settings.model_copy(update={"database_url": url})
    )


def refit_every(settings: dict[str, Any] | None) -> int:
    """The study's ``refit_every`` setting (0 when the settings are invalid)."""
    try:
        return StudySettings.model_validate(settings or {}).refit_every
    except ValueError:
        return 0


EARLY_REFIT = 25
"""The first automatic refit of a study comes after this many completed live respondents
(or ``refit_every``, if smaller): see :func:`refit_threshold`."""


def refit_threshold(every: int, fitted: int) -> int:
    """New completed respondents that trigger the next automatic refit: ``refit_every``,
    but sooner while the active model was fitted on few respondents, so that a study
    that starts without history learns early (the threshold doubles the data each time).

    ``min(every, max(EARLY_REFIT, fitted))`` where ``fitted`` is the number of respondents
    behind the active model (imported, live and held out). Example with ``every = 500``:
    refits after 25, 25, 50, 100, 200, 400, 500, 500, ... new respondents (at about 25, 50,
    100, 200, 400, 800, 1,300, ... live respondents in all).
    """
    return min(every, max(EARLY_REFIT, fitted))


def maybe_queue_refit(
    study_id: int, study_settings: dict[str, Any] | None, *, engine: Engine
) -> Job | None:
    """After a completed session: queue a ``fit_model`` job when :func:`refit_threshold`
    new completed live sessions (at most the study's ``refit_every``, N > 0) were stored
    since its last fit job and no fit job is queued or running. Three cheap queries, no
    fitting; never raises (a respondent's answer must not fail because of it: the log
    says why). Returns the job queued now."""
    every = refit_every(study_settings)
    if every <= 0:
        return None
    try:
        with Session(engine) as db:
            if active_fit_job(study_id, session=db) is not None:
                return None
            fitted = db.exec(
                select(FittedModel.n_imported + FittedModel.n_live + FittedModel.n_validation)
                .where(
                    FittedModel.study_id == study_id,
                    col(FittedModel.is_active),
                    FittedModel.family != "gnn",
                )
                .order_by(col(FittedModel.id).desc())
            ).first()
            due = refit_threshold(every, int(fitted or 0))
            if completed_since_last_fit(study_id, session=db) < due:
                return None
            study = db.get(Study, study_id)
            if study is None:
                return None
            job, queued = queue_refit(
                study,
                researcher=None,
                settings=_settings_for(engine),
                session=db,
                reason=f"{due} new completed respondents",
            )
            return job if queued else None
    except Exception:
        log.exception("could not queue the refit of study %s", study_id)
        return None
