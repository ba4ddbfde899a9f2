"""Tracking and closing a group round: per member whether they answered, the round's
answer counts, its links and results as CSV, and closing it (unanswered members become non-response).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app import session as svc
from app.errors import ConflictError, NotFoundError
from app.schemas import StudySettings
from app.services.export import csv_line, panel_text
from app.services.group_rounds import (
    answers_by_session,
    link_token,
    member_label,
    round_members,
    study_rounds,
)
from app.services.round_links import stop_answered_round_sessions
from app.tables import (
    Answer,
    ElicitationSession,
    GroupRound,
    GroupRoundMember,
    GroupRoundOutcome,
    GroupRoundStatus,
    Respondent,
    SessionStatus,
    Study,
    iso_utc,
    utcnow,
)


@dataclass(frozen=True)
class MemberRow:
    """One line of the track table."""

    label: str
    respondent_id: int
    expected_gain: float
    status: str  # answered / skipped / waiting / no_answer
    answer: str | None  # the option's label
    answered_at: datetime | None
    link: str
    panel: str = ""  # the link parameters the member arrived with (export.panel_text)
    option: str | None = None  # the option's letter


@dataclass(frozen=True)
class RoundView:
    round: GroupRound
    question_key: str
    question_text: str
    members: list[MemberRow]
    asked: int
    answered: int
    skipped: int
    unanswered: int
    """Members without an answer: waiting while the round is open, no answer once closed."""


def round_fingerprint(rnd: GroupRound, *, session: Session) -> str:
    """What the round page shows changes only with this: the round's status, and the
    count and last id of its members' answers (one query, whatever the round's size).

    Example: ``"open:3:1742"`` (3 answers, the last one row 1742).
    """
    n, last = session.exec(
        select(func.count(col(Answer.id)), func.max(col(Answer.id)))
        .join(GroupRoundMember, col(GroupRoundMember.session_id) == col(Answer.session_id))
        .where(GroupRoundMember.round_id == rnd.id)
    ).one()
    return f"{rnd.status}:{n}:{last or 0}"


def round_view(
    study: Study, rnd: GroupRound, *, session: Session, secret: str, link_base: str
) -> RoundView:
    """The round's members with their status and links (``link_base`` + token)."""
    rt = svc.load_runtime(study, session=session, fit_if_missing=False)
    item = rt.by_id.get(rnd.item_id)
    labels = {str(o[0]): str(o[1]) for o in (item.options if item else [])}
    members = round_members([rnd.id or 0], session)
    answers = answers_by_session([m.session_id for m in members], session)
    resp = {
        r.id: r
        for r in session.exec(
            select(Respondent).where(col(Respondent.id).in_([m.respondent_id for m in members]))
        ).all()
    }
    rows: list[MemberRow] = []
    for m in members:
        a = answers.get(m.session_id)
        if a is None:
            status = "waiting" if rnd.status == GroupRoundStatus.open.value else "no_answer"
        else:
            status = "answered" if a.option is not None else "skipped"
        r = resp.get(m.respondent_id)
        rows.append(
            MemberRow(
                label=member_label(r) if r is not None else f"r{m.respondent_id}",
                respondent_id=m.respondent_id,
                expected_gain=m.expected_gain,
                status=status,
                answer=labels.get(a.option or "", a.option) if a and a.option else None,
                answered_at=a.created_at if a else None,
                link=link_base + link_token(secret, rnd.id or 0, m.respondent_id),
                panel=panel_text(r.panel_params) if r is not None else "",
                option=a.option if a else None,
            )
        )
    count = {
        s: sum(1 for r in rows if r.status == s)
        for s in ("answered", "skipped", "waiting", "no_answer")
    }
    return RoundView(
        round=rnd,
        question_key=item.key if item else "?",
        question_text=item.question if item else "",
        members=rows,
        asked=len(rows),
        answered=count["answered"],
        skipped=count["skipped"],
        unanswered=count["waiting"] + count["no_answer"],
    )


def links_csv(view: RoundView) -> str:
    """CSV of a round's members: ``respondent, respondent_id, expected_gain, status, link,
    panel_params`` (the link parameters the member arrived with, e.g.
    ``PROLIFIC_PID=5f3a``, for a mail merge keyed by the panel's ids)."""
    header = ["respondent", "respondent_id", "expected_gain", "status", "link", "panel_params"]
    rows = (
        [m.label, m.respondent_id, f"{m.expected_gain:.6f}", m.status, m.link, m.panel]
        for m in view.members
    )  # csv_line: no spreadsheet formula (OWASP)
    return "".join(csv_line(r) for r in (header, *rows))


ANSWER_COLUMNS = (
    "round",
    "question",
    "respondent",
    "respondent_id",
    "status",
    "option",
    "option_label",
    "answered_at",
    "expected_gain",
    "panel_params",
)
"""The columns of :func:`answers_csv`."""


def answers_csv(view: RoundView) -> str:
    """CSV of a round's results, one row per member (:data:`ANSWER_COLUMNS`): the round's
    number and question key, the member, ``status`` (``answered``, ``skipped``,
    ``waiting`` while open, ``no_answer`` once closed), the option's letter and label,
    ``answered_at`` (ISO 8601 in UTC, as the answer exports), the plan's expected gain and
    the link parameters.

    Example row: ``1,330a,r12,12,answered,A,Support,2026-12-04T18:55:27+00:00,0.031,``.
    """
    rows = (
        [
            view.round.number,
            view.question_key,
            m.label,
            m.respondent_id,
            m.status,
            m.option or "",
            m.answer or "",
            iso_utc(m.answered_at) or "",
            f"{m.expected_gain:.6f}",
            m.panel,
        ]
        for m in view.members
    )
    return "".join(csv_line(r) for r in (list(ANSWER_COLUMNS), *rows))


def close_round(study: Study, number: int, *, engine: Engine) -> GroupRound:
    """Close round ``number``: no answer is accepted on its links afterwards.

    One transaction holding the write lock on every member's round session (SQLite:
    ``BEGIN IMMEDIATE``; PostgreSQL: ``SELECT ... FOR UPDATE`` of those rows, so an answer
    being stored finishes first and is counted): unanswered sessions become
    ``abandoned`` (the answer path refuses them from then on), answered ones
    ``completed``, and each member's outcome is recorded.

    Raises:
        NotFoundError: no such round. ConflictError: the round is already closed.
    """
    with Session(engine, expire_on_commit=False) as db:
        try:
            if engine.dialect.name == "sqlite":
                db.connection().exec_driver_sql("BEGIN IMMEDIATE")
            rnd = db.exec(
                select(GroupRound)
                .where(GroupRound.study_id == study.id, GroupRound.number == number)
                .with_for_update()
            ).first()
            if rnd is None:
                raise NotFoundError(f"study {study.slug!r} has no group round {number}")
            if rnd.status != GroupRoundStatus.open.value:
                raise ConflictError(f"round {number} is already closed")
            members = round_members([rnd.id or 0], db)
            sids = [m.session_id for m in members]
            if sids:
                db.exec(  # type: ignore[call-overload]
                    select(ElicitationSession.id)
                    .where(col(ElicitationSession.id).in_(sids))
                    .order_by(col(ElicitationSession.id))
                    .with_for_update()
                ).all()
            answers = answers_by_session(sids, db)
            now = utcnow()
            for m in members:
                a = answers.get(m.session_id)
                if a is None:
                    m.outcome = GroupRoundOutcome.no_answer.value
                elif a.option is None:
                    m.outcome = GroupRoundOutcome.skipped.value
                else:
                    m.outcome = GroupRoundOutcome.answered.value
                db.add(m)
            unanswered = [m.session_id for m in members if m.session_id not in answers]
            if unanswered:
                db.execute(
                    update(ElicitationSession)
                    .where(col(ElicitationSession.id).in_(unanswered))
                    .values(status=SessionStatus.abandoned.value, updated_at=now)
                )
            # answered: make sure each stopped after its one question
            stop_answered_round_sessions(db, list(answers))
            rnd.status = GroupRoundStatus.closed.value
            rnd.closed_at = now
            db.add(rnd)
            db.commit()
        except BaseException:
            db.rollback()
            raise
        return rnd


@dataclass(frozen=True)
class BudgetUsage:
    """The group budget against what the study's rounds used (for the track page).

    ``asked_total`` counts round questions asked over all rounds, one per member of each
    round (what ``total_answers`` caps, as in :class:`elicitation.group.GroupBudget`);
    ``asked_people`` the distinct respondents among them; ``most_questions`` is the largest
    number of rounds one respondent was asked in (capped by
    ``max_questions_per_respondent``).
    """

    rounds_used: int
    rounds_total: int
    asked_total: int
    asked_people: int
    total_answers: int | None
    answered_total: int
    most_questions: int
    max_questions_per_respondent: int
    per_round_setting: str


def budget_usage(study: Study, *, session: Session) -> BudgetUsage:
    settings = StudySettings.model_validate(study.settings or {})
    g = settings.group
    rounds = study_rounds(study, session=session)
    members = round_members([r.id or 0 for r in rounds], session)
    per_resp: dict[int, int] = {}
    for m in members:
        per_resp[m.respondent_id] = per_resp.get(m.respondent_id, 0) + 1
    answers = answers_by_session([m.session_id for m in members], session)
    return BudgetUsage(
        rounds_used=len(rounds),
        rounds_total=g.rounds,
        asked_total=len(members),
        asked_people=len(per_resp),
        total_answers=g.total_answers,
        answered_total=sum(1 for a in answers.values() if a.option is not None),
        most_questions=max(per_resp.values(), default=0),
        max_questions_per_respondent=g.max_questions_per_respondent,
        per_round_setting=(
            f"{g.respondents_per_round} respondent{'' if g.respondents_per_round == 1 else 's'}"
            if g.respondents_per_round
            else f"{100 * g.respondents_share:g} % of the panel"
        ),
    )
