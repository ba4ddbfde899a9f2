"""Preference profiles: a session's predicted answers as a ranked, product-ready profile.

CAPE's output (docs/methods.md §2) is a full predicted preference profile: criteria
ranked by how likely the user holds them, each with an expected importance, which a
product uses to personalise its answers. For any belief model and state this module
builds the same from the model's predictive distributions:

* every item becomes an entry with its most likely option, that option's probability, the
  full distribution, whether it was observed, and — for ordinal items (options in scale
  order) — the expected level ``E[level] = sum_k (k + 1) p_k`` on the item's ``1..O_i``
  scale;
* **preference criteria** (items marked "how much do you care about X?", ordinal) are
  ranked by expected level (highest first); the other items by the probability of their
  most likely option;
* a short plain-text summary from the codebook labels, for a system prompt.

Text is never interpreted: labels are copied as given (callers escape on display).
Pure: no web framework, database or settings imports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from models.base import BeliefModel, ModelError


@dataclass(frozen=True)
class ItemText:
    """Codebook text of one item (in model order).

    Attributes:
        key: item id; question: the text shown to people; options: option labels in scale
        order; ordinal: options are an ordered scale (expected level is meaningful);
        criterion: the item is a preference criterion ("how much do you care about X?").
    """

    key: str
    question: str
    options: tuple[str, ...]
    ordinal: bool = False
    criterion: bool = False


@dataclass(frozen=True)
class ProfileEntry:
    """One item of a profile.

    Attributes:
        key, question: the item; option: label of the most likely option; option_index:
        its index; probability: its predictive probability; distribution: all options'
        probabilities; expected_level: ``sum_k (k + 1) p_k`` for ordinal items (else
        ``None``); observed: answered by the respondent; criterion: a preference criterion.
    """

    key: str
    question: str
    option: str
    option_index: int
    probability: float
    distribution: tuple[float, ...]
    expected_level: float | None
    observed: bool
    criterion: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "item": self.key,
            "question": self.question,
            "option": self.option,
            "option_index": self.option_index,
            "probability": self.probability,
            "distribution": list(self.distribution),
            "expected_level": self.expected_level,
            "observed": self.observed,
            "criterion": self.criterion,
        }


@dataclass(frozen=True)
class PreferenceProfile:
    """A ranked profile: ``criteria`` (by expected level) then ``items`` (by probability)."""

    criteria: list[ProfileEntry] = field(default_factory=list)
    items: list[ProfileEntry] = field(default_factory=list)
    summary: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "criteria": [e.to_dict() for e in self.criteria],
            "items": [e.to_dict() for e in self.items],
            "summary": self.summary,
        }


def preference_profile(
    model: BeliefModel,
    state: Any,
    texts: Sequence[ItemText],
    *,
    observed: Mapping[int, int] | None = None,
    include_observed: bool = True,
    summary_items: int = 5,
) -> PreferenceProfile:
    """The respondent's preference profile under ``model`` in ``state``.

    Args:
        model: any belief model; state: a one-respondent state of it.
        texts: one :class:`ItemText` per item of ``model.item_bank`` (model order).
        observed: ``{item index: option index}`` of the items the respondent answered:
            marked observed, with all the probability on the given answer (a belief
            model's predictive need not put it there: a latent-class posterior predictive
            of an answered item is a mixture over the classes), and ranked with the others.
        include_observed: keep answered items in the profile.
        summary_items: how many criteria and items the plain-text summary names.

    Raises:
        ModelError: ``texts`` does not match the item bank (count, keys or option counts).
    """
    bank = model.item_bank
    if len(texts) != bank.n_items:
        raise ModelError(f"profile: {len(texts)} item texts for {bank.n_items} items")
    for i, t in enumerate(texts):
        if t.key != bank.keys[i] or len(t.options) != bank.n_options[i]:
            raise ModelError(
                f"profile: item text {i} ({t.key!r}, {len(t.options)} options) does not match "
                f"the model's item {bank.keys[i]!r} ({bank.n_options[i]} options)"
            )
    seen = {int(i): int(k) for i, k in (observed or {}).items()}
    for i, k in seen.items():
        if not (0 <= i < bank.n_items and 0 <= k < bank.n_options[i]):
            raise ModelError(f"profile: observed answer {k} of item {i} is not in the item bank")
    pred = model.predict(state).clone()  # [I, O]
    for i, k in seen.items():
        pred[i] = 0.0
        pred[i, k] = 1.0
    criteria: list[ProfileEntry] = []
    items: list[ProfileEntry] = []
    for i, t in enumerate(texts):
        if i in seen and not include_observed:
            continue
        p = [float(v) for v in pred[i, : bank.n_options[i]]]
        k = max(range(len(p)), key=lambda j: p[j])
        level = sum((j + 1) * v for j, v in enumerate(p)) if (t.ordinal or t.criterion) else None
        entry = ProfileEntry(
            t.key, t.question, t.options[k], k, p[k], tuple(p), level, i in seen, t.criterion
        )
        (criteria if t.criterion else items).append(entry)
    criteria.sort(key=lambda e: -(e.expected_level or 0.0))
    items.sort(key=lambda e: -e.probability)
    return PreferenceProfile(criteria, items, _summary(criteria, items, texts, summary_items))


def _summary(
    criteria: list[ProfileEntry], items: list[ProfileEntry], texts: Sequence[ItemText], n: int
) -> str:
    """Plain text, one line per named entry, for a system prompt."""
    scale = {t.key: len(t.options) for t in texts}
    lines: list[str] = []
    if criteria:
        lines.append("What this person cares about most (expected importance):")
        for e in criteria[:n]:
            lines.append(
                f"- {e.question} {e.expected_level:.1f} of {scale[e.key]} (most likely: {e.option})"
            )
    if items:
        lines.append("Their most likely answers:")
        for e in items[:n]:
            source = "answered" if e.observed else f"{e.probability:.0%} likely"
            lines.append(f"- {e.question} {e.option} ({source})")
    return "\n".join(lines)


__all__ = ["ItemText", "PreferenceProfile", "ProfileEntry", "preference_profile"]
