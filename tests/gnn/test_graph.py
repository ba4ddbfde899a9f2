"""Graph construction: exact node and edge counts on a tiny hand-made group."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data, HeteroData

from gnn.graph import (
    EDGE_TYPES,
    NODE_TYPES,
    REL_MEMBER_TO_OPTION,
    REL_MEMBER_TO_SUBGROUP,
    REL_OPTION_TO_MEMBER,
    REL_SUBGROUP_TO_MEMBER,
    GraphInputError,
    GraphSchema,
    build_graph,
)

# 3 members, attributes (gender: 2 values, age: 3 values), questions with 2, 3, 2 options
SCHEMA = GraphSchema((2, 3), (2, 3, 2), ("gender", "age"), ("q1", "q2", "q3"))
ATTRS = torch.tensor([[0, 2], [1, -1], [1, 0]])  # member 1's age unknown
RESP = torch.tensor([[1, 2, -1], [-1, -1, -1], [0, 0, 1]])  # member 1 answered nothing


def test_counts_nodes_and_edges_exactly() -> None:
    g = build_graph(SCHEMA, ATTRS, RESP)
    assert g.n_members == 3
    assert SCHEMA.n_subgroups == 5 and SCHEMA.n_option_nodes == 7
    assert g.n_nodes == 3 + 5 + 7
    assert torch.bincount(g.node_type(), minlength=3).tolist() == [3, 5, 7]
    # 5 known attribute values, 5 observed answers; each edge has its reverse
    assert g.count_edges() == {
        REL_SUBGROUP_TO_MEMBER: 5,
        REL_MEMBER_TO_SUBGROUP: 5,
        REL_OPTION_TO_MEMBER: 5,
        REL_MEMBER_TO_OPTION: 5,
    }
    assert g.edge_index.shape == (2, 20)


def test_edges_connect_the_right_nodes() -> None:
    g = build_graph(SCHEMA, ATTRS, RESP)
    sub0, opt0 = g.subgroup_start, g.option_start  # 3 and 8
    edges = {
        (int(s), int(d), int(t))
        for (s, d), t in zip(g.edge_index.t().tolist(), g.edge_type.tolist(), strict=True)
    }
    # member 0: gender=0 (subgroup 0), age=2 (subgroup 2 + 2 = 4); q1=1 (option 1), q2=2 (2+2)
    expected_member0 = {
        (sub0 + 0, 0, REL_SUBGROUP_TO_MEMBER),
        (sub0 + 4, 0, REL_SUBGROUP_TO_MEMBER),
        (opt0 + 1, 0, REL_OPTION_TO_MEMBER),
        (opt0 + 4, 0, REL_OPTION_TO_MEMBER),
    }
    assert expected_member0 <= edges
    for s, d, t in expected_member0:
        assert (d, s, t + 1) in edges  # the reverse edge
    # member 2: q3 = 1 -> option node 2 + 3 + 1 = 6
    assert (opt0 + 6, 2, REL_OPTION_TO_MEMBER) in edges
    # member 1 has only its gender edge (and reverse)
    assert {e for e in edges if 1 in (e[0], e[1])} == {
        (sub0 + 1, 1, REL_SUBGROUP_TO_MEMBER),
        (1, sub0 + 1, REL_MEMBER_TO_SUBGROUP),
    }


def test_option_table_pads_short_questions() -> None:
    idx, mask = SCHEMA.option_table()
    assert idx.tolist() == [[0, 1, 0], [2, 3, 4], [5, 6, 0]]
    assert mask.tolist() == [[True, True, False], [True, True, True], [True, True, False]]


@pytest.mark.parametrize(
    ("attrs", "resp", "message"),
    [
        (ATTRS, torch.tensor([[1, 3, -1], [-1, -1, -1], [0, 0, 1]]), "row 0, 'q2': value 3"),
        (torch.tensor([[0, 2], [2, -1], [1, 0]]), RESP, "row 1, 'gender': value 2"),
        (ATTRS[:, :1], RESP, "attributes must have shape [N, 2]"),
        (ATTRS[:2], RESP, "attributes have 2 rows but responses 3"),
    ],
)
def test_bad_input_names_the_cell(attrs: torch.Tensor, resp: torch.Tensor, message: str) -> None:
    with pytest.raises(GraphInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build_graph(SCHEMA, attrs, resp)


def test_schema_rejects_single_option_questions() -> None:
    with pytest.raises(GraphInputError, match=">= 2 options"):
        GraphSchema((2,), (2, 1))


def test_the_graph_is_pyg_data_with_a_heterogeneous_view() -> None:
    """``data`` is the homogeneous PyG view; ``to_hetero()`` splits it into the three node
    types and four edge types, renumbering each node type from 0."""
    g = build_graph(SCHEMA, ATTRS, RESP)
    assert isinstance(g.data, Data)
    assert g.data.num_nodes == 15 and g.data.edge_index.shape == (2, 20)
    assert g.data.node_type.tolist() == [0] * 3 + [1] * 5 + [2] * 7
    h = g.to_hetero()
    assert isinstance(h, HeteroData)
    assert [h[t].num_nodes for t in NODE_TYPES] == [3, 5, 7]
    assert [h[t].edge_index.shape[1] for t in EDGE_TYPES] == [5, 5, 5, 5]
    answered = {tuple(e) for e in h["member", "answered", "option"].edge_index.t().tolist()}
    # member 0: q1 = 1 (option 1), q2 = 2 (option 4); member 2: q1 = 0, q2 = 0, q3 = 1
    assert answered == {(0, 1), (0, 4), (2, 0), (2, 2), (2, 6)}
    belongs = {tuple(e) for e in h["member", "belongs_to", "subgroup"].edge_index.t().tolist()}
    # gender = 0 / 1 -> subgroups 0 / 1; age = 2 / 0 -> subgroups 4 / 2; member 1's age unknown
    assert belongs == {(0, 0), (0, 4), (1, 1), (2, 1), (2, 2)}
    # each relation's edges are the reverse of its partner's (0 <-> 1, 2 <-> 3)
    for fwd, rev in zip(EDGE_TYPES[::2], EDGE_TYPES[1::2], strict=True):
        assert (fwd[0], fwd[2]) == (rev[2], rev[0])
        assert torch.equal(h[fwd].edge_index.flip(0), h[rev].edge_index)
