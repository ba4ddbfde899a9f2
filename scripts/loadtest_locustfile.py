"""Locust user for ``scripts/loadtest``: one simulated respondent = one adaptive session.

Each user creates a session through the JSON API (the researcher's API key from
``PRIORLY_LOADTEST_KEY``), answers every question until the session completes (a random
option, seeded per user), and then either stops (default) or, when
``PRIORLY_LOADTEST_DURATION_S`` is set, starts another session until that many seconds
have passed since the test began (a steady population of respondents). Between two
answers a user "thinks" for ``PRIORLY_LOADTEST_THINK_S`` seconds on average (uniform in
[0.5, 1.5] x the mean; 0 = answers back to back, the closed-loop worst case); a user's
first request is delayed by a random fraction of one think time so that users spawned
together do not stay in lock-step.

A request that fails at the network level or with a 5xx is retried with the same
idempotency key (what a real client does), so an answer is never posted twice under two
keys. The latency of every answer call (client-side wall time of the request, including
retries) and the count of acknowledged (2xx) answers are written to
``PRIORLY_LOADTEST_OUT`` (JSON) when locust quits; the runner quits when every user has
finished. The client is locust's ``FastHttpUser`` (geventhttpclient), which costs several
times less CPU per request than the requests-based ``HttpUser``: the generator runs on the
same two cores as the server.
"""

from __future__ import annotations

import gc
import json
import os
import random
import threading
import time
import uuid
from typing import Any

import gevent
from locust import constant, events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.exception import StopUser

STUDY = os.environ.get("PRIORLY_LOADTEST_STUDY", "ces")
KEY = os.environ.get("PRIORLY_LOADTEST_KEY", "")
OUT = os.environ.get("PRIORLY_LOADTEST_OUT", "loadtest.json")
USERS = int(os.environ.get("PRIORLY_LOADTEST_USERS", "200"))
THINK_S = float(os.environ.get("PRIORLY_LOADTEST_THINK_S", "0"))
DURATION_S = float(os.environ.get("PRIORLY_LOADTEST_DURATION_S", "0"))
MAX_RETRIES = 5

_lock = threading.Lock()
_answer_ms: list[float] = []
_answer_windows: list[tuple[float, float]] = []
_acked = 0
_sessions: list[int] = []
_completed_sessions = 0
_finished = 0
_errors: list[str] = []
_retries = 0
_started = time.monotonic()
_lag_ms: list[float] = []
_gc_ms: list[float] = []
_gc_start = [0.0]


def _gc_timer(phase: str, _info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_start[0] = time.perf_counter()
    else:
        _gc_ms.append((time.perf_counter() - _gc_start[0]) * 1000)


gc.callbacks.append(_gc_timer)


def _loop_lag_monitor() -> None:
    """How late the generator's event loop wakes a 5 ms sleep: a stalled generator sends
    no requests and then a burst, which the server sees as a load spike."""
    while True:
        t = time.perf_counter()
        gevent.sleep(0.005)
        _lag_ms.append((time.perf_counter() - t) * 1000 - 5.0)


@events.init.add_listener
def _start_monitor(environment: Any, **_kw: Any) -> None:
    gevent.spawn(_loop_lag_monitor)


class Respondent(FastHttpUser):
    """One respondent completing one session (or sessions until the duration is over)."""

    wait_time = constant(0)  # pacing is done inside the task (think time between answers)
    network_timeout = 120.0
    connection_timeout = 30.0

    @task
    def complete_sessions(self) -> None:
        rng = random.Random(id(self))
        if THINK_S > 0:
            gevent.sleep(rng.uniform(0, THINK_S))
        while True:
            self._one_session(rng)
            if not DURATION_S or time.monotonic() - _started >= DURATION_S:
                break
        self._finish()

    def _one_session(self, rng: random.Random) -> None:
        global _acked, _completed_sessions
        r = self._post(
            f"/api/v1/studies/{STUDY}/sessions",
            {"external_id": f"load-{uuid.uuid4().hex}"},
            {"Authorization": f"Bearer {KEY}"},
            name="create session",
        )
        if r is None:
            return
        body = r[0]
        token, sid = body["token"], body["session_id"]
        with _lock:
            _sessions.append(sid)
        auth = {"Authorization": f"Bearer {token}"}
        while body.get("question"):
            if THINK_S > 0:
                gevent.sleep(rng.uniform(0.5 * THINK_S, 1.5 * THINK_S))
            q = body["question"]
            payload = {
                "item": q["item"],
                "option": rng.choice(q["options"])["letter"],
                "idempotency_key": uuid.uuid4().hex,
            }
            start = time.perf_counter()
            r = self._post(f"/api/v1/sessions/{sid}/answers", payload, auth, name="answer")
            end = time.perf_counter()
            if r is None:
                return
            with _lock:
                _acked += 1
                _answer_ms.append((end - start) * 1000)
                _answer_windows.append((start, end))
            body = r[0]
        with _lock:
            _completed_sessions += 1

    def _post(
        self, path: str, payload: dict[str, Any], headers: dict[str, str], *, name: str
    ) -> tuple[dict[str, Any]] | None:
        """POST with retries on 5xx / network errors; ``(json body,)`` of a 2xx or ``None``."""
        global _retries
        for attempt in range(MAX_RETRIES):
            if attempt:
                with _lock:
                    _retries += 1
            with self.client.post(
                path, json=payload, headers=headers, name=name, catch_response=True
            ) as r:
                status = r.status_code or 0
                if 200 <= status < 300:
                    r.success()
                    return (r.json(),)
                if status >= 500 or status == 0:
                    r.failure(f"{status}: retrying")
                    continue
                r.failure(f"{status}: {(r.text or '')[:200]}")
                with _lock:
                    _errors.append(f"{name} {status} {(r.text or '')[:200]}")
                return None
        with _lock:
            _errors.append(f"{name}: gave up after {MAX_RETRIES} attempts")
        return None

    def _finish(self) -> None:
        global _finished
        with _lock:
            _finished += 1
            done = _finished >= USERS
        if done and self.environment.runner is not None:
            self.environment.runner.quit()
        raise StopUser()


def _summary(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "p50": xs[len(xs) // 2],
        "p99": xs[min(len(xs) - 1, int(0.99 * len(xs)))],
        "max": xs[-1],
        "sum": sum(xs),
    }


@events.quitting.add_listener
def _write_results(environment: Any, **_kw: Any) -> None:
    with _lock:
        ms = sorted(_answer_ms)
        first = min((w[0] for w in _answer_windows), default=0.0)
        last = max((w[1] for w in _answer_windows), default=0.0)
        data = {
            "users": USERS,
            "think_time_s": THINK_S,
            "duration_s": DURATION_S,
            "finished_users": _finished,
            "sessions": sorted(_sessions),
            "sessions_completed_by_clients": _completed_sessions,
            "answers_acknowledged": _acked,
            "answer_ms": ms,
            "answer_window_s": last - first,
            "retries": _retries,
            "errors": _errors[:50],
            "n_errors": len(_errors),
            "generator_loop_lag_ms": _summary(_lag_ms),
            "generator_gc_ms": _summary(_gc_ms),
        }
    with open(OUT, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
