"""The ``openai`` backend: any OpenAI-compatible server, first of all vLLM.

Two request modes:

* ``"completions"`` (default) — ``POST /v1/completions`` with the chat-templated prompt,
  ``max_tokens=1``, ``logprobs=k``, ``temperature=0``. Several prompts go in one request
  (``prompt`` is a list), which vLLM batches; with prefix caching on, each persona's
  shared prefix is computed once on the server. The chat template is applied

  - here, with the model's own tokenizer (``template_from="local"``: a local model folder,
    or the embedded model's converted folder), giving the prompt text byte-identical to
    what the ``local`` backend scores; or
  - by the server (``template_from="server"``): vLLM's ``POST /tokenize`` with
    ``messages`` and ``add_generation_prompt=true`` returns the token ids of the rendered
    chat, which go to ``/v1/completions`` as ``prompt`` (a list of id lists). This works
    for any chat model the server serves, with no local files. A server without
    ``/tokenize`` (HTTP 404) makes the backend fall back to ``"chat"`` mode.
* ``"chat"`` — ``POST /v1/chat/completions`` with the messages, ``logprobs=true``,
  ``top_logprobs=k``, one pair per request (the server applies the chat template).

Before its first request the backend checks ``GET /v1/models``: a server that cannot be
reached, or that does not serve ``model``, raises one
:class:`~inference_server.errors.BackendError` naming the URL and the models it serves.

The letters' probabilities are read from the top-``k`` log-probabilities of the single
generated position (:func:`~inference_server.prompts.letters_from_top_logprobs`); with
``k = 20`` and a handful of option letters this is exact up to the mass of tokens outside
the top ``k``.

Requests run on an ``httpx.AsyncClient`` with a concurrency limit (a semaphore), a
timeout, and retries with exponential backoff on connection errors, timeouts, HTTP 429
and 5xx. Anything else — a 4xx, a body that is not JSON, JSON of the wrong shape, a
choice missing or duplicated, log-probabilities that are not numbers — raises
:class:`~inference_server.errors.BackendError` naming the URL and the problem. A wrong
distribution is never returned.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from inference_server.backends.base import Backend, ScoreRequest, register_backend
from inference_server.errors import BackendError
from inference_server.model_store import DEFAULT_MODEL, MARKER, cache_dir, is_model_folder
from inference_server.prompts import (
    DEFAULT_MASS_THRESHOLD,
    DEFAULT_TEMPLATE,
    LetterScore,
    PromptTemplate,
    letter_distribution,
    letters_from_top_logprobs,
)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})

CONNECTION_ERRORS = (httpx.HTTPError, httpx.InvalidURL, OSError, OverflowError, ExceptionGroup)
"""What a request can raise before any answer: httpx's errors, and what the socket layer
raises through them (an out-of-range port's ``OverflowError``, wrapped in an
``ExceptionGroup`` by the connect's task group)."""


def _connection_error(exc: BaseException) -> str:
    """``"Type: message"`` of a connection error; an exception group by its first leaf."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


@register_backend("openai")
class OpenAIBackend(Backend):
    """Client of an OpenAI-compatible server.

    Args:
        base_url: the server root, e.g. ``http://127.0.0.1:8000`` (``/v1`` is appended
            when missing).
        model: the served model name (``model_id`` of stored distributions).
        mode: ``"completions"`` or ``"chat"``.
        tokenizer_path: a local model folder whose tokenizer renders the chat template
            (``"completions"`` mode).
        template_from: where the chat template is applied in ``"completions"`` mode:
            ``"local"`` (``tokenizer_path``, else the embedded model's converted folder when
            ``model`` is the embedded model's name), ``"server"`` (vLLM's ``/tokenize``), or
            ``"auto"`` (default): ``"local"`` when such a folder exists, else ``"server"``.
        api_key: sent as a bearer token when given.
        template: the prompt template.
        threshold: valid-letter mass below which a pair is flagged.
        batch_size: prompts per completions request.
        concurrency: requests in flight at once.
        timeout: seconds per request.
        max_retries: retries after the first attempt (connection errors, timeouts, 429,
            5xx), waiting ``backoff · 2^attempt`` seconds (± 10% jitter) in between.
        backoff: the first wait in seconds.
        top_logprobs: ``k`` (vLLM's default server limit is 20).

    Example (a model whose files are only on the server)::

        b = OpenAIBackend("http://gpu-box:8001", "Qwen/Qwen2.5-7B-Instruct")
        b.template_from                      # "server": no local folder for that name
        b.check()                            # ["Qwen/Qwen2.5-7B-Instruct"], else BackendError
        (s,) = b.score([ScoreRequest("A retired teacher from Ohio.", item)])
        s.probs                              # one probability per option of ``item``
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        mode: str = "completions",
        tokenizer_path: str | None = None,
        template_from: str = "auto",
        api_key: str | None = None,
        template: PromptTemplate = DEFAULT_TEMPLATE,
        threshold: float = DEFAULT_MASS_THRESHOLD,
        batch_size: int = 32,
        concurrency: int = 4,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        top_logprobs: int = 20,
    ) -> None:
        super().__init__(model_id=model, template=template, threshold=threshold)
        if mode not in ("completions", "chat"):
            raise BackendError(f"unknown mode {mode!r} (completions, chat)")
        if template_from not in ("auto", "local", "server"):
            raise BackendError(f"unknown template_from {template_from!r} (auto, local, server)")
        if batch_size < 1 or concurrency < 1 or max_retries < 0 or timeout <= 0:
            raise BackendError("batch_size, concurrency >= 1, max_retries >= 0, timeout > 0")
        url = base_url.rstrip("/")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
            raise BackendError(f"{base_url!r}: not an http:// or https:// server URL")
        if port is not None and not 1 <= port <= 65535:
            raise BackendError(f"{base_url!r}: the port must be a number from 1 to 65535")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.root_url = self.base_url.removesuffix("/v1")
        self.mode = mode
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.top_logprobs = top_logprobs
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._tokenizer: Any = None
        self._checked = False
        self.template_from = "server" if mode == "chat" else template_from
        if mode == "completions" and template_from != "server":
            folder = tokenizer_path or _embedded_folder(model)
            if folder is not None:
                self._tokenizer = _load_tokenizer(folder)
                self.template_from = "local"
            elif template_from == "local":
                raise BackendError(
                    f"template_from='local' needs the tokenizer of {model!r}: pass "
                    "tokenizer_path (a local model folder)"
                )
            else:
                self.template_from = "server"

    # ----- rendering -------------------------------------------------------------------
    def render(self, persona: str, item: Any) -> str:
        """The chat-templated prompt text (completions mode)."""
        return str(
            self._tokenizer.apply_chat_template(
                self.template.messages(persona, item), tokenize=False, add_generation_prompt=True
            )
        )

    async def _server_tokens(
        self, client: httpx.AsyncClient, sem: asyncio.Semaphore, req: ScoreRequest
    ) -> list[int]:
        """The token ids of the chat-templated prompt, rendered by the server."""
        url = f"{self.root_url}/tokenize"
        body = {
            "model": self.model_id,
            "messages": self.template.messages(req.persona, req.item),
            "add_generation_prompt": True,
            "add_special_tokens": False,
        }
        data = await self._post(client, sem, url, body)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if (
            not isinstance(tokens, list)
            or not tokens
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens)
        ):
            raise BackendError(f"{url}: 'tokens' is not a non-empty list of token ids")
        return tokens

    # ----- the server check ----------------------------------------------------------------
    async def _served_models(self, client: httpx.AsyncClient) -> list[str]:
        """``GET /v1/models``: the served model names, or :class:`BackendError`."""
        url = f"{self.base_url}/models"
        try:
            resp = await client.get(url)
        except httpx.TimeoutException:
            raise BackendError(
                f"{url}: the inference server did not answer within {self.timeout:g} s"
            ) from None
        except CONNECTION_ERRORS as exc:
            raise BackendError(
                f"{url}: cannot reach the inference server ({_connection_error(exc)})"
            ) from None
        if resp.status_code != 200:
            raise BackendError(f"{url}: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            return [str(m["id"]) for m in resp.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise BackendError(f"{url}: not a model list: {resp.text[:200]!r}") from None

    async def _acheck(self, client: httpx.AsyncClient) -> list[str]:
        """:meth:`check` on an open client; also settles ``template_from="server"``."""
        served = await self._served_models(client)
        if self.model_id not in served:
            raise BackendError(
                f"the inference server at {self.root_url} does not serve {self.model_id!r}; "
                f"it serves: {', '.join(served) or '(no model)'}"
            )
        if self.mode == "completions" and self.template_from == "server":
            url = f"{self.root_url}/tokenize"
            body = {"model": self.model_id, "messages": [{"role": "user", "content": "Hi"}]}
            try:
                probe = await client.post(url, json=body)
            except CONNECTION_ERRORS as exc:
                raise BackendError(f"{url}: {_connection_error(exc)}") from None
            if probe.status_code in (404, 405):
                self.mode = "chat"  # no /tokenize (not vLLM): the server applies the template
            elif probe.status_code != 200:
                raise BackendError(f"{url}: HTTP {probe.status_code}: {probe.text[:300]}")
        return served

    def check(self) -> list[str]:
        """Check that the server answers and serves ``model``; return the served names.

        Raises:
            BackendError: the server cannot be reached, does not answer in time, answers
                something that is not a model list, or does not serve ``model`` (the
                message names the URL and the served models).
        """

        async def run() -> list[str]:
            async with self._client() as client:
                return await self._acheck(client)

        served = asyncio.run(run())
        self._checked = True
        return served

    # ----- HTTP --------------------------------------------------------------------------
    async def _post(
        self, client: httpx.AsyncClient, sem: asyncio.Semaphore, url: str, body: dict[str, Any]
    ) -> Any:
        """POST to ``url`` with retries; the parsed JSON body, or :class:`BackendError`."""
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                wait = self.backoff * 2 ** (attempt - 1) * (0.9 + 0.2 * random.random())
                await asyncio.sleep(wait)
            try:
                async with sem:
                    resp = await client.post(url, json=body)
            except httpx.TimeoutException:
                last = f"timed out after {self.timeout:g} s"
                continue
            except httpx.TransportError as exc:
                last = f"cannot connect ({type(exc).__name__}: {exc})"
                continue
            except CONNECTION_ERRORS as exc:  # not transient (e.g. a port out of range)
                raise BackendError(
                    f"{url}: cannot reach the inference server ({_connection_error(exc)})"
                ) from None
            if resp.status_code in RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code != 200:
                raise BackendError(f"{url}: HTTP {resp.status_code}: {resp.text[:500]}")
            try:
                return resp.json()
            except ValueError:
                raise BackendError(
                    f"{url}: the response is not JSON: {resp.text[:200]!r}"
                ) from None
        raise BackendError(f"{url}: {last} (after {self.max_retries + 1} attempts)")

    def _client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.concurrency)
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout), limits=limits, headers=self._headers
        )

    # ----- parsing ---------------------------------------------------------------------
    def _top_from_completion(self, choice: Any, where: str) -> dict[str, float]:
        try:
            top_list = choice["logprobs"]["top_logprobs"]
            top = top_list[0]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{where}: no top_logprobs in the choice") from None
        if not isinstance(top, dict) or not top:
            raise BackendError(f"{where}: top_logprobs[0] is not a non-empty object")
        return {str(t): _logprob(v, where) for t, v in top.items()}

    def _top_from_chat(self, choice: Any, where: str) -> dict[str, float]:
        try:
            entry = choice["logprobs"]["content"][0]
            top = entry["top_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{where}: no logprobs.content[0].top_logprobs") from None
        if not isinstance(top, list) or not top:
            raise BackendError(f"{where}: top_logprobs is not a non-empty list")
        out: dict[str, float] = {}
        for e in top:
            if not isinstance(e, dict) or "token" not in e or "logprob" not in e:
                raise BackendError(f"{where}: a top_logprobs entry lacks token/logprob")
            tok = str(e["token"])
            out[tok] = max(out.get(tok, -math.inf), _logprob(e["logprob"], where))
        return out

    def _score_top(self, top: dict[str, float], req: ScoreRequest, where: str) -> LetterScore:
        q = letters_from_top_logprobs(top, req.item.letters)
        try:
            return letter_distribution(q, self.threshold)
        except Exception as exc:
            raise BackendError(f"{where}: {exc}") from None

    async def _completions(
        self, client: httpx.AsyncClient, sem: asyncio.Semaphore, reqs: Sequence[ScoreRequest]
    ) -> list[LetterScore]:
        prompts: list[Any]
        if self._tokenizer is not None:
            prompts = [self.render(r.persona, r.item) for r in reqs]
        else:
            prompts = list(
                await asyncio.gather(*(self._server_tokens(client, sem, r) for r in reqs))
            )
        body = {
            "model": self.model_id,
            "prompt": prompts,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": self.top_logprobs,
        }
        where = f"{self.base_url}/completions"
        data = await self._post(client, sem, where, body)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or len(choices) != len(reqs):
            got = len(choices) if isinstance(choices, list) else "no"
            raise BackendError(f"{where}: expected {len(reqs)} choices, got {got}")
        by_index: dict[int, Any] = {}
        for c in choices:
            idx = c.get("index") if isinstance(c, dict) else None
            if not isinstance(idx, int) or not 0 <= idx < len(reqs) or idx in by_index:
                raise BackendError(f"{where}: a choice has a missing, bad or repeated index")
            by_index[idx] = c
        return [
            self._score_top(self._top_from_completion(by_index[i], where), r, where)
            for i, r in enumerate(reqs)
        ]

    async def _chat(
        self, client: httpx.AsyncClient, sem: asyncio.Semaphore, req: ScoreRequest
    ) -> LetterScore:
        body = {
            "model": self.model_id,
            "messages": self.template.messages(req.persona, req.item),
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": self.top_logprobs,
        }
        where = f"{self.base_url}/chat/completions"
        data = await self._post(client, sem, where, body)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or len(choices) != 1:
            raise BackendError(f"{where}: expected 1 choice")
        return self._score_top(self._top_from_chat(choices[0], where), req, where)

    async def ascore(self, requests: Sequence[ScoreRequest]) -> list[LetterScore]:
        """Async :meth:`score`: all batches in flight, at most ``concurrency`` at once."""
        sem = asyncio.Semaphore(self.concurrency)
        async with self._client() as client:
            if not self._checked:
                await self._acheck(client)
                self._checked = True
            if self.mode == "chat":
                return list(await asyncio.gather(*(self._chat(client, sem, r) for r in requests)))
            batches = [
                requests[i : i + self.batch_size] for i in range(0, len(requests), self.batch_size)
            ]
            parts = await asyncio.gather(*(self._completions(client, sem, b) for b in batches))
        return [s for part in parts for s in part]

    def score(self, requests: Sequence[ScoreRequest]) -> list[LetterScore]:
        """Score every request (runs :meth:`ascore` in a fresh event loop)."""
        if not requests:
            return []
        return asyncio.run(self.ascore(requests))

    def health(self) -> list[str]:
        """The served model names (``GET /v1/models``); :class:`BackendError` if down."""

        async def run() -> list[str]:
            async with self._client() as client:
                return await self._served_models(client)

        return asyncio.run(run())


def _logprob(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) or v > 1e-6:
        raise BackendError(f"{where}: {v!r} is not a log-probability")
    return float(min(v, 0.0))


def _embedded_folder(model: str) -> str | None:
    """The embedded model's converted folder when ``model`` names it and it exists."""
    if model != DEFAULT_MODEL:
        return None
    dest = cache_dir() / "models" / DEFAULT_MODEL
    return str(dest) if (dest / MARKER).is_file() and is_model_folder(dest) else None


def _load_tokenizer(tokenizer_path: str) -> Any:
    """The tokenizer of a local model folder, which renders the chat template."""
    if not Path(tokenizer_path).is_dir():
        raise BackendError(f"tokenizer_path {tokenizer_path!r} is not a folder")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # transformers is heavy and optional (the llm extra): imported only when a local
    # tokenizer is asked for.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    if tok.chat_template is None:
        raise BackendError(f"the tokenizer at {tokenizer_path} has no chat template")
    return tok
