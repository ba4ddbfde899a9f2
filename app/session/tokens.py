"""Session tokens and completion codes.

A session token is the respondent's bearer credential (256 random bits, URL-safe); only
its SHA-256 (:func:`hash_token`) is stored. A completion code is the study's fixed code or
``HMAC-SHA256(secret, "<study id>:<session id>")`` (:func:`completion_code`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from app.services.apikeys import KEY_PREFIX
from app.tables import Study

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


def completion_code(study: Study, session_id: int, secret: str) -> str:
    """The study's completion code, or a per-session code derived from the secret key.

    The derived code is ``HMAC-SHA256(secret, "<study id>:<session id>")`` in 10 upper-case
    hex characters: a researcher can recompute it to check a code a respondent reports.
    """
    if study.completion_code:
        return study.completion_code
    mac = hmac.new(secret.encode(), f"{study.id}:{session_id}".encode(), hashlib.sha256)
    return mac.hexdigest()[:10].upper()
