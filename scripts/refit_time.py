"""Time one refit of the learning loop on CES-sized data (docs/models.md, "The learning loop").

Imports ``datasets/ces`` (5,369 respondents) into a fresh SQLite file and runs
:func:`app.services.belief.fit_study_model` (the ``fit_model`` job's work: training data,
the default latent-class grid, the held-out verdict); prints respondents, CPU and wall
seconds. Usage: ``OMP_NUM_THREADS=1 python scripts/refit_time.py [DB_FILE]`` (the file is
deleted first; default ``/tmp/priorly-refit-time.db``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sqlmodel import Session, func, select

from app.db import make_engine, upgrade
from app.services.belief import fit_study_model
from app.services.importer import import_dataset
from app.settings import REPO_ROOT
from app.tables import Respondent, Study


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "db_file",
        nargs="?",
        type=Path,
        default=Path("/tmp/priorly-refit-time.db"),
        help="SQLite file to create (deleted first if it exists)",
    )
    db_file: Path = parser.parse_args(argv).db_file
    db_file.unlink(missing_ok=True)
    url = f"sqlite:///{db_file}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as db:
        result = import_dataset(REPO_ROOT / "datasets" / "ces", session=db)
        study = db.get(Study, result.study_id)
        assert study is not None
        n = db.exec(select(func.count()).where(Respondent.study_id == study.id)).one()
        wall, cpu = time.perf_counter(), time.process_time()
        row = fit_study_model(study, session=db)
        print(
            f"respondents={n} cpu_s={time.process_time() - cpu:.1f} "
            f"wall_s={time.perf_counter() - wall:.1f} status={row.status} "
            f"n_imported={row.n_imported} n_live={row.n_live} n_validation={row.n_validation}"
        )
    engine.dispose()


if __name__ == "__main__":
    main()
