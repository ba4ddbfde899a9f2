"""The default criterion ``eig_anchored`` in the live app: the fixed order is computed when
the model is fitted (or the study prepared), stored with the model, loaded into the cached
study runtime and never recomputed per decision; a study without a stored order for its
current pool and targets is served with ``eig`` (recorded in each decision) while a
``fixed_order`` job computes it.

Real parts only: a migrated SQLite file or PostgreSQL database, the first 120 CES
respondents, a latent class model fitted on them, the session services and the job runner.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlmodel import Session, select

from app import session as svc
from app.schemas import StudySettings
from app.services import belief
from app.services.designer import set_roles
from app.session import decide as session_decide
from app.tables import FittedModel, Item, Job, JobStatus, SelectionDecision, Study
from elicitation.criteria import (
    DEFAULT_DELTA,
    DEFAULT_EVIDENCE_STRENGTH,
    FixedOrder,
    get_criterion,
)
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import (
    LiveStudy,
    admin_study_page,
    ces_sample_study,
    fresh_database_url,
    make_live_study,
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStudy]:
    yield from ces_sample_study(request.param, tmp_path_factory.mktemp("anch"), 120)


@pytest.fixture
def count_greedy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the greedy fixed-order searches (``FixedOrder._greedy``) run from now on."""
    calls: list[int] = []
    real = FixedOrder._greedy

    def counted(self: FixedOrder, *args: Any) -> Any:
        calls.append(1)
        return real(self, *args)

    monkeypatch.setattr(FixedOrder, "_greedy", counted)
    return calls


def _study(db: Session, study_id: int) -> Study:
    study = db.get(Study, study_id)
    assert study is not None
    return study


def _active_row(db: Session, study_id: int) -> FittedModel:
    row = belief.active_model_row(study_id, session=db)
    assert row is not None
    return row


def _run_session(engine: Any, study: Study, n: int) -> int:
    """Start a session and answer its first ``n`` questions with option A; its id."""
    started = svc.start_session(study, engine=engine, attributes={"gender4": "A"})
    view = started.view
    for k in range(n):
        assert view.question is not None
        view = svc.submit_answer(
            study,
            started.session_id,
            item_key=view.question.key,
            option="A",
            idempotency_key=f"k{k}",
            engine=engine,
        )
    return started.session_id


def _decisions(db: Session, session_id: int) -> list[SelectionDecision]:
    return list(
        db.exec(
            select(SelectionDecision)
            .where(SelectionDecision.session_id == session_id)
            .order_by(SelectionDecision.position)  # type: ignore[arg-type]
        ).all()
    )


def _anchored_scores(rt: svc.StudyRuntime, db: Session, d: SelectionDecision, order: list[str]):  # type: ignore[no-untyped-def]
    """``EIG(x) - delta * r(x)`` of every candidate of decision ``d`` recomputed from the
    replayed state and the given order (item keys), with the registry's ``eig`` on the
    model's evidence view."""
    from app.tables import Answer, ElicitationSession, Respondent

    sess = db.get(ElicitationSession, d.session_id)
    assert sess is not None
    respondent = db.get(Respondent, sess.respondent_id)
    answers = list(
        db.exec(select(Answer).where(Answer.session_id == d.session_id).order_by(Answer.id)).all()  # type: ignore[arg-type]
    )[: d.position]
    state = svc.replay(rt, respondent, answers)  # type: ignore[arg-type]
    keys = list(d.scores["scores"])
    bank = rt.model.item_bank
    targets = [rt.model_index[t.id] for t in rt.targets]  # type: ignore[index]
    view = rt.model.evidence_view(DEFAULT_EVIDENCE_STRENGTH)
    eig = get_criterion("eig").score(view, state, [bank.index(k) for k in keys], targets)
    rank = [sum(1 for y in order[: order.index(k)] if y in keys) for k in keys]
    return dict(
        zip(
            keys,
            (eig - DEFAULT_DELTA * torch.tensor(rank, dtype=torch.float64)).tolist(),
            strict=True,
        )
    )


def test_new_studies_default_to_eig_anchored() -> None:
    assert StudySettings().criterion == "eig_anchored"
    # a study that stored another criterion keeps it
    assert StudySettings.model_validate({"criterion": "eig"}).criterion == "eig"


def test_prepared_study_serves_the_stored_order_without_recomputing_it(
    live: LiveStudy, count_greedy: list[int]
) -> None:
    svc.clear_runtime_cache()
    with live.session() as db:
        study = _study(db, live.study_id)
        rt = svc.load_runtime(study, session=db, fit_if_missing=False)
        row = _active_row(db, live.study_id)
        orders = belief.stored_fixed_orders(row.metrics)
        pool = tuple(c.key for c in rt.candidates)
        targets = tuple(t.key for t in rt.targets)
        key = belief.fixed_order_key(
            row.training_hash, pool, targets, get_criterion("fixed").params()
        )
        # stored when the study was prepared, under this model + pool + targets
        assert list(orders) == [key]
        stored = orders[key]["order"]
        assert sorted(stored) == sorted(pool) and orders[key]["targets"] == list(targets)
        assert rt.criterion == "eig_anchored" and rt.requested_criterion is None
        assert rt.missing_order_key is None
        bank = rt.model.item_bank
        assert rt.selector.fixed.order == [bank.index(k) for k in stored]
        # built once per runtime: every decision gets the same object
        assert (
            session_decide.criterion_for(rt, 1, 0)
            is session_decide.criterion_for(rt, 2, 5)
            is rt.selector
        )
    sid = _run_session(live.engine, study, 4)
    assert count_greedy == []  # the whole session ran without a fixed-order search
    with live.session() as db:
        decisions = _decisions(db, sid)
        assert [d.position for d in decisions] == list(range(5))
        for d in decisions:
            assert d.criterion == "eig_anchored" and "requested_criterion" not in d.scores
            assert d.scores["criterion_params"]["delta"] == DEFAULT_DELTA
            want = _anchored_scores(rt, db, d, stored)
            assert d.scores["scores"] == pytest.approx(want, abs=1e-12)


def test_the_stored_order_is_the_one_used(live: LiveStudy, count_greedy: list[int]) -> None:
    """Replace the stored order by another permutation: the decisions follow it (a runtime
    that recomputed or ignored the stored order would score with the greedy one)."""
    with live.session() as db:
        row = _active_row(db, live.study_id)
        orders = belief.stored_fixed_orders(row.metrics)
        ((key, entry),) = orders.items()
        original = list(entry["order"])
        swapped = list(reversed(original))
        row.metrics = {**row.metrics, "fixed_orders": {key: {**entry, "order": swapped}}}
        db.add(row)
        db.commit()
    try:
        svc.clear_runtime_cache()
        with live.session() as db:
            study = _study(db, live.study_id)
        sid = _run_session(live.engine, study, 2)
        assert count_greedy == []
        with live.session() as db:
            rt = svc.load_runtime(study, session=db, fit_if_missing=False)
            for d in _decisions(db, sid):
                assert d.scores["scores"] == pytest.approx(
                    _anchored_scores(rt, db, d, swapped), abs=1e-12
                )
            # and not the greedy order's scores (the test can fail)
            first = _decisions(db, sid)[0]
            greedy = _anchored_scores(rt, db, first, original)
            assert max(abs(first.scores["scores"][k] - greedy[k]) for k in greedy) > 1e-3
    finally:
        with live.session() as db:
            row = _active_row(db, live.study_id)
            row.metrics = {**row.metrics, "fixed_orders": {key: entry}}
            db.add(row)
            db.commit()
        svc.clear_runtime_cache()


@pytest.fixture
def fresh_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveStudy]:
    """A study of its own (its roles are edited) on SQLite, with the process settings'
    queue in ``tmp_path`` (the missing-order path queues a job there)."""
    from app.settings import get_settings

    monkeypatch.setenv("PRIORLY_QUEUE_PATH", str(tmp_path / "queue.db"))
    get_settings.cache_clear()
    belief.forget_fixed_order_requests()
    for url in fresh_database_url("sqlite", tmp_path):
        svc.clear_runtime_cache()
        data = write_small_dataset(DATASETS_DIR / "ces", tmp_path / "ces120", 120)
        study = make_live_study(url, data)
        try:
            yield study
        finally:
            assert belief.wait_for_fixed_order_requests(30.0)
            study.engine.dispose()
            get_settings.cache_clear()
            belief.forget_fixed_order_requests()
            svc.clear_runtime_cache()


def test_missing_order_serves_eig_and_queues_the_job_that_stores_it(
    fresh_live: LiveStudy, count_greedy: list[int]
) -> None:
    from app.jobs.runner import execute_job

    live = fresh_live
    with live.session() as db:
        study = _study(db, live.study_id)
        old_key = next(iter(belief.stored_fixed_orders(_active_row(db, live.study_id).metrics)))
        question = db.exec(
            select(Item).where(Item.study_id == live.study_id, Item.role == "question")
        ).first()
        assert question is not None
        set_roles(study, {question.key: "target"}, session=db)  # roles edited after the fit
    svc.clear_runtime_cache()
    with live.session() as db:
        rt = svc.load_runtime(_study(db, live.study_id), session=db, fit_if_missing=False)
    assert rt.criterion == "eig" and rt.requested_criterion == "eig_anchored"
    assert rt.missing_order_key is not None and rt.missing_order_key != old_key
    status = _admin_criterion_status(live)
    assert "chosen with eig until the fixed question order that eig_anchored needs" in status
    assert belief.wait_for_fixed_order_requests(30.0)
    with live.session() as db:
        jobs = db.exec(select(Job).where(Job.study_id == live.study_id)).all()
        assert [(j.kind, j.status, j.payload) for j in jobs] == [
            ("fixed_order", JobStatus.queued.value, {"key": rt.missing_order_key})
        ]
    # meanwhile: eig, recorded as such with the requested criterion; no search ran
    study = _study_row(live)
    sid = _run_session(live.engine, study, 1)
    assert count_greedy == []
    with live.session() as db:
        decisions = _decisions(db, sid)
        assert [d.criterion for d in decisions] == ["eig", "eig"]
        assert all(d.scores["requested_criterion"] == "eig_anchored" for d in decisions)
        targets = [rt.model_index[t.id] for t in rt.targets]  # type: ignore[index]
        bank = rt.model.item_bank
        first = decisions[0]
        keys = list(first.scores["scores"])
        eig = get_criterion("eig").score(
            rt.model,
            rt.model.initial_state({bank.index("gender4"): 0}),
            [bank.index(k) for k in keys],
            targets,
        )
        assert first.scores["scores"] == pytest.approx(
            dict(zip(keys, eig.tolist(), strict=True)), abs=1e-12
        )
    # a second runtime build queues nothing more
    svc.clear_runtime_cache()
    with live.session() as db:
        svc.load_runtime(_study(db, live.study_id), session=db, fit_if_missing=False)
    assert belief.wait_for_fixed_order_requests(30.0)
    with live.session() as db:
        (job,) = db.exec(select(Job).where(Job.study_id == live.study_id)).all()
    # the job stores the order of the new pool and targets (the old one is kept)
    execute_job(live.engine, job.id or 0, stale_after_s=30.0)
    assert len(count_greedy) == 1
    with live.session() as db:
        done = db.get(Job, job.id)
        assert done is not None and done.status == JobStatus.succeeded.value, done.error
        assert done.result["status"] == "computed" and done.result["key"] == rt.missing_order_key
        orders = belief.stored_fixed_orders(_active_row(db, live.study_id).metrics)
        assert set(orders) == {old_key, rt.missing_order_key}
    svc.clear_runtime_cache()
    with live.session() as db:
        rt2 = svc.load_runtime(_study(db, live.study_id), session=db, fit_if_missing=False)
    assert rt2.criterion == "eig_anchored" and rt2.missing_order_key is None
    n_order = len(rt2.selector.fixed.order)
    assert n_order == len(rt2.candidates)
    status = _admin_criterion_status(live)
    assert f"chosen with eig_anchored, anchored to the stored fixed order of {n_order}" in status
    # the same session continues with the stored order (recorded as eig_anchored)
    view = svc.submit_answer(
        study,
        sid,
        item_key=_decisions_item(live, sid),
        option="A",
        idempotency_key="k1",
        engine=live.engine,
    )
    assert view.question is not None
    with live.session() as db:
        last = _decisions(db, sid)[-1]
        assert last.criterion == "eig_anchored" and "requested_criterion" not in last.scores
    assert len(count_greedy) == 1  # nothing recomputed after the job


def _admin_criterion_status(live: LiveStudy) -> str:
    """The study page's "criterion in use" line, as its owner sees it (text, no tags)."""
    import re

    from app.auth import set_password
    from app.tables import Researcher

    with live.session() as db:
        owner = db.exec(select(Researcher).where(Researcher.email == "owner@example.org")).one()
        set_password(owner, "a long enough password 1", session=db)
        slug = _study(db, live.study_id).slug
    page = admin_study_page(live.url, slug, "owner@example.org", "a long enough password 1")
    found = re.search(r'id="criterion-status">(.*?)</p>', page, re.S)
    assert found is not None, "no criterion status on the study page"
    return " ".join(re.sub(r"<[^>]+>", "", found.group(1)).split())


def _decisions_item(live: LiveStudy, sid: int) -> str:
    with live.session() as db:
        last = _decisions(db, sid)[-1]
        item = db.get(Item, last.item_id)
        assert item is not None
        return item.key


def test_fit_stores_the_order_and_target_free_study_uses_the_fallback(
    fresh_live: LiveStudy, count_greedy: list[int]
) -> None:
    live = fresh_live
    with live.session() as db:
        study = _study(db, live.study_id)
        row = belief.fit_study_model(study, session=db, n_classes=(4,), n_restarts=1, force=True)
        assert len(count_greedy) == 1  # the fit searched the order once ...
        (key,) = belief.stored_fixed_orders(row.metrics)
    svc.clear_runtime_cache()
    with live.session() as db:
        rt = svc.load_runtime(_study(db, live.study_id), session=db, fit_if_missing=False)
    assert rt.model_id == row.id and rt.criterion == "eig_anchored"
    assert rt.selector.fixed.order == [
        rt.model.item_bank.index(k) for k in belief.stored_fixed_orders(row.metrics)[key]["order"]
    ]
    assert len(count_greedy) == 1  # ... and the runtime did not
    # the live selector shrinks by the fit's evidence: one count per class and item
    evidence = rt.model.evidence
    assert evidence is not None and evidence.shape == rt.model.mu.shape[:2]
    assert rt.selector.params()["evidence_strength"] == DEFAULT_EVIDENCE_STRENGTH > 0
    # a study without targets: the target-free criterion, and no order is requested
    with live.session() as db:
        study = _study(db, live.study_id)
        targets = db.exec(
            select(Item.key).where(Item.study_id == live.study_id, Item.role == "target")
        ).all()
        set_roles(study, dict.fromkeys(targets, "question"), session=db)
    svc.clear_runtime_cache()
    with live.session() as db:
        rt = svc.load_runtime(_study(db, live.study_id), session=db, fit_if_missing=False)
    assert rt.criterion == svc.FALLBACK_CRITERION and rt.missing_order_key is None
    assert rt.requested_criterion is None
    sid = _run_session(live.engine, _study_row(live), 1)
    with live.session() as db:
        assert {d.criterion for d in _decisions(db, sid)} == {svc.FALLBACK_CRITERION}
        assert db.exec(select(Job).where(Job.study_id == live.study_id)).all() == []


def _study_row(live: LiveStudy) -> Study:
    with live.session() as db:
        study = _study(db, live.study_id)
        db.expunge(study)
        return study


def test_simulation_maps_the_study_criterion_to_the_same_bench_rule() -> None:
    from app.services.simulation import _study_method
    from elicitation.bench.methods import FitContext
    from models.base import ItemBank

    bank = ItemBank(("a", "b", "t"), (2, 2, 2))
    ctx = FitContext(bank, torch.zeros(0, 3), torch.zeros(0, 3), [], [0, 1], [2], seed=0)
    for name in (StudySettings().criterion, "eig", "eig_tempered", "fixed"):
        label, method = _study_method(name)
        crit = method.criterion(ctx)
        assert label == f"{name} (study)"
        assert crit.name == name and crit.params() == get_criterion(name).params()


def test_a_failed_order_search_does_not_fail_the_fit(
    fresh_live: LiveStudy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fit is stored and activated; the study serves eig, and the queued job fails
    with the search's error stored in the job row (visible to the researcher)."""
    from app.jobs.runner import execute_job

    def broken(self: FixedOrder, *args: Any) -> Any:
        raise RuntimeError("order search exploded")

    monkeypatch.setattr(FixedOrder, "_greedy", broken)
    live = fresh_live
    with live.session() as db:
        row = belief.fit_study_model(
            _study(db, live.study_id), session=db, n_classes=(4,), n_restarts=1, force=True
        )
        assert row.is_active and belief.stored_fixed_orders(row.metrics) == {}
    svc.clear_runtime_cache()
    with live.session() as db:
        rt = svc.load_runtime(_study(db, live.study_id), session=db, fit_if_missing=False)
    assert rt.model_id == row.id
    assert rt.criterion == "eig" and rt.requested_criterion == "eig_anchored"
    assert belief.wait_for_fixed_order_requests(30.0)
    with live.session() as db:
        (job,) = db.exec(select(Job).where(Job.study_id == live.study_id)).all()
    execute_job(live.engine, job.id or 0, stale_after_s=30.0)
    with live.session() as db:
        failed = db.get(Job, job.id)
        assert failed is not None and failed.status == JobStatus.failed.value
        assert "order search exploded" in (failed.error or "")
