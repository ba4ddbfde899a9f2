"""The persona generation job from the personas page's pieces: cancel between chunks and
resume (the real runner), a server that is down or serves another model (nothing
stored), the server the page offered used by a worker with other settings, and the
embedded SmolLM2 model on a few pairs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.jobs.runner import execute_job
from app.services import jobs
from app.services import personas as ps
from app.services.designer import add_item, create_study
from app.settings import Settings
from app.tables import FittedModel, Job, JobStatus, PersonaDistribution, Researcher, Study
from tests.support.fake_vllm import FakeVLLM


def _job(engine: Engine, job_id: int) -> Job:
    with Session(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


@pytest.fixture
def study(db: Session, alice: Researcher) -> Study:
    """Two attribute-share personas x two questions = 4 pairs."""
    st = create_study("Persona job", owner=alice, session=db)
    add_item(st, session=db, key="age", question="Your age?", options_text="A: Young\nB: Old",
             role="attribute", topic="Age", is_preference_criterion=False)  # fmt: skip
    for k, q in (("q1", "Trust parliament?"), ("q2", "Trust the courts?")):
        add_item(st, session=db, key=k, question=q, options_text="A: Yes\nB: No",
                 role="question", topic="", is_preference_criterion=False)  # fmt: skip
    assert ps.add_share_personas(st, {"age": {"A": "0.5", "B": "0.5"}}, session=db) == 2
    return st


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    server = FakeVLLM()
    yield server
    server.close()


def _run(engine: Engine, db: Session, study: Study, payload: dict[str, Any]) -> Job:
    job = Job(kind="persona_generation", study_id=study.id, payload=payload)
    db.add(job)
    db.commit()
    execute_job(engine, job.id or 0)
    return _job(engine, job.id or 0)


def _stored(db: Session) -> int:
    return len(db.exec(select(PersonaDistribution)).all())


def test_cancel_between_chunks_then_resume(
    engine: Engine, db: Session, study: Study, fake: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel requested while the job runs (after its first chunk) stops it at the next
    chunk boundary with that chunk stored; running the job again scores only the rest."""
    original = ps.generation_progress
    messages: list[str] = []

    def cancelling(total: int, report: Callable[[float, str], None], **kw: Any):
        def spy(fraction: float, message: str) -> None:
            messages.append(message)
            report(fraction, message)

        inner = original(total, spy, **kw)

        def on_progress(done: int, todo: int) -> None:
            if done == 1:  # the researcher presses Cancel while the job runs
                with Session(engine) as s:
                    running = s.exec(select(Job).where(Job.status == "running")).one()
                    jobs.cancel_job(running, session=s)
            inner(done, todo)

        return on_progress

    monkeypatch.setattr(ps, "generation_progress", cancelling)
    payload = {"backend": "openai", "base_url": fake.url, "chunk": 1}
    first = _run(engine, db, study, payload)
    assert first.status == JobStatus.cancelled.value
    assert _stored(db) == 1
    assert first.message.startswith("cancelled; last progress: 1 of 4 pairs scored")
    assert messages[0] == "0 of 4 pairs scored"
    assert messages[1].startswith("1 of 4 pairs scored, ") and "pairs/s, about" in messages[1]
    resumed: list[str] = []

    def watching(total: int, report: Callable[[float, str], None], **kw: Any):
        return original(total, lambda f, m: (resumed.append(m), report(f, m)), **kw)

    monkeypatch.setattr(ps, "generation_progress", watching)
    again = _run(engine, db, study, payload)  # what the Resume button starts
    assert again.status == JobStatus.succeeded.value, again.error
    assert again.result is not None
    assert (again.result["already_stored"], again.result["computed"]) == (1, 3)
    assert resumed[0] == "1 of 4 pairs scored (1 stored before)"
    assert resumed[-1].startswith("4 of 4 pairs scored (1 stored before), ")
    assert _stored(db) == 4


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (
            "down",
            r"inference server: http://127.0.0.1:\d+/v1/models: cannot reach the inference server",
        ),
        ("other model", "does not serve 'another-model'; it serves: SmolLM2-135M-Instruct"),
    ],
)
def test_a_bad_server_fails_the_job_with_nothing_stored(
    engine: Engine, db: Session, study: Study, fake: FakeVLLM, setup: str, message: str
) -> None:
    import re

    db.add(FittedModel(study_id=study.id or 0, family="persona_mixture", blob=b"x",
                       training_hash="h", metrics={"prior": "uniform"}, is_active=True))  # fmt: skip
    db.commit()
    personas_before = len(ps.stored_persona_texts(study.id or 0, session=db))
    payload: dict[str, Any] = {"backend": "openai", "base_url": fake.url, "n_personas": 1}
    if setup == "down":
        fake.close()
    else:
        payload["model"] = "another-model"
    job = _run(engine, db, study, payload)
    assert job.status == JobStatus.failed.value
    assert job.error is not None and re.search(message, job.error), job.error
    assert _stored(db) == 0 and fake.requests == 0
    # nothing else was written: no persona added (n_personas asked for respondents'
    # profiles), the active model is the same row
    assert len(ps.stored_persona_texts(study.id or 0, session=db)) == personas_before
    active = db.exec(select(FittedModel).where(FittedModel.is_active)).all()  # type: ignore[arg-type]
    assert [m.training_hash for m in active] == ["h"]


def _chunk_ends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pairs done at each progress report of the next persona job (one per chunk)."""
    original, ends = ps.generation_progress, []

    def watching(total: int, report: Callable[[float, str], None], **kw: Any):
        inner = original(total, report, **kw)

        def on_progress(done: int, todo: int) -> None:
            ends.append(done)
            inner(done, todo)

        return on_progress

    monkeypatch.setattr(ps, "generation_progress", watching)
    return ends


def test_a_server_chunk_is_a_batch_per_concurrent_request(
    engine: Engine, db: Session, study: Study, fake: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    ends = _chunk_ends(monkeypatch)
    payload = {"backend": "openai", "base_url": fake.url, "batch_size": 1, "concurrency": 3}
    assert _run(engine, db, study, payload).status == JobStatus.succeeded.value
    assert ends == [0, 3, 4]


def test_embedded_model_scores_the_share_personas(
    engine: Engine, db: Session, study: Study, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real embedded SmolLM2-135M on 2 personas x 2 questions (about 15 s with the
    model load), one batch per chunk (a cancel waits for one batch), then the persona prior
    built from what it stored, on each backend."""
    from app.services.belief import fit_study_model

    ends = _chunk_ends(monkeypatch)
    job = _run(engine, db, study, {"backend": "local", "batch_size": 2})
    assert job.status == JobStatus.succeeded.value, job.error
    assert ends == [0, 2, 4]
    assert job.result is not None and job.result["computed"] == 4
    assert job.result["model_id"] == "SmolLM2-135M-Instruct"
    assert (job.result["backend"], job.result["base_url"]) == ("local", None)
    rows = db.exec(select(PersonaDistribution)).all()
    assert len(rows) == 4
    assert all(abs(sum(r.probs) - 1) < 1e-9 and len(r.probs) == 2 for r in rows)
    row = fit_study_model(study, session=db)
    assert row.metrics["prior"] == "persona" and row.metrics["distributions"] == 4
    assert row.metrics["attribute_personas"] == 2


def _worker_settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """The worker process's own PRIORLY_LLM_* settings (``get_settings``, as a separate
    ``priorly worker`` reads them): ``env`` set, the others unset."""
    from app.settings import get_settings

    for name in ("BASE_URL", "MODEL", "API_KEY"):
        monkeypatch.delenv(f"PRIORLY_LLM_{name}", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(f"PRIORLY_LLM_{name.upper()}", value)
    get_settings.cache_clear()


@pytest.fixture
def fresh_settings() -> Iterator[None]:
    from app.settings import get_settings

    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_the_worker_calls_the_server_the_page_offered(
    engine: Engine,
    db: Session,
    study: Study,
    fake: FakeVLLM,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    fresh_settings: None,
) -> None:
    """`priorly serve --no-worker` with PRIORLY_LLM_* and a `priorly worker` without them:
    the job uses the server and model the page offered (in its payload, without the key);
    a worker whose settings disagree or lack the page's key fails naming the setting."""
    from inference_server.model_store import DEFAULT_MODEL

    web = settings.model_copy(update={"llm_base_url": fake.url, "llm_api_key": "s3cret"})
    payload = ps.generation_payload("openai", study, session=db, settings=web)
    assert payload == {"backend": "openai", "chunk": 32, "base_url": fake.url,
                       "model": DEFAULT_MODEL, "api_key_set": True}  # fmt: skip
    refusals = [
        ({}, "the worker running this job has no PRIORLY_LLM_API_KEY: set it for "
             "`priorly worker` too"),  # fmt: skip
        ({"api_key": "k", "base_url": "http://127.0.0.1:9"},
         "the worker running this job has PRIORLY_LLM_BASE_URL=http://127.0.0.1:9, but the "
         f"job was started for the inference server {fake.url}: give `priorly worker`"),
        ({"api_key": "k", "model": "other"}, "the worker running this job has "
         "PRIORLY_LLM_MODEL=other, but the job was "
         f"started for the model {DEFAULT_MODEL}"),
    ]  # fmt: skip
    for env, message in refusals:
        _worker_settings(monkeypatch, **env)
        job = _run(engine, db, study, payload)
        assert job.status == JobStatus.failed.value and job.error is not None
        assert job.error.startswith(message), job.error
        assert _stored(db) == 0 and fake.requests == 0
    _worker_settings(monkeypatch, api_key="s3cret")
    job = _run(engine, db, study, payload)
    assert job.status == JobStatus.succeeded.value, job.error
    assert job.result is not None and job.result["base_url"] == fake.url
    assert _stored(db) == 4 and fake.authorization == {"Bearer s3cret"}


def test_the_docs_server_chunk_is_the_page_constant() -> None:
    """docs/personas.md's chunk on a server is the constant the Personas page uses and the
    job's default (batch 8 × 4 requests in flight)."""
    from pathlib import Path

    docs = (Path(__file__).parents[3] / "docs" / "personas.md").read_text()
    assert "8 × 4 concurrent requests = 32 pairs on an inference server" in docs
    assert "one batch of 8 pairs with the embedded model" in docs
    assert ps.GENERATION_CHUNK == {"local": 8, "openai": 8 * 4}
