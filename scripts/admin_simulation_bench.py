"""Time the admin UI's simulation job ("how many questions do I need?") on a dataset.

Usage: python scripts/admin_simulation_bench.py [DATASET_DIR] [--budget N]

Imports the dataset into a fresh SQLite file, makes the first benchmark run's held-out
items the targets (as ``priorly serve`` does for its demo study), then runs the simulation
job end to end through the job runner (claim, progress, result) in this process and prints
the wall time and the "questions needed" answer. Default options are the UI's (budget =
the study's max_questions, at most 1000 held-out respondents, K in (8, 16)).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from sqlmodel import Session

from app.db import make_engine, upgrade
from app.jobs.runner import execute_job
from app.services.designer import set_roles
from app.services.importer import import_dataset
from app.tables import Job, Study


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "dataset", nargs="?", default=str(Path(__file__).parents[1] / "datasets" / "ces")
    )
    ap.add_argument("--budget", type=int, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        upgrade(url)
        engine = make_engine(url)
        with Session(engine) as db:
            res = import_dataset(args.dataset, session=db)
            study = db.get(Study, res.study_id)
            assert study is not None
            targets = study.benchmark_runs[0]["eval_qids"] if study.benchmark_runs else []
            set_roles(study, dict.fromkeys(targets, "target"), session=db)
            payload = {} if args.budget is None else {"budget": args.budget}
            job = Job(kind="simulation", study_id=study.id, payload=payload)
            db.add(job)
            db.commit()
            job_id = job.id or 0
        t0 = time.perf_counter()
        status = execute_job(engine, job_id)
        wall = time.perf_counter() - t0
        with Session(engine) as db:
            job = db.get(Job, job_id)
            assert job is not None
            out = {
                "dataset": args.dataset,
                "status": status,
                "error": job.error,
                "wall_seconds": round(wall, 1),
                "n_train": (job.result or {}).get("n_train"),
                "n_test": (job.result or {}).get("n_test"),
                "budget": (job.result or {}).get("budget"),
                "questions_needed": (job.result or {}).get("questions_needed"),
                "accuracy": {
                    k: [round(x, 3) for x in v["accuracy"]]
                    for k, v in ((job.result or {}).get("methods") or {}).items()
                },
            }
        print(json.dumps(out, indent=1))
        engine.dispose()


if __name__ == "__main__":
    main()
