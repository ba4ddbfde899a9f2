"""The column names of the answer exports, and the item keys they reserve.

A leaf module (it imports nothing of the app), so that the study designer can refuse an
item key the exports need without importing the exports.
"""

from __future__ import annotations

from collections.abc import Callable

META_COLUMNS = (
    "respondent_id",
    "session_id",
    "source",
    "status",
    "started_at",
    "completed_at",
    "earlier_starts",
)
PANEL_PREFIX = "panel."
"""The wide CSV's column of a link parameter ``K`` (``PROLIFIC_PID`` from
``/s/{slug}?PROLIFIC_PID=...``) is ``panel.K``, after the meta columns."""
PRED_SUFFIX, PROB_SUFFIX = "__pred", "__p"
"""With predictions, the wide CSV adds ``<key>__pred`` (the most likely option's letter)
and ``<key>__p`` (its probability) per item, filled where the item has no answer."""


def reserved_key(key: str) -> str | None:
    """Why ``key`` cannot be the key of an item added in the designer, or ``None``: the
    wide CSV would have two columns of that name (an imported item keeps its key, and
    :func:`unique_columns` tells the two apart). Reserved: the meta columns (:data:`META_COLUMNS`), the link parameters'
    ``panel.`` prefix and the prediction suffixes ``__pred`` and ``__p``.

    Example: ``reserved_key("status")`` is ``"'status' is the name of an export column
    (respondent_id, session_id, source, status, started_at, completed_at,
    earlier_starts)"``; ``reserved_key("status_q")`` is ``None``.
    """
    if key in META_COLUMNS:
        return f"{key!r} is the name of an export column ({', '.join(META_COLUMNS)})"
    if key.startswith(PANEL_PREFIX):
        return f"{key!r} starts with {PANEL_PREFIX!r}, the prefix of the link parameters' columns"
    for suffix in (PRED_SUFFIX, PROB_SUFFIX):
        if key.endswith(suffix):
            return f"{key!r} ends with {suffix!r}, the suffix of the prediction columns"
    return None


def unique_columns(
    names: list[str], *, taken: tuple[str, ...] = (), fold: Callable[[str], str] = str
) -> list[str]:
    """``names`` with each repeat of an earlier name (or of one in ``taken``) given ``_2``,
    ``_3``, ... (the first keeps its name), so that a header names every column once;
    names are compared after ``fold`` (``str.lower`` for the case-insensitive SPSS and
    Stata names).

    Example: an imported item ``status`` after the meta columns:
    ``unique_columns(["respondent_id", "status", "q1", "status"])`` is
    ``["respondent_id", "status", "q1", "status_2"]``.
    """
    used = {fold(t) for t in taken}
    out: list[str] = []
    for name in names:
        unique, n = name, 1
        while fold(unique) in used:
            n += 1
            unique = f"{name}_{n}"
        used.add(fold(unique))
        out.append(unique)
    return out
