"""A study's downloads: which files there are, and each one as a file on disk or a stream.

:data:`EXPORTS` maps a download's name to its media type. :func:`open_export` prepares
one: the SPSS and Stata files are written to a temporary file first (the caller deletes
it after sending); the CSV and JSONL files are streamed from a database session of their
own, opened when the first chunk is asked for. The predictions need a fitted model, which
is checked before anything is sent (a half-sent CSV would look complete).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.errors import InvalidInputError, NotFoundError
from app.services import export
from app.session import load_runtime
from app.tables import Study

EXPORTS = {
    "answers_wide.csv": "text/csv; charset=utf-8",
    "answers_long.csv": "text/csv; charset=utf-8",
    "answers.sav": "application/x-spss-sav",
    "answers.dta": "application/x-stata-dta",
    "codebook.jsonl": "application/jsonl; charset=utf-8",
    "predictions.csv": "text/csv; charset=utf-8",
}


@dataclass(frozen=True)
class Download:
    """One prepared download: ``filename`` (``<slug>-<name>``, with ``-with-imported`` and
    ``-predictions`` before the extension when they apply), ``media_type``, and either
    ``path`` (a temporary file the caller deletes) or ``chunks`` (UTF-8 bytes)."""

    filename: str
    media_type: str
    path: Path | None = None
    chunks: Iterator[bytes] | None = None


PREDICTING = frozenset({"answers_wide.csv", "answers_long.csv"})
"""The downloads that take ``predictions`` (each respondent's predicted answers)."""
WITH_IMPORTED = frozenset({"answers_wide.csv", "answers.sav", "answers.dta"})
"""The downloads that can add the imported respondents (named ``...-with-imported``)."""


def open_export(
    study: Study,
    name: str,
    *,
    engine: Engine,
    include_imported: bool = False,
    predictions: bool = False,
) -> Download:
    """Prepare the download ``name`` of :data:`EXPORTS` (:class:`NotFoundError` for any
    other name); ``include_imported`` adds the imported respondents to the wide CSV and
    the SPSS and Stata files (:data:`WITH_IMPORTED`; :class:`InvalidInputError` for
    another file); ``predictions`` adds each respondent's predicted answers to
    the CSV answers (:data:`PREDICTING`; :class:`InvalidInputError` for another file, a
    :class:`~app.services.belief.NoModelError` when the study has no model)."""
    if name not in EXPORTS:
        raise NotFoundError(f"no export {name!r}")
    if predictions and name not in PREDICTING:
        raise InvalidInputError(
            f"predictions: only {' and '.join(sorted(PREDICTING))} carry predictions, not {name!r}"
        )
    if include_imported and name not in WITH_IMPORTED:
        raise InvalidInputError(
            f"imported: only {', '.join(sorted(WITH_IMPORTED))} add the imported respondents, "
            f"not {name!r}"
        )
    stem, ext = name.rsplit(".", 1)
    if include_imported and name in WITH_IMPORTED:
        stem += "-with-imported"
    if predictions:
        stem += "-predictions"
    filename = f"{study.slug}-{stem}.{ext}"
    if name.endswith((".sav", ".dta")):
        tmp = tempfile.NamedTemporaryFile(prefix="priorly-", suffix=name[-4:], delete=False)
        tmp.close()
        path = Path(tmp.name)
        with Session(engine) as db:
            writer = export.write_sav if name.endswith(".sav") else export.write_dta
            writer(study, path, session=db, include_imported=include_imported)
        return Download(filename, EXPORTS[name], path=path)
    if name == "predictions.csv" or predictions:
        with Session(engine) as db:
            load_runtime(study, session=db, fit_if_missing=False)

    def stream() -> Iterator[str]:
        with Session(engine) as db:
            if name == "answers_wide.csv":
                yield from export.csv_wide(
                    study, session=db, include_imported=include_imported, predictions=predictions
                )
            elif name == "answers_long.csv":
                yield from export.csv_long(study, session=db, predictions=predictions)
            elif name == "codebook.jsonl":
                yield from export.codebook_jsonl(study, session=db)
            else:
                yield from export.csv_predictions(study, session=db)

    return Download(filename, EXPORTS[name], chunks=(chunk.encode("utf-8") for chunk in stream()))
