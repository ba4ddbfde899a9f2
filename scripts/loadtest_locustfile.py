"""Locust user for ``scripts/loadtest``: one simulated respondent = one adaptive session.

Each user creates a session through the JSON API (the researcher's API key from
``PRIORLY_LOADTEST_KEY``), answers every question until the session completes (a random
option, seeded per user), then stops. A request that fails at the network level or with a
5xx is retried with the same idempotency key (what a real client does), so an answer is
never posted twice under two keys. Exact latencies of every answer call are written, with
the count of acknowledged (2xx) answers, to ``PRIORLY_LOADTEST_OUT`` (JSON) when locust
quits; the runner quits when every user has finished.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from typing import Any

from locust import HttpUser, constant, events, task
from locust.exception import StopUser

STUDY = os.environ.get("PRIORLY_LOADTEST_STUDY", "ces")
KEY = os.environ.get("PRIORLY_LOADTEST_KEY", "")
OUT = os.environ.get("PRIORLY_LOADTEST_OUT", "loadtest.json")
USERS = int(os.environ.get("PRIORLY_LOADTEST_USERS", "200"))
MAX_RETRIES = 5

_lock = threading.Lock()
_answer_ms: list[float] = []
_answer_windows: list[tuple[float, float]] = []
_acked = 0
_sessions: list[int] = []
_finished = 0
_errors: list[str] = []


class Respondent(HttpUser):
    """One respondent completing one session."""

    wait_time = constant(0)  # answers are sent back to back (the worst case for the server)

    @task
    def complete_a_session(self) -> None:
        global _acked, _finished
        rng = random.Random(id(self))
        r = self._post(
            f"/api/v1/studies/{STUDY}/sessions",
            {"external_id": f"load-{uuid.uuid4().hex}"},
            {"Authorization": f"Bearer {KEY}"},
            name="create session",
        )
        if r is None:
            self._finish()
            return
        body = r.json()
        token, sid = body["token"], body["session_id"]
        with _lock:
            _sessions.append(sid)
        auth = {"Authorization": f"Bearer {token}"}
        while body.get("question"):
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
                break
            with _lock:
                _acked += 1
                _answer_ms.append(r.elapsed.total_seconds() * 1000)
                _answer_windows.append((start, end))
            body = r.json()
        self._finish()

    def _post(
        self, path: str, payload: dict[str, Any], headers: dict[str, str], *, name: str
    ) -> Any:
        for _attempt in range(MAX_RETRIES):
            with self.client.post(
                path, json=payload, headers=headers, name=name, catch_response=True
            ) as r:
                if 200 <= r.status_code < 300:
                    r.success()
                    return r
                if r.status_code >= 500 or r.status_code == 0:
                    r.failure(f"{r.status_code}: retrying")
                    continue
                r.failure(f"{r.status_code}: {r.text[:200]}")
                with _lock:
                    _errors.append(f"{name} {r.status_code} {r.text[:200]}")
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


@events.quitting.add_listener
def _write_results(environment: Any, **_kw: Any) -> None:
    with _lock:
        ms = sorted(_answer_ms)
        first = min((w[0] for w in _answer_windows), default=0.0)
        last = max((w[1] for w in _answer_windows), default=0.0)
        data = {
            "users": USERS,
            "finished_users": _finished,
            "sessions": sorted(_sessions),
            "answers_acknowledged": _acked,
            "answer_ms": ms,
            "answer_window_s": last - first,
            "errors": _errors[:50],
            "n_errors": len(_errors),
        }
    with open(OUT, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
