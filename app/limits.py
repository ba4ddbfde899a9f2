"""Request-body size limits, enforced before a body is read into memory (pure ASGI).

:class:`BodyLimitMiddleware` wraps the whole application. For every HTTP request it picks
a limit (``max_upload_bytes`` for the admin's file uploads, :data:`UPLOAD_PATHS`,
``max_body_bytes`` for any other request; both are settings) and then:

* a ``Content-Length`` above the limit is answered ``413`` at once: the app is not called
  and not one byte of the body is read;
* a body without ``Content-Length`` (``Transfer-Encoding: chunked``) or one that lies about
  its length is counted chunk by chunk as the app receives it; the chunk that takes the
  total over the limit is dropped, the ``413`` is sent, and the app is told the client has
  disconnected (``http.disconnect``), so it stops reading. Whatever the app tries to send
  afterwards is discarded. Memory held for the body is therefore bounded by the limit
  plus one chunk (the ASGI server's read size, 64 KiB for uvicorn).

The answer is JSON ``{"code": "payload_too_large", "message": ...}`` (the JSON API's error
shape) with ``Connection: close``, since the rest of the body is never read; a request the
``html_page`` callable answers (the admin pages' browser forms: :func:`app.routes.admin.
html_error_page`) gets that HTML page instead, with the same status.

Inside a body under the limit, one text field of a form (not a file) may hold at most
:data:`FORM_FIELD_MAX_BYTES`: the admin forms are read with that ``max_part_size``, and
Starlette's refusal (400, ``Field exceeded maximum size of 1024KB.``) is put in words by
:func:`form_read_error`, shown on the same admin error page.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UPLOAD_PATHS: tuple[str, ...] = ("/admin/import/upload", "/admin/studies/{slug}/personas/texts")
"""Paths whose bodies are file uploads (the larger limit): a dataset, a persona file.
``{name}`` stands for one path segment."""


def path_regex(path_format: str) -> re.Pattern[str]:
    """``/api/v1/sessions/{session_id}`` -> a regex matching one path segment per parameter."""
    return re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path_format)) + "$")


ERROR_CODE = "payload_too_large"

FORM_FIELD_MAX_BYTES = 1024 * 1024
"""The largest text field of a multipart form (a typed persona list, say): Starlette's
``max_part_size``, passed explicitly wherever an admin form is read. Files are not bound
by it (only by the body limit)."""

HtmlPage = Callable[[Scope, int, str], ASGIApp | None]
"""``(scope, status, message) -> an ASGI response``, or ``None`` to answer JSON."""


def form_read_error(detail: str) -> str:
    """Words for Starlette's refusal of a multipart form (its ``HTTPException`` detail).

    >>> form_read_error("Field exceeded maximum size of 1024KB.")
    'a text field of the form is larger than the limit of 1 MiB for a typed field (Field exceeded maximum size of 1024KB.): put long text in a file and upload it'
    """
    if detail.startswith(("Field exceeded maximum size", "Part exceeded maximum size")):
        return (
            f"a text field of the form is larger than the limit of "
            f"{_mib(FORM_FIELD_MAX_BYTES)} for a typed field ({detail}): put long text in a "
            "file and upload it"
        )
    return f"the form could not be read: {detail}"


def _mib(n: int) -> str:
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{n} bytes"


class BodyLimitMiddleware:
    """Refuse request bodies larger than a per-path limit with 413 (see the module doc).

    Args:
        app: the ASGI application to wrap.
        max_body_bytes: the limit for every request except the dataset upload.
        max_upload_bytes: the limit for :data:`UPLOAD_PATHS`.
        upload_paths: paths that get ``max_upload_bytes`` (``{name}``: any one segment).
        html_page: the page answering a request it takes (a browser's admin form), else
            JSON (:data:`HtmlPage`).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        max_upload_bytes: int,
        upload_paths: tuple[str, ...] = UPLOAD_PATHS,
        html_page: HtmlPage | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes
        self.upload_paths = tuple(path_regex(p) for p in upload_paths)
        self.html_page = html_page

    def limit_for(self, path: str) -> int:
        """The body limit in bytes for a request to ``path``."""
        bare = path.rstrip("/")
        upload = any(p.match(bare) for p in self.upload_paths)
        return self.max_upload_bytes if upload else self.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        limit = self.limit_for(path)
        declared: int | None = None
        for name, value in scope.get("headers", ()):
            if name.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _send_error(send, 400, "bad_request", "Content-Length is not a number")
                    return
                if declared < 0:
                    await _send_error(send, 400, "bad_request", "Content-Length is negative")
                    return
        if declared is not None and declared > limit:
            await self._too_large(scope, receive, send, limit)
            return

        received = 0
        refused = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    if not started:
                        await self._too_large(scope, receive, send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 went out already; the app's own answer is dropped
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise
            # The app failed because its body was cut off (ClientDisconnect or a parser
            # error on a truncated body): the client already has its 413.

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Answer 413: the :attr:`html_page` for a request it takes, else JSON."""
        path = str(scope.get("path", ""))
        message = f"the request body for {path} is larger than the limit of {_mib(limit)}"
        page = None
        if self.html_page is not None:
            page = self.html_page(
                scope,
                413,
                f"the form is larger than the limit of {_mib(limit)} for this page: choose a "
                "smaller file (or split it)",
            )
        if page is None:
            await _send_error(send, 413, ERROR_CODE, message)
            return

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)

        await page(scope, receive, closing)


async def _send_error(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"code": code, "message": message}).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
