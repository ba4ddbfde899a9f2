"""ASGI middleware and logging filters that guard every request: log redaction, hostile
input, security headers.

* :class:`RedactPathSecrets` / :func:`install_log_redaction`: tokens in paths stay out of
  the logs (below).
* :class:`HostileInputMiddleware`: 422 for a NUL character or a lone surrogate in the path,
  the query, a form field or a JSON string, naming where, before any route runs.
* :class:`SecurityHeadersMiddleware`: CSP, framing, nosniff, referrer and (in prod) HSTS
  headers on every answer.
* :class:`ApiKeyUseMiddleware`: records when each API key was last used (the admin's key
  list shows it).
* :class:`ApiCorsMiddleware`: CORS for ``/api/v1`` from the origins the deployment names.
* :class:`HeadAsGetMiddleware`: ``HEAD`` on any page answers what ``GET`` would, without
  the body.

Keeping secrets out of log lines.

Three links carry a credential in their path, by design (a person follows them without
any other credential): a respondent's resume link ``/s/{slug}/resume/{token}``, an
invitation ``/admin/invite/{token}`` and a group-round member link ``/g/{token}``. The ASGI
server's access log writes every request path, so without care these tokens would end up
in log files (and in whatever collects them). :class:`RedactPathSecrets` is a logging
filter that replaces the token part of such paths with ``[redacted]`` in every record of
the loggers it is attached to; :func:`install_log_redaction` attaches it to uvicorn's
access and error loggers and to the app's own (``priorly``).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote_plus

from anyio import to_thread
from starlette.middleware.cors import CORSMiddleware

from app.limits import HtmlPage
from app.ratelimit import bearer_credential
from app.services.apikeys import (
    KEY_PREFIX,
    LAST_USED_RESOLUTION_S,
    hash_key,
    record_key_use,
)
from app.textguard import bad_character, clip

SECRET_PATHS = re.compile(r"(/resume/|/admin/invite/|/g/)([^/?#\s\"']+)")
"""Path segments that are credentials: the segment after any of these prefixes."""

REDACTED = "[redacted]"
LOGGERS = ("uvicorn.access", "uvicorn.error", "uvicorn", "priorly")


def redact(text: str) -> str:
    """``text`` with the token segment of every credential-bearing path replaced."""
    return SECRET_PATHS.sub(lambda m: m.group(1) + REDACTED, text)


class RedactPathSecrets(logging.Filter):
    """Rewrite a record's message arguments (and message) so no path token is logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {
                k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()
            }
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


_FILTER = RedactPathSecrets()


def install_log_redaction() -> None:
    """Attach the filter to uvicorn's and the app's loggers (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


# ----- hostile input: NUL characters and lone surrogates ----------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_JSON_SUSPECT = re.compile(rb"\x00|\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
"""A JSON body can only hold a bad character if its bytes match this (NUL, ``\\u0000`` or a
``\\uD800``-``\\uDFFF`` escape): the body is parsed only then."""


class HostileInputError(ValueError):
    """A request part holds a character no text column can store (answered 422)."""


def _check(value: str, where: str) -> None:
    problem = bad_character(value)
    if problem is not None:
        raise HostileInputError(f"{where} contains {problem}: remove it and send again")


def _check_pairs(raw: bytes, kind: str, *, once: bool = False) -> None:
    """Check the names and values of ``a=1&b=2`` (a query string or a urlencoded form);
    with ``once``, a name given twice is refused too (no query parameter of the app takes
    several values, and which of two ``limit`` values counts cannot be known)."""
    seen: set[str] = set()
    for pair in raw.split(b"&"):
        name_raw, _, value_raw = pair.partition(b"=")
        name = unquote_plus(name_raw.decode("latin-1"), errors="replace")
        _check(name, f"the name of a {kind}")
        if once and name in seen:
            raise HostileInputError(f"{kind} {clip(name, 60)!r} is given twice")
        seen.add(name)
        _check(
            unquote_plus(value_raw.decode("latin-1"), errors="replace"),
            f"{kind} {clip(name, 60)!r}",
        )


def _json_path(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    text = str(key)
    return f"{path}.{text}" if text.isidentifier() else f"{path}[{clip(text, 60)!r}]"


def _no_repeated_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise HostileInputError(
                f"the JSON body repeats the key {clip(key, 60)!r} in one object: send each key once"
            )
        seen.add(key)
    return dict(pairs)


def _check_json(raw: bytes) -> None:
    """Check a JSON body: no object repeats a key (a parser would keep one of the values
    silently), and every string (keys included) can be stored; the error names the key or
    the JSON path.

    A body that is not UTF-8, nested too deeply to read, or holds a number too long to
    convert is refused here with those words; malformed JSON is left to the route (which
    answers 422 with the position). Strings are walked only when the bytes may hold a bad
    character (:data:`_JSON_SUSPECT`).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HostileInputError(f"the JSON body is not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_repeated_keys)
    except HostileInputError:
        raise
    except RecursionError:
        raise HostileInputError("the JSON body is nested too deeply to read") from None
    except json.JSONDecodeError:
        return
    except ValueError as exc:
        if "digits" in str(exc):  # Python's int conversion limit
            raise HostileInputError(
                "the JSON body holds a number of more than 4,300 digits: send a shorter one"
            ) from None
        raise HostileInputError(f"the JSON body cannot be read: {exc}") from None
    if not _JSON_SUSPECT.search(raw):
        return
    stack: list[tuple[str, object]] = [("$", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            _check(value, f"the JSON body at {path}")
        elif isinstance(value, dict):
            for key, item in value.items():
                _check(key, f"a key of the JSON body at {path}")
                stack.append((_json_path(path, key), item))
        elif isinstance(value, list):
            stack.extend((_json_path(path, i), item) for i, item in enumerate(value))


def _check_multipart(raw: bytes, content_type: str) -> None:
    """Check the text fields (not the files) of a ``multipart/form-data`` body with a NUL.

    Uploaded files are checked by the importer (their NULs are reported with file and
    line); here only the parts without a ``filename`` are looked at.
    """
    if b"\x00" not in raw:
        return
    boundary = ""
    for param in content_type.split(";")[1:]:
        name, _, value = param.strip().partition("=")
        if name.lower() == "boundary":
            boundary = value.strip('"')
    if not boundary:
        return
    for part in raw.split(b"--" + boundary.encode("latin-1")):
        head, sep, body = part.partition(b"\r\n\r\n")
        if not sep or b"filename=" in head.lower():
            continue
        found = re.search(rb'name="([^"]*)"', head)
        field = found.group(1).decode("utf-8", "replace") if found else "?"
        if b"\x00" in body.removesuffix(b"\r\n"):
            raise HostileInputError(
                f"form field {clip(field, 60)!r} contains a NUL character (U+0000): "
                "remove it and send again"
            )


class HostileInputMiddleware:
    """Answer 422 for a request whose path, query, form fields or JSON strings hold a NUL
    character or a lone surrogate, or whose query gives a parameter twice (outside the
    survey pages, whose link parameters their consent page checks), before any route runs
    (pure ASGI).

    PostgreSQL cannot store U+0000 in text (the driver raises ``DataError``) and no database
    can store a lone surrogate as UTF-8, so such a value would fail deep inside a route
    with a 500. The answer is the JSON error ``{"code": "invalid_input", "message": ...}``
    and the message says what and where: ``the path``, ``query parameter 'x'``,
    ``form field 'email'``, ``the JSON body at $.external_id``.

    Bodies are read (up to the body limit, :mod:`app.limits`, which runs first) only for
    ``application/x-www-form-urlencoded``, JSON and ``multipart/form-data`` requests, and
    replayed to the app unchanged. A JSON body is parsed only if its bytes could hold such a
    character, so ordinary calls pay one regular-expression scan.
    """

    def __init__(self, app: ASGIApp, html_page: HtmlPage | None = None) -> None:
        self.app = app
        self.html_page = html_page

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, message: str) -> None:
        """Answer 422: the :attr:`html_page` for a request it takes (a browser's admin
        form), else the JSON error."""
        page = self.html_page(scope, 422, message) if self.html_page is not None else None
        if page is None:
            await _refuse(send, message)
        else:
            await page(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            _check(str(scope.get("path", "")), "the path")
            query = scope.get("query_string", b"")
            if query:  # a survey link's parameters are checked by its page ("Invalid link")
                path = str(scope.get("path", ""))
                _check_pairs(query, "query parameter", once=not path.startswith(("/s/", "/g/")))
        except HostileInputError as exc:
            await self._refuse(scope, receive, send, str(exc))
            return
        content_type = ""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"content-type":
                content_type = value.decode("latin-1")  # the boundary's case matters
        kind = content_type.split(";")[0].strip().lower()
        is_json = kind == "application/json" or kind.endswith("+json")
        if kind not in ("application/x-www-form-urlencoded", "multipart/form-data") and not is_json:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        chunks: list[bytes] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            if is_json:
                _check_json(body)
            elif kind == "multipart/form-data":
                _check_multipart(body, content_type)
            else:
                _check_pairs(body, "form field")
        except HostileInputError as exc:
            await self._refuse(scope, receive, send, str(exc))
            return

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replay, send)


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"code": "invalid_input", "message": message}).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": 422,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# ----- security headers ---------------------------------------------------------------------

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self' https:; "
    "frame-ancestors 'none'; base-uri 'self'; object-src 'none'"
)
"""The pages' policy: scripts only from this server (htmx and the app's own files; no
inline script, no ``eval``), styles from this server plus inline ``style`` (htmx sets some),
no framing by any site, forms posted to this server (or, after the last page, to the
study's https redirect URL)."""

HSTS = "max-age=31536000; includeSubDomains"


class SecurityHeadersMiddleware:
    """Add the security headers to every HTTP response (pure ASGI).

    Every response: ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY``,
    ``Referrer-Policy: no-referrer`` (resume and invitation links carry a token in their
    path) and a ``Content-Security-Policy`` (:data:`CONTENT_SECURITY_POLICY`). With ``hsts`` (``PRIORLY_ENV=prod``,
    served over https) also ``Strict-Transport-Security``. A header the app set itself is
    kept.
    """

    def __init__(self, app: ASGIApp, *, hsts: bool = False) -> None:
        self.app = app
        self.hsts = hsts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = CONTENT_SECURITY_POLICY
        extra = [
            (b"x-content-type-options", b"nosniff"),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"no-referrer"),
            (b"content-security-policy", csp.encode("ascii")),
        ]
        if self.hsts:
            extra.append((b"strict-transport-security", HSTS.encode("ascii")))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers.extend((n, v) for n, v in extra if n not in present)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


HTTPS_ONLY_PATHS = ("/admin/", "/s/", "/g/")
"""The pages that need cookies (the admin, the surveys, the group round links)."""

HTTPS_REQUIRED_PAGE = (
    b"<!doctype html><meta charset=utf-8><title>HTTPS required</title>"
    b"<h1>This server must be reached over HTTPS</h1>"
    b"<p>It runs with <code>PRIORLY_ENV=prod</code>: its cookies are sent over HTTPS only, "
    b"so over plain HTTP no login or survey can work. Open this address with "
    b"<code>https://</code>, or serve it behind a proxy that terminates HTTPS and sends "
    b"<code>X-Forwarded-Proto: https</code> from an address listed in "
    b"<code>PRIORLY_TRUSTED_PROXIES</code>.</p>"
)


class HttpsRequiredMiddleware:
    """In prod (``PRIORLY_ENV=prod``, cookies ``__Host-``/``Secure``): a request to a page
    that needs cookies (:data:`HTTPS_ONLY_PATHS`, ``/admin``) whose scheme is ``http``
    after the proxy headers (``scope["scheme"]``) gets 400 with a page saying HTTPS is
    required, before any route runs (nothing is stored: no respondent, no login).
    ``/healthz``, ``/api`` (bearer credentials, no cookies), the home page and
    ``/static`` stay reachable. Pure ASGI; added inside uvicorn's proxy-headers middleware.

    Example: ``GET http://host/s/ces`` directly on uvicorn in prod: 400; the same through
    a trusted proxy sending ``X-Forwarded-Proto: https``: the survey.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if (
            scope["type"] == "http"
            and scope.get("scheme") == "http"
            and (path == "/admin" or path.startswith(HTTPS_ONLY_PATHS))
        ):
            await send(
                {
                    "type": "http.response.start",
                    "status": 400,
                    "headers": [
                        (b"content-type", b"text/html; charset=utf-8"),
                        (b"content-length", str(len(HTTPS_REQUIRED_PAGE)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": HTTPS_REQUIRED_PAGE})
            return
        await self.app(scope, receive, send)


class ApiCorsMiddleware:
    """CORS on ``/api/v1`` only, for the origins of ``PRIORLY_API_CORS_ORIGINS`` (pure ASGI
    around Starlette's :class:`~starlette.middleware.cors.CORSMiddleware`).

    A browser page of an allowed origin may call the API with ``Authorization`` and
    ``Content-Type`` headers (GET, POST, DELETE) and read ``Retry-After`` and
    ``Idempotent-Replayed``; no cookie is ever allowed, and the admin and survey pages get
    no CORS header. Example: with ``origins=["https://app.example.com"]`` the preflight
    ``OPTIONS /api/v1/sessions/1`` from that origin is 200 with
    ``Access-Control-Allow-Origin: https://app.example.com``.
    """

    def __init__(self, app: ASGIApp, *, origins: list[str]) -> None:
        self.app = app
        self.cors = CORSMiddleware(
            app,
            allow_origins=origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=["Retry-After", "Idempotent-Replayed"],
            allow_credentials=False,
            max_age=600,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith("/api/v1/"):
            await self.cors(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class HeadAsGetMiddleware:
    """Answer ``HEAD`` as ``GET`` without the body, on every path (pure ASGI, RFC 9110 9.3.2).

    The routes declare ``GET`` only; a ``HEAD`` (an uptime monitor, a link checker, a
    mail client previewing a survey link) is routed as ``GET``, and the answer keeps its
    status and headers (``Content-Length`` included) while its body is dropped. Example:
    ``HEAD /s/ces`` is 200 with the consent page's headers and no body, where it was 405.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        finished = False

        async def send_without_body(message: Message) -> None:
            nonlocal finished
            if message["type"] != "http.response.body":
                await send(message)
            elif not finished:
                finished = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.app({**scope, "method": "GET"}, receive, send_without_body)


class ApiKeyUseMiddleware:
    """Record ``api_key.last_used_at`` for an ``/api/`` call with an API key that the API
    answered with a 2xx status (:func:`app.services.apikeys.record_key_use`, in a thread).

    A process writes a key's time at most once per
    :data:`~app.services.apikeys.LAST_USED_RESOLUTION_S` (its own memory of what it wrote,
    bounded), so a busy key costs one small write a minute, not one per call. A failed
    write is logged and never fails the call.
    """

    def __init__(self, app: Any, *, max_remembered: int = 10_000) -> None:
        self.app = app
        self.max_remembered = max_remembered
        self._written: dict[str, float] = {}  # key hash -> time.monotonic() of our write

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith("/api/"):
            await self.app(scope, receive, send)
            return
        credential = bearer_credential(scope)
        if not credential.startswith(KEY_PREFIX):
            await self.app(scope, receive, send)
            return
        status = 0

        async def send_status(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await self.app(scope, receive, send_status)
        if not 200 <= status < 300:
            return
        now, digest = time.monotonic(), hash_key(credential)
        if now - self._written.get(digest, -1e18) < LAST_USED_RESOLUTION_S:
            return
        if len(self._written) >= self.max_remembered:
            self._written.clear()
        self._written[digest] = now
        engine = getattr(scope["app"].state, "engine", None)
        if engine is None:
            return
        try:
            await to_thread.run_sync(record_key_use, engine, credential)
        except Exception as exc:  # noqa: BLE001 - bookkeeping never fails a call
            logging.getLogger("priorly").warning(
                "api key last use not recorded: %s", type(exc).__name__
            )
