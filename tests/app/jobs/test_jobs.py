"""Jobs through the real queue (Huey, SQLite storage) and real worker processes.

The central test kills a worker process (SIGKILL) in the middle of a simulation job and
checks that another worker retries the job and that it finishes with the same result as
an uninterrupted run. Waiting is done by polling the job row for a condition (with a
deadline), never by sleeping for a fixed time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.jobs.runner import MAX_ATTEMPTS, claim, execute_job, reap_dead_jobs
from app.services.job_views import result_summary
from app.services.jobs import cancel_job, start_job
from app.settings import Settings
from app.tables import Job, JobStatus, Researcher, Study

REPO = Path(__file__).resolve().parents[3]
# Small enough to run in seconds, long enough (several progress steps) to be killed mid-way.
PAYLOAD: dict[str, Any] = {
    "budget": 3,
    "max_test_users": 60,
    "n_classes": [3],
    "baselines": ["random", "full"],
    "seed": 1,
}


def _job(engine: Engine, job_id: int) -> Job:
    with Session(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def _wait_for(
    engine: Engine, job_id: int, cond: Callable[[Job], bool], timeout: float, what: str
) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = _job(engine, job_id)
        if cond(job):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; job is {job.status} {job.message}")
        time.sleep(0.02)  # polling interval of a condition, not a synchronisation sleep


def _worker(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        PRIORLY_DATABASE_URL=settings.database_url,
        PRIORLY_QUEUE_PATH=str(settings.queue_path),
        PRIORLY_ENV="test",
        PRIORLY_SECRET_KEY="t" * 40,
        PRIORLY_JOB_STALE_AFTER_S="30",
        OMP_NUM_THREADS="1",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker"],
        cwd=REPO,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(60)


def _comparable(result: dict[str, Any] | None) -> dict[str, Any]:
    assert result is not None
    return {k: v for k, v in result.items() if k != "seconds"}


def test_killed_worker_job_is_retried_with_same_result(
    settings: Settings,
    engine: Engine,
    db: Session,
    ces_study: Study,
    alice: Researcher,
    tmp_path: Path,
) -> None:
    # Reference: the same job run uninterrupted, in this process.
    ref = Job(kind="simulation", study_id=ces_study.id, payload=PAYLOAD)
    db.add(ref)
    db.commit()
    assert execute_job(engine, ref.id or 0) == JobStatus.succeeded.value
    expected = _comparable(_job(engine, ref.id or 0).result)
    assert expected["methods"]["full"]["accuracy"][0] > 0.5

    job = start_job(
        "simulation", ces_study, payload=PAYLOAD, researcher=alice, settings=settings, session=db
    )
    log = tmp_path / "worker.log"
    first = _worker(settings, log)
    try:
        _wait_for(
            engine,
            job.id or 0,
            lambda j: j.status == "running" and j.progress > 0,
            120,
            "the first worker to make progress",
        )
        first.kill()
        first.wait(60)  # reaped: its pid no longer exists
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(60)
    mid = _job(engine, job.id or 0)
    assert mid.status == JobStatus.running.value, "the job ended before the worker was killed"
    assert mid.progress < 1.0 and mid.attempts == 1 and mid.result is None

    second = _worker(settings, log)
    try:
        done = _wait_for(
            engine,
            job.id or 0,
            lambda j: j.status in ("succeeded", "failed", "cancelled"),
            180,
            "the retried job to finish",
        )
    finally:
        _stop(second)
    assert done.status == JobStatus.succeeded.value, (done.error, log.read_text()[-2000:])
    assert done.attempts == 2
    assert _comparable(done.result) == expected


def test_claim_is_exclusive_and_reaper_requeues_dead_worker(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    job = Job(kind="simulation", study_id=ces_study.id, payload=PAYLOAD)
    db.add(job)
    db.commit()
    jid = job.id or 0
    # A worker on this host whose process does not exist (pid far above pid_max).
    import socket

    dead = f"{socket.gethostname()}:999999999:1"
    assert claim(engine, jid, dead) is not None
    assert claim(engine, jid, "other:1:1") is None  # already running: nobody else takes it
    # Heartbeat fresh, but the process is gone: requeued at once.
    assert reap_dead_jobs(engine, stale_after_s=3600) == [jid]
    again = _job(engine, jid)
    assert again.status == JobStatus.queued.value and again.worker is None
    # A live worker on another host with a fresh heartbeat is left alone.
    assert claim(engine, jid, "elsewhere:1:1") is not None
    assert reap_dead_jobs(engine, stale_after_s=3600) == []
    # ... until its heartbeat is stale.
    assert reap_dead_jobs(engine, stale_after_s=1e-9) == [jid]
    # After MAX_ATTEMPTS dead workers the job fails instead of looping.
    for _ in range(MAX_ATTEMPTS - 3):  # two attempts were used above
        assert claim(engine, jid, dead) is not None
        assert reap_dead_jobs(engine, stale_after_s=3600) == [jid]
    assert claim(engine, jid, dead) is not None
    assert reap_dead_jobs(engine, stale_after_s=3600) == []
    final = _job(engine, jid)
    assert final.status == JobStatus.failed.value and "died" in (final.error or "")


def test_cancel_queued_and_running(
    settings: Settings, engine: Engine, db: Session, ces_study: Study, alice: Researcher
) -> None:
    queued = start_job(
        "simulation", ces_study, payload=PAYLOAD, researcher=alice, settings=settings, session=db
    )
    cancel_job(queued, session=db)
    assert _job(engine, queued.id or 0).status == JobStatus.cancelled.value
    assert execute_job(engine, queued.id or 0) is None  # a cancelled job is never claimed

    running = Job(kind="simulation", study_id=ces_study.id, payload=PAYLOAD)
    db.add(running)
    db.commit()
    db.refresh(running)
    running.cancel_requested = True  # as if cancelled while running: stops at first progress
    db.add(running)
    db.commit()
    assert execute_job(engine, running.id or 0) == JobStatus.cancelled.value


def test_failed_job_stores_the_error(
    engine: Engine, db: Session, ces_study: Study, caplog: pytest.LogCaptureFixture
) -> None:
    job = Job(kind="simulation", study_id=ces_study.id, payload={"baselines": ["random"]})
    db.add(job)
    db.commit()
    with caplog.at_level("INFO", logger="priorly.jobs"):
        assert execute_job(engine, job.id or 0) == JobStatus.failed.value
    assert "full" in (_job(engine, job.id or 0).error or "")
    # the worker's log says when the job started and how it ended
    lines = [r.getMessage() for r in caplog.records if r.name == "priorly.jobs"]
    what = f"job {job.id} (simulation, study {ces_study.id})"
    assert f"{what} started, attempt 1" in lines
    assert any(line.startswith(f"{what} failed after ") and "full" in line for line in lines)


@pytest.mark.parametrize("kind", ["nonsense"])
def test_unknown_kind_is_refused_before_writing(
    settings: Settings, db: Session, ces_study: Study, alice: Researcher, kind: str
) -> None:
    from app.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="unknown job kind"):
        start_job(kind, ces_study, researcher=alice, settings=settings, session=db)
    assert db.exec(select(Job)).all() == []


def test_queue_location_and_backend(tmp_path: Path) -> None:
    from huey import RedisHuey, SqliteHuey

    from app.jobs.queue import get_queue, queue_location

    sqlite = Settings(database_url=f"sqlite:///{tmp_path / 'x' / 'p.db'}")
    assert queue_location(sqlite) == str((tmp_path / "x" / "priorly-queue.db").resolve())
    assert isinstance(get_queue(sqlite).huey, SqliteHuey)
    redis = Settings(
        database_url="postgresql+psycopg://u@db.example:5432/p",
        redis_url="redis://q.example:6379/0",
    )
    assert queue_location(redis) == "redis://q.example:6379/0"
    assert isinstance(get_queue(redis).huey, RedisHuey)  # connects lazily: nothing reached here


def test_plan_group_round_picks_best_question_and_top_respondents(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    """The plan's question has the highest score; its respondents are the top-n by their
    own expected gain (the live planner's lookahead accuracy gain: expected correct
    target answers, at most one per target)."""
    from app.services.belief import fit_study_model

    fit_study_model(ces_study, session=db, n_classes=(2,), n_restarts=1)
    settings = dict(ces_study.settings)
    settings["group"] = {**settings["group"], "respondents_per_round": 7}
    ces_study.settings = settings
    db.add(ces_study)
    db.commit()
    job = Job(kind="plan_group_round", study_id=ces_study.id, payload={"max_members": 50})
    db.add(job)
    db.commit()
    assert execute_job(engine, job.id or 0) == JobStatus.succeeded.value, _job(
        engine, job.id or 0
    ).error
    r = _job(engine, job.id or 0).result
    assert r is not None and r["panel"] == "imported" and r["n_members"] == 50
    scores = [q["score"] for q in r["question_scores"]]
    assert r["question"] == r["question_scores"][0]["item"] and scores == sorted(
        scores, reverse=True
    )
    assert len(scores) == 25  # every candidate scored (none asked yet)
    gains = [p["expected_gain"] for p in r["respondents"]]
    assert len(gains) == r["per_round"] == 7 and gains == sorted(gains, reverse=True)
    n_targets = len(ces_study.benchmark_runs[0]["eval_qids"])
    assert gains[0] > 0 and all(g <= n_targets for g in gains)
    assert min(gains) >= r["best_gain_not_chosen"]  # the top 7, not any 7


def test_a_plan_cancelled_while_scored_ends_cancelled_without_a_plan(
    engine: Engine, db: Session, ces_study: Study, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel arrives after the plan's last progress report (while its members are
    scored): the job ends cancelled, with no plan a round could be opened from."""
    from app.jobs import tasks
    from app.services.belief import fit_study_model

    fit_study_model(ces_study, session=db, n_classes=(2,), n_restarts=1)
    job = Job(kind="plan_group_round", study_id=ces_study.id, payload={"max_members": 30})
    db.add(job)
    db.commit()
    real = tasks.plan_next_round

    def plan_then_cancel(*args: object, **kwargs: object) -> object:
        plan = real(*args, **kwargs)  # type: ignore[arg-type]
        with Session(engine) as other:  # the researcher's Cancel, from another request
            row = other.get(Job, job.id)
            assert row is not None
            row.cancel_requested = True
            other.add(row)
            other.commit()
        return plan

    monkeypatch.setattr(tasks, "plan_next_round", plan_then_cancel)
    assert execute_job(engine, job.id or 0) == JobStatus.cancelled.value
    done = _job(engine, job.id or 0)
    assert done.status == JobStatus.cancelled.value and done.result is None


def test_persona_generation_job_stores_distributions_and_resumes(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    """Through the job runner, against a real HTTP server speaking the OpenAI API whose
    answers are a known function of the prompt (inference_server's test double)."""
    from app.tables import PersonaDistribution
    from tests.support.fake_vllm import FakeVLLM

    fake = FakeVLLM()
    try:
        payload = {
            "backend": "openai",
            "base_url": fake.url,
            "n_personas": 2,
            "limit": 7,
            "chunk": 4,
        }
        first = Job(kind="persona_generation", study_id=ces_study.id, payload=payload)
        db.add(first)
        db.commit()
        assert execute_job(engine, first.id or 0) == JobStatus.succeeded.value, _job(
            engine, first.id or 0
        ).error
        r1 = _job(engine, first.id or 0).result
        assert r1 is not None and r1["computed"] == 7 and r1["personas"] == 2
        assert len(db.exec(select(PersonaDistribution)).all()) == 7
        # "limit" is the first N pairs of the grid, not N new pairs per attempt: a retry
        # (same payload) computes nothing more; a larger limit computes only the difference
        for limit, computed, stored in ((7, 0, 7), (10, 3, 10)):
            again = Job(
                kind="persona_generation",
                study_id=ces_study.id,
                payload={**payload, "limit": limit},
            )
            db.add(again)
            db.commit()
            assert execute_job(engine, again.id or 0) == JobStatus.succeeded.value
            r = _job(engine, again.id or 0).result
            assert r is not None and r["computed"] == computed
            assert len(db.exec(select(PersonaDistribution)).all()) == stored
        rest = Job(
            kind="persona_generation", study_id=ces_study.id, payload={**payload, "limit": None}
        )
        db.add(rest)
        db.commit()
        requests_before = fake.requests
        assert execute_job(engine, rest.id or 0) == JobStatus.succeeded.value
        r2 = _job(engine, rest.id or 0).result
        assert r2 is not None and r2["already_stored"] == 10
        assert r2["computed"] == r2["total_pairs"] - 10 == 2 * r1["questions"] - 10
        assert fake.requests > requests_before
        assert len(db.exec(select(PersonaDistribution)).all()) == r2["total_pairs"]
    finally:
        fake.close()


def test_train_gnn_job_stores_an_inactive_model(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    from app.tables import FittedModel
    from gnn.train import TrainedGNN

    job = Job(kind="train_gnn", study_id=ces_study.id, payload={"max_epochs": 2})
    db.add(job)
    db.commit()
    assert execute_job(engine, job.id or 0) == JobStatus.succeeded.value, _job(
        engine, job.id or 0
    ).error
    r = _job(engine, job.id or 0).result
    assert r is not None and r["members"] > 100
    row = db.get(FittedModel, r["fitted_model_id"])
    assert row is not None and row.family == "gnn" and not row.is_active
    assert isinstance(TrainedGNN.from_bytes(row.blob), TrainedGNN)
    words = result_summary(_job(engine, job.id or 0))
    assert words is not None and words.startswith(f"group GNN trained on {r['members']:,} ")
    assert f"{r['best_val_ce']:.3f} nats per answer" in words and "best val ce" not in words


def test_fit_progress_reports_each_em_restart_over_the_k_grid(
    db: Session, ces_study: Study
) -> None:
    """The latent class fit reports every EM restart, K by K, then the refit; the
    fractions never go back; the model is the same as without a progress callback."""
    from app.services.belief import fit_study_model

    seen: list[tuple[float, str]] = []
    row = fit_study_model(
        ces_study,
        session=db,
        n_classes=(2, 3),
        n_restarts=2,
        progress=lambda f, m: seen.append((f, m)),
    )
    messages = [m for _, m in seen]
    assert messages[:4] == [
        "K grid: 2 classes (1 of 2), restart 1 of 2",
        "K grid: 2 classes (1 of 2), restart 2 of 2",
        "K grid: 3 classes (2 of 2), restart 1 of 2",
        "K grid: 3 classes (2 of 2), restart 2 of 2",
    ]
    assert any(m.startswith("refit with validation users") for m in messages)
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[3] == pytest.approx(0.8)
    assert fractions[-1] == pytest.approx(1.0)
    again = fit_study_model(ces_study, session=db, n_classes=(2, 3), n_restarts=2)
    assert again.blob == row.blob  # reporting changes nothing


def test_fit_job_shows_progress_and_a_readable_result(
    engine: Engine, db: Session, ces_study: Study
) -> None:
    """While the fit job runs, its row moves past 5% with the step it is on; the result
    says what was fitted in words."""
    import threading

    from app.services.job_views import job_row

    job = Job(kind="fit_model", study_id=ces_study.id, payload={})
    db.add(job)
    db.commit()
    job_id = job.id or 0
    seen: set[tuple[float, str]] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            j = _job(engine, job_id)
            seen.add((j.progress, j.message or ""))
            done.wait(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        status = execute_job(engine, job_id)
    finally:
        done.set()
        watcher.join()
    assert status == JobStatus.succeeded.value, _job(engine, job_id).error
    steps = [(p, m) for p, m in seen if 0.05 < p < 0.9]
    assert steps, sorted(seen)
    assert all(m.startswith("fitting latent classes: ") for _, m in steps)
    assert any("classes (" in m and "restart" in m for _, m in steps)
    final = _job(engine, job_id)
    summary = job_row(final)["summary"]
    assert summary is not None and summary.startswith("latent classes, ")
    assert " classes, log-likelihood " in summary and "per selection respondent" in summary
    assert "hash" not in summary


def test_a_queued_job_says_what_it_waits_behind(
    client: Any, db: Session, ces_study: Study, alice: Researcher
) -> None:
    """Study A's fit waits behind B's running simulation and A's own queued persona job;
    a job created after it is not ahead of it, nor is a finished one."""
    from app.services.designer import create_study
    from app.services.job_views import job_rows, waiting_words
    from app.services.jobs import jobs_ahead
    from tests.support.admin import login

    other = create_study("Other study", owner=alice, session=db)
    done = Job(kind="simulation", study_id=other.id, status=JobStatus.succeeded.value)
    running = Job(kind="simulation", study_id=other.id, status=JobStatus.running.value)
    persona = Job(kind="persona_generation", study_id=ces_study.id)
    fit = Job(kind="fit_model", study_id=ces_study.id)
    later = Job(kind="simulation", study_id=other.id)
    for job in (done, running, persona, fit, later):
        db.add(job)
        db.commit()
    got = jobs_ahead([fit, persona, running, done, later], session=db)
    assert got == {persona.id: (1, 1), fit.id: (2, 1), later.id: (3, 2)}
    assert waiting_words(2, 1) == "waiting for 2 earlier jobs to finish first (1 of another study)"
    assert waiting_words(1, 0) == "waiting for 1 earlier job to finish first"
    assert waiting_words(3, 2) == "waiting for 3 earlier jobs to finish first (2 of other studies)"
    assert waiting_words(0, 0) == ""
    rows = job_rows([fit, running], session=db)
    assert [r["waiting"] for r in rows] == [waiting_words(2, 1), ""]

    login(client, "alice@example.org")
    page = client.get(f"/admin/studies/{ces_study.slug}")
    assert page.status_code == 200, page.text
    assert f'job {fit.id}</a>): <span class="job-waiting">{waiting_words(2, 1)}' in page.text
    jobs_page = client.get(f"/admin/studies/{ces_study.slug}/jobs")
    assert waiting_words(2, 1) in jobs_page.text and waiting_words(1, 1) in jobs_page.text
