"""The ``openai`` backend against tiny real HTTP servers: exact parsing and clear errors.

Each server is a real ``http.server`` on 127.0.0.1 (a free port) in a thread. A server that
is down, that never answers, that answers malformed JSON or JSON of the wrong shape must
raise :class:`BackendError` — never return a distribution.
"""

from __future__ import annotations

import contextlib
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
from inference_server.prompts import DEFAULT_TEMPLATE, PromptItem
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
    def __init__(self, handle: Handler, models: tuple[str, ...], tokenize: bool) -> None:
        self.handle = handle
        self.models = models
        self.tokenize = tokenize
        self.requests: list[dict[str, Any]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def reply(self, code: int, payload: bytes) -> None:
                # A client that timed out has closed the connection: nothing to answer.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

            def do_GET(self) -> None:  # noqa: N802
                if self.path != "/v1/models":
                    self.reply(404, b'{"detail": "Not Found"}')
                    return
                self.reply(200, json.dumps({"data": [{"id": m} for m in outer.models]}).encode())

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n))
                if self.path == "/tokenize" and not outer.tokenize:
                    self.reply(404, b'{"detail": "Not Found"}')
                    return
                body["_path"] = self.path
                outer.requests.append(body)
                self.reply(*outer.handle(body))

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

    def make(handle: Handler, models: tuple[str, ...] = ("m",), tokenize: bool = False) -> _Server:
        s = _Server(handle, models, tokenize)
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
    assert b.template_from == "local"
    res = b.score([ScoreRequest(f"persona {i}", it) for i, it in enumerate(items)])
    for r, want in zip(res, [(0.5, 0.5), (0.1, 0.9), (1 / 3,) * 3], strict=True):
        assert r.probs == pytest.approx(want)
    assert {r["_path"] for r in s.requests} == {"/v1/completions"}  # no /tokenize
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
    for call in (lambda b: b.score([ScoreRequest("p", ITEM)]), lambda b: b.health()):
        with pytest.raises(BackendError, match=rf"^{url}/v1/models: cannot reach the inference"):
            call(backend(url))


def test_a_port_out_of_range_is_one_clear_error() -> None:
    with pytest.raises(BackendError, match=r"^'http://127.0.0.1:88211': the port must be a"):
        backend("http://127.0.0.1:88211")
    b = backend("http://127.0.0.1:8001")
    b.base_url = "http://127.0.0.1:88211/v1"  # past the constructor: the socket's own error
    for call in (lambda: b.score([ScoreRequest("p", ITEM)]), b.health):
        with pytest.raises(BackendError, match=r"^http://127.0.0.1:88211/v1/models: cannot re"):
            call()


def test_server_that_never_answers_times_out() -> None:
    with socket.socket() as sock:  # accepts connections (backlog) but never replies
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(BackendError, match=r"/v1/models: .* did not answer within 0.3 s"):
            backend(url, timeout=0.3).score([ScoreRequest("p", ITEM)])


def test_request_that_never_answers_is_retried_then_fails(serve) -> None:
    release = threading.Event()

    def handle(body: dict[str, Any]) -> tuple[int, bytes]:
        release.wait()  # holds the request until the test ends
        return 200, json.dumps(chat_body({"A": 1.0})).encode()

    s = serve(handle)
    try:
        with pytest.raises(BackendError, match=r"timed out after 0.3 s \(after 2 attempts\)"):
            backend(s.url, timeout=0.3, max_retries=1).score([ScoreRequest("p", ITEM)])
    finally:
        release.set()
    assert len(s.requests) == 2


def test_wrong_model_names_the_url_and_the_served_models(serve) -> None:
    s = serve(lambda body: (200, json.dumps(chat_body({"A": 1.0})).encode()), ("x/Llama", "y"))
    for mode in ("chat", "completions"):
        b = backend(s.url, mode=mode)
        with pytest.raises(BackendError) as err:
            b.score([ScoreRequest("p", ITEM)])
        assert str(err.value) == (
            f"the inference server at {s.url} does not serve 'm'; it serves: x/Llama, y"
        )
        with pytest.raises(BackendError, match="it serves: x/Llama, y"):
            b.check()
    assert s.requests == []  # nothing was scored


def test_completions_with_the_server_chat_template(serve) -> None:
    """No local tokenizer: ``/tokenize`` renders each prompt's ids, which are what is scored."""

    def handle(body: dict[str, Any]) -> tuple[int, bytes]:
        if body["_path"] == "/tokenize":
            system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
            return 200, json.dumps({"tokens": [len(system), len(user), 7], "count": 3}).encode()
        tops = [{"A": 0.25 if ids[0] % 2 else 0.75, "B": 0.25} for ids in body["prompt"]]
        return 200, json.dumps(completion_body(tops)).encode()

    s = serve(handle, tokenize=True)
    b = backend(s.url, mode="completions", template_from="auto", batch_size=2)
    assert b.template_from == "server"  # model "m" has no local folder
    reqs = [ScoreRequest(p, it) for p in ("<b>odd</b>", "even{{x}}!") for it in (ITEM, ITEM3)]
    res = b.score(reqs)
    tokenized = [r for r in s.requests if r["_path"] == "/tokenize"]
    completions = [r for r in s.requests if r["_path"] == "/v1/completions"]
    assert len(tokenized) == 1 + len(reqs)  # the probe, then one per pair
    for r in tokenized[1:]:
        assert r["add_generation_prompt"] is True and r["add_special_tokens"] is False
        assert r["model"] == "m"
    assert {r["messages"][0]["content"].split("Person: ")[1] for r in tokenized[1:]} == {
        "<b>odd</b>",
        "even{{x}}!",
    }
    sent = [ids for r in completions for ids in r["prompt"]]
    assert sorted(map(tuple, sent)) == sorted(
        (len(t["messages"][0]["content"]), len(t["messages"][1]["content"]), 7)
        for t in tokenized[1:]
    )
    for req, r in zip(reqs, res, strict=True):
        system = DEFAULT_TEMPLATE.messages(req.persona, req.item)[0]["content"]
        a = 0.25 if len(system) % 2 else 0.75
        want = (a / (a + 0.25), 0.25 / (a + 0.25))
        assert r.probs[:2] == pytest.approx(want)


def test_server_without_tokenize_falls_back_to_chat(serve) -> None:
    s = serve(lambda body: (200, json.dumps(chat_body({"A": 0.5, "B": 0.5})).encode()))
    b = backend(s.url, mode="completions")
    (res,) = b.score([ScoreRequest("p", ITEM)])
    assert b.mode == "chat" and res.probs == pytest.approx((0.5, 0.5))
    assert [r["_path"] for r in s.requests] == ["/v1/chat/completions"]


@pytest.mark.parametrize("tokens", [[], ["a"], [True], None])
def test_bad_tokenize_answer_raises(serve, tokens: Any) -> None:
    def handle(body: dict[str, Any]) -> tuple[int, bytes]:
        return 200, json.dumps({"tokens": tokens}).encode()

    s = serve(handle, tokenize=True)
    with pytest.raises(BackendError, match=r"/tokenize: 'tokens' is not a non-empty list"):
        backend(s.url, mode="completions").score([ScoreRequest("p", ITEM)])
    assert all(r["_path"] == "/tokenize" for r in s.requests)


def test_template_from_local_without_folder_is_a_clear_error() -> None:
    with pytest.raises(BackendError, match="needs the tokenizer of 'm'"):
        backend("http://127.0.0.1:1", mode="completions", template_from="local")
