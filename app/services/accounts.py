"""Researcher accounts as the admin pages list them, revoking one's own API key, and
sharing a study with another account."""

from __future__ import annotations

from sqlmodel import Session, col, select

from app.auth import share_study as add_share
from app.errors import InvalidInputError, NotFoundError
from app.services.apikeys import revoke_api_key
from app.tables import ApiKey, Researcher, Study


def list_accounts(*, session: Session) -> list[Researcher]:
    """Every researcher account, by email."""
    return list(session.exec(select(Researcher).order_by(col(Researcher.email))).all())


def revoke_own_api_key(researcher: Researcher, key_id: int, *, session: Session) -> ApiKey:
    """Revoke the API key ``key_id`` of ``researcher``; :class:`NotFoundError` for a key
    that does not exist or belongs to someone else (the two are not told apart)."""
    row = session.get(ApiKey, key_id)
    if row is None or row.researcher_id != researcher.id:
        raise NotFoundError(f"no API key {key_id} among your keys")
    return revoke_api_key(row.prefix, session=session)


def share_study(study: Study, email: str, *, by: Researcher, session: Session) -> Researcher:
    """Share ``study`` with the researcher ``email`` on behalf of ``by``, who must own the
    study or be an admin (:class:`InvalidInputError` otherwise); returns the researcher
    the study is now shared with."""
    if not (by.is_admin or study.owner_id == by.id):
        raise InvalidInputError("only the study's owner can share it")
    return add_share(study, email, session=session)
