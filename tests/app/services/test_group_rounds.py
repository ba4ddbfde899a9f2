"""Group rounds end to end through the web app (SQLite, and PostgreSQL when configured).

plan (job) → open (round row, member links, round sessions) → members answer on their
links (through the respondent answer path) → the track partial shows it → close →
answers refused with a clear message → the next plan uses the answers and the spent
budget; the group budget (rounds, respondents per round, total answers, questions per
respondent) is respected exactly.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

from app import session as svc
from app.errors import ConflictError
from app.jobs.runner import execute_job
from app.services import (
    designer,
    export,
    group_rounds,
    group_views,
    round_links,
    round_tracking,
)
from app.settings import Settings
from app.tables import (
    Answer,
    ElicitationSession,
    GroupRound,
    GroupRoundMember,
    Item,
    Job,
    JobStatus,
    Researcher,
    Respondent,
    SelectionDecision,
    Study,
)
from tests.support.admin import csrf, login
from tests.support.group_round import group_study as _group_study
from tests.support.group_round import open_from_form as _open
from tests.support.group_round import plan_from_form as _plan

LINK = re.compile(r'value="(http://localhost/g/[A-Za-z0-9_-]+)"')


def _answers(engine: Engine, session_id: int) -> list[Answer]:
    with Session(engine) as s:
        return list(s.exec(select(Answer).where(Answer.session_id == session_id)).all())


def test_round_plan_open_answer_track_close_and_next_plan(
    client: TestClient,
    engine: Engine,
    db: Session,
    settings: Settings,
    ces_study: Study,
    alice: Researcher,
    make_researcher: Any,
) -> None:
    study = _group_study(
        db,
        ces_study,
        rounds=2,
        respondents_per_round=4,
        total_answers=7,
        max_questions_per_respondent=1,
    )
    login(client, "alice@example.org")

    # ---- plan 1 ------------------------------------------------------------------------------
    plan1 = _plan(client, engine, study)
    assert plan1.status == JobStatus.succeeded.value, plan1.error
    r1 = plan1.result
    assert r1 is not None
    assert r1["panel"] == "imported" and r1["rounds_done"] == 0 and r1["answers_used"] == 0
    assert r1["per_round"] == 4 and len(r1["respondents"]) == 4
    page = client.get(f"/admin/studies/{study.slug}/groups")
    assert page.status_code == 200 and 'id="open-round"' in page.text
    assert r1["question"] in page.text
    # who can be asked, in the imported panel's terms (not "answered the survey")
    assert "they have answers in the imported data, are reached by the id" in page.text
    assert "answered the survey" not in page.text

    # ---- open round 1 ---------------------------------------------------------------------
    r = _open(client, study, plan1.id or 0)
    assert r.status_code == 303, r.text
    assert r.headers["location"].endswith(f"/admin/studies/{study.slug}/groups/1")
    with Session(engine) as s:
        rnd = s.exec(select(GroupRound).where(GroupRound.study_id == study.id)).one()
        members = list(
            s.exec(
                select(GroupRoundMember)
                .where(GroupRoundMember.round_id == rnd.id)
                .order_by(col(GroupRoundMember.id))
            ).all()
        )
        assert rnd.status == "open" and rnd.number == 1
        assert [m.respondent_id for m in members] == [p["respondent_id"] for p in r1["respondents"]]
        for m in members:  # each round session's one pending question is the round's
            d = s.exec(
                select(SelectionDecision).where(SelectionDecision.session_id == m.session_id)
            ).one()
            assert (d.position, d.item_id, d.criterion) == (0, rnd.item_id, "group_round")
    # a second open of the same plan is refused: a round is open
    again = _open(client, study, plan1.id or 0)
    assert again.status_code == 409 and "still open" in again.text
    # so is a plan asked for from a page shown before the round was opened: nothing started
    with Session(engine) as s:
        n_jobs = len(s.exec(select(Job)).all())
    stale_plan = client.post(
        f"/admin/studies/{study.slug}/groups/plan",
        data={"selection": "elook", "csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert stale_plan.status_code == 409, stale_plan.text
    assert "round 1 is open: close it before planning the next" in stale_plan.text
    assert 'id="latest-plan"' in stale_plan.text  # the rounds page, with the error
    with Session(engine) as s:
        assert len(s.exec(select(Job)).all()) == n_jobs
    # the used plan folds to one line that says which round it became
    page = client.get(f"/admin/studies/{study.slug}/groups").text
    latest = page.split('id="latest-plan"')[1].split("</section>")[0]
    assert f"Plan #{plan1.id} was opened as" in latest and ">round 1</a>" in latest
    assert latest.index("<details>") < latest.index('id="group-predictions"')
    assert 'class="small stack" id="rounds"' in page  # the phone layout of the rounds table

    # ---- links ------------------------------------------------------------------------------
    track = client.get(f"/admin/studies/{study.slug}/groups/1")
    assert track.status_code == 200
    links = LINK.findall(track.text)
    assert len(links) == 4
    expected = [
        "http://localhost/g/"
        + group_rounds.link_token(
            settings.secret_key.get_secret_value(), rnd.id or 0, m.respondent_id
        )
        for m in members
    ]
    assert links == expected
    csv_file = client.get(f"/admin/studies/{study.slug}/groups/1/links.csv")
    assert csv_file.status_code == 200 and csv_file.text.startswith("\ufeffrespondent,")
    import csv
    import io

    table = list(csv.DictReader(io.StringIO(csv_file.text.lstrip("\ufeff"))))
    assert [row["link"] for row in table] == expected
    assert [int(row["respondent_id"]) for row in table] == [m.respondent_id for m in members]
    assert {row["status"] for row in table} == {"waiting"}
    respondent = TestClient(client.app, base_url="http://localhost")  # no admin cookies
    q = respondent.get(links[0])
    assert q.status_code == 200 and f'name="item" value="{r1["question"]}"' in q.text
    assert f'action="{links[0]}"' in q.text  # posts back to the link, not to /s/...
    letters = re.findall(r'name="option" value="([^"]+)"', q.text)
    assert letters

    # a bad option: 422 with the answer path's message, nothing stored
    bad = respondent.post(links[0], data={"option": "ZZ", "idempotency_key": "k0"})
    assert bad.status_code == 422 and "is not an option" in bad.text
    huge = respondent.post(links[0], data={"option": "A" * 100_000, "idempotency_key": "kh"})
    assert huge.status_code == 422 and "(100,000 characters)" in huge.text
    assert len(huge.text) < 20_000  # the value is not echoed in full
    assert _answers(engine, members[0].session_id) == []
    empty = respondent.post(links[0], data={"idempotency_key": "k00"})
    assert empty.status_code == 422 and "Please choose an answer" in empty.text
    twice = respondent.post(
        links[0], data={"option": [letters[0], letters[-1]], "idempotency_key": "kk"}
    )
    assert twice.status_code == 422 and "your answer could not be read" in twice.text
    assert _answers(engine, members[0].session_id) == []

    # the round's item keeps its options and role while members answer it
    asked = db.exec(select(Item).where(Item.study_id == study.id, Item.key == r1["question"])).one()
    options_text = "\n".join(f"{o[0]}: {o[1]}" for o in reversed(asked.options))
    edits = [
        lambda: designer.update_item(study, asked, session=db, question=asked.question,
                                     options_text=options_text, role=asked.role, topic="",
                                     is_preference_criterion=False),
        lambda: designer.set_roles(study, {asked.key: "target"}, session=db),
        lambda: designer.delete_item(study, asked, session=db),
    ]  # fmt: skip
    for edit in edits:
        with pytest.raises(ConflictError, match="group round 1 is asking this question"):
            edit()
    db.refresh(asked)
    assert asked.role == "question"
    for headers in ({"HX-Request": "true"}, {}):  # the designer's row, and a plain post
        refused = client.post(
            f"/admin/studies/{study.slug}/items/{asked.id}",
            data={"action": "delete", "csrf_token": csrf(client)},
            headers=headers,
        )
        assert refused.status_code == 409 and "group round 1 is asking" in refused.text
    reworded = designer.update_item(
        study, asked, session=db, question=asked.question + " (reworded)",
        options_text="\n".join(f"{o[0]}: {o[1]}" for o in asked.options), role=asked.role,
        topic=asked.topic or "", is_preference_criterion=asked.is_preference_criterion,
    )  # fmt: skip
    assert reworded.question.endswith("(reworded)")  # wording alone may still be fixed

    # the open round's page polls with its fingerprint: nothing to draw while unchanged
    track_url = f"/admin/studies/{study.slug}/groups/1"
    poll = re.search(r'hx-get="([^"]+\?since=[^"]+)"', client.get(track_url).text)
    assert poll is not None
    hx = {"HX-Request": "true"}
    poll_url = poll.group(1).replace("&amp;", "&")
    assert client.get(poll_url, headers=hx).status_code == 204

    # member 0 answers (plain POST), the retry with the same key is the same answer
    # an answer posted for another question (a stale or edited page) is refused, not stored
    other = respondent.post(
        links[0], data={"item": "not-this-one", "option": letters[0], "idempotency_key": "k0"}
    )
    assert other.status_code == 409 and "That answer was for another question" in other.text
    assert _answers(engine, members[0].session_id) == []
    for _ in range(2):
        ok = respondent.post(
            links[0],
            data={"item": r1["question"], "option": letters[0], "idempotency_key": "k1"},
            follow_redirects=False,
        )
        assert ok.status_code == 303 and ok.headers["location"] == links[0] + "?reply=answered"
    assert [a.option for a in _answers(engine, members[0].session_id)] == [letters[0]]
    redrawn = client.get(poll_url, headers=hx)  # the answer changed the round: drawn again
    assert redrawn.status_code == 200 and 'data-status="answered"' in redrawn.text
    assert "Your answer was saved" in respondent.get(ok.headers["location"]).text
    assert "Your reply was recorded" in respondent.get(links[0]).text  # a later visit
    changed = respondent.post(links[0], data={"option": letters[-1], "idempotency_key": "k2"})
    assert changed.status_code == 409 and "You have already answered this question" in changed.text
    # a bad option after the answer: thanks again, not "closed" (the round is open)
    bad = respondent.post(links[0], data={"option": "Z?", "idempotency_key": "k2b"})
    assert bad.status_code == 200 and "Your reply was recorded" in bad.text
    # member 1 prefers not to answer; member 2 answers with htmx
    skip = respondent.post(
        links[1], data={"skip": "1", "idempotency_key": "k3"}, follow_redirects=False
    )
    assert skip.status_code == 303 and skip.headers["location"] == links[1] + "?reply=skipped"
    thanks = respondent.get(skip.headers["location"]).text
    assert "You preferred not to answer" in thanks and "answer was saved" not in thanks
    hx = respondent.post(
        links[2],
        data={"option": letters[-1], "idempotency_key": "k4"},
        headers={"HX-Request": "true"},
    )
    assert hx.status_code == 200 and hx.headers["HX-Redirect"] == links[2] + "?reply=answered"
    # one question per link: each answered round session stopped after it
    with Session(engine) as s:
        for m in members[:3]:
            sess = s.get(ElicitationSession, m.session_id)
            assert sess is not None and sess.status == "completed"
            view = svc.session_view(study, sess, session=s)
            assert view.phase == "done" and view.n_posed == 1

    # ---- track (the htmx partial) -----------------------------------------------------------
    part = client.get(f"/admin/studies/{study.slug}/groups/1", headers={"HX-Request": "true"})
    assert part.status_code == 200 and "<html" not in part.text
    assert 'hx-trigger="every 2s"' in part.text  # polls while open
    statuses = re.findall(r'<tr data-status="(\w+)">', part.text)
    assert statuses == ["answered", "skipped", "answered", "waiting"]  # answers first, newest first
    # the badge says what the count says; the round's own numbers come before the budget
    assert ">preferred not to answer</span>" in part.text and ">skipped</span>" not in part.text
    assert part.text.index('id="round-stats"') < part.text.index('id="study-budget"')
    assert re.search(r'id="n-asked">4<', part.text) and "current settings" in part.text
    # gains in expected correct target answers (as on the plan), readable times
    assert "Expected gain (correct target answers)" in part.text and "nats" not in part.text
    assert len(re.findall(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td>", part.text)) == 3
    assert re.search(r'id="n-answered">2<', part.text) and re.search(
        r'id="n-waiting">1<', part.text
    )

    # ---- close ------------------------------------------------------------------------------
    closed = client.post(
        f"/admin/studies/{study.slug}/groups/1/close",
        data={"csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert closed.status_code == 303
    # a second close (another admin's page) shows the round, saying it was closed already
    twice = client.post(
        f"/admin/studies/{study.slug}/groups/1/close", data={"csrf_token": csrf(client)}
    )
    assert twice.status_code == 200 and "round 1 was already closed" in twice.text
    with Session(engine) as s:
        outcomes = [
            s.get(GroupRoundMember, m.id).outcome  # type: ignore[union-attr]
            for m in members
        ]
        assert outcomes == ["answered", "skipped", "answered", "no_answer"]
        late = s.get(ElicitationSession, members[3].session_id)
        assert late is not None and late.status == "abandoned"
        # its view (what GET /api/v1/sessions/{id} returns) takes no more answers
        view = svc.session_view(study, late, session=s)
        assert (view.status, view.phase, view.question) == ("abandoned", "done", None)
        assert view.stop_reason == "abandoned"
    part = client.get(f"/admin/studies/{study.slug}/groups/1", headers={"HX-Request": "true"})
    assert "hx-trigger" not in part.text  # the closed table stops polling
    assert re.findall(r'<tr data-status="(\w+)">', part.text)[-1] == "no_answer"
    assert re.search(r'id="n-waiting">1</span> did not answer', part.text)
    # answers on the links are refused with a clear message; the answer path refuses too
    refused = respondent.post(links[3], data={"option": letters[0], "idempotency_key": "k5"})
    assert refused.status_code == 409 and "answers are no longer accepted" in refused.text
    assert respondent.get(links[3]).status_code == 409
    assert respondent.post(links[3], data={}).status_code == 409
    with pytest.raises(svc.SessionClosedError):
        svc.submit_answer(
            study,
            members[3].session_id,
            item_key=r1["question"],
            option=letters[0],
            idempotency_key=None,
            engine=engine,
        )
    assert _answers(engine, members[3].session_id) == []
    assert respondent.get("http://localhost/g/not-a-token").status_code == 404
    # the dashboard counts round sessions apart: no respondent "started" a survey, but the
    # round's 4 members were asked its question (2 answers, 1 skip, 1 no answer)
    from app.services.dashboard import build_dashboard

    with Session(engine) as s:
        st = s.get(Study, study.id)
        assert st is not None
        dash = build_dashboard(st, session=s)
    assert dash.counts["started"] == 0 and dash.counts["dropped"] == 0
    row = next(e for e in dash.exposure if e["key"] == r1["question"])
    assert (row["asked"], row["skipped"]) == (4, 1)
    # the round's results as CSV: one row per member, the answer's letter and label
    got = client.get(f"/admin/studies/{study.slug}/groups/1/answers.csv")
    assert got.status_code == 200 and got.text.startswith("\ufeffround,question,")
    assert 'filename="' + f'{study.slug}-round-1-answers.csv"' in got.headers["content-disposition"]
    result = list(csv.DictReader(io.StringIO(got.text.lstrip("\ufeff"))))
    assert list(result[0]) == list(round_tracking.ANSWER_COLUMNS)
    assert [(r["respondent_id"], r["status"], r["option"]) for r in result] == [
        (str(members[0].respondent_id), "answered", letters[0]),
        (str(members[1].respondent_id), "skipped", ""),
        (str(members[2].respondent_id), "answered", letters[-1]),
        (str(members[3].respondent_id), "no_answer", ""),
    ]
    assert {r["round"] for r in result} == {"1"} and {r["question"] for r in result} == {
        r1["question"]
    }
    assert dict(asked.options)[letters[0]] == result[0]["option_label"]
    assert result[0]["answered_at"].endswith("+00:00") and result[3]["answered_at"] == ""
    assert client.get(f"/admin/studies/{study.slug}/groups/1/other.csv").status_code == 404
    # the exports: the imported member who never answered has nothing live
    with Session(engine) as s:
        st = s.get(Study, study.id)
        assert st is not None
        live_rows = list(export.iter_rows(st, session=s))
        assert [r.respondent_pk for r in live_rows] == [m.respondent_id for m in members[:3]]
        assert [r.status for r in live_rows] == ["completed"] * 3
        everyone = {
            r.respondent_pk: r for r in export.iter_rows(st, session=s, include_imported=True)
        }
        silent = everyone[members[3].respondent_id]
        assert (silent.status, silent.session_id, silent.source) == ("imported", None, "import")
        assert len(everyone) == len({r.respondent_pk for r in everyone.values()})
        # the long CSV has the same people: the silent member has no rows, and the
        # members' imported attributes carry no live answer time
        long = list(csv.DictReader(io.StringIO("".join(export.csv_long(st, session=s))[1:])))
        labels = {r.respondent_pk: r.respondent_id for r in live_rows}
        assert {r["respondent_id"] for r in long} == set(labels.values())
        attribute_rows = [r for r in long if r["role"] == "attribute"]
        assert attribute_rows and {r["answered_at"] for r in attribute_rows} == {""}
        assert all(r["answered_at"] for r in long if r["role"] != "attribute")

    # ---- the next plan uses the answers and the spent budget ----------------------------------
    with Session(engine) as s:
        st = s.get(Study, study.id)
        assert st is not None
        rep = group_rounds.replay_group(st, session=s)
        row = {m.id: i for i, m in enumerate(rep.members)}
        qi = rep.rt.model_index[rnd.item_id]
        got = [int(rep.group.observed[row[m.respondent_id], qi]) for m in members]
        assert got == [letters.index(letters[0]), -1, letters.index(letters[-1]), -1]
        assert [int(rep.group.n_asked[row[m.respondent_id]]) for m in members] == [1] * 4
    plan2 = _plan(client, engine, study)
    r2 = plan2.result
    assert plan2.status == JobStatus.succeeded.value and r2 is not None, plan2.error
    assert r2["rounds_done"] == 1 and r2["answers_used"] == 4
    assert r2["question"] != r1["question"]
    assert r1["question"] not in [x["item"] for x in r2["question_scores"]]
    assert r2["per_round"] == 3  # min(4 per round, 7 total - 4 used)
    asked_before = {m.respondent_id for m in members}
    assert not asked_before & {p["respondent_id"] for p in r2["respondents"]}  # max 1 each
    # the 4 members asked in round 1 are at the cap of 1: not counted as able to receive one
    assert r2["n_eligible"] == r1["n_eligible"] - 4
    assert r2["predictions"] != r1["predictions"]  # the answers moved the predictions
    # the stale plan 1 cannot be opened again
    stale = _open(client, study, plan1.id or 0)
    assert stale.status_code == 409 and "out of date" in stale.text

    # a budget cut after planning is enforced when opening
    with Session(engine) as s:
        st = s.get(Study, study.id)
        assert st is not None
        st.settings = {**st.settings, "group": {**st.settings["group"], "total_answers": 6}}
        s.add(st)
        s.commit()
    cut = _open(client, study, plan2.id or 0)
    assert cut.status_code == 409 and "4 of the 6 round questions" in cut.text
    assert "(members invited in all rounds, answered or not)" in cut.text
    with Session(engine) as s:
        st = s.get(Study, study.id)
        assert st is not None
        st.settings = {**st.settings, "group": {**st.settings["group"], "total_answers": 7}}
        s.add(st)
        s.commit()
    assert _open(client, study, plan2.id or 0).status_code == 303
    assert (
        client.post(
            f"/admin/studies/{study.slug}/groups/2/close",
            data={"csrf_token": csrf(client)},
            follow_redirects=False,
        ).status_code
        == 303
    )
    usage = round_tracking.budget_usage(study, session=db)
    assert (usage.rounds_used, usage.asked_total, usage.most_questions) == (2, 7, 1)
    assert usage.asked_people == 7  # a respondent is asked at most once (the cap is 1)
    # rounds (and total answers) spent: the next plan fails with the reason
    plan3 = _plan(client, engine, study)
    assert plan3.status == JobStatus.failed.value
    assert "group budget is spent" in (plan3.error or "")
    # the rounds page says so, and shows the failed plan (not only the Jobs tab)
    page = client.get(f"/admin/studies/{study.slug}/groups").text
    assert 'id="budget-spent"' in page and 'id="plan-round"' not in page
    failed = page.split('id="plan-failed"')[1].split("</section>")[0]
    assert "group budget is spent" in failed

    # ---- another researcher sees none of it -------------------------------------------------
    make_researcher("bob@example.org")
    other = TestClient(client.app, base_url="http://localhost")
    login(other, "bob@example.org")
    assert other.get(f"/admin/studies/{study.slug}/groups/1").status_code == 404
    assert other.get(f"/admin/studies/{study.slug}/groups/1/links.csv").status_code == 404
    assert (
        other.post(
            f"/admin/studies/{study.slug}/groups/1/close", data={"csrf_token": csrf(other)}
        ).status_code
        == 404
    )


def test_open_needs_a_published_study(
    client: TestClient, engine: Engine, db: Session, ces_study: Study, alice: Researcher
) -> None:
    study = _group_study(db, ces_study, rounds=1, respondents_per_round=2)
    study.status = "draft"
    db.add(study)
    db.commit()
    login(client, "alice@example.org")
    plan = _plan(client, engine, study)
    assert plan.status == JobStatus.succeeded.value, plan.error
    r = _open(client, study, plan.id or 0)
    assert r.status_code == 409 and "publish the study" in r.text
    with Session(engine) as s:
        assert s.exec(select(GroupRound)).all() == []
        assert s.exec(select(ElicitationSession)).all() == []  # nothing half-written


def test_close_while_members_answer_loses_no_acknowledged_answer(
    engine: Engine, db: Session, settings: Settings, ces_study: Study
) -> None:
    """Members answer from 8 threads while the round is closed: every answer that was
    acknowledged is recorded as answered, every refused one says the round is closed and
    left no row, and nothing is in between."""
    from concurrent.futures import ThreadPoolExecutor

    study = _group_study(db, ces_study, rounds=1, respondents_per_round=8)
    job = Job(kind="plan_group_round", study_id=study.id, payload={"max_members": 60})
    db.add(job)
    db.commit()
    assert execute_job(engine, job.id or 0) == JobStatus.succeeded.value
    db.refresh(job)
    n_imported = db.exec(
        select(func.count()).select_from(Respondent).where(Respondent.study_id == study.id)
    ).one()
    assert job.result is not None and job.result["n_members"] == 60
    assert job.result["panel_size"] == n_imported > 60  # the cut is reported, not silent
    secret = settings.secret_key.get_secret_value()
    rnd = group_rounds.open_round(study, job.id or 0, engine=engine, secret=secret)
    with Session(engine) as s:
        members = list(
            s.exec(select(GroupRoundMember).where(GroupRoundMember.round_id == rnd.id)).all()
        )
        links = [
            round_links.member_by_token(
                group_rounds.link_token(secret, rnd.id or 0, m.respondent_id), session=s
            )
            for m in members
        ]
    item = next(
        it
        for it in group_rounds.svc.load_runtime(study, session=db).items
        if it.key == links[0].item_key
    )
    letter = item.options[0][0]
    acknowledged: set[int] = set()
    refused: set[int] = set()

    def answer(i: int) -> None:
        try:
            round_links.answer_round(
                links[i], option=letter, idempotency_key=f"c{i}", engine=engine
            )
            acknowledged.add(members[i].session_id)
        except group_rounds.RoundClosedError as exc:
            assert "no longer accepted" in str(exc)
            refused.add(members[i].session_id)

    # member 0 answers through the plain answer path, which poses a next question: the
    # close must stop that session after its one round question
    first = svc.submit_answer(
        study,
        members[0].session_id,
        item_key=links[0].item_key,
        option=letter,
        idempotency_key="c0",
        engine=engine,
    )
    assert first.status == "active" and first.question is not None
    acknowledged.add(members[0].session_id)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(answer, i) for i in range(1, len(links))]
        round_tracking.close_round(study, 1, engine=engine)
        for f in futures:
            f.result()
    with Session(engine) as s:
        sess = s.get(ElicitationSession, members[0].session_id)
        assert sess is not None and sess.status == "completed" and sess.completed_at
        stop = s.exec(
            select(SelectionDecision).where(
                SelectionDecision.session_id == sess.id, SelectionDecision.position == 1
            )
        ).one()
        assert (stop.item_id, stop.stop_reason) == (None, group_rounds.ONE_QUESTION_STOP)
        assert svc.session_view(study, sess, session=s).phase == "done"
    assert len(acknowledged) + len(refused) == len(members) == 8
    with Session(engine) as s:
        outcome = {
            m.session_id: m.outcome
            for m in s.exec(select(GroupRoundMember).where(GroupRoundMember.round_id == rnd.id))
        }
        stored = {a.session_id for a in s.exec(select(Answer)).all()}
    assert stored == acknowledged
    assert {sid for sid, o in outcome.items() if o == "answered"} == acknowledged
    assert {sid for sid, o in outcome.items() if o == "no_answer"} == refused


def _live_member(
    engine: Engine,
    study: Study,
    *,
    external_id: str | None = None,
    panel: dict[str, str] | None = None,
    answers: int = 1,
) -> int:
    """A live respondent who consented (a session started) and answered ``answers``
    questions of the survey; returns the respondent id."""
    started = svc.start_session(study, engine=engine, external_id=external_id, panel_params=panel)
    view = started.view
    for k in range(answers):
        assert view.question is not None
        view = svc.submit_answer(
            study,
            started.session_id,
            item_key=view.question.key,
            option=view.question.options[0][0],
            idempotency_key=f"{started.session_id}-{k}",
            engine=engine,
        )
    return started.respondent_id


def test_plan_asks_only_members_who_answered_and_can_be_reached(
    client: TestClient, engine: Engine, db: Session, ces_study: Study, alice: Researcher
) -> None:
    """Live panel: who only consented (never answered), or answered anonymously (no
    external id, no panel parameters: nobody can hand them a link) is never chosen, and
    the plan page says how many members could be asked."""
    study = _group_study(db, ces_study, rounds=2, respondents_per_round=4)
    api_client = _live_member(engine, study, external_id="api-user-1")
    panel_member = _live_member(engine, study, panel={"PROLIFIC_PID": "p-77"})
    only_consented = _live_member(engine, study, external_id="api-user-2", answers=0)
    anonymous = _live_member(engine, study)
    login(client, "alice@example.org")
    plan = _plan(client, engine, study)
    assert plan.status == JobStatus.succeeded.value, plan.error
    r = plan.result
    assert r is not None and r["panel"] == "live"
    assert (r["n_members"], r["n_eligible"]) == (4, 2)
    chosen = {p["respondent_id"] for p in r["respondents"]}
    assert chosen == {api_client, panel_member}
    assert not chosen & {only_consented, anonymous}
    page = client.get(f"/admin/studies/{study.slug}/groups")
    assert re.search(r'id="n-eligible">2<', page.text), page.text
    assert "ask 2 respondents" in page.text
    assert "they answered at least one question of the survey (a skip does not count)" in page.text
    assert "answered the survey" not in page.text
    # the panel's own ids travel with the member: round page, links.csv, exports
    assert _open(client, study, plan.id or 0).status_code == 303
    round_page = client.get(f"/admin/studies/{study.slug}/groups/1")
    assert "Link parameters" in round_page.text and "PROLIFIC_PID=p-77" in round_page.text
    links = client.get(f"/admin/studies/{study.slug}/groups/1/links.csv").text
    rows = {r["respondent_id"]: r for r in csv.DictReader(io.StringIO(links.lstrip("\ufeff")))}
    assert rows[str(panel_member)]["panel_params"] == "PROLIFIC_PID=p-77"
    assert rows[str(api_client)]["panel_params"] == ""
    wide = client.get(f"/admin/studies/{study.slug}/export/answers_wide.csv").text
    table = list(csv.DictReader(io.StringIO(wide.lstrip("\ufeff"))))
    assert list(table[0])[:8] == [*export.META_COLUMNS, "panel.PROLIFIC_PID"]
    assert {r["panel.PROLIFIC_PID"] for r in table} == {"p-77", ""}
    frame, labels, _ = export.labelled_frame(study, session=db)
    assert set(frame["panel_PROLIFIC_PID"]) == {"p-77", ""}
    assert labels["panel_PROLIFIC_PID"] == "link parameter PROLIFIC_PID"
    # both reachable members were asked once, the most one may be asked over all rounds
    closed = client.post(
        f"/admin/studies/{study.slug}/groups/1/close",
        data={"csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert closed.status_code == 303, closed.text
    again = _plan(client, engine, study)
    assert again.status == JobStatus.failed.value
    assert "each of the 2 reachable members has been asked 1 round question," in (again.error or "")


def test_plan_fails_with_the_reason_when_nobody_can_be_reached(
    client: TestClient, engine: Engine, db: Session, ces_study: Study, alice: Researcher
) -> None:
    study = _group_study(db, ces_study, rounds=1, respondents_per_round=2)
    _live_member(engine, study)  # anonymous
    _live_member(engine, study, external_id="x", answers=0)  # never answered
    login(client, "alice@example.org")
    queued = Job(kind="plan_group_round", study_id=study.id, payload={})
    db.add(queued)
    db.commit()
    # a pending plan's row reloads the page when it ends (the Open button, the failure)
    page = client.get(f"/admin/studies/{study.slug}/groups").text
    assert f"/jobs/{queued.id}?refresh=1" in page
    execute_job(engine, queued.id or 0)
    plan = _plan(client, engine, study)
    assert plan.status == JobStatus.failed.value
    assert "none of the 2 members can receive a question" in (plan.error or "")
    refused = _open(client, study, plan.id or 0)  # a stale page's Open of the failed plan
    assert refused.status_code == 409
    assert f"round plan {plan.id} failed: plan the next round again" in refused.text


def test_plan_with_the_study_gnn_and_relational_selection(
    client: TestClient, engine: Engine, db: Session, ces_study: Study, alice: Researcher
) -> None:
    """Without a trained GNN the plan says so and runs on the belief model; after "Train
    the group GNN" the planner loads that model (pool of the belief model and the GNN,
    checked on validation members), relational selection becomes possible and explains
    each member, and the dashboard plots the imputed target distribution round by round."""
    study = _group_study(db, ces_study, rounds=2, respondents_per_round=3)
    login(client, "alice@example.org")
    plain = _plan(client, engine, study).result
    assert plain is not None and plain["uses_gnn"] is False and plain["gnn_model_id"] is None
    assert "no group GNN is trained" in plain["gnn_note"]
    assert plain["method"] == "elook_budget / elook / none"
    page = client.get(f"/admin/studies/{study.slug}/groups")
    assert "No group GNN is trained" in page.text
    assert 'class="warning" id="plan-gnn-note"' in page.text  # not styled as a success
    # relational selection needs the GNN: the job fails with the reason
    r = client.post(
        f"/admin/studies/{study.slug}/groups/plan",
        data={"selection": "relational", "csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert r.status_code == 422 and "needs the study&#39;s trained group GNN" in r.text
    page = client.get(f"/admin/studies/{study.slug}/groups").text
    assert '<option value="relational" disabled>' in page and 'id="no-gnn"' in page
    bad = client.post(
        f"/admin/studies/{study.slug}/groups/plan",
        data={"selection": "nearest", "csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert bad.status_code == 422 and "unknown respondent selection" in bad.text

    # train the GNN (the job of the jobs page), then plan with it
    train = Job(kind="train_gnn", study_id=study.id, payload={"max_epochs": 5})
    db.add(train)
    db.commit()
    assert execute_job(engine, train.id or 0) == JobStatus.succeeded.value
    with Session(engine) as s:
        trained = s.get(Job, train.id)
        assert trained is not None and trained.result is not None
        gnn_id = trained.result["fitted_model_id"]
    page = client.get(f"/admin/studies/{study.slug}/groups")
    assert 'id="plan-gnn-since"' in page.text  # the plan without it says to plan again
    with_gnn = _plan(client, engine, study).result
    assert with_gnn is not None and with_gnn["uses_gnn"] is True
    assert with_gnn["gnn_model_id"] == gnn_id
    assert with_gnn["method"] == "elook_budget / elook / pool"
    assert 0.0 <= with_gnn["pool_weight"] <= 1.0 and with_gnn["pool_val_gain"] is not None
    for t in with_gnn["predictions"]:
        assert abs(sum(t["mean"]) - 1.0) < 1e-6 and all(0 < se < 0.5 for se in t["se"])

    r = client.post(
        f"/admin/studies/{study.slug}/groups/plan",
        data={"selection": "relational", "csrf_token": csrf(client)},
        follow_redirects=False,
    )
    job_id = int(r.headers["location"].rsplit("job=", 1)[1])
    execute_job(engine, job_id)
    with Session(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == JobStatus.succeeded.value, job.error
        rel = job.result
    assert rel["selection"] == "relational" and rel["method"] == "eig / relational / gnn"
    assert len(rel["respondents"]) == 3
    sizes = [
        int(re.search(r"stands for (\d+) of", p["reason"]).group(1)) for p in rel["respondents"]
    ]  # type: ignore[union-attr]
    assert all(n >= 1 for n in sizes) and sum(sizes) == rel["n_eligible"]
    page = client.get(f"/admin/studies/{study.slug}/groups")
    assert "k-means over the GNN" in page.text and "stands for" in page.text
    # the members' expected gains are real figures (not all 0): shown, marked as not
    # what chose them, and the same in the round's answers.csv
    gains = [p["expected_gain"] for p in rel["respondents"]]
    assert any(g > 0 for g in gains)
    members = page.text.split('id="plan-members"')[1].split("</table>")[0]
    assert '<th class="num">Gain</th>' in members and f"{gains[0]:.4f}" in members
    assert "not used to choose them" in page.text and 'id="plan-relational-note"' in page.text
    # its imputed targets are the study's estimate, the chart's last point (not the
    # relational imputation's own), and the page names that model
    with Session(engine) as s:
        st = s.get(Study, study.id)
        assert st is not None
        before = group_views.distribution_history(st, session=s)
    for t, shown in zip(before["targets"], rel["predictions"], strict=True):
        assert t["mean"][-1] == pytest.approx(shown["mean"], abs=1e-9)
    label = group_views.estimate_label(True, [rel["pool_weight"]])
    assert f"Imputed by the {label}" in page.text.replace("&#39;", "'")
    assert "by the GNN alone" not in page.text

    # open, every member answers "A", close; the distribution plot has a point per round
    assert _open(client, study, job_id).status_code == 303
    track = client.get(f"/admin/studies/{study.slug}/groups/1").text
    table = track.split('id="members"')[1]
    assert "Expected gain (correct target answers; not used to choose)" in table
    assert f"{gains[0]:.4f}" in table
    with Session(engine) as s:
        rnd = group_rounds.get_round(study, 1, session=s)
        s.add_all(
            Answer(session_id=m.session_id, item_id=rnd.item_id or 0, option="A")
            for m in group_rounds.round_members([rnd.id or 0], s)
        )
        s.commit()
    closed = client.post(
        f"/admin/studies/{study.slug}/groups/1/close",
        data={"csrf_token": csrf(client)},
        follow_redirects=False,
    )
    assert closed.status_code == 303
    with Session(engine) as s:
        st = s.get(Study, study.id)
        assert st is not None
        hist = group_views.distribution_history(st, session=s)
        own = group_rounds.replay_group(st, session=s, selection="relational").group
        own_mean = own.predict_targets().mean(0)  # the relational imputation's own figures
    assert hist["rounds"] == [0, 1] and hist["uses_gnn"] is True
    assert all(len(t["mean"]) == 2 for t in hist["targets"])
    # after answers, a relational plan still shows the chart's figures, not its own
    r = client.post(
        f"/admin/studies/{study.slug}/groups/plan",
        data={"selection": "relational", "csrf_token": csrf(client)},
        follow_redirects=False,
    )
    job2 = int(r.headers["location"].rsplit("job=", 1)[1])
    assert execute_job(engine, job2) == JobStatus.succeeded.value
    with Session(engine) as s:
        rel2 = (s.get(Job, job2) or Job()).result or {}
    for t, (h, shown) in enumerate(zip(hist["targets"], rel2["predictions"], strict=True)):
        assert h["mean"][-1] == pytest.approx(shown["mean"], abs=1e-9)
        k = len(shown["mean"])
        assert own_mean[t, :k].tolist() != pytest.approx(shown["mean"], abs=1e-6)
    svg = client.get(f"/admin/studies/{study.slug}/groups/distribution.svg")
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml")
    assert "<svg" in svg.text and "closed rounds" in svg.text


def test_one_respondent_is_singular_on_the_pages(
    client: TestClient, engine: Engine, db: Session, ces_study: Study, alice: Researcher
) -> None:
    study = _group_study(db, ces_study, rounds=1, respondents_per_round=1)
    login(client, "alice@example.org")
    plan = _plan(client, engine, study)
    assert plan.status == JobStatus.succeeded.value, plan.error
    page = client.get(f"/admin/studies/{study.slug}/groups").text
    assert "ask 1 respondent</button>" in page
    assert '<span class="n">1 respondent</span> per round' in page
    assert "1 respondents" not in page


def test_gnn_holdout_uses_the_split_or_the_last_tenth() -> None:
    rows = torch.arange(60).reshape(30, 2)
    # a dataset split with enough validation members: as it is
    fit, check = group_rounds.gnn_holdout(rows[:18], rows[18:])
    assert fit.equal(rows[:18]) and check.equal(rows[18:])
    # no split (an upload without user_split.json): the last max(10, N // 10) members
    fit, check = group_rounds.gnn_holdout(rows, rows[:0])
    assert fit.equal(rows[:20]) and check.equal(rows[20:])
    many = torch.arange(400).reshape(200, 2)
    fit, check = group_rounds.gnn_holdout(many[:195], many[195:])
    assert fit.equal(many[:180]) and check.equal(many[180:])
    # too few to hold 10 out and fit on as many: left as it is
    fit, check = group_rounds.gnn_holdout(rows[:15], rows[:0])
    assert fit.equal(rows[:15]) and check.shape[0] == 0


def test_a_study_uploaded_without_a_split_plans_with_its_gnn(
    client: TestClient, engine: Engine, db: Session, ces_study: Study, alice: Researcher
) -> None:
    """The GNN job and the planner check the GNN on the same held-out members, so a study
    whose imported respondents have no validation split can use the GNN it trained."""
    for r in db.exec(select(Respondent).where(Respondent.study_id == ces_study.id)).all():
        r.split = "train"
        db.add(r)
    db.commit()
    study = _group_study(db, ces_study, rounds=2, respondents_per_round=3)
    login(client, "alice@example.org")
    train = Job(kind="train_gnn", study_id=study.id, payload={"max_epochs": 3})
    db.add(train)
    db.commit()
    assert execute_job(engine, train.id or 0) == JobStatus.succeeded.value
    plan = _plan(client, engine, study).result
    assert plan is not None and plan["uses_gnn"] is True, plan.get("gnn_note")
    assert plan["pool_val_gain"] is not None  # checked on the held-out members


def test_the_gnn_note_says_whether_it_hurts_or_only_does_not_clearly_help() -> None:
    """Validation gains of 3 members at the weights 0, 0.5, 1 (answers per member 1):
    every positive weight loses, then a positive but noisy gain, then a clear one."""
    from elicitation.group.pools import pool_weight_from_gains

    counts = torch.ones(3, dtype=torch.float64)
    hurts = torch.tensor([[0.0, -0.1, -0.3], [0.0, -0.2, -0.1], [0.0, -0.1, -0.2]])
    w, pool = pool_weight_from_gains(hurts.double(), counts)
    note = group_rounds.gnn_validation_note(w, {**pool, "members": 3})
    assert w == 0.0 and "predicts worse than the belief model at every weight tried" in note
    noisy = torch.tensor([[0.0, 0.3, 0.1], [0.0, -0.2, -0.1], [0.0, 0.2, 0.0]])
    w, pool = pool_weight_from_gains(noisy.double(), counts)
    note = group_rounds.gnn_validation_note(w, {**pool, "members": 3})
    # weight 0.5: mean 0.1, se sqrt(3/2 * (0.04 + 0.09 + 0.01)) / 3 = 0.1528: bound < 0
    assert w == 0.0 and "at its best weight, 0.5, a gain of 0.1000 ± 0.1528 nats" in note
    clear = torch.tensor([[0.0, 0.3, 0.1], [0.0, 0.31, 0.1], [0.0, 0.29, 0.1]])
    w, pool = pool_weight_from_gains(clear.double(), counts)
    assert w == 0.5 and group_rounds.gnn_validation_note(w, {**pool, "members": 3}) == ""


def test_the_panel_setting_keeps_an_imported_panel_after_a_test_response(
    client: TestClient, engine: Engine, db: Session, ces_study: Study, alice: Researcher
) -> None:
    """One live test response makes the automatic panel live (1 member); the designer's
    Panel setting "imported respondents" keeps the imported panel; an unknown value is
    refused naming the field; round 1 fixes the panel."""
    study = _group_study(db, ces_study, rounds=2, respondents_per_round=2)
    _live_member(engine, study, external_id="tester")
    login(client, "alice@example.org")
    auto = _plan(client, engine, study)
    assert auto.result is not None and (auto.result["panel"], auto.result["n_members"]) == (
        "live",
        1,
    )
    form = {
        "criterion": study.settings["criterion"],
        "rounds": "2",
        "respondents_per_round": "2",
        "max_questions_per_respondent": "1",
        "csrf_token": csrf(client),
    }
    bad = client.post(f"/admin/studies/{study.slug}/settings", data={**form, "panel": "all"})
    assert bad.status_code == 422 and "Panel" in bad.text
    ok = client.post(f"/admin/studies/{study.slug}/settings", data={**form, "panel": "imported"})
    assert ok.status_code == 200, ok.text
    assert '<option value="imported" selected>' in ok.text
    db.refresh(study)
    assert study.settings["group"]["panel"] == "imported"
    imported = _plan(client, engine, study)
    assert imported.result is not None and imported.result["panel"] == "imported"
    assert imported.result["n_members"] > 1
    assert _open(client, study, imported.id or 0).status_code == 303
    # round 1 fixes the panel: a later setting does not move it
    designer.update_settings(
        study,
        {**study.settings, "group": {**study.settings["group"], "panel": "live"}},
        session=db,
    )
    with Session(engine) as s:
        st = s.get(Study, study.id)
        assert st is not None
        members = group_rounds.replay_group(st, session=s).members
    assert all(m.source == "import" for m in members)
    # and the rounds page says so: which panel round 1 fixed, and that the setting differs
    page = client.get(f"/admin/studies/{study.slug}/groups").text
    fixed = page.split('id="panel-fixed"')[1].split("</p>")[0]
    assert "<strong>imported respondents</strong>" in fixed
    assert "setting now says live respondents; it applies only before round 1" in fixed
