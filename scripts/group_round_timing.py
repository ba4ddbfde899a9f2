"""Time opening, tracking and closing one large group round on a fresh SQLite database.

Usage: python scripts/group_round_timing.py [DATASET_DIR] [--members 2000] [--answered 1000]

Imports the dataset, fits latent classes (K = 2, one restart: the model only has to
exist), publishes the study and stores a finished round plan that asks the first candidate
question of the first ``--members`` imported respondents (the planner itself is timed by
``priorly bench group-speed``). Then times, through the product's own functions:
``open_round`` (sessions, decisions, memberships, one transaction), ``round_view`` (the
track table's rows), the round page's refresh (``round_page`` and its ``track`` block, what
htmx swaps in every 2 s once an answer arrived; its size in bytes), and ``close_round`` after ``--answered`` members have an answer
(outcomes, abandoned sessions, and each answered session stopped after its question).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from sqlmodel import Session, col, select

from app.db import make_engine, upgrade
from app.services import group_rounds, group_views, round_tracking
from app.services.belief import fit_study_model
from app.services.importer import import_dataset
from app.session import load_runtime
from app.tables import Answer, GroupRoundMember, Job, Respondent, Study
from app.templating import make_templates

SECRET = "timing-secret-" * 3


def _time_partial(study: Study, number: int, db: Session) -> tuple[float, int]:
    """Seconds and bytes of one refresh of round ``number``'s page: the page's context
    (:func:`app.services.group_views.round_page`) and its ``track`` block rendered."""
    from jinja2_fragments import render_block

    env = make_templates().env
    t0 = time.perf_counter()
    ctx = group_views.round_page(study, number, session=db, secret=SECRET, link_base="/g/")
    html = render_block(env, "admin/group_round.html", "track", csrf_token="x", **ctx)
    return time.perf_counter() - t0, len(html.encode())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "dataset", nargs="?", default=str(Path(__file__).parents[1] / "datasets" / "ces")
    )
    ap.add_argument("--members", type=int, default=2000)
    ap.add_argument("--answered", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/rounds.db"
        upgrade(url)
        engine = make_engine(url)
        with Session(engine) as db:
            study = db.get(Study, import_dataset(args.dataset, session=db).study_id)
            assert study is not None
            fit_study_model(study, session=db, n_classes=(2,), n_restarts=1)
            ids = db.exec(
                select(Respondent.id)
                .where(Respondent.study_id == study.id)
                .order_by(col(Respondent.id))
                .limit(args.members)
            ).all()
            question = load_runtime(study, session=db, fit_if_missing=False).candidates[0].key
            settings = dict(study.settings)
            settings["group"] = {
                **settings["group"],
                "rounds": 1,
                "respondents_per_round": len(ids),
                "total_answers": len(ids),
                "max_questions_per_respondent": 1,
            }
            study.settings = settings
            study.status = "published"
            plan = Job(
                kind="plan_group_round",
                study_id=study.id,
                status="succeeded",
                result={
                    "question": question,
                    "question_scores": [{"item": question, "score": 1.0}],
                    "n_members": len(ids),
                    "per_round": len(ids),
                    "rounds_done": 0,
                    "panel": "imported",
                    "respondents": [
                        {"respondent_id": i, "respondent": f"r{i}", "expected_gain": 0.01}
                        for i in ids
                    ],
                },
            )
            db.add_all([study, plan])
            db.commit()
            db.refresh(study)
            db.refresh(plan)
            db.expunge(study)
            plan_id = plan.id or 0
        t0 = time.perf_counter()
        rnd = group_rounds.open_round(study, plan_id, engine=engine, secret=SECRET)
        t_open = time.perf_counter() - t0
        with Session(engine) as db:
            t0 = time.perf_counter()
            round_tracking.round_view(study, rnd, session=db, secret=SECRET, link_base="/g/")
            t_view = time.perf_counter() - t0
            members = db.exec(
                select(GroupRoundMember)
                .where(GroupRoundMember.round_id == rnd.id)
                .order_by(col(GroupRoundMember.id))
                .limit(args.answered)
            ).all()
            item = rnd.item_id or 0
            db.add_all(Answer(session_id=m.session_id, item_id=item, option="A") for m in members)
            db.commit()
            t_partial, partial_bytes = _time_partial(study, rnd.number, db)
        t0 = time.perf_counter()
        round_tracking.close_round(study, rnd.number, engine=engine)
        t_close = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "dataset": args.dataset,
                "members": len(ids),
                "answered": len(members),
                "open_seconds": round(t_open, 2),
                "round_view_seconds": round(t_view, 2),
                "refresh_seconds": round(t_partial, 2),
                "refresh_bytes": partial_bytes,
                "close_seconds": round(t_close, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
