"""Fixtures of the group elicitation tests (test_group.py, test_live.py)."""

from __future__ import annotations

import pytest

from elicitation.group import GNNView
from gnn.graph import GraphSchema
from gnn.train import GNNConfig, train_gnn
from tests.support.group_cases import toy_data


@pytest.fixture(scope="module")
def gnn_view() -> GNNView:
    """A small relational GNN trained on 90 members of :func:`toy_data` (60 train, 30 val)."""
    y = toy_data(90, seed=1)
    schema = GraphSchema((2, 3), (2, 2, 2, 3))
    model = train_gnn(
        schema,
        y[:, :2],
        y[:, 2:],
        range(60),
        range(60, 90),
        GNNConfig(dim=16, lr=1e-2, max_epochs=80, patience=80, seed=0, num_threads=1),
    )
    return GNNView(model, [0, 1], [2, 3, 4, 5])
