"""A fake vLLM: a real HTTP server on 127.0.0.1 speaking the subset of the OpenAI API that
``inference_server``'s OpenAI backend uses (``GET /v1/models``, ``POST /v1/completions``).

Its answer for a prompt is a known function of the prompt text (:func:`p_first`), so every
stored distribution can be checked exactly; it can be switched to answering garbage
(``garbage_after``) and records the prompts, the request count and the ``Authorization``
headers it saw.

Example::

    fake = FakeVLLM()
    try:
        args = ["personas", "generate", "--study", "gen-test", "--backend", "openai"]
        assert main([*args, "--base-url", fake.url]) == 0  # app.cli.main
        assert fake.requests > 0 and all(p_first(p) > 0 for p in fake.prompts)
    finally:
        fake.close()
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from inference_server.model_store import DEFAULT_MODEL


def p_first(prompt: str) -> float:
    """The server's probability of letter A for a prompt (a known function of its text)."""
    return 0.05 + 0.9 * (int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF)


class FakeVLLM:
    """A real HTTP server speaking the completions subset of the OpenAI API."""

    def __init__(self) -> None:
        self.garbage_after: int | None = None
        self.prompts: list[str] = []
        self.requests = 0
        self.authorization: set[str | None] = set()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802  (GET /v1/models: the served model)
                outer.authorization.add(self.headers.get("Authorization"))
                payload = json.dumps({"data": [{"id": DEFAULT_MODEL}]}).encode()
                self.send_response(200 if self.path == "/v1/models" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.authorization.add(self.headers.get("Authorization"))
                outer.requests += 1
                if outer.garbage_after is not None and outer.requests > outer.garbage_after:
                    payload = b'{"choices": [{"index": 0, "logprobs": {"top_logprobs": [{"A"'
                else:
                    choices = []
                    for i, prompt in enumerate(body["prompt"]):
                        outer.prompts.append(prompt)
                        a = p_first(prompt)
                        top = {"A": math.log(a * 0.9), " B": math.log((1 - a) * 0.9)}
                        top["Sure"] = math.log(0.1)
                        choices.append(
                            {"index": i, "text": "A", "logprobs": {"top_logprobs": [top]}}
                        )
                    payload = json.dumps({"choices": choices}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving and close the listening socket."""
        self.httpd.shutdown()
        self.httpd.server_close()
