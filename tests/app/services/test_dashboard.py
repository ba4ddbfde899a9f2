"""The dashboard's figures on a small constructed study, exact, on SQLite and PostgreSQL.

A published CES study (30 imported respondents, a 4-class model) gets nine sessions
written row by row with chosen timestamps, statuses, answers and repeated-start flags,
and a fixed ``now``; every figure is then known by hand: the counts (completed, in
progress, dropped, declined; live, flagged and imported respondents), the drop-off per
question, the median completion time, the answer distributions, and that a preview
session counts nowhere. "Open a respondent" resolves an id or a completion code.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from sqlmodel import Session, col, select

from app import session as svc
from app.errors import InvalidInputError, NotFoundError
from app.services import dashboard as dashboard_service
from app.services.belief import fit_study_model
from app.services.dashboard import (
    build_dashboard,
    clear_population_cache,
    clip_middle,
    dashboard_page,
    duration_text,
    resolve_respondent,
)
from app.settings import Settings
from app.tables import (
    Answer,
    ElicitationSession,
    Item,
    Respondent,
    RespondentSource,
    Study,
)
from models.distinctive import distinctive_answers
from tests.support.admin import login
from tests.support.live_study import LiveStudy, SessionSpec, add_sessions, make_live_study

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SECRET = "t" * 40  # the settings fixture's secret key


# (status, created min ago, last activity min ago, completed min ago, answers, earlier
# starts, preview); answers are (question index, option letter or None for a skip)
SESSIONS: list[SessionSpec] = [
    ("completed", 50, 40, 40, [(0, "A"), (1, "A"), (2, "B")], 0, False),  # 10 min
    ("completed", 100, 80, 80, [(0, "B"), (1, None), (2, "A")], 0, False),  # 20 min
    ("completed", 30, 29, 29, [(1, "B")], 0, False),  # 1 min
    ("active", 70, 61, None, [(0, "A"), (3, "A")], 1, False),  # dropped after 2
    ("active", 65, 59, None, [(0, None)], 2, False),  # in progress (59 < 60 min)
    ("active", 130, 120, None, [], 0, False),  # dropped before the first question
    ("abandoned", 10, 5, None, [(2, "A"), (3, "B")], 0, False),  # dropped after 2
    ("declined", 3, 3, None, [], 0, False),
    ("active", 300, 200, None, [(0, "B"), (1, "B"), (2, "B")], 1, True),  # a preview
]


@pytest.fixture
def live(settings: Settings, small_dataset: Path) -> Iterator[tuple[LiveStudy, list[int]]]:
    """The study with :data:`SESSIONS` written; yields it and the sessions' ids."""
    svc.clear_runtime_cache()
    clear_population_cache()
    study = make_live_study(settings.database_url, small_dataset)
    try:
        yield study, add_sessions(study, SESSIONS, NOW)
    finally:
        study.engine.dispose()


def _study(db: Session, live: LiveStudy) -> Study:
    study = db.get(Study, live.study_id)
    assert study is not None
    return study


def _questions(db: Session, study_id: int) -> list[Item]:
    """The study's question items in study order (SESSIONS' question indices)."""
    return list(
        db.exec(
            select(Item)
            .where(Item.study_id == study_id, Item.role == "question")
            .order_by(col(Item.position), col(Item.id))
        ).all()
    )


def test_counts_drop_off_and_median_by_hand(live: tuple[LiveStudy, list[int]]) -> None:
    study_live, _ = live
    with study_live.session() as db:
        study = _study(db, study_live)
        dash = build_dashboard(study, session=db, now=NOW)
        max_q = dash.budget["max_questions"]
    assert dash.counts == {
        "started": 8,
        "completed": 3,
        "in_progress": 1,
        "dropped": 3,
        "declined": 1,
        "live_respondents": 8,
        "repeated_starts": 2,
        "imported": 30,
        "erased": 0,
    }
    assert dash.drop_after_minutes == 60
    want = {0: 1, 2: 2}
    assert dash.drop_off == [{"position": k, "dropped": want.get(k, 0)} for k in range(max_q + 1)]
    assert dash.median_completion_s == 600.0  # median of 10, 20 and 1 minutes
    # answers of completed sessions: 3 + 3 + 1 over 3 completed
    assert dash.budget["mean_questions_completed"] == round(7 / 3, 2)


def test_drop_after_minutes_moves_sessions_between_in_progress_and_dropped(
    live: tuple[LiveStudy, list[int]],
) -> None:
    study_live, _ = live
    with study_live.session() as db:
        study = _study(db, study_live)
        study.settings = {**study.settings, "drop_after_minutes": 30}
        db.add(study)
        db.commit()
        dash = build_dashboard(study, session=db, now=NOW)
        assert (dash.counts["in_progress"], dash.counts["dropped"]) == (0, 4)
        assert dash.drop_off[1] == {"position": 1, "dropped": 1}  # the 59-minute one
        # a later "now" with the default setting: the in-progress one is dropped too
        study.settings = {k: v for k, v in study.settings.items() if k != "drop_after_minutes"}
        db.add(study)
        db.commit()
        later = build_dashboard(study, session=db, now=NOW + timedelta(minutes=2))
        assert (later.counts["in_progress"], later.counts["dropped"]) == (0, 4)
        earlier = build_dashboard(study, session=db, now=NOW - timedelta(minutes=2))
        assert (earlier.counts["in_progress"], earlier.counts["dropped"]) == (2, 2)


def test_answer_distributions_live_and_imported_apart(live: tuple[LiveStudy, list[int]]) -> None:
    study_live, _ = live
    with study_live.session() as db:
        study = _study(db, study_live)
        dash = build_dashboard(study, session=db, now=NOW)
        questions = _questions(db, study.id or 0)
        imported = db.exec(
            select(Respondent).where(
                Respondent.study_id == study.id, Respondent.source == RespondentSource.import_.value
            )
        ).all()
    by_key = {d.key: d for d in dash.distributions}
    assert list(by_key) == [q.key for q in questions[:4]]  # asked live, in study order
    # live answers by hand (the preview's are left out)
    want_live = {0: ({"A": 2, "B": 1}, 1), 1: ({"A": 1, "B": 1}, 1), 2: ({"B": 1, "A": 2}, 0)}
    want_live[3] = ({"A": 1, "B": 1}, 0)
    for q, (counts, skipped) in want_live.items():
        d = by_key[questions[q].key]
        n = sum(counts.values())
        assert (d.n_live, d.skipped) == (n, skipped)
        assert [o.letter for o in d.options] == [o[0] for o in questions[q].options]
        assert [o.label for o in d.options] == [o[1] for o in questions[q].options]
        assert {o.letter: o.live for o in d.options if o.live} == counts
        for o in d.options:
            assert o.live_share == pytest.approx(counts.get(o.letter, 0) / n)
        # imported: the historical answers, counted here row by row
        hist = Counter(
            r.answers[questions[q].key] for r in imported if questions[q].key in r.answers
        )
        assert d.n_imported == sum(hist.values()) > 0
        assert {o.letter: o.imported for o in d.options if o.imported} == dict(hist)
        assert sum(o.imported_share or 0 for o in d.options) == pytest.approx(1.0)
    # the imported counts are kept per process until the imported respondents change
    first_key = questions[0].key
    gone = next(r for r in imported if first_key in r.answers)
    with study_live.session() as db:
        db.delete(db.get(Respondent, gone.id))
        db.commit()
        study = _study(db, study_live)
        again = {d.key: d for d in build_dashboard(study, session=db, now=NOW).distributions}
    assert again[first_key].n_imported == by_key[first_key].n_imported - 1


def test_personas_are_described_by_their_most_distinctive_answers(
    live: tuple[LiveStudy, list[int]],
) -> None:
    study_live, _ = live
    with study_live.session() as db:
        study = _study(db, study_live)
        page = dashboard_page(study, session=db, now=NOW)
        rt = svc.load_runtime(study, session=db, fit_if_missing=False)
    dash = page["dash"]
    assert page["median_completion"] == "10 min 00 s"
    assert len(dash.personas) == 4 and len(page["target_svgs"]) == len(dash.targets) > 0
    assert sum(p["weight"] for p in dash.personas) == pytest.approx(1.0)
    by_index = {rt.model_index[it.id]: it for it in rt.items if it.id in rt.model_index}
    for p in dash.personas:
        c = int(p["label"].removeprefix("class ")) - 1
        want = distinctive_answers(rt.model.mu, rt.model.log_prior, [c], items=sorted(by_index))[0]
        assert len(p["distinctive"]) == len(want[:3]) > 0
        for text, a in zip(p["distinctive"], want, strict=False):
            it = by_index[a.item]
            assert text.startswith(f"{it.options[a.option][1]} on '")
            assert text.endswith(f"({100 * a.share:.0f} % vs {100 * a.overall:.0f} % overall)")
            assert re.fullmatch(r".+ on '.+' \(\d+ % vs \d+ % overall\)", text)


def test_clipped_questions_keep_their_start_and_end() -> None:
    stem = "Thinking about policing policy, would you support or oppose the following:"
    a = clip_middle(f"{stem} require police officers to wear body cameras?", 70)
    b = clip_middle(f"{stem} increase the number of police on the street by 10 percent?", 70)
    assert a != b and len(a) <= 70 and len(b) <= 70
    assert a.startswith("Thinking about policing") and a.endswith("to wear body cameras?")
    assert " … " in a and clip_middle("Short question?", 70) == "Short question?"


def _population(dash: Any) -> list[tuple[str, int, list[float]]]:
    return [(t.key, t.n, t.mean) for t in dash.targets]


def test_an_unchanged_study_is_replayed_once_and_a_change_replays_it(
    live: tuple[LiveStudy, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two refreshes without a change replay the sessions once; a new answer, a new session,
    a changed attribute and a new active model each make the next refresh replay them and
    show what a replay without the cache shows."""
    study_live, ids = live
    replays: list[int] = []
    real = dashboard_service.replay_population

    def counted(*args: Any, **kwargs: Any) -> Any:
        replays.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dashboard_service, "replay_population", counted)

    def refresh(db: Session) -> Any:
        return build_dashboard(_study(db, study_live), session=db, now=NOW)

    def uncached(db: Session) -> Any:
        clear_population_cache()
        return refresh(db)

    with study_live.session() as db:
        first = refresh(db)
        second = refresh(db)
        assert len(replays) == 1
        assert _population(second) == _population(first) and first.targets[0].n == 8
        assert second.personas == first.personas

        # a new answer in the session in progress (index 4): replayed, and different
        question = _questions(db, study_live.study_id)[5]
        db.add(Answer(session_id=ids[4], item_id=question.id or 0, option="A", created_at=NOW))
        db.commit()
        answered = refresh(db)
        assert len(replays) == 2
        assert _population(answered) != _population(first)
        assert _population(answered) == _population(uncached(db))
        assert len(replays) == 3
        refresh(db)
        assert len(replays) == 3  # unchanged again

    # a new session: one more respondent in every target's mean
    add_sessions(study_live, [("active", 1, 1, None, [(0, "B")], 0, False)], NOW)
    with study_live.session() as db:
        grown = refresh(db)
        assert len(replays) == 4 and grown.targets[0].n == 9
        # an attribute stored on an attribute page (no answer, no session change)
        attribute = db.exec(
            select(Item).where(Item.study_id == study_live.study_id, Item.role == "attribute")
        ).first()
        assert attribute is not None  # the CES demographics
        sess = db.get(ElicitationSession, ids[5])  # started, no answer
        assert sess is not None
        resp = db.get(Respondent, sess.respondent_id)
        assert resp is not None
        resp.attributes = {attribute.key: attribute.options[0][0]}
        db.add(resp)
        db.commit()
        described = refresh(db)
        assert len(replays) == 5 and _population(described) != _population(grown)
        n = len(replays)

        # a new active model (3 classes, promoted): replayed with it
        fit_study_model(_study(db, study_live), session=db, n_classes=(3,), n_restarts=1,
                        force=True)  # fmt: skip
        svc.clear_runtime_cache()  # the runtime itself follows a new model within 5 s
        refit = refresh(db)
        assert len(replays) == n + 1 and len(refit.personas) == 3
        assert _population(refit) == _population(uncached(db))


def test_an_option_added_to_an_answered_item_keeps_the_dashboard_working(
    live: tuple[LiveStudy, list[int]],
) -> None:
    """The active model does not know an item whose options changed (until a refit):
    its answers are left out of the replay and the dashboard is built."""
    from app.services.designer import update_item

    study_live, ids = live
    with study_live.session() as db:
        study = _study(db, study_live)
        before = build_dashboard(study, session=db, now=NOW)
        first = _questions(db, study_live.study_id)[0]  # answered by SESSIONS (index 0)
        text = "\n".join(f"{o[0]}: {o[1]}" for o in first.options) + "\nZZ: a new option"
        update_item(study, first, session=db, question=first.question, options_text=text,
                    role=first.role, topic=first.topic or "",
                    is_preference_criterion=first.is_preference_criterion)  # fmt: skip
        svc.clear_runtime_cache()
        clear_population_cache()
        after = build_dashboard(study, session=db, now=NOW)
        assert after.counts == before.counts and after.targets[0].n == before.targets[0].n
        rt = svc.load_runtime(study, session=db)
        assert first.id not in rt.model_index
        answers = db.exec(select(Answer).where(Answer.session_id == ids[0])).all()
        assert first.id in {a.item_id for a in answers}
        assert len(svc.answer_pairs(rt, answers)) == len(answers) - 1


def test_resolve_respondent_by_id_or_completion_code(live: tuple[LiveStudy, list[int]]) -> None:
    study_live, ids = live
    with study_live.session() as db:
        study = _study(db, study_live)
        first = db.get(ElicitationSession, ids[0])
        assert first is not None
        rid = first.respondent_id
        assert resolve_respondent(study, f" {rid} ", SECRET, session=db) == rid
        assert resolve_respondent(study, f"r{rid}", SECRET, session=db) == rid  # as listed
        person = db.get(Respondent, rid)
        assert person is not None
        person.external_id = "panel-77"
        db.add(person)
        db.commit()
        assert resolve_respondent(study, "panel-77", SECRET, session=db) == rid
        code = svc.completion_code(study, ids[0], SECRET)
        assert resolve_respondent(study, code.lower(), SECRET, session=db) == rid
        with pytest.raises(NotFoundError, match="no respondent with id 999999"):
            resolve_respondent(study, "999999", SECRET, session=db)
        with pytest.raises(NotFoundError, match="no respondent with id 99999999999999999999"):
            resolve_respondent(study, "99999999999999999999", SECRET, session=db)
        with pytest.raises(NotFoundError, match="completion code 'NOPE'"):
            resolve_respondent(study, "NOPE", SECRET, session=db)
        with pytest.raises(InvalidInputError, match="enter a respondent id"):
            resolve_respondent(study, "  ", SECRET, session=db)
        study.completion_code = "SAME4ALL"
        with pytest.raises(NotFoundError, match="same completion code"):
            resolve_respondent(study, "SAME4ALL", SECRET, session=db)


def test_dashboard_page_and_open_respondent_route(
    settings: Settings, live: tuple[LiveStudy, list[int]]
) -> None:
    from app.auth import create_account
    from app.main import create_app

    study_live, ids = live
    with study_live.session() as db:
        create_account("boss@example.org", "boss password 123", session=db, is_admin=True)
        sess = db.get(ElicitationSession, ids[1])
        assert sess is not None
        rid = sess.respondent_id
        study = _study(db, study_live)
        code = svc.completion_code(study, ids[1], SECRET)
    slug = study_live.slug
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        login(client, "boss@example.org", "boss password 123")
        page = client.get(f"/admin/studies/{slug}/dashboard")
        assert page.status_code == 200
        text = page.text
        for marker in ('id="drop-off"', 'id="personas"', 'id="answers"', 'id="open-respondent"'):
            assert marker in text
        assert re.search(r'id="stat-imported"><span class="n">30</span>', text)
        assert "Most distinctive answers" in text and "class " in text
        url = f"/admin/studies/{slug}/dashboard/respondent"
        for q in (str(rid), code):
            r = client.get(url, params={"respondent": q}, follow_redirects=False)
            assert r.status_code == 303, q
            assert r.headers["location"] == f"/admin/studies/{slug}/respondents/{rid}"
        r = client.get(url, params={"respondent": "ZZZZ"})
        assert r.status_code == 404 and "completion code" in r.text and "ZZZZ" in r.text
        r = client.get(url, params={"respondent": "\u202e"})  # non-ASCII: not a 500
        assert r.status_code == 404 and "completion code" in r.text
        r = client.get(url, params={"respondent": ""})
        assert r.status_code == 422 and "enter a respondent id" in r.text


def test_duration_text() -> None:
    assert [duration_text(x) for x in (None, 44.6, 60, 252, 7500)] == [
        "—",
        "45 s",
        "1 min 00 s",
        "4 min 12 s",
        "2 h 05 min",
    ]


def test_persona_rows_merge_classes_with_the_same_answers() -> None:
    """Classes 1 and 3 give the same answers (a model averaged over two fits holds the
    class twice): one row "class 1, 3" with their summed weight; class 4's weight of
    0.0001 is left out; class 2 keeps its own row."""
    from types import SimpleNamespace

    from app.services.dashboard import persona_rows

    yes, no = [0.9, 0.1], [0.1, 0.9]
    mu = torch.tensor([[yes, no], [no, yes], [yes, no], [no, no]], dtype=torch.float64)
    items = [
        SimpleNamespace(id=10, question="Q1?", options=[["A", "Yes"], ["B", "No"]]),
        SimpleNamespace(id=11, question="Q2?", options=[["A", "Yes"], ["B", "No"]]),
    ]
    w = torch.tensor([0.3, 0.4, 0.2999, 0.0001], dtype=torch.float64)
    model = SimpleNamespace(mu=mu, log_prior=w.log(), labels=None)
    rt = SimpleNamespace(model=model, items=items, model_index={10: 0, 11: 1})
    rows = persona_rows(rt, w)
    assert [(r["label"], round(r["weight"], 4)) for r in rows] == [
        ("class 1, 3", 0.5999),
        ("class 2", 0.4),
    ]
    assert rows[0]["distinctive"] and rows[0]["distinctive"] != rows[1]["distinctive"]
