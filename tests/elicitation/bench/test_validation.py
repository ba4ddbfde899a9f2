"""Validation and cross-validation splits: choices are made without reading test users."""

from __future__ import annotations

from pathlib import Path

import pytest

from elicitation.bench.validation import (
    cross_validation_dataset,
    run_validation,
    validation_dataset,
)
from elicitation.datasets import load_dataset
from elicitation.errors import BenchmarkError
from tests.support.elicitation_cases import write_tiny_dataset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_dataset(tmp_path_factory.mktemp("tiny") / "tiny")


def test_validation_dataset_scores_the_validation_users(tiny: Path) -> None:
    ds = load_dataset(tiny)
    assert ds.split is not None
    v = validation_dataset(ds, val_fraction=0.25, seed=1)
    assert v.split is not None
    assert v.split["test_users"] == ds.split["val_users"]
    inner = set(v.split["train_users"]) | set(v.split["val_users"])
    assert inner == set(ds.split["train_users"])
    assert not set(v.split["train_users"]) & set(v.split["val_users"])
    assert len(v.split["val_users"]) == round(0.25 * len(ds.split["train_users"]))
    assert not inner & set(ds.split["test_users"])
    # reproducible, and the original dataset is unchanged
    assert validation_dataset(ds, val_fraction=0.25, seed=1).split == v.split
    assert ds.split == load_dataset(tiny).split


def test_cross_validation_folds_cover_the_non_test_users_once(tiny: Path) -> None:
    ds = load_dataset(tiny)
    assert ds.split is not None
    pool = set(ds.split["train_users"]) | set(ds.split["val_users"])
    scored: list[str] = []
    for f in range(3):
        cv = cross_validation_dataset(ds, f, n_folds=3)
        assert cv.split is not None
        parts = [set(cv.split[k]) for k in ("train_users", "val_users", "test_users")]
        assert parts[0] | parts[1] | parts[2] == pool
        assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
        scored += cv.split["test_users"]
    assert sorted(scored) == sorted(pool)
    with pytest.raises(BenchmarkError, match="fold"):
        cross_validation_dataset(ds, 3, n_folds=3)


def test_run_validation_runs_the_harness(tiny: Path) -> None:
    res = run_validation(
        tiny,
        2,
        ["default", "fixed"],
        progress=False,
        fit_options={"latent_classes": {"n_classes": (2, 3), "n_restarts": 1}},
    )
    assert res["dataset"] == "tiny[validation]"
    ds = load_dataset(tiny)
    assert ds.split is not None
    assert res["protocol"]["test_users"] == len(ds.split["val_users"])
    for m in ("default", "fixed"):
        assert len(res["methods"][m]["log_loss"]) == 3
