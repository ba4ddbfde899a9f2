"""What the routes show: where a session stands, its answers, predictions and explanation.

:class:`SessionView` is the result of every start, attribute submission and answer: the
phase (``attributes`` / ``question`` / ``done``), the current :class:`QuestionView` and
the progress. The readers (:func:`session_view`, :func:`session_answers`,
:func:`predictions`, :func:`explanation`) use the caller's database session and never the
cached state (predictions replay the stored answers).

The position of a decision is the number of questions posed before it: decision 0 picks
the first question, decision ``n`` the question after ``n`` answers (or skips). A stopped
session's last decision has ``item_id`` NULL and a ``stop_reason``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from sqlalchemy import func
from sqlmodel import Session, select

from app import respondent_text
from app.respondent_text import DEFAULT_LANGUAGE, NOUNS_CAPITALISED
from app.session.errors import NotCurrentQuestionError, SessionNotFoundError
from app.session.runtime import ItemInfo, StudyRuntime, load_runtime, session_runtime
from app.session.sql import DecisionRow
from app.session.state import replay, respondent_and_answers
from app.session.tokens import hash_token
from app.tables import (
    Answer,
    ElicitationSession,
    Item,
    Respondent,
    SelectionDecision,
    SessionStatus,
    Study,
    iso_utc,
)

TOP_PERSONAS = 5
"""Personas listed with a session's predictions (the largest posterior weights)."""


@dataclass(frozen=True)
class QuestionView:
    """The question a respondent is asked now.

    Attributes:
        number: 1-based number of this question in the session.
        options: ``[(letter, label), ...]`` in scale order.
    """

    item_id: int
    key: str
    text: str
    options: list[tuple[str, str]]
    number: int
    topic: str | None = None


@dataclass(frozen=True)
class SessionView:
    """Where a session stands.

    Attributes:
        status: ``active`` / ``completed`` / ...
        phase: ``attributes`` (the browser still asks the attribute questions),
            ``question`` (a question is waiting) or ``done``.
        n_posed: questions answered or skipped so far.
        max_questions: the most questions this session can pose (it may stop earlier).
        question: the current question, or ``None``.
        stop_reason: why the session stopped (``None`` while active).
        replayed: whether this is the view an answer stored earlier got, returned again
            for a request that repeats it (the same idempotency key, or the same option
            to the same item); ``False`` for a fresh answer and for any other view.
    """

    session_id: int
    study_slug: str
    status: str
    phase: str
    n_posed: int
    max_questions: int
    allow_skip: bool
    question: QuestionView | None
    stop_reason: str | None
    replayed: bool = False


def shown_max(rt: StudyRuntime, reached: int) -> int:
    """The budget a session shows once it has reached question ``reached``: the study's
    ``max_questions``, or ``reached`` when the researcher lowered the budget below it
    mid-session (the question already posed is still asked, and the session stops after it).

    Example: ``max_questions`` lowered from 12 to 8 while question 10 is shown: ``10``,
    so the page reads "question 10 of 10", not "10 of 8".
    """
    return max(rt.max_questions, reached)


def question_view(item: ItemInfo, number: int) -> QuestionView:
    """``item`` shown as the ``number``-th question."""
    return QuestionView(
        item_id=item.id or 0,
        key=item.key,
        text=item.question,
        options=[(str(o[0]), str(o[1])) for o in item.options],
        number=number,
        topic=item.topic,
    )


def closed_reason(sess: ElicitationSession) -> str | None:
    """The stop reason of a session closed with a question pending: ``"abandoned"`` (a
    group round closed before its member answered) or ``"finished"`` (completed by its
    client, :func:`app.session.finish_session`); None for an active session. (A session
    completed by the stopping rule has no question pending: its last decision is the stop.)"""
    if sess.status == SessionStatus.abandoned.value:
        return "abandoned"
    if sess.status == SessionStatus.completed.value:
        return "finished"
    return None


def view_at(
    rt: StudyRuntime,
    sess: ElicitationSession,
    decision: SelectionDecision | DecisionRow | None,
    position: int,
) -> SessionView:
    """The view after ``position`` questions were posed, given the decision at ``position``.

    A session closed with a question pending is ``done`` now and takes no more answers:
    ``abandoned`` (a group round closed before its member answered; stop reason
    ``abandoned``) or ``completed`` by its client (:func:`app.session.finish_session`;
    stop reason ``finished``). Only the current view (``position`` = the session's answers,
    ``state_version``) says so: the view after an earlier answer, replayed for an
    idempotent retry, is the one that answer got."""
    closed = None
    if position == sess.state_version:
        pending = decision is None or decision.item_id is not None
        if pending or sess.status == SessionStatus.abandoned.value:
            closed = closed_reason(sess)
    if closed is not None:
        return replace(plain_view(rt, sess.id or 0, None, closed, position), status=sess.status)
    if decision is None:
        phase = "attributes"
        question = None
    elif decision.item_id is None:
        phase = "done"
        question = None
    else:
        phase = "question"
        question = question_view(rt.by_id[decision.item_id], position + 1)
    status = sess.status if phase != "question" else SessionStatus.active.value
    return SessionView(
        session_id=sess.id or 0,
        study_slug=rt.slug,
        status=status if phase != "done" else SessionStatus.completed.value,
        phase=phase,
        n_posed=position,
        max_questions=shown_max(rt, position + (question is not None)),
        allow_skip=rt.allow_skip,
        question=question,
        stop_reason=decision.stop_reason if decision is not None else None,
    )


def plain_view(
    rt: StudyRuntime, session_id: int, item_id: int | None, stop_reason: str | None, n: int
) -> SessionView:
    """The view after ``n`` questions posed, whose next decision chose ``item_id``."""
    if item_id is None:
        return SessionView(
            session_id=session_id,
            study_slug=rt.slug,
            status=SessionStatus.completed.value,
            phase="done",
            n_posed=n,
            max_questions=shown_max(rt, n),
            allow_skip=rt.allow_skip,
            question=None,
            stop_reason=stop_reason,
        )
    return SessionView(
        session_id=session_id,
        study_slug=rt.slug,
        status=SessionStatus.active.value,
        phase="question",
        n_posed=n,
        max_questions=shown_max(rt, n + 1),
        allow_skip=rt.allow_skip,
        question=question_view(rt.by_id[item_id], n + 1),
        stop_reason=None,
    )


def check_study(sess: ElicitationSession, study_id: int, slug: str) -> None:
    """Raise :class:`SessionNotFoundError` when ``sess`` is not a session of the study."""
    if sess.study_id != study_id:
        raise SessionNotFoundError(f"no session {sess.id} in study {slug!r}")


def decision_at(db: Session, session_id: int, position: int) -> SelectionDecision | None:
    """The stored decision of the session at ``position``, if any."""
    return db.exec(
        select(SelectionDecision).where(
            SelectionDecision.session_id == session_id, SelectionDecision.position == position
        )
    ).first()


def current_view(rt: StudyRuntime, db: Session, sess: ElicitationSession) -> SessionView:
    """The view after the stored answers (their count is the pending position)."""
    n = int(
        db.exec(select(func.count()).select_from(Answer).where(Answer.session_id == sess.id)).one()
    )
    return view_at(rt, sess, decision_at(db, sess.id or 0, n), n)


def result_of(
    rt: StudyRuntime, db: Session, sess: ElicitationSession, answer: Answer
) -> SessionView:
    """The view that followed ``answer`` (what the request that stored it returned)."""
    earlier = int(
        db.exec(
            select(func.count())
            .select_from(Answer)
            .where(Answer.session_id == sess.id, Answer.id <= answer.id)  # type: ignore[operator]
        ).one()
    )
    return view_at(rt, sess, decision_at(db, sess.id or 0, earlier), earlier)


def get_session_by_token(token: str, *, session: Session) -> ElicitationSession:
    """The session whose token is ``token``; :class:`SessionNotFoundError` otherwise."""
    if not token or len(token) > 200:
        raise SessionNotFoundError("unknown session token")
    sess = session.exec(
        select(ElicitationSession).where(ElicitationSession.token_hash == hash_token(token))
    ).first()
    if sess is None:
        raise SessionNotFoundError("unknown session token")
    return sess


def session_view(study: Study, sess: ElicitationSession, *, session: Session) -> SessionView:
    """Where the session stands now (with the model the session started with)."""
    rt = load_runtime(study, session=session, fit_if_missing=False)
    rt = session_runtime(rt, study, sess.model_id, session=session)
    return current_view(rt, session, sess)


@dataclass(frozen=True)
class AnswerRecord:
    """A stored answer: item key, option letter (``None``: skipped), ISO time."""

    item: str
    option: str | None
    answered_at: str


def session_answers(sess: ElicitationSession, *, session: Session) -> list[AnswerRecord]:
    """The stored answers of a session, in order (item keys and letters)."""
    rows = session.exec(
        select(Answer, Item.key)
        .join(Item, Item.id == Answer.item_id)  # type: ignore[arg-type]
        .where(Answer.session_id == sess.id)
        .order_by(Answer.id)  # type: ignore[arg-type]
    ).all()
    return [AnswerRecord(key, a.option, iso_utc(a.created_at) or "") for a, key in rows]


@dataclass(frozen=True)
class Prediction:
    """The predictive distribution of one item: ``{option letter: probability}``."""

    item: str
    role: str
    question: str
    distribution: dict[str, float]


@dataclass(frozen=True)
class Predictions:
    """Predictive distributions of every unasked item and every target, and top personas."""

    items: list[Prediction]
    targets: list[Prediction]
    personas: list[dict[str, Any]]
    n_answers: int


def predictions(study: Study, sess: ElicitationSession, *, session: Session) -> Predictions:
    """Predictions from the replayed state (never trusting the cache for a read).

    Raises:
        SessionNotFoundError: the session was erased after the caller read it (404).
    """
    rt = load_runtime(study, session=session, fit_if_missing=False)
    rt = session_runtime(rt, study, sess.model_id, session=session)
    respondent, answers = respondent_and_answers(session, sess)
    state = replay(rt, respondent, answers)
    answered = {a.item_id for a in answers}
    unasked = [it for it in rt.candidates if it.id not in answered]
    wanted = unasked + rt.targets
    probs = rt.model.predict(state, [rt.model_index[it.id] for it in wanted]) if wanted else None  # type: ignore[index]

    def pred(j: int, it: ItemInfo) -> Prediction:
        row = probs[j].tolist() if probs is not None else []
        return Prediction(
            item=it.key,
            role=it.role,
            question=it.question,
            distribution={str(o[0]): float(row[k]) for k, o in enumerate(it.options)},
        )

    out = [pred(j, it) for j, it in enumerate(wanted)]
    personas: list[dict[str, Any]] = []
    latent = getattr(rt.model, "latent_posterior", None)
    if callable(latent):
        w = latent(state)
        top = torch.topk(w, min(TOP_PERSONAS, int(w.numel())))
        labels = getattr(rt.model, "labels", None)
        for weight, idx in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            personas.append(
                {
                    "persona": int(idx),
                    "label": labels[idx] if labels else f"class {idx + 1}",
                    "weight": float(weight),
                }
            )
    return Predictions(
        items=out[: len(unasked)],
        targets=out[len(unasked) :],
        personas=personas,
        n_answers=len(answers),
    )


def explanation(study: Study, sess: ElicitationSession, *, session: Session) -> dict[str, Any]:
    """The last selection decision: the chosen item (or stop reason) and every score.

    Raises:
        NotCurrentQuestionError: no decision yet (409); SessionNotFoundError: the session
            was erased after the caller read it (404).
    """
    row = session.exec(
        select(SelectionDecision)
        .where(SelectionDecision.session_id == sess.id)
        .order_by(SelectionDecision.position.desc())  # type: ignore[attr-defined]
    ).first()
    if row is None:
        gone = (
            session.exec(
                select(ElicitationSession.id).where(ElicitationSession.id == sess.id)
            ).first()
            is None
        )
        if gone:  # erased after the caller's authorization read it
            raise SessionNotFoundError(f"no session {sess.id}")
        raise NotCurrentQuestionError("no question has been chosen in this session yet")
    item_key, stop_reason = None, row.stop_reason
    closed = closed_reason(sess)
    if closed is not None and row.item_id is not None and row.position == sess.state_version:
        stop_reason = closed  # its question was never answered: the session view's stop
    elif row.item_id is not None:
        item = session.get(Item, row.item_id)
        item_key = item.key if item is not None else None
    detail = dict(row.scores or {})
    scores = detail.pop("scores", {})
    return {
        "position": row.position,
        "item": item_key,
        "stop_reason": stop_reason,
        "criterion": row.criterion,
        "scores": dict(sorted(scores.items(), key=lambda kv: -kv[1])),
        **{k: v for k, v in detail.items() if k != "model_id"},
    }


@dataclass(frozen=True)
class StoredSummary:
    """What is stored about a session's respondent (shown before deleting it).

    Attributes:
        n_answered: questions answered; n_skipped: questions skipped ("prefer not to
        answer"); n_attributes: answers to the questions about the respondent;
        completed: whether the session was finished.
    """

    n_answered: int
    n_skipped: int
    n_attributes: int
    completed: bool


def stored_summary(sess: ElicitationSession, *, session: Session) -> StoredSummary:
    """Counts of what the session's respondent has stored (answers, skips, attributes)."""
    options = session.exec(select(Answer.option).where(Answer.session_id == sess.id)).all()
    respondent = session.get(Respondent, sess.respondent_id)
    n_attr = len(respondent.attributes or {}) if respondent is not None else 0
    return StoredSummary(
        n_answered=sum(1 for o in options if o is not None),
        n_skipped=sum(1 for o in options if o is None),
        n_attributes=n_attr,
        completed=sess.status == SessionStatus.completed.value,
    )


ATTRIBUTES_PER_PAGE = 3
"""Questions about the respondent shown on one page of the browser flow."""


def attribute_question(item: ItemInfo, language: str = DEFAULT_LANGUAGE) -> str:
    """The wording of an attribute item as a question to the respondent, in the study's
    ``language`` (:mod:`app.respondent_text`, message ``about.question``).

    The codebook's question text when it is one (it ends with ``?`` or ``:``, or has at
    least four words); otherwise a question built from the bare label (the text, else the
    topic, else the key, with ``_`` read as a space), whose first letter is lowered unless
    it starts an abbreviation or the language capitalises nouns (German).

    Example: ``"What is your gender?"`` stays; ``"age"`` becomes ``"What is your age?"``;
    in German ``"Alter"`` becomes ``"Bitte geben Sie an: Alter"``.
    """
    text = " ".join(item.question.split())
    if text.endswith(("?", ":")) or len(text.split()) >= 4:
        return text
    label = (text or item.topic or item.key).replace("_", " ").strip()
    if not label[:2].isupper() and language not in NOUNS_CAPITALISED:
        label = label[:1].lower() + label[1:]
    return respondent_text.text(language, "about.question", label=label)


def attribute_pages(rt: StudyRuntime) -> list[list[ItemInfo]]:
    """The study's attribute items in pages of :data:`ATTRIBUTES_PER_PAGE` (study order)."""
    items = rt.attributes
    return [items[i : i + ATTRIBUTES_PER_PAGE] for i in range(0, len(items), ATTRIBUTES_PER_PAGE)]


def respondent_attributes(sess: ElicitationSession, *, session: Session) -> dict[str, str]:
    """The attribute answers stored so far for the session's respondent."""
    respondent = session.get(Respondent, sess.respondent_id)
    return dict(respondent.attributes or {}) if respondent is not None else {}
