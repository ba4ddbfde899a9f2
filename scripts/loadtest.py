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

from app.db import make_engine, upgrade  # noqa: E402
from app.services import sessions as svc  # noqa: E402
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


def serve(url: str, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = _free_port()
    env = {**os.environ, "PRIORLY_DATABASE_URL": url, "PRIORLY_ENV": "dev"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app.main:create_app",
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
        ],
        cwd=REPO,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
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


def run_locust(base: str, slug: str, key: str, users: int, out: Path) -> None:
    env = {
        **os.environ,
        "PRIORLY_LOADTEST_STUDY": slug,
        "PRIORLY_LOADTEST_KEY": key,
        "PRIORLY_LOADTEST_OUT": str(out),
        "PRIORLY_LOADTEST_USERS": str(users),
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
        str(users),
        "--run-time",
        "600s",
        "--stop-timeout",
        "30",
        "--loglevel",
        "WARNING",
        "--only-summary",
    ]
    subprocess.run(cmd, env=env, cwd=REPO, check=False)


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
                if not svc.states_equal(svc._load_state(sess.state), svc.replay(rt, resp, answers)):  # type: ignore[arg-type]
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
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    for backend in args.backends.split(","):
        print(
            f"== {backend}: {args.users} respondents x {args.questions} questions, "
            f"{args.workers} uvicorn workers",
            flush=True,
        )
        url, drop = _fresh_database(backend)
        proc = None
        try:
            slug, key = prepare(url, args.dataset, args.questions)
            proc, base = serve(url, args.workers)
            warm_up(base, slug, key, args.workers)
            raw = args.out / f"{backend}-raw.json"
            run_locust(base, slug, key, args.users, raw)
            results = json.loads(raw.read_text())
            ms = results["answer_ms"]
            q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else [0] * 99
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
                **verify(url, results, args.questions),
            }
            summary[backend] = figures
            print(json.dumps(figures, indent=2), flush=True)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
            if not args.keep:
                drop()
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"summary written to {args.out / 'summary.json'}")
    ok = all(
        f["lost"] == 0
        and f["sessions_not_max_questions"] == 0
        and f["sessions_with_repeated_item"] == 0
        and f["state_replay_mismatches"] == 0
        and f["answers_in_db"] == f["answers_acknowledged"]
        for f in summary.values()
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
