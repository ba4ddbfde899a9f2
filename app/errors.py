"""The application's error hierarchy and the one answer to "is this a user error?".

A *user error* is one that a user (a researcher at the CLI, a browser, an API client, the
author of a job's payload) caused and can fix: it is shown as its message, one line, with
no traceback. Anything else is a bug and keeps its traceback.

* :class:`PriorlyError` is the base of the app's user errors; each subclass carries the
  HTTP status a web route answers with (:attr:`PriorlyError.http_status`) and the JSON
  API's error code (:attr:`PriorlyError.code`):

  ====================== ====== ====================== ================================
  class                  status code                   meaning
  ====================== ====== ====================== ================================
  PriorlyError           400    error                  (the base)
  InvalidInputError      422    invalid_input          invalid request, form, arguments
  NotFoundError          404    not_found              a named object does not exist
  ConflictError          409    conflict               conflicts with the stored state
  ConfigurationError     500    configuration_error    the settings are unusable
  DatabaseError          503    database_unavailable   unreachable or not migrated
  ====================== ====== ====================== ================================

  Errors of one area subclass these and may name their own ``code`` (e.g.
  ``NoModelError(ConflictError)``, code ``no_model``).
* The pure packages keep their own base error and import nothing of the app:
  ``elicitation.errors.ElicitationError``, ``elicitation.datasets.DatasetError``,
  ``models.base.ModelError``, ``gnn.graph.GNNError`` and
  ``inference_server.errors.InferenceError`` (:data:`PURE_USER_ERRORS`).

:func:`is_user_error` recognises both; the CLI (exit code 2), the benchmark commands, the
job runner (the job's ``error``) and the admin pages ask it.

Example::

    >>> is_user_error(NotFoundError("no study 'x'"))
    True
    >>> is_user_error(KeyError("x"))
    False
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class PriorlyError(Exception):
    """Base of all user-facing errors of the app.

    Attributes:
        message: the text shown to the user.
        http_status: the HTTP status a web route should answer with.
        code: the machine-readable code of the JSON API's error body.
    """

    http_status: int = 400
    code: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidInputError(PriorlyError):
    """The request or command arguments are invalid."""

    http_status = 422
    code = "invalid_input"


class NotFoundError(PriorlyError):
    """A named object (study, item, session, ...) does not exist."""

    http_status = 404
    code = "not_found"


class ConflictError(PriorlyError):
    """The operation conflicts with existing data (e.g. a study slug already in use)."""

    http_status = 409
    code = "conflict"


class ConfigurationError(PriorlyError):
    """The settings are unusable (e.g. a placeholder secret outside development)."""

    http_status = 500
    code = "configuration_error"


class DatabaseError(PriorlyError):
    """The database cannot be reached or is not migrated to the code's schema."""

    http_status = 503
    code = "database_unavailable"


PURE_USER_ERRORS: tuple[tuple[str, str], ...] = (
    ("elicitation.errors", "ElicitationError"),
    ("elicitation.datasets", "DatasetError"),
    ("models.base", "ModelError"),
    ("gnn.graph", "GNNError"),
    ("inference_server.errors", "InferenceError"),
)
"""``(module, class)`` of the pure packages' base errors, which are user errors too.

Looked up by name in ``sys.modules``: an exception of a class whose module was never
imported cannot occur, and this module stays free of torch and of the pure packages."""


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an error the user can fix (shown as its message, no traceback)."""
    if isinstance(exc, PriorlyError):
        return True
    for module_name, class_name in PURE_USER_ERRORS:
        module = sys.modules.get(module_name)
        cls = getattr(module, class_name, None) if module is not None else None
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return False


def error_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (its class name when it has no message)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class _HasErrors(Protocol):
    def errors(self) -> Sequence[Mapping[str, Any]]: ...


BODY_MESSAGES = {
    "missing": "request body: a JSON object is required (send it with Content-Type: "
    "application/json)",
    "model_attributes_type": "request body: must be a JSON object (send it with "
    "Content-Type: application/json)",
}
""":func:`validation_message`'s words for a problem with the whole body, by pydantic error
type: a missing body, or one that is not a JSON object (another content type, a list)."""


def validation_message(exc: _HasErrors) -> str:
    """One line for a request validation error (FastAPI's ``RequestValidationError``):
    where and what, for its first five problems, e.g. ``path.job_id: Input should be a
    valid integer``."""
    parts = []
    for err in exc.errors()[:5]:
        whole_body = tuple(err.get("loc", ())) == ("body",)
        if whole_body and err.get("type") in BODY_MESSAGES:
            parts.append(BODY_MESSAGES[str(err["type"])])
            continue
        if err.get("type") == "json_invalid":
            where = (err.get("loc") or ("body", "?"))[-1]
            reason = (err.get("ctx") or {}).get("error", "")
            parts.append(
                f"request body: not valid JSON at character {where}: {reason}".rstrip(": ")
            )
            continue
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {err.get('msg', 'invalid')}" if loc else str(err.get("msg")))
    return "; ".join(parts) or "invalid request"
