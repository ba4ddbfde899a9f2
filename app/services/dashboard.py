"""The live dashboard of a study: progress, drop-off, answers, predicted population, personas.

Who is counted: *live* sessions are a study's ordinary sessions, neither a group round's
one-question session (the group rounds page tracks those; their answers count in the
exposure and the answers budget) nor a researcher's "preview as respondent"
(``elicitation_session.is_preview``: counted nowhere on the dashboard). Imported
respondents (``respondent.source = 'import'``) have no sessions and are counted apart.

* **counts**: ``started`` live sessions = ``completed`` + ``in_progress`` + ``dropped`` +
  ``declined`` (consent refused). With ``now`` and the study setting
  ``drop_after_minutes`` (``StudySettings.drop_after_minutes``, default 60), an unfinished
  session is *dropped* when its last activity (``updated_at``: start, attribute step or
  answer) is older than ``now - drop_after_minutes`` or it was closed as ``abandoned``,
  else *in progress*. ``live_respondents``: respondents with a live session;
  ``repeated_starts``: those of them flagged ``earlier_starts > 0`` (the same browser had
  started the study before); ``imported``: imported respondents; ``erased``: sessions
  erased on request (``erasure_record``).
* **drop-off**: for each position ``k`` (0 = before the first question, 1..budget) the
  number of dropped sessions with exactly ``k`` answered (or skipped) questions, i.e.
  whose last answered position is ``k``.
* **median completion time**: the median of ``completed_at - created_at`` (session start
  to completion) over completed live sessions, in seconds.
* **answer distributions**: for every item asked in a live session, the count and share
  of each option among its live answers (skips counted apart), next to the same figures
  over the imported respondents' historical answers (``respondent.answers``).
* **exposure**: per item, how many sessions (round sessions included) were asked it
  (answers + skips).
* **predicted population distribution** per target: each live respondent's predictive
  distribution ``p_s`` over the target's options (replayed from the stored answers with
  the active model) averaged over respondents, ``p̄ = (1/S) Σ_s p_s``, with a 95 % band
  ``p̄ ± 1.96 · sd(p_s) / √S`` (normal approximation of the sampling error of the mean,
  clipped to ``[0, 1]``); the model's prior (no answer) is shown next to it.
* **aggregate persona posterior**: for persona-mixture (latent-class) models, the mean
  over respondents of each persona's posterior weight (top :data:`TOP_PERSONAS`), each
  described by its most distinctive answers (:func:`models.distinctive.distinctive_answers`:
  largest ``μ[c, i, o] / p(o | i)``), e.g. ``Strongly agree on 'X' (82 % vs 31 % overall)``.
* **budget used**: answers collected, mean questions per completed respondent against
  ``max_questions``, and, when the group budget caps the round questions
  (``total_answers``), the round questions asked so far (members invited to rounds,
  answered or not: :func:`app.services.designer.round_questions_asked`).

Every figure but the predictions is one aggregate SQL query. At most :data:`MAX_SESSIONS`
most recent sessions are replayed for the predictions (their answers in one query); the
replayed population is kept per process until an answer, a session, a respondent's
attributes or the active model changes (:func:`_population_key`), so a poll of an
unchanged study replays nothing.
:func:`dashboard_page` adds the figures: one distribution plot per target (SVG text).
:func:`resolve_respondent` turns a respondent id or a completion code typed on the
dashboard into a respondent id.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import statistics
import threading
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import torch
from sqlalchemy import case, func, literal, union, union_all
from sqlmodel import Session, col, select

from app import session as svc
from app.errors import InvalidInputError, NotFoundError
from app.schemas import StudySettings
from app.services import plots
from app.services.designer import round_questions_asked
from app.services.respondents import drop_cutoff
from app.tables import (
    Answer,
    ElicitationSession,
    ErasureRecord,
    GroupRoundMember,
    Item,
    Respondent,
    RespondentSource,
    SelectionDecision,
    SessionStatus,
    Study,
)
from models.distinctive import distinctive_answers

MAX_SESSIONS = 2000
TOP_PERSONAS = 10
DISTINCTIVE_TOP = 3
"""Distinctive answers shown per persona."""
MAX_DB_ID = 2**31 - 1


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
class OptionCount:
    """One option of an asked item: live and imported counts and shares (``None``: no
    answers of that kind)."""

    letter: str
    label: str
    live: int
    live_share: float | None
    imported: int
    imported_share: float | None


@dataclass
class ItemDistribution:
    """The answers to one item asked live: ``n_live`` answers (``skipped`` apart) and
    ``n_imported`` imported respondents' answers, per option."""

    key: str
    question: str
    role: str
    n_live: int
    skipped: int
    n_imported: int
    options: list[OptionCount]


@dataclass
class Dashboard:
    counts: dict[str, int]
    exposure: list[dict[str, Any]]
    targets: list[TargetSummary] = field(default_factory=list)
    personas: list[dict[str, Any]] = field(default_factory=list)
    budget: dict[str, Any] = field(default_factory=dict)
    model_note: str | None = None
    drop_after_minutes: int = 60
    drop_off: list[dict[str, int]] = field(default_factory=list)
    median_completion_s: float | None = None
    distributions: list[ItemDistribution] = field(default_factory=list)


def _live_session() -> Any:
    """SQL condition: a live session, not a group round's one-question session (those are
    counted on the group rounds page, not as respondents started or completed) nor a
    researcher's preview."""
    return col(ElicitationSession.id).not_in(select(GroupRoundMember.session_id)) & col(
        ElicitationSession.is_preview
    ).is_(False)


def _dropped(cutoff: datetime) -> Any:
    """SQL condition: an unfinished session idle since before ``cutoff``, or abandoned."""
    return (col(ElicitationSession.status) == SessionStatus.abandoned.value) | (
        (col(ElicitationSession.status) == SessionStatus.active.value)
        & (col(ElicitationSession.updated_at) < cutoff)
    )


def _counts(study: Study, session: Session, cutoff: datetime) -> dict[str, int]:
    stale = case((col(ElicitationSession.updated_at) < cutoff, 1), else_=0)
    rows = session.exec(
        select(ElicitationSession.status, stale, func.count())
        .where(ElicitationSession.study_id == study.id, _live_session())
        .group_by(ElicitationSession.status, stale)
    ).all()
    by: dict[tuple[str, bool], int] = defaultdict(int)
    for status, is_stale, n in rows:
        by[(str(status), bool(is_stale))] += int(n)

    def n(status: SessionStatus, stale_only: bool | None = None) -> int:
        return sum(
            v
            for (s, st), v in by.items()
            if s == status.value and (stale_only is None or st == stale_only)
        )

    people = session.exec(
        select(
            func.count(func.distinct(col(Respondent.id))),
            func.count(
                func.distinct(case((col(Respondent.earlier_starts) > 0, col(Respondent.id))))
            ),
        )
        .select_from(ElicitationSession)
        .join(Respondent, col(Respondent.id) == col(ElicitationSession.respondent_id))
        .where(ElicitationSession.study_id == study.id, _live_session())
    ).one()
    imported = session.exec(
        select(func.count()).where(
            Respondent.study_id == study.id, Respondent.source == RespondentSource.import_.value
        )
    ).one()
    erased = session.exec(
        select(func.coalesce(func.sum(ErasureRecord.n_sessions), 0)).where(
            ErasureRecord.study_id == study.id
        )
    ).one()
    return {
        "started": sum(by.values()),
        "completed": n(SessionStatus.completed),
        "in_progress": n(SessionStatus.active, False),
        "dropped": n(SessionStatus.active, True) + n(SessionStatus.abandoned),
        "declined": n(SessionStatus.declined),
        "live_respondents": int(people[0]),
        "repeated_starts": int(people[1]),
        "imported": int(imported),
        "erased": int(erased),
    }


def _drop_off(
    study: Study, session: Session, cutoff: datetime, budget: int
) -> list[dict[str, int]]:
    per = (
        select(col(ElicitationSession.id), func.count(col(Answer.id)).label("n"))
        .select_from(ElicitationSession)
        .outerjoin(Answer, col(Answer.session_id) == col(ElicitationSession.id))
        .where(ElicitationSession.study_id == study.id, _live_session(), _dropped(cutoff))
        .group_by(col(ElicitationSession.id))
        .subquery()
    )
    rows = session.exec(select(per.c.n, func.count()).group_by(per.c.n)).all()
    by = {int(k): int(v) for k, v in rows}
    top = max([budget, *by])
    return [{"position": k, "dropped": by.get(k, 0)} for k in range(top + 1)]


def _median_completion(study: Study, session: Session) -> float | None:
    rows = session.exec(
        select(ElicitationSession.created_at, ElicitationSession.completed_at).where(
            ElicitationSession.study_id == study.id,
            ElicitationSession.status == SessionStatus.completed.value,
            col(ElicitationSession.completed_at).is_not(None),
            _live_session(),
        )
    ).all()
    spans = [(done - start).total_seconds() for start, done in rows if done is not None]
    return float(statistics.median(spans)) if spans else None


_IMPORTED: OrderedDict[tuple[str, int, int, int, tuple[str, ...]], dict[str, dict[str, int]]] = (
    OrderedDict()
)
_IMPORTED_LOCK = threading.Lock()
_IMPORTED_MAX = 32


def _imported_counts(
    study: Study, session: Session, items: list[Item]
) -> dict[str, dict[str, int]]:
    """``{item key: {option letter: imported respondents who gave it}}`` for every item.

    Imported respondents are written once by the import and only ever deleted, so the
    counts are cached per process under (database, study, number and largest id of its
    imported respondents, item keys): a poll of the dashboard reads two aggregates instead of
    every imported answer.
    """
    n, top = session.exec(
        select(func.count(), func.coalesce(func.max(col(Respondent.id)), 0)).where(
            Respondent.study_id == study.id, Respondent.source == RespondentSource.import_.value
        )
    ).one()
    bind = session.get_bind()
    key = (str(bind.engine.url), study.id or 0, int(n), int(top), tuple(it.key for it in items))
    with _IMPORTED_LOCK:
        if key in _IMPORTED:
            _IMPORTED.move_to_end(key)
            return _IMPORTED[key]
    out: dict[str, dict[str, int]] = defaultdict(dict)
    if n and items:
        answers = col(Respondent.answers)
        # one row per (item, imported respondent who answered it), grouped once in SQL
        # (grouping each part by its own JSON expression fails on PostgreSQL: every part
        # binds the key as a new parameter)
        cells = union_all(
            *(
                select(
                    literal(it.key).label("key"),
                    answers[it.key].as_string().label("option"),
                ).where(
                    Respondent.study_id == study.id,
                    Respondent.source == RespondentSource.import_.value,
                    answers[it.key].as_string().is_not(None),
                )
                for it in items
            )
        ).subquery()
        grouped = select(cells.c.key, cells.c.option, func.count()).group_by(
            cells.c.key, cells.c.option
        )
        for k, option, count in session.exec(grouped).all():  # type: ignore[call-overload]
            out[str(k)][str(option)] = int(count)
    with _IMPORTED_LOCK:
        _IMPORTED[key] = dict(out)
        while len(_IMPORTED) > _IMPORTED_MAX:
            _IMPORTED.popitem(last=False)
    return dict(out)


def _distributions(study: Study, session: Session, items: list[Item]) -> list[ItemDistribution]:
    live_rows = session.exec(
        select(col(Answer.item_id), col(Answer.option), func.count())
        .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
        .where(ElicitationSession.study_id == study.id, _live_session())
        .group_by(col(Answer.item_id), col(Answer.option))
    ).all()
    live: dict[int, dict[str | None, int]] = defaultdict(dict)
    for item_id, option, n in live_rows:
        live[int(item_id)][option] = int(n)
    asked = [it for it in items if it.id in live]
    imported = _imported_counts(study, session, items) if asked else {}
    out = []
    for it in asked:
        counts = live[it.id or 0]
        skipped = counts.get(None, 0)
        n_live = sum(v for k, v in counts.items() if k is not None)
        imp = imported.get(it.key, {})
        n_imp = sum(imp.values())
        out.append(
            ItemDistribution(
                key=it.key,
                question=it.question,
                role=it.role,
                n_live=n_live,
                skipped=skipped,
                n_imported=n_imp,
                options=[
                    OptionCount(
                        letter=letter,
                        label=label,
                        live=counts.get(letter, 0),
                        live_share=counts.get(letter, 0) / n_live if n_live else None,
                        imported=imp.get(letter, 0),
                        imported_share=imp.get(letter, 0) / n_imp if n_imp else None,
                    )
                    for letter, label in ((o[0], o[1]) for o in it.options)
                ],
            )
        )
    return out


def _exposure(study: Study, session: Session, items: list[Item]) -> list[dict[str, Any]]:
    """Per item: ``asked``, the sessions (group round sessions included, previews not) that
    were posed it, answered or not (a selection decision chose it, or it has an answer),
    and ``skipped``, its "prefer not to answer" answers."""
    in_study = (
        col(ElicitationSession.study_id) == study.id,
        col(ElicitationSession.is_preview).is_(False),
    )
    posed = (
        select(col(SelectionDecision.session_id), col(SelectionDecision.item_id))
        .join(ElicitationSession, col(ElicitationSession.id) == col(SelectionDecision.session_id))
        .where(col(SelectionDecision.item_id).is_not(None), *in_study)
    )
    answered = select(col(Answer.session_id), col(Answer.item_id)).join(
        ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id)
    )
    pairs = union(posed, answered.where(*in_study)).subquery()  # one row per session and item
    asked = {
        int(i): int(n)
        for i, n in session.exec(
            select(pairs.c.item_id, func.count()).group_by(pairs.c.item_id)
        ).all()
    }
    skips = session.exec(
        select(col(Answer.item_id), func.count())
        .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
        .where(col(Answer.option).is_(None), *in_study)
        .group_by(col(Answer.item_id))
    ).all()
    skipped = {int(i): int(n) for i, n in skips}
    return [
        {
            "key": it.key,
            "question": it.question,
            "role": it.role,
            "asked": asked.get(it.id or 0, 0),
            "skipped": skipped.get(it.id or 0, 0),
        }
        for it in items
    ]


def clip_middle(text: str, n: int) -> str:
    """``text`` in at most ``n`` characters: when longer, its start and its end (cut at
    word boundaries) around " … ", so that questions sharing a long stem stay apart.

    Example (n = 50): ``"Thinking about policing policy, would you support or oppose:
    require body cameras?"`` → ``"Thinking about policing … require body cameras?"``.
    """
    if len(text) <= n:
        return text
    room = n - 3
    head_n, tail_n = room * 2 // 5, room - room * 2 // 5
    head = text[:head_n]
    if " " in head:
        head = head.rsplit(" ", 1)[0]
    tail = text[-tail_n:]
    if " " in tail:
        tail = tail.split(" ", 1)[1]
    return f"{head.rstrip(' ,;:')} … {tail}"


def _percent(x: float) -> str:
    return f"{100 * x:.0f} %"


def describe_personas(rt: Any, classes: list[int]) -> list[list[str]]:
    """Each of ``classes`` of the runtime's persona-mixture model in words: its
    :data:`DISTINCTIVE_TOP` most distinctive answers (:mod:`models.distinctive`), e.g.
    ``Strongly agree on 'Ban assault rifles' (82 % vs 31 % overall)``; empty lists for a
    model without ``mu`` / ``log_prior`` (not a persona mixture)."""
    mu = getattr(rt.model, "mu", None)
    log_prior = getattr(rt.model, "log_prior", None)
    if not isinstance(mu, torch.Tensor) or not isinstance(log_prior, torch.Tensor):
        return [[] for _ in classes]
    by_index = {rt.model_index[it.id]: it for it in rt.items if it.id in rt.model_index}
    found = distinctive_answers(mu, log_prior, classes, top=DISTINCTIVE_TOP, items=sorted(by_index))
    out = []
    for answers in found:
        words = []
        for a in answers:
            it = by_index[a.item]
            label = it.options[a.option][1] if a.option < len(it.options) else str(a.option)
            words.append(
                f"{label} on '{clip_middle(it.question, 70)}' "
                f"({_percent(a.share)} vs {_percent(a.overall)} overall)"
            )
        out.append(words)
    return out


@dataclass(frozen=True)
class Population:
    """The predicted population of a study's replayed live sessions.

    ``n`` sessions ``s`` were replayed; for target ``t`` (``rt.targets`` order) with ``O_t``
    options, ``mean[t]`` is ``p̄ = (1/n) Σ_s p_s`` (shape ``[O_t]``) and ``half[t]`` the
    half-width of its 95 % band, ``1.96 · sd(p_s) / √n`` (zeros when ``n < 2``);
    ``persona_weights`` is the mean latent posterior ``[K]`` of a persona-mixture model,
    else ``None``. Example: 300 sessions and a yes/no target give ``n=300``,
    ``mean[0]=tensor([0.62, 0.38])``.
    """

    n: int
    mean: list[torch.Tensor]
    half: list[torch.Tensor]
    persona_weights: torch.Tensor | None


def replay_population(
    study: Study, rt: svc.StudyRuntime, pairs: list[tuple[int, Respondent]], session: Session
) -> Population:
    """Replay the sessions ``pairs`` (``[(session id, respondent)]``, newest first) from
    their stored answers with the runtime's model and average their predictions (see
    :class:`Population`). The costly part of the dashboard: most of a later dashboard call,
    which takes 250 ms with 300 live sessions on the CES demo (docs/admin.md, Dashboard;
    ``scripts/dashboard_bench.py``). :func:`build_dashboard` calls it through
    :func:`_cached_population`."""
    by_session: dict[int, list[Answer]] = defaultdict(list)
    if pairs:
        oldest = min(sid for sid, _ in pairs)
        rows = session.exec(
            select(Answer)
            .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
            .where(
                ElicitationSession.study_id == study.id,
                _live_session(),
                col(ElicitationSession.id) >= oldest,
            )
            .order_by(col(Answer.id))
        ).all()
        for a in rows:
            by_session[a.session_id].append(a)
    idx = [rt.model_index[t.id] for t in rt.targets]
    preds: list[torch.Tensor] = []
    latent: list[torch.Tensor] = []
    latent_fn = getattr(rt.model, "latent_posterior", None)
    for sid, resp in pairs:
        state = svc.replay(rt, resp, by_session.get(sid, []))
        preds.append(rt.model.predict(state, idx))
        if callable(latent_fn):
            latent.append(latent_fn(state))
    s = len(preds)
    means: list[torch.Tensor] = []
    halves: list[torch.Tensor] = []
    if preds:
        stacked = torch.stack(preds)  # [S, T, O]
        for t_i, t in enumerate(rt.targets):
            n_opt = len(t.options)
            p = stacked[:, t_i, :n_opt]
            means.append(p.mean(0))
            halves.append(
                1.96 * (p.std(0, unbiased=False) / math.sqrt(s)) if s > 1 else torch.zeros(n_opt)
            )
    weights = torch.stack(latent).mean(0) if latent else None
    return Population(n=s, mean=means, half=halves, persona_weights=weights)


_POPULATION: OrderedDict[tuple[Any, ...], Population] = OrderedDict()
_POPULATION_LOCK = threading.Lock()
_POPULATION_MAX = 16


def clear_population_cache() -> None:
    """Forget every kept population (tests that rebuild a database under the same URL)."""
    with _POPULATION_LOCK:
        _POPULATION.clear()


def _population_key(
    study: Study, rt: svc.StudyRuntime, pairs: list[tuple[int, Respondent]], session: Session
) -> tuple[Any, ...]:
    """What :func:`replay_population` depends on: the database and study; the model and
    the items it maps (id, key, role, option letters: the runtime of the active model);
    the replayed sessions with their respondents' attributes (a digest); the number and
    largest id of their answers (answers are only ever added or erased, never changed);
    and :data:`MAX_SESSIONS`. A new answer, session or active model changes it."""
    digest = hashlib.blake2b(digest_size=16)
    for sid, resp in pairs:
        digest.update(f"{sid}:{resp.id}:".encode())
        digest.update(json.dumps(resp.attributes or {}, sort_keys=True).encode())
    answers: tuple[Any, Any] = (0, 0)  # (number, largest id) of the replayed answers
    if pairs:
        answers = session.exec(
            select(func.count(col(Answer.id)), func.coalesce(func.max(col(Answer.id)), 0))
            .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
            .where(
                ElicitationSession.study_id == study.id,
                _live_session(),
                col(ElicitationSession.id) >= min(sid for sid, _ in pairs),
            )
        ).one()
    design = (
        rt.model_id,
        tuple((i.id, i.key, i.role, tuple(o[0] for o in i.options)) for i in rt.items),
        tuple(sorted(rt.model_index.items())),
        tuple(t.id for t in rt.targets),
    )
    bind = session.get_bind()
    return (
        str(bind.engine.url),
        study.id or 0,
        design,
        len(pairs),
        digest.hexdigest(),
        int(answers[0]),
        int(answers[1] or 0),
        MAX_SESSIONS,
    )


def _cached_population(
    study: Study, rt: svc.StudyRuntime, pairs: list[tuple[int, Respondent]], session: Session
) -> Population:
    """:func:`replay_population`, kept per process (the :data:`_POPULATION_MAX` latest
    keys) under :func:`_population_key`: a poll of an unchanged study replays nothing."""
    key = _population_key(study, rt, pairs, session)
    with _POPULATION_LOCK:
        if key in _POPULATION:
            _POPULATION.move_to_end(key)
            return _POPULATION[key]
    pop = replay_population(study, rt, pairs, session)
    with _POPULATION_LOCK:
        _POPULATION[key] = pop
        while len(_POPULATION) > _POPULATION_MAX:
            _POPULATION.popitem(last=False)
    return pop


def build_dashboard(study: Study, *, session: Session, now: datetime | None = None) -> Dashboard:
    """Everything the dashboard page shows (see the module docstring); ``now`` (default:
    the current time) decides which unfinished sessions are dropped."""
    settings = StudySettings.model_validate(study.settings or {})
    cutoff = drop_cutoff(study, now)
    items = list(
        session.exec(
            select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
        ).all()
    )
    counts = _counts(study, session, cutoff)
    exposure = _exposure(study, session, items)
    n_answers = sum(e["asked"] for e in exposure)
    completed_answers = session.exec(
        select(func.count())
        .select_from(Answer)
        .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
        .where(
            ElicitationSession.study_id == study.id,
            ElicitationSession.status == SessionStatus.completed.value,
            _live_session(),
        )
    ).one()
    budget: dict[str, Any] = {
        "answers": n_answers,
        "max_questions": settings.budgets.max_questions,
        "mean_questions_completed": (
            round(int(completed_answers) / counts["completed"], 2) if counts["completed"] else None
        ),
        "total_answers": settings.group.total_answers,
        "round_questions_asked": round_questions_asked(study, session=session),
    }
    dash = Dashboard(
        counts=counts,
        exposure=exposure,
        budget=budget,
        drop_after_minutes=settings.drop_after_minutes,
        drop_off=_drop_off(study, session, cutoff, settings.budgets.max_questions),
        median_completion_s=_median_completion(study, session),
        distributions=_distributions(study, session, items),
    )
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
        select(ElicitationSession.id, Respondent)
        .join(Respondent, col(Respondent.id) == col(ElicitationSession.respondent_id))
        .where(ElicitationSession.study_id == study.id, _live_session())
        .order_by(col(ElicitationSession.id).desc())
        .limit(MAX_SESSIONS)
    ).all()
    pop = _cached_population(study, rt, [(int(sid), resp) for sid, resp in pairs], session)
    for t_i, t in enumerate(rt.targets):
        n_opt = len(t.options)
        if pop.n:
            mean, half = pop.mean[t_i], pop.half[t_i]
        else:
            mean, half = prior[t_i, :n_opt], torch.zeros(n_opt)
        dash.targets.append(
            TargetSummary(
                key=t.key,
                question=t.question,
                labels=[f"{o[0]}: {o[1]}" for o in t.options],
                mean=mean.tolist(),
                low=(mean - half).clamp(0, 1).tolist(),
                high=(mean + half).clamp(0, 1).tolist(),
                prior=prior[t_i, :n_opt].tolist(),
                n=pop.n,
            )
        )
    if pop.persona_weights is not None:
        dash.personas = persona_rows(rt, pop.persona_weights)
    return dash


def persona_rows(rt: Any, w: torch.Tensor) -> list[dict[str, Any]]:
    """The dashboard's personas: the largest mean posterior weights ``w [K]``, those whose
    most distinctive answers are the same merged into one row (a model averaged over
    several fits holds the same class once per fit: "class 12, 4, 5"), rows under 0.05 %
    left out, at most :data:`TOP_PERSONAS`; each ``{"label", "weight", "distinctive"}``.

    Example: classes 3 and 7 both described by ``["q1: Yes (80 %, population 40 %)"]``
    with weights 0.2 and 0.1 are one row "class 3, 7" of weight 0.3.
    """
    top = torch.topk(w, min(3 * TOP_PERSONAS, int(w.numel())))
    classes = [int(i) for i in top.indices.tolist()]
    labels = getattr(rt.model, "labels", None)
    rows: dict[Any, dict[str, Any]] = {}
    for v, i, d in zip(top.values.tolist(), classes, describe_personas(rt, classes), strict=True):
        key = tuple(d) if d else ("class", i)
        row = rows.get(key)
        if row is None:
            name = labels[i] if labels else f"class {i + 1}"
            rows[key] = {"label": name, "weight": float(v), "distinctive": d}
        else:
            row["weight"] += float(v)
            row["label"] += f", {labels[i] if labels else i + 1}"
    kept = sorted(rows.values(), key=lambda r: -r["weight"])
    return [r for r in kept if r["weight"] >= 0.0005][:TOP_PERSONAS]


@functools.lru_cache(maxsize=64)
def _distribution_svg(
    title: str,
    labels: tuple[str, ...],
    mean: tuple[float, ...],
    low: tuple[float, ...],
    high: tuple[float, ...],
    prior: tuple[float, ...],
) -> str:
    """:func:`app.services.plots.distribution_svg`, kept per process for the same inputs:
    a poll of an unchanged dashboard draws no plot again (~0.1 s each)."""
    return plots.distribution_svg(title, labels, mean, low, high, prior)


def dashboard_page(
    study: Study, *, session: Session, now: datetime | None = None
) -> dict[str, Any]:
    """The dashboard page: ``study``, ``dash`` (:func:`build_dashboard`) and
    ``target_svgs`` (one predicted-distribution plot per target, with the prior)."""
    dash = build_dashboard(study, session=session, now=now)
    target_svgs = [
        _distribution_svg(
            f"{t.key}: {t.question} (n = {t.n})",
            tuple(t.labels),
            tuple(t.mean),
            tuple(t.low),
            tuple(t.high),
            tuple(t.prior),
        )
        for t in dash.targets
    ]
    return {
        "study": study,
        "dash": dash,
        "target_svgs": target_svgs,
        "median_completion": duration_text(dash.median_completion_s),
    }


def duration_text(seconds: float | None) -> str:
    """A duration in words: ``"—"`` for none, ``"45 s"``, ``"4 min 12 s"``, ``"2 h 05 min"``."""
    if seconds is None:
        return "—"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def resolve_respondent(study: Study, text: str, secret: str, *, session: Session) -> int:
    """The id of the respondent of ``study`` named by ``text``, as the lists and exports
    name them: an external id (an API client's, a panel's, an imported survey's), ``r<id>``
    or the id's digits, or a completion code shown to a respondent at the end of the
    survey; tried in that order.

    Example: ``resolve_respondent(study, "42", key, session=db)`` -> ``42``, also for
    ``"r42"``; ``"api-user-7"`` -> the respondent with that external id;
    ``resolve_respondent(study, "3F9A0C21B7", key, session=db)`` -> that session's
    respondent.

    Raises:
        InvalidInputError: ``text`` is empty (422).
        NotFoundError: no respondent of the study has that id or completion code (404);
            the message says which, and why when the study gives everyone one fixed code.
    """
    wanted = text.strip()
    if not wanted:
        raise InvalidInputError("respondent: enter a respondent id or a completion code")
    named = session.exec(
        select(Respondent.id).where(
            Respondent.study_id == study.id, Respondent.external_id == wanted[:200]
        )
    ).first()
    if named is not None:
        return int(named)
    if re.fullmatch(r"r[0-9]+", wanted):
        wanted = wanted[1:]
    if wanted.isdigit():
        rid = int(wanted) if len(wanted) <= 10 else 0
        found = (
            session.exec(
                select(Respondent.id).where(Respondent.id == rid, Respondent.study_id == study.id)
            ).first()
            if 0 < rid <= MAX_DB_ID
            else None
        )
        if found is None:
            raise NotFoundError(f"no respondent with id {wanted} in study {study.slug!r}")
        return int(found)
    if study.completion_code:
        raise NotFoundError(
            f"study {study.slug!r} gives every respondent the same completion code, which "
            "names no one: open a respondent by id"
        )
    sess = svc.session_by_completion_code(study, wanted, secret, session=session)
    if sess is None:
        raise NotFoundError(
            f"no completed session of study {study.slug!r} has the completion code {wanted[:64]!r}"
        )
    return sess.respondent_id
