"""The criterion registry: registry name -> :class:`SelectionCriterion` subclass.

Example::

    >>> get_criterion("eig_anchored", delta=0.001).params()["delta"]
    0.001
"""

from __future__ import annotations

from typing import Any

from elicitation.criteria.base import SelectionCriterion
from elicitation.errors import ElicitationError, UnknownCriterionError

_CRITERIA: dict[str, type[SelectionCriterion]] = {}


def register_criterion(cls: type[SelectionCriterion]) -> type[SelectionCriterion]:
    """Class decorator: make ``cls`` available to :func:`get_criterion` under ``cls.name``."""
    if not cls.name:
        raise ElicitationError(f"{cls.__name__} has no criterion name")
    _CRITERIA[cls.name] = cls
    return cls


def criterion_names() -> list[str]:
    """The registered criterion names, sorted."""
    return sorted(_CRITERIA)


def get_criterion(name: str, **kwargs: Any) -> SelectionCriterion:
    """A new criterion of the registered class ``name`` built with ``kwargs``.

    Raises:
        UnknownCriterionError: ``name`` is not registered (the message lists the known ones).
        ElicitationError: a keyword the criterion does not take.
    """
    try:
        cls = _CRITERIA[name]
    except KeyError:
        raise UnknownCriterionError(
            f"unknown selection criterion {name!r} (known: {', '.join(criterion_names())})"
        ) from None
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ElicitationError(
            f"criterion {name!r}: bad parameters {sorted(kwargs)}: {exc}"
        ) from None
