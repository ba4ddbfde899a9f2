"""The relational GNN: the PyG layer against a hand enumeration, training, reproducibility,
storage, CES quality."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch_geometric.nn import RGCNConv

from elicitation.datasets import load_dataset
from gnn.graph import (
    GNNError,
    GraphInputError,
    GraphSchema,
    answer_triples,
    attribute_pairs,
    build_graph,
    graph_from_pairs,
)
from gnn.model import Adjacency, AdjacencyPattern, RelationalConv, RelationalGNN
from gnn.train import GNNConfig, TrainedGNN, train_gnn


def _toy(n: int = 60, seed: int = 0) -> tuple[GraphSchema, torch.Tensor, torch.Tensor]:
    """Members in two latent camps; attribute 0 reveals the camp, answers follow it."""
    g = torch.Generator().manual_seed(seed)
    camp = torch.randint(0, 2, (n,), generator=g)
    attrs = torch.stack([camp, torch.randint(0, 3, (n,), generator=g)], 1)
    flip = torch.rand(n, 4, generator=g) < 0.1
    resp = (camp.unsqueeze(1).expand(n, 4) ^ flip.long()).clone()
    resp[:, 3] = resp[:, 3] + (torch.rand(n, generator=g) < 0.5).long()  # 3 options
    resp[torch.rand(n, 4, generator=g) < 0.1] = -1
    return GraphSchema((2, 3), (2, 2, 2, 3)), attrs, resp


def _enumerated_conv(
    conv: RelationalConv, x: torch.Tensor, edges: list[tuple[int, int, int]]
) -> torch.Tensor:
    """``out_v = x_v W_0 + b + sum_r mean_{u: (u, v, r) in edges} x_u W_r``, node by node."""
    rows = []
    for v in range(x.shape[0]):
        out = x[v] @ conv.root + conv.bias
        for r in range(conv.num_relations):
            nbrs = [u for u, d, t in edges if d == v and t == r]
            if nbrs:
                out = out + sum(x[u] @ conv.weight[r] for u in nbrs) / len(nbrs)
        rows.append(out)
    return torch.stack(rows)


def test_relational_conv_equals_the_enumerated_mean_aggregation() -> None:
    """The PyG layer on the sparse per-relation adjacency computes, and differentiates,
    ``x_v W_0 + b + sum_r mean_{u in N_r(v)} x_u W_r`` (enumerated edge by edge on the
    3-member graph of tests/gnn/test_graph.py: 15 nodes, 20 edges, nodes with 0-3
    neighbours per relation), and equals PyG's edge-list RGCNConv with the same weights."""
    schema = GraphSchema((2, 3), (2, 3, 2))
    graph = build_graph(
        schema,
        torch.tensor([[0, 2], [1, -1], [1, 0]]),
        torch.tensor([[1, 2, -1], [-1] * 3, [0, 0, 1]]),
    )
    edges = [
        (int(s), int(d), int(t))
        for (s, d), t in zip(graph.edge_index.t().tolist(), graph.edge_type.tolist(), strict=True)
    ]
    torch.manual_seed(1)
    conv = RelationalConv(8, 5, 4)
    with torch.no_grad():
        conv.bias.copy_(torch.randn(5))
    assert isinstance(conv, RGCNConv)
    x1 = torch.randn(graph.n_nodes, 8, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    out = conv(x1, Adjacency(graph))
    want = _enumerated_conv(conv, x2, edges)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    # subgroup node "age = 1" has no edge: only the root term and the bias
    torch.testing.assert_close(
        out[graph.subgroup_start + 3], x1[graph.subgroup_start + 3] @ conv.root + conv.bias
    )
    (out**2).sum().backward()
    (want**2).sum().backward()
    assert x1.grad is not None and x2.grad is not None
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-5)
    ref = RGCNConv(8, 5, 4, aggr="mean")
    ref.load_state_dict(conv.state_dict())
    torch.testing.assert_close(ref(x1, graph.edge_index, graph.edge_type), out)
    # plain edge lists take PyG's unfused gather / weighted scatter path: same output
    adj = Adjacency(graph)
    plain = Adjacency.from_parts([e.as_tensor() for e in adj.edges], adj.weights)
    torch.testing.assert_close(conv(x1, plain), out)


FAST = GNNConfig(dim=16, lr=1e-2, max_epochs=80, patience=80, seed=3, num_threads=1)


def test_masked_pattern_equals_the_adjacency_of_the_sub_graph() -> None:
    """Re-weighting the full graph's pattern gives the sub-graph's row-normalised
    adjacency of each relation (dropped edges weigh 0) and the same layer output."""
    schema, attrs, resp = _toy()
    sm, sn = attribute_pairs(schema, attrs)
    am, aq, ao = answer_triples(resp)
    full = graph_from_pairs(schema, attrs.shape[0], sm, sn, am, aq, ao)
    keep = torch.rand(len(am), generator=torch.Generator().manual_seed(3)) < 0.6
    sub = graph_from_pairs(schema, attrs.shape[0], sm, sn, am[keep], aq[keep], ao[keep])
    masked = AdjacencyPattern(full).adjacency(
        torch.cat([torch.ones(2 * len(sm), dtype=torch.bool), keep, keep])
    )
    exact = Adjacency(sub)
    v = full.n_nodes
    for r in range(4):
        dense = [
            torch.sparse_coo_tensor(a.edges[r].as_tensor().flip(0), a.weights[r], (v, v)).to_dense()
            for a in (masked, exact)
        ]
        torch.testing.assert_close(dense[0], dense[1], rtol=0, atol=0)
    conv = RelationalConv(6, 6, 4)
    x = torch.randn(v, 6)
    torch.testing.assert_close(conv(x, masked), conv(x, exact))


def test_decoder_logits_equal_the_explicit_dot_products() -> None:
    """``logits[p, o] = <z_v, z_c(q, o)> / tau`` for real options, ``-inf`` for padding."""
    schema, attrs, resp = _toy()
    torch.manual_seed(0)
    net = RelationalGNN(schema, dim=8)
    z_m, z_o = torch.randn(5, 8), torch.randn(schema.n_option_nodes, 8)
    q = torch.tensor([0, 3, 1, 3, 2])
    with torch.no_grad():
        lg = net.logits(z_m, z_o, q)
    offsets = schema.option_offsets()
    for p in range(5):
        for o in range(schema.max_options):
            if o < schema.n_options[int(q[p])]:
                want = float(z_m[p] @ z_o[int(offsets[q[p]]) + o]) / float(
                    net.log_tau.detach().exp()
                )
                assert abs(float(lg[p, o]) - want) < 1e-5
            else:
                assert lg[p, o] == float("-inf")
    with torch.no_grad():
        torch.testing.assert_close(net.all_logits(z_m, z_o)[torch.arange(5), q], lg)


def test_training_learns_the_toy_structure_and_is_reproducible() -> None:
    schema, attrs, resp = _toy()
    a = train_gnn(schema, attrs, resp, range(40), range(40, 60), FAST)
    b = train_gnn(schema, attrs, resp, range(40), range(40, 60), FAST)
    new_attrs = torch.tensor([[0, 1], [1, 1]])
    blank = torch.full((2, 4), -1)
    pa, pb = a.predict(new_attrs, blank), b.predict(new_attrs, blank)
    assert torch.equal(pa, pb)  # same seed -> same predictions, bit for bit
    assert pa.shape == (2, 4, 3)
    torch.testing.assert_close(pa.sum(-1), torch.ones(2, 4, dtype=torch.float64))
    assert bool((pa[:, :3, 2] == 0).all())  # padding of 2-option questions
    # the camp attribute drives the answers: camp 0 -> option 0, camp 1 -> option 1
    assert pa[0, 0, 0] > 0.6 and pa[1, 0, 1] > 0.6
    assert a.history.best_val_ce < a.history.val_ce[0]
    c = train_gnn(
        schema, attrs, resp, range(40), range(40, 60), GNNConfig(**{**FAST.__dict__, "seed": 4})
    )
    assert not torch.equal(c.predict(new_attrs, blank), pa)


def test_save_load_round_trip() -> None:
    schema, attrs, resp = _toy()
    model = train_gnn(schema, attrs, resp, range(40), range(40, 60), FAST)
    blob = model.to_bytes()
    back = TrainedGNN.from_bytes(blob)
    q_attrs, q_resp = attrs[:5], resp[:5].clone()
    q_resp[:, 2:] = -1
    assert torch.equal(back.predict(q_attrs, q_resp), model.predict(q_attrs, q_resp))
    assert torch.equal(back.embeddings(q_attrs, q_resp), model.embeddings(q_attrs, q_resp))
    assert back.schema == schema and back.config == FAST
    assert back.history.best_epoch == model.history.best_epoch
    with pytest.raises(GNNError, match="cannot read a stored GNN"):
        TrainedGNN.from_bytes(b"not a model")


def test_bad_training_input_is_refused() -> None:
    schema, attrs, resp = _toy()
    with pytest.raises(GraphInputError, match="overlap"):
        train_gnn(schema, attrs, resp, range(40), range(35, 60), FAST)
    with pytest.raises(GraphInputError, match="member indices"):
        train_gnn(schema, attrs, resp, range(40), range(40, 61), FAST)


def _marginal_baselines(
    schema: GraphSchema, attrs: torch.Tensor, resp: torch.Tensor, q_attrs: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Attribute-only predictors from training frequencies (add-one smoothing).

    * ``subgroup_mean``: the mean over the member's attribute values ``a`` of
      ``p(answer | a)`` (the per-subgroup frequencies, averaged);
    * ``naive_bayes``: ``p(answer) * prod_a p(a | answer)``, normalised.

    Returns ``[N, Q, O]`` probabilities for members with attributes ``q_attrs``.
    """
    n_q, o = schema.n_questions, schema.max_options
    _, mask = schema.option_table()
    mean = torch.zeros(q_attrs.shape[0], n_q, o, dtype=torch.float64)
    log_nb = torch.zeros(q_attrs.shape[0], n_q, o, dtype=torch.float64)
    for q in range(n_q):
        ans = resp[:, q]
        prior = torch.bincount(ans[ans >= 0], minlength=o).double() + 1.0
        log_nb[:, q] = prior.log()
        for a, card in enumerate(schema.attribute_cardinalities):
            joint = torch.ones(card, o, dtype=torch.float64)  # add-one
            ok = (ans >= 0) & (attrs[:, a] >= 0)
            joint.index_put_(
                (attrs[ok, a], ans[ok]),
                torch.ones(int(ok.sum()), dtype=torch.float64),
                accumulate=True,
            )
            joint = joint * mask[q]
            p_ans_given_a = joint / joint.sum(1, keepdim=True)
            p_a_given_ans = joint / joint.sum(0, keepdim=True).clamp(min=1e-12)
            v = q_attrs[:, a].clamp(min=0)
            mean[:, q] += p_ans_given_a[v] / schema.n_attributes
            log_nb[:, q] += p_a_given_ans[v].clamp(min=1e-300).log()
    log_nb = log_nb.masked_fill(~mask.unsqueeze(0), float("-inf"))
    return {"subgroup_mean": mean, "naive_bayes": torch.softmax(log_nb, -1)}


def _ce(p: torch.Tensor, resp: torch.Tensor) -> float:
    m, q = (resp >= 0).nonzero(as_tuple=True)
    return float(-p[m, q, resp[m, q]].clamp(min=1e-12).log().mean())


@pytest.mark.slow
def test_gnn_beats_attribute_only_frequencies_on_ces(datasets_dir: Path) -> None:
    ds = load_dataset(datasets_dir / "ces")
    attrs = torch.as_tensor(ds.matrix(ds.demographics).astype("int64"))
    resp = torch.as_tensor(ds.matrix(ds.questions).astype("int64"))
    schema = GraphSchema(
        tuple(ds.item(k).n_options for k in ds.demographics),
        tuple(ds.item(k).n_options for k in ds.questions),
    )
    tr, va, te = (
        torch.as_tensor(ds.user_indices(s)) for s in ("train_users", "val_users", "test_users")
    )
    rows = torch.cat([tr, va])
    model = train_gnn(
        schema,
        attrs[rows],
        resp[rows],
        range(len(tr)),
        range(len(tr), len(rows)),
        GNNConfig(max_epochs=45, patience=45, seed=0, num_threads=1),
    )
    # held-out members (the test users, another region; not in the GNN's context)
    base = _marginal_baselines(schema, attrs[rows], resp[rows], attrs[te])
    blank = torch.full_like(resp[te], -1)
    ce = {name: _ce(p, resp[te]) for name, p in base.items()}
    ce["gnn"] = _ce(model.predict(attrs[te], blank), resp[te])
    # attribute-only information on both sides (cold start): the GNN must still be better
    assert ce["gnn"] < min(ce["subgroup_mean"], ce["naive_bayes"]) - 0.01, ce
    # with half of their answers observed, the GNN uses them: a much lower cross-entropy
    half = resp[te].clone()
    half[:, ::2] = -1
    hidden = torch.full_like(half, -1)
    hidden[:, ::2] = resp[te][:, ::2]
    gnn_half = model.predict(attrs[te], half)
    assert _ce(gnn_half, hidden) < min(_ce(p, hidden) for p in base.values()) - 0.02
