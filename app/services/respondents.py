"""A study's live respondents as the researcher sees them, and erasing one.

:func:`live_respondents` lists each live respondent with its sessions' state, its answer
count and ``earlier_starts`` (respondents the same browser started in the study before:
more than 0 flags a repeated start). :func:`erase_live_respondent` deletes one through
the live loop's erasure (:func:`app.session.erase_respondent_id`), which keeps only the
:class:`app.tables.ErasureRecord` counts. :func:`respondent_profile` is one respondent's
page: status, what they answered, and the predicted answer to every other item.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app import session as live
from app.errors import NotFoundError
from app.schemas import StudySettings
from app.services import export
from app.services.belief import NoModelError
from app.tables import (
    Answer,
    ElicitationSession,
    Item,
    ItemRole,
    Respondent,
    RespondentSource,
    SessionStatus,
    Study,
    as_utc,
    respondent_label,
    utcnow,
)

MAX_ID = 2**31 - 1
"""The largest row id (an INTEGER primary key)."""

LIST_LIMIT = 500
"""The most respondents one listing shows (the newest first)."""


@dataclass(frozen=True)
class LiveRespondentRow:
    """One live respondent in the researcher's list.

    Attributes:
        status: ``completed`` when a session of it finished, else its newest session's,
            an unfinished one in the dashboard's words: ``in progress``, or ``dropped``
            when idle for longer than the study's ``drop_after_minutes``.
        earlier_starts: respondents the same browser had started before this one.
        preview: every session of it is a researcher's preview (no profile, no export).
        n_answers: its stored answers in all its sessions, skips included; ``n_skipped``
            of them skipped ("prefer not to answer").
    """

    id: int
    external_id: str | None
    created_at: datetime
    status: str
    n_answers: int
    earlier_starts: int
    panel_params: dict[str, object] | None
    preview: bool = False
    n_skipped: int = 0

    @property
    def panel(self) -> str:
        """The link parameters as one line (:func:`app.services.export.panel_text`)."""
        return export.panel_text(self.panel_params)

    @property
    def label(self) -> str:
        """The id the exports give it (:func:`app.tables.respondent_label`)."""
        return respondent_label(self.external_id, self.id)


def _status_word(sess: ElicitationSession, cutoff: datetime) -> str:
    """A session's status as the dashboard counts it: an ``active`` session is ``in
    progress``, or ``dropped`` when its last activity is before ``cutoff``."""
    if sess.status != SessionStatus.active.value:
        return sess.status
    return "in progress" if as_utc(sess.updated_at) >= cutoff else "dropped"


def drop_cutoff(study: Study, now: datetime | None = None) -> datetime:
    """Unfinished sessions idle since before this are dropped (the study's
    ``drop_after_minutes`` before ``now``, default the current time)."""
    drop_after = StudySettings.model_validate(study.settings or {}).drop_after_minutes
    return (now or utcnow()) - timedelta(minutes=drop_after)


def live_respondents(
    study: Study, *, session: Session, now: datetime | None = None
) -> list[LiveRespondentRow]:
    """The study's live respondents, newest first (at most :data:`LIST_LIMIT`); ``now``
    (default: the current time) decides which unfinished ones are dropped."""
    cutoff = drop_cutoff(study, now)
    respondents = session.exec(
        select(Respondent)
        .where(Respondent.study_id == study.id, Respondent.source == RespondentSource.live.value)
        .order_by(Respondent.id.desc())  # type: ignore[union-attr]
        .limit(LIST_LIMIT)
    ).all()
    ids = [r.id for r in respondents]
    sessions = session.exec(
        select(ElicitationSession).where(ElicitationSession.respondent_id.in_(ids))  # type: ignore[attr-defined]
    ).all()
    counts: dict[int, tuple[int, int]] = {
        rid: (int(n), int(n) - int(chosen))
        for rid, n, chosen in session.exec(
            select(  # type: ignore[call-overload]
                ElicitationSession.respondent_id,
                func.count(Answer.id),  # type: ignore[arg-type]
                func.count(Answer.option),  # a skip has no option
            )
            .join(Answer, Answer.session_id == ElicitationSession.id)  # type: ignore[arg-type]
            .where(ElicitationSession.respondent_id.in_(ids))  # type: ignore[attr-defined]
            .group_by(ElicitationSession.respondent_id)  # type: ignore[arg-type]
        ).all()
    }
    previews = {s.respondent_id: True for s in sessions if s.is_preview}
    real = {s.respondent_id: True for s in sessions if not s.is_preview}
    status: dict[int, str] = {}
    for s in sorted(sessions, key=lambda s: s.id or 0):
        if status.get(s.respondent_id) != SessionStatus.completed.value:
            status[s.respondent_id] = _status_word(s, cutoff)
    return [
        LiveRespondentRow(
            id=r.id or 0,
            external_id=r.external_id,
            created_at=r.created_at,
            status=status.get(r.id or 0, "no session"),
            n_answers=counts.get(r.id or 0, (0, 0))[0],
            n_skipped=counts.get(r.id or 0, (0, 0))[1],
            earlier_starts=r.earlier_starts,
            panel_params=r.panel_params,
            preview=bool(previews.get(r.id or 0)) and not real.get(r.id or 0),
        )
        for r in respondents
    ]


def session_of_external_id(study_id: int, external_id: str, *, engine: Engine) -> int | None:
    """The newest session id of the study's respondent with ``external_id``, or None (no
    such respondent, or it has no session)."""
    with Session(engine) as db:
        return db.exec(
            select(ElicitationSession.id)
            .join(Respondent, col(Respondent.id) == col(ElicitationSession.respondent_id))
            .where(Respondent.study_id == study_id, Respondent.external_id == external_id)
            .order_by(col(ElicitationSession.id).desc())
        ).first()


def erase_live_respondent(
    study: Study, respondent_id: int, *, engine: Engine
) -> live.ErasureResult:
    """Erase live respondent ``respondent_id`` of ``study`` (sessions, answers, decisions,
    states), leaving the erasure record.

    Raises:
        NotFoundError: no live respondent with that id in the study (404).
    """
    if not 0 < respondent_id <= MAX_ID:  # beyond any row id (PostgreSQL: out of range)
        raise NotFoundError(f"no live respondent {respondent_id} in study {study.slug!r}")
    try:
        return live.erase_respondent_id(respondent_id, study_id=study.id or 0, engine=engine)
    except live.SessionNotFoundError as exc:
        raise NotFoundError(f"no live respondent {respondent_id} in study {study.slug!r}") from exc


@dataclass(frozen=True)
class GivenAnswer:
    """One thing a respondent told us, as the profile page shows it.

    Attributes:
        kind: ``attribute`` (about them), ``answer`` (a live answer) or ``imported``.
        option, label: the option letter and label; ``None`` when skipped or declined.
        answered_at: when it was stored (``None`` for attributes and imported answers).
    """

    key: str
    role: str
    question: str
    kind: str
    option: str | None
    label: str | None
    answered_at: datetime | None = None


@dataclass(frozen=True)
class RespondentProfile:
    """One respondent of a study: who, status, what they answered, what we predict.

    Attributes:
        row: their wide-export row (:class:`app.services.export.ExportRow`: label,
            first session, status, earlier starts, cells).
        given: attributes first (study order), then live answers in the order given, then
            an imported respondent's stored answers (study order).
        predicted: every item the model knows without an answer (never asked, skipped or
            declined), study order (:class:`app.services.predictions.ItemPrediction`).
        model_id, model_from_session: the model of the predictions (``None`` without one)
            and whether it is their session in progress's (else the study's active model).
        no_model: why there are no predictions (the study has no fitted model), or ``None``.
        status: the first session's status in the dashboard's words (``in progress`` or
            ``dropped`` for an unfinished one; :class:`LiveRespondentRow`).
    """

    respondent_pk: int
    source: str
    external_id: str | None
    row: export.ExportRow
    given: list[GivenAnswer]
    predicted: list[Any]
    model_id: int | None
    model_from_session: bool
    no_model: str | None
    status: str = ""


def respondent_profile(study: Study, respondent_id: int, *, session: Session) -> RespondentProfile:
    """The profile of respondent ``respondent_id`` of ``study`` (preview sessions left out),
    with predictions from :func:`app.services.export.predicted_rows` (the exports' code
    path).

    Raises:
        NotFoundError: no respondent with that id in the study (404), or one whose only
            sessions are previews.
    """
    missing = NotFoundError(f"no respondent {respondent_id} in study {study.slug!r}")
    if not 0 < respondent_id <= MAX_ID:
        raise missing
    resp = session.exec(
        select(Respondent).where(Respondent.id == respondent_id, Respondent.study_id == study.id)
    ).first()
    if resp is None:
        raise missing
    predicted: list[Any] = []
    model_id: int | None = None
    from_session = False
    no_model = None
    try:
        found = next(
            export.predicted_rows(study, session=session, include_imported=True, only=resp.id),
            None,
        )
    except NoModelError as exc:
        found, no_model = None, str(exc)
    if found is not None:
        row, result = found
        predicted = result.unanswered
        model_id, from_session = result.model_id, result.model_from_session
    else:
        row_or_none = next(
            export.iter_rows(study, session=session, include_imported=True, only=resp.id), None
        )
        if row_or_none is None:
            raise missing
        row = row_or_none
    first = session.get(ElicitationSession, row.session_id) if row.session_id else None
    return RespondentProfile(
        respondent_pk=resp.id or 0,
        source=resp.source,
        external_id=resp.external_id,
        row=row,
        given=_given(study, resp, row, session=session),
        predicted=predicted,
        model_id=model_id,
        model_from_session=from_session,
        no_model=no_model,
        status=_status_word(first, drop_cutoff(study)) if first is not None else row.status,
    )


def _given(
    study: Study, resp: Respondent, row: export.ExportRow, *, session: Session
) -> list[GivenAnswer]:
    items = export.export_items(study, session=session)
    by_id = {it.id: it for it in items}

    def labelled(it: Item, option: str | None, kind: str, at: datetime | None) -> GivenAnswer:
        labels = {str(o[0]): str(o[1]) for o in it.options}
        return GivenAnswer(it.key, it.role, it.question, kind, option, labels.get(option or ""), at)

    out = []
    for it in items:
        value = row.cells.get(it.key)
        if it.role == ItemRole.attribute.value and value is not None:
            out.append(
                labelled(it, None if value == export.SKIP_MARK else value, "attribute", None)
            )
    answers = session.exec(
        select(Answer)
        .join(ElicitationSession, col(ElicitationSession.id) == col(Answer.session_id))
        .where(
            ElicitationSession.respondent_id == resp.id,
            col(ElicitationSession.is_preview).is_(False),
        )
        .order_by(col(Answer.id))
    ).all()
    for a in answers:
        it = by_id.get(a.item_id)
        if it is not None:
            out.append(labelled(it, a.option, "answer", a.created_at))
    if resp.source == RespondentSource.import_.value:
        for it in items:
            value = (resp.answers or {}).get(it.key)
            if value is not None and it.role != ItemRole.attribute.value:
                out.append(labelled(it, value, "imported", None))
    return out
