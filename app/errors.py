"""The application's error hierarchy.

Every error that a user (a researcher at the CLI, a browser, an API client) can cause and
fix derives from :class:`PriorlyError`. The CLI prints such errors as one line
(``priorly: error: ...``, exit code 2) and the web layer maps their ``http_status`` to a
response; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys


class PriorlyError(Exception):
    """Base of all user-facing errors of the app.

    Attributes:
        http_status: the HTTP status a web route should answer with.
    """

    http_status: int = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidInputError(PriorlyError):
    """The request or command arguments are invalid."""

    http_status = 422


class NotFoundError(PriorlyError):
    """A named object (study, item, session, ...) does not exist."""

    http_status = 404


class ConflictError(PriorlyError):
    """The operation conflicts with existing data (e.g. a study slug already in use)."""

    http_status = 409


class ConfigurationError(PriorlyError):
    """The settings are unusable (e.g. a placeholder secret outside development)."""

    http_status = 500


class DatabaseError(PriorlyError):
    """The database cannot be reached or is not migrated to the code's schema."""

    http_status = 503


# Error classes of the pure packages that are user errors too, named by module so that
# asking about an exception imports none of them: an exception of a class from a module
# that was never imported cannot occur.
_FOREIGN_USER_ERRORS = (
    ("elicitation.datasets", "DatasetError"),
    ("models.base", "ModelError"),
    ("inference_server.errors", "InferenceError"),
)


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an error the user can fix: a :class:`PriorlyError` or one of the
    pure packages' input errors (shown as a message; anything else is a bug)."""
    if isinstance(exc, PriorlyError):
        return True
    for module_name, class_name in _FOREIGN_USER_ERRORS:
        module = sys.modules.get(module_name)
        cls = getattr(module, class_name, None) if module is not None else None
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return False
