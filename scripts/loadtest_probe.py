"""Server-side probes for ``scripts/loadtest --probe``: where an answer call's time goes.

``create_app`` wraps the real app (``app.main.create_app``) with measurements that cost
microseconds per request, and each worker process writes them to
``$PRIORLY_LOADTEST_PROBE_DIR/worker-<pid>.json`` (counters) and
``worker-<pid>.series.jsonl`` (the series, appended) every ~5 s and at shutdown
(:func:`load_worker` joins them):

* ``answers``: ``[start, end]`` (``time.perf_counter``) of every answer call, from the
  ASGI call to the last body byte: the server's share of the client's latency;
* ``loop_lag_ms``: how late the event loop wakes a 5 ms sleep (a blocked loop delays
  every request of the process);
* ``gc``: ``[generation, wall ms, CPU ms, objects left in generation 2]`` of every
  cyclic-GC collection (a full collection over a large heap stalls the process);
* ``answer_paths``: :data:`app.session.async_path.STATS` (answers stored in the
  event loop vs handed to the thread pool);
* ``pools``: ``psycopg_pool`` statistics of the asyncio pools (PostgreSQL): requests that
  had to wait for a connection (``requests_queued``) and their total wait
  (``requests_wait_ms``).

Used to find the tail of the answer call (docs/respondents.md, "Where the tail came
from"); not part of the app.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from typing import Any

import app.main

_DIR = os.environ.get("PRIORLY_LOADTEST_PROBE_DIR", "")
_answers: list[tuple[float, float]] = []
_lag_ms: list[float] = []
_gc: list[tuple[int, float, float, int]] = []
_gc_start = [0.0, 0.0]
_apps: list[Any] = []


def _pool_stats() -> dict[str, Any]:
    db = getattr(_apps[0].state, "answers_db", None) if _apps else None
    if db is None:
        return {}
    return {"answers": db.pool.get_stats(), "limiter": db.limiter_pool.get_stats()}


def _gc_probe(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_start[0], _gc_start[1] = time.perf_counter(), time.thread_time()
        return
    gen = int(info["generation"])
    _gc.append(
        (
            gen,
            (time.perf_counter() - _gc_start[0]) * 1000,
            (time.thread_time() - _gc_start[1]) * 1000,
            len(gc.get_objects(2)) if gen == 2 else 0,
        )
    )


_written = {"answers": 0, "loop_lag_ms": 0, "gc": 0}


def _dump() -> None:
    """Append the series' new entries to ``worker-<pid>.series.jsonl`` (one line per
    dump, so a dump costs what was measured since the last one, not the whole run: a
    dump of every answer so far every 5 s stalled the event loop for tens of ms late in
    a run, which the answers in flight then paid) and rewrite the counters in
    ``worker-<pid>.json``."""
    if not _DIR:
        return
    from app.session.async_path import STATS
    from app.session.memo import STEP_MEMO_STATS

    series = {"answers": _answers, "loop_lag_ms": _lag_ms, "gc": _gc}
    new = {k: v[_written[k] :] for k, v in series.items()}
    base = os.path.join(_DIR, f"worker-{os.getpid()}")
    with open(base + ".series.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(new) + "\n")
    for k, v in series.items():
        _written[k] = len(v)
    with open(base + ".json.tmp", "w", encoding="utf-8") as fh:
        json.dump(
            {
                "answer_paths": STATS,
                "step_memo": STEP_MEMO_STATS,
                "pools": _pool_stats(),
            },
            fh,
        )
    os.replace(base + ".json.tmp", base + ".json")


def load_worker(folder: str, name: str) -> dict[str, Any]:
    """One worker's probe figures: its counters (``worker-<pid>.json``) with its series
    (``answers``, ``loop_lag_ms``, ``gc``) joined from the ``.series.jsonl`` file."""
    with open(os.path.join(folder, name), encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    for k in ("answers", "loop_lag_ms", "gc"):
        data[k] = []
    series = os.path.join(folder, name[: -len(".json")] + ".series.jsonl")
    if os.path.exists(series):
        with open(series, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    chunk = json.loads(line)
                    for k in ("answers", "loop_lag_ms", "gc"):
                        data[k] += chunk.get(k, [])
    return data


async def _monitor() -> None:
    last = time.monotonic()
    while True:
        t = time.perf_counter()
        await asyncio.sleep(0.005)
        _lag_ms.append((time.perf_counter() - t) * 1000 - 5.0)
        if time.monotonic() - last > 5.0:
            last = time.monotonic()
            _dump()


def create_app() -> Any:
    inner = app.main.create_app()
    _apps.append(inner)
    gc.callbacks.append(_gc_probe)
    tasks: list[asyncio.Task[None]] = []

    async def probed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":

            async def send_and_dump(message: dict[str, Any]) -> None:
                if message["type"] == "lifespan.shutdown.complete":
                    _dump()
                await send(message)

            await inner(scope, receive, send_and_dump)
            return
        if not tasks:
            tasks.append(asyncio.get_running_loop().create_task(_monitor()))
        if scope["type"] != "http" or not scope["path"].endswith("/answers"):
            await inner(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed_send(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                _answers.append((start, time.perf_counter()))

        await inner(scope, receive, timed_send)

    return probed


def summarise(folder: str) -> dict[str, Any]:
    """The workers' probe files in ``folder`` as figures (milliseconds)."""

    def q(xs: list[float], p: float) -> float | None:
        xs = sorted(xs)
        return round(xs[min(len(xs) - 1, int(p * len(xs)))], 1) if xs else None

    out: dict[str, Any] = {"workers": {}}
    everything: list[float] = []
    for name in sorted(os.listdir(folder)):
        if not name.startswith("worker-") or not name.endswith(".json"):
            continue
        data = load_worker(folder, name)
        ms = [(b - a) * 1000 for a, b in data["answers"]]
        everything += ms
        full = [g for g in data["gc"] if g[0] == 2]
        out["workers"][name[7:-5]] = {
            "answers": len(ms),
            "server_p50_ms": q(ms, 0.5),
            "server_p99_ms": q(ms, 0.99),
            "loop_lag_p99_ms": q(data["loop_lag_ms"], 0.99),
            "loop_lag_max_ms": round(max(data["loop_lag_ms"], default=0.0), 1),
            "full_gc": len(full),
            "full_gc_max_ms": round(max((g[1] for g in full), default=0.0), 1),
            "full_gc_max_objects": max((g[3] for g in full), default=0),
            "answer_paths": data["answer_paths"],
            "step_memo": data.get("step_memo", {}),
            "pools": data.get("pools", {}),
        }
    out["server_p50_ms"] = q(everything, 0.5)
    out["server_p90_ms"] = q(everything, 0.9)
    out["server_p99_ms"] = q(everything, 0.99)
    return out
