"""Session tokens and completion codes.

A session token is the respondent's bearer credential (256 random bits, URL-safe); only
its SHA-256 (:func:`hash_token`) is stored. A completion code is the study's fixed code or
``HMAC-SHA256(secret, "<study id>:<session id>")`` (:func:`completion_code`). The code a
completed session shows is the one it got when it completed
(:func:`session_completion_code`): the completing write stores the study's fixed code of
that moment, or ``""`` for the derived code, in ``elicitation_session.completion_code``
(:func:`code_at_completion`, and the same rule in the raw SQL of :mod:`app.session.sql`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime

from sqlmodel import Session, select

from app.services.apikeys import KEY_PREFIX
from app.tables import ElicitationSession, SessionStatus, Study

TOKEN_BYTES = 32


def new_token() -> str:
    """A session token (256 random bits, URL-safe): the respondent's credential.

    Never starts with the API keys' prefix (``pk_``): the JSON API tells the two kinds of
    bearer credential apart by that prefix, and a random token starts with it once in
    64**3 = 262,144 draws (that respondent would get 401 "invalid API key"). Redrawing
    keeps the remaining tokens uniformly random.
    """
    while True:
        token = secrets.token_urlsafe(TOKEN_BYTES)
        if not token.startswith(KEY_PREFIX):
            return token


def hash_token(token: str) -> str:
    """SHA-256 hex of a session token (only the hash is stored)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def derived_code(study_id: int, session_id: int, secret: str) -> str:
    """The per-session completion code: ``HMAC-SHA256(secret, "<study id>:<session id>")``
    in 10 upper-case hex characters; a researcher can recompute it to check a code a
    respondent reports."""
    mac = hmac.new(secret.encode(), f"{study_id}:{session_id}".encode(), hashlib.sha256)
    return mac.hexdigest()[:10].upper()


def completion_code(study: Study, session_id: int, secret: str) -> str:
    """The code a session of ``study`` completing now gets: the study's fixed completion
    code, or without one the session's :func:`derived_code`."""
    if study.completion_code:
        return study.completion_code
    return derived_code(study.id or 0, session_id, secret)


def session_completion_code(study: Study, sess: ElicitationSession, secret: str) -> str:
    """The completion code of the completed session ``sess``: the one it got when it
    completed, whatever the study's fixed code is now.

    ``sess.completion_code`` is that fixed code; ``""``: the session's :func:`derived_code`;
    ``None`` (completed before the code was stored): :func:`completion_code` of the study
    as it is now.

    Example: a session that completed while the study's code was ``"A1"`` shows ``"A1"``
    after the researcher changed it to ``"B2"``; one completing afterwards shows ``"B2"``.
    """
    if sess.completion_code is None:
        return completion_code(study, sess.id or 0, secret)
    return sess.completion_code or derived_code(study.id or 0, sess.id or 0, secret)


def code_at_completion(db: Session, study_id: int) -> str:
    """The ``elicitation_session.completion_code`` of a session of study ``study_id`` that
    completes in ``db``'s transaction: the study's fixed code, ``""`` without one."""
    code = db.exec(select(Study.completion_code).where(Study.id == study_id)).first()
    return code or ""


def mark_completed(db: Session, sess: ElicitationSession, now: datetime) -> None:
    """Complete ``sess`` in ``db``'s transaction (not committed): status ``completed``,
    ``completed_at = now`` and the code it shows from now on (:func:`code_at_completion`)."""
    sess.status = SessionStatus.completed.value
    sess.completed_at = now
    sess.completion_code = code_at_completion(db, sess.study_id)
