"""Real servers, a real answer flood and the database invariants of issue 8 (items 3 and 4).

Pieces shared by ``test_concurrency.py`` and ``test_crash_recovery.py``:

* :class:`UvicornServer`: ``uvicorn --workers N`` as a subprocess in its own process group,
  so ``kill -9`` of the group takes the supervisor and every worker process at once (as a
  machine losing power would); readiness is polled on ``/healthz`` with a deadline.
* :func:`flood`: many concurrent asyncio + httpx clients answering the same sessions
  through the JSON API, with retries (same idempotency key, same body), duplicates (the
  same question posted by several "tabs" of one session with their own keys, with the same
  or a conflicting option) and an optional stop event (the crash). A 503 of a server
  shedding load is retried unchanged (as the API tells clients to). Every request and its
  outcome is recorded in :class:`FloodLog`.
* :func:`check_sessions`: what must hold in the database afterwards: every acknowledged
  answer is stored exactly once with its option; no question is asked twice; decisions
  are one per position and agree with the answers; the cached state equals the replay of
  the stored answers; every stored next question is the one the replayed state selects.
* :func:`check_acknowledged`: every acknowledged answer is stored, the reply's next step
  is the stored one, and only the request that stored an answer got a fresh reply.

Nothing here sleeps to synchronise: waits poll an observable condition with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app import session as svc
from app.session import decide as session_decide
from app.tables import ElicitationSession, Respondent, SelectionDecision, Study
from tests.support.live_study import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_QUESTIONS = 5
"""Questions per session (the served study's budget): 20 sessions x 5 = 100 answers."""
ALLOWED_409 = {"answer_conflict", "not_current_question", "session_closed"}
"""The conflicts a racing client may legitimately get (a tab that lost the race)."""


def poll_until(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Return ``cond()``'s first truthy value; AssertionError after ``timeout`` seconds.

    ``every`` is the polling interval of the condition, not a synchronisation sleep.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid`` (read from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # fields after the command name (which may contain spaces): state ppid pgrp ...
        rest = stat[stat.rfind(")") + 2 :].split()
        if int(rest[2]) == pgid and rest[0] != "Z":
            out.append(int(entry))
    return out


class _ProcessGroup:
    """A subprocess started with ``start_new_session=True`` (its own process group)."""

    proc: subprocess.Popen[bytes] | None
    log_path: Path

    def kill9(self) -> int:
        """SIGKILL the whole process group; wait until none of its processes is left.

        Returns the number of processes that were killed.
        """
        assert self.proc is not None
        pgid = self.proc.pid
        n = len(group_pids(pgid))
        os.killpg(pgid, signal.SIGKILL)
        self.proc.wait(30)
        poll_until(lambda: not group_pids(pgid), 30, "every process of the group to die")
        self.proc = None
        return n

    def stop(self) -> None:
        """Terminate the group (SIGTERM, then SIGKILL after a grace period)."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            pass
        if group_pids(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(30)
        self.proc = None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class UvicornServer(_ProcessGroup):
    """``python -m uvicorn app.main:create_app --factory --workers N`` on ``db_url``.

    The process is started in a new session (its own process group), so :meth:`kill9`
    sends SIGKILL to the supervisor and all its workers together and stops nothing else.
    """

    def __init__(
        self,
        db_url: str,
        log_path: Path,
        *,
        workers: int = 2,
        port: int = 0,
        app: str = "app.main:create_app",
    ) -> None:
        self.app = app
        self.db_url = db_url
        self.log_path = log_path
        self.workers = workers
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> float:
        """Start and wait until ``/healthz`` answers 200 and all workers run; returns seconds."""
        env = {
            **os.environ,
            "PRIORLY_DATABASE_URL": self.db_url,
            "PRIORLY_ENV": "dev",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    self.app,
                    "--factory",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--workers",
                    str(self.workers),
                    "--log-level",
                    "warning",
                    "--timeout-graceful-shutdown",
                    "5",
                ],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"uvicorn exited with {proc.returncode}:\n{self.log_tail()}")
            # the supervisor plus its workers (multiprocessing may add a resource tracker)
            if len(group_pids(proc.pid)) < self.workers + 1:
                return False
            try:
                return httpx.get(f"{self.base_url}/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            poll_until(ready, timeout, "uvicorn to answer /healthz", every=0.1)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; processes in its group: {len(group_pids(proc.pid))}; "
                f"log:\n{self.log_tail()}"
            ) from None
        return time.monotonic() - t0


class JobWorker(_ProcessGroup):
    """``priorly worker`` (the Huey consumer and its reaper) as a subprocess in its own
    process group, on ``db_url`` with the SQLite queue file ``queue_path``."""

    def __init__(self, db_url: str, queue_path: Path, log_path: Path) -> None:
        self.db_url = db_url
        self.queue_path = queue_path
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> JobWorker:
        env = {
            **os.environ,
            "PRIORLY_DATABASE_URL": self.db_url,
            "PRIORLY_QUEUE_PATH": str(self.queue_path),
            "PRIORLY_ENV": "test",
            "PRIORLY_SECRET_KEY": "t" * 40,
            "PRIORLY_JOB_STALE_AFTER_S": "30",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "worker"],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self


# ----- the flood -------------------------------------------------------------------------


@dataclass(frozen=True)
class Posted:
    """One POST of an answer and what came back (``status`` 0: no response: transport error)."""

    session_id: int
    client: int
    item: str
    option: str | None
    key: str
    status: int
    body: dict[str, Any] | None
    retry: bool


@dataclass
class FloodLog:
    """Every answer request of a flood and the unexpected responses."""

    posts: list[Posted] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    gets: int = 0
    shed: int = 0
    """503 ``database_unavailable`` answers (the server shedding load), each retried."""
    transport: list[str] = field(default_factory=list)
    """Transport errors that were retried (exception type names)."""
    retry_transport: bool = True
    """Whether a broken connection is retried (False while waiting for a crash)."""

    def acked(self) -> list[Posted]:
        return [p for p in self.posts if 200 <= p.status < 300]

    def in_flight(self) -> list[Posted]:
        """Requests without a response (the connection broke, e.g. at the crash)."""
        return [p for p in self.posts if p.status == 0]

    def counts(self) -> dict[str, int]:
        c = Counter(
            "2xx" if 200 <= p.status < 300 else str(p.status) if p.status else "no_response"
            for p in self.posts
        )
        c409 = Counter((p.body or {}).get("code", "?") for p in self.posts if p.status == 409)
        return {
            "posts": len(self.posts),
            "retries": sum(p.retry for p in self.posts),
            "gets": self.gets,
            "503_shed_and_retried": self.shed,
            "transport_errors_retried": len(self.transport),
            **{f"transport_{k}": v for k, v in Counter(self.transport).items()},
            **dict(c),
            **{f"409_{k}": v for k, v in c409.items()},
            "unexpected": len(self.unexpected),
        }


@dataclass(frozen=True)
class Live:
    """A session made for the flood: id and token."""

    session_id: int
    token: str


def create_sessions(base_url: str, slug: str, api_key: str, n: int) -> list[Live]:
    """Create ``n`` sessions through the API (as another product would)."""
    out = []
    with httpx.Client(base_url=base_url, timeout=120) as c:
        for _ in range(n):
            r = c.post(
                f"/api/v1/studies/{slug}/sessions",
                json={},
                headers={"Authorization": f"Bearer {api_key}"},
            )
            assert r.status_code == 201, r.text
            out.append(Live(r.json()["session_id"], r.json()["token"]))
    return out


TRANSPORT_ERRORS = (httpx.TransportError,)
OVERLOAD_RETRIES = 12
TRANSPORT_RETRIES = 3


async def _send(
    http: httpx.AsyncClient, method: str, url: str, log: FloodLog, **kw: Any
) -> httpx.Response:
    """One request; a broken connection (e.g. a keep-alive connection the server closed
    just as the client reused it) is retried unchanged when ``log.retry_transport``; the
    idempotency key makes that safe for an answer that was stored before the break."""
    for attempt in range(TRANSPORT_RETRIES + 1):
        try:
            return await http.request(method, url, **kw)
        except TRANSPORT_ERRORS as exc:
            if not log.retry_transport or attempt == TRANSPORT_RETRIES:
                raise
            log.transport.append(type(exc).__name__)
    raise AssertionError("unreachable")


async def _request(
    http: httpx.AsyncClient, method: str, url: str, log: FloodLog, **kw: Any
) -> httpx.Response:
    """Send a request; a 503 ``database_unavailable`` (the server shedding load: nothing was
    acknowledged) is sent again, unchanged, after a client back-off of 0.1 * 2^k s (at
    most 2 s), as the API documents. Other responses are returned as they are."""
    resp = await _send(http, method, url, log, **kw)
    for attempt in range(OVERLOAD_RETRIES):
        if resp.status_code != 503 or _code(resp) != "database_unavailable":
            return resp
        log.shed += 1
        await asyncio.sleep(min(2.0, 0.1 * 2**attempt))  # the client's retry policy
        resp = await _send(http, method, url, log, **kw)
    return resp


def _code(resp: httpx.Response) -> str | None:
    try:
        body = resp.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None


async def _client(
    http: httpx.AsyncClient,
    live: Live,
    client_id: int,
    rng: random.Random,
    log: FloodLog,
    stop: threading.Event,
    retry_p: float,
    max_steps: int,
) -> None:
    """One client: read the current question, answer it (sometimes twice), until done.

    Several clients share a session: they act as tabs that race on the same question with
    their own idempotency keys and their own (random) options. With probability
    ``retry_p`` a client sends its request again with the same key and body (a retry after
    a lost response); both answers must be the same. A transport error (the server died)
    ends the client; its request is recorded with status 0.
    """
    headers = {"Authorization": f"Bearer {live.token}"}
    url = f"/api/v1/sessions/{live.session_id}"
    for step in range(max_steps):
        if stop.is_set():
            return
        try:
            r = await _request(http, "GET", url, log, headers=headers)
        except TRANSPORT_ERRORS:
            return
        log.gets += 1
        if r.status_code != 200:
            log.unexpected.append(f"GET {url}: {r.status_code} {r.text[:200]}")
            return
        view = r.json()
        if view["phase"] == "done" or view["question"] is None:
            return
        q = view["question"]
        option = rng.choice([o["letter"] for o in q["options"]])
        key = f"s{live.session_id}-c{client_id}-{step}"
        body = {"item": q["item"], "option": option, "idempotency_key": key}
        first: dict[str, Any] | None = None
        for attempt in range(2 if rng.random() < retry_p else 1):
            if stop.is_set() and attempt:
                return
            try:
                resp = await _request(
                    http, "POST", f"{url}/answers", log, json=body, headers=headers
                )
            except TRANSPORT_ERRORS:
                log.posts.append(
                    Posted(live.session_id, client_id, q["item"], option, key, 0, None, attempt > 0)
                )
                return
            data = (
                resp.json()
                if resp.headers.get("content-type", "").startswith("application/json")
                else None
            )
            log.posts.append(
                Posted(
                    live.session_id,
                    client_id,
                    q["item"],
                    option,
                    key,
                    resp.status_code,
                    data,
                    attempt > 0,
                )
            )
            ok = 200 <= resp.status_code < 300
            if not ok and not (resp.status_code == 409 and (data or {}).get("code") in ALLOWED_409):
                log.unexpected.append(
                    f"POST {url}/answers {body}: {resp.status_code} {resp.text[:300]}"
                )
            if attempt == 0:
                first = data if ok else None
            elif first is not None and data != {**first, "replayed": True}:
                log.unexpected.append(
                    f"retry with key {key!r} answered {data} but the first request {first} "
                    f"(a retry is the first reply, replayed)"
                )
            if ok and (data or {}).get("replayed") != (
                resp.headers.get("Idempotent-Replayed") == "true"
            ):
                log.unexpected.append(
                    f"POST {url}/answers {body}: replayed {(data or {}).get('replayed')!r} "
                    f"but header Idempotent-Replayed {resp.headers.get('Idempotent-Replayed')!r}"
                )


def flood(
    base_url: str,
    sessions: list[Live],
    *,
    clients: int,
    seed: int,
    retry_p: float = 0.3,
    stop: threading.Event | None = None,
    on_ack: Callable[[FloodLog], None] | None = None,
    max_steps: int = 200,
    timeout: float = 120.0,
    retry_transport: bool = True,
) -> FloodLog:
    """Run ``clients`` concurrent clients (client ``c`` on session ``c % len(sessions)``).

    Args:
        stop: when set, clients stop after their request in flight.
        on_ack: called (in the event loop) after every response; the crash test kills the
            server from here once enough answers were acknowledged.
        retry_transport: retry a request whose connection broke (off in the crash test,
            where a broken connection means the server is dead and ends the client).
    """
    log = FloodLog(retry_transport=retry_transport)
    stop = stop or threading.Event()
    rng = random.Random(seed)

    async def main() -> None:
        limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients)

        class Hooked(httpx.AsyncClient):
            async def send(self, *a: Any, **k: Any) -> httpx.Response:
                resp = await super().send(*a, **k)
                if on_ack is not None:
                    on_ack(log)
                return resp

        async with Hooked(base_url=base_url, timeout=timeout, limits=limits) as http:
            await asyncio.gather(
                *(
                    _client(
                        http,
                        sessions[c % len(sessions)],
                        c,
                        random.Random(rng.random()),
                        log,
                        stop,
                        retry_p,
                        max_steps,
                    )
                    for c in range(clients)
                )
            )

    asyncio.run(main())
    return log


# ----- the invariants -----------------------------------------------------------------------


@dataclass
class SessionCheck:
    """Per-session findings of :func:`check_sessions` (empty ``problems`` = all good)."""

    answers: int = 0
    completed: int = 0
    replayed_decisions: int = 0
    problems: list[str] = field(default_factory=list)


def check_sessions(engine: Engine, study_id: int, session_ids: list[int]) -> SessionCheck:
    """Check every invariant of the answer path on the stored rows of ``session_ids``.

    For each session, with answers ``a_0..a_{n-1}`` (in id order) and decisions
    ``d_0..d_m`` (by position):

    * items of the answers are distinct, idempotency keys are distinct;
    * ``m == n`` and positions are ``0..n``; ``d_k.item == a_k.item`` for ``k < n``;
      the items of the decisions are distinct (no question asked twice);
    * ``d_n.item`` is None exactly when the session is completed;
    * ``state_version == n`` and the cached state equals the replay of the answers;
    * for each ``k``, replaying ``a_0..a_{k-1}`` and running the selection step again
      gives ``d_k``: the stored choice scores within ``1e-9`` of the best replayed score
      (a tolerance only for summation order across processes) and the stop reason agrees.
    """
    out = SessionCheck()
    with Session(engine) as db:
        study = db.get(Study, study_id)
        assert study is not None
        rt = svc.load_runtime(study, session=db, fit_if_missing=False)
        for sid in session_ids:
            sess = db.get(ElicitationSession, sid)
            if sess is None:
                out.problems.append(f"session {sid}: missing")
                continue
            answers = svc.answers_of(db, sid)
            decisions = list(
                db.exec(
                    select(SelectionDecision)
                    .where(SelectionDecision.session_id == sid)
                    .order_by(SelectionDecision.position)  # type: ignore[arg-type]
                ).all()
            )
            respondent = db.get(Respondent, sess.respondent_id)
            assert respondent is not None
            n = len(answers)
            out.answers += n
            p = out.problems
            items = [a.item_id for a in answers]
            if len(set(items)) != n:
                p.append(f"session {sid}: an item answered twice: {items}")
            keys = [a.idempotency_key for a in answers if a.idempotency_key is not None]
            if len(set(keys)) != len(keys):
                p.append(f"session {sid}: an idempotency key stored twice")
            positions = [d.position for d in decisions]
            if positions != list(range(n + 1)):
                p.append(f"session {sid}: decision positions {positions} for {n} answers")
                continue
            for k in range(n):
                if decisions[k].item_id != answers[k].item_id:
                    p.append(
                        f"session {sid}: answer {k} is item {answers[k].item_id} but decision "
                        f"{k} asked {decisions[k].item_id}"
                    )
            asked = [d.item_id for d in decisions if d.item_id is not None]
            if len(set(asked)) != len(asked):
                p.append(f"session {sid}: a question asked twice: {asked}")
            done = decisions[n].item_id is None
            if done != (sess.status == "completed"):
                p.append(f"session {sid}: status {sess.status} but last decision {decisions[n]}")
            out.completed += int(done)
            if sess.state_version != n or sess.state is None:
                p.append(f"session {sid}: state_version {sess.state_version} for {n} answers")
            elif not svc.states_equal(
                svc.load_state(sess.state), svc.replay(rt, respondent, answers)
            ):
                p.append(f"session {sid}: cached state differs from the replay")
            for k in range(n + 1):
                state = svc.replay(rt, respondent, answers[:k])
                again = session_decide.decide_next(rt, state, sid, answers[:k])
                stored = decisions[k]
                out.replayed_decisions += 1
                if (again.item_id is None) != (stored.item_id is None) or (
                    again.stop_reason != stored.stop_reason
                ):
                    p.append(
                        f"session {sid}: decision {k} stored {stored.item_id}/"
                        f"{stored.stop_reason}, replay gives {again.item_id}/{again.stop_reason}"
                    )
                    continue
                if stored.item_id is None:
                    continue
                if stored.criterion == session_decide.CALIBRATION:
                    # a calibration pick is drawn, not scored: the replay draws the same
                    if again.item_id != stored.item_id:
                        p.append(
                            f"session {sid}: calibration decision {k} stored "
                            f"{stored.item_id}, replay gives {again.item_id}"
                        )
                    continue
                scores = (again.scores or {}).get("scores", {})
                key = rt.by_id[stored.item_id].key
                best = max(scores.values())
                if key not in scores or scores[key] < best - 1e-9 * (1 + abs(best)):
                    p.append(
                        f"session {sid}: decision {k} asked {key!r} (replayed score "
                        f"{scores.get(key)}) but the replay's best is {best}"
                    )
    return out


def check_acknowledged(engine: Engine, log: FloodLog) -> tuple[int, list[str]]:
    """Every acknowledged answer is stored exactly once with its option, what each
    acknowledged response returned as the next step is what the database holds, and the
    acknowledgements of one stored answer are at most one fresh reply (``replayed``
    false: the request that stored the row, with its idempotency key), all others replays
    (another tab's same answer, a retry).

    Returns ``(number of distinct acknowledged (session, item) answers, problems)``.
    """
    from app.tables import Answer, Item

    problems: list[str] = []
    acked = log.acked()
    with Session(engine) as db:
        ids = sorted({p.session_id for p in log.posts})
        rows = db.exec(
            select(Answer, Item.key)
            .join(Item, Item.id == Answer.item_id)  # type: ignore[arg-type]
            .where(Answer.session_id.in_(ids))  # type: ignore[attr-defined]
            .order_by(Answer.id)  # type: ignore[arg-type]
        ).all()
        stored: dict[tuple[int, str], list[tuple[Any, int]]] = {}
        position: dict[int, int] = Counter()
        for a, key in rows:
            stored.setdefault((a.session_id, key), []).append((a, position[a.session_id]))
            position[a.session_id] += 1
        decisions = {
            (d.session_id, d.position): d
            for d in db.exec(
                select(SelectionDecision).where(SelectionDecision.session_id.in_(ids))  # type: ignore[attr-defined]
            ).all()
        }
        keys_of = {it.id: it.key for it in db.exec(select(Item)).all()}
    fresh: Counter[tuple[int, str]] = Counter()
    for p in acked:
        found = stored.get((p.session_id, p.item), [])
        if len(found) != 1:
            problems.append(f"acknowledged {p} is stored {len(found)} times")
            continue
        row, pos = found[0]
        if row.option != p.option:
            problems.append(f"acknowledged {p} but the stored option is {row.option!r}")
            continue
        body = p.body or {}
        if body.get("replayed") is not True:
            fresh[(p.session_id, p.item)] += 1
            if body.get("replayed") is not False or row.idempotency_key != p.key:
                problems.append(
                    f"acknowledged {p.key} with replayed {body.get('replayed')!r}, but the "
                    f"stored answer has the key {row.idempotency_key!r}"
                )
            elif fresh[(p.session_id, p.item)] > 1:
                problems.append(f"acknowledged {p.key}: a second fresh reply for {p.item!r}")
        nxt = decisions.get((p.session_id, pos + 1))
        want = None if nxt is None or nxt.item_id is None else keys_of[nxt.item_id]
        got = (body.get("question") or {}).get("item")
        if got != want or body.get("questions_answered") != pos + 1:
            problems.append(
                f"acknowledged {p.key}: response says next {got!r} after "
                f"{body.get('questions_answered')}, database has {want!r} after {pos + 1}"
            )
    return len({(p.session_id, p.item) for p in acked}), problems
