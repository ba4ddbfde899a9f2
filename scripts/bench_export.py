"""Time the answer exports of the CES demo study, with and without predicted answers.

Imports ``datasets/ces`` into a fresh SQLite file, prepares it as the demo is (targets,
published, the default fitted model), adds one live respondent per imported one (their
attributes, a session whose decisions record the model, and their first ``--answers``
answers as live answers), then times each export streamed to the end (one torch thread; wall and CPU seconds):
the wide CSV, the wide CSV with ``predictions`` (and with the imported respondents too)
and the long CSV with and without ``predictions``. Prints seconds, rows and megabytes.
Used for the figures in docs/respondents.md.

    python scripts/bench_export.py [--live 5000] [--answers 10] [--db /tmp/bench.db]

An existing ``--db`` file is reused as it is (no new set-up).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from sqlmodel import Session, col, select  # noqa: E402

from app.db import make_engine, upgrade  # noqa: E402
from app.services import export  # noqa: E402
from app.services.demo import prepare_study_for_fielding  # noqa: E402
from app.services.importer import import_dataset  # noqa: E402
from app.session import hash_token  # noqa: E402
from app.tables import (  # noqa: E402
    Answer,
    ElicitationSession,
    Item,
    ItemRole,
    Respondent,
    SelectionDecision,
    Study,
)


def add_live_copies(db: Session, study: Study, model_id: int, n: int, n_answers: int) -> int:
    """One live respondent per imported one (at most ``n``): attributes, one session with
    a decision at position 0 and one after the answers (both recording ``model_id``), and
    their first ``n_answers`` historical answers to questions as live answers."""
    items = db.exec(
        select(Item).where(Item.study_id == study.id).order_by(col(Item.position))
    ).all()
    questions = [it for it in items if it.role == ItemRole.question.value]
    history = db.exec(
        select(Respondent)
        .where(Respondent.study_id == study.id, Respondent.source == "import")
        .order_by(col(Respondent.id))
        .limit(n)
    ).all()
    made = 0
    for h in history:
        resp = Respondent(study_id=study.id or 0, attributes=dict(h.attributes or {}))
        db.add(resp)
        db.flush()
        sess = ElicitationSession(
            study_id=study.id or 0,
            respondent_id=resp.id or 0,
            token_hash=hash_token(secrets.token_urlsafe(16)),
            status="completed",
        )
        db.add(sess)
        db.flush()
        given = [(it, (h.answers or {}).get(it.key)) for it in questions]
        given = [(it, v) for it, v in given if v is not None][:n_answers]
        for pos in (0, len(given)):
            db.add(
                SelectionDecision(
                    session_id=sess.id or 0,
                    position=pos,
                    item_id=None,
                    criterion="eig",
                    scores={"model_id": model_id},
                )
            )
        db.add_all(Answer(session_id=sess.id or 0, item_id=it.id or 0, option=v) for it, v in given)
        made += 1
        if made % 1000 == 0:
            db.commit()
    db.commit()
    return made


def timed(label: str, make: Callable[[], Iterator[str]]) -> None:
    """Stream one export to the end; print wall and CPU seconds (the CPU time of this
    process is the steadier figure on a shared machine), rows and megabytes."""
    start, cpu = time.perf_counter(), time.process_time()
    rows = size = 0
    for chunk in make():
        rows += chunk.count("\n")
        size += len(chunk.encode("utf-8"))
    took, used = time.perf_counter() - start, time.process_time() - cpu
    print(
        f"{label:<38} {took:6.2f} s wall {used:6.2f} s CPU {rows - 1:>7} rows {size / 1e6:5.1f} MB",
        flush=True,
    )


def set_up(engine: Any, live: int, answers: int) -> int:
    """Import the CES dataset, prepare it as the demo, add the live copies; the study id."""
    with Session(engine) as db:
        t0 = time.perf_counter()
        result = import_dataset(REPO / "datasets" / "ces", session=db)
        study = db.exec(select(Study).where(Study.id == result.study_id)).one()
        prepared = prepare_study_for_fielding(study, session=db)
        made = add_live_copies(db, study, prepared.fitted_model_id, live, answers)
        n_items = len(export.export_items(study, session=db))
        print(
            f"set-up {time.perf_counter() - t0:.1f} s: {made} live respondents, {n_items} items, "
            f"model {prepared.fitted_model_id}",
            flush=True,
        )
    return result.study_id


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=5000, help="live respondents to add")
    parser.add_argument("--answers", type=int, default=10, help="live answers per respondent")
    parser.add_argument("--db", type=Path, default=None, help="SQLite file (default: temporary)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="priorly-bench-export-"))
    path = args.db or folder / "bench.db"
    reuse = path.exists()
    url = f"sqlite:///{path}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as db:
        study_id = db.exec(select(Study.id)).first() if reuse else None
    if study_id is None:
        study_id = set_up(engine, args.live, args.answers)
    with Session(engine) as db:
        study = db.exec(select(Study).where(Study.id == study_id)).one()
        timed("wide CSV", lambda: export.csv_wide(study, session=db))
        timed(
            "wide CSV, predictions",
            lambda: export.csv_wide(study, session=db, predictions=True),
        )
        timed(
            "wide CSV, predictions, with imported",
            lambda: export.csv_wide(study, session=db, predictions=True, include_imported=True),
        )
        timed("long CSV", lambda: export.csv_long(study, session=db))
        timed("long CSV, predictions", lambda: export.csv_long(study, session=db, predictions=True))
    engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
