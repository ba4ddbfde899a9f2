"""Time the admin dashboard (the page that polls itself every 15 s) on a dataset.

Usage: python scripts/dashboard_bench.py [DATASET_DIR] [--sessions N] [--classes K ...]
       [--runs R]

Imports the dataset (default: the CES demo, ~5,000 imported respondents) into a fresh
SQLite file, opens it for fielding as ``priorly serve`` does for its demo study (targets,
consent, publish, the default belief-model fit unless ``--classes`` names a smaller grid,
the fixed order), then runs ``--sessions`` live respondents through the real answer path
(seeded random answers; every fourth stops half-way, so there is drop-off), and times
:func:`app.services.dashboard.dashboard_page` (every figure and the SVG plots) and the
htmx refresh of the page over HTTP (TestClient, template included), ``--runs`` times
after one warm-up; prints the first call and the medians, in milliseconds, on one torch
thread.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from fastapi.testclient import TestClient
from sqlmodel import Session

from app import session as svc
from app.auth import create_account
from app.db import make_engine, upgrade
from app.main import create_app
from app.services.belief import fit_study_model
from app.services.dashboard import dashboard_page
from app.services.demo import prepare_study_for_fielding
from app.services.importer import import_dataset
from app.settings import Settings
from app.tables import Study

EMAIL, PASSWORD = "bench@example.org", "dashboard bench password"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "dataset", nargs="?", default=str(Path(__file__).parents[1] / "datasets" / "ces")
    )
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--classes", type=int, nargs="*", default=None)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        upgrade(url)
        engine = make_engine(url)
        with Session(engine) as db:
            result = import_dataset(Path(args.dataset), session=db)
            study = db.get(Study, result.study_id)
            assert study is not None
            t0 = time.perf_counter()
            if args.classes:
                fit_study_model(study, session=db, n_classes=args.classes, n_restarts=1)
            prepare_study_for_fielding(study, session=db)
            fit_s = time.perf_counter() - t0
            db.refresh(study)
        for n in range(args.sessions):
            started = svc.start_session(study, engine=engine)
            view = started.view
            stop = 2 if n % 4 == 3 else None
            answered = 0
            while view.phase == "question" and view.question is not None and answered != stop:
                q = view.question
                view = svc.submit_answer(
                    study,
                    started.session_id,
                    item_key=q.key,
                    option=rng.choice(q.options)[0],
                    idempotency_key=f"{n}-{answered}",
                    engine=engine,
                )
                answered += 1
        with Session(engine) as db:
            create_account(EMAIL, PASSWORD, session=db, is_admin=True)
            study = db.get(Study, result.study_id)
            assert study is not None
            times = []
            for _ in range(args.runs + 1):
                t = time.perf_counter()
                ctx = dashboard_page(study, session=db)
                times.append(time.perf_counter() - t)
        settings = Settings(
            database_url=url, env="test", secret_key="b" * 40, queue_path=Path(tmp) / "q.db"
        )
        pages = []
        with TestClient(create_app(settings), base_url="http://localhost") as client:
            client.get("/admin/login")
            form = {"email": EMAIL, "password": PASSWORD}
            form["csrf_token"] = client.cookies.get("priorly_csrf") or ""
            assert client.post("/admin/login", data=form, follow_redirects=False).status_code == 303
            for _ in range(args.runs + 1):
                t = time.perf_counter()
                r = client.get(
                    f"/admin/studies/{study.slug}/dashboard", headers={"HX-Request": "true"}
                )
                pages.append(time.perf_counter() - t)
                assert r.status_code == 200
        dash = ctx["dash"]
        print(
            f"{args.dataset}: {dash.counts['imported']:,} imported, "
            f"{dash.counts['started']} live sessions ({dash.counts['completed']} completed), "
            f"{len(dash.distributions)} items asked live, {len(dash.targets)} targets, "
            f"model fit {fit_s:.0f} s"
        )
        print(
            f"dashboard_page: first {1000 * times[0]:.0f} ms, median of {args.runs} "
            f"{1000 * statistics.median(times[1:]):.0f} ms; the htmx refresh over HTTP "
            f"(TestClient, template included) median {1000 * statistics.median(pages[1:]):.0f} ms"
        )
        engine.dispose()


if __name__ == "__main__":
    main()
