"""A dataset's LLM persona table ``μ [K, I, O]``, generated once and cached on disk.

For benchmarks (``llm_personas`` and ``mixed`` in ``priorly bench individual``) the
persona distributions of a dataset are generated once — attribute personas of the
training users (the ``K`` most frequent profiles), every askable question scored by a
backend — and saved as one file. The items are the dataset's demographics then
questions (``Dataset.default_keys()``, the benchmark's item bank):

* a question row is the language model's distribution for that persona;
* a demographic row is the persona's own attribute value with noise ``ε``
  (``1 − ε`` on it, ``ε / (O − 1)`` elsewhere; uniform where the profile lacks it), so that
  conditioning on a respondent's observed demographics favours the matching personas.

Files live under ``$PRIORLY_CACHE_DIR/persona_tables/<item-bank hash>/`` and are named by
model, template version and ``K``; :func:`find_table` finds one for an item bank.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from elicitation.datasets import Dataset
from inference_server.backends.base import Backend, ScoreRequest
from inference_server.errors import PersonaError
from inference_server.model_store import cache_dir
from inference_server.personas import deterministic_mu, from_attributes
from inference_server.prompts import PromptItem


def bank_hash(keys: tuple[str, ...] | list[str], n_options: tuple[int, ...] | list[int]) -> str:
    """First 16 hex of SHA-256 of the item keys and option counts."""
    blob = json.dumps([list(keys), [int(n) for n in n_options]]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class PersonaTable:
    """A cached persona table.

    Attributes:
        item_keys: ``I`` item ids (demographics then questions).
        n_options: ``O_i``.
        mu: ``float64 [K, I, max O]``.
        texts: the ``K`` persona texts.
        weights: how many training users share each profile.
        valid_mass: ``[K, I]`` valid-letter mass (1 on demographic rows).
        model_id, template_version: what generated the question rows.
    """

    item_keys: tuple[str, ...]
    n_options: tuple[int, ...]
    mu: Tensor
    texts: tuple[str, ...]
    weights: tuple[float, ...]
    valid_mass: Tensor
    model_id: str
    template_version: str

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(self.__dict__, tmp)
        tmp.rename(path)  # nothing half-written under the real name
        return path

    @classmethod
    def load(cls, path: Path) -> PersonaTable:
        try:
            d: dict[str, Any] = torch.load(path, weights_only=False)
            return cls(**d)
        except Exception as exc:
            raise PersonaError(f"cannot read persona table {path}: {exc}") from None

    def rows_for(self, keys: tuple[str, ...], n_options: tuple[int, ...]) -> Tensor:
        """``μ`` re-indexed to another item bank; items not in the table get uniform rows."""
        index = {k: i for i, k in enumerate(self.item_keys)}
        o_max = max(n_options)
        out = torch.zeros(self.mu.shape[0], len(keys), o_max, dtype=torch.float64)
        for j, (k, o) in enumerate(zip(keys, n_options, strict=True)):
            if k in index and self.n_options[index[k]] == o:
                out[:, j, :o] = self.mu[:, index[k], :o]
            else:
                out[:, j, :o] = 1.0 / o
        return out


def table_dir(keys: tuple[str, ...] | list[str], n_options: tuple[int, ...] | list[int]) -> Path:
    return cache_dir() / "persona_tables" / bank_hash(keys, n_options)


def table_path(ds: Dataset, model_id: str, template_version: str, k: int) -> Path:
    bank = ds.item_bank()
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_id)
    return table_dir(bank.keys, bank.n_options) / f"{safe}__{template_version}__K{k}.pt"


def find_table(keys: tuple[str, ...], n_options: tuple[int, ...]) -> Path | None:
    """The cached table for this item bank with the most personas, or ``None``."""
    folder = table_dir(keys, n_options)
    files = sorted(folder.glob("*__K*.pt"), key=lambda p: int(p.stem.rsplit("__K", 1)[1]))
    return files[-1] if files else None


def build_table(
    ds: Dataset,
    backend: Backend,
    *,
    n_personas: int,
    demo_epsilon: float = 0.05,
    chunk: int = 32,
    on_progress: Callable[[int, int], None] | None = None,
) -> PersonaTable:
    """Generate a dataset's persona table (see the module docstring).

    Personas: the ``n_personas`` most frequent attribute profiles of the training users
    (all users when the dataset has no split).
    """
    rows = ds.user_indices("train_users") if ds.split is not None else None
    personas = from_attributes(ds, rows=rows, n=n_personas)
    keys = ds.default_keys()
    bank = ds.item_bank(keys)
    o_max = bank.max_options
    k_n = len(personas)
    mu = torch.zeros(k_n, len(keys), o_max, dtype=torch.float64)
    mass = torch.ones(k_n, len(keys), dtype=torch.float64)
    demo = set(ds.demographics)
    for j, key in enumerate(keys):
        if key in demo:
            ans = torch.tensor([[p.attributes.get(key, -1)] for p in personas])
            mu[:, j, : bank.n_options[j]] = deterministic_mu(
                ans, [bank.n_options[j]], demo_epsilon
            )[:, 0, : bank.n_options[j]]
    q_cols = [j for j, key in enumerate(keys) if key not in demo]
    items = {j: PromptItem.from_codebook(ds.item(keys[j])) for j in q_cols}
    pairs = [(t, j) for t in range(k_n) for j in q_cols]
    if on_progress:
        on_progress(0, len(pairs))
    for start in range(0, len(pairs), chunk):
        part = pairs[start : start + chunk]
        scores = backend.score([ScoreRequest(personas[t].text, items[j]) for t, j in part])
        for (t, j), s in zip(part, scores, strict=True):
            mu[t, j, : len(s.probs)] = torch.tensor(s.probs, dtype=torch.float64)
            mass[t, j] = s.valid_mass
        if on_progress:
            on_progress(start + len(part), len(pairs))
    return PersonaTable(
        item_keys=tuple(keys),
        n_options=tuple(bank.n_options),
        mu=mu,
        texts=tuple(p.text for p in personas),
        weights=tuple(p.weight for p in personas),
        valid_mass=mass,
        model_id=backend.model_id,
        template_version=backend.template.version_id,
    )
