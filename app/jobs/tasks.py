"""The job functions: what each kind of job (:mod:`app.jobs.registry`) does.

A job function takes a :class:`app.jobs.context.JobContext` and returns a JSON-able dict
(stored in ``job.result``). It is deterministic given the job's payload (seeded), so that
a job retried after its worker died ends with the same result, and it reports progress
through ``ctx.progress`` (which also raises when the job was cancelled). Only the worker
side (:mod:`app.jobs.runner`) imports this module.

Kinds:

* ``fit_model``: fit a new version of the study's belief model on its imported and live
  respondents and promote it when it beats the active one on held-out respondents
  (:func:`app.services.belief.fit_study_model`; a promoted model also gets the fixed
  question order that ``eig_anchored`` and ``fixed`` need). Payload ``force``: promote
  whatever the scores.
* ``fixed_order``: compute and store the fixed question order of the study's active model
  for its current candidates and targets (:func:`app.services.belief.ensure_fixed_order`);
  queued by the live loop when a study needs an order that is not stored (roles edited
  after the fit).
* ``simulation``: "how many questions do I need?"
  (:func:`app.services.simulation.run_study_simulation`).
* ``train_gnn``: train the relational GNN (:func:`gnn.train.train_gnn`) on the study's
  history; stored as an inactive ``fitted_model`` row of family ``gnn``, which the group
  planner loads (:func:`app.services.group_rounds.study_planner_models`).
* ``plan_group_round``: the next group round's question and respondents with their
  scores (:func:`app.services.group_rounds.plan_next_round`: the live planner with the
  study's belief model and trained GNN), stored in the job's result.
* ``persona_generation``: persona answer distributions from a language model
  (:mod:`app.services.personas`, resumable).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch
from sqlmodel import Session, select

from app.errors import InvalidInputError, NotFoundError
from app.jobs.context import JobContext
from app.jobs.registry import KINDS, check_kind
from app.services import personas as persona_service
from app.services.belief import ensure_fixed_order, fit_study_model, historical_matrix
from app.services.group_rounds import MIN_VALIDATION_MEMBERS, gnn_holdout, plan_next_round
from app.services.persona_models import job_server
from app.services.setting_words import describe_fit
from app.services.simulation import SimulationOptions, run_study_simulation
from app.settings import get_settings
from app.tables import FittedModel, Item, ItemRole, Study

JobFn = Callable[[JobContext], dict[str, Any]]


def _study(ctx: JobContext, db: Session) -> Study:
    study = db.get(Study, ctx.study_id) if ctx.study_id is not None else None
    if study is None:
        raise NotFoundError("the study of this job no longer exists")
    return study


FIT_STARTS = {
    "default": "fitting latent classes",
    "auto": "fitting latent classes and CAPE models (automatic choice)",
    "persona_mixture": "building the persona prior",
}
"""The fit job's first message by ``belief_model`` (a CAPE family: ``fitting <family>``)."""


def fit_model(ctx: JobContext) -> dict[str, Any]:
    """Fit the study's belief model (its ``belief_model`` setting) on its respondents and
    promote it when it beats the active one; payload ``seed`` (default 0), ``force``.

    Progress: 5% at the start, then the fit's own steps (EM restarts over the ``K`` grid,
    the CAPE fits of ``auto``) up to 90%, then storing the model and its fixed order. The
    result holds ``summary``, the model in words (e.g. "latent classes, 12 classes,
    validation log-likelihood -21.40 per respondent"), besides the ids and metrics.
    """
    with Session(ctx.engine) as db:
        study = _study(ctx, db)
        kind = str((study.settings or {}).get("belief_model") or "default")
        start = FIT_STARTS.get(kind, f"fitting {kind}")
        ctx.progress(0.05, start)

        def progress(fraction: float, message: str) -> None:
            ctx.progress(0.05 + 0.85 * fraction, f"{start}: {message}" if message else start)

        row = fit_study_model(
            study,
            session=db,
            seed=int(ctx.payload.get("seed", 0)),
            progress=progress,
            force=bool(ctx.payload.get("force", False)),
        )
        verdict = f"{row.status}: {row.reason}" if row.status else ""
        return {
            "summary": describe_fit(row.family, row.metrics) + (f" ({verdict})" if verdict else ""),
            "status": row.status,
            "reason": row.reason,
            "val_log_lik": row.val_log_lik,
            "active_val_log_lik": row.active_val_log_lik,
            "n_imported": row.n_imported,
            "n_live": row.n_live,
            "n_validation": row.n_validation,
            "fitted_model_id": row.id,
            "family": row.family,
            "training_hash": row.training_hash,
            "metrics": row.metrics,
        }


def fixed_order(ctx: JobContext) -> dict[str, Any]:
    """Store the fixed order of the study's active model, pool and targets (idempotent)."""
    ctx.progress(0.05, "computing the fixed question order")
    with Session(ctx.engine) as db:
        result = ensure_fixed_order(_study(ctx, db), session=db)
    if result.status == "failed":
        raise InvalidInputError(f"no fixed order: {result.message}")
    return {"status": result.status, "key": result.key, "cpu_seconds": result.cpu_seconds}


def simulation(ctx: JobContext) -> dict[str, Any]:
    """Replay the study's history through its design (see app.services.simulation); a
    cancel requested while it runs ends the job cancelled, without a result."""
    opts = SimulationOptions.from_payload(ctx.payload)
    with Session(ctx.engine) as db:
        study = _study(ctx, db)
        result = run_study_simulation(study, session=db, options=opts, progress=ctx.progress)
    ctx.progress(1.0, "simulation done")  # the result is its only effect
    return result


def train_gnn_job(ctx: JobContext) -> dict[str, Any]:
    """Train the relational GNN on the study's history; store it (inactive, family gnn)."""
    # gnn loads torch_geometric (seconds): only in the job that trains it
    from gnn.graph import schema_from_data
    from gnn.train import GNNConfig, train_gnn

    seed = int(ctx.payload.get("seed", 0))
    max_epochs = int(ctx.payload.get("max_epochs", 200))
    with Session(ctx.engine) as db:
        study = _study(ctx, db)
        items = list(
            db.exec(
                select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
            ).all()
        )
        if not any(it.role != ItemRole.attribute.value for it in items):
            raise InvalidInputError("the study has no question or target items to train on")
        fit, check = gnn_holdout(*historical_matrix(study.id or 0, items, session=db))
        attr = [j for j, it in enumerate(items) if it.role == ItemRole.attribute.value]
        ques = [j for j, it in enumerate(items) if it.role != ItemRole.attribute.value]
        if attr:  # the graph needs every member's attributes: drop members missing any
            fit = fit[(fit[:, attr] >= 0).all(1)]
            check = check[(check[:, attr] >= 0).all(1)]
        if fit.shape[0] < 3 or check.shape[0] < 3 or not ques:
            raise InvalidInputError(
                f"the study has too little history to train the group GNN: {fit.shape[0]} "
                f"imported respondents to train on and {check.shape[0]} to check it on "
                "(with every attribute answered; at least 3 of each, and the planner uses "
                f"it only when it can check it on {MIN_VALIDATION_MEMBERS})"
            )
        data = torch.cat([fit, check])
        n, n_val = data.shape[0], check.shape[0]
        tr, va = list(range(n - n_val)), list(range(n - n_val, n))
        attributes = data[:, attr] if attr else torch.zeros(n, 0, dtype=torch.long)
        schema = schema_from_data(
            attributes,
            data[:, ques],
            [len(items[j].options) for j in attr],
            [len(items[j].options) for j in ques],
            [items[j].key for j in attr],
            [items[j].key for j in ques],
        )
        config = GNNConfig(seed=seed, max_epochs=max_epochs, num_threads=1)

        def progress(epoch: int, train_loss: float, val_ce: float) -> None:
            ctx.progress(
                min(0.95, epoch / max_epochs), f"epoch {epoch}: validation CE {val_ce:.3f}"
            )

        trained = train_gnn(schema, attributes, data[:, ques], tr, va, config, progress=progress)
        blob = trained.to_bytes()
        row = FittedModel(
            study_id=study.id or 0,
            family="gnn",
            blob=blob,
            training_hash=hashlib.sha256(blob).hexdigest(),
            metrics={
                "best_epoch": trained.history.best_epoch,
                "best_val_ce": trained.history.best_val_ce,
                "seconds": trained.history.seconds,
            },
            is_active=False,
        )
        db.add(row)
        db.commit()
        db.refresh(row)
        return {"fitted_model_id": row.id, "members": n, **row.metrics}


def plan_group_round(ctx: JobContext) -> dict[str, Any]:
    """Choose the next round's question and respondents, with scores.

    :func:`app.services.group_rounds.plan_next_round`, i.e.
    :func:`elicitation.group.plan_round` (the benchmark's ``live`` method) with the
    study's active belief model and its trained GNN (the latest ``train_gnn`` result),
    when there is one. The panel is the study's live respondents (or its imported ones
    before fielding, at most ``max_members``, lowest ids first), of whom only those who
    can receive a question are chosen; the study's closed rounds are applied first, so
    the plan charges them against the group budget and uses their answers. Payload
    ``selection``: ``elook`` (default: question and members by the expected gain in
    correct target answers) or ``relational`` (k-means over the GNN's member
    embeddings). The plan is stored in the job's result; nothing else is written (a
    round is opened from it on the groups page). A cancel requested while it is scored
    ends the job cancelled, without a plan.
    """
    with Session(ctx.engine) as db:
        study = _study(ctx, db)
        plan = plan_next_round(
            study,
            session=db,
            max_members=int(ctx.payload.get("max_members", 2000)),
            seed=int(ctx.payload.get("seed", 0)),
            selection=str(ctx.payload.get("selection", "elook")),
            progress=ctx.progress,
        )
    # the plan is the job's only effect: a cancel during the scoring discards it
    ctx.progress(1.0, "plan ready")
    return plan


def persona_generation(ctx: JobContext) -> dict[str, Any]:
    """Score the study's personas × questions with a language model (resumable).

    The same pieces as ``priorly personas generate`` (:mod:`app.services.personas`). The
    personas are the study's persona dictionary (``study_persona``, built from one of the
    sources on the personas page); a study without one, or a payload with ``n_personas``,
    gets the ``n_personas`` (default 16) most frequent attribute profiles of its
    respondents, added to the dictionary. The backend is the embedded local model, or an
    OpenAI-compatible server (``backend: "openai"``, ``base_url``, ``model``: the server the
    Personas page offered; unset: this process's settings; a worker whose own
    ``PRIORLY_LLM_*`` settings disagree, or lack the key the page had, fails the job naming
    the setting: :func:`app.services.persona_models.job_server`), checked before anything
    is stored (a server that is down or serves another model fails the job with nothing
    written).

    Progress: pairs done / total, pairs per second and the time left after every chunk;
    a cancel stops the job between chunks (each chunk is committed). A chunk (payload
    ``chunk``; :data:`app.services.personas.GENERATION_CHUNK` from the Personas page) is by
    default what the backend scores at once: one batch (``batch_size``, 8) with the
    embedded model, ``batch_size × concurrency`` (8 × 4 = 32) on a server, so a cancel
    waits for one chunk. Stored pairs are
    never recomputed, so running the job again (after a cancel, or a retry after its
    worker died) resumes where it stopped and ends with the same stored distributions.
    ``limit`` (payload) means "the first ``limit`` pairs of the persona × question grid"
    (in :func:`inference_server.generate.generate`'s order), not "``limit`` new pairs in
    this attempt", so a retried job stores the same pairs as an uninterrupted one.
    """
    p = ctx.payload
    ctx.progress(0.0, persona_service.GENERATION_CHECKING)
    with Session(ctx.engine) as db:
        study = _study(ctx, db)
        assert study.id is not None
        attrs, questions = persona_service.study_items(study.id, session=db)
        if not questions:
            raise InvalidInputError("the study has no questions to score")
        kind = str(p.get("backend", "local"))
        batch, concurrency = int(p.get("batch_size", 8)), int(p.get("concurrency", 4))
        # one chunk is what the backend scores at once: a cancel waits for at most that
        chunk = int(p.get("chunk", batch if kind == "local" else batch * concurrency))
        base_url, model = p.get("base_url"), p.get("model")
        if kind == "openai":
            base_url, model = job_server(p, get_settings())
        backend = persona_service.make_persona_backend(
            kind,
            base_url=base_url,
            model=model,
            batch_size=batch,
            concurrency=concurrency,
            threshold=float(p.get("threshold", 0.5)),
            threads=1,
        )
        persona_service.check_persona_backend(backend)
        texts = persona_service.stored_persona_texts(study.id, session=db)
        if not texts or p.get("n_personas") is not None:
            if not attrs:
                raise InvalidInputError(
                    "the study has no personas and no attribute items to build them from: "
                    "add personas on the study's personas page"
                )
            personas = persona_service.attribute_personas(
                study.id,
                attrs,
                mode="profiles",
                n=int(p.get("n_personas", 16)),
                seed=int(p.get("seed", 0)),
                session=db,
            )
            persona_service.save_study_personas(
                study.id, personas, "respondents", session=db, attrs=attrs
            )
            texts = [persona.text for persona in personas]
        total = len({(t, q.hash) for t in texts for q in questions})
        limit = None if p.get("limit") is None else max(0, int(p["limit"]))
        stats = persona_service.score_personas(
            texts,
            questions,
            backend,
            session=db,
            chunk_size=chunk,
            first_pairs=limit,
            on_progress=persona_service.generation_progress(
                total if limit is None else min(total, limit), ctx.progress
            ),
        )
        return {
            "personas": len(texts),
            "questions": len(questions),
            "total_pairs": stats.total,
            "already_stored": stats.already_stored,
            "computed": stats.computed,
            "flagged": stats.flagged,
            "pairs_per_second": round(stats.rate, 3),
            "model": backend.model_id,
            "model_id": backend.model_id,
            "template_version": backend.template.version_id,
            "backend": str(p.get("backend", "local")),
            "base_url": getattr(backend, "root_url", None),
        }


TASKS: dict[str, JobFn] = {
    "fit_model": fit_model,
    "fixed_order": fixed_order,
    "simulation": simulation,
    "train_gnn": train_gnn_job,
    "plan_group_round": plan_group_round,
    "persona_generation": persona_generation,
}
"""``kind → job function``; the same names as :data:`app.jobs.registry.KINDS`."""

if set(TASKS) != set(KINDS):  # pragma: no cover - a kind without a function is a bug
    raise RuntimeError(f"job kinds without a function or label: {set(TASKS) ^ set(KINDS)}")


def task_of(kind: str) -> JobFn:
    """The function of ``kind``; :class:`InvalidInputError` for an unknown kind."""
    return TASKS[check_kind(kind).name]
