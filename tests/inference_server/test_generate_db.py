"""``priorly personas generate`` on a real database (SQLite file and PostgreSQL).

The backend is the real ``openai`` client against a tiny real HTTP server on 127.0.0.1
whose answer for a prompt is a known function of the prompt text, so every stored
distribution can be checked exactly. The server can be switched to answering garbage:
the run must fail with a clear error, leave a ``failed`` job, keep what was stored before
and store nothing wrong; a rerun resumes without recomputing any stored pair.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session, select

from app import db
from app.cli import main
from app.services.personas import study_items
from app.settings import get_settings
from inference_server.model_store import DEFAULT_MODEL
from tests.support.fake_vllm import FakeVLLM, p_first

NASTY = '<script>alert("hi")</script> {{ persona }} {% if x %}{persona}{% endif %} & "q"'
PERSONAS = [NASTY, "A retired teacher from Ohio.", "A young nurse in Nevada."]


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    s = FakeVLLM()
    yield s
    s.close()


@pytest.fixture
def study_db(db_url: str, small_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("PRIORLY_DATABASE_URL", db_url)
    get_settings.cache_clear()
    db.upgrade(db_url)
    from app.services.importer import import_dataset

    engine = db.make_engine(db_url)
    with Session(engine) as session:
        import_dataset(small_dataset, session=session, study_name="gen test")
    engine.dispose()
    yield db_url
    get_settings.cache_clear()


def test_generate_resumes_and_never_stores_wrong(
    study_db: str, fake: FakeVLLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.tables import Job, PersonaDistribution, StudyPersona
    from inference_server.backends import OpenAIBackend
    from inference_server.generate import PairKey, pair_key

    pfile = tmp_path / "personas.jsonl"
    pfile.write_text("\n".join(json.dumps({"text": t}) for t in PERSONAS) + "\n")
    args = ["personas", "generate", "--study", "gen-test", "--backend", "openai"]
    args += ["--base-url", fake.url, "--personas", str(pfile), "--chunk", "8", "--batch-size", "4"]
    args += ["--concurrency", "2"]

    assert main([*args, "--limit", "10"]) == 0
    engine = db.make_engine(study_db)
    with Session(engine) as s:
        assert len(s.exec(select(PersonaDistribution)).all()) == 10
        texts = s.exec(select(StudyPersona.text).order_by(StudyPersona.id)).all()  # type: ignore[arg-type]
        assert list(texts) == PERSONAS  # verbatim, markup and all
        study_id = s.exec(select(StudyPersona.study_id)).first()
        _, questions = study_items(study_id, session=s)
    n_total = len(PERSONAS) * len(questions)
    assert n_total == 90

    fake.garbage_after = fake.requests + 3  # three good requests (= 12 pairs), then garbage
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "persona generation failed" in err and "not JSON" in err and "rerun to resume" in err
    with Session(engine) as s:
        n_after_fail = len(s.exec(select(PersonaDistribution)).all())
        jobs = s.exec(select(Job).order_by(Job.id)).all()  # type: ignore[arg-type]
    assert 10 < n_after_fail < n_total
    assert [j.status for j in jobs] == ["succeeded", "failed"]
    assert jobs[1].error and "BackendError" in jobs[1].error

    fake.garbage_after = None
    sent_before = len(fake.prompts)
    assert main(args) == 0
    assert len(fake.prompts) - sent_before == n_total - n_after_fail  # no stored pair redone
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["computed"] == n_total - n_after_fail and out["already_stored"] == n_after_fail

    # every stored row is exactly what the server said for that pair's prompt
    client = OpenAIBackend(fake.url, DEFAULT_MODEL)
    expected = {}
    for text in PERSONAS:
        for item in questions:
            prompt = client.render(text, item)
            a = p_first(prompt)
            expected[pair_key(client, text, item)] = [a, 1 - a] + [0.0] * (item.n_options - 2)
    with Session(engine) as s:
        rows = s.exec(select(PersonaDistribution)).all()
        jobs = s.exec(select(Job).order_by(Job.id)).all()  # type: ignore[arg-type]
    engine.dispose()
    assert len(rows) == n_total
    for r in rows:
        key = PairKey(r.model_id, r.template_version, r.persona_hash, r.item_hash)
        assert r.probs == pytest.approx(expected[key], abs=1e-9)
        assert r.valid_mass == pytest.approx(0.9, abs=1e-9)
        assert not r.flagged
    assert [j.status for j in jobs] == ["succeeded", "failed", "succeeded"]


def test_generate_unknown_study_is_a_clear_error(
    study_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["personas", "generate", "--study", "nope", "--backend", "openai"]) == 2
    assert "no study with slug 'nope'" in capsys.readouterr().err


def test_generate_with_server_down_stores_nothing(
    study_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens on the port: a clear error naming the URL before anything is
    written (no persona, no job, no distribution)."""
    from app.tables import Job, PersonaDistribution, StudyPersona
    from inference_server.server import free_port

    pfile = tmp_path / "personas.txt"
    pfile.write_text("\n".join(PERSONAS[1:]) + "\n")
    url = f"http://127.0.0.1:{free_port()}"
    args = ["personas", "generate", "--study", "gen-test", "--backend", "openai"]
    args += ["--base-url", url, "--personas", str(pfile), "--limit", "4"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"inference server: {url}/v1/models: cannot reach the inference server" in err
    engine = db.make_engine(study_db)
    with Session(engine) as s:
        assert s.exec(select(PersonaDistribution)).all() == []
        assert s.exec(select(StudyPersona)).all() == []
        assert s.exec(select(Job)).all() == []
    engine.dispose()


def test_generate_takes_the_server_from_the_settings(
    study_db: str,
    fake: FakeVLLM,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PRIORLY_LLM_BASE_URL / _MODEL / _API_KEY stand in for --base-url and --model; a
    server that serves another model is one clear error and no distribution is stored."""
    from app.tables import PersonaDistribution

    pfile = tmp_path / "personas.txt"
    pfile.write_text("\n".join(PERSONAS[1:]) + "\n")
    args = ["personas", "generate", "--study", "gen-test", "--backend", "openai"]
    args += ["--personas", str(pfile), "--limit", "3"]
    monkeypatch.setenv("PRIORLY_LLM_BASE_URL", fake.url + "/")
    monkeypatch.setenv("PRIORLY_LLM_API_KEY", "s3cret-key")
    monkeypatch.setenv("PRIORLY_LLM_MODEL", "meta-llama/Llama-3.1-8B-Instruct")
    get_settings.cache_clear()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (
        f"the inference server at {fake.url} does not serve "
        f"'meta-llama/Llama-3.1-8B-Instruct'; it serves: {DEFAULT_MODEL}"
    ) in err
    assert "Traceback" not in err and "s3cret-key" not in err
    assert fake.requests == 0  # nothing was scored

    monkeypatch.setenv("PRIORLY_LLM_MODEL", DEFAULT_MODEL)
    get_settings.cache_clear()
    engine = db.make_engine(study_db)
    with Session(engine) as s:
        assert s.exec(select(PersonaDistribution)).all() == []
        assert main(args) == 0
        assert json.loads(capsys.readouterr().out)["computed"] == 3
        assert len(s.exec(select(PersonaDistribution)).all()) == 3
    engine.dispose()
    assert fake.authorization == {"Bearer s3cret-key"}  # on every request, GET and POST

    monkeypatch.setenv("PRIORLY_LLM_BASE_URL", "127.0.0.1:8001")
    get_settings.cache_clear()
    assert main(args) == 2
    assert "PRIORLY_LLM_BASE_URL: not an http:// or https:// URL" in capsys.readouterr().err
    for url, why in (
        ("http://127.0.0.1:88211", "the port must be a number from 1 to 65535"),
        ("http://127.0.0.1:8001/api", "has the path /api: give the server root"),
        ("http://127.0.0.1:8001/v1/completions", "has the path /v1/completions: give the"),
    ):
        monkeypatch.setenv("PRIORLY_LLM_BASE_URL", url)
        get_settings.cache_clear()
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"invalid settings: PRIORLY_LLM_BASE_URL: '{url}'" in err and why in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
