"""The errors of the live loop, each with a stable ``code`` (the API's error body).

Not found (404): :class:`SessionNotFoundError`, :class:`StudyNotFoundError`,
:class:`ItemNotFoundError`. Invalid input (422): :class:`InvalidAnswerError`,
:class:`InvalidAttributesError`. Conflicts (409): :class:`AnswerConflictError`,
:class:`NotCurrentQuestionError`, :class:`SessionClosedError`, :class:`StudyClosedError`,
:class:`ExternalIdTakenError`, :class:`StudyMisconfiguredError`.
"""

from __future__ import annotations

from app.errors import ConflictError, InvalidInputError, NotFoundError


class SessionNotFoundError(NotFoundError):
    code = "session_not_found"


class StudyNotFoundError(NotFoundError):
    code = "study_not_found"


class ItemNotFoundError(NotFoundError):
    code = "item_not_found"


class InvalidAnswerError(InvalidInputError):
    code = "invalid_answer"


class InvalidAttributesError(InvalidInputError):
    code = "invalid_attributes"


class AnswerConflictError(ConflictError):
    """The item was already answered differently, or the idempotency key was reused."""

    code = "answer_conflict"


class NotCurrentQuestionError(ConflictError):
    """The item is not the question the session is waiting for."""

    code = "not_current_question"


class SessionClosedError(ConflictError):
    code = "session_closed"


class StudyClosedError(ConflictError):
    code = "study_not_open"


class ExternalIdTakenError(ConflictError):
    code = "external_id_taken"


class StudyMisconfiguredError(ConflictError):
    code = "study_misconfigured"
