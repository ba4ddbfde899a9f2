"""Background jobs as the admin pages show them: rows with a label and progress, the jobs
page, a page about one kind of job, one job's row, cancelling, a simulation's plot.

The pages that list jobs carry ``worker_warning``: when one of their jobs is queued and no
job worker has been seen (:func:`app.services.workers.no_worker_warning`), else empty.

A job row is a dict ``{"job", "label", "active", "percent", "summary", "simulation",
"waiting", "resumable"}``: the :class:`Job`, the kind's label, whether it is queued or
running (the row then polls itself), its progress in whole percent, e.g. ``percent =
round(100 * 0.426) = 43``, a succeeded job's result in words (:func:`result_summary`),
for a succeeded simulation what its figures rest on (:func:`simulation_view`), what a
queued job waits behind, and whether it offers Resume (:func:`resumable`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlmodel import Session, select

from app.errors import NotFoundError
from app.jobs.registry import LABELS, kind_names
from app.schemas import StudySettings
from app.services import jobs, model_notes
from app.services import personas as persona_service
from app.services.persona_models import server_root
from app.services.plots import simulation_svg
from app.services.setting_words import BELIEF_MODEL_LABELS, FAMILY_LABELS, describe_fit
from app.services.simulation import (
    FEW_TEST_RESPONDENTS,
    MIN_REPLAYABLE,
    imported_count,
    unavailable_reason,
)
from app.services.studies import study_personas
from app.services.workers import no_worker_warning
from app.settings import Settings
from app.tables import Job, JobStatus, Study
from inference_server.model_store import DEFAULT_MODEL

PERSONAS_SHOWN = 200
"""Personas listed on the jobs page (the count covers all of them)."""


def job_row(job: Job, ahead: tuple[int, int] | None = None) -> dict[str, Any]:
    """The row of ``job`` (see the module docstring); ``waiting`` says, for a queued job,
    what it waits behind (``ahead``: :func:`app.services.jobs.jobs_ahead`)."""
    return {
        "job": job,
        "label": LABELS.get(job.kind, job.kind),
        "active": job.status in jobs.ACTIVE,
        "percent": int(round(100 * (job.progress or 0.0))),
        "summary": result_summary(job),
        "simulation": simulation_view(job),
        "waiting": waiting_words(*ahead) if ahead else "",
        "resumable": resumable(job),
    }


SIMULATED_MIXTURE = {"default": "latent classes", "persona_mixture": "language-model personas"}
"""A simulation's ``persona_mixture`` family in words, by the study's ``belief_model``."""


def simulation_view(job: Job | None) -> dict[str, Any] | None:
    """What a succeeded simulation's figures rest on: ``n_test`` (test respondents
    replayed), ``few`` (fewer than :data:`app.services.simulation.FEW_TEST_RESPONDENTS`:
    the page then shows a caution instead of a conclusion), ``threshold``, and the model
    the curves come from, ``belief_model`` (the study setting, e.g. ``auto``) and
    ``model_family`` (the fitted family, e.g. ``cape_cooccurrence``) with their words
    (``belief_label``, ``family_label``; empty for a result stored without them).
    ``None`` for any other job."""
    if job is None or job.kind != "simulation" or job.status != JobStatus.succeeded.value:
        return None
    r = job.result or {}
    n_test = int(r.get("n_test") or 0)
    belief, family = str(r.get("belief_model") or ""), str(r.get("model_family") or "")
    family_label = FAMILY_LABELS.get(family, family)
    if family == "persona_mixture":  # latent classes are persona mixtures too
        family_label = SIMULATED_MIXTURE.get(belief, "latent classes or language-model personas")
    return {
        "n_test": n_test,
        "few": n_test < FEW_TEST_RESPONDENTS,
        "threshold": FEW_TEST_RESPONDENTS,
        "belief_model": belief,
        "belief_label": BELIEF_MODEL_LABELS.get(belief, belief),
        "model_family": family,
        "family_label": family_label,
    }


def resumable(job: Job) -> bool:
    """Whether a persona generation job offers Resume: when it was cancelled, or failed
    after its checks. One that failed in them (no server configured, a server that is
    down or serves another model, a worker with other settings, no questions) stays at
    :data:`app.services.personas.GENERATION_CHECKING`: the settings must change first, and
    the Generate form starts it again."""
    return job.kind == "persona_generation" and (
        job.status == JobStatus.cancelled.value
        or (
            job.status == JobStatus.failed.value
            and job.message != persona_service.GENERATION_CHECKING
        )
    )


def waiting_words(earlier: int, other_studies: int) -> str:
    """A queued job's wait in words, e.g. ``waiting_words(2, 1)`` = "waiting for 2 earlier
    jobs to finish first (1 of another study)"; empty when nothing is ahead."""
    if earlier <= 0:
        return ""
    jobs_word = "job" if earlier == 1 else "jobs"
    other = (
        f" ({other_studies} of {'another study' if other_studies == 1 else 'other studies'})"
        if other_studies
        else ""
    )
    return f"waiting for {earlier} earlier {jobs_word} to finish first{other}"


def job_rows(rows: list[Job], *, session: Session) -> list[dict[str, Any]]:
    """:func:`job_row` of each job, with what the queued ones wait behind (one query)."""
    ahead = jobs.jobs_ahead(rows, session=session)
    return [job_row(j, ahead.get(j.id or 0)) for j in rows]


def worker_warning(jobs_shown: list[Job], *, session: Session) -> str:
    """:func:`app.services.workers.no_worker_warning` for a page listing ``jobs_shown``:
    non-empty only when one of them is queued and no worker is seen."""
    queued = any(j.status == JobStatus.queued.value for j in jobs_shown)
    return no_worker_warning(session, queued=queued)


def _persona_words(r: dict[str, Any]) -> str:
    flagged = int(r.get("flagged") or 0)
    return (
        f"{int(r['computed']):,} persona × question pairs scored "
        f"({int(r['personas']):,} personas × {int(r['questions']):,} questions; "
        f"{int(r['already_stored']):,} were already stored) at "
        f"{float(r['pairs_per_second']):.1f} pairs per second with {r['model']}"
        + (
            f" on the inference server {r['base_url']}"
            if r.get("backend") == "openai" and r.get("base_url")
            else " (the embedded model)"
            if r.get("backend") == "local"
            else ""
        )
        + (
            f"; {flagged:,} flagged: the model put little probability on the answer "
            "letters, so its distribution says little"
            if flagged
            else ""
        )
    )


FIXED_ORDER_WORDS = {
    "computed": "the fixed question order was computed",
    "stored": "the fixed question order was already stored",
    "not_needed": "not needed: the study's criterion does not use a fixed order",
    "not_applicable": "nothing to compute: the study has no fitted model, or no question "
    "or target items",
    "failed": "the fixed order could not be computed",
}
"""What a ``fixed_order`` job's ``status`` means (:class:`app.services.belief.FixedOrderResult`)."""


def _fixed_order_words(r: dict[str, Any]) -> str:
    words = FIXED_ORDER_WORDS[str(r["status"])]
    if r.get("cpu_seconds") is not None:
        words += f" in {float(r['cpu_seconds']):.1f} s of CPU"
    return words + (f": {r['message']}" if r.get("message") else "")


def _gnn_words(r: dict[str, Any]) -> str:
    epoch = int(r["best_epoch"])
    return (
        f"group GNN trained on {int(r['members']):,} imported respondents in "
        f"{float(r['seconds']):.1f} s; cross-entropy on the held-out respondents "
        f"{float(r['best_val_ce']):.3f} nats per answer "
        + (
            "after the first epoch (more training did not lower it)"
            if epoch == 0
            else f"at its best epoch, {epoch}"
        )
    )


RESULT_WORDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "persona_generation": _persona_words,
    "fixed_order": _fixed_order_words,
    "train_gnn": _gnn_words,
}
"""A succeeded job's result in words, per kind (others: their fields)."""


def result_summary(job: Job) -> str | None:
    """A succeeded job's result in words: a fitted model by its family, size and validation
    score (:func:`app.services.setting_words.describe_fit`); other kinds: their result fields
    but ids, hashes and metrics. ``None`` before success."""
    result = job.result or {}
    if job.status != JobStatus.succeeded.value or not result:
        return None
    if job.kind == "fit_model":
        return str(
            result.get("summary")
            or describe_fit(str(result.get("family", "")), result.get("metrics"))
        )
    if job.kind in RESULT_WORDS:
        try:
            return RESULT_WORDS[job.kind](result)
        except (KeyError, TypeError, ValueError):  # a result of an older shape
            pass
    shown = {
        k: v
        for k, v in result.items()
        if k != "metrics"
        and not k.endswith(("_id", "_hash", "_ids"))
        and not isinstance(v, (dict, list))
    }
    return "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in shown.items()) or None


def jobs_overview(study: Study, *, session: Session) -> dict[str, Any]:
    """The jobs page: ``study``, its newest ``jobs`` as rows, the ``kinds`` that can be
    started here (``(name, label, why not)``: ``why not`` is the reason a job of that kind
    would fail now, e.g. a simulation without imported respondents, else ``None``; persona
    generation is started from the Personas page, where the backend is chosen), and the
    study's persona dictionary (``personas``, the first :data:`PERSONAS_SHOWN`;
    ``n_personas``, all)."""
    personas, n_personas = study_personas(study, session=session, limit=PERSONAS_SHOWN)
    why_not = {
        "simulation": unavailable_reason(study, session=session),
        "train_gnn": None
        if imported_count(study, session=session) >= MIN_REPLAYABLE
        else "it learns from imported respondents' complete answers, and this study has too "
        "few: import a dataset with this study's items (Import).",
    }
    shown = jobs.study_jobs(study, session=session)
    return {
        "study": study,
        "jobs": job_rows(shown, session=session),
        "worker_warning": worker_warning(shown, session=session),
        "kinds": [
            (k, LABELS[k], why_not.get(k)) for k in kind_names() if k != "persona_generation"
        ],
        "personas": personas,
        "n_personas": n_personas,
    }


def persona_overview(
    study: Study, *, session: Session, settings: Settings, **extra: Any
) -> dict[str, Any]:
    """The personas page: :func:`app.services.personas.persona_page` with the
    ``prior_warning`` of :func:`app.services.personas.uniform_prior_warning`,
    ``persona_use`` (:func:`app.services.model_notes.persona_use`), the ``estimates`` of
    a generation's duration (:func:`generation_estimates`), the study's newest persona
    generation ``jobs`` as rows, ``newest_persona_job`` (its id: only that job
    offers Resume when it was cancelled or failed) and ``extra`` (an ``error`` or
    ``notice``)."""
    shown = [
        j
        for j in jobs.study_jobs(study, session=session, limit=50)
        if j.kind == "persona_generation"
    ][:10]
    rows = job_rows(shown, session=session)
    page = persona_service.persona_page(study, session=session, settings=settings)
    return {
        **page,
        "estimates": generation_estimates(
            page["n_pairs"] - page["n_pairs_scored"], session=session, settings=settings
        ),
        "prior_warning": persona_service.uniform_prior_warning(study, session=session),
        "persona_use": model_notes.persona_use(study, session=session),
        "jobs": rows,
        "worker_warning": worker_warning(shown, session=session),
        "newest_persona_job": rows[0]["job"].id if rows else None,
        **extra,
    }


EMBEDDED_PAIRS_PER_SECOND = 1.85
"""The embedded model's persona × question pairs per second on one core, as the job runs
it (one thread, batches of 8, the persona's prefix reused: docs/inference.md, "pairs per
CPU s"): the estimate until a job on this server has measured its own rate."""


def measured_rates(*, session: Session, settings: Settings) -> dict[str, tuple[float, int]]:
    """``{backend: (pairs per second, job id)}`` of the newest succeeded persona generation
    job (of any study, among the newest 50) that scored at least 8 pairs with each backend:
    the embedded model (``local``), or the inference server the settings name now
    (``openai``: same URL and model); a backend without one is left out."""
    want_url = server_root(settings.llm_base_url or "")
    want_model = settings.llm_model or DEFAULT_MODEL
    rows = session.exec(
        select(Job)
        .where(Job.kind == "persona_generation", Job.status == JobStatus.succeeded.value)
        .order_by(Job.id.desc())  # type: ignore[union-attr]
        .limit(50)
    ).all()
    found: dict[str, tuple[float, int]] = {}
    for job in rows:
        result = job.result or {}
        backend = result.get("backend")
        rate, computed = result.get("pairs_per_second"), result.get("computed")
        if backend in found or not isinstance(rate, int | float) or rate <= 0:
            continue
        if not isinstance(computed, int) or computed < 8:
            continue
        if backend == "openai" and (
            result.get("base_url") != want_url or result.get("model") != want_model
        ):
            continue
        found[str(backend)] = (float(rate), int(job.id or 0))
    return found


def generation_estimates(missing: int, *, session: Session, settings: Settings) -> dict[str, str]:
    """How long generating ``missing`` pairs would take, per backend (``local``,
    ``openai``), in words for the Generate form: ``missing / rate`` with the rate a job on
    this server measured (:func:`measured_rates`), else :data:`EMBEDDED_PAIRS_PER_SECOND`
    for the embedded model and "unknown" for an inference server.

    Example: 7,000 pairs with no job measured: ``{"local": "about 1 h 3 min (7,000 pairs at
    1.85 pairs/s, the embedded model's speed on one core)", "openai": "unknown ..."}``.
    """
    out: dict[str, str] = {}
    measured = measured_rates(session=session, settings=settings) if missing > 0 else {}
    for backend in persona_service.BACKENDS:
        if missing <= 0:
            out[backend] = "nothing to score: every pair has a stored distribution"
            continue
        found = measured.get(backend)
        if found is not None:
            rate, job_id = found
            source = f"measured by job #{job_id} on this server"
        elif backend == "local":
            rate, source = EMBEDDED_PAIRS_PER_SECOND, "the embedded model's speed on one core"
        else:
            out[backend] = (
                f"unknown for {missing:,} pairs: this server's speed is known once a "
                "generation on it has finished (a running job's progress gives its rate)"
            )
            continue
        seconds = persona_service.format_seconds(max(1.0, missing / rate))
        out[backend] = f"about {seconds} ({missing:,} pairs at {rate:.3g} pairs/s, {source})"
    return out


def kind_overview(study: Study, kind: str, *, session: Session) -> dict[str, Any]:
    """A page about one job kind: ``study``, its queued or running jobs of ``kind`` among
    the newest 20 (``pending``, as rows), the newest succeeded one (``latest``; for a
    simulation ``latest_simulation``, :func:`simulation_view`), the newest failed one when it came after that (``failed``, as a row: why the last run
    gave nothing) and the study's validated ``settings``."""
    newest = [j for j in jobs.study_jobs(study, session=session, limit=20) if j.kind == kind]
    latest = jobs.latest_result(study, kind, session=session)
    failed = next((j for j in newest if j.status == JobStatus.failed.value), None)
    if failed is not None and latest is not None and (latest.id or 0) > (failed.id or 0):
        failed = None
    pending = [j for j in newest if j.status in jobs.ACTIVE]
    return {
        "study": study,
        "pending": job_rows(pending, session=session),
        "worker_warning": worker_warning(pending, session=session),
        "latest": latest,
        "latest_simulation": simulation_view(latest),
        "failed": job_row(failed) if failed is not None else None,
        "settings": StudySettings.model_validate(study.settings or {}),
    }


def study_job_row(study: Study, job_id: int, *, session: Session) -> dict[str, Any]:
    """The row of job ``job_id`` of ``study`` (:class:`NotFoundError` for another study's)."""
    return job_rows([jobs.get_study_job(study, job_id, session=session)], session=session)[0]


def cancel_study_job(study: Study, job_id: int, *, session: Session) -> dict[str, Any]:
    """Cancel job ``job_id`` of ``study`` (:func:`app.services.jobs.cancel_job`); its row."""
    job = jobs.get_study_job(study, job_id, session=session)
    jobs.cancel_job(job, session=session)
    return job_row(job)


def simulation_plot(study: Study, job_id: int, *, session: Session) -> str:
    """The SVG plot of the succeeded simulation job ``job_id`` of ``study``;
    :class:`NotFoundError` for any other job."""
    job = jobs.get_study_job(study, job_id, session=session)
    if job.kind != "simulation" or job.status != JobStatus.succeeded.value or not job.result:
        raise NotFoundError("this job has no simulation plot")
    return simulation_svg(job.result)
