"""The live dashboard of a study: progress, exposure, predicted population, personas, budget.

* **respondents**: sessions started, completed, dropped (declined or abandoned), active,
  and erased (from ``erasure_record``). A group round's one-question sessions are left out
  of these counts and of the predictions (the group rounds page tracks them); their answers
  count in the exposure and the answers budget.
* **exposure**: per item, how many live sessions were asked it (answers + skips).
* **predicted population distribution** per target: each live respondent's predictive
  distribution ``p_s`` over the target's options (replayed from the stored answers with
  the active model) averaged over respondents, ``p̄ = (1/S) Σ_s p_s``, with a 95 % band
  ``p̄ ± 1.96 · sd(p_s) / √S`` (normal approximation of the sampling error of the mean,
  clipped to ``[0, 1]``); the model's prior (no answer) is shown next to it.
* **aggregate persona posterior**: for latent-class models, the mean over respondents of
  each persona's posterior weight (top :data:`TOP_PERSONAS`).
* **budget used**: answers collected, mean questions per completed respondent against
  ``max_questions``, and the group answer budget when one is set.

At most :data:`MAX_SESSIONS` most recent sessions are replayed (the count figures use all).
:func:`dashboard_page` adds the figures: one distribution plot per target and a bar chart
of the aggregate persona posterior (SVG text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from sqlalchemy import func
from sqlmodel import Session, col, select

from app import session as svc
from app.schemas import StudySettings
from app.services import plots
from app.tables import (
    Answer,
    ElicitationSession,
    ErasureRecord,
    GroupRoundMember,
    Item,
    Respondent,
    SessionStatus,
    Study,
)

MAX_SESSIONS = 2000
TOP_PERSONAS = 10


@dataclass
class TargetSummary:
    key: str
    question: str
    labels: list[str]
    mean: list[float]
    low: list[float]
    high: list[float]
    prior: list[float]
    n: int


@dataclass
class Dashboard:
    counts: dict[str, int]
    exposure: list[dict[str, Any]]
    targets: list[TargetSummary] = field(default_factory=list)
    personas: list[dict[str, Any]] = field(default_factory=list)
    budget: dict[str, Any] = field(default_factory=dict)
    model_note: str | None = None


def _not_round_session() -> Any:
    """SQL condition: an ordinary session, not a group round's one-question session (those
    are counted on the group rounds page, not as respondents started or completed) nor a
    researcher's preview."""
    return col(ElicitationSession.id).not_in(select(GroupRoundMember.session_id)) & col(
        ElicitationSession.is_preview
    ).is_(False)


def _counts(study: Study, session: Session) -> dict[str, int]:
    rows = session.exec(
        select(ElicitationSession.status, func.count())
        .where(ElicitationSession.study_id == study.id, _not_round_session())
        .group_by(ElicitationSession.status)
    ).all()
    by = {str(s): int(n) for s, n in rows}
    erased = session.exec(
        select(func.coalesce(func.sum(ErasureRecord.n_sessions), 0)).where(
            ErasureRecord.study_id == study.id
        )
    ).one()
    return {
        "started": sum(by.values()),
        "completed": by.get(SessionStatus.completed.value, 0),
        "dropped": by.get(SessionStatus.abandoned.value, 0)
        + by.get(SessionStatus.declined.value, 0),
        "active": by.get(SessionStatus.active.value, 0),
        "erased": int(erased),
    }


def _exposure(study: Study, session: Session) -> list[dict[str, Any]]:
    items = session.exec(
        select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
    ).all()
    rows = session.exec(
        select(col(Answer.item_id), func.count(), func.count(col(Answer.option)))
        .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
        .where(
            ElicitationSession.study_id == study.id, col(ElicitationSession.is_preview).is_(False)
        )
        .group_by(col(Answer.item_id))
    ).all()
    by = {int(i): (int(n), int(k)) for i, n, k in rows}
    return [
        {
            "key": it.key,
            "question": it.question,
            "role": it.role,
            "asked": by.get(it.id or 0, (0, 0))[0],
            "skipped": by.get(it.id or 0, (0, 0))[0] - by.get(it.id or 0, (0, 0))[1],
        }
        for it in items
    ]


def build_dashboard(study: Study, *, session: Session) -> Dashboard:
    """Everything the dashboard page shows (see the module docstring)."""
    counts = _counts(study, session)
    exposure = _exposure(study, session)
    settings = StudySettings.model_validate(study.settings or {})
    n_answers = sum(e["asked"] for e in exposure)
    completed_answers = session.exec(
        select(func.count())
        .select_from(Answer)
        .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
        .where(
            ElicitationSession.study_id == study.id,
            ElicitationSession.status == SessionStatus.completed.value,
            _not_round_session(),
        )
    ).one()
    budget: dict[str, Any] = {
        "answers": n_answers,
        "max_questions": settings.budgets.max_questions,
        "mean_questions_completed": (
            round(int(completed_answers) / counts["completed"], 2) if counts["completed"] else None
        ),
        "total_answers": settings.group.total_answers,
        "total_used": (
            round(n_answers / settings.group.total_answers, 3)
            if settings.group.total_answers
            else None
        ),
    }
    dash = Dashboard(counts=counts, exposure=exposure, budget=budget)
    try:
        rt = svc.load_runtime(study, session=session, fit_if_missing=False)
    except Exception as exc:  # no fitted model yet, or a misconfigured study
        dash.model_note = f"no predictions: {exc}"
        return dash
    if not rt.targets:
        dash.model_note = "no predictions: the study has no target items"
        return dash
    idx = [rt.model_index[t.id] for t in rt.targets]
    prior = rt.model.predict(rt.model.initial_state({}), idx)
    pairs = session.exec(
        select(ElicitationSession, Respondent)
        .join(Respondent, col(Respondent.id) == col(ElicitationSession.respondent_id))
        .where(ElicitationSession.study_id == study.id, _not_round_session())
        .order_by(col(ElicitationSession.id).desc())
        .limit(MAX_SESSIONS)
    ).all()
    preds: list[torch.Tensor] = []
    latent: list[torch.Tensor] = []
    latent_fn = getattr(rt.model, "latent_posterior", None)
    for sess, resp in pairs:
        answers = list(
            session.exec(
                select(Answer).where(Answer.session_id == sess.id).order_by(col(Answer.id))
            ).all()
        )
        state = svc.replay(rt, resp, answers)
        preds.append(rt.model.predict(state, idx))
        if callable(latent_fn):
            latent.append(latent_fn(state))
    s = len(preds)
    stacked = torch.stack(preds) if preds else None  # [S, T, O]
    for t_i, t in enumerate(rt.targets):
        n_opt = len(t.options)
        if stacked is not None:
            p = stacked[:, t_i, :n_opt]
            mean = p.mean(0)
            half = 1.96 * (p.std(0, unbiased=False) / math.sqrt(s)) if s > 1 else torch.zeros(n_opt)
        else:
            mean = prior[t_i, :n_opt]
            half = torch.zeros(n_opt)
        dash.targets.append(
            TargetSummary(
                key=t.key,
                question=t.question,
                labels=[f"{o[0]}: {o[1]}" for o in t.options],
                mean=mean.tolist(),
                low=(mean - half).clamp(0, 1).tolist(),
                high=(mean + half).clamp(0, 1).tolist(),
                prior=prior[t_i, :n_opt].tolist(),
                n=s,
            )
        )
    if latent:
        w = torch.stack(latent).mean(0)
        top = torch.topk(w, min(TOP_PERSONAS, int(w.numel())))
        labels = getattr(rt.model, "labels", None)
        dash.personas = [
            {"label": labels[i] if labels else f"class {i + 1}", "weight": float(v)}
            for v, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)
        ]
    return dash


def dashboard_page(study: Study, *, session: Session) -> dict[str, Any]:
    """The dashboard page: ``study``, ``dash`` (:func:`build_dashboard`), ``target_svgs``
    (one predicted-distribution plot per target, with the prior) and ``persona_svg`` (the
    aggregate persona posterior; ``None`` without personas or before the first session)."""
    dash = build_dashboard(study, session=session)
    target_svgs = [
        plots.distribution_svg(
            f"{t.key}: {t.question} (n = {t.n})", t.labels, t.mean, t.low, t.high, t.prior
        )
        for t in dash.targets
    ]
    persona_svg = (
        plots.bars_svg(
            "aggregate persona posterior",
            [p["label"] for p in dash.personas],
            [p["weight"] for p in dash.personas],
            "mean posterior weight",
        )
        if dash.personas and dash.counts["started"]
        else None
    )
    return {"study": study, "dash": dash, "target_svgs": target_svgs, "persona_svg": persona_svg}
