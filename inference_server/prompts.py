"""The versioned prompt template and the reading of an answer distribution from letters.

A persona × item pair becomes a chat: the persona as the system message, the question with
lettered options (``"A. Support"``, ``"B. Oppose"``) and ``"Answer with one letter."`` as the
user message. The model's chat template renders it; the answer distribution is read from
the **next-token** probabilities of the option letters — no text is generated:

    q_k = Σ_{t ∈ V_k} softmax(logits)_t,     V_k = {tokens t : decode(t).strip() == letter_k}
    m = Σ_k q_k                               (valid-letter mass)
    p_k = q_k / m                             (the distribution over the item's options)

``V_k`` covers the variants ``"A"`` and ``" A"`` (and any other token that decodes to the
letter with surrounding whitespace). A pair whose mass ``m`` is below a threshold is
flagged: the model mostly wanted to say something else, so its distribution is weak
evidence.

The template's :attr:`PromptTemplate.version_id` is part of every stored distribution's
key, so changing a word of the template never reuses distributions made with the old one.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elicitation.datasets import CodebookItem
from inference_server.errors import PromptError

LETTERS = string.ascii_uppercase
"""Option letters in order; an item has at most 26 options."""

DEFAULT_MASS_THRESHOLD = 0.5
"""Flag a pair whose valid-letter probability mass is below this."""

_SLOT = re.compile(r"\{(question|options)\}")


@dataclass(frozen=True)
class PromptItem:
    """An item as the model sees it.

    Attributes:
        key: the item id (not part of the identity).
        question: the question text.
        options: option labels in scale order; option ``k`` gets letter ``LETTERS[k]``.
    """

    key: str
    question: str
    options: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.question.strip():
            raise PromptError(f"item {self.key!r}: empty question")
        if not 2 <= len(self.options) <= len(LETTERS):
            raise PromptError(
                f"item {self.key!r}: {len(self.options)} options (2 to {len(LETTERS)} allowed)"
            )
        for k, label in enumerate(self.options):
            if not str(label).strip():
                raise PromptError(f"item {self.key!r}: option {LETTERS[k]} has an empty label")

    @property
    def letters(self) -> tuple[str, ...]:
        return tuple(LETTERS[: len(self.options)])

    @property
    def n_options(self) -> int:
        return len(self.options)

    @property
    def hash(self) -> str:
        """SHA-256 of the question and option labels: same wording, same distribution."""
        blob = json.dumps([self.question, list(self.options)], ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    @classmethod
    def from_codebook(cls, item: CodebookItem) -> PromptItem:
        """The prompt item of a codebook entry (its option labels in scale order)."""
        return cls(key=item.id, question=item.question, options=tuple(lb for _, lb in item.options))


@dataclass(frozen=True)
class PromptTemplate:
    """A versioned prompt template.

    ``system`` contains ``{persona}`` and ``user`` contains ``{question}`` and ``{options}``;
    they are substituted literally (no ``str.format``), so braces or template syntax in a
    persona or question are kept verbatim.

    Attributes:
        version: a short name (``"v1"``).
        system: the system message around the persona text.
        user: the user message around the question and the lettered options.
    """

    version: str
    system: str
    user: str

    def __post_init__(self) -> None:
        if "{persona}" not in self.system:
            raise PromptError(f"template {self.version}: the system message lacks {{persona}}")
        for slot in ("{question}", "{options}"):
            if slot not in self.user:
                raise PromptError(f"template {self.version}: the user message lacks {slot}")

    @property
    def version_id(self) -> str:
        """``"<version>-<first 12 hex of sha256(system, user)>"``: the storage key part."""
        blob = json.dumps([self.system, self.user], ensure_ascii=False).encode("utf-8")
        return f"{self.version}-{hashlib.sha256(blob).hexdigest()[:12]}"

    def options_text(self, item: PromptItem) -> str:
        return "\n".join(
            f"{L}. {label}" for L, label in zip(item.letters, item.options, strict=True)
        )

    def system_message(self, persona: str) -> str:
        return self.system.replace("{persona}", persona)

    def user_message(self, item: PromptItem) -> str:
        # One pass over the template: a "{options}" inside a question stays literal.
        slots = {"question": item.question, "options": self.options_text(item)}
        return _SLOT.sub(lambda m: slots[m.group(1)], self.user)

    def messages(self, persona: str, item: PromptItem) -> list[dict[str, str]]:
        """The chat: ``[{"role": "system", ...}, {"role": "user", ...}]``."""
        return [
            {"role": "system", "content": self.system_message(persona)},
            {"role": "user", "content": self.user_message(item)},
        ]


DEFAULT_TEMPLATE = PromptTemplate(
    version="v1",
    system=(
        "You are answering a survey as the person described below. Answer every question "
        "as this person would.\nPerson: {persona}"
    ),
    user="{question}\n{options}\nAnswer with one letter.",
)


@dataclass(frozen=True)
class LetterScore:
    """The answer distribution of one persona × item pair.

    Attributes:
        probs: ``O_i`` probabilities over the item's options (sum 1).
        valid_mass: ``m``, the next-token probability on any option letter, in ``[0, 1]``.
        flagged: ``m`` below the threshold (or 0: then ``probs`` is uniform and carries no
            information from the model).
    """

    probs: tuple[float, ...]
    valid_mass: float
    flagged: bool


def letter_distribution(
    letter_probs: Sequence[float], threshold: float = DEFAULT_MASS_THRESHOLD
) -> LetterScore:
    """Renormalise the letters' next-token probabilities ``q_k`` over the options.

    Args:
        letter_probs: ``q_k >= 0`` for each option letter (the summed probability of the
            letter's token variants).
        threshold: flag the pair when ``m = Σ q_k`` is below it.

    Returns:
        ``p_k = q_k / m``; when ``m = 0`` the uniform distribution, flagged.

    Raises:
        PromptError: a negative, non-finite or > 1 (beyond rounding) probability, or a mass
            above 1, which no softmax produces.

    Example::

        letter_distribution([0.3, 0.1])    # LetterScore(probs=(0.75, 0.25), valid_mass=0.4, flagged=True)
    """
    q = [float(x) for x in letter_probs]
    if not q:
        raise PromptError("no option letters to score")
    if any(not math.isfinite(x) or x < 0 for x in q):
        raise PromptError(f"invalid letter probabilities {q}")
    mass = math.fsum(q)
    if mass > 1 + 1e-4:
        raise PromptError(f"letter probabilities sum to {mass:.6f} > 1")
    mass = min(mass, 1.0)
    if mass <= 0:
        return LetterScore(tuple(1.0 / len(q) for _ in q), 0.0, True)
    return LetterScore(tuple(x / mass for x in q), mass, mass < threshold)


def letters_from_top_logprobs(top: Mapping[str, float], letters: Sequence[str]) -> list[float]:
    """``q_k`` from a server's top log-probabilities ``{token text: log p}``.

    A token counts for letter ``L`` when its text stripped of whitespace equals ``L``
    (``"A"``, ``" A"``, ``"\\nA"``). Letters absent from the top list get 0: their true
    probability is below the smallest listed one, so the reading is a lower bound that is
    exact up to that bound.
    """
    q = dict.fromkeys(letters, 0.0)
    for token, lp in top.items():
        t = token.strip()
        if t in q:
            q[t] += math.exp(float(lp))
    return [q[L] for L in letters]
