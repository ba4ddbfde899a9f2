"""Persona dictionaries: the ``θ`` of the persona mixture (docs/methods.md §1.1).

Three sources:

* **texts** a researcher enters (:func:`from_texts`, :func:`read_persona_file`);
* **attribute profiles** of a dataset's respondents (:func:`from_attributes`): one sentence
  per distinct attribute combination, or per sampled respondent, built generically from
  each attribute item's topic (or question) and the chosen option's codebook label, e.g.
  ``"Gender: Woman; Party Identification: Democrat; ..."``;
* **imported answer matrices** (:func:`load_answer_matrix`): a persona × item table of
  deterministic answers, turned into distributions with noise ``ε``.

A persona's identity is the SHA-256 of its text (:func:`persona_hash`), so a stored
distribution is found again whatever the persona's key or position in a dictionary. Texts
are kept verbatim — HTML or template syntax is data, escaped only when a page is rendered.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from elicitation.datasets import MISSING_CODE, CodebookItem, Dataset
from inference_server.errors import PersonaError

MAX_PERSONA_CHARS = 4000
"""Longest persona text accepted (a system message, not a document)."""

MAX_PERSONA_KEY_CHARS = 190
"""Longest persona key accepted (the app's ``study_persona.key`` holds 200 characters: room
for the ``~2`` suffix of a key given again in a later upload)."""

PERSONA_FILE_TYPES = (".txt", ".jsonl", ".json")
"""The persona file formats (:func:`parse_personas`), by file extension."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for messages (never a Python repr).

    >>> json_type({"a": 1}), json_type([1]), json_type(2.5), json_type(None)
    ('an object', 'a list', 'a number', 'null')
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    for kind, name in ((str, "a string"), (dict, "an object"), (list, "a list")):
        if isinstance(value, kind):
            return name
    return "a number" if isinstance(value, int | float) else type(value).__name__


def text_lines(raw: str) -> list[str]:
    """The lines of a persona file: split at ``\n`` only (a ``\r`` before it is dropped).

    Unlike ``str.splitlines``, a U+2028/U+2029, form feed or other Unicode line separator
    inside a line stays part of it (a pasted text with one does not become two personas,
    and a JSON string holding one stays one JSON line).

    >>> text_lines("a\u2028b\r\nc\n")
    ['a\u2028b', 'c', '']
    """
    return [line.removesuffix("\r") for line in raw.split("\n")]


def _no_surrogate(text: str, where: str, what: str) -> None:
    found = _SURROGATE.search(text)
    if found is not None:
        raise PersonaError(
            f"{where}: {what} contains a lone surrogate (U+{ord(found.group()):04X}) at "
            f"position {found.start()}, which is not text (a broken \\u escape?)"
        )


def persona_hash(text: str) -> str:
    """SHA-256 (hex) of a persona text, encoded as UTF-8: the persona's stable identity."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Persona:
    """One persona of a dictionary.

    Attributes:
        key: a short human-readable name (``"profile-3"``, ``"respondent-123"``, a
            researcher's label); not part of the identity.
        text: the persona description given to the language model as the system message,
            verbatim.
        weight: a prior weight (e.g. how many respondents share this attribute profile);
            normalise over the dictionary to get ``p(θ)``.
        attributes: for attribute personas, ``{item id: option index}`` of the profile.
    """

    key: str
    text: str
    weight: float = 1.0
    attributes: Mapping[str, int] = field(default_factory=dict)

    @property
    def hash(self) -> str:
        """:func:`persona_hash` of :attr:`text`."""
        return persona_hash(self.text)


def _check_field(value: object, where: str, what: str, limit: int) -> str:
    """``value`` unchanged if it is a non-blank string of at most ``limit`` characters
    without a NUL character or a lone surrogate; else a :class:`PersonaError` naming
    ``where`` and ``what`` (``"key"``, ``"persona text"``)."""
    if not isinstance(value, str):
        raise PersonaError(f"{where}: {what} must be a string, got {json_type(value)}")
    if not value.strip():
        raise PersonaError(f"{where}: {what} is empty")
    if "\x00" in value:
        raise PersonaError(f"{where}: {what} contains a NUL character")
    _no_surrogate(value, where, what)
    if len(value) > limit:
        raise PersonaError(f"{where}: {what} has {len(value):,} characters (at most {limit:,})")
    return value


def check_persona_key(key: object, where: str) -> str:
    """Validate one persona key (a researcher's label) and return it unchanged.

    Raises:
        PersonaError: if it is not a string, is blank, contains a NUL character or a lone
            surrogate, or is longer than :data:`MAX_PERSONA_KEY_CHARS`.
    """
    return _check_field(key, where, "key", MAX_PERSONA_KEY_CHARS)


def check_persona_text(text: object, where: str) -> str:
    """Validate one persona text and return it unchanged.

    Args:
        text: the candidate text.
        where: where it came from, for the error message (``"persona 3"``, ``"file.txt
            line 7"``).

    Raises:
        PersonaError: if it is not a string, is blank, contains a NUL character or a lone
            surrogate, or is longer than :data:`MAX_PERSONA_CHARS`.
    """
    return _check_field(text, where, "persona text", MAX_PERSONA_CHARS)


def from_texts(texts: Sequence[str], keys: Sequence[str] | None = None) -> list[Persona]:
    """Personas from researcher-entered texts, kept verbatim.

    Args:
        texts: one description per persona.
        keys: optional names (default ``"persona-1"``, ``"persona-2"``, ...).

    Raises:
        PersonaError: on an invalid text (see :func:`check_persona_text`), a key count that
            does not match, or two identical texts (they would be one persona).
    """
    if keys is not None and len(keys) != len(texts):
        raise PersonaError(f"{len(texts)} persona texts but {len(keys)} keys")
    if not texts:
        raise PersonaError("the persona dictionary is empty")
    out: list[Persona] = []
    seen: dict[str, int] = {}
    for i, text in enumerate(texts):
        check_persona_text(text, f"persona {i + 1}")
        h = persona_hash(text)
        if h in seen:
            raise PersonaError(f"persona {i + 1} has the same text as persona {seen[h] + 1}")
        seen[h] = i
        out.append(Persona(key=keys[i] if keys is not None else f"persona-{i + 1}", text=text))
    return out


def read_persona_file(path: str | Path) -> list[Persona]:
    """Read researcher personas from a file (formats: :func:`parse_personas`, by extension).

    Raises:
        PersonaError: naming the file and line (or list position) of the first problem.
    """
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PersonaError(f"persona file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PersonaError(f"{p}: cannot read persona file: {exc}") from None
    return parse_personas(raw, name=p.name, kind=p.suffix.lower())


MAX_PERSONA_WEIGHT = 1e12
"""The largest weight of a researcher persona (weights are relative: a larger one would
only overflow the normalisation)."""


def parse_personas(raw: str, *, name: str, kind: str) -> list[Persona]:
    """Researcher personas from the text of a persona file.

    Formats (``kind``):

    * ``.txt``: one persona per line (lines end at ``\n`` or ``\r\n`` only:
      :func:`text_lines`); blank lines are skipped;
    * ``.jsonl``: one JSON object per line with ``text`` and optional ``key`` (a string
      of at most :data:`MAX_PERSONA_KEY_CHARS` characters) and ``weight``;
    * ``.json``: a list of strings or of such objects.

    Example: ``parse_personas('{"text": "A nurse", "weight": 2}', name="p", kind=".jsonl")``
    is one persona ``persona-1`` of weight 2.

    Raises:
        PersonaError: naming ``name`` and the line (or list position) of the first problem.
    """
    suffix = kind

    def load(text: str, where: str) -> object:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            at = f"{name} line {exc.lineno}" if suffix == ".json" else where
            raise PersonaError(f"{at}: invalid JSON: {exc.msg}") from None
        except RecursionError:
            raise PersonaError(f"{where}: JSON nested too deeply to read") from None
        except ValueError as exc:  # e.g. an integer of more than 4,300 digits
            raise PersonaError(f"{where}: invalid JSON: {exc}") from None

    entries: list[tuple[str, object]] = []  # (where, entry)
    if suffix == ".txt":
        for n, line in enumerate(text_lines(raw), start=1):
            if line.strip():
                entries.append((f"{name} line {n}", line))
    elif suffix == ".jsonl":
        for n, line in enumerate(text_lines(raw), start=1):
            if not line.strip():
                continue
            entries.append((f"{name} line {n}", load(line, f"{name} line {n}")))
    elif suffix == ".json":
        data = load(raw, name)
        if not isinstance(data, list):
            raise PersonaError(f"{name}: expected a JSON list of personas")
        entries = [(f"{name} entry {i + 1}", e) for i, e in enumerate(data)]
    else:
        raise PersonaError(
            f"{name}: unknown persona file type {suffix or '(none)'}: use "
            f"{', '.join(PERSONA_FILE_TYPES)}"
        )
    if not entries:
        raise PersonaError(f"{name}: no personas in the file")
    out: list[Persona] = []
    seen: dict[str, str] = {}  # text hash -> where
    keys: dict[str, str] = {}  # key -> where
    for i, (where, entry) in enumerate(entries):
        key, weight = f"persona-{i + 1}", 1.0
        if isinstance(entry, dict):
            unknown = sorted(set(entry) - {"text", "key", "weight"})
            if unknown:
                raise PersonaError(
                    f"{where}: unknown fields {', '.join(unknown)} (the fields are text, key, "
                    "weight)"
                )
            if "text" not in entry:
                raise PersonaError(f"{where}: missing field 'text'")
            text = entry["text"]
            if "key" in entry:
                key = check_persona_key(entry["key"], where)
            w = entry.get("weight", 1.0)
            try:
                weight = float(w) if isinstance(w, int | float) and not isinstance(w, bool) else 0
            except OverflowError:  # an integer beyond the float range
                weight = math.inf
            if not (0 < weight <= MAX_PERSONA_WEIGHT):
                if isinstance(w, int) and not isinstance(w, bool) and abs(w) >= 10**30:
                    shown = "a huge integer"
                elif isinstance(w, int | float) and not isinstance(w, bool):
                    shown = f"{w:g}"
                else:
                    shown = json_type(w)
                raise PersonaError(
                    f"{where}: weight must be a positive number at most "
                    f"{MAX_PERSONA_WEIGHT:g}, got {shown}"
                )
        else:
            text = entry
        check_persona_text(text, where)
        assert isinstance(text, str)
        h = persona_hash(text)
        if h in seen:
            raise PersonaError(f"{where}: the same text as {seen[h]}")
        seen[h] = where
        if key in keys:
            raise PersonaError(f"{where}: the same key {key!r} as {keys[key]}")
        keys[key] = where
        out.append(Persona(key=key, text=text, weight=weight))
    return out


# ----- attribute personas -------------------------------------------------------------


def _item_label(item: CodebookItem, shared_topics: frozenset[str] = frozenset()) -> str:
    """The name of an attribute in a persona sentence: its topic, else (no topic, or a
    topic in ``shared_topics``: one that several attributes have) its question."""
    topic = (item.topic or "").strip()
    label = topic if topic and topic not in shared_topics else item.question.strip()
    return label.rstrip(" ?:.")


def attribute_sentence(items: Sequence[CodebookItem], options: Sequence[int]) -> str:
    """The persona sentence of one attribute profile.

    ``"{label of item 1}: {option label}; {label of item 2}: {option label}."`` where an
    item's label is its codebook topic (its question when it has none, or when another of
    ``items`` has the same topic: "Demographics: 18-34; Demographics: North" would not
    say which is which) and missing attributes (``-1``) are left out. Nothing here knows
    any particular dataset.

    Raises:
        PersonaError: if every attribute is missing or an option is out of range.
    """
    topics = [(it.topic or "").strip() for it in items]
    shared = frozenset(t for t in topics if t and topics.count(t) > 1)
    parts: list[str] = []
    for item, k in zip(items, options, strict=True):
        k = int(k)
        if k == MISSING_CODE:
            continue
        if not 0 <= k < item.n_options:
            raise PersonaError(f"option {k} out of range for attribute {item.id!r}")
        parts.append(f"{_item_label(item, shared)}: {item.options[k][1].strip()}")
    if not parts:
        raise PersonaError("an attribute profile with every attribute missing")
    return "; ".join(parts) + "."


def from_attributes(
    dataset: Dataset,
    *,
    attributes: Sequence[str] | None = None,
    rows: Sequence[int] | np.ndarray | None = None,
    mode: str = "profiles",
    n: int | None = None,
    seed: int = 0,
) -> list[Persona]:
    """Personas built from the attribute combinations of a dataset's respondents.

    Args:
        dataset: a loaded dataset in the canonical format.
        attributes: the attribute items (default: the manifest's ``demographics``).
        rows: respondent rows to use (default: all), e.g. the training users.
        mode, n, seed: see :func:`profiles_from_matrix`.

    Raises:
        PersonaError: no attribute items, an unknown item, or see
            :func:`profiles_from_matrix`.
    """
    keys = list(dataset.demographics if attributes is None else attributes)
    if not keys:
        raise PersonaError(f"dataset {dataset.name!r} has no attribute (demographic) items")
    try:
        items = [dataset.item(k) for k in keys]
    except Exception as exc:  # DatasetError: an unknown item id
        raise PersonaError(f"attribute items: {exc}") from None
    matrix = dataset.matrix(keys)
    if rows is not None:
        matrix = matrix[np.asarray(rows, dtype=np.int64)]
    return profiles_from_matrix(items, matrix, mode=mode, n=n, seed=seed)


def profiles_from_matrix(
    items: Sequence[CodebookItem],
    matrix: np.ndarray,
    *,
    mode: str = "profiles",
    n: int | None = None,
    seed: int = 0,
) -> list[Persona]:
    """Personas from an attribute matrix ``[N, A]`` of option indices (``-1`` = missing).

    Args:
        items: the ``A`` attribute items (codebook entries, for the labels).
        matrix: one row per respondent.
        mode: ``"profiles"`` — one persona per distinct attribute profile, weighted by how
            many respondents have it, most frequent first (ties: first appearance), the
            first ``n`` when ``n`` is given; ``"sample"`` — ``n`` respondents drawn without
            replacement with ``seed``, identical profiles merged (weights add up).
        n: how many personas (required for ``"sample"``).
        seed: the sampling seed.

    Returns:
        Personas whose text is :func:`attribute_sentence` of the profile, whose
        ``attributes`` hold the profile and whose ``weight`` counts its respondents.
        Respondents with every attribute missing are left out.

    Raises:
        PersonaError: on an unknown mode, a bad ``n``, a shape mismatch, or no respondent
            with any attribute.
    """
    matrix = np.asarray(matrix)
    if matrix.ndim != 2 or matrix.shape[1] != len(items):
        raise PersonaError(
            f"attribute matrix must have shape [N, {len(items)}], got {list(matrix.shape)}"
        )
    if n is not None and n < 1:
        raise PersonaError(f"n must be at least 1, got {n}")
    if mode == "sample":
        if n is None:
            raise PersonaError("mode 'sample' needs n (how many respondents to draw)")
        rng = np.random.default_rng(seed)
        pick = rng.choice(matrix.shape[0], size=min(n, matrix.shape[0]), replace=False)
        matrix = matrix[np.sort(pick)]
    elif mode != "profiles":
        raise PersonaError(f"unknown persona mode {mode!r} (profiles, sample)")
    matrix = matrix[(matrix != MISSING_CODE).any(axis=1)]
    if matrix.shape[0] == 0:
        raise PersonaError(
            f"no respondent has any of the attributes {', '.join(it.id for it in items)}"
        )
    profiles, first, counts = np.unique(matrix, axis=0, return_index=True, return_counts=True)
    if mode == "profiles":
        order = np.lexsort((first, -counts))  # most frequent first, then first appearance
        if n is not None:
            order = order[:n]
    else:
        order = np.argsort(first, kind="stable")  # sampled order
    keys = [it.id for it in items]
    out: list[Persona] = []
    for j, idx in enumerate(order, start=1):
        prof = profiles[idx]
        out.append(
            Persona(
                key=f"profile-{j}",
                text=attribute_sentence(items, prof.tolist()),
                weight=float(counts[idx]),
                attributes={k: int(v) for k, v in zip(keys, prof.tolist(), strict=True)},
            )
        )
    return out


# ----- imported answer matrices ---------------------------------------------------------


@dataclass(frozen=True)
class AnswerMatrix:
    """An imported persona dictionary of deterministic answers.

    Attributes:
        persona_ids: ``K`` persona ids (the first column of the answer file).
        item_keys: ``I`` item ids (the other columns).
        questions: each item's question text.
        n_options: ``O_i`` per item.
        answers: ``LongTensor [K, I]`` option indices (0-based), ``-1`` = no answer.
    """

    persona_ids: tuple[str, ...]
    item_keys: tuple[str, ...]
    questions: tuple[str, ...]
    n_options: tuple[int, ...]
    answers: Tensor

    def distributions(self, epsilon: float) -> Tensor:
        """``μ [K, I, O]`` from the answers with noise ``ε`` (see :func:`deterministic_mu`)."""
        return deterministic_mu(self.answers, self.n_options, epsilon)


def deterministic_mu(answers: Tensor, n_options: Sequence[int], epsilon: float) -> Tensor:
    """Distributions from single answers: ``1 − ε`` on the answer, ``ε / (O_i − 1)`` elsewhere.

    ``μ[θ, i, k] = 1 − ε`` if ``k = ŷ[θ, i]``, else ``ε / (O_i − 1)`` for ``k < O_i`` and
    0 for ``k ≥ O_i``; a missing answer (``-1``) gives the uniform ``1 / O_i``; a
    single-option item gets 1 (docs/methods.md §1.2; the persona-prior paper uses ε = 0.05
    on synthetic respondents and 0.5 against real people).

    Example::

        deterministic_mu(torch.tensor([[0, -1]]), [3, 2], 0.1)
        # tensor([[[0.90, 0.05, 0.05], [0.50, 0.50, 0.00]]])  (K = 1, I = 2, max O = 3)

    Args:
        answers: ``LongTensor [K, I]``.
        n_options: ``O_i`` for each of the ``I`` items.
        epsilon: in ``[0, 1)``.

    Returns:
        ``float64 [K, I, max O_i]``; each row over ``k < O_i`` sums to 1.
    """
    if not 0 <= epsilon < 1:
        raise PersonaError(f"epsilon must be in [0, 1), got {epsilon}")
    answers = torch.as_tensor(answers, dtype=torch.long)
    k_n, i_n = answers.shape
    if i_n != len(n_options):
        raise PersonaError(f"answers have {i_n} items but {len(n_options)} option counts")
    o = torch.tensor(list(n_options), dtype=torch.float64)  # [I]
    o_max = int(o.max()) if i_n else 0
    if bool(((answers >= o.long().unsqueeze(0)) | (answers < MISSING_CODE)).any()):
        raise PersonaError("an answer is outside its item's options")
    valid = (torch.arange(o_max).unsqueeze(0) < o.unsqueeze(1)).to(torch.float64)  # [I, O]
    off = torch.where(o > 1, epsilon / (o - 1).clamp_min(1), torch.zeros_like(o))
    mu = (off.view(1, i_n, 1) * valid).expand(k_n, i_n, o_max).clone()
    on = torch.where(o > 1, torch.full_like(o, 1 - epsilon), torch.ones_like(o))
    on = on.view(1, i_n, 1).expand(k_n, i_n, 1)
    mu.scatter_(2, answers.clamp_min(0).unsqueeze(-1), on.clone())
    uniform = (valid / o.unsqueeze(1)).unsqueeze(0).expand(k_n, i_n, o_max)
    return torch.where((answers == MISSING_CODE).unsqueeze(-1), uniform, mu)


def _read_metadata(meta_path: Path, metadata_file: str) -> dict:
    """The question metadata JSON object ``{item id: {...}}`` of ``meta_path``.

    Raises:
        PersonaError: the file is not valid JSON or not a JSON object.
    """
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PersonaError(f"{metadata_file}: invalid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise PersonaError(f"{metadata_file}: expected a JSON object keyed by item id")
    return meta


def _item_scales(
    item_keys: list[str], meta: dict, answers_file: str, metadata_file: str
) -> tuple[list[int], list[int], list[str]]:
    """Per item column: the scale's lowest answer, its number of options, its question.

    An item with scale ``lo..hi`` (integers, ``hi > lo``) has ``hi − lo + 1`` options; the
    question defaults to the item id.

    Raises:
        PersonaError: a column without a metadata entry or without an integer scale.
    """
    lows, n_opts, questions = [], [], []
    for key in item_keys:
        m = meta.get(key)
        if not isinstance(m, dict):
            raise PersonaError(f"{answers_file}: column {key!r} has no entry in {metadata_file}")
        lo, hi = m.get("answer_scale_min"), m.get("answer_scale_max")
        if (
            isinstance(lo, bool)
            or isinstance(hi, bool)
            or not (isinstance(lo, int) and isinstance(hi, int) and hi > lo)
        ):
            raise PersonaError(
                f"{metadata_file}: item {key!r} has no integer answer scale "
                f"(answer_scale_min={lo!r}, answer_scale_max={hi!r})"
            )
        lows.append(lo)
        n_opts.append(hi - lo + 1)
        questions.append(str(m.get("question", key)))
    return lows, n_opts, questions


def _answer_codes(
    cells: list[str],
    r: int,
    item_keys: list[str],
    lows: list[int],
    n_opts: list[int],
    answers_file: str,
) -> list[int]:
    """Option codes of one CSV row's answer cells (row ``r``): ``v − lo``, or ``MISSING_CODE``.

    Raises:
        PersonaError: a cell that is not an integer, or outside its item's scale.
    """
    codes: list[int] = []
    for j, cell in enumerate(cells):
        cell = cell.strip()
        if not cell:
            codes.append(MISSING_CODE)
            continue
        try:
            v = float(cell)
            ok = v.is_integer()
        except ValueError:
            ok = False
        if not ok:
            raise PersonaError(
                f"{answers_file} row {r}, column {item_keys[j]!r}: {cell!r} is not an "
                "integer answer"
            )
        code = int(v) - lows[j]
        if not 0 <= code < n_opts[j]:
            raise PersonaError(
                f"{answers_file} row {r}, column {item_keys[j]!r}: answer {cell} is "
                f"outside the scale {lows[j]}..{lows[j] + n_opts[j] - 1}"
            )
        codes.append(code)
    return codes


def load_answer_matrix(
    folder: str | Path,
    *,
    answers_file: str = "persona_answers_deterministic.csv",
    metadata_file: str = "question_metadata.json",
) -> AnswerMatrix:
    """Read a deterministic persona answer matrix and its question metadata.

    The answer file is a CSV whose first column is the persona id and whose other columns
    are item ids; a cell is an integer answer on the item's scale or empty. The metadata
    is a JSON object ``{item id: {"question", "answer_scale_min", "answer_scale_max"}}``;
    answer ``v`` becomes option ``v − answer_scale_min`` of
    ``answer_scale_max − answer_scale_min + 1`` options.

    Raises:
        PersonaError: naming the file, row and column of the first problem (a missing
            file, an item without a numeric scale, a non-integer or out-of-scale answer, a
            duplicate persona id, a ragged row).
    """
    base = Path(folder)
    ans_path, meta_path = base / answers_file, base / metadata_file
    for p in (ans_path, meta_path):
        if not p.is_file():
            raise PersonaError(f"persona answer matrix: file not found: {p}")
    meta = _read_metadata(meta_path, metadata_file)
    with ans_path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise PersonaError(f"{answers_file}: the file is empty") from None
        item_keys = [h.strip() for h in header[1:]]
        if not item_keys:
            raise PersonaError(f"{answers_file}: no item columns")
        lows, n_opts, questions = _item_scales(item_keys, meta, answers_file, metadata_file)
        ids: list[str] = []
        rows: list[list[int]] = []
        seen: set[str] = set()
        for r, row in enumerate(reader, start=1):
            if not row:
                continue
            if len(row) != len(header):
                raise PersonaError(
                    f"{answers_file} row {r}: {len(row)} cells, the header has {len(header)}"
                )
            pid = row[0].strip()
            if not pid or pid in seen:
                raise PersonaError(
                    f"{answers_file} row {r}: missing or duplicate persona id {pid!r}"
                )
            seen.add(pid)
            codes = _answer_codes(row[1:], r, item_keys, lows, n_opts, answers_file)
            ids.append(pid)
            rows.append(codes)
    if not rows:
        raise PersonaError(f"{answers_file}: no personas")
    return AnswerMatrix(
        persona_ids=tuple(ids),
        item_keys=tuple(item_keys),
        questions=tuple(questions),
        n_options=tuple(n_opts),
        answers=torch.tensor(rows, dtype=torch.long),
    )
