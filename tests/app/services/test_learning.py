"""The learning loop: training data from imported and live respondents, the stable split,
promotion on held-out respondents, sessions keeping their model, refits queued (never
fitted) by the answer path. SQLite and PostgreSQL (the ``engine`` fixture)."""

from __future__ import annotations

import math

import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app import session as svc
from app.services.apikeys import create_api_key
from app.services.belief import fit_study_model
from app.services.learning import (
    HOLDOUT_PERCENT,
    ModelFitFailedError,
    ModelPreparingError,
    judge,
    model_versions,
    queue_refit,
    refit_threshold,
    respondent_part,
    split_bucket,
    study_training_data,
)
from app.session.erasure import erase_respondent
from app.settings import Settings
from app.tables import ElicitationSession, FittedModel, Item, Job, SelectionDecision, Study
from models.base import ItemBank
from models.persona import PersonaMixture


def _items(db: Session, study: Study) -> list[Item]:
    return list(
        db.exec(
            select(Item).where(Item.study_id == study.id).order_by(col(Item.position), col(Item.id))
        ).all()
    )


def _fit(db: Session, study: Study, k: tuple[int, ...] = (2,), **kw: object) -> FittedModel:
    return fit_study_model(study, session=db, n_classes=k, n_restarts=1, **kw)  # type: ignore[arg-type]


def _publish(db: Session, study: Study, **settings: object) -> None:
    study.status = "published"
    study.settings = {**study.settings, **settings}
    db.add(study)
    db.commit()
    db.refresh(study)
    svc.clear_runtime_cache()


def _answer_all(
    study: Study, engine: Engine, sid: int, view: svc.SessionView, n: int
) -> svc.SessionView:
    """Answer ``n`` questions with option ``A`` (or until the session stops)."""
    for _ in range(n):
        if view.question is None:
            break
        view = svc.submit_answer(
            study, sid, item_key=view.question.key, option="A", idempotency_key=None, engine=engine
        )
    return view


def test_split_is_stable_and_keeps_dataset_splits() -> None:
    assert respondent_part(7, 1, "train") == "train"
    assert respondent_part(7, 1, "val") == "selection"
    assert respondent_part(7, 1, "test") == "holdout"
    assert split_bucket(3, 42) == split_bucket(3, 42)
    parts = [respondent_part(3, rid, None) for rid in range(10_000)]
    share = parts.count("holdout") / len(parts)
    assert abs(share - HOLDOUT_PERCENT / 100) < 0.015
    assert [respondent_part(3, rid, None) for rid in range(200)] == parts[:200]


def test_judge_scores_the_observed_answers_exactly() -> None:
    """One item with two options: ``log 0.75`` per answer B; a missing cell scores 0."""
    bank = ItemBank(("q",), (2,))
    good = PersonaMixture(bank, torch.tensor([[[0.25, 0.75]]], dtype=torch.float64))
    flat = PersonaMixture(bank, torch.tensor([[[0.5, 0.5]]], dtype=torch.float64))
    holdout = torch.tensor([[1], [1], [-1]])
    first = judge(good, None, holdout)
    assert first.status == "promoted" and first.reason == "first model of the study"
    assert first.score == pytest.approx(math.log(0.75))
    better = judge(good, flat, holdout)
    assert better.status == "promoted"
    assert (better.score, better.active_score) == pytest.approx((math.log(0.75), math.log(0.5)))
    worse = judge(flat, good, holdout)
    assert worse.status == "rejected" and "does not beat" in worse.reason
    same = judge(good, good, holdout)
    assert same.status == "rejected" and same.reason.startswith("ties with the active model")
    assert judge(flat, good, holdout, force=True).status == "promoted"
    none_held_out = torch.zeros(0, 1, dtype=torch.long)
    kept = judge(good, flat, none_held_out)  # e.g. a persona prior stays
    assert kept.status == "rejected" and kept.reason.startswith("no held-out respondents")
    assert judge(good, flat, none_held_out, unscored_replaces=True).status == "promoted"


def test_training_data_holds_imported_and_live_respondents(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    """Completed and partial live respondents are rows (answers in place, skips and unasked
    missing); preview and erased ones are not; counts say imported / live."""
    _fit(db, ces_study)
    _publish(db, ces_study, budgets={**ces_study.settings["budgets"], "max_questions": 3})
    items = _items(db, ces_study)
    before = study_training_data(ces_study.id or 0, items, session=db)
    assert before.n_live == 0 and before.counts["holdout"]["live"] == 0
    assert before.n_imported + before.counts["holdout"]["imported"] == 400

    done = svc.start_session(ces_study, engine=engine)
    done_view = _answer_all(ces_study, engine, done.session_id, done.view, 3)
    assert done_view.status == "completed"
    partial = svc.start_session(ces_study, engine=engine)
    first_key = partial.view.question.key  # type: ignore[union-attr]
    svc.submit_answer(
        ces_study, partial.session_id, item_key=first_key, option="B", idempotency_key=None,
        engine=engine,
    )  # fmt: skip
    skipped = svc.start_session(ces_study, engine=engine)
    svc.submit_answer(
        ces_study, skipped.session_id, item_key=skipped.view.question.key, option=None,  # type: ignore[union-attr]
        idempotency_key=None, engine=engine,
    )  # fmt: skip
    preview = svc.start_session(ces_study, engine=engine)
    _answer_all(ces_study, engine, preview.session_id, preview.view, 1)
    erased = svc.start_session(ces_study, engine=engine)
    _answer_all(ces_study, engine, erased.session_id, erased.view, 1)
    with Session(engine) as s:
        row = s.get(ElicitationSession, preview.session_id)
        assert row is not None
        row.is_preview = True
        s.add(row)
        s.commit()
        gone = s.get(ElicitationSession, erased.session_id)
        assert gone is not None
    erase_respondent(gone, engine=engine)

    after = study_training_data(ces_study.id or 0, items, session=db)
    live_total = after.n_live + after.counts["holdout"]["live"]
    assert live_total == 2  # completed + partial; the skip-only, preview and erased are not
    assert after.n_imported == before.n_imported
    col_of = {it.key: j for j, it in enumerate(items)}
    expected = [-1] * len(items)
    expected[col_of[first_key]] = 1
    part = respondent_part(ces_study.id or 0, partial.respondent_id, None)
    rows = {"train": after.train, "selection": after.selection, "holdout": after.holdout}[part]
    assert any(r.tolist() == expected for r in rows)
    part = respondent_part(ces_study.id or 0, done.respondent_id, None)
    rows = {"train": after.train, "selection": after.selection, "holdout": after.holdout}[part]
    three = [r for r in rows.tolist() if sum(v >= 0 for v in r) == 3 and r.count(0) == 3]
    assert len(three) >= 1
    refit = _fit(db, ces_study, force=True)
    assert (refit.n_imported, refit.n_live) == (after.n_imported, after.n_live)
    assert refit.n_validation == after.n_holdout


def test_a_worse_fit_is_rejected_with_both_scores(db: Session, ces_study: Study) -> None:
    first = _fit(db, ces_study, (3,))
    assert first.is_active and first.status == "promoted"
    assert first.n_imported > 0 and first.n_live == 0 and first.n_validation > 0
    worse = _fit(db, ces_study, (1,))
    db.refresh(first)
    assert worse.status == "rejected" and not worse.is_active and first.is_active
    assert worse.val_log_lik is not None and worse.active_val_log_lik is not None
    assert worse.val_log_lik < worse.active_val_log_lik
    assert worse.active_val_log_lik == pytest.approx(first.val_log_lik)
    forced = _fit(db, ces_study, (1,), force=True)
    db.refresh(first)
    assert forced.is_active and forced.status == "promoted" and not first.is_active
    versions = model_versions(ces_study.id or 0, session=db)
    assert [v.id for v in versions] == [forced.id, worse.id, first.id]
    assert versions[1].val_log_loss == pytest.approx(-(worse.val_log_lik or 0))
    assert versions[1].reason is not None and "does not beat" in versions[1].reason


def test_model_versions_name_an_averaged_fit_as_such() -> None:
    from app.services.learning import _family_label

    one = {"model": "latent_class", "n_classes": 16, "classes_per_fit": [16]}
    assert _family_label("persona_mixture", one) == "latent classes, 16 classes"
    avg = {"model": "latent_class", "n_classes": 96, "classes_per_fit": [4, 8, 16, 16, 24, 28]}
    assert _family_label("persona_mixture", avg) == (
        "latent classes, the average of 6 fits (96 classes in all)"
    )
    assert _family_label("persona_mixture", {"prior": "uniform"}) == "uniform prior"


def test_a_session_in_progress_keeps_its_model(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    a = _fit(db, ces_study, (2,))
    _publish(db, ces_study, budgets={**ces_study.settings["budgets"], "max_questions": 4})
    old = svc.start_session(ces_study, engine=engine)
    _answer_all(ces_study, engine, old.session_id, old.view, 1)
    b = _fit(db, ces_study, (3,), force=True)
    assert b.is_active and b.id != a.id
    svc.clear_runtime_cache()
    _answer_all(ces_study, engine, old.session_id, svc.session_view(
        ces_study, db.get(ElicitationSession, old.session_id), session=db  # type: ignore[arg-type]
    ), 2)  # fmt: skip
    new = svc.start_session(ces_study, engine=engine)
    with Session(engine) as s:
        models_of = {
            sid: {
                d.scores.get("model_id")
                for d in s.exec(
                    select(SelectionDecision).where(SelectionDecision.session_id == sid)
                ).all()
            }
            for sid in (old.session_id, new.session_id)
        }
        assert models_of == {old.session_id: {a.id}, new.session_id: {b.id}}
        assert s.get(ElicitationSession, old.session_id).model_id == a.id  # type: ignore[union-attr]
        assert s.get(ElicitationSession, new.session_id).model_id == b.id  # type: ignore[union-attr]


def test_completed_sessions_queue_one_refit(engine: Engine, db: Session, ces_study: Study) -> None:
    _fit(db, ces_study)
    _publish(
        db, ces_study, refit_every=2, budgets={**ces_study.settings["budgets"], "max_questions": 1}
    )

    def fit_jobs() -> list[Job]:
        with Session(engine) as s:
            return list(s.exec(select(Job).where(Job.kind == "fit_model")).all())

    for n in range(4):
        started = svc.start_session(ces_study, engine=engine)
        view = _answer_all(ces_study, engine, started.session_id, started.view, 1)
        assert view.status == "completed"
        assert len(fit_jobs()) == (0 if n == 0 else 1)  # the second queues; no duplicate
    (job,) = fit_jobs()
    assert job.payload == {"reason": "2 new completed respondents"}
    assert db.exec(select(FittedModel)).all() and len(db.exec(select(FittedModel)).all()) == 1


def test_an_api_start_without_a_model_queues_a_fit_and_says_so(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    _publish(db, ces_study)
    for _ in range(2):
        with pytest.raises(ModelPreparingError, match="being fitted by job"):
            svc.start_session(ces_study, engine=engine)
    assert db.exec(select(FittedModel)).all() == []
    assert len(db.exec(select(Job).where(Job.kind == "fit_model")).all()) == 1


def test_a_browser_visit_without_a_model_queues_the_fit_and_shows_preparing(
    client: TestClient, db: Session, ces_study: Study
) -> None:
    """The survey page of a published study without a model or fit job queues its first
    fit (once) and shows "preparing"; nothing is fitted in the request."""
    _publish(db, ces_study)
    for _ in range(2):
        page = client.get(f"/s/{ces_study.slug}")
        assert page.status_code == 200 and "Preparing the survey" in page.text
    (job,) = db.exec(select(Job).where(Job.kind == "fit_model")).all()
    assert job.payload == {"reason": "first model"} and job.status == "queued"
    assert db.exec(select(FittedModel)).all() == []


def test_a_failed_first_fit_is_reported_and_not_queued_again(
    engine: Engine, client: TestClient, db: Session, ces_study: Study, settings: Settings
) -> None:
    """A study without a model whose last fit failed answers an API start with 409
    ``model_fit_failed`` naming the job and its error, and its survey page with "not
    available yet" (the preparing page's poll reloads to it); neither queues another fit.
    A researcher's refit makes it "preparing" again."""
    _publish(db, ces_study)
    with pytest.raises(ModelPreparingError):
        svc.start_session(ces_study, engine=engine)
    (job,) = db.exec(select(Job).where(Job.kind == "fit_model")).all()
    job.status, job.error = "failed", "PersonaError: weight must be finite\nTraceback ..."
    db.add(job)
    db.commit()
    for _ in range(2):
        with pytest.raises(ModelFitFailedError, match=rf"last fit \(job {job.id}\) failed: "
                           r"PersonaError: weight must be finite\. A researcher"):  # fmt: skip
            svc.start_session(ces_study, engine=engine)
        page = client.get(f"/s/{ces_study.slug}")
        assert page.status_code == 503 and "cannot start yet" in page.text
        assert "PersonaError" not in page.text
        poll = client.get(f"/s/{ces_study.slug}",
                          headers={"HX-Request": "true", "HX-Trigger": "preparing"})  # fmt: skip
        assert poll.headers.get("HX-Refresh") == "true"
    assert len(db.exec(select(Job).where(Job.kind == "fit_model")).all()) == 1
    key = create_api_key("alice@example.org", session=db)
    r = client.post(f"/api/v1/studies/{ces_study.slug}/sessions", json={},
                    headers={"Authorization": f"Bearer {key.key}"})  # fmt: skip
    assert r.status_code == 409 and r.json()["code"] == "model_fit_failed"
    assert f"job {job.id}" in r.json()["message"]
    assert len(db.exec(select(Job).where(Job.kind == "fit_model")).all()) == 1
    assert "retry-after" not in r.headers  # retrying does not help
    refit, queued = queue_refit(ces_study, researcher=None, settings=settings, session=db)
    assert queued and refit.id != job.id
    with pytest.raises(ModelPreparingError, match=f"being fitted by job {refit.id}"):
        svc.start_session(ces_study, engine=engine)
    # through the API: 409 model_preparing with a Retry-After
    r = client.post(f"/api/v1/studies/{ces_study.slug}/sessions", json={},
                    headers={"Authorization": f"Bearer {key.key}"})  # fmt: skip
    assert r.status_code == 409 and r.json()["code"] == "model_preparing"
    assert r.headers["retry-after"] == str(ModelPreparingError.retry_after)


def test_one_fit_job_per_study_at_a_time_even_when_clicks_race(
    engine: Engine, db: Session, ces_study: Study, settings: Settings
) -> None:
    """The database keeps one queued or running fit per study: a second insert is refused
    (index ``uq_job_one_active_fit``) and :func:`start_job` names the first; four
    simultaneous "Refit now" queue one job, and each click gets it."""
    import threading

    from app.services.jobs import JobAlreadyActiveError, start_job

    first = start_job("fit_model", ces_study, researcher=None, settings=settings, session=db)
    with pytest.raises(JobAlreadyActiveError) as raised:  # the check of queue_refit bypassed
        start_job("fit_model", ces_study, researcher=None, settings=settings, session=db)
    assert raised.value.job.id == first.id
    first.status = "failed"
    db.add(first)
    db.commit()
    barrier = threading.Barrier(4)
    got: list[tuple[int | None, bool]] = []

    def click() -> None:
        with Session(engine) as s:
            study = s.get(Study, ces_study.id)
            assert study is not None
            barrier.wait()
            job, queued = queue_refit(study, researcher=None, settings=settings, session=s)
            got.append((job.id, queued))

    threads = [threading.Thread(target=click) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    active = db.exec(select(Job).where(Job.kind == "fit_model", Job.status == "queued")).all()
    assert len(active) == 1 and {job_id for job_id, _ in got} == {active[0].id}
    assert sorted(queued for _, queued in got) == [False, False, False, True]


def test_a_cape_fit_is_identified_by_its_training_data(db: Session, ces_study: Study) -> None:
    """A CAPE fit (whose fitter sets no training hash) is stored with the hash of its family
    and training data, so the per-process model cache and the fixed-order keys never take
    it for another study's or another fit's model."""
    from models.base import responses_hash

    for it in _items(db, ces_study):
        it.is_preference_criterion = it.role == "question"
        db.add(it)
    db.commit()
    row = _fit(db, ces_study, belief_model="cape_linear",
               fit_options={"cape_linear": {"dims": (1,)}})  # fmt: skip
    items = _items(db, ces_study)
    data = study_training_data(ces_study.id or 0, items, session=db)
    bank = ItemBank(tuple(i.key for i in items), tuple(len(i.options) for i in items))
    expected = responses_hash(torch.cat([data.train, data.selection]), bank)
    assert row.family == "cape_linear" and row.training_hash == f"cape_linear:{expected}"


def test_calibration_questions_take_the_last_places_of_the_budget(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    """``calibration_items = 2`` of ``max_questions = 4``: two adaptive questions, then two
    items drawn from the unposed questions and targets (the draw: sha256 of the session id
    and the answers so far, modulo the pool in study order); the respondent sees a budget
    of 4."""
    import dataclasses
    import hashlib
    import json

    from app.schemas import StudySettings
    from app.session.decide import calibration_decision, calibration_start

    _fit(db, ces_study)
    budgets = {**ces_study.settings["budgets"], "max_questions": 4}
    _publish(db, ces_study, budgets=budgets, calibration_items=10, calibration_min_answers=0)
    capped = svc.load_runtime(ces_study, engine=engine)
    assert capped.calibration_items == 3  # at most max_questions - 1: one adaptive question
    assert StudySettings.model_validate({}).calibration_items == 5  # a new study's
    _publish(db, ces_study, calibration_items=2)
    rt = svc.load_runtime(ces_study, engine=engine)
    assert rt.calibration_items == 2
    started = svc.start_session(ces_study, engine=engine)
    assert started.view.max_questions == 4
    view, posed = started.view, []
    for _ in range(4):
        assert view.question is not None
        posed.append(rt.by_key[view.question.key].id)
        view = svc.submit_answer(
            ces_study, started.session_id, item_key=view.question.key, option="A",
            idempotency_key=None, engine=engine,
        )  # fmt: skip
    assert view.status == "completed"
    with Session(engine) as s:
        decisions = s.exec(
            select(SelectionDecision)
            .where(SelectionDecision.session_id == started.session_id)
            .order_by(col(SelectionDecision.position))
        ).all()
    assert [d.criterion for d in decisions] == [rt.criterion] * 2 + ["calibration"] * 3
    assert decisions[-1].item_id is None and decisions[-1].stop_reason == "max_questions"
    for position in (2, 3):
        answered = [[item_id, "A"] for item_id in posed[:position]]
        pool = [it.id for it in rt.candidates + rt.targets if it.id not in posed[:position]]
        digest = hashlib.sha256(json.dumps([started.session_id, answered]).encode()).digest()
        assert posed[position] == pool[int.from_bytes(digest[:8], "big") % len(pool)]

    class Ans:  # duck-types an answer row
        def __init__(self, item_id: int) -> None:
            self.item_id, self.option = item_id, "A"

    only_targets_left = [Ans(c.id) for c in rt.candidates]
    budget = rt.settings.budgets.model_copy(update={"max_questions": len(rt.candidates) + 1})
    with_targets = dataclasses.replace(  # a copy: the cached runtime is shared
        rt, settings=rt.settings.model_copy(update={"budgets": budget})
    )
    pick = calibration_decision(with_targets, 0, only_targets_left)  # type: ignore[arg-type]
    assert pick is not None and pick.item_id in {t.id for t in rt.targets}
    few = dataclasses.replace(rt, candidates=rt.candidates[:1])  # fewer than 4 - 2
    assert calibration_start(few) == 1 and few.max_questions == 3
    assert calibration_decision(few, 0, []) is None
    assert calibration_decision(few, 0, [Ans(rt.candidates[0].id)]) is not None
    big = rt.settings.budgets.model_copy(update={"max_questions": 50})
    small_pool = dataclasses.replace(  # 1 candidate + the targets; 50 questions, 10 calibration
        rt,
        candidates=rt.candidates[:1],
        settings=rt.settings.model_copy(update={"budgets": big, "calibration_items": 10}),
    )
    assert small_pool.max_questions == 1 + len(rt.targets)  # no item is asked twice


def test_respondents_who_answer_alike_get_their_own_calibration_items(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    """Eight respondents give the same answers: their adaptive questions are the same (and
    come from the step memo after the first), their calibration items are drawn per
    session (each one the draw of :func:`calibration_decision` for its session id)."""
    from app.session.decide import calibration_decision

    _fit(db, ces_study)
    budgets = {**ces_study.settings["budgets"], "max_questions": 4}
    _publish(db, ces_study, budgets=budgets, calibration_items=2, calibration_min_answers=0)
    rt = svc.load_runtime(ces_study, engine=engine)
    orders = []
    for _ in range(8):
        started = svc.start_session(ces_study, engine=engine)
        view, posed = started.view, []
        while view.question is not None:
            posed.append(rt.by_key[view.question.key].id)
            view = svc.submit_answer(
                ces_study, started.session_id, item_key=view.question.key, option="A",
                idempotency_key=None, engine=engine,
            )  # fmt: skip
        orders.append((started.session_id, posed))

    class Ans:  # duck-types an answer row
        def __init__(self, item_id: int) -> None:
            self.item_id, self.option = item_id, "A"

    assert len({tuple(posed[:2]) for _, posed in orders}) == 1
    assert len({posed[2] for _, posed in orders}) > 1
    for sid, posed in orders:
        for position in (2, 3):
            pick = calibration_decision(rt, sid, [Ans(i) for i in posed[:position]])
            assert pick is not None and pick.item_id == posed[position]


def test_a_fit_records_the_observed_answers_of_each_item(db: Session, ces_study: Study) -> None:
    """``metrics["item_answers"]`` counts the observed cells of every respondent the fit saw
    (held-out ones included), per item key."""
    row = _fit(db, ces_study)
    items = _items(db, ces_study)
    data = study_training_data(ces_study.id or 0, items, session=db)
    everyone = torch.cat([data.train, data.selection, data.holdout])
    expected = {it.key: int((everyone[:, j] >= 0).sum()) for j, it in enumerate(items)}
    assert row.metrics["item_answers"] == expected
    assert sum(expected.values()) == int((everyone >= 0).sum())


def test_calibration_is_asked_only_while_an_item_is_under_observed(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    """Calibration places exist while some question or target item has fewer than
    ``calibration_min_answers`` answers in the model's data; the draw prefers those items,
    and falls back to any unposed item once the respondent was asked all of them."""
    import dataclasses

    from app.session.decide import calibration_decision

    row = _fit(db, ces_study)
    counts = row.metrics["item_answers"]
    budgets = {**ces_study.settings["budgets"], "max_questions": 4}
    _publish(db, ces_study, budgets=budgets, calibration_items=2,
             calibration_min_answers=max(counts.values()) + 1)  # fmt: skip
    rt = svc.load_runtime(ces_study, engine=engine)
    assert rt.calibration_items == 2
    assert rt.under_observed == rt.candidates + rt.targets
    assert rt.item_answers == {it.id: counts[it.key] for it in rt.items if it.id in rt.model_index}

    askable = rt.candidates + rt.targets
    _publish(db, ces_study, calibration_min_answers=min(counts[it.key] for it in askable))
    learned = svc.load_runtime(ces_study, engine=engine)
    assert learned.under_observed == [] and learned.calibration_items == 0
    started = svc.start_session(ces_study, engine=engine)
    view = _answer_all(ces_study, engine, started.session_id, started.view, 4)
    assert view.status == "completed"
    with Session(engine) as s:
        criteria = s.exec(
            select(SelectionDecision.criterion).where(
                SelectionDecision.session_id == started.session_id
            )
        ).all()
    assert "calibration" not in criteria and len(criteria) == 5  # 4 adaptive, then the stop

    target = rt.targets[0]
    one_left = dataclasses.replace(  # a copy: the cached runtime is shared
        learned, item_answers={**(learned.item_answers or {}), target.id: 0}
    )
    assert one_left.under_observed == [target] and one_left.calibration_items == 2

    class Ans:  # duck-types an answer row
        def __init__(self, item_id: int) -> None:
            self.item_id, self.option = item_id, "A"

    two = [Ans(c.id) for c in rt.candidates[:2]]
    pick = calibration_decision(one_left, 0, two)  # type: ignore[arg-type]
    assert pick is not None and pick.item_id == target.id  # the only under-observed item
    three = [*two, Ans(target.id)]
    pick = calibration_decision(one_left, 0, three)  # type: ignore[arg-type]
    assert pick is not None and pick.item_id in {it.id for it in askable} - {
        a.item_id for a in three
    }
    unknown = dataclasses.replace(learned, item_answers=None)  # a model stored without counts
    assert unknown.calibration_items == 0


def test_refits_come_early_while_the_model_knows_few_respondents() -> None:
    """The threshold doubles the data until ``refit_every``: 25, 25, 50, ... 500."""
    assert [refit_threshold(500, n) for n in (0, 10, 25, 50, 400, 800, 5000)] == [
        25, 25, 25, 50, 400, 500, 500,
    ]  # fmt: skip
    assert refit_threshold(2, 0) == 2 and refit_threshold(2, 1000) == 2


def test_a_model_fitted_on_few_respondents_is_refitted_early(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    """With ``refit_every = 500`` and an active model behind which stand no respondents, the
    25th completed session queues the refit (:func:`refit_threshold` read from the active
    row's counts), not the 24th."""
    row = _fit(db, ces_study)
    row.n_imported = row.n_live = row.n_validation = 0
    db.add(row)
    db.commit()
    _publish(
        db,
        ces_study,
        refit_every=500,
        budgets={**ces_study.settings["budgets"], "max_questions": 1},
    )
    for n in range(1, 26):
        started = svc.start_session(ces_study, engine=engine)
        assert _answer_all(ces_study, engine, started.session_id, started.view, 1).status == (
            "completed"
        )
        with Session(engine) as s:
            jobs = s.exec(select(Job).where(Job.kind == "fit_model")).all()
        assert len(jobs) == (1 if n == 25 else 0)
    assert jobs[0].payload == {"reason": "25 new completed respondents"}


def test_the_study_page_says_whether_the_study_is_calibrating(
    client: TestClient, db: Session, ces_study: Study
) -> None:
    """The designer page names the calibration places and the fewest-answered items while
    calibrating, and says when calibration is done."""
    import re

    from tests.support.admin import login

    row = _fit(db, ces_study)
    counts = row.metrics["item_answers"]
    login(client, "alice@example.org")

    def status() -> str:
        page = client.get(f"/admin/studies/{ces_study.slug}").text
        found = re.search(r'id="calibration-status">(.*?)</p>', page, re.S)
        assert found is not None, "no calibration status on the study page"
        return " ".join(re.sub(r"<[^>]+>", "", found.group(1)).split())

    threshold = max(counts.values()) + 1
    _publish(db, ces_study, calibration_items=3, calibration_min_answers=threshold)
    rt = svc.load_runtime(ces_study, session=db)
    askable = rt.candidates + rt.targets
    fewest = min((counts[it.key], it.key) for it in askable)
    text = status()
    assert text.startswith("Calibrating: the last 3 of each respondent's questions")
    assert (
        f"while {len(askable)} of the question and target items have fewer than {threshold}" in text
    )
    assert f"(fewest: {fewest[1]} {fewest[0]}," in text
    _publish(db, ces_study, calibration_min_answers=min(counts[it.key] for it in askable))
    assert status().startswith("Calibration done: every question and target item has at least")


def test_auto_refits_a_study_with_its_first_few_respondents(
    db: Session, alice: object, small_dataset_factory: object
) -> None:
    """A study with 14 respondents (a handful for training, one or two for selection and
    for the promotion): ``auto`` fits, skipping what cannot be fitted on so few and saying
    why, instead of failing the job (a CAPE factor fit with more factors than respondents
    raised a shape error before)."""
    from app.services.designer import set_roles
    from app.services.importer import import_dataset

    folder = small_dataset_factory("ces", 14)  # type: ignore[operator]
    study = db.get(Study, import_dataset(folder, session=db, study_name="young").study_id)
    assert study is not None
    set_roles(study, dict.fromkeys(study.benchmark_runs[0]["eval_qids"], "target"), session=db)
    db.refresh(study)
    data = study_training_data(study.id or 0, _items(db, study), session=db)
    assert data.train.shape[0] < 12 <= data.train.shape[0] + 12  # fewer than cape_linear's d
    families = ("latent_classes", "cape_linear", "persona_mixture")  # the Pyro fit is slow
    row = _fit(db, study, belief_model="auto", fit_options={"auto": {"families": families}})
    assert row.status == "promoted" and row.metrics is not None
    assert row.metrics["auto_chosen"] in {r["name"] for r in row.metrics["model_choice"]}
    assert "persona_mixture" in row.metrics["model_choice_skipped"]
