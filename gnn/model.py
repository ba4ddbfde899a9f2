"""The two-layer relational GNN and its dot-product decoder (docs/methods.md §3).

Encoder (``d = 64`` by default) over the homogeneous view of a
:class:`~gnn.graph.GroupGraph` (``V`` nodes numbered ``[members | subgroups | options]``):

* input features: learnable ``d``-dim embeddings for subgroup and option nodes; members
  have zero features (so any new member can be embedded without retraining);
* a per-type linear layer + ReLU: ``h0_v = ReLU(W_type(v) x_v + b_type(v))``;
* two relational GCN layers (:class:`RelationalConv`: PyG's
  :class:`~torch_geometric.nn.RGCNConv` on the row-normalised sparse adjacency of each
  relation) with ReLU and dropout 0.1, each
  ``h^{l+1}_v = W_0 h^l_v + b + sum_r mean_{u in N_r(v)} W_r h^l_u`` (4 relations; the
  function of ``RGCNConv(aggr="mean")`` on the edge list);
* a per-type output linear layer: ``z_v = U_type(v) h2_v``.

Decoder: ``p(option c | member v, question q) = softmax_{c in options(q)} <z_v, z_c> / tau``
with a learned temperature ``tau = exp(log_tau)``.

Example::

    graph = build_graph(schema, attributes, responses)       # [N, A], [N, Q]
    net = RelationalGNN(schema, dim=64)
    z_member, z_option = net.encode(graph)                   # [N, 64], [C, 64]
    probs = net.all_logits(z_member, z_option).softmax(-1)   # [N, Q, O]
"""

from __future__ import annotations

import warnings
from typing import cast

import torch
from torch import Tensor, nn
from torch_geometric import EdgeIndex
from torch_geometric.nn import RGCNConv

from gnn.graph import N_RELATIONS, GraphSchema, GroupGraph

# EdgeIndex.matmul(transpose=True) multiplies with a CSC view built without invariant
# checks (the pattern is valid by construction); torch warns once about both.
warnings.filterwarnings("ignore", "Sparse CSC tensor support is in beta", UserWarning)
warnings.filterwarnings("ignore", "Sparse invariant checks are implicitly disabled", UserWarning)


def _relation_edges(src: Tensor, dst: Tensor, n: int) -> tuple[EdgeIndex, Tensor]:
    """``[2, E_r]`` edges ``src -> dst`` of one relation as an :class:`EdgeIndex` sorted by
    destination, with its compressed (CSC) pointers, and the sorted destinations. (The
    transposed form, for a backward pass, is built by the first one and cached.)"""
    order = torch.argsort(dst * n + src)
    edges = EdgeIndex(torch.stack([src[order], dst[order]]), sparse_size=(n, n), sort_order="col")
    edges.get_csc()
    return edges, dst[order]


def _mean_weights(dst: Tensor, keep: Tensor, n: int) -> Tensor:
    """``keep_e / sum_{e' into dst_e} keep_e'`` for each edge ``e`` (float32)."""
    k = keep.float()
    deg = torch.zeros(n).index_add_(0, dst, k).clamp(min=1.0)
    return k / deg[dst]


class Adjacency:
    """Row-normalised adjacency of each relation, for mean aggregation.

    ``edges[r]`` is the ``[2, E_r]`` :class:`~torch_geometric.EdgeIndex` (source row,
    destination row) of the edges of relation ``r``, sorted by destination, and
    ``weights[r] [E_r]`` their weights ``1 / (#edges of type r into the destination)``, so
    ``A_r[v, u] = weight`` of edge ``u -> v`` and
    ``(A_r X)[v] = edges[r].matmul(X, weights[r], transpose=True)[v] = mean_{u in N_r(v)} X[u]``
    (zero rows for nodes without such edges): one sparse-dense matrix product.
    A member has at most one edge to a given subgroup or option node, so there are no
    duplicate edges.

    Args:
        graph: the graph.

    Example::

        adj = Adjacency(build_graph(schema, attributes, responses))
        len(adj.edges), adj.weights[0].shape  # 4, [E_0]
    """

    def __init__(self, graph: GroupGraph) -> None:
        v = graph.n_nodes
        src, dst = graph.edge_index
        self.edges: list[EdgeIndex] = []
        self.weights: list[Tensor] = []
        for r in range(N_RELATIONS):
            sel = graph.edge_type == r
            edges, d = _relation_edges(src[sel], dst[sel], v)
            self.edges.append(edges)
            self.weights.append(_mean_weights(d, torch.ones_like(d, dtype=torch.bool), v))

    @classmethod
    def from_parts(cls, edges: list[EdgeIndex], weights: list[Tensor]) -> Adjacency:
        """An adjacency from built edges and weights (see :class:`AdjacencyPattern`)."""
        adj = cls.__new__(cls)
        adj.edges, adj.weights = edges, weights
        return adj


class AdjacencyPattern:
    """The sparsity pattern of a fixed graph, for cheap masked sub-graphs.

    Masked training keeps a different subset of the answer edges every epoch. The edges
    are sorted and their compressed forms built once here; :meth:`adjacency` only
    recomputes the mean weights
    ``A_r[v, u] = keep_e / sum_{e' of type r into v} keep_e'`` of the kept edges
    (dropped edges are explicit zeros, so the products equal those of the sub-graph).

    Args:
        graph: the graph with every edge that any mask may keep.

    Example::

        pattern = AdjacencyPattern(full_graph)
        adj = pattern.adjacency(keep)  # keep [E] bool -> Adjacency of the kept edges
    """

    def __init__(self, graph: GroupGraph) -> None:
        self.n = v = graph.n_nodes
        src, dst = graph.edge_index
        self.edges: list[EdgeIndex] = []
        self.parts: list[tuple[Tensor, Tensor]] = []
        for r in range(N_RELATIONS):
            ids = (graph.edge_type == r).nonzero().reshape(-1)
            ids = ids[torch.argsort(dst[ids] * v + src[ids])]
            edges, d = _relation_edges(src[ids], dst[ids], v)
            self.edges.append(edges)
            self.parts.append((ids, d))

    def adjacency(self, keep: Tensor) -> Adjacency:
        """:class:`Adjacency` of the sub-graph of the edges with ``keep [E]`` true."""
        return Adjacency.from_parts(
            self.edges, [_mean_weights(d, keep[ids], self.n) for ids, d in self.parts]
        )


class RelationalConv(RGCNConv):
    """One relational GCN layer with mean aggregation per relation (R-GCN).

    PyG's :class:`~torch_geometric.nn.RGCNConv` (parameters ``weight [R, in, out]`` =
    ``W_r``, ``root [in, out]`` = ``W_0``, ``bias [out]``; Glorot initialisation) run on
    the row-normalised sparse adjacency ``A_r`` of each relation (:class:`Adjacency`):

    ``out_v = x_v W_0 + b + sum_r (A_r X W_r)_v = x_v W_0 + b + sum_r mean_{u in N_r(v)} x_u W_r``

    Each product is PyG's fused message passing (``propagate`` ->
    :meth:`message_and_aggregate`) on the relation's :class:`~torch_geometric.EdgeIndex`
    with the edge weights; the backward pass multiplies with ``A_r^T``, whose compressed
    form the ``EdgeIndex`` caches. The same function as ``RGCNConv(in, out, R,
    aggr="mean")(x, edge_index, edge_type)`` with the same parameters, without its
    per-relation gather / scatter of edge messages.

    Args:
        in_dim: input width.
        out_dim: output width.
        n_relations: number of relation types ``R``.

    Example::

        conv = RelationalConv(64, 64, 4)
        out = conv(x, Adjacency(graph))  # x [V, 64] -> [V, 64]
    """

    SUPPORTS_FUSED_EDGE_INDEX = True

    def __init__(self, in_dim: int, out_dim: int, n_relations: int) -> None:
        # the mean is in the adjacency's weights, so the aggregation is their sum
        super().__init__(in_dim, out_dim, n_relations, aggr="add")

    def forward(self, x: Tensor, adjacency: Adjacency) -> Tensor:  # type: ignore[override]
        """``x [V, in]`` -> ``[V, out]``."""
        # propagate_type: (x: Tensor, edge_weight: Tensor)
        out = x @ self.root + self.bias
        for r, (edges, w) in enumerate(zip(adjacency.edges, adjacency.weights, strict=True)):
            out = out + self.propagate(edges, x=x @ self.weight[r], edge_weight=w)
        return out

    def message(self, x_j: Tensor, edge_weight: Tensor) -> Tensor:  # type: ignore[override]
        """``w_e x_u`` for each edge ``e = u -> v`` (the unfused path)."""
        return edge_weight.view(-1, 1) * x_j

    def message_and_aggregate(  # type: ignore[override]
        self, edge_index: EdgeIndex, x: Tensor, edge_weight: Tensor
    ) -> Tensor:
        """``(A X)[v] = sum_{e = u -> v} w_e x_u`` for every node ``v``: ``[V, d]`` -> ``[V, d]``.

        ``edge_index`` is sorted by destination (the order PyG's fused path requires),
        so the product is taken with its transpose, as in
        :class:`~torch_geometric.nn.GraphConv`.
        """
        return edge_index.matmul(x, input_value=edge_weight, reduce="sum", transpose=True)


class RelationalGNN(nn.Module):
    """Encoder + decoder over a :class:`~gnn.graph.GraphSchema`.

    Args:
        schema: the subgroup and option nodes (their embeddings are parameters).
        dim: embedding and hidden width ``d``.
        dropout: dropout after each relational layer.
    """

    opt_index: Tensor
    opt_mask: Tensor

    def __init__(self, schema: GraphSchema, dim: int = 64, dropout: float = 0.1) -> None:
        super().__init__()
        self.schema = schema
        self.dim = int(dim)
        self.dropout = float(dropout)
        self.subgroup_emb = nn.Parameter(torch.randn(schema.n_subgroups, dim) * 0.1)
        self.option_emb = nn.Parameter(torch.randn(schema.n_option_nodes, dim) * 0.1)
        self.in_lin = nn.ModuleList([nn.Linear(dim, dim) for _ in range(3)])
        self.conv1 = RelationalConv(dim, dim, N_RELATIONS)
        self.conv2 = RelationalConv(dim, dim, N_RELATIONS)
        self.out_lin = nn.ModuleList([nn.Linear(dim, dim) for _ in range(3)])
        self.log_tau = nn.Parameter(torch.zeros(()))
        idx, mask = schema.option_table()
        self.register_buffer("opt_index", idx, persistent=False)
        self.register_buffer("opt_mask", mask, persistent=False)

    def _per_type(self, layers: nn.ModuleList, parts: list[Tensor]) -> Tensor:
        return torch.cat([layers[t](p) for t, p in enumerate(parts)], 0)

    def encode(
        self, graph: GroupGraph, adjacency: Adjacency | None = None
    ) -> tuple[Tensor, Tensor]:
        """Node representations after the output layer.

        Args:
            graph: the graph.
            adjacency: ``Adjacency(graph)`` when already computed (a fixed graph).

        Returns:
            ``z_member [N, d]`` and ``z_option [C, d]`` (``C`` = number of option nodes).
        """
        n, s = graph.n_members, self.schema.n_subgroups
        member_lin = cast(nn.Linear, self.in_lin[0])
        member_x = member_lin.bias.expand(n, self.dim)  # W * 0 + b: zero features
        h = torch.cat(
            [member_x, self.in_lin[1](self.subgroup_emb), self.in_lin[2](self.option_emb)], 0
        ).relu()
        adj = adjacency if adjacency is not None else Adjacency(graph)
        h = self.conv1(h, adj).relu()
        h = nn.functional.dropout(h, self.dropout, self.training)
        h = self.conv2(h, adj).relu()
        h = nn.functional.dropout(h, self.dropout, self.training)
        z = self._per_type(self.out_lin, [h[:n], h[n : n + s], h[n + s :]])
        return z[:n], z[n + s :]

    def logits(self, z_member: Tensor, z_option: Tensor, questions: Tensor) -> Tensor:
        """Decoder logits ``<z_v, z_c> / tau`` for each (member, question) pair.

        Args:
            z_member: ``[P, d]`` member representations, one per pair.
            z_option: ``[C, d]`` option representations.
            questions: ``[P]`` question index of each pair.

        Returns:
            ``[P, O]`` logits, ``-inf`` beyond the question's option count.
        """
        # all dot products [P, C] by one matrix product, then pick each question's
        # options: much cheaper (and cheaper to differentiate) than gathering a
        # [P, O, d] block of option vectors per pair and a batched product
        lg = (z_member @ z_option.T).gather(1, self.opt_index[questions]) / self.log_tau.exp()
        return lg.masked_fill(~self.opt_mask[questions], float("-inf"))

    def all_logits(self, z_member: Tensor, z_option: Tensor) -> Tensor:
        """``[N, Q, O]`` logits of every member for every question (``-inf`` padding)."""
        lg = (z_member @ z_option.T)[:, self.opt_index] / self.log_tau.exp()  # [N, Q, O]
        return lg.masked_fill(~self.opt_mask.unsqueeze(0), float("-inf"))
