"""The relational GNN: layer parity with PyG, training, reproducibility, storage, CES quality."""

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


def test_relational_conv_equals_pyg_rgcnconv() -> None:
    schema, attrs, resp = _toy()
    graph = build_graph(schema, attrs, resp)
    torch.manual_seed(1)
    mine = RelationalConv(8, 5, 4)
    ref = RGCNConv(8, 5, 4, aggr="mean")
    with torch.no_grad():
        ref.weight.copy_(mine.weight)
        ref.root.copy_(mine.root)
        ref.bias.copy_(torch.randn(5))
        mine.bias.copy_(ref.bias)
    x1 = torch.randn(graph.n_nodes, 8, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    out_ref = ref(x1, graph.edge_index, graph.edge_type)
    out = mine(x2, Adjacency(graph))
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)
    (out_ref**2).sum().backward()
    (out**2).sum().backward()
    assert x1.grad is not None and x2.grad is not None
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-4, atol=1e-4)


FAST = GNNConfig(dim=16, lr=1e-2, max_epochs=80, patience=80, seed=3, num_threads=1)


def test_masked_pattern_equals_the_adjacency_of_the_sub_graph() -> None:
    """Re-weighting the full graph's pattern gives the sub-graph's mean aggregation."""
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
    x = torch.randn(full.n_nodes, 6, dtype=torch.float32)
    for r in range(4):
        torch.testing.assert_close(masked.mats[r] @ x, exact.mats[r] @ x)
        torch.testing.assert_close(masked.trans[r] @ x, exact.trans[r] @ x)


def test_decoder_logits_equal_the_explicit_dot_products() -> None:
    """``logits[p, o] = <z_v, z_c(q, o)> / tau`` for real options, ``-inf`` for padding."""
    schema, attrs, resp = _toy()
    torch.manual_seed(0)
    net = RelationalGNN(schema, dim=8)
    z_m, z_o = torch.randn(5, 8), torch.randn(schema.n_option_nodes, 8)
    q = torch.tensor([0, 3, 1, 3, 2])
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
