"""The rounds page's Plan button when no plan can be made, and a large round's page (its
first 100 members, the counts and the CSVs of all), through the web app (SQLite, and
PostgreSQL when configured)."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app import session as svc
from app.services import designer, group_rounds
from app.tables import Answer, Item, Job, JobStatus, Researcher, Respondent, Study
from tests.support.admin import login
from tests.support.group_round import group_study, open_from_form, plan_from_form


def test_planning_needs_targets_and_a_fitted_model(
    client: TestClient, engine: Engine, db: Session, ces_study: Study, alice: Researcher
) -> None:
    """Without a fitted belief model, or without a target item, the rounds page disables
    its Plan button with the reason; a plan started anyway (from the Jobs tab) fails
    saying how to fit the model."""
    login(client, "alice@example.org")
    page = client.get(f"/admin/studies/{ces_study.slug}/groups").text
    assert 'disabled aria-describedby="plan-unavailable"' in page
    why = page.split('id="plan-unavailable"')[1].split("</p>")[0]
    assert "Fit the belief model" in why and "Jobs tab" in why
    plan = plan_from_form(client, engine, ces_study)
    assert plan.status == JobStatus.failed.value
    assert 'fit the belief model first: run "Fit the belief model" on the Jobs tab' in (
        plan.error or ""
    )

    study = group_study(db, ces_study, rounds=1, respondents_per_round=2)
    page = client.get(f"/admin/studies/{study.slug}/groups").text
    assert 'id="plan-unavailable"' not in page and 'id="plan-round"' in page
    designer.set_roles(
        study,
        {it.key: "question" for it in db.exec(select(Item).where(Item.study_id == study.id))},
        session=db,
    )
    page = client.get(f"/admin/studies/{study.slug}/groups").text
    why = page.split('id="plan-unavailable"')[1].split("</p>")[0]
    assert "Choose at least one target item" in why


def test_a_large_round_page_draws_its_first_100_members(
    client: TestClient, engine: Engine, db: Session, ces_study: Study, alice: Researcher
) -> None:
    """A round of 130 members: the page (and each refresh) draws 100 rows, the members
    who answered first (the newest first), says so and points to the CSVs; the counts
    and the CSVs cover all 130."""
    study = group_study(db, ces_study, rounds=1, respondents_per_round=130)
    login(client, "alice@example.org")
    ids = list(
        db.exec(
            select(Respondent.id)
            .where(Respondent.study_id == study.id)
            .order_by(col(Respondent.id))
            .limit(130)
        ).all()
    )
    question = svc.load_runtime(study, session=db, fit_if_missing=False).candidates[0].key
    plan = Job(
        kind="plan_group_round",
        study_id=study.id,
        status="succeeded",
        result={
            "question": question,
            "question_scores": [{"item": question, "score": 1.0}],
            "n_members": len(ids),
            "per_round": len(ids),
            "rounds_done": 0,
            "panel": "imported",
            "respondents": [
                {"respondent_id": i, "respondent": f"r{i}", "expected_gain": 0.01} for i in ids
            ],
        },
    )
    db.add(plan)
    db.commit()
    assert open_from_form(client, study, plan.id or 0).status_code == 303
    with Session(engine, expire_on_commit=False) as s:
        rnd = group_rounds.get_round(study, 1, session=s)
        members = group_rounds.round_members([rnd.id or 0], s)
        for k, m in enumerate((members[5], members[50], members[120])):  # r120 is the newest
            s.add(
                Answer(
                    session_id=m.session_id,
                    item_id=rnd.item_id or 0,
                    option="A",
                    created_at=datetime(2026, 1, 1, 10, k, tzinfo=UTC),
                )
            )
        s.commit()
    part = client.get(f"/admin/studies/{study.slug}/groups/1", headers={"HX-Request": "true"})
    rows = re.findall(r'<tr data-status="(\w+)">', part.text)
    assert len(rows) == 100 and rows[:3] == ["answered"] * 3 and "answered" not in rows[3:]
    shown = re.findall(r'aria-label="link of ([^"]+)"', part.text)
    newest_first = [db.get(Respondent, members[i].respondent_id) for i in (120, 50, 5)]
    assert len(shown) == 100
    assert shown[:3] == [group_rounds.member_label(r) for r in newest_first if r is not None]
    assert "Showing 100 of 130 members" in part.text and "links.csv" in part.text
    assert re.search(r'id="n-asked">130<', part.text)
    assert re.search(r'id="n-answered">3<', part.text)
    assert re.search(r'id="n-waiting">127<', part.text)
    table = client.get(f"/admin/studies/{study.slug}/groups/1/answers.csv").text
    assert len(list(csv.DictReader(io.StringIO(table.lstrip("\ufeff"))))) == 130
