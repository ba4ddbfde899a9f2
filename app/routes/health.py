"""Liveness / readiness: ``/healthz`` checks that the database answers and is migrated, and
reports the job workers seen."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.db import check_database
from app.deps import EngineDep
from app.services.workers import worker_health

router = APIRouter()


@router.get("/healthz", name="healthz")
def healthz(request: Request, engine: EngineDep) -> JSONResponse:
    """``200 {"status": "ok", "database": "ok", "workers": {...}}``, or 503 with the
    database's problem (``"workers": null``); ``HEAD`` answers the same status without the
    body (uptime monitors; :class:`app.middleware.HeadAsGetMiddleware`).

    ``workers`` (:func:`app.services.workers.worker_health`) is information, never a
    reason for 503: a web process serves without any job worker running."""
    database = check_database(engine, request.app.state.schema_head)
    ok = database == "ok"
    return JSONResponse(
        {
            "status": "ok" if ok else "error",
            "database": database,
            "workers": worker_health(engine) if ok else None,
        },
        status_code=200 if ok else 503,
    )
