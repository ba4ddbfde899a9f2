"""The ``openai`` backend against tiny real HTTP servers: exact parsing and clear errors.

Each server is a real ``http.server`` on 127.0.0.1 (a free port) in a thread. A server that
is down, that never answers, that answers malformed JSON or JSON of the wrong shape must
raise :class:`BackendError` — never return a distribution.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from inference_server.backends import OpenAIBackend, ScoreRequest
from inference_server.errors import BackendError
from inference_server.model_store import resolve_model
from inference_server.prompts import PromptItem
from inference_server.server import free_port

ITEM = PromptItem("q1", "Do you agree?", ("Agree", "Disagree"))
ITEM3 = PromptItem("q2", "Pick one", ("x", "y", "z"))


def chat_body(top: dict[str, float]) -> dict[str, Any]:
    entries = [{"token": t, "logprob": math.log(p), "bytes": None} for t, p in top.items()]
    return {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": next(iter(top))},
                "logprobs": {"content": [{"token": "A", "logprob": 0.0, "top_logprobs": entries}]},
            }
        ]
    }


def completion_body(tops: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "choices": [
            {
                "index": i,
                "text": "A",
                "logprobs": {"top_logprobs": [{t: math.log(p) for t, p in top.items()}]},
            }
            for i, top in reversed(list(enumerate(tops)))  # out of order on purpose
        ]
    }


Handler = Callable[[dict[str, Any]], tuple[int, bytes]]


class _Server:
    def __init__(self, handle: Handler) -> None:
        self.handle = handle
        self.requests: list[dict[str, Any]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n))
                outer.requests.append(body)
                code, payload = outer.handle(body)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], _Server]]:
    servers: list[_Server] = []

    def make(handle: Handler) -> _Server:
        s = _Server(handle)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def backend(url: str, **kw: Any) -> OpenAIBackend:
    kw.setdefault("mode", "chat")
    kw.setdefault("backoff", 0.01)
    kw.setdefault("timeout", 5.0)
    return OpenAIBackend(url, "m", **kw)


def test_chat_parsing_is_exact(serve) -> None:
    top = {"A": 0.6, " A": 0.1, "B": 0.2, "Hello": 0.05}
    s = serve(lambda body: (200, json.dumps(chat_body(top)).encode()))
    (res,) = backend(s.url).score([ScoreRequest("<b>p</b> {{x}}", ITEM)])
    assert res.valid_mass == pytest.approx(0.9)
    assert res.probs == pytest.approx((0.7 / 0.9, 0.2 / 0.9))
    assert not res.flagged
    (req,) = s.requests
    assert req["messages"][0]["content"].endswith("<b>p</b> {{x}}")  # verbatim
    assert req["max_tokens"] == 1 and req["logprobs"] is True and req["top_logprobs"] == 20


def test_low_mass_flagged_and_missing_letter_zero(serve) -> None:
    top = {"A": 0.2, "Sure": 0.7}
    s = serve(lambda body: (200, json.dumps(chat_body(top)).encode()))
    (res,) = backend(s.url, threshold=0.5).score([ScoreRequest("p", ITEM3)])
    assert res.flagged and res.valid_mass == pytest.approx(0.2)
    assert res.probs == pytest.approx((1.0, 0.0, 0.0))


def test_completions_batches_and_orders_by_index(serve) -> None:
    tops = [{"A": 0.5, "B": 0.5}, {" B": 0.9, "A": 0.1}, {"C": 0.3, "A": 0.3, "B": 0.3}]
    items = [ITEM, ITEM, ITEM3]

    def handle(body: dict[str, Any]) -> tuple[int, bytes]:
        n = len(body["prompt"])
        start = 0 if n == 2 else 2
        return 200, json.dumps(completion_body(tops[start : start + n])).encode()

    s = serve(handle)
    tok = str(resolve_model(None)[1])
    b = backend(s.url, mode="completions", batch_size=2, concurrency=1, tokenizer_path=tok)
    res = b.score([ScoreRequest(f"persona {i}", it) for i, it in enumerate(items)])
    for r, want in zip(res, [(0.5, 0.5), (0.1, 0.9), (1 / 3,) * 3], strict=True):
        assert r.probs == pytest.approx(want)
    assert sorted(len(r["prompt"]) for r in s.requests) == [1, 2]
    assert all(r["prompt"][0].startswith("<|im_start|>system") for r in s.requests)


def test_retries_then_succeeds(serve) -> None:
    calls = {"n": 0}

    def handle(body: dict[str, Any]) -> tuple[int, bytes]:
        calls["n"] += 1
        if calls["n"] < 3:
            return 503, b'{"error": "busy"}'
        return 200, json.dumps(chat_body({"A": 0.5, "B": 0.5})).encode()

    s = serve(handle)
    (res,) = backend(s.url, max_retries=3).score([ScoreRequest("p", ITEM)])
    assert res.probs == pytest.approx((0.5, 0.5))
    assert calls["n"] == 3


@pytest.mark.parametrize(
    ("payload", "msg"),
    [
        (b"this is {not json", "the response is not JSON"),
        (b'{"choices": []}', "expected 1 choice"),
        (b'{"choices": [{"index": 0, "message": {}}]}', "no logprobs.content"),
        (
            json.dumps(
                {
                    "choices": [
                        {
                            "logprobs": {
                                "content": [{"top_logprobs": [{"token": "A", "logprob": 3}]}]
                            }
                        }
                    ]
                }
            ).encode(),
            "is not a log-probability",
        ),
    ],
)
def test_garbage_raises(serve, payload: bytes, msg: str) -> None:
    s = serve(lambda body: (200, payload))
    with pytest.raises(BackendError, match=msg):
        backend(s.url).score([ScoreRequest("p", ITEM)])


def test_client_error_not_retried(serve) -> None:
    s = serve(lambda body: (404, b'{"error": "model m does not exist"}'))
    with pytest.raises(BackendError, match="HTTP 404.*does not exist"):
        backend(s.url, max_retries=3).score([ScoreRequest("p", ITEM)])
    assert len(s.requests) == 1


def test_server_down() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(BackendError, match=r"cannot connect.*after 2 attempts"):
        backend(url, max_retries=1).score([ScoreRequest("p", ITEM)])
    with pytest.raises(BackendError, match="/v1/models"):
        backend(url).health()


def test_server_that_never_answers_times_out() -> None:
    with socket.socket() as sock:  # accepts connections (backlog) but never replies
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(BackendError, match=r"timed out after 0.3 s \(after 2 attempts\)"):
            backend(url, timeout=0.3, max_retries=1).score([ScoreRequest("p", ITEM)])
