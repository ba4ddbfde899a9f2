"""The kinds of job: name → label and payload parameters (no job code, no service imports).

A job row's ``kind`` is one of :data:`KINDS`. Starting a job (:mod:`app.services.jobs`)
and the admin pages need only this table; the functions that do the work live in
:mod:`app.jobs.tasks`, which only the worker imports.

Example::

    >>> check_kind("fit_model").label
    'Fit the belief model'
"""

from __future__ import annotations

from dataclasses import dataclass

from app.errors import InvalidInputError


@dataclass(frozen=True)
class JobKind:
    """One kind of job.

    Attributes:
        name: the ``job.kind`` value.
        label: shown in the admin UI.
        params: the payload keys the job reads (all optional; defaults in
            :mod:`app.jobs.tasks`).
    """

    name: str
    label: str
    params: tuple[str, ...] = ()


KINDS: dict[str, JobKind] = {
    k.name: k
    for k in (
        JobKind("fit_model", "Fit the belief model", ("seed",)),
        JobKind("fixed_order", "Compute the fixed question order", ("key",)),
        JobKind(
            "simulation",
            "Simulate before fielding",
            ("budget", "max_test_users", "n_classes", "baselines", "seed"),
        ),
        JobKind("train_gnn", "Train the group GNN", ("seed", "max_epochs")),
        JobKind(
            "plan_group_round", "Plan the next group round", ("max_members", "seed", "selection")
        ),
        JobKind(
            "persona_generation",
            "Generate persona distributions (LLM)",
            (
                "backend",
                "base_url",
                "model",
                "batch_size",
                "concurrency",
                "threshold",
                "n_personas",
                "seed",
                "limit",
                "chunk",
            ),
        ),
    )
}
"""Every kind of job, in the order the admin UI lists them."""

LABELS: dict[str, str] = {name: kind.label for name, kind in KINDS.items()}
"""``kind → label`` (the admin templates)."""


def kind_names() -> list[str]:
    """The names of every kind of job."""
    return list(KINDS)


def check_kind(name: str) -> JobKind:
    """The kind ``name``; :class:`InvalidInputError` naming the known ones otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise InvalidInputError(
            f"unknown job kind {name!r} (known: {', '.join(kind_names())})"
        ) from None
