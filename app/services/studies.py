"""Reading studies: summaries for listings (all, or those a researcher may see), lookups by
slug, a study's persona dictionary."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func
from sqlmodel import Session, col, select

from app.auth import visible_study_ids
from app.errors import NotFoundError
from app.tables import ElicitationSession, Item, Researcher, Respondent, Study, StudyPersona


@dataclass(frozen=True)
class StudySummary:
    """One row of a study listing."""

    id: int
    slug: str
    name: str
    status: str
    n_items: int
    n_respondents: int


def list_study_summaries(*, session: Session) -> list[StudySummary]:
    """All studies with their item and respondent counts (a researcher's preview is not a
    respondent), newest first (two grouped counts)."""
    item_study = col(Item.study_id)
    respondent_study = col(Respondent.study_id)
    items: dict[int, int] = dict(
        session.exec(select(item_study, func.count()).group_by(item_study)).all()
    )
    previewers = select(ElicitationSession.respondent_id).where(
        col(ElicitationSession.is_preview).is_(True)
    )
    people: dict[int, int] = dict(
        session.exec(
            select(respondent_study, func.count())
            .where(col(Respondent.id).not_in(previewers))
            .group_by(respondent_study)
        ).all()
    )
    newest_first = (col(Study.created_at).desc(), col(Study.id).desc())
    studies = session.exec(select(Study).order_by(*newest_first)).all()
    return [
        StudySummary(
            id=s.id or 0,
            slug=s.slug,
            name=s.name,
            status=s.status,
            n_items=int(items.get(s.id or 0, 0)),
            n_respondents=int(people.get(s.id or 0, 0)),
        )
        for s in studies
    ]


def visible_study_summaries(researcher: Researcher, *, session: Session) -> list[StudySummary]:
    """The rows of :func:`list_study_summaries` that ``researcher`` may see (all for an
    admin; otherwise owned or shared)."""
    visible = visible_study_ids(researcher, session=session)
    return [s for s in list_study_summaries(session=session) if visible is None or s.id in visible]


def study_personas(study: Study, *, session: Session, limit: int) -> tuple[list[StudyPersona], int]:
    """The first ``limit`` entries of the study's persona dictionary (in creation order)
    and how many entries it has in all."""
    rows = session.exec(
        select(StudyPersona)
        .where(StudyPersona.study_id == study.id)
        .order_by(col(StudyPersona.id))
        .limit(limit)
    ).all()
    total = session.exec(
        select(func.count()).select_from(StudyPersona).where(StudyPersona.study_id == study.id)
    ).one()
    return list(rows), int(total)


def count_studies(*, session: Session) -> int:
    return int(session.exec(select(func.count()).select_from(Study)).one())


def get_study_by_slug(slug: str, *, session: Session) -> Study:
    """The study with ``slug``; :class:`NotFoundError` if there is none."""
    study = session.exec(select(Study).where(Study.slug == slug)).first()
    if study is None:
        raise NotFoundError(f"no study with slug {slug!r}")
    return study
