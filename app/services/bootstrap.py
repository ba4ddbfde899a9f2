"""Bring a database to a servable state: migrate it, and import the demo study into an
empty one. ``priorly serve`` calls :func:`bootstrap_database` before starting uvicorn."""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session

from app import db
from app.services.importer import ImportResult, import_dataset
from app.services.studies import count_studies
from app.settings import Settings


@dataclass(frozen=True)
class BootstrapResult:
    """What :func:`bootstrap_database` did: the schema revision and the demo import, if any."""

    revision: str | None
    demo: ImportResult | None


def bootstrap_database(settings: Settings, *, import_demo: bool = True) -> BootstrapResult:
    """Migrate ``settings.database_url`` to head; import ``settings.demo_dataset`` when the
    database has no study and ``import_demo`` is true (idempotent: a second call imports
    nothing)."""
    db.upgrade(settings.database_url)
    engine = db.make_engine(settings.database_url)
    try:
        demo = None
        if import_demo:
            with Session(engine) as session:
                if count_studies(session=session) == 0:
                    demo = import_dataset(settings.demo_dataset, session=session)
        return BootstrapResult(revision=db.current_revision(engine), demo=demo)
    finally:
        engine.dispose()
