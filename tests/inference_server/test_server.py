"""The vLLM launcher: its command line, and a server process that dies while starting."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference_server.errors import ModelNotFoundError, ServerError
from inference_server.model_store import DEFAULT_MODEL, resolve_model
from inference_server.server import MARKER, VLLMServer, vllm_command


def test_cpu_command_line() -> None:
    cmd = vllm_command(
        Path("/v/bin/python"), Path("/m"), "name", host="127.0.0.1", port=9, device="cpu"
    )
    assert cmd[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-prefix-caching" in cmd
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(2**30)
    assert cmd[cmd.index("--served-model-name") + 1] == "name"
    assert cmd[cmd.index("--port") + 1] == "9"


def test_gpu_command_line() -> None:
    cmd = vllm_command(
        Path("p"), Path("/m"), "n", host="0.0.0.0", port=1, device="gpu", tensor_parallel_size=4
    )
    assert cmd[cmd.index("--dtype") + 1] == "auto"
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4"
    assert "--kv-cache-memory-bytes" not in cmd


def test_server_that_dies_while_starting(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text("#!/bin/sh\necho 'engine failed: out of memory' >&2\nexit 3\n")
    py.chmod(0o755)
    (venv / MARKER).write_text("cpu")
    server = VLLMServer(venv=venv, device="cpu", log_path=tmp_path / "log")
    with pytest.raises(ServerError, match=r"(?s)exited with code 3.*engine failed: out of memory"):
        with server:
            pass


def test_unknown_model_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="nothing is downloaded"):
        resolve_model(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model(str(tmp_path / "empty"))
    name, folder = resolve_model(DEFAULT_MODEL)
    assert name == DEFAULT_MODEL and (folder / "config.json").is_file()
