"""The belief-model interface that every model family implements.

A belief model is fitted offline on a response matrix and answers online questions
without retraining (see docs/architecture.md):

* ``state = model.initial_state(attributes)`` — the prior, conditioned on respondent
  attributes (demographics are observed items at the start of a session);
* ``state = model.update(state, item, option)`` — a pure, cheap, deterministic transition;
* ``model.predict(state, items)`` — predictive distributions ``[n_items, max_options]``;
* ``model.lookahead(state, candidates, targets)`` — predictive of each candidate and the
  target predictives after each hypothetical answer (what selection criteria score);
* batched forms over ``B`` respondents for the benchmark and group rounds;
* ``to_bytes()`` / ``load_model(bytes)`` with the training-data hash and metrics.

Conventions (all tensors are ``torch.float64`` unless said otherwise):

* Items are integer indices into an :class:`ItemBank`; options are ``0 .. O_i - 1``.
* A response matrix is a ``LongTensor [N, I]`` with ``-1`` for "not answered".
* A predictive row has zeros beyond the item's own option count and sums to 1.

This module is pure numerics: it must never import a web framework or settings.
"""

from __future__ import annotations

import hashlib
import io
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

MISSING = -1
DTYPE = torch.float64


class ModelError(Exception):
    """Base error of the ``models`` package."""


class ShapeError(ModelError, ValueError):
    """A tensor argument has the wrong shape or dtype."""


class UnknownItemError(ModelError, KeyError):
    """An item index or key that the model's item bank does not have."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown item"


class InvalidOptionError(ModelError, ValueError):
    """An option index outside ``0 .. O_i - 1`` for its item."""


class InvalidDistributionError(ModelError, ValueError):
    """A probability table that is negative, not finite, or does not sum to 1."""


class TooFewRespondentsError(ModelError, ValueError):
    """A fit needs more respondents than it was given (e.g. a CAPE fit with one training
    respondent): a model choice skips that candidate and records the message."""


@dataclass(frozen=True)
class ItemBank:
    """The items a model knows: their keys and option counts, in model order.

    Attributes:
        keys: item keys (e.g. codebook ids), unique.
        n_options: ``O_i`` for each item, each >= 2.
    """

    keys: tuple[str, ...]
    n_options: tuple[int, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        keys = tuple(str(k) for k in self.keys)
        n_opt = tuple(int(n) for n in self.n_options)
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "n_options", n_opt)
        if len(keys) != len(n_opt):
            raise ShapeError(f"item bank: {len(keys)} keys but {len(n_opt)} option counts")
        if len(set(keys)) != len(keys):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            raise ModelError(f"item bank: duplicate item keys {dup}")
        bad = [k for k, n in zip(keys, n_opt, strict=True) if n < 1]
        if bad:
            raise ModelError(f"item bank: items without options: {bad}")
        object.__setattr__(self, "_index", {k: i for i, k in enumerate(keys)})

    @property
    def n_items(self) -> int:
        return len(self.keys)

    @property
    def max_options(self) -> int:
        return max(self.n_options) if self.n_options else 0

    def index(self, key: str) -> int:
        """Index of ``key``; raises :class:`UnknownItemError` naming the key."""
        try:
            return self._index[str(key)]
        except KeyError:
            raise UnknownItemError(f"unknown item {key!r}") from None

    def indices(self, keys: Sequence[str]) -> list[int]:
        return [self.index(k) for k in keys]

    def option_mask(self) -> Tensor:
        """Bool ``[I, O]``: ``mask[i, k]`` is true when ``k < O_i``."""
        o = torch.arange(self.max_options)
        return o.unsqueeze(0) < torch.tensor(self.n_options).unsqueeze(1)

    def check_item(self, item: int) -> int:
        if not 0 <= int(item) < self.n_items:
            raise UnknownItemError(f"unknown item index {item} (the bank has {self.n_items} items)")
        return int(item)

    def check_answer(self, item: int, option: int) -> tuple[int, int]:
        item = self.check_item(item)
        if not 0 <= int(option) < self.n_options[item]:
            raise InvalidOptionError(
                f"option {option} is out of range for item {self.keys[item]!r} "
                f"({self.n_options[item]} options)"
            )
        return item, int(option)

    def check_responses(self, responses: Tensor) -> Tensor:
        """Validate a ``[N, I]`` response matrix (``-1`` = missing); returns it as int64."""
        if not isinstance(responses, Tensor):
            responses = torch.as_tensor(responses)
        if responses.dim() != 2 or responses.shape[1] != self.n_items:
            raise ShapeError(
                f"responses must have shape [N, {self.n_items}], got {list(responses.shape)}"
            )
        responses = responses.long()
        limit = torch.tensor(self.n_options).unsqueeze(0)
        bad = (responses < MISSING) | (responses >= limit)
        if bool(bad.any()):
            r, c = (int(v) for v in bad.nonzero()[0])
            raise InvalidOptionError(
                f"responses[{r}, {c}] = {int(responses[r, c])} is not a valid option of item "
                f"{self.keys[c]!r} ({self.n_options[c]} options)"
            )
        return responses

    def to_dict(self) -> dict[str, Any]:
        return {"keys": list(self.keys), "n_options": list(self.n_options)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ItemBank:
        return cls(tuple(d["keys"]), tuple(d["n_options"]))


def responses_hash(responses: Tensor, item_bank: ItemBank) -> str:
    """SHA-256 of a response matrix and its item bank: identifies the training data."""
    h = hashlib.sha256()
    h.update(repr(item_bank.to_dict()).encode())
    h.update(responses.long().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class BeliefModel(ABC):
    """A fitted belief model over the items of ``item_bank``.

    Subclasses set ``family`` (the registry name) and implement the abstract methods.
    States are treated as immutable values: ``update`` returns a new state and never
    mutates its argument, and never changes the fitted parameters.

    Attributes:
        item_bank: the model's items.
        training_hash: :func:`responses_hash` of the data the model was fitted on.
        metrics: held-out metrics recorded at fit time (e.g. validation log-likelihood).
    """

    family: ClassVar[str] = ""

    def __init__(self, item_bank: ItemBank) -> None:
        self.item_bank = item_bank
        self.training_hash: str | None = None
        self.metrics: dict[str, Any] = {}

    # ----- one respondent -------------------------------------------------
    @abstractmethod
    def initial_state(self, attributes: Mapping[int, int] | None = None) -> Any:
        """The prior state, conditioned on observed attributes ``{item: option}``."""

    @abstractmethod
    def update(self, state: Any, item: int, option: int) -> Any:
        """The state after observing ``option`` for ``item`` (a new object)."""

    @abstractmethod
    def predict(self, state: Any, items: Sequence[int] | Tensor | None = None) -> Tensor:
        """Predictive distributions ``[n_items, max_options]`` (all items when ``None``)."""

    def replay(
        self, answers: Sequence[tuple[int, int]], attributes: Mapping[int, int] | None = None
    ) -> Any:
        """The state after ``answers`` in order; equals the incrementally updated state."""
        state = self.initial_state(attributes)
        for item, option in answers:
            state = self.update(state, item, option)
        return state

    def lookahead(
        self, state: Any, candidates: Sequence[int] | Tensor, targets: Sequence[int] | Tensor
    ) -> tuple[Tensor, Tensor]:
        """Predictive of each candidate and target predictives after each of its answers.

        Returns:
            ``p_x [C, O]``: ``p(Y_x = k | h)``;
            ``p_t [C, O, T, O]``: ``p(Y_t = j | h, Y_x = k)`` (rows for ``k >= O_x`` are
            the current target predictive, with zero weight in ``p_x``).

        This generic form calls ``update`` ``C * O`` times; families override it with a
        vectorised closed form.
        """
        cand = [int(c) for c in torch.as_tensor(candidates).reshape(-1).tolist()]
        tgt = torch.as_tensor(targets, dtype=torch.long).reshape(-1)
        o_max = self.item_bank.max_options
        p_x = self.predict(state, cand) if cand else torch.zeros(0, o_max, dtype=DTYPE)
        base = self.predict(state, tgt)
        p_t = base.expand(len(cand), o_max, *base.shape).clone()
        for ci, x in enumerate(cand):
            for k in range(self.item_bank.n_options[x]):
                p_t[ci, k] = self.predict(self.update(state, x, k), tgt)
        return p_x, p_t

    # ----- many respondents -------------------------------------------------
    @abstractmethod
    def initial_batch(self, observed: Tensor) -> Any:
        """Batched states from ``observed [B, I]`` (``-1`` = not observed)."""

    @abstractmethod
    def update_batch(self, state: Any, items: Tensor, options: Tensor) -> Any:
        """Batched update: respondent ``b`` observes ``options[b]`` for ``items[b]``.

        ``options[b] == -1`` (a skipped question) leaves respondent ``b`` unchanged.
        """

    @abstractmethod
    def predict_batch(self, state: Any, items: Tensor | Sequence[int]) -> Tensor:
        """Predictive distributions ``[B, n_items, max_options]``."""

    def lookahead_batch(
        self, state: Any, candidates: Tensor | Sequence[int], targets: Tensor | Sequence[int]
    ) -> tuple[Tensor, Tensor]:
        """Batched :meth:`lookahead`: ``p_x [B, C, O]`` and ``p_t [B, C, O, T, O]``."""
        raise NotImplementedError(f"{type(self).__name__} has no batched lookahead")

    # ----- serialisation ----------------------------------------------------
    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild the fitted model (tensors and plain values)."""

    @classmethod
    @abstractmethod
    def from_state_dict(cls, d: dict[str, Any]) -> BeliefModel:
        """Inverse of :meth:`state_dict`."""

    def to_bytes(self) -> bytes:
        """Serialise with ``torch.save`` (family, item bank, hash, metrics, parameters)."""
        payload = {
            "family": self.family,
            "item_bank": self.item_bank.to_dict(),
            "training_hash": self.training_hash,
            "metrics": self.metrics,
            "params": self.state_dict(),
        }
        buf = io.BytesIO()
        torch.save(payload, buf)
        return buf.getvalue()


_REGISTRY: dict[str, type[BeliefModel]] = {}


def register_model(cls: type[BeliefModel]) -> type[BeliefModel]:
    """Class decorator: make ``cls`` loadable by :func:`load_model` under ``cls.family``."""
    if not cls.family:
        raise ModelError(f"{cls.__name__} has no family name")
    _REGISTRY[cls.family] = cls
    return cls


def model_families() -> list[str]:
    return sorted(_REGISTRY)


def load_model(data: bytes) -> BeliefModel:
    """Rebuild a model saved with :meth:`BeliefModel.to_bytes`."""
    try:
        payload = torch.load(io.BytesIO(data), weights_only=False)
    except Exception as exc:  # corrupt blob: say so, do not leak pickle internals
        raise ModelError(f"cannot read a stored model: {exc}") from None
    family = payload.get("family")
    if family not in _REGISTRY:
        raise ModelError(f"unknown model family {family!r} (known: {model_families()})")
    model = _REGISTRY[family].from_state_dict(payload["params"])
    model.training_hash = payload.get("training_hash")
    model.metrics = dict(payload.get("metrics") or {})
    return model
