"""Researcher accounts in the admin UI: passwords, session cookies, CSRF, roles, access.

* **Passwords** are hashed with argon2id (``argon2-cffi``'s defaults); a hash made with
  older parameters is upgraded at the next login.
* **Sessions** are server-side (table ``admin_session``): the cookie ``priorly_session``
  holds a random token (only its SHA-256 is stored), HttpOnly, SameSite=Lax, Secure unless
  the request is for localhost, valid for :data:`SESSION_MAX_AGE_S`. Logging out deletes
  the row, so a copied cookie stops working at once; a password change
  (:func:`set_password`) and a deactivated or removed account end every login of the
  researcher.
* **CSRF**: each login has its own random token (``admin_session.csrf_token``, also sent
  in the cookie ``priorly_csrf`` for the pages' forms); every state-changing admin request
  of a logged-in researcher must carry that token in the form field ``csrf_token`` or the
  header ``X-CSRF-Token`` (htmx sends it from ``hx-headers``), so a planted cookie does not
  help. Before login (the login and invitation forms) it is a double submit of the cookie,
  issued by :class:`CsrfCookieMiddleware` on the first admin request.
* **Cookie names in prod** (``PRIORLY_ENV=prod``): ``__Host-priorly_session`` and
  ``__Host-priorly_csrf``, always Secure, Path=/, no Domain (a sibling subdomain cannot set
  or overwrite them).
* **Login lockout**: :func:`login_with_limits` refuses (429 + ``Retry-After``) after too
  many failed logins per account or per client address (counters in the database,
  :mod:`app.ratelimit`).
* **Roles**: ``researcher.is_admin`` (admin) or not (researcher). Admins create accounts,
  send invitations and see every study; a researcher sees the studies they own and those
  shared with them (:func:`can_see_study`). Anything else is answered 404, never 403.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import timedelta
from typing import Annotated, Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from fastapi import Depends, Request
from sqlmodel import Session, col, delete, select
from starlette.concurrency import run_in_threadpool

from app import ratelimit
from app.deps import SessionDep
from app.errors import ConflictError, InvalidInputError, NotFoundError, PriorlyError
from app.limits import FORM_FIELD_MAX_BYTES
from app.ratelimit import LoginLocked as LoginLocked  # re-exported for the login route
from app.services.apikeys import normalise_email
from app.tables import AdminSession, Invitation, Researcher, Study, StudyShare, utcnow

SESSION_COOKIE = "priorly_session"
HOST_PREFIX = "__Host-"
CSRF_COOKIE = "priorly_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
SESSION_MAX_AGE_S = 12 * 3600
INVITATION_TTL = timedelta(days=7)
MIN_PASSWORD_LEN = 10
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_hasher = PasswordHasher()


class LoginRequired(PriorlyError):
    """No valid admin session; pages redirect to the login page (HTTP 401 for htmx)."""

    http_status = 401


class CsrfError(PriorlyError):
    """A state-changing request without the CSRF token of its cookie (HTTP 403)."""

    http_status = 403


class AdminRequired(NotFoundError):
    """An admin-only page asked for by a researcher: reported as not found."""


# ----- passwords --------------------------------------------------------------------------


def hash_password(password: str) -> str:
    """An argon2id hash of ``password``; :class:`InvalidInputError` if it is too short."""
    if len(password) < MIN_PASSWORD_LEN:
        raise InvalidInputError(f"the password must have at least {MIN_PASSWORD_LEN} characters")
    if len(password) > 1024:
        raise InvalidInputError("the password is longer than 1024 characters")
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    """Whether ``password`` matches ``password_hash`` (``False`` for no hash)."""
    if not password_hash:
        # Spend the same time as a real check so the login does not reveal accounts.
        _hasher.hash("not-a-password-0000")
        return False
    try:
        return _hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def authenticate(email: str, password: str, *, session: Session) -> Researcher:
    """The active researcher with ``email`` and ``password``; :class:`LoginRequired` if not.

    The message is the same for an unknown email and a wrong password.
    """
    try:
        value = normalise_email(email)
    except InvalidInputError:
        value = ""
    researcher = (
        session.exec(select(Researcher).where(Researcher.email == value)).first() if value else None
    )
    ok = verify_password(researcher.password_hash if researcher else None, password)
    if researcher is None or not ok or not researcher.is_active:
        raise LoginRequired("wrong email or password")
    assert researcher.password_hash is not None
    if _hasher.check_needs_rehash(researcher.password_hash):
        researcher.password_hash = _hasher.hash(password)
        session.add(researcher)
        session.commit()
        session.refresh(researcher)
    return researcher


def login_with_limits(
    request: Request, email: str, password: str, *, session: Session
) -> Researcher:
    """:func:`authenticate` behind the login lockout (:mod:`app.ratelimit`).

    Refuses with :class:`LoginLocked` (429, ``retry_after``) before checking the password
    when the account or the client address had too many recent failures; counts a failure
    (:class:`LoginRequired`) against both; a success clears the account's count. The
    counters are in the database, so every worker process sees the same ones.
    """
    settings = request.app.state.settings
    engine = request.app.state.engine
    client_ip = request.client.host if request.client else "unknown"
    ratelimit.check_login(engine, settings, email, client_ip)
    try:
        researcher = authenticate(email, password, session=session)
    except LoginRequired:
        ratelimit.record_login_failure(engine, settings, email, client_ip)
        raise
    ratelimit.clear_login_failures(engine, email)
    return researcher


def set_password(researcher: Researcher, password: str, *, session: Session) -> None:
    """Set (or change) a researcher's password; every login of theirs ends at once."""
    researcher.password_hash = hash_password(password)
    session.add(researcher)
    if researcher.id is not None:
        end_sessions(researcher.id, session=session, commit=False)
    session.commit()
    session.refresh(researcher)


def create_account(
    email: str, password: str, *, session: Session, is_admin: bool = False
) -> Researcher:
    """Create a researcher who can log in; :class:`ConflictError` if the email is taken.

    The password is checked before anything is written.
    """
    value = normalise_email(email)
    password_hash = hash_password(password)
    if session.exec(select(Researcher).where(Researcher.email == value)).first() is not None:
        raise ConflictError(f"a researcher with email {value!r} already exists")
    researcher = Researcher(email=value, is_admin=is_admin, password_hash=password_hash)
    session.add(researcher)
    session.commit()
    session.refresh(researcher)
    return researcher


# ----- invitations -----------------------------------------------------------------------


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_invitation(
    email: str, *, inviter: Researcher, session: Session, is_admin: bool = False
) -> str:
    """Create an invitation for ``email``; returns the token of the link (shown once)."""
    value = normalise_email(email)
    if session.exec(select(Researcher).where(Researcher.email == value)).first() is not None:
        raise ConflictError(f"a researcher with email {value!r} already exists")
    token = secrets.token_urlsafe(32)
    session.add(
        Invitation(
            email=value,
            token_hash=_token_hash(token),
            is_admin=is_admin,
            invited_by_id=inviter.id,
            expires_at=utcnow() + INVITATION_TTL,
        )
    )
    session.commit()
    return token


def get_invitation(token: str, *, session: Session) -> Invitation:
    """The open invitation of ``token``; :class:`NotFoundError` if unknown, used or expired."""
    row = session.exec(
        select(Invitation).where(Invitation.token_hash == _token_hash(token))
    ).first()
    if row is None or row.used_at is not None:
        raise NotFoundError("this invitation link is unknown or was already used")
    expires = row.expires_at
    if expires.tzinfo is None:  # SQLite returns naive UTC datetimes
        expires = expires.replace(tzinfo=utcnow().tzinfo)
    if expires < utcnow():
        raise NotFoundError("this invitation link has expired")
    return row


def accept_invitation(token: str, password: str, *, session: Session) -> Researcher:
    """Create the invited account with ``password`` and mark the invitation used."""
    invitation = get_invitation(token, session=session)
    researcher = create_account(
        invitation.email, password, session=session, is_admin=invitation.is_admin
    )
    invitation.used_at = utcnow()
    session.add(invitation)
    session.commit()
    return researcher


# ----- session cookies (server-side sessions) ----------------------------------------------


def _prod(request: Request) -> bool:
    return bool(getattr(request.app.state.settings, "env", "dev") == "prod")


def session_cookie_name(request: Request) -> str:
    """``__Host-priorly_session`` in prod (https only, this host only), else ``priorly_session``."""
    return f"{HOST_PREFIX}{SESSION_COOKIE}" if _prod(request) else SESSION_COOKIE


def csrf_cookie_name(request: Request) -> str:
    """``__Host-priorly_csrf`` in prod, else ``priorly_csrf``."""
    return f"{HOST_PREFIX}{CSRF_COOKIE}" if _prod(request) else CSRF_COOKIE


def cookie_secure(request: Request) -> bool:
    """Cookies are ``Secure`` in prod, and elsewhere except for a server reached as localhost."""
    return _prod(request) or (request.url.hostname or "") not in LOCAL_HOSTS


def _engine(request: Request) -> Any:
    return request.app.state.engine


def start_session(researcher: Researcher, *, session: Session) -> tuple[str, str]:
    """Store a new login of ``researcher``; returns ``(cookie token, CSRF token)``.

    Only the token's SHA-256 is stored. Logins whose time is over are deleted.
    """
    now = utcnow()
    session.exec(delete(AdminSession).where(col(AdminSession.expires_at) < now))  # type: ignore[call-overload]
    token = secrets.token_urlsafe(32)
    csrf = secrets.token_urlsafe(32)
    session.add(
        AdminSession(
            token_hash=_token_hash(token),
            researcher_id=researcher.id,  # type: ignore[arg-type]
            csrf_token=csrf,
            expires_at=now + timedelta(seconds=SESSION_MAX_AGE_S),
        )
    )
    session.commit()
    return token, csrf


def end_sessions(researcher_id: int, *, session: Session, commit: bool = True) -> None:
    """End every login of a researcher (a password change, a deactivated account)."""
    session.exec(delete(AdminSession).where(col(AdminSession.researcher_id) == researcher_id))  # type: ignore[call-overload]
    if commit:
        session.commit()


def set_login_cookies(request: Request, response: Any, researcher: Researcher) -> None:
    """Start a server-side session for ``researcher`` and set its cookie and its CSRF token
    (a new one at every login)."""
    with Session(_engine(request)) as db:
        token, csrf = start_session(researcher, session=db)
    secure = cookie_secure(request)
    response.set_cookie(
        session_cookie_name(request),
        token,
        max_age=SESSION_MAX_AGE_S,
        httponly=True,
        samesite="lax",
        secure=secure,
        path="/",
    )
    response.set_cookie(
        csrf_cookie_name(request), csrf, httponly=True, samesite="lax", secure=secure, path="/"
    )


def clear_login_cookies(request: Request, response: Any) -> None:
    """Log out: delete this request's server-side session (its cookie stops working at
    once, wherever it was copied) and clear the cookies."""
    token = request.cookies.get(session_cookie_name(request))
    if token:
        with Session(_engine(request)) as db:
            db.exec(delete(AdminSession).where(col(AdminSession.token_hash) == _token_hash(token)))  # type: ignore[call-overload]
            db.commit()
    secure = cookie_secure(request)
    for name in (session_cookie_name(request), csrf_cookie_name(request)):
        response.delete_cookie(name, path="/", httponly=True, samesite="lax", secure=secure)


def _login_row(request: Request, session: Session) -> tuple[AdminSession, Researcher] | None:
    """The open login of this request's session cookie and its researcher, or ``None``."""
    token = request.cookies.get(session_cookie_name(request))
    if not token or len(token) > 200:
        return None
    row = session.exec(
        select(AdminSession, Researcher)
        .join(Researcher, col(Researcher.id) == col(AdminSession.researcher_id))
        .where(AdminSession.token_hash == _token_hash(token))
    ).first()
    if row is None:
        return None
    login, researcher = row
    expires = login.expires_at
    if expires.tzinfo is None:  # SQLite returns naive UTC datetimes
        expires = expires.replace(tzinfo=utcnow().tzinfo)
    if expires < utcnow() or not researcher.is_active or not researcher.password_hash:
        return None
    return login, researcher


def current_researcher_or_none(request: Request, session: Session) -> Researcher | None:
    """The researcher of a valid session cookie, or ``None``; remembers the login's CSRF
    token on ``request.state`` for the page this request renders."""
    found = _login_row(request, session)
    if found is None:
        return None
    login, researcher = found
    request.state.csrf_token = login.csrf_token
    return researcher


def get_current_researcher(request: Request, session: SessionDep) -> Researcher:
    """Dependency: the logged-in researcher; :class:`LoginRequired` otherwise."""
    researcher = current_researcher_or_none(request, session)
    if researcher is None:
        raise LoginRequired("please log in")
    request.state.researcher = researcher
    return researcher


CurrentResearcher = Annotated[Researcher, Depends(get_current_researcher)]


def get_admin(researcher: CurrentResearcher) -> Researcher:
    """Dependency: the logged-in researcher if an admin (404 for anyone else)."""
    if not researcher.is_admin:
        raise AdminRequired("not found")
    return researcher


AdminUser = Annotated[Researcher, Depends(get_admin)]


# ----- CSRF ------------------------------------------------------------------------------


def csrf_token(request: Request) -> str:
    """The CSRF token of this request: its login's, else its cookie's (or the one being
    issued)."""
    token = getattr(request.state, "csrf_token", None)
    return str(token or request.cookies.get(csrf_cookie_name(request), ""))


def _expected_csrf(request: Request) -> str:
    """The token an unsafe request must carry: its login's when it has a valid session
    cookie (bound to that login: a planted cookie does not help), else its CSRF cookie's
    (the login and invitation forms, before any session)."""
    with Session(_engine(request)) as db:
        found = _login_row(request, db)
    if found is not None:
        return found[0].csrf_token
    return request.cookies.get(csrf_cookie_name(request), "")


async def verify_csrf(request: Request) -> None:
    """Dependency: refuse an unsafe request without the CSRF token of its login (or, before
    login, of its CSRF cookie)."""
    if request.method not in UNSAFE_METHODS:
        return
    expected = await run_in_threadpool(_expected_csrf, request)
    sent = request.headers.get(CSRF_HEADER, "")
    if not sent:
        content_type = request.headers.get("content-type", "")
        if content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
            form = await request.form(max_part_size=FORM_FIELD_MAX_BYTES)
            values = form.getlist(CSRF_FIELD)
            if len(values) > 1:
                raise CsrfError(f"the form's {CSRF_FIELD} field is given {len(values)} times")
            sent = values[0] if values and isinstance(values[0], str) else ""
    # compare_digest takes str only when ASCII; a token is URL-safe base64
    if not expected or not sent.isascii() or not sent or not hmac.compare_digest(expected, sent):
        raise CsrfError("the form is missing its security token or it expired: reload the page")


Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class CsrfCookieMiddleware:
    """Issue the ``priorly_csrf`` cookie on an admin request that has none (pure ASGI).

    The token is put on ``request.state.csrf_token`` so the page rendered by this same
    request can embed it in its forms.
    """

    def __init__(self, app: Callable[..., Awaitable[None]], prefix: str = "/admin") -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        name = csrf_cookie_name(request)
        if request.cookies.get(name):
            await self.app(scope, receive, send)
            return
        token = secrets.token_urlsafe(32)
        scope.setdefault("state", {})["csrf_token"] = token
        cookie = f"{name}={token}; Path=/; HttpOnly; SameSite=Lax" + (
            "; Secure" if cookie_secure(request) else ""
        )

        async def send_with_cookie(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"set-cookie", cookie.encode("latin-1")))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_cookie)


# ----- study access ----------------------------------------------------------------------


def can_see_study(researcher: Researcher, study: Study, *, session: Session) -> bool:
    """Owner, a researcher the study is shared with, or an admin."""
    if researcher.is_admin or (study.owner_id is not None and study.owner_id == researcher.id):
        return True
    share = session.exec(
        select(StudyShare).where(
            StudyShare.study_id == study.id, StudyShare.researcher_id == researcher.id
        )
    ).first()
    return share is not None


def visible_study_ids(researcher: Researcher, *, session: Session) -> set[int] | None:
    """Ids of the studies ``researcher`` may see; ``None`` means every study (admin)."""
    if researcher.is_admin:
        return None
    owned = session.exec(select(Study.id).where(Study.owner_id == researcher.id)).all()
    shared = session.exec(
        select(StudyShare.study_id).where(StudyShare.researcher_id == researcher.id)
    ).all()
    return {int(i) for i in owned if i is not None} | {int(i) for i in shared}


def get_visible_study(slug: str, researcher: CurrentResearcher, session: SessionDep) -> Study:
    """Dependency: the study ``slug`` if the researcher may see it; 404 otherwise."""
    study = session.exec(select(Study).where(Study.slug == slug)).first()
    if study is None or not can_see_study(researcher, study, session=session):
        raise NotFoundError(f"no study {slug!r} among your studies")
    return study


VisibleStudy = Annotated[Study, Depends(get_visible_study)]


def share_study(study: Study, email: str, *, session: Session) -> Researcher:
    """Share ``study`` with the researcher ``email`` (idempotent)."""
    value = normalise_email(email)
    researcher = session.exec(select(Researcher).where(Researcher.email == value)).first()
    if researcher is None:
        raise NotFoundError(f"no researcher with email {value!r}")
    if researcher.id == study.owner_id:
        raise InvalidInputError(f"{value} owns this study already")
    exists = session.exec(
        select(StudyShare).where(
            StudyShare.study_id == study.id, StudyShare.researcher_id == researcher.id
        )
    ).first()
    if exists is None:
        session.add(StudyShare(study_id=study.id, researcher_id=researcher.id))  # type: ignore[arg-type]
        session.commit()
    return researcher
