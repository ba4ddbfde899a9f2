"""The vLLM launcher: command lines, process groups, a server that dies while starting,
and the CI background server's state folder (real processes; a shell script as vLLM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from inference_server.errors import ModelNotFoundError, ServerError
from inference_server.model_store import DEFAULT_MODEL, resolve_model
from inference_server.model_store import MARKER as MODEL_MARKER
from inference_server.server import (
    MARKER,
    VLLMServer,
    run_background,
    setup_vllm_env,
    stop_background,
    vllm_command,
    wait_background,
)


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


def test_environment_for_the_other_device_is_refused(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / MARKER).write_text("cpu")
    assert setup_vllm_env(venv, device="cpu") == venv / "bin" / "python"
    with pytest.raises(ServerError, match=r"/venv is set up for the CPU, not the GPU"):
        setup_vllm_env(venv, device="gpu")


def test_unknown_model_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="nothing is downloaded"):
        resolve_model(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model(str(tmp_path / "empty"))
    name, folder = resolve_model(DEFAULT_MODEL)
    assert name == DEFAULT_MODEL and (folder / "config.json").is_file()


# ---- process groups and the CI background server (real processes, fake vLLM) -------------
def _fake_venv(tmp_path: Path, script: str) -> Path:
    """A vLLM environment whose ``python`` is ``script`` (a shell script), marked ready."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text("#!/bin/sh\n" + script)
    py.chmod(0o755)
    (venv / MARKER).write_text("cpu")
    return venv


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _poll(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    # The fake server forks a child (like vLLM's engine core) and writes its pid.
    child = tmp_path / "child.pid"
    venv = _fake_venv(tmp_path, f"sleep 600 &\necho $! > {child}\nwait\n")
    server = VLLMServer(venv=venv, device="cpu", log_path=tmp_path / "log").start()
    assert server.proc is not None
    assert _poll(lambda: child.is_file() and child.read_text().strip() != "")
    child_pid = int(child.read_text())
    assert _alive(server.proc.pid)
    server.stop(grace=5)
    assert server.proc.poll() is not None
    assert not _alive(server.proc.pid)
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)


def test_stop_from_a_signal_handler_during_wait(tmp_path: Path) -> None:
    """``priorly inference serve`` stops the server from its SIGTERM handler while the main
    thread waits for it: stop() must not wait out its grace period on the held wait()."""
    child = tmp_path / "child.pid"
    venv = _fake_venv(tmp_path, f"sleep 600 &\necho $! > {child}\nwait\n")
    server = VLLMServer(venv=venv, device="cpu", log_path=tmp_path / "log").start()
    assert server.proc is not None
    assert _poll(lambda: child.is_file() and child.read_text().strip() != "")
    previous = signal.signal(signal.SIGALRM, lambda *_: server.stop(grace=30))
    try:
        t0 = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        assert server.proc.wait() == -signal.SIGTERM  # blocking: holds the wait lock
        assert time.monotonic() - t0 < 15  # not the 30 s grace period
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert _poll(lambda: not _alive(server.proc.pid))
    with pytest.raises(ProcessLookupError):
        os.kill(int(child.read_text()), 0)


def test_single_process_command_and_environment(tmp_path: Path) -> None:
    env_out = tmp_path / "env"
    venv = _fake_venv(tmp_path, f'echo "$VLLM_ENABLE_V1_MULTIPROCESSING $*" > {env_out}\n')
    server = VLLMServer(venv=venv, device="cpu", single_process=True, log_path=tmp_path / "l")
    cmd = server.command()
    assert cmd[cmd.index("--distributed-executor-backend") + 1] == "uni"
    server.start()
    assert server.proc is not None and server.proc.wait(20) == 0
    assert env_out.read_text().split()[0] == "0"
    with pytest.raises(ServerError, match="tensor_parallel_size 1"):
        vllm_command(
            Path("p"), Path("/m"), "n", host="h", port=1, device="gpu",
            tensor_parallel_size=2, single_process=True,
        )  # fmt: skip


@pytest.fixture
def embedded_stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder holding a (stub) converted embedded model: files the launcher checks."""
    cache = tmp_path / "cache"
    folder = cache / "models" / DEFAULT_MODEL
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", MODEL_MARKER):
        (folder / name).write_text("{}")
    monkeypatch.setenv("PRIORLY_CACHE_DIR", str(cache))
    return folder


def test_background_server_that_dies_fails_with_reason(
    tmp_path: Path, embedded_stub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = _fake_venv(tmp_path, "echo 'engine failed: out of memory' >&2\nexit 3\n")
    monkeypatch.setenv("PRIORLY_VLLM_VENV", str(venv))
    state = tmp_path / "state"
    assert run_background(state) == 1
    assert "exited with code 3" in (state / "failed").read_text()
    assert "engine failed: out of memory" in (state / "failed").read_text()
    with pytest.raises(ServerError, match=r"(?s)exited with code 3.*out of memory"):
        wait_background(state, timeout=5)


def test_background_model_wait_has_a_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = _fake_venv(tmp_path, "exit 0\n")
    monkeypatch.setenv("PRIORLY_VLLM_VENV", str(venv))
    monkeypatch.setenv("PRIORLY_CACHE_DIR", str(tmp_path / "empty-cache"))
    state = tmp_path / "state"
    assert run_background(state, model_wait=0.2, poll=0.05) == 1
    assert "embedded model was not converted" in (state / "failed").read_text()


def test_wait_background_gone_launcher_and_timeout(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    (state / "launcher.pid").write_text(str(proc.pid))
    with pytest.raises(ServerError, match="launcher process is gone"):
        wait_background(state, timeout=5, poll=0.05)
    (state / "launcher.pid").unlink()
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="not ready within 0.3 s"):
        wait_background(state, timeout=0.3, poll=0.05)
    assert time.monotonic() - t0 < 5


def test_wait_background_returns_url_of_a_ready_server(tmp_path: Path) -> None:
    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps({"data": [{"id": DEFAULT_MODEL}]}).encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        state = tmp_path / "state"
        state.mkdir()
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        (state / "url").write_text(url)
        assert wait_background(state, timeout=10, poll=0.05) == url
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_stop_background_ends_launcher_and_server_groups(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    launcher = subprocess.Popen(["sleep", "600"], start_new_session=True)
    server = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
    (state / "launcher.pid").write_text(str(launcher.pid))
    (state / "server.pgid").write_text(str(server.pid))
    stop_background(state, grace=1)  # they stay zombies (our children) until waited below
    # SIGTERM ended both (the SIGKILL after the grace period finds only zombies)
    assert launcher.wait(5) == -signal.SIGTERM and server.wait(5) == -signal.SIGTERM
    # the orphaned grandchild (sleep) is gone once init has reaped it
    assert _poll(lambda: not _alive(launcher.pid) and not _alive(server.pid))


@pytest.mark.parametrize("listening", [True, False])
def test_serve_refuses_a_port_in_use_before_starting_vllm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], listening: bool
) -> None:
    """A port another server listens on (whose answers the readiness check would take for
    vLLM's) or merely holds is one line and exit 2; vLLM is never started."""
    import socket

    from app.cli import main

    started = tmp_path / "started"
    venv = _fake_venv(tmp_path, f"touch {started}\nsleep 30\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        if listening:
            sock.listen(1)
        port = sock.getsockname()[1]
        code = main(["inference", "serve", "--port", str(port), "--venv", str(venv)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == f"priorly: error: port {port} is in use: choose another with --port"
    assert not started.exists()


# ---- `priorly inference serve`: served name, API key, log files, help -------------------
def test_served_name_and_api_key_reach_vllm_not_its_command_line(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    venv = _fake_venv(tmp_path, f'echo "$VLLM_API_KEY|$*" > {out}\n')
    server = VLLMServer(
        venv=venv, device="cpu", served_name="my-model", api_key="k3y", log_path=tmp_path / "l"
    )
    cmd = server.command()
    assert cmd[cmd.index("--served-model-name") + 1] == "my-model"
    assert "k3y" not in " ".join(cmd)
    server.start()
    assert server.proc is not None and server.proc.wait(20) == 0
    key, args = out.read_text().strip().split("|")
    assert key == "k3y" and "--served-model-name my-model" in args


def test_ready_sends_the_api_key(tmp_path: Path) -> None:
    seen: list[str | None] = []

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            ok = self.headers.get("Authorization") == "Bearer k3y"
            body = json.dumps({"data": [{"id": "my-model"}]}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        port = httpd.server_address[1]
        kw = dict(venv=tmp_path, device="cpu", port=port, served_name="my-model")
        assert VLLMServer(**kw, api_key="k3y", log_path=tmp_path / "a").ready()
        assert not VLLMServer(**kw, log_path=tmp_path / "b").ready()
        assert seen == ["Bearer k3y", None]
    finally:
        httpd.shutdown()
        httpd.server_close()


def _serve(tmp_path: Path, venv: Path, *extra: str) -> int:
    from app.cli import main
    from inference_server.server import free_port

    port = free_port()
    return main(["inference", "serve", "--port", str(port), "--venv", str(venv), *extra])


def test_serve_passes_served_name_and_key_and_keeps_the_log_of_a_vllm_that_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tempfile

    from app.settings import get_settings

    logs = tmp_path / "tmp"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
    out = tmp_path / "seen"
    venv = _fake_venv(tmp_path, f'echo "$VLLM_API_KEY|$*" > {out}\necho boom\nexit 3\n')
    monkeypatch.setenv("PRIORLY_LLM_API_KEY", "from-settings")
    get_settings.cache_clear()
    try:
        assert _serve(tmp_path, venv, "--device", "cpu", "--served-name", "mine") == 2
        key, args = out.read_text().strip().split("|")
        assert key == "from-settings" and "--served-model-name mine" in args
        assert _serve(tmp_path, venv, "--device", "cpu", "--api-key", "given") == 2
        assert out.read_text().startswith("given|")
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert "exited with code 3" in err and "from-settings" not in err and "given" not in err
    kept = sorted(logs.glob("priorly-vllm-*.log"))
    assert len(kept) == 2 and all("boom" in p.read_text() for p in kept)


def test_serve_removes_the_log_of_a_start_that_failed_before_vllm_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tempfile

    logs = tmp_path / "tmp"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
    started = tmp_path / "started"
    venv = _fake_venv(tmp_path, f"touch {started}\n")
    (venv / MARKER).write_text("gpu")  # set up for the other device: refused before vLLM
    assert _serve(tmp_path, venv, "--device", "cpu") == 2
    assert "is set up for the GPU, not the CPU" in capsys.readouterr().err
    assert not started.exists()
    assert list(logs.iterdir()) == []


def test_serve_help_shows_defaults_and_the_new_options(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main

    with pytest.raises(SystemExit):
        main(["inference", "serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for needle in (
        "port to listen on (default: 8001)",
        "(default: 127.0.0.1)",
        "--api-key KEY",
        "PRIORLY_LLM_API_KEY",
        "--served-name NAME",
        "set PRIORLY_LLM_MODEL to that name",
        f"{DEFAULT_MODEL} for the embedded model",
    ):
        assert needle in text, needle
    assert "(default: None)" not in text
