"""Liveness / readiness: ``/healthz`` checks that the database answers and is migrated."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.db import check_database
from app.deps import EngineDep

router = APIRouter()


@router.get("/healthz", name="healthz")
def healthz(request: Request, engine: EngineDep) -> JSONResponse:
    """``200 {"status": "ok", "database": "ok"}``, or 503 with the database's problem;
    ``HEAD`` answers the same status without the body (uptime monitors;
    :class:`app.middleware.HeadAsGetMiddleware`)."""
    database = check_database(engine, request.app.state.schema_head)
    ok = database == "ok"
    return JSONResponse(
        {"status": "ok" if ok else "error", "database": database},
        status_code=200 if ok else 503,
    )
