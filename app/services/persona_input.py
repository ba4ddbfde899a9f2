"""Reading a researcher's persona input: persona texts (pasted or uploaded) and the
population shares of the attribute items, each checked with an error naming its place.

* :func:`text_personas`: pasted or uploaded texts (one per line, JSONL, or a JSON list);
* :func:`check_shares`, :func:`shares_from_form`: population shares ``{attribute key:
  {option letter: share}}`` (a census table), from the personas page's fields;
* :func:`share_personas`: the attribute-profile personas of checked shares (every
  combination, or a sample counted out by :func:`apportion`).

Pure of the database: :mod:`app.services.personas` stores what these return.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence

import numpy as np

from app.errors import InvalidInputError
from app.textguard import clip
from elicitation.datasets import CodebookItem
from inference_server.errors import InferenceError
from inference_server.personas import (
    PERSONA_FILE_TYPES,
    Persona,
    attribute_sentence,
    parse_personas,
    text_lines,
)

MAX_PROFILE_PERSONAS = 20_000
"""Most attribute combinations :func:`share_personas` enumerates (above: give a sample)."""


def text_personas(raw: str | bytes, *, filename: str | None = None) -> list[Persona]:
    """Researcher personas from pasted or uploaded text.

    An uploaded file (``filename`` given) is read by its extension, one of
    :data:`inference_server.personas.PERSONA_FILE_TYPES`: ``.txt`` one persona per line,
    ``.jsonl`` one object per line with ``text`` and optional ``key`` and ``weight``,
    ``.json`` a list; its bytes must be UTF-8 (a byte order mark at the start is skipped).
    Pasted text is JSONL when its first non-blank line starts with ``{``, else one persona
    per line. Lines end at ``\\n`` or ``\\r\\n`` only
    (:func:`inference_server.personas.text_lines`); the entries are checked by
    :func:`inference_server.personas.parse_personas`.

    Example: ``text_personas("A nurse in Leeds\\nA retired farmer")`` gives two personas.

    Raises:
        InvalidInputError: another file type, a file that is not UTF-8, empty input, or
            naming the line of the first bad entry (``"persona texts line 3: invalid
            JSON: ..."``, ``"p.jsonl line 2: key must be a string, got an object"``).
    """
    name = filename or "persona texts"
    suffix = ""
    if filename is not None:
        suffix = "." + filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
        if suffix not in PERSONA_FILE_TYPES:
            raise InvalidInputError(
                f"{clip(name, 80)}: not a persona file: choose a .txt (one persona per line), "
                ".jsonl or .json file"
            )
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError:
            raise InvalidInputError(f"{name}: not UTF-8 text") from None
    lines = text_lines(raw)
    first = next((line.strip() for line in lines if line.strip()), "")
    if not first:
        raise InvalidInputError(f"{name}: no persona texts (the input is empty)")
    kind = suffix or (".jsonl" if first.startswith("{") else ".txt")
    if kind == ".txt":
        for n, line in enumerate(lines, start=1):
            if line.strip().startswith("{") and _is_json_object(line):
                raise InvalidInputError(
                    f"{name} line {n}: a JSON object, but the first line is plain text: write "
                    "every persona as plain text (one per line) or every line as JSON"
                )
    try:
        return parse_personas(raw, name=name, kind=kind)
    except InferenceError as exc:
        raise InvalidInputError(str(exc)) from None


def form_persona_texts(
    typed: str, upload: tuple[str, bytes] | None
) -> tuple[str | bytes, str | None]:
    """What the personas page's *persona texts* form gives :func:`text_personas`:
    ``(the file's bytes, its name)`` or ``(the typed text, None)``.

    Raises:
        InvalidInputError: both the text box and a file are filled in (neither is dropped
            silently: the message says which to clear).
    """
    if upload is None:
        return typed, None
    name, data = upload
    if typed.strip():
        raise InvalidInputError(
            f"persona texts: both the text box and a file ({clip(name, 80)}) are filled in: "
            "clear the text box to add the file, or remove the file to add the typed texts"
        )
    return data, name


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


def check_shares(
    attrs: Sequence[CodebookItem], shares: Mapping[str, Mapping[str, object]]
) -> dict[str, dict[str, float]]:
    """Validate population shares ``{attribute key: {option letter: share}}``.

    Each share is a number: a fraction in ``[0, 1]``, or a percentage (``"30%"``, or all
    of one attribute's shares in ``[0, 100]`` summing to 100 as a census table prints
    them); a decimal comma is read as a point. The shares of one attribute sum to 1 (or
    100 %) within :data:`SHARE_TOLERANCE`, the rounding of a printed table, and are then
    rescaled to sum to exactly 1. Each key is one of the study's attribute items and each
    letter one of its options. Attributes left out are not part of the profiles.

    Example: ``{"age": {"A": "33.3", "B": "33.3", "C": "33.3"}}`` gives ``1/3`` each.

    Returns:
        The shares as floats summing to 1 per attribute, in the order of ``attrs``.

    Raises:
        InvalidInputError: naming the attribute (its topic and key) and option (``"shares
            of Age (age), option Z: not an option of age (A, B, C)"``, ``"shares of Age
            (age) sum to 0.9, not 1"``, ``"shares of Age (age) read as percentages sum to
            95 %, not 100 %"``).
    """
    known = {a.id: a for a in attrs}
    if not shares:
        raise InvalidInputError("shares: give the shares of at least one attribute")
    for key in shares:
        if key not in known:
            raise InvalidInputError(
                f"shares: {key!r} is not an attribute item of this study "
                f"(attributes: {', '.join(known) or 'none'})"
            )
    out: dict[str, dict[str, float]] = {}
    for a in attrs:
        if a.id not in shares:
            continue
        name = _attribute_name(a)
        letters = [letter for letter, _ in a.options]
        given = shares[a.id]
        if not given:
            raise InvalidInputError(f"shares of {name}: no option has a share")
        values: dict[str, float] = {}
        for letter, raw in given.items():
            where = f"shares of {name}, option {letter}"
            if letter not in letters:
                raise InvalidInputError(f"{where}: not an option of {a.id} ({', '.join(letters)})")
            values[letter] = _share_value(raw, where)
        total = sum(values.values())
        if all(v <= 100 for v in values.values()) and 50 <= total <= 150:  # a table in percent
            if abs(total - 100) > 100 * SHARE_TOLERANCE:
                raise InvalidInputError(
                    f"shares of {name} read as percentages sum to {total:.6g} %, not 100 % "
                    f"(within {100 * SHARE_TOLERANCE:g})"
                )
            values = {k: v / 100 for k, v in values.items()}
            total /= 100
        big = next((k for k, v in values.items() if v > 1), None)
        if big is not None:
            raise InvalidInputError(
                f"shares of {name}, option {big}: {given[big]!r} is not a share between 0 and "
                "1 (or a percentage, with the attribute's shares summing to 100)"
            )
        if abs(total - 1) > SHARE_TOLERANCE:
            if any(str(raw).strip().endswith("%") for raw in given.values()):
                raise InvalidInputError(
                    f"shares of {name} sum to {100 * total:.6g} %, not 100 % "
                    f"(within {100 * SHARE_TOLERANCE:g})"
                )
            raise InvalidInputError(
                f"shares of {name} sum to {total:.6g}, not 1 (within {SHARE_TOLERANCE:g})"
            )
        out[a.id] = {letter: values[letter] / total for letter in letters if letter in values}
    return out


def _attribute_name(a: CodebookItem) -> str:
    """``"Age (age)"``: the attribute's topic and key, or the key alone."""
    return f"{a.topic} ({a.id})" if a.topic and a.topic != a.id else a.id


SHARE_TOLERANCE = 0.01
"""How far one attribute's shares may sum from 1 (the rounding of a printed table: three
shares of 33.3 % sum to 99.9 %); :func:`check_shares` rescales them to sum to 1."""


SHARE_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
"""What a typed share may be (after a decimal comma is read as a point and a ``%`` taken
off): ASCII digits only, as a census table prints them. ``float`` alone would also take
``1_000``, ``inf``, ``nan`` and the digits of other scripts (full-width ``０.３``,
Arabic-Indic), some but not all of them: they are refused, all alike."""


def _share_value(raw: object, where: str) -> float:
    """One share as a float: a number, ``"0,3"`` (decimal comma) or ``"30%"`` (0.3); a
    text must be :data:`SHARE_NUMBER` (ASCII digits)."""
    if isinstance(raw, bool):
        raise InvalidInputError(f"{where}: {raw!r} is not a number")
    percent = False
    if isinstance(raw, int | float):
        v = float(raw)
    else:
        text = str(raw).strip()
        percent = text.endswith("%")
        text = text.removesuffix("%").strip()
        if "," in text and "." not in text:
            text = text.replace(",", ".")
        if len(text) > 40 or not SHARE_NUMBER.fullmatch(text):
            if any(c.isdigit() and not c.isascii() for c in text):
                raise InvalidInputError(
                    f"{where}: {clip(str(raw), 40)!r} is not a number: write it with the "
                    "ASCII digits 0-9"
                )
            raise InvalidInputError(f"{where}: {clip(str(raw), 40)!r} is not a number")
        v = float(text)
    if not math.isfinite(v) or v < 0 or (percent and v > 100):
        raise InvalidInputError(f"{where}: {raw!r} is not a share between 0 and 1")
    return v / 100 if percent else v


def apportion(shares: Sequence[float], n: int, *, where: str) -> list[int]:
    """Counts out of ``n`` proportional to positive ``shares``, one at least each.

    The largest-remainder rule on ``n * share / sum(shares)``; then each option left at 0
    takes one from the largest count (the first of equal ones).

    Example: ``apportion([0.9, 0.08, 0.02], 10, where="x")`` is ``[8, 1, 1]``: the
    quotas ``9, 0.8, 0.2`` give ``[9, 1, 0]``, and the third option takes one from the
    first.

    Raises:
        InvalidInputError: ``n`` is smaller than the number of shares (``where`` names the
            attribute).
    """
    k = len(shares)
    if n < k:
        raise InvalidInputError(
            f"{where} has {k} options with a positive share; a sample of {n} profiles "
            f"cannot include each of them: give {k} at least"
        )
    total = sum(shares)
    quota = [n * v / total for v in shares]
    counts = [math.floor(q) for q in quota]
    by_remainder = sorted(range(k), key=lambda j: (counts[j] - quota[j], j))
    for j in by_remainder[: n - sum(counts)]:
        counts[j] += 1
    for j in range(k):
        if counts[j] == 0:
            counts[max(range(k), key=lambda i: (counts[i], -i))] -= 1
            counts[j] = 1
    return counts


def share_personas(
    attrs: Sequence[CodebookItem],
    shares: Mapping[str, Mapping[str, object]],
    *,
    sample: int | None = None,
    seed: int = 0,
    max_personas: int = MAX_PROFILE_PERSONAS,
) -> list[Persona]:
    """Personas from population shares of the attribute options (:func:`check_shares`),
    the attributes taken as independent.

    Without ``sample``: one persona per combination of options with a positive share,
    weight ``Π_a share[a, option_a]`` (they sum to 1). With ``sample = N``: ``N`` profiles
    whose options of each attribute are counted out by :func:`apportion` (every option with
    a positive share in one profile at least) and paired across attributes by a random
    permutation with ``seed``; identical profiles merged, weight = count / N. A persona's
    text is
    :func:`inference_server.personas.attribute_sentence` of its profile (the attribute's
    topic or question, then the option's label).

    Example: age ``{A: 0.4, B: 0.6}`` and region ``{A: 0.5, B: 0.5}`` give 4 personas of
    weights 0.2, 0.2, 0.3, 0.3.

    Raises:
        InvalidInputError: bad shares, a bad sample size, or more than ``max_personas``
            combinations without a sample.
    """
    checked = check_shares(attrs, shares)
    used = [a for a in attrs if a.id in checked]
    choices: list[list[tuple[int, float]]] = []
    for a in used:
        letters = [letter for letter, _ in a.options]
        choices.append([(letters.index(letter), v) for letter, v in checked[a.id].items() if v > 0])
    n_combos = math.prod(len(c) for c in choices)
    profiles: list[tuple[tuple[int, ...], float]]
    if sample is not None:
        if not 1 <= sample <= max_personas:
            raise InvalidInputError(f"sample: give a number from 1 to {max_personas}")
        rng = np.random.default_rng(seed)
        columns = []
        for a, c in zip(used, choices, strict=True):
            counts = apportion([v for _, v in c], sample, where=f"sample: {_attribute_name(a)}")
            column = np.repeat(np.asarray([k for k, _ in c]), counts)
            columns.append(rng.permutation(column))  # independent attributes
        drawn = np.stack(columns, axis=1)
        uniq, first, counts = np.unique(drawn, axis=0, return_index=True, return_counts=True)
        order = np.lexsort((first, -counts))
        profiles = [(tuple(int(x) for x in uniq[j]), counts[j] / sample) for j in order]
    else:
        if n_combos > max_personas:
            raise InvalidInputError(
                f"shares: {n_combos} attribute combinations, more than {max_personas}; "
                "give a sample size (how many profiles to draw)"
            )
        profiles = [
            (tuple(k for k, _ in combo), math.prod(v for _, v in combo))
            for combo in itertools.product(*choices)
        ]
    return [
        Persona(
            key=f"profile-{j}",
            text=attribute_sentence(used, list(prof)),
            weight=float(w),
            attributes={a.id: k for a, k in zip(used, prof, strict=True)},
        )
        for j, (prof, w) in enumerate(profiles, start=1)
    ]


SHARE_FIELD = "share:"
"""The prefix of the personas page's share fields: ``share:{item key}:{option letter}``."""


def shares_from_form(
    attrs: Sequence[CodebookItem], fields: Sequence[tuple[str, str]]
) -> dict[str, dict[str, str]]:
    """The shares typed in the personas page's table: the ``(name, text)`` of the form's
    fields named ``share:{item key}:{letter}`` (:data:`SHARE_FIELD`), one per attribute
    item and option. An attribute whose fields are all blank is not part of the profiles;
    one blank field among filled ones is an InvalidInputError naming it (a share left out
    by mistake, not a 0). A filled field that names no attribute item, or a letter that is
    not one of the attribute's options, or a field given twice, is an InvalidInputError
    naming the field (nothing is dropped silently). Validated by :func:`check_shares`.

    Example: ``[("share:age:A", "0.4"), ("share:age:B", "0.6")]`` gives
    ``{"age": {"A": "0.4", "B": "0.6"}}``.
    """
    known = {a.id: a for a in attrs}
    typed: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    for name, raw in fields:
        value = raw.strip()
        if not name.startswith(SHARE_FIELD) or not value:
            continue
        shown = clip(name, 60)
        if name in seen:
            raise InvalidInputError(f"form field {shown}: given twice; give each share once")
        seen.add(name)
        key, sep, letter = name.removeprefix(SHARE_FIELD).rpartition(":")
        if not sep:
            raise InvalidInputError(
                f"form field {shown}: not a share field (share:<attribute key>:<option letter>)"
            )
        if key not in known:
            raise InvalidInputError(
                f"form field {shown}: {clip(key, 40)} is not an attribute item of this study "
                f"(attributes: {', '.join(known) or 'none'})"
            )
        a = known[key]
        letters = [o for o, _ in a.options]
        if letter not in letters:
            raise InvalidInputError(
                f"shares of {_attribute_name(a)}, option {clip(letter, 20)}: not an option of "
                f"{a.id} ({', '.join(letters)})"
            )
        typed.setdefault(key, {})[letter] = value
    out: dict[str, dict[str, str]] = {}
    for a in attrs:
        given = typed.get(a.id)
        if given:
            blank = [letter for letter, _ in a.options if letter not in given]
            if blank:
                raise InvalidInputError(
                    f"shares of {_attribute_name(a)}, option {blank[0]}: blank while other "
                    "options have a share; type 0 for an option nobody has, or clear the "
                    "whole attribute"
                )
            out[a.id] = {letter: given[letter] for letter, _ in a.options}
    return out
