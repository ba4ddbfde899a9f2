"""Driver of ``scripts/loadtest``: prepare a database, serve it, run locust, count the rows.

For each backend: a fresh database (a SQLite file under ``var/loadtest/`` or a new
PostgreSQL database), migrated; the demo dataset imported and prepared exactly as
``priorly serve`` does (targets from its first benchmark run, the default latent class
model, published); an admin researcher with an API key. Then ``uvicorn --workers N``
serves it on loopback and locust (headless) runs ``scripts/loadtest_locustfile.py`` with
``--users`` respondents spawned at once. Afterwards the answers are counted in the
database: every acknowledged answer must be there exactly once, every session must have
``max_questions`` answers, the answered items of a session must be distinct, and each
session's cached state must equal the replay of its answers.

The fitted model is cached in ``var/cache/loadtest/`` (keyed by the training data hash),
so a second run does not refit it.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import create_engine, func, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlmodel import Session, select  # noqa: E402

from app import session as svc  # noqa: E402
from app.db import make_engine, upgrade  # noqa: E402
from app.services.apikeys import create_api_key, create_researcher  # noqa: E402
from app.services.belief import historical_matrix  # noqa: E402
from app.services.demo import prepare_study_for_fielding  # noqa: E402
from app.services.importer import import_dataset  # noqa: E402
from app.settings import normalise_database_url  # noqa: E402
from app.tables import (  # noqa: E402
    Answer,
    ElicitationSession,
    FittedModel,
    Item,
    Respondent,
    SelectionDecision,
    Study,
)

VAR = REPO / "var" / "loadtest"
CACHE = REPO / "var" / "cache" / "loadtest"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fresh_database(backend: str) -> tuple[str, Any]:
    """``(url, drop)``: a fresh database and a callable that removes it."""
    if backend == "sqlite":
        VAR.mkdir(parents=True, exist_ok=True)
        path = VAR / f"loadtest-{secrets.token_hex(4)}.db"

        def drop_file() -> None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)

        return f"sqlite:///{path}", drop_file
    base = make_url(
        normalise_database_url(
            os.environ.get(
                "PRIORLY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
            )
        )
    )
    name = f"priorly_load_{secrets.token_hex(4)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop_db() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return base.set(database=name).render_as_string(hide_password=False), drop_db


def prepare(url: str, dataset: Path, max_questions: int) -> tuple[str, str]:
    """Migrate, import, fit (or reuse the cached fit), publish; returns ``(slug, api key)``."""
    upgrade(url)
    engine = make_engine(url)
    try:
        with Session(engine) as db:
            result = import_dataset(dataset, session=db)
            study = db.exec(select(Study).where(Study.id == result.study_id)).one()
            study.settings = {
                **study.settings,
                "budgets": {**study.settings.get("budgets", {}), "max_questions": max_questions},
            }
            db.add(study)
            db.commit()
            items = list(
                db.exec(
                    select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
                ).all()
            )
            train, val = historical_matrix(study.id or 0, items, session=db)
            import hashlib

            data_hash = hashlib.sha256(
                train.numpy().tobytes()
                + val.numpy().tobytes()
                + repr([i.key for i in items]).encode()
            ).hexdigest()[:16]
            cached = CACHE / f"model-{data_hash}.bin"
            if cached.exists():
                meta = json.loads(cached.with_suffix(".json").read_text())
                db.add(
                    FittedModel(
                        study_id=study.id,  # type: ignore[arg-type]
                        family=meta["family"],
                        blob=cached.read_bytes(),
                        training_hash=meta["training_hash"],
                        metrics=meta["metrics"],
                        is_active=True,
                    )
                )
                db.commit()
                print(f"  reusing the cached fitted model {cached.name}")
            else:
                print("  fitting the default belief model (cached afterwards) ...", flush=True)
            t = time.perf_counter()
            prepare_study_for_fielding(study, session=db)
            if not cached.exists():
                row = db.exec(
                    select(FittedModel).where(
                        FittedModel.study_id == study.id, FittedModel.is_active
                    )  # type: ignore[arg-type]
                ).one()
                CACHE.mkdir(parents=True, exist_ok=True)
                cached.write_bytes(row.blob)
                cached.with_suffix(".json").write_text(
                    json.dumps(
                        {
                            "family": row.family,
                            "training_hash": row.training_hash,
                            "metrics": row.metrics,
                        }
                    )
                )
                print(f"  fitted in {time.perf_counter() - t:.0f} s")
            create_researcher("loadtest@example.org", session=db, is_admin=True)
            key = create_api_key("loadtest@example.org", session=db, name="loadtest").key
            return study.slug, key
    finally:
        engine.dispose()


def serve(
    url: str, workers: int, probe_dir: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``uvicorn --workers N`` on the app (wrapped by ``scripts/loadtest_probe.py``
    when ``probe_dir`` is given: each worker writes its probe figures there)."""
    import httpx

    port = _free_port()
    env = {**os.environ, "PRIORLY_DATABASE_URL": url, "PRIORLY_ENV": "dev"}
    factory = ["app.main:create_app"]
    if probe_dir is not None:
        probe_dir.mkdir(parents=True, exist_ok=True)
        for old in [*probe_dir.glob("worker-*.json"), *probe_dir.glob("worker-*.jsonl")]:
            old.unlink()
        env["PRIORLY_LOADTEST_PROBE_DIR"] = str(probe_dir)
        factory = ["loadtest_probe:create_app", "--app-dir", str(REPO / "scripts")]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            *factory,
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
            "--no-access-log",
            # uvicorn's supervisor kills a worker that does not answer its health ping
            # within 5 s (the ping is answered by a thread that needs the GIL): on a
            # saturated 2-core machine that killed busy workers mid-request.
            "--timeout-worker-healthcheck",
            "60",
        ],
        cwd=REPO,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("uvicorn did not start")
        time.sleep(0.3)


def warm_up(base: str, slug: str, key: str, workers: int) -> None:
    """One session per worker (loads the model into each process before measuring)."""
    import httpx

    for _ in range(workers * 3):
        r = httpx.post(
            f"{base}/api/v1/studies/{slug}/sessions",
            json={},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        r.raise_for_status()


def run_locust(
    base: str,
    slug: str,
    key: str,
    users: int,
    out: Path,
    *,
    think_s: float,
    duration_s: float,
    spawn_rate: float,
) -> subprocess.Popen[bytes]:
    """Start locust headless (the caller waits for it: its CPU is sampled meanwhile)."""
    env = {
        **os.environ,
        "PRIORLY_LOADTEST_STUDY": slug,
        "PRIORLY_LOADTEST_KEY": key,
        "PRIORLY_LOADTEST_OUT": str(out),
        "PRIORLY_LOADTEST_USERS": str(users),
        "PRIORLY_LOADTEST_THINK_S": str(think_s),
        "PRIORLY_LOADTEST_DURATION_S": str(duration_s),
    }
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(REPO / "scripts" / "loadtest_locustfile.py"),
        "--headless",
        "--host",
        base,
        "--users",
        str(users),
        "--spawn-rate",
        str(spawn_rate),
        "--run-time",
        f"{int(max(600, duration_s + 300))}s",
        "--stop-timeout",
        "60",
        "--loglevel",
        "WARNING",
        "--only-summary",
    ]
    return subprocess.Popen(cmd, env=env, cwd=REPO)


# ----- resource accounting (Linux /proc) --------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


def _processes(matches: Any) -> list[int]:
    """Processes whose command line (``\0``-separated, as in /proc) ``matches(title)``."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                title = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        if matches(title):
            out.append(int(d))
    return out


def _postgres_backends(database: str) -> list[int]:
    """PostgreSQL backend processes connected to ``database`` (by their process title)."""
    return _processes(lambda t: t.startswith("postgres: ") and f" {database} " in t)


def _redis_servers() -> list[int]:
    """``redis-server`` processes (their CPU is the rate limiter's when ``--redis-url``)."""
    return _processes(lambda t: t.split("\0", 1)[0].split("/")[-1].startswith("redis-server"))


class ResourceSampler:
    """Samples, once a second, the CPU seconds of the app workers, of PostgreSQL's backends
    for the test database and of the load generator, and the workers' resident memory."""

    def __init__(self, server_pid: int, database: str | None, redis: bool = False) -> None:
        self.server_pid = server_pid
        self.database = database
        self.redis = redis
        self.generator_pid: int | None = None
        groups = ["workers", "postgres", "generator"] + (["redis"] if redis else [])
        self.cpu: dict[str, dict[int, float]] = {g: {} for g in groups}
        self.start_cpu: dict[str, dict[int, float]] = {g: {} for g in groups}
        self.rss_max: dict[int, float] = {}
        self.rss_last: dict[int, float] = {}
        self._stop = False
        import threading

        self._thread = threading.Thread(target=self._run, daemon=True)

    def _groups(self) -> dict[str, list[int]]:
        workers = [self.server_pid, *_children(self.server_pid)]
        return {
            "workers": workers,
            "postgres": _postgres_backends(self.database) if self.database else [],
            "generator": [self.generator_pid, *_children(self.generator_pid)]
            if self.generator_pid
            else [],
            **({"redis": _redis_servers()} if self.redis else {}),
        }

    def sample(self) -> None:
        for group, pids in self._groups().items():
            for pid in pids:
                cpu = _cpu_s(pid)
                self.start_cpu[group].setdefault(pid, cpu)
                self.cpu[group][pid] = max(cpu, self.cpu[group].get(pid, 0.0))
        for pid in _children(self.server_pid):
            rss = _rss_mib(pid)
            self.rss_last[pid] = rss
            self.rss_max[pid] = max(rss, self.rss_max.get(pid, 0.0))

    def _run(self) -> None:
        while not self._stop:
            self.sample()
            time.sleep(1.0)

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._thread.join()
        self.sample()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used per group since :meth:`start` (processes seen at any sample)."""
        return {
            g: sum(self.cpu[g][p] - self.start_cpu[g].get(p, 0.0) for p in self.cpu[g])
            for g in self.cpu
        }


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop uvicorn and its workers: SIGTERM, then SIGKILL of every worker and the
    supervisor after 30 s (a graceful shutdown can wait on open client connections
    forever; a server left running kept 48 PostgreSQL connections)."""
    workers = _children(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        for pid in workers:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait(timeout=30)


def _timing_lock(path: Path | None) -> Any:
    """An open file holding an exclusive flock on ``path`` (``None`` without a path)."""
    if path is None:
        return None
    import fcntl

    fh = open(path, "a")  # noqa: SIM115 (closed by the caller, which releases the lock)
    print(f"  waiting for the timing lock {path} ...", flush=True)
    fcntl.flock(fh, fcntl.LOCK_EX)
    print(f"  timing lock taken; load average {os.getloadavg()}", flush=True)
    return fh


def pin_workers(server_pid: int) -> dict[int, int]:
    """Pin each uvicorn worker process to its own core (``taskset``); ``{pid: core}``."""
    cores = sorted(os.sched_getaffinity(0))
    pinned = {}
    # ``--workers 1``: uvicorn serves from the one process (no supervisor, no children)
    workers = [p for p in _children(server_pid) if _rss_mib(p) > 100] or [server_pid]
    for i, pid in enumerate(sorted(workers)):
        core = cores[i % len(cores)]
        os.sched_setaffinity(pid, {core})
        pinned[pid] = core
    return pinned


def verify(url: str, results: dict[str, Any], max_questions: int) -> dict[str, Any]:
    """Count the answers of the load-test sessions in the database."""
    engine = make_engine(url)
    try:
        with Session(engine) as db:
            sids = results["sessions"]
            per_session = dict(
                db.exec(
                    select(Answer.session_id, func.count())
                    .where(Answer.session_id.in_(sids))  # type: ignore[attr-defined]
                    .group_by(Answer.session_id)
                ).all()
            )
            distinct_items = dict(
                db.exec(
                    select(Answer.session_id, func.count(func.distinct(Answer.item_id)))
                    .where(Answer.session_id.in_(sids))  # type: ignore[attr-defined]
                    .group_by(Answer.session_id)
                ).all()
            )
            decisions = dict(
                db.exec(
                    select(SelectionDecision.session_id, func.count())
                    .where(SelectionDecision.session_id.in_(sids))  # type: ignore[attr-defined]
                    .group_by(SelectionDecision.session_id)
                ).all()
            )
            total = sum(per_session.values())
            completed = db.exec(
                select(func.count())
                .select_from(ElicitationSession)
                .where(ElicitationSession.id.in_(sids), ElicitationSession.status == "completed")  # type: ignore[union-attr]
            ).one()
            # cached state == replay, checked on a sample of sessions
            study = db.exec(select(Study)).first()
            assert study is not None
            rt = svc.load_runtime(study, session=db, fit_if_missing=False)
            mismatched = 0
            for sid in sids[:: max(1, len(sids) // 20)]:
                sess = db.get(ElicitationSession, sid)
                assert sess is not None
                resp = db.get(Respondent, sess.respondent_id)
                answers = db.exec(
                    select(Answer).where(Answer.session_id == sid).order_by(Answer.id)
                ).all()  # type: ignore[arg-type]
                if not svc.states_equal(svc.load_state(sess.state), svc.replay(rt, resp, answers)):  # type: ignore[arg-type]
                    mismatched += 1
    finally:
        engine.dispose()
    return {
        "answers_in_db": total,
        "answers_acknowledged": results["answers_acknowledged"],
        "lost": max(0, results["answers_acknowledged"] - total),
        "sessions_not_max_questions": sum(
            1 for s in sids if per_session.get(s, 0) != max_questions
        ),
        "sessions_with_repeated_item": sum(
            1 for s in sids if distinct_items.get(s, 0) != per_session.get(s, 0)
        ),
        "sessions_completed": int(completed),
        "sessions_decisions_not_answers_plus_1": sum(
            1 for s in sids if decisions.get(s, 0) != per_session.get(s, 0) + 1
        ),
        "state_replay_mismatches": mismatched,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--dataset", type=Path, default=REPO / "datasets" / "ces")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "loadtest")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument(
        "--think-time",
        type=float,
        default=0.0,
        help="mean seconds a respondent takes between answers (0: back to back, closed loop)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=0.0,
        help="seconds to keep every user starting new sessions (0: one session per user)",
    )
    parser.add_argument(
        "--spawn-rate", type=float, default=0.0, help="users started per second (0: all at once)"
    )
    parser.add_argument(
        "--pin", action="store_true", help="pin each uvicorn worker to its own core (taskset)"
    )
    parser.add_argument(
        "--timing-lock",
        type=Path,
        default=None,
        help="hold flock(2) on this file while serving and measuring (not while preparing), "
        "so that timing runs on a shared machine do not overlap",
    )
    parser.add_argument(
        "--redis-url",
        default=None,
        help="serve with PRIORLY_REDIS_URL set to this (the API rate limiter then counts in "
        "Redis, as in a several-machine deployment); its CPU is reported as 'redis'",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="measure inside the server too (scripts/loadtest_probe.py): server-side latency "
        "of the answer call, event-loop lag, GC pauses, answers served in the event loop",
    )
    args = parser.parse_args()
    if args.redis_url:
        os.environ["PRIORLY_REDIS_URL"] = args.redis_url  # inherited by uvicorn's workers
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    for backend in args.backends.split(","):
        print(
            f"== {backend}: {args.users} respondents x {args.questions} questions, "
            f"{args.workers} uvicorn workers, think time {args.think_time} s, "
            f"duration {args.duration or 'one session each'}",
            flush=True,
        )
        url, drop = _fresh_database(backend)
        proc = None
        lock = None
        try:
            slug, key = prepare(url, args.dataset, args.questions)
            lock = _timing_lock(args.timing_lock)
            probe_dir = args.out / f"{backend}-probe" if args.probe else None
            proc, base = serve(url, args.workers, probe_dir)
            pinned = pin_workers(proc.pid) if args.pin else {}
            warm_up(base, slug, key, args.workers)
            raw = args.out / f"{backend}-raw.json"
            database = make_url(url).database if backend != "sqlite" else None
            sampler = ResourceSampler(proc.pid, database, redis=bool(args.redis_url))
            load_before = os.getloadavg()
            sampler.start()
            gen = run_locust(
                base,
                slug,
                key,
                args.users,
                raw,
                think_s=args.think_time,
                duration_s=args.duration,
                spawn_rate=args.spawn_rate or args.users,
            )
            sampler.generator_pid = gen.pid
            gen.wait()
            sampler.stop()
            load_after = os.getloadavg()
            results = json.loads(raw.read_text())
            ms = results["answer_ms"]
            q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else [0] * 99
            cpu = sampler.cpu_seconds()
            n_ans = max(1, len(ms))
            figures = {
                "answers": len(ms),
                "answers_per_s": len(ms) / results["answer_window_s"]
                if results["answer_window_s"]
                else 0,
                "p50_ms": q[49],
                "p99_ms": q[98],
                "max_ms": max(ms) if ms else 0,
                "client_errors": results["n_errors"],
                "finished_users": results["finished_users"],
                "users": args.users,
                "workers": args.workers,
                "redis_url": args.redis_url,
                "think_time_s": args.think_time,
                "duration_s": args.duration,
                "answer_window_s": results["answer_window_s"],
                "p90_ms": q[89],
                "p95_ms": q[94],
                "client_retries": results.get("retries", 0),
                "sessions": len(results["sessions"]),
                "cpu_s": cpu,
                "cpu_ms_per_answer": {g: 1000 * v / n_ans for g, v in cpu.items()},
                "worker_rss_mib_max": {str(p): round(v, 1) for p, v in sampler.rss_max.items()},
                "worker_rss_mib_end": {str(p): round(v, 1) for p, v in sampler.rss_last.items()},
                "pinned": {str(p): c for p, c in pinned.items()},
                "generator_loop_lag_ms": results.get("generator_loop_lag_ms"),
                "generator_gc_ms": results.get("generator_gc_ms"),
                "loadavg_before": load_before,
                "loadavg_after": load_after,
                **verify(url, results, args.questions),
            }
            summary[backend] = figures
            print(json.dumps({k: v for k, v in figures.items()}, indent=2), flush=True)
        finally:
            try:
                if proc is not None:
                    stop_server(proc)
            finally:
                if lock is not None:
                    lock.close()  # releases the flock
                if not args.keep:
                    drop()
    if args.probe:  # the workers write their last probe figures when they stop
        sys.path.insert(0, str(REPO / "scripts"))
        from loadtest_probe import summarise

        for backend, figures in summary.items():
            figures["server_probe"] = summarise(str(args.out / f"{backend}-probe"))
            print(backend, "server probe:", json.dumps(figures["server_probe"]), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"summary written to {args.out / 'summary.json'}")
    ok = all(
        f["lost"] == 0
        and f["sessions_not_max_questions"] == 0
        and f["sessions_with_repeated_item"] == 0
        and f["state_replay_mismatches"] == 0
        and f["sessions_decisions_not_answers_plus_1"] == 0
        and f["answers_in_db"] == f["answers_acknowledged"]
        for f in summary.values()
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
