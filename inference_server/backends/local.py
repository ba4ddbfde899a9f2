"""The ``local`` backend: transformers in this process, on the CPU.

For each persona × item pair the chat-templated prompt runs through the model once and
the last position's logits give the letters' next-token probabilities (see
:mod:`inference_server.prompts`). Two ways to batch:

* **plain** — ``B`` full prompts per forward pass, left-padded, with position ids
  ``cumsum(mask) − 1`` so that a padded row computes exactly what it would alone;
* **prefix reuse** — every item of one persona shares the token prefix up to the user
  message (chat header + persona system message). That prefix runs once; its key/value
  cache is repeated ``B`` times and only the item suffixes (right-padded, positions
  continuing after the prefix) run per batch. The last real position of each row is
  gathered before the output layer, so the ``V``-wide projection runs on ``B`` vectors
  only.

Both give the same numbers up to float rounding (a test checks it); prefix reuse skips
the prefix's share of the compute (``docs/inference.md`` has the measured effect).
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from inference_server.backends.base import Backend, ScoreRequest, register_backend
from inference_server.errors import BackendError
from inference_server.model_store import resolve_model
from inference_server.prompts import (
    DEFAULT_MASS_THRESHOLD,
    DEFAULT_TEMPLATE,
    LETTERS,
    LetterScore,
    PromptTemplate,
    letter_distribution,
)


@register_backend("local")
class LocalBackend(Backend):
    """In-process scoring with transformers (float32, CPU).

    Args:
        model: ``None`` for the embedded SmolLM2 model, or a local model folder.
        template: the prompt template.
        threshold: valid-letter mass below which a pair is flagged.
        batch_size: rows per forward pass (``B``).
        prefix_reuse: run each persona's shared prefix once and reuse its KV cache.
        num_threads: torch threads while scoring (set for the call and restored after;
            ``None``: leave as is). One thread avoids spin-waiting on a busy machine.
    """

    name = "local"

    def __init__(
        self,
        model: str | None = None,
        *,
        template: PromptTemplate = DEFAULT_TEMPLATE,
        threshold: float = DEFAULT_MASS_THRESHOLD,
        batch_size: int = 8,
        prefix_reuse: bool = True,
        num_threads: int | None = None,
    ) -> None:
        model_id, folder = resolve_model(model)
        super().__init__(model_id=model_id, template=template, threshold=threshold)
        if batch_size < 1:
            raise BackendError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = batch_size
        self.prefix_reuse = prefix_reuse
        self.folder = folder
        self.num_threads = num_threads
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy, optional

        self.tokenizer: Any = AutoTokenizer.from_pretrained(folder)
        self.model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.model.eval()
        if self.tokenizer.chat_template is None:
            raise BackendError(f"model {model_id!r} at {folder} has no chat template")
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id)
        self._letter_ids: dict[str, Tensor] | None = None
        # transformers >= 5.2x renamed ``past_key_values`` to ``cache``; support both.
        params = inspect.signature(self.model.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    # ----- prompts -------------------------------------------------------------------
    def render(self, persona: str, item: Any) -> str:
        """The chat-templated prompt text (what an OpenAI completions request sends)."""
        return str(
            self.tokenizer.apply_chat_template(
                self.template.messages(persona, item), tokenize=False, add_generation_prompt=True
            )
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def letter_token_ids(self) -> dict[str, Tensor]:
        """``{letter: LongTensor of token ids t with decode(t).strip() == letter}``."""
        if self._letter_ids is None:
            texts = self.tokenizer.batch_decode([[t] for t in range(len(self.tokenizer))])
            ids: dict[str, list[int]] = {L: [] for L in LETTERS}
            for t, s in enumerate(texts):
                s = s.strip()
                if s in ids:
                    ids[s].append(t)
            self._letter_ids = {L: torch.tensor(v, dtype=torch.long) for L, v in ids.items()}
        return self._letter_ids

    # ----- scoring -------------------------------------------------------------------
    def _split(self, req: ScoreRequest) -> tuple[tuple[int, ...], list[int]]:
        """``(prefix ids, suffix ids)``: the prefix is everything before the user message.

        If tokenising the prefix alone does not give a token prefix of the full prompt
        (a merge across the boundary), the whole prompt is the suffix (no reuse).
        """
        full_text = self.render(req.persona, req.item)
        full = self._encode(full_text)
        if not self.prefix_reuse:
            return (), full
        cut = full_text.rfind(self.template.user_message(req.item))
        prefix = self._encode(full_text[:cut]) if cut > 0 else []
        if prefix and full[: len(prefix)] == prefix and len(prefix) < len(full):
            return tuple(prefix), full[len(prefix) :]
        return (), full

    @torch.no_grad()
    def _last_logprobs(
        self, suffixes: Sequence[list[int]], cache: Any | None, prefix_len: int
    ) -> Tensor:
        """Log-softmax of the next-token logits after each row: ``[B, V]``.

        Rows are right-padded; ``cache`` (batch 1, length ``prefix_len``) is repeated to
        ``B`` rows. Without a cache the rows are left-padded instead.
        """
        b = len(suffixes)
        s = max(len(x) for x in suffixes)
        ids = torch.full((b, s), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, s), dtype=torch.long)
        if cache is None:  # left padding, positions counted over real tokens
            for r, x in enumerate(suffixes):
                ids[r, s - len(x) :] = torch.tensor(x)
                mask[r, s - len(x) :] = 1
            pos = (mask.cumsum(1) - 1).clamp_min(0)
            last = torch.full((b,), s - 1, dtype=torch.long)
            kv = None
            full_mask = mask
        else:  # right padding after the shared prefix
            for r, x in enumerate(suffixes):
                ids[r, : len(x)] = torch.tensor(x)
                mask[r, : len(x)] = 1
            pos = prefix_len + torch.arange(s).unsqueeze(0).expand(b, s)
            last = torch.tensor([len(x) - 1 for x in suffixes])
            kv = copy.deepcopy(cache)
            if b > 1:
                kv.batch_repeat_interleave(b)
            full_mask = torch.cat([torch.ones((b, prefix_len), dtype=torch.long), mask], dim=1)
        out = self.model.model(
            input_ids=ids,
            attention_mask=full_mask,
            position_ids=pos,
            use_cache=kv is not None,
            **{self._cache_kw: kv},
        )
        h = out.last_hidden_state[torch.arange(b), last]  # [B, H]
        logits = self.model.lm_head(h).float()  # [B, V]
        return torch.log_softmax(logits, dim=-1)

    def _scores(self, logp: Tensor, reqs: Sequence[ScoreRequest]) -> list[LetterScore]:
        letter_ids = self.letter_token_ids()
        p = logp.exp()
        out = []
        for r, req in enumerate(reqs):
            q = [float(p[r, letter_ids[L]].sum()) for L in req.item.letters]
            out.append(letter_distribution(q, self.threshold))
        return out

    def score(self, requests: Sequence[ScoreRequest]) -> list[LetterScore]:
        """Score every request; batches of :attr:`batch_size`, grouped by shared prefix."""
        if self.num_threads is None:
            return self._score(requests)
        before = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)
        try:
            return self._score(requests)
        finally:
            torch.set_num_threads(before)

    @torch.no_grad()
    def _score(self, requests: Sequence[ScoreRequest]) -> list[LetterScore]:
        results: list[LetterScore | None] = [None] * len(requests)
        groups: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
        for i, req in enumerate(requests):
            prefix, suffix = self._split(req)
            groups.setdefault(prefix, []).append((i, suffix))
        for prefix, members in groups.items():
            cache = None
            if prefix:
                out = self.model.model(input_ids=torch.tensor([prefix]), use_cache=True)
                cache = getattr(out, "cache", None)
                if cache is None:
                    cache = out.past_key_values
            for start in range(0, len(members), self.batch_size):
                chunk = members[start : start + self.batch_size]
                logp = self._last_logprobs([s for _, s in chunk], cache, len(prefix))
                reqs = [requests[i] for i, _ in chunk]
                for (i, _), sc in zip(chunk, self._scores(logp, reqs), strict=True):
                    results[i] = sc
        assert all(r is not None for r in results)
        return [r for r in results if r is not None]

    def close(self) -> None:
        self.model = None
