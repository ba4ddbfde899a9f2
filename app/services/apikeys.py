"""Researcher accounts and their API keys (the JSON API's authentication).

An API key is ``pk_<prefix>_<secret>``: 8 public characters that identify the key in
listings and 43 characters (256 bits) of ``secrets.token_urlsafe``. Only the SHA-256 hex
digest of the whole key is stored (``api_key.key_hash``, unique), so a stolen database does
not reveal usable keys; the key is shown once, at creation. Because the secret is 256
random bits, a fast hash is enough (a slow password hash would only slow every API call).

A key is limited to its owner's studies (:func:`can_access_study`): a researcher's key sees
the studies whose ``owner_id`` is theirs; an admin's key sees every study. Anything else
is reported as "not found" by the callers (never 403, so a key cannot probe which studies
exist).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, or_, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.errors import ConflictError, InvalidInputError, NotFoundError, PriorlyError
from app.tables import ApiKey, Researcher, Study, utcnow
from app.textguard import unsafe_in_name

KEY_PREFIX = "pk_"
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


class AuthenticationError(PriorlyError):
    """Missing, malformed, unknown or revoked credentials (HTTP 401)."""

    http_status = 401
    code = "unauthenticated"


def normalise_email(email: str) -> str:
    """``email`` stripped and lower-cased; :class:`InvalidInputError` if it is not one, or
    if it holds a control or bidirectional control character (which would make an address
    look like another one in the admin's lists)."""
    value = email.strip().lower()
    max_len = Researcher.__table__.c.email.type.length  # type: ignore[attr-defined]
    if not _EMAIL_RE.match(value) or len(value) > max_len:
        raise InvalidInputError(f"not a valid email address: {email!r}")
    problem = unsafe_in_name(value)
    if problem:
        raise InvalidInputError(f"the email address contains {problem}")
    return value


def hash_key(key: str) -> str:
    """SHA-256 hex digest of an API key (what is stored)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def create_researcher(email: str, *, session: Session, is_admin: bool = False) -> Researcher:
    """Create a researcher account; :class:`ConflictError` if the email is taken."""
    value = normalise_email(email)
    if session.exec(select(Researcher).where(Researcher.email == value)).first() is not None:
        raise ConflictError(f"a researcher with email {value!r} already exists")
    researcher = Researcher(email=value, is_admin=is_admin)
    session.add(researcher)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise ConflictError(f"a researcher with email {value!r} already exists") from None
    session.refresh(researcher)
    return researcher


def get_researcher_by_email(email: str, *, session: Session) -> Researcher:
    """The researcher with ``email`` (case-insensitive); :class:`NotFoundError` otherwise."""
    value = normalise_email(email)
    researcher = session.exec(select(Researcher).where(Researcher.email == value)).first()
    if researcher is None:
        raise NotFoundError(f"no researcher with email {value!r} (create one: priorly user create)")
    return researcher


@dataclass(frozen=True)
class NewApiKey:
    """A freshly created key: ``key`` is the only time the secret is available."""

    id: int
    key: str
    prefix: str
    researcher_email: str


def create_api_key(email: str, *, session: Session, name: str = "") -> NewApiKey:
    """Create an API key for the researcher with ``email``; returns the key (shown once)."""
    researcher = get_researcher_by_email(email, session=session)
    if not researcher.is_active:
        raise InvalidInputError(f"researcher {researcher.email!r} is deactivated")
    max_name = ApiKey.__table__.c.name.type.length  # type: ignore[attr-defined]
    if len(name) > max_name:
        raise InvalidInputError(f"key name is longer than {max_name} characters")
    problem = unsafe_in_name(name)
    if problem is not None:
        raise InvalidInputError(f"the key name contains {problem}")
    prefix = secrets.token_hex(4)
    key = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    row = ApiKey(
        researcher_id=researcher.id,  # type: ignore[arg-type]
        name=name,
        prefix=f"{KEY_PREFIX}{prefix}",
        key_hash=hash_key(key),
    )
    session.add(row)
    session.commit()
    session.refresh(row)
    return NewApiKey(id=row.id or 0, key=key, prefix=row.prefix, researcher_email=researcher.email)


def revoke_api_key(prefix: str, *, session: Session) -> ApiKey:
    """Revoke the key whose display prefix is ``prefix`` (idempotent)."""
    row = session.exec(select(ApiKey).where(ApiKey.prefix == prefix.strip())).first()
    if row is None:
        raise NotFoundError(f"no API key with prefix {prefix!r}")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.add(row)
        session.commit()
        session.refresh(row)
    return row


def all_api_keys(*, session: Session) -> list[tuple[ApiKey, str]]:
    """Every API key with its researcher's email, newest first."""
    rows = session.exec(
        select(ApiKey, Researcher.email)
        .join(Researcher, Researcher.id == ApiKey.researcher_id)  # type: ignore[arg-type]
        .order_by(col(ApiKey.id).desc())
    ).all()
    return [(key, str(email)) for key, email in rows]


def list_api_keys(email: str, *, session: Session) -> list[ApiKey]:
    """The researcher's keys, newest first (hashes included: never print them)."""
    researcher = get_researcher_by_email(email, session=session)
    return list(
        session.exec(
            select(ApiKey).where(ApiKey.researcher_id == researcher.id).order_by(ApiKey.id.desc())  # type: ignore[union-attr]
        ).all()
    )


def authenticate_api_key(key: str, *, session: Session) -> Researcher:
    """The active researcher owning the non-revoked ``key``; :class:`AuthenticationError`."""
    if not key.startswith(KEY_PREFIX) or len(key) > 200:
        raise AuthenticationError("invalid API key")
    row = session.exec(
        select(ApiKey, Researcher)
        .join(Researcher, Researcher.id == ApiKey.researcher_id)  # type: ignore[arg-type]
        .where(ApiKey.key_hash == hash_key(key))
    ).first()
    if row is None:
        raise AuthenticationError("invalid API key")
    api_key, researcher = row
    if api_key.revoked_at is not None:
        raise AuthenticationError("this API key was revoked")
    if not researcher.is_active:
        raise AuthenticationError("the researcher of this API key is deactivated")
    return researcher


LAST_USED_RESOLUTION_S = 60.0
"""``api_key.last_used_at`` is recorded to this many seconds (at most one write per key
and process per period: :func:`record_key_use`)."""


def record_key_use(engine: Engine, key: str, now: datetime | None = None) -> bool:
    """Set ``last_used_at`` of the non-revoked API key ``key`` to ``now`` unless it was
    set less than :data:`LAST_USED_RESOLUTION_S` before; whether a row was written.

    One conditional ``UPDATE`` (no read first): a call with an unknown key writes nothing.
    Example: a key used at 12:00:00 and 12:00:30 keeps ``12:00:00``; at 12:01:05 it is
    updated.
    """
    now = now or utcnow()
    with engine.begin() as conn:
        result = conn.execute(
            update(ApiKey)
            .where(
                col(ApiKey.key_hash) == hash_key(key),
                col(ApiKey.revoked_at).is_(None),
                or_(
                    col(ApiKey.last_used_at).is_(None),
                    col(ApiKey.last_used_at) < now - timedelta(seconds=LAST_USED_RESOLUTION_S),
                ),
            )
            .values(last_used_at=now)
        )
    return bool(result.rowcount)


def can_access_study(researcher: Researcher, study: Study) -> bool:
    """Whether ``researcher`` may use ``study`` through the API (owner, or any admin)."""
    return researcher.is_admin or (study.owner_id is not None and study.owner_id == researcher.id)
