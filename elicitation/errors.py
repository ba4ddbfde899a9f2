"""Errors of the ``elicitation`` package.

One base class, :class:`ElicitationError`, so that callers (the CLI, the web app) can map
every user-facing problem of this package to one response (exit code 2, an error partial)
without turning unrelated ``ValueError``s into user errors.
"""

from __future__ import annotations


class ElicitationError(Exception):
    """Base error of the ``elicitation`` package; the message is one line for the user."""


class UnknownCriterionError(ElicitationError, KeyError):
    """A selection-criterion name that the registry does not know."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown criterion"


class CriterionNotApplicableError(ElicitationError):
    """A criterion was asked to score a model that lacks what it needs."""


class BudgetError(ElicitationError, ValueError):
    """An invalid budget or stopping rule (negative counts, min above max, ...)."""


class SessionError(ElicitationError, ValueError):
    """An invalid session transition: an unknown item, an item both asked and skipped, ..."""


class BenchmarkError(ElicitationError, ValueError):
    """Invalid benchmark input: an unknown method, a negative budget, a dataset without runs."""


class GroupError(ElicitationError, ValueError):
    """Invalid group-elicitation input (unknown selector, bad member set, ...)."""
