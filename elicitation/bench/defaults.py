"""Constants of the benchmark harness that the CLI needs without importing torch."""

from __future__ import annotations

DEFAULT_METHODS: tuple[str, ...] = ("default", "random", "fixed", "irt", "full")
"""The methods ``priorly bench individual`` runs when ``--methods`` is not given."""

DEFAULT_GROUP_METHODS: tuple[str, ...] = (
    "random_random",
    "greedy_random",
    "greedy_random_selfimpute",
    "greedy_relational_gnn",
    "default",
)
"""The methods ``priorly bench group`` runs when ``--methods`` is not given."""
