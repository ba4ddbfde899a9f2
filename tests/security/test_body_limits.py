"""Oversized request bodies are refused with 413 before they are read (app/limits.py).

A real uvicorn process (small limits through its settings: 64 KiB for bodies, 1 MiB for the
dataset upload) receives raw HTTP over a socket:

* a declared ``Content-Length`` over the limit is answered 413 although not one byte of the
  body was sent (so the server cannot have read it);
* a chunked body with no ``Content-Length`` is streamed until the server answers: 413 comes
  back after at most the limit plus a few chunks, long before the 32 MiB the client was
  ready to send, and the server's resident memory grows by far less than the body;
* the dataset upload has its own (larger) limit; a body under a limit reaches the app.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from app.db import upgrade
from tests.support.secutil import LiveServer, live_server

BODY_LIMIT = 64 * 1024
UPLOAD_LIMIT = 1024 * 1024
CHUNK = 64 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("limits")
    url = f"sqlite:///{folder / 'limits.db'}"
    upgrade(url)
    env = {
        "PRIORLY_MAX_BODY_BYTES": str(BODY_LIMIT),
        "PRIORLY_MAX_UPLOAD_BYTES": str(UPLOAD_LIMIT),
    }
    with live_server(url, folder / "server.log", env_extra=env, log_level="warning") as srv:
        yield srv


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP response (status, lower-cased headers, body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        if not part:
            break
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), f"no HTTP response: {data[:200]!r}"
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        part = sock.recv(65536)
        if not part:
            break
        body += part
    return status, headers, body


def _stream_chunked(
    srv: LiveServer,
    path: str,
    total: int,
    content_type: str = "application/json",
    preamble: bytes = b"",
) -> tuple[int, dict[str, str], bytes, int]:
    """POST a chunked body of up to ``total`` bytes; stop sending once the server answers.

    Returns ``(status, headers, body, bytes sent)``. A sending thread streams the chunks
    while this thread waits for the response, so the answer is read as soon as it comes.
    """
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    sock.sendall(
        (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
        + (b"%x\r\n" % len(preamble) + preamble + b"\r\n" if preamble else b"")
    )
    answered = threading.Event()
    sent = [0]
    chunk = b"%x\r\n" % CHUNK + b"x" * CHUNK + b"\r\n"

    def pump() -> None:
        try:
            while sent[0] < total and not answered.is_set():
                sock.sendall(chunk)
                sent[0] += CHUNK
            if not answered.is_set():
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server closed the connection after its 413

    sender = threading.Thread(target=pump, daemon=True)
    sender.start()
    try:
        status, headers, body = _read_response(sock)
    finally:
        answered.set()
        sender.join(timeout=30)
        sock.close()
    return status, headers, body, sent[0]


def test_declared_length_over_limit_is_refused_without_reading(server: LiveServer) -> None:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        sock.sendall(
            b"POST /api/v1/sessions/1/answers HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
        )  # no body byte is ever sent: only an answer before reading explains a response
        status, headers, body = _read_response(sock)
    finally:
        sock.close()
    assert status == 413
    assert headers["connection"] == "close"
    payload = json.loads(body)
    assert payload["code"] == "payload_too_large"
    assert (
        "/api/v1/sessions/1/answers" in payload["message"] and "65536 bytes" in payload["message"]
    )


def test_chunked_body_over_limit_is_cut_off_with_bounded_memory(server: LiveServer) -> None:
    before = server.rss_kib()
    total = 32 * 1024 * 1024
    status, _headers, body, sent = _stream_chunked(server, "/api/v1/sessions/1/answers", total)
    after = server.rss_kib()
    assert status == 413
    assert json.loads(body)["code"] == "payload_too_large"
    # The refusal came while the client was still sending, not after the whole body.
    assert sent < total // 2, f"the client sent {sent} bytes before the 413"
    assert after - before < 8 * 1024, f"server RSS grew by {after - before} KiB"
    # The server still answers afterwards.
    import httpx

    assert httpx.get(f"{server.base}/healthz", timeout=10).status_code == 200


MULTIPART = "multipart/form-data; boundary=xyz"
FILE_PART = b'--xyz\r\nContent-Disposition: form-data; name="responses"; filename="r.csv"\r\n\r\n'


def test_upload_path_has_its_own_limit(server: LiveServer) -> None:
    # Over the body limit but under the upload limit: the upload reaches the app (which
    # finds the multipart body unterminated or asks for a login), not refused for its size.
    status, _h, _b, _sent = _stream_chunked(
        server, "/admin/import/upload", 4 * CHUNK, MULTIPART, FILE_PART
    )
    assert status in (400, 401, 403)
    status, _h, body, sent = _stream_chunked(
        server, "/admin/import/upload", 16 * 1024 * 1024, MULTIPART, FILE_PART
    )
    assert status == 413
    assert "1 MiB" in json.loads(body)["message"]
    assert sent < 8 * 1024 * 1024


def test_a_persona_file_upload_gets_the_upload_limit(server: LiveServer) -> None:
    """Persona texts are uploaded to a path with the study in it: the upload limit applies
    there (and to no other path of the study)."""
    from app.limits import BodyLimitMiddleware

    limits = BodyLimitMiddleware(None, max_body_bytes=1, max_upload_bytes=2)  # type: ignore[arg-type]
    assert limits.limit_for("/admin/studies/my-study/personas/texts") == 2
    assert limits.limit_for("/admin/studies/my-study/personas/texts/") == 2
    assert limits.limit_for("/admin/studies/my-study/personas/shares") == 1
    assert limits.limit_for("/admin/studies/a/b/personas/texts") == 1
    status, _h, _b, _sent = _stream_chunked(
        server, "/admin/studies/x/personas/texts", 4 * CHUNK, MULTIPART, FILE_PART
    )
    assert status in (400, 401, 403)


def test_small_body_reaches_the_app(server: LiveServer) -> None:
    import httpx

    r = httpx.post(
        f"{server.base}/api/v1/sessions/1/answers",
        json={"item": "x", "option": "A", "idempotency_key": "k"},
        timeout=10,
    )
    assert r.status_code == 401
    assert r.json()["code"] == "unauthenticated"
    r = httpx.post(
        f"{server.base}/api/v1/sessions/1/answers",
        content=b"{" + b" " * (BODY_LIMIT + 1) + b"}",
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 413
