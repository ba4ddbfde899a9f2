"""Helpers shared by the admin routes: rendering, redirects, form fields, job rows."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from app import auth
from app.errors import InvalidInputError, PriorlyError
from app.jobs.kinds import LABELS
from app.schemas import StudySettings
from app.services import jobs
from app.tables import Job
from elicitation.datasets import DatasetError

FORM_ERRORS = (PriorlyError, DatasetError)


def render(
    request: Request,
    templates: Any,
    name: str,
    context: dict[str, Any],
    *,
    block: str | None = None,
    status: int = 200,
) -> Response:
    ctx = {
        "researcher": getattr(request.state, "researcher", None),
        "csrf_token": auth.csrf_token(request),
        **context,
    }
    if block is not None:
        return templates.TemplateResponse(request, name, ctx, block_name=block, status_code=status)
    return templates.TemplateResponse(request, name, ctx, status_code=status)


def see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def form_str(form: Any, name: str, default: str = "") -> str:
    value = form.get(name, default)
    return value if isinstance(value, str) else default


def opt_number(value: str, kind: type[int] | type[float], what: str) -> Any:
    """``None`` for an empty field, else the field as ``kind`` (InvalidInputError if not)."""
    value = value.strip()
    if not value:
        return None
    try:
        return kind(value)
    except ValueError:
        raise InvalidInputError(f"not {what}: {value!r}") from None


def opt_int(value: str) -> int | None:
    return opt_number(value, int, "a whole number")  # type: ignore[no-any-return]


def opt_float(value: str) -> float | None:
    return opt_number(value, float, "a number")  # type: ignore[no-any-return]


def job_view(job: Job) -> dict[str, Any]:
    return {
        "job": job,
        "label": LABELS.get(job.kind, job.kind),
        "active": job.status in jobs.ACTIVE,
        "percent": int(round(100 * (job.progress or 0.0))),
    }


def kind_context(study: Any, kind: str, session: Any) -> dict[str, Any]:
    """A page about one job kind: its queued/running jobs (polling rows) and latest result."""
    return {
        "study": study,
        "pending": [
            job_view(j)
            for j in jobs.study_jobs(study, session=session, limit=20)
            if j.kind == kind and j.status in jobs.ACTIVE
        ],
        "latest": jobs.latest_result(study, kind, session=session),
        "settings": StudySettings.model_validate(study.settings or {}),
    }


def exc_status(exc: Exception) -> int:
    """The status of a form error: its own (409 conflict, 404, ...) or 422."""
    return exc.http_status if isinstance(exc, PriorlyError) else 422
