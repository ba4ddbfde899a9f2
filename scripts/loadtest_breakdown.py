"""Where the milliseconds of an answer go: CPU per answer by process and by step.

One respondent at a time (no queueing), so the figures are service costs, not waits:
a fresh database per backend, prepared like ``scripts/loadtest`` (CES demo, the cached
fitted model), served by ONE uvicorn process (``--workers 1``), and a sequential client
completing ``--sessions`` 10-question sessions through the JSON API. Reported per answer
(session creation included, one per ``questions`` answers):

* ``server_cpu_ms``: CPU of the uvicorn process (``/proc``), i.e. HTTP, FastAPI, the
  authorization read, the model step and the writes;
* ``postgres_cpu_ms``: CPU of the PostgreSQL backends connected to the test database;
* ``client_cpu_ms``: CPU of this client (httpx);
* ``wall_ms`` / ``p50_ms``: the answer call's wall time;
* ``steps_cpu_ms``: ``[calls, mean thread-CPU ms]`` inside the server for each service
  step, after the warm-up (the server process
  is started with the steps wrapped by a timer: ``submit_answer``, its fast path,
  ``_decide`` (the selection step), state (de)serialisation, the token read, the
  session start).

Usage: ``python scripts/loadtest_breakdown.py [--backends sqlite,postgresql] [--sessions 20]``
(run it under ``flock /tmp/priorly-timing.lock`` on a shared machine; CPU times depend
less on the machine's load than wall times do, but not nothing: caches and frequency).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

STEPS = {
    # each name wrapped where its callers look it up
    "app.session": ["submit_answer", "read_session_by_token", "load_runtime", "start_session"],
    "app.session.submit": ["submit_fast"],
    "app.session.decide": ["decide_next", "dump_state", "load_state"],
}


def serve_instrumented(port: int) -> None:
    """Run uvicorn in this process with the service steps wrapped by a CPU timer; on
    SIGTERM print ``{step: [calls, mean thread-CPU ms]}`` as JSON on stderr."""
    import importlib
    import signal

    acc: dict[str, list[float]] = {}

    def wrap(mod: Any, name: str) -> None:
        fn = getattr(mod, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                c = acc.setdefault(name, [0, 0.0])
                c[0] += 1
                c[1] += time.thread_time() - t

        setattr(mod, name, timed)

    for module, names in STEPS.items():
        mod = importlib.import_module(module)
        for name in names:
            wrap(mod, name)

    def report(*_a: Any) -> None:
        out = {k: [int(v[0]), round(1000 * v[1] / max(1, v[0]), 3)] for k, v in acc.items()}
        print("STEPS " + json.dumps(out), file=sys.stderr, flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, report)
    signal.signal(signal.SIGUSR1, lambda *_a: acc.clear())  # after the warm-up
    import uvicorn

    uvicorn.run(
        "app.main:create_app", factory=True, port=port, log_level="warning", access_log=False
    )


def measure(backend: str, n_sessions: int, questions: int) -> dict[str, Any]:
    import httpx
    import loadtest as lt

    url, drop = lt._fresh_database(backend)
    try:
        slug, key = lt.prepare(url, lt.REPO / "datasets" / "ces", questions)
        port = lt._free_port()
        env = {**os.environ, "PRIORLY_DATABASE_URL": url, "PRIORLY_ENV": "dev"}
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-instrumented", str(port)],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.3)
        database = url.rsplit("/", 1)[1] if backend != "sqlite" else None
        client = httpx.Client(base_url=base, timeout=120)
        rng = random.Random(0)

        def session() -> list[float]:
            r = client.post(
                f"/api/v1/studies/{slug}/sessions",
                json={},
                headers={"Authorization": f"Bearer {key}"},
            )
            r.raise_for_status()
            body = r.json()
            auth = {"Authorization": f"Bearer {body['token']}"}
            lat = []
            while body.get("question"):
                q = body["question"]
                t = time.perf_counter()
                r = client.post(
                    f"/api/v1/sessions/{body['session_id']}/answers",
                    json={
                        "item": q["item"],
                        "option": rng.choice(q["options"])["letter"],
                        "idempotency_key": uuid.uuid4().hex,
                    },
                    headers=auth,
                )
                lat.append(time.perf_counter() - t)
                r.raise_for_status()
                body = r.json()
            return lat

        for _ in range(3):  # warm-up: model loaded, runtime cached, pool filled
            session()
        import signal

        proc.send_signal(signal.SIGUSR1)  # the step timers restart from here
        time.sleep(0.5)

        def pg_cpu() -> float:
            return sum(lt._cpu_s(p) for p in lt._postgres_backends(database)) if database else 0.0

        s0, p0, c0, w0 = lt._cpu_s(proc.pid), pg_cpu(), time.process_time(), time.perf_counter()
        load = os.getloadavg()
        lat: list[float] = []
        for _ in range(n_sessions):
            lat += session()
        wall = time.perf_counter() - w0
        s1, p1, c1 = lt._cpu_s(proc.pid), pg_cpu(), time.process_time()
        proc.terminate()
        _out, err = proc.communicate(timeout=60)
        steps = {}
        for line in err.splitlines():
            if line.startswith("STEPS "):
                steps = json.loads(line[6:])
        lat.sort()
        n = len(lat)
        return {
            "answers": n,
            "sessions": n_sessions,
            "server_cpu_ms": 1000 * (s1 - s0) / n,
            "postgres_cpu_ms": 1000 * (p1 - p0) / n,
            "client_cpu_ms": 1000 * (c1 - c0) / n,
            "wall_ms": 1000 * wall / n,
            "p50_ms": 1000 * lat[n // 2],
            "steps_cpu_ms": steps,
            "loadavg": load,
        }
    finally:
        drop()


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-instrumented":
        serve_instrumented(int(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "loadtest-breakdown.json")
    args = parser.parse_args()
    out = {b: measure(b, args.sessions, args.questions) for b in args.backends.split(",")}
    print(json.dumps(out, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
