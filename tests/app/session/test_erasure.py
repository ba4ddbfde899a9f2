"""Erasing a live respondent (app/session/erasure.py) on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from app.session.erasure import erase_respondent_id
from app.session.errors import SessionNotFoundError
from app.tables import Answer, ElicitationSession, ErasureRecord, Item, Respondent, Study


def _live_respondent(db: Session, study: Study) -> int:
    """A live respondent with one completed session holding two answers."""
    respondent = Respondent(study_id=study.id or 0, source="live")
    db.add(respondent)
    db.commit()
    sess = ElicitationSession(
        study_id=study.id or 0,
        respondent_id=respondent.id or 0,
        token_hash=f"erasure-test-{respondent.id}",
        status="completed",
    )
    db.add(sess)
    db.commit()
    items = db.exec(select(Item).where(Item.study_id == study.id).limit(2)).all()
    db.add_all(Answer(session_id=sess.id or 0, item_id=it.id or 0, option="A") for it in items)
    db.commit()
    return respondent.id or 0


def test_two_erasures_at_once_record_one(engine: Engine, db: Session, ces_study: Study) -> None:
    """The second erasure runs whole between the first's reads and its deletes (the race
    two API calls can make): the first then finds nothing to delete and is refused, so
    one erasure is recorded, with the respondent's real counts."""
    rid = _live_respondent(db, ces_study)
    study_id = ces_study.id or 0
    second: list[object] = []
    raced = False

    def before_execute(conn, clause, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal raced
        if not raced and str(clause).startswith("DELETE FROM selection_decision"):
            raced = True
            second.append(erase_respondent_id(rid, study_id=study_id, engine=engine))

    event.listen(engine, "before_execute", before_execute)
    try:
        with pytest.raises(SessionNotFoundError, match=f"no live respondent {rid}"):
            erase_respondent_id(rid, study_id=study_id, engine=engine)
    finally:
        event.remove(engine, "before_execute", before_execute)
    (won,) = second
    assert (won.n_sessions, won.n_answers) == (1, 2)  # type: ignore[attr-defined]
    records = db.exec(select(ErasureRecord).where(ErasureRecord.study_id == study_id)).all()
    assert [(r.n_sessions, r.n_completed, r.n_answers) for r in records] == [(1, 1, 2)]
    assert (
        db.exec(select(func.count()).select_from(Respondent).where(Respondent.id == rid)).one() == 0
    )
