"""The individual benchmark on validation users: for choosing methods without test users.

The benchmark's protocol chooses anything (a criterion, its parameters) on the
validation users and scores only the test users. :func:`validation_dataset` turns a
dataset into one whose *test* users are the original validation users and whose
train / validation users are a seeded split of the original training users
(``val_fraction`` of them become the inner validation users on which the fits choose
their structure, e.g. the number of latent classes). Running :func:`run_individual` on
it therefore never reads a test user's answers: every method is fitted on training users
only and scored on the validation users.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from elicitation.bench.individual import run_individual
from elicitation.datasets import Dataset, load_dataset
from elicitation.errors import BenchmarkError


def validation_dataset(
    dataset: Dataset | str | Path, *, val_fraction: float = 0.2, seed: int = 0
) -> Dataset:
    """A copy of ``dataset`` whose test users are its validation users.

    Args:
        dataset: a loaded dataset or its folder (must have a split with validation users).
        val_fraction: share of the training users that become inner validation users.
        seed: seed of the (reproducible) inner split.

    Returns:
        The same dataset with ``split = {"train_users": train minus inner,
        "val_users": inner, "test_users": original val_users}``.

    Raises:
        BenchmarkError: no split, no validation users, or a bad ``val_fraction``.
    """
    ds = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
    if ds.split is None or not ds.split.get("val_users"):
        raise BenchmarkError(f"dataset {ds.name!r} has no validation users to score")
    if not 0 < val_fraction < 1:
        raise BenchmarkError(f"val_fraction must be in (0, 1), got {val_fraction}")
    train = list(ds.split["train_users"])
    perm = np.random.default_rng(seed).permutation(len(train))
    n_inner = max(1, round(val_fraction * len(train)))
    inner = sorted(int(i) for i in perm[:n_inner])
    keep = sorted(int(i) for i in perm[n_inner:])
    split = {
        "train_users": [train[i] for i in keep],
        "val_users": [train[i] for i in inner],
        "test_users": list(ds.split["val_users"]),
    }
    return dataclasses.replace(ds, name=f"{ds.name}[validation]", split=split)


def cross_validation_dataset(
    dataset: Dataset | str | Path,
    fold: int,
    *,
    n_folds: int = 5,
    val_fraction: float = 0.2,
    seed: int = 0,
) -> Dataset:
    """Fold ``fold`` of a ``n_folds``-fold cross-validation over the non-test users.

    The training and validation users together are shuffled (seeded) and cut into
    ``n_folds`` folds; fold ``fold`` becomes the scored ("test") users, and the other
    folds are split into training users and ``val_fraction`` inner validation users.
    Every non-test user is scored exactly once over the folds: ``n_folds`` times more
    scored users than :func:`validation_dataset`, so smaller differences between
    methods can be told apart. The test users are never read.

    Raises:
        BenchmarkError: no split, a bad ``fold``, ``n_folds`` or ``val_fraction``.
    """
    ds = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
    if ds.split is None:
        raise BenchmarkError(f"dataset {ds.name!r} has no user split")
    if n_folds < 2 or not 0 <= fold < n_folds:
        raise BenchmarkError(f"need n_folds >= 2 and 0 <= fold < n_folds, got {fold}/{n_folds}")
    if not 0 < val_fraction < 1:
        raise BenchmarkError(f"val_fraction must be in (0, 1), got {val_fraction}")
    users = list(ds.split["train_users"]) + list(ds.split.get("val_users", []))
    perm = np.random.default_rng(seed).permutation(len(users))
    folds = np.array_split(perm, n_folds)
    scored = sorted(int(i) for i in folds[fold])
    rest = np.concatenate([f for j, f in enumerate(folds) if j != fold])
    n_inner = max(1, round(val_fraction * len(rest)))
    split = {
        "train_users": [users[i] for i in sorted(int(i) for i in rest[n_inner:])],
        "val_users": [users[i] for i in sorted(int(i) for i in rest[:n_inner])],
        "test_users": [users[i] for i in scored],
    }
    return dataclasses.replace(ds, name=f"{ds.name}[cv {fold + 1}/{n_folds}]", split=split)


def run_validation(
    dataset: Dataset | str | Path,
    budget: int,
    methods: Sequence[str],
    *,
    val_fraction: float = 0.2,
    split_seed: int = 0,
    **kwargs: Any,
) -> dict[str, Any]:
    """:func:`run_individual` on :func:`validation_dataset` (same result format)."""
    ds = validation_dataset(dataset, val_fraction=val_fraction, seed=split_seed)
    return run_individual(ds, budget, methods, **kwargs)
