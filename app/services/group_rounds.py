"""Group rounds in the live product: plan, open, track and close.

A group study asks its *panel* (its live or its imported respondents: the ``group.panel``
setting, by default live ones when there are any) in rounds: each round puts **one question** to a **few members**, chosen by
:mod:`elicitation.group` under the study's group budget (``study.settings["group"]``).

* **plan** (:func:`plan_next_round`, run by the ``plan_group_round`` job): the panel's
  observations (attributes and answers outside rounds), its closed rounds (question,
  members asked, their answers or ``-1``) and who can be asked
  (:func:`reachable_members`) are the members' states; the study's stored models
  (:func:`study_planner_models`: the active belief model, and the GNN of the "Train the
  group GNN" job with its pool weight checked on validation members) are the models; and
  :func:`elicitation.group.plan_round` -- the one planner, which ``priorly bench group``
  runs as its ``live`` method -- replays the closed rounds (so the rounds, answers and
  per-member counts already spent are charged against the budget, an asked question is
  never planned again, and the predictions use the answers gathered) and chooses the
  question and members: by the expected gain in correct target answers with one more
  answer ahead (``elook``, the benchmark's ``default``), or by k-means over the GNN's
  member embeddings (``relational``). The job stores the plan with every score and a
  reason per member.
* **open** (:func:`open_round`): from a plan that is still current (no round opened or
  closed since it was made), in one transaction: a ``group_round`` row, and per chosen
  member a ``group_round_member`` row with the hash of a personal link token and a new
  *round session* (an ``elicitation_session`` of that respondent whose first and only
  question is the round's: its decision at position 0 has criterion ``group_round`` and the
  plan's scores). Budgets are checked again against the stored rounds.
* **answer** (:func:`answer_round`): the link's page is the respondent question page; the
  answer is stored by :func:`app.session.submit_answer` (the one answer path:
  locking, idempotency, conflicts), after which the round session is finished (its next
  decision becomes a stop: one question per link).
* **track** (:func:`round_view`): who answered, from the round sessions' answer rows.
* **close** (:func:`close_round`): in one transaction that holds the write lock on every
  member session, unanswered round sessions become ``abandoned`` — the answer path itself
  then refuses any later answer (``SessionClosedError``) — and each member's outcome
  (answered / skipped / no_answer) is recorded.

Link tokens are ``HMAC-SHA256(secret key, "group-round:<round id>:<respondent id>")``
(URL-safe base64): the researcher's pages can show a link again without storing it, and
only its SHA-256 hash is in the database. The round session's own session token is random
and never shown, so a round session can only be answered through its round link.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from app import session as svc
from app.errors import ConflictError, InvalidInputError, NotFoundError
from app.schemas import StudySettings
from app.services.belief import NoModelError, historical_matrix
from app.tables import (
    Answer,
    ElicitationSession,
    FittedModel,
    GroupRound,
    GroupRoundMember,
    GroupRoundStatus,
    Job,
    JobStatus,
    Researcher,
    Respondent,
    RespondentSource,
    SelectionDecision,
    Study,
    StudyStatus,
    respondent_label,
)
from elicitation.errors import BudgetError, GroupError
from elicitation.group import (
    SELECTION_LABELS,
    SELECTIONS,
    ClosedRound,
    GNNView,
    GroupBudget,
    GroupElicitation,
    GroupState,
    PlannerModels,
    RoundPlan,
    live_method,
    plan_round,
    replay,
    validation_pool,
)
from models.base import MISSING

ROUND_CRITERION = "group_round"
"""The ``criterion`` of a round session's decisions (the question was chosen for the group)."""
ONE_QUESTION_STOP = "group round: one question per link"
DEFAULT_MAX_MEMBERS = 2000
FIT_FIRST = 'fit the belief model first: run "Fit the belief model" on the Jobs tab'

MIN_VALIDATION_MEMBERS = 10
"""The fewest validation members on which the study's GNN is checked before it is used."""


def gnn_holdout(train: torch.Tensor, val: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fit [N_fit, I], check [N_check, I])``: the imported respondents the group GNN is
    trained on, and those it is checked on (its early stopping in the ``train_gnn`` job,
    its pool weight in the planner: the same members in both).

    ``train`` and ``val`` are :func:`app.services.belief.historical_matrix`'s (respondent
    id order). With at least :data:`MIN_VALIDATION_MEMBERS` validation members (the
    dataset's own split) they are the check; otherwise (an upload without a split) the
    last ``max(MIN_VALIDATION_MEMBERS, N // 10)`` of all ``N`` respondents are, when at
    least as many are left to fit on. Example: 50 respondents, none marked validation:
    fit on the first 40, check on the last 10.
    """
    if val.shape[0] >= MIN_VALIDATION_MEMBERS:
        return train, val
    data = torch.cat([train, val])
    n = data.shape[0]
    n_check = max(MIN_VALIDATION_MEMBERS, n // 10)
    if n - n_check < n_check:
        return train, val
    return data[: n - n_check], data[n - n_check :]


class RoundClosedError(ConflictError):
    """The round of a link is closed: answers are no longer accepted."""

    code = "round_closed"


class RoundLinkNotFoundError(NotFoundError):
    code = "round_link_not_found"


class GroupBudgetError(ConflictError):
    """Opening or planning a round would exceed the study's group budget."""

    code = "group_budget"


# ----- links ------------------------------------------------------------------------------------


def link_token(secret: str, round_id: int, respondent_id: int) -> str:
    """The personal link token of a member of a round (deterministic, see module doc)."""
    mac = hmac.new(
        secret.encode(), f"group-round:{round_id}:{respondent_id}".encode(), hashlib.sha256
    )
    return base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


def member_label(respondent: Respondent) -> str:
    """How a member is named to the researcher (:func:`app.tables.respondent_label`)."""
    return respondent_label(respondent.external_id, respondent.id)


# ----- reading rounds ---------------------------------------------------------------------------


def study_rounds(study: Study, *, session: Session) -> list[GroupRound]:
    """The study's rounds in order (1, 2, ...)."""
    return list(
        session.exec(
            select(GroupRound)
            .where(GroupRound.study_id == study.id)
            .order_by(col(GroupRound.number))
        ).all()
    )


def get_round(study: Study, number: int, *, session: Session) -> GroupRound:
    """Round ``number`` of ``study``; :class:`NotFoundError` otherwise."""
    rnd = session.exec(
        select(GroupRound).where(GroupRound.study_id == study.id, GroupRound.number == number)
    ).first()
    if rnd is None:
        raise NotFoundError(f"study {study.slug!r} has no group round {number}")
    return rnd


def round_members(round_ids: Sequence[int], session: Session) -> list[GroupRoundMember]:
    if not round_ids:
        return []
    return list(
        session.exec(
            select(GroupRoundMember)
            .where(col(GroupRoundMember.round_id).in_(list(round_ids)))
            .order_by(col(GroupRoundMember.id))
        ).all()
    )


def answers_by_session(session_ids: Sequence[int], session: Session) -> dict[int, Answer]:
    """The (first) answer row of each round session that has one."""
    if not session_ids:
        return {}
    out: dict[int, Answer] = {}
    for a in session.exec(
        select(Answer).where(col(Answer.session_id).in_(list(session_ids))).order_by(col(Answer.id))
    ).all():
        out.setdefault(a.session_id, a)
    return out


# ----- the replay of the group -------------------------------------------------------------------


@dataclass
class GroupReplay:
    """The study's group as :mod:`elicitation.group` sees it after its closed rounds.

    Attributes:
        rt: the study runtime (items, model, candidates, targets).
        group: the elicitation with every closed round applied.
        members: the panel's respondents; row ``r`` of ``group.observed`` is ``members[r]``.
        panel: ``live`` or ``import``.
        rounds: every round of the study (open ones included), in order.
        askable: ``[N]`` bool, the members who can receive a question
            (:func:`reachable_members`).
        models, state, budget: the planner's inputs (:func:`elicitation.group.plan_round`).
        info: what :func:`study_planner_models` says about the GNN.
        panel_size: the respondents of the panel's source; above ``len(members)`` when
            the panel was cut to its first ``max_members`` by id.
    """

    rt: svc.StudyRuntime
    group: GroupElicitation
    members: list[Respondent]
    panel: str
    rounds: list[GroupRound]
    settings: StudySettings
    askable: torch.Tensor
    models: PlannerModels
    state: GroupState
    budget: GroupBudget
    info: dict[str, Any]
    panel_size: int


def _panel_members(
    study: Study, rounds: list[GroupRound], max_members: int, session: Session
) -> tuple[str, list[Respondent], int]:
    """The panel: the source of the first round, else the study's ``group.panel`` setting
    (``auto``: live respondents when any, else imported); its first ``max_members``
    respondents by id, and how many the source has."""

    def of(source: str) -> list[Respondent]:
        return list(
            session.exec(
                select(Respondent)
                .where(Respondent.study_id == study.id, Respondent.source == source)
                .order_by(col(Respondent.id))
                .limit(max_members)
            ).all()
        )

    chosen = StudySettings.model_validate(study.settings or {}).group.panel
    if rounds or chosen != "auto":
        imported = RespondentSource.import_.value
        source = rounds[0].panel if rounds else imported if chosen == "imported" else "live"
        members = of(source)
    else:
        source, members = RespondentSource.live.value, of(RespondentSource.live.value)
        if not members:
            source, members = RespondentSource.import_.value, of(RespondentSource.import_.value)
    size = len(members)
    if size == max_members:
        size = session.exec(
            select(func.count())
            .select_from(Respondent)
            .where(Respondent.study_id == study.id, Respondent.source == source)
        ).one()
    return source, members, size


def reachable_members(
    members: Sequence[Respondent], panel: str, answered: set[int]
) -> torch.Tensor:
    """``[N]`` bool: the members who can receive a round's question.

    A round question reaches a member through a personal link (``/g/<token>``) that the
    researcher, or the product of an API client, hands to that person; so a member can be
    asked when

    * they took part: a live member consented (the respondent row exists only after
      consent) **and** answered at least one question of their ordinary sessions
      (``answered``: respondent ids with a non-skipped answer); an imported member has
      historical answers;
    * and they can be reached: an ``external_id`` (given by an API client, a panel or
      the import) or panel parameters of their survey link (a recruitment panel's ids).
      An anonymous visitor of the public survey link has neither: nobody can hand them
      a link.
    """
    ok = []
    for m in members:
        took_part = m.id in answered if panel == RespondentSource.live.value else bool(m.answers)
        reachable = bool(m.external_id) or bool(m.panel_params)
        ok.append(took_part and reachable)
    return torch.tensor(ok, dtype=torch.bool)


def group_budget(settings: StudySettings) -> Any:
    """The study's group settings as an :class:`elicitation.group.GroupBudget`."""
    g = settings.group
    return GroupBudget(
        respondents=g.respondents_per_round or float(g.respondents_share),
        rounds=g.rounds,
        total_answers=g.total_answers,
        max_questions_per_respondent=g.max_questions_per_respondent,
    )


def gnn_validation_note(w: float, pool: dict[str, Any]) -> str:
    """What the plan page says of a GNN that validation gave the pool weight ``w`` (``""``
    when it is used). ``pool`` is :func:`elicitation.group.validation_pool`'s: ``members``,
    ``w_best_mean`` (the weight of the best mean gain), ``gain`` and ``gain_se`` (there).

    Example: ``w = 0``, ``w_best_mean = 0`` (every positive weight loses log score): "on the
    403 validation members the GNN predicts worse than the belief model at every weight
    tried: its starting weight is 0, ...".
    """
    if w > 0.0:
        return ""
    if pool["w_best_mean"] == 0.0:
        finding = "predicts worse than the belief model at every weight tried"
    else:
        finding = (
            f"does not clearly help (at its best weight, {pool['w_best_mean']:.2g}, a gain "
            f"of {pool['gain']:.4f} ± {pool['gain_se']:.4f} nats per answer)"
        )
    return (
        f"on the {pool['members']} validation members the GNN {finding}: its starting "
        "weight is 0 (the belief model's predictions); the weight is re-chosen with every "
        "round's answers"
    )


def study_planner_models(
    study: Study, rt: svc.StudyRuntime, *, session: Session, seed: int = 0
) -> tuple[PlannerModels, dict[str, Any]]:
    """The study's stored models for the planner: the active belief model and, when the
    "Train the group GNN" job stored one (the study's latest ``fitted_model`` of family
    ``gnn``), that GNN with its pool weight checked on the study's validation members
    (:func:`elicitation.group.validation_pool`).

    Returns ``(models, info)``; ``info`` says what the plan page shows: ``gnn_model_id``,
    ``gnn_note`` (why the GNN is not used, or what validation says of it), and the
    validation figures ``pool_val_gain``, ``pool_val_gain_se``, ``pool_val_members``.
    Without a usable GNN the planner runs on the belief model alone and says why.
    """
    info: dict[str, Any] = {"gnn_model_id": None}

    def without(note: str) -> tuple[PlannerModels, dict[str, Any]]:
        info["gnn_note"] = note
        return PlannerModels(rt.model, gnn_note=note), info

    row = session.exec(
        select(FittedModel)
        .where(FittedModel.study_id == study.id, FittedModel.family == "gnn")
        .order_by(col(FittedModel.id).desc())
    ).first()
    if row is None:
        return without(
            'no group GNN is trained for this study (run "Train the group GNN"): '
            "planned with the belief model alone"
        )
    info["gnn_model_id"] = row.id
    # gnn loads torch_geometric (seconds): only when the study has a trained GNN
    from gnn.graph import GNNError
    from gnn.train import TrainedGNN

    try:
        trained = TrainedGNN.from_bytes(row.blob)
    except GNNError as exc:
        return without(f"the stored GNN cannot be read ({exc}): planned without it")
    bank_of = {it.key: rt.model_index.get(it.id) for it in rt.items}
    keys = (*trained.schema.attribute_names, *trained.schema.question_names)
    lost = [k for k in keys if bank_of.get(k) is None]
    if lost or not trained.schema.question_names:
        return without(
            f"the GNN was trained on items the active model does not have ({', '.join(lost[:5])}): "
            "train it again; planned without it"
        )
    view = GNNView(
        trained,
        [int(bank_of[k]) for k in trained.schema.attribute_names],  # type: ignore[arg-type]
        [int(bank_of[k]) for k in trained.schema.question_names],  # type: ignore[arg-type]
    )
    bank_items = sorted(
        (it for it in rt.items if it.id in rt.model_index), key=lambda it: rt.model_index[it.id]
    )
    _, val = gnn_holdout(*historical_matrix(study.id or 0, bank_items, session=session))
    if val.shape[0] < MIN_VALIDATION_MEMBERS:
        return without(
            f"only {val.shape[0]} validation members to check the GNN on (at least "
            f"{MIN_VALIDATION_MEMBERS} are needed): planned without it"
        )
    w, pool = validation_pool(rt.model, view, val, seed=seed)
    info.update(
        pool_val_gain=float(pool["gain"]),
        pool_val_gain_se=float(pool["gain_se"]),
        pool_val_members=int(pool["members"]),
    )
    info["gnn_note"] = gnn_validation_note(w, pool)
    models = PlannerModels(rt.model, view, w, (pool["gain_sums"], pool["gain_counts"]))
    return models, info


def _option_index(rt: svc.StudyRuntime, item_id: int, letter: str | None) -> int | None:
    """Option index of answer ``letter`` to item ``item_id`` in the active model.

    ``None`` when the item is not in the model, the letter is ``None`` or not one of the
    item's options.
    """
    it = rt.by_id.get(item_id)
    if it is None or letter is None or item_id not in rt.model_index:
        return None
    letters = [o[0] for o in it.options]
    return letters.index(letter) if letter in letters else None


def _put(
    observed: torch.Tensor, rt: svc.StudyRuntime, r: int, item_id: int, letter: str | None
) -> None:
    """Record answer ``letter`` to ``item_id`` in row ``r`` of ``observed`` when it is known."""
    k = _option_index(rt, item_id, letter)
    if k is not None:
        observed[r, rt.model_index[item_id]] = k


def _observe_members(
    rt: svc.StudyRuntime, members: Sequence[Respondent], panel: str, observed: torch.Tensor
) -> None:
    """Fill ``observed`` ``[R, I]`` in place from the members' own records.

    Every member's attributes; for an imported panel also their historical answers except
    candidates and targets.
    """
    hidden = {c.key for c in rt.candidates} | {t.key for t in rt.targets}
    for r, person in enumerate(members):
        for key, letter in (person.attributes or {}).items():
            if key in rt.by_key:
                _put(observed, rt, r, rt.by_key[key].id, letter)
        if panel == RespondentSource.import_.value:
            for key, letter in (person.answers or {}).items():
                if key in rt.by_key and key not in hidden:
                    _put(observed, rt, r, rt.by_key[key].id, letter)


def _observe_sessions(
    study: Study,
    rt: svc.StudyRuntime,
    observed: torch.Tensor,
    row_of: dict[int | None, int],
    exclude: tuple[set[int], set[tuple[int, int]]],
    session: Session,
) -> set[int]:
    """Fill ``observed`` in place from the members' session answers; who answered something.

    ``exclude`` is ``(round_sessions, asked_in_round)``: answers in a round's own session,
    and answers by a member to a question a closed round asked them, are left out (the
    rounds add them). Returns the respondent ids with at least one recorded option.
    """
    round_sessions, asked_in_round = exclude
    rows = session.exec(
        select(Answer, ElicitationSession.respondent_id, ElicitationSession.id)
        .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
        .where(ElicitationSession.study_id == study.id)
    ).all()
    answered: set[int] = set()
    for row, rid, sid in rows:
        if rid in row_of and sid not in round_sessions and (rid, row.item_id) not in asked_in_round:
            _put(observed, rt, row_of[rid], row.item_id, row.option)
            if row.option is not None:
                answered.add(rid)
    return answered


def _closed_rounds(
    rt: svc.StudyRuntime,
    closed: Sequence[GroupRound],
    members_of: dict[int, list[GroupRoundMember]],
    row_of: dict[int | None, int],
    answers: dict[int, Answer],
) -> list[ClosedRound]:
    """The closed rounds as :class:`ClosedRound`: model item, panel rows asked, answers.

    A member no longer in the panel is left out; an answer is its option index, ``-1``
    when skipped or unanswered.

    Raises:
        ConflictError: a round's question is no longer an item of the active model.
    """
    closed_rounds: list[ClosedRound] = []
    for rnd in closed:
        if rnd.item_id not in rt.model_index:
            raise ConflictError(
                f"the question of round {rnd.number} is not an item of the active model"
            )
        asked: list[int] = []
        got: list[int] = []
        for m in members_of[rnd.id or 0]:
            if m.respondent_id not in row_of:
                continue  # no longer in the panel (erased, or beyond max_members)
            given = answers.get(m.session_id)
            k = _option_index(rt, rnd.item_id, given.option) if given is not None else None
            asked.append(row_of[m.respondent_id])
            got.append(-1 if k is None else k)
        closed_rounds.append(
            ClosedRound(
                rt.model_index[rnd.item_id],
                torch.tensor(asked, dtype=torch.long),
                torch.tensor(got, dtype=torch.long),
            )
        )
    return closed_rounds


def replay_group(
    study: Study,
    *,
    session: Session,
    max_members: int = DEFAULT_MAX_MEMBERS,
    seed: int = 0,
    selection: str = "elook",
    use_gnn: bool = True,
) -> GroupReplay:
    """Build the group elicitation of ``study`` and apply its closed rounds (module doc).

    Observations per member (``observed[r, i]``, ``-1`` unknown): attributes; for a live
    panel the answers of their ordinary sessions; for an imported panel the historical
    answers except candidates (what a round may ask) and targets (what the group study
    wants to learn). Each closed round ``k`` is then applied: ``asked`` = its members in
    the panel, ``answers`` = their option index, or ``-1`` when skipped or unanswered.
    The models are the study's (:func:`study_planner_models`; ``use_gnn=False``: the
    belief model alone) and the elicitation is :func:`elicitation.group.replay`'s.

    Raises:
        InvalidInputError: no targets, or no respondents to form a panel.
        ConflictError: a round's question is no longer an item of the active model.
    """
    try:
        rt = svc.load_runtime(study, session=session, fit_if_missing=False)
    except NoModelError:
        raise NoModelError(
            f"study {study.slug!r} has no fitted belief model: {FIT_FIRST}"
        ) from None
    if not rt.targets:
        raise InvalidInputError("choose at least one target item before planning a round")
    settings = StudySettings.model_validate(study.settings or {})
    rounds = study_rounds(study, session=session)
    panel, members, panel_size = _panel_members(study, rounds, max_members, session)
    if not members:
        raise InvalidInputError("the study has no respondents to plan a round for")
    n_items = rt.model.item_bank.n_items
    observed = torch.full((len(members), n_items), MISSING, dtype=torch.long)
    row_of = {m.id: r for r, m in enumerate(members)}
    closed = [r for r in rounds if r.status == GroupRoundStatus.closed.value]
    members_of: dict[int, list[GroupRoundMember]] = {r.id or 0: [] for r in rounds}
    for m in round_members([r.id or 0 for r in rounds], session):
        members_of[m.round_id].append(m)
    round_sessions = {m.session_id for ms in members_of.values() for m in ms}
    asked_in_round = {(m.respondent_id, r.item_id) for r in closed for m in members_of[r.id or 0]}
    _observe_members(rt, members, panel, observed)
    answered = _observe_sessions(
        study, rt, observed, row_of, (round_sessions, asked_in_round), session
    )
    askable = reachable_members(members, panel, answered)
    answers = answers_by_session(
        [m.session_id for r in closed for m in members_of[r.id or 0]], session
    )
    closed_rounds = _closed_rounds(rt, closed, members_of, row_of, answers)
    if use_gnn:
        models, info = study_planner_models(study, rt, session=session, seed=seed)
    else:
        models, info = PlannerModels(rt.model), {"gnn_model_id": None, "gnn_note": ""}
    state = GroupState(
        observed,
        [rt.model_index[c.id] for c in rt.candidates],
        [rt.model_index[t.id] for t in rt.targets],
        closed_rounds,
        askable=askable,
    )
    budget = group_budget(settings)
    try:
        group = replay(models, state, budget, selection=selection, seed=seed)
    except GroupError as exc:
        raise InvalidInputError(str(exc)) from None
    return GroupReplay(
        rt,
        group,
        members,
        panel,
        rounds,
        settings,
        askable,
        models,
        state,
        budget,
        info,
        panel_size,
    )


def target_predictions(rt: svc.StudyRuntime, group: GroupElicitation) -> list[dict[str, Any]]:
    """Per target: the panel's imputed distribution and its uncertainty.

    With ``p[v, t, o]`` the predictions of :meth:`GroupElicitation.predict_targets`
    (members' answers independent given them), the share of the ``N`` members who would
    answer option ``o`` has mean ``m_o = sum_v p[v, t, o] / N`` and standard error
    ``se_o = sqrt(sum_v p[v, t, o] (1 - p[v, t, o])) / N``; keys ``mean`` and ``se``.
    """
    p = group.predict_targets()  # [N, T, O]
    n = max(1, p.shape[0])
    mean = p.mean(0)
    se = (p * (1 - p)).sum(0).clamp_min(0).sqrt() / n
    out = []
    for t, item in enumerate(rt.targets):
        k = len(item.options)
        out.append(
            {
                "item": item.key,
                "question": item.question,
                "labels": [str(o[1]) for o in item.options],
                "mean": [float(x) for x in mean[t, :k].tolist()],
                "se": [float(x) for x in se[t, :k].tolist()],
            }
        )
    return out


def panel_estimate(rep: GroupReplay) -> GroupElicitation:
    """The study's estimate of the panel after its closed rounds, whatever selection
    planned them: the default selection's replay (the belief model, pooled with the GNN at
    the weight chosen online when the study has one), so that every plan's predicted
    targets and the groups page's chart are the same figures."""
    if rep.group.method == live_method("elook", rep.models):
        return rep.group
    return replay(rep.models, rep.state, rep.budget)


def _plan_result(
    rep: GroupReplay, plan: RoundPlan, selection: str, n_eligible: int
) -> dict[str, Any]:
    """The plan job's result for ``plan`` on the replayed group ``rep``.

    Keys as listed in :func:`plan_next_round`; ``n_eligible`` members can receive a
    question.
    """
    rt, members, group, question, who = rep.rt, rep.members, plan.group, plan.question, plan.members
    assert group is not None
    member_gain = plan.member_gain
    item_of = {rt.model_index[it.id]: it for it in rt.items if it.id in rt.model_index}
    pairs = sorted(
        zip(plan.left, plan.question_scores.tolist(), strict=True), key=lambda cs: -float(cs[1])
    )
    estimate = panel_estimate(rep)  # relational: not its own GNN-imputed predictions
    others = rep.askable.clone()
    others[who] = False
    m = plan.method
    return {
        "best_gain_not_chosen": float(member_gain[others].max()) if bool(others.any()) else None,
        "panel": "live" if rep.panel == RespondentSource.live.value else "imported",
        "n_members": len(members),
        "panel_size": rep.panel_size,
        "n_eligible": n_eligible,
        "question": item_of[question].key,
        "question_text": item_of[question].question,
        "question_scores": [{"item": item_of[c].key, "score": float(s)} for c, s in pairs],
        "score_unit": "nats" if m.question == "eig" else "expected correct target answers",
        "respondents": [
            {
                "respondent": member_label(members[int(v)]),
                "respondent_id": members[int(v)].id,
                "expected_gain": round(float(member_gain[int(v)]), 6) + 0.0,  # never -0.0
                "questions_asked": int(group.n_asked[int(v)]),
                "reason": plan.explanations[j]["reason"] if plan.explanations else "",
            }
            for j, v in enumerate(who.tolist())
        ],
        "per_round": len(who),
        "rounds_done": len(group.records),
        "rounds_total": group.budget.rounds,
        "answers_used": group.answers_used,
        "total_answers": group.budget.total_answers,
        "selection": selection,
        "selection_label": SELECTION_LABELS[selection],
        "method": f"{m.question} / {m.respondents} / {m.imputation}",
        "uses_gnn": plan.uses_gnn,
        "gnn_model_id": rep.info.get("gnn_model_id"),
        "gnn_note": rep.info.get("gnn_note", ""),
        "pool_weight": estimate.pool_weight if estimate.method.imputation == "pool" else 0.0,
        "pool_val_gain": rep.info.get("pool_val_gain"),
        "pool_val_gain_se": rep.info.get("pool_val_gain_se"),
        "predictions": target_predictions(rt, estimate),
    }


def plan_next_round(
    study: Study,
    *,
    session: Session,
    max_members: int = DEFAULT_MAX_MEMBERS,
    seed: int = 0,
    selection: str = "elook",
    progress: Callable[[float, str], None] | None = None,
) -> dict[str, Any]:
    """The next round's question and members with their scores (the plan job's result).

    The plan is :func:`elicitation.group.plan_round` (the benchmark's ``live`` method)
    with the study's stored models (:func:`study_planner_models`) and the members' states
    (:func:`replay_group`). ``selection``: ``elook`` (expected gain in correct target
    answers) or ``relational`` (k-means over the GNN's member embeddings; needs the
    study's GNN).

    Keys: ``question`` (item key), ``question_text``, ``question_scores`` (every candidate
    not asked yet, best first), ``respondents`` (``respondent`` label, ``respondent_id``,
    ``expected_gain`` in expected correct target answers, ``questions_asked``,
    ``reason``), ``per_round``, ``best_gain_not_chosen``, ``panel`` (``live`` /
    ``imported``), ``n_members``, ``n_eligible`` (members who can receive a question:
    reachable, and asked fewer round questions than ``max_questions_per_respondent``),
    ``rounds_done``, ``rounds_total``, ``answers_used``, ``total_answers``, ``selection``,
    ``selection_label``, ``method``, ``uses_gnn``, ``gnn_model_id``, ``gnn_note``,
    ``pool_weight`` (the GNN's) and ``predictions`` (per target, the panel's mean
    predicted distribution after the closed rounds with its uncertainty), both of
    :func:`panel_estimate` whatever the selection. ``expected_gain`` is the same figure
    for both selections (what ``elook`` ranks by; relational selection ranks by none).

    Raises:
        ConflictError: a round is open (close it first).
        InvalidInputError: unknown selection, or relational selection without a GNN.
        GroupBudgetError: the budget is spent (rounds or total answers), or nobody is left
            who may be asked.
    """
    if selection not in SELECTIONS:
        raise InvalidInputError(
            f"selection: unknown respondent selection {selection!r} (known: {sorted(SELECTIONS)})"
        )
    if progress:
        progress(0.05, "loading the models and the panel")
    rep = replay_group(
        study, session=session, max_members=max_members, seed=seed, selection=selection
    )
    open_ = [r for r in rep.rounds if r.status == GroupRoundStatus.open.value]
    if open_:
        raise ConflictError(f"round {open_[0].number} is open: close it before planning the next")
    members = rep.members
    if not bool(rep.askable.any()):
        raise GroupBudgetError(
            f"none of the {len(members)} members can receive a question: a live member must "
            "have answered a survey question and be reachable (an external id or panel "
            "parameters in their survey link); an imported one must have imported answers"
        )
    cap = rep.budget.max_questions_per_respondent
    under_cap = rep.askable if cap is None else rep.askable & (rep.group.n_asked < cap)
    n_eligible = int(under_cap.sum())  # reachable and below the per-respondent cap
    if n_eligible == 0:
        raise GroupBudgetError(
            f"no member may be asked: each of the {int(rep.askable.sum())} reachable members "
            f"has been asked {cap} round question{'' if cap == 1 else 's'}, the most one "
            "respondent may be asked over all rounds (raise “Round questions per respondent” "
            "in the study's settings to ask them again)"
        )
    if progress:
        progress(0.2, f"scoring {len(rep.state.candidates)} questions for {len(members)} members")
    try:
        plan = plan_round(rep.models, rep.state, rep.budget, selection=selection, seed=seed)
    except BudgetError as exc:
        raise GroupBudgetError(f"the group budget is spent: {exc}") from None
    except GroupError as exc:
        raise InvalidInputError(str(exc)) from None
    assert plan.group is not None
    if len(plan.members) == 0:
        raise GroupBudgetError(
            "nobody may be asked this question (every member who can be reached has "
            "answered it or reached the per-respondent question budget)"
        )
    return _plan_result(rep, plan, selection, n_eligible)


# ----- budgets ----------------------------------------------------------------------------------


def _check_budget(
    study: Study, rounds: list[GroupRound], chosen: list[int], n_members: int, session: Session
) -> None:
    """Refuse a round that the stored rounds and the current settings do not allow."""
    settings = StudySettings.model_validate(study.settings or {})
    g = settings.group
    if len(rounds) >= g.rounds:
        raise GroupBudgetError(f"all {g.rounds} rounds of the group budget were used")
    per_round = group_budget(settings).per_round(n_members)
    if len(chosen) > per_round:
        raise GroupBudgetError(
            f"the plan asks {len(chosen)} respondents; the budget allows {per_round} per round"
        )
    members = round_members([r.id or 0 for r in rounds], session)
    if g.total_answers is not None and len(members) + len(chosen) > g.total_answers:
        raise GroupBudgetError(
            f"{len(members)} of the {g.total_answers} round questions of the group budget are used "
            f"(members invited in all rounds, answered or not); this round asks {len(chosen)} more"
        )
    count: dict[int, int] = {}
    for m in members:
        count[m.respondent_id] = count.get(m.respondent_id, 0) + 1
    over = [rid for rid in chosen if count.get(rid, 0) >= g.max_questions_per_respondent]
    if over:
        raise GroupBudgetError(
            f"respondent id {over[0]} was already asked {count[over[0]]} question(s), the "
            f"most one respondent may be asked ({g.max_questions_per_respondent})"
        )


# ----- open ------------------------------------------------------------------------------------


def _finished_plan_job(study: Study, plan_job_id: int, db: Session) -> Job:
    """The succeeded round plan job ``plan_job_id`` of ``study``, which must be published.

    Raises:
        NotFoundError: no such plan job of the study.
        ConflictError: the plan has not finished, or the study is not published.
    """
    job = db.get(Job, plan_job_id)
    if job is None or job.study_id != study.id or job.kind != "plan_group_round":
        raise NotFoundError(f"no round plan {plan_job_id} in this study")
    if job.status in (JobStatus.failed.value, JobStatus.cancelled.value):
        raise ConflictError(f"round plan {plan_job_id} {job.status}: plan the next round again")
    if job.status != JobStatus.succeeded.value or not job.result:
        raise ConflictError(f"round plan {plan_job_id} has not finished")
    if study.status != StudyStatus.published.value:
        raise ConflictError(
            "publish the study before opening a round (members answer on the "
            "respondent pages, which only a published study has)"
        )
    return job


def _add_members(
    db: Session,
    study: Study,
    rnd: GroupRound,
    planned: list[dict[str, Any]],
    asked: tuple[int | None, str, dict[str, Any], int],
    secret: str,
) -> None:
    """Add the planned members to round ``rnd``: per member a session, its decision and
    the membership (the respondents read in one query, the rows written in batches).

    ``asked`` is ``(item_id, panel, scores, model_id)``: the round's question, the panel
    source, the question scores of the plan and the active model. A session's token is
    never shown; a member's link token derives from ``secret``, the round and the
    respondent.

    Raises:
        ConflictError: a respondent is no longer in the panel.
    """
    item_id, panel, scores, model_id = asked
    ids = [int(p["respondent_id"]) for p in planned]
    found = {
        r.id: r
        for r in db.exec(
            select(Respondent).where(
                col(Respondent.id).in_(ids),
                Respondent.study_id == study.id,
                Respondent.source == panel,
            )
        ).all()
    }
    for p in planned:
        if int(p["respondent_id"]) not in found:
            raise ConflictError(f"respondent {p['respondent']!r} is no longer in the panel")
    sessions = [
        ElicitationSession(
            study_id=study.id or 0,
            respondent_id=rid,
            token_hash=svc.hash_token(svc.new_token()),  # never shown: links only
            model_id=model_id,
        )
        for rid in ids
    ]
    db.add_all(sessions)
    db.flush()
    for p, sess, rid in zip(planned, sessions, ids, strict=True):
        gain = float(p["expected_gain"])
        db.add(
            SelectionDecision(
                session_id=sess.id or 0,
                position=0,
                item_id=item_id,
                criterion=ROUND_CRITERION,
                scores={
                    "scores": scores,
                    "round": rnd.number,
                    "expected_gain": gain,
                    "model_id": model_id,
                },
            )
        )
        db.add(
            GroupRoundMember(
                round_id=rnd.id or 0,
                respondent_id=rid,
                session_id=sess.id or 0,
                token_hash=svc.hash_token(link_token(secret, rnd.id or 0, rid)),
                expected_gain=gain,
            )
        )


def open_round(
    study: Study,
    plan_job_id: int,
    *,
    engine: Engine,
    secret: str,
    researcher: Researcher | None = None,
) -> GroupRound:
    """Open the round planned by job ``plan_job_id`` (see the module doc).

    ``secret`` is the app's secret key (it derives the members' link tokens).

    Raises:
        NotFoundError: no such plan job of the study.
        ConflictError: the study is not published, a round is open, the plan is out of
            date (a round was opened or closed since), or its question or a member is gone.
        GroupBudgetError: the round would exceed the group budget.
    """
    with Session(engine, expire_on_commit=False) as db:
        job = _finished_plan_job(study, plan_job_id, db)
        plan = job.result
        rounds = study_rounds(study, session=db)
        open_ = [r for r in rounds if r.status == GroupRoundStatus.open.value]
        if open_:
            raise ConflictError(f"round {open_[0].number} is still open: close it first")
        if int(plan.get("rounds_done", -1)) != len(rounds):
            raise ConflictError(
                "this plan is out of date (a round was opened or closed after it was made): "
                "plan the next round again"
            )
        rt = svc.load_runtime(study, session=db, fit_if_missing=False)
        item = rt.by_key.get(str(plan["question"]))
        if item is None or item not in rt.candidates:
            raise ConflictError(f"the planned question {plan['question']!r} is no longer askable")
        chosen = [int(p["respondent_id"]) for p in plan["respondents"]]
        _check_budget(study, rounds, chosen, int(plan["n_members"]), db)
        panel = (
            RespondentSource.live.value
            if plan["panel"] == "live"
            else RespondentSource.import_.value
        )
        rnd = GroupRound(
            study_id=study.id or 0,
            number=len(rounds) + 1,
            item_id=item.id,
            panel=panel,
            plan_job_id=job.id,
            plan={
                "question_key": item.key,
                "question_scores": plan["question_scores"],
                "n_members": plan["n_members"],
                "per_round": plan["per_round"],
                "best_gain_not_chosen": plan.get("best_gain_not_chosen"),
                "selection": plan.get("selection"),
            },
            opened_by_id=researcher.id if researcher else None,
        )
        db.add(rnd)
        try:
            db.flush()
        except IntegrityError:
            db.rollback()
            raise ConflictError("another round was opened at the same time") from None
        scores = {q["item"]: q["score"] for q in plan["question_scores"]}
        _add_members(
            db, study, rnd, list(plan["respondents"]), (item.id, panel, scores, rt.model_id), secret
        )
        db.commit()
        return rnd
