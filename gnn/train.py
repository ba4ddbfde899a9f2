"""Masked training, early stopping, inference, embeddings and storage of the GNN.

Training (docs/methods.md §3): the graph holds the training members. Every epoch the training
members are shuffled into three equal parts:

* a third keep all their answer edges (context only);
* a third lose a random half of their answer edges — the lost answers are targets;
* a third lose all their answer edges (cold start) — all their answers are targets.

Attribute (subgroup) edges are always kept. The loss is the mean cross-entropy of the
decoder on the target answers. Validation members are masked the same way once, with
a fixed seed, on a graph made of all training answers plus the validation members'
kept answers; training keeps the parameters with the lowest validation cross-entropy
and stops when it has not improved for ``patience`` epochs. AdamW, lr 2e-3, weight
decay 1e-4.

Inference builds the graph of the *context* (the training and validation members with
all their answers, stored with the model) plus the group's members with whatever they
have answered so far, and decodes every (member, question) pair.

Example::

    model = train_gnn(schema, attributes, responses, range(800), range(800, 1000))
    probs = model.predict(group_attributes, group_responses)    # [N, Q, O]
    z = model.embeddings(group_attributes, group_responses)     # [N, 64]
    same = TrainedGNN.from_bytes(model.to_bytes())
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from gnn.graph import (
    GNNError,
    GraphInputError,
    GraphSchema,
    GroupGraph,
    answer_triples,
    attribute_pairs,
    graph_from_pairs,
)
from gnn.model import Adjacency, AdjacencyPattern, RelationalGNN


@dataclass(frozen=True)
class GNNConfig:
    """Training settings (defaults follow docs/methods.md §3).

    Attributes:
        dim: embedding / hidden width.
        dropout: dropout after each relational layer.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        max_epochs: upper bound on epochs.
        patience: stop after this many epochs without a better validation cross-entropy.
        seed: seeds initialisation, dropout and masks (a run is reproducible).
        num_threads: ``torch.set_num_threads`` during training (``None``: leave as is).
        partial_mask: how the middle third of the members is masked: ``"half"`` (the group
            paper, docs/methods.md [3]: each loses half of its answers) or ``"uniform"``
            (each keeps a uniformly drawn share ``s ~ U(0, 1)`` of its answers, so that
            members with one or two answers, the usual state in early group rounds, are seen
            in training; with ``"half"`` a member with a single observed answer is out of
            the training distribution, see docs/group.md).
    """

    dim: int = 64
    dropout: float = 0.1
    lr: float = 2e-3
    weight_decay: float = 1e-4
    max_epochs: int = 500
    patience: int = 40
    seed: int = 0
    num_threads: int | None = None
    partial_mask: str = "half"

    def __post_init__(self) -> None:
        if self.partial_mask not in ("half", "uniform"):
            raise GraphInputError(
                f"partial_mask must be 'half' or 'uniform', got {self.partial_mask!r}"
            )


@dataclass
class TrainingHistory:
    """Per-epoch training loss and validation cross-entropy (nats per answer)."""

    train_loss: list[float] = field(default_factory=list)
    val_ce: list[float] = field(default_factory=list)
    best_epoch: int = -1
    best_val_ce: float = float("inf")
    seconds: float = 0.0


def _thirds_mask(
    members: Tensor,
    ans_member: Tensor,
    n_members: int,
    gen: torch.Generator,
    partial: str = "half",
) -> tuple[Tensor, Tensor]:
    """Split ``members`` in thirds and decide which answer edges are kept / are targets.

    Args:
        members: ``[M]`` member numbers to mask.
        ans_member: ``[E]`` member of each answer edge (only edges of ``members`` count).
        n_members: total number of members (for lookup tables).
        gen: random generator.
        partial: ``"half"`` or ``"uniform"`` (see :class:`GNNConfig`).

    Returns:
        ``keep [E]`` and ``target [E]`` boolean masks (edges of other members: kept).
    """
    group = torch.full((n_members,), -1, dtype=torch.long)
    perm = members[torch.randperm(len(members), generator=gen)]
    third = len(members) // 3
    group[perm[:third]] = 0  # keep all
    group[perm[third : 2 * third]] = 1  # lose half
    group[perm[2 * third :]] = 2  # lose all
    g = group[ans_member]
    # rank of each edge among its member's edges, in random order
    key = torch.rand(len(ans_member), generator=gen)
    order = torch.argsort(ans_member.double() * 2.0 + key)
    sorted_member = ans_member[order]
    counts = torch.bincount(ans_member, minlength=n_members)
    first = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(ans_member)
    rank[order] = torch.arange(len(ans_member)) - first[sorted_member]
    if partial == "half":
        n_lost = (counts + 1) // 2
    else:  # keep a uniform share of the answers (at least 0, at most all but one lost)
        share = torch.rand(n_members, generator=gen)
        n_lost = (counts - (share * (counts + 1)).floor().long()).clamp(min=1)
    lost_half = rank < n_lost[ans_member]
    target = (g == 2) | ((g == 1) & lost_half)
    return ~target, target


class TrainedGNN:
    """A trained :class:`~gnn.model.RelationalGNN` with its context members.

    Attributes:
        schema: node schema.
        config: training settings.
        module: the network (eval mode).
        context_attributes: ``[Nc, A]`` attributes of the context members.
        context_responses: ``[Nc, Q]`` answers of the context members (``-1`` missing).
        history: the training curve.
    """

    def __init__(
        self,
        schema: GraphSchema,
        config: GNNConfig,
        module: RelationalGNN,
        context_attributes: Tensor,
        context_responses: Tensor,
        history: TrainingHistory,
    ) -> None:
        self.schema = schema
        self.config = config
        self.module = module.eval()
        self.context_attributes = context_attributes.long()
        self.context_responses = context_responses.long()
        self.history = history

    # ----- inference ------------------------------------------------------
    def _graph(self, attributes: Tensor, responses: Tensor, with_context: bool) -> GroupGraph:
        attributes, responses = self.schema.check(attributes, responses)
        if with_context:
            attributes = torch.cat([self.context_attributes, attributes], 0)
            responses = torch.cat([self.context_responses, responses], 0)
        sm, sn = attribute_pairs(self.schema, attributes)
        am, aq, ao = answer_triples(responses)
        return graph_from_pairs(self.schema, attributes.shape[0], sm, sn, am, aq, ao)

    @torch.no_grad()
    def _encode(
        self, attributes: Tensor, responses: Tensor, with_context: bool
    ) -> tuple[Tensor, Tensor]:
        graph = self._graph(attributes, responses, with_context)
        z_m, z_o = self.module.encode(graph)
        n = torch.as_tensor(attributes).shape[0]
        return z_m[z_m.shape[0] - n :], z_o

    @torch.no_grad()
    def predict(
        self, attributes: Tensor, responses: Tensor, *, with_context: bool = True
    ) -> Tensor:
        """Answer distributions of the group's members on the current observed graph.

        Args:
            attributes: ``[N, A]`` attribute values (``-1`` unknown).
            responses: ``[N, Q]`` answers observed so far (``-1`` not observed).
            with_context: include the stored context members in the graph.

        Returns:
            ``[N, Q, O]`` float64 probabilities (zeros beyond ``O_q``). Observed cells
            are predicted as well (as if they were not); callers use unobserved ones.
        """
        z_m, z_o = self._encode(attributes, responses, with_context)
        return torch.softmax(self.module.all_logits(z_m, z_o), -1).double().nan_to_num(0.0)

    @torch.no_grad()
    def embeddings(
        self, attributes: Tensor, responses: Tensor, *, with_context: bool = True
    ) -> Tensor:
        """``[N, d]`` member embeddings ``z_v`` (output layer) on the current graph."""
        return self._encode(attributes, responses, with_context)[0].double()

    # ----- storage --------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Serialise schema, settings, parameters, context and history."""
        payload = {
            "format": "priorly.gnn/1",
            "schema": {
                "attribute_cardinalities": list(self.schema.attribute_cardinalities),
                "n_options": list(self.schema.n_options),
                "attribute_names": list(self.schema.attribute_names),
                "question_names": list(self.schema.question_names),
            },
            "config": asdict(self.config),
            "params": self.module.state_dict(),
            "context_attributes": self.context_attributes.to(torch.int16),
            "context_responses": self.context_responses.to(torch.int16),
            "history": asdict(self.history),
        }
        buf = io.BytesIO()
        torch.save(payload, buf)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> TrainedGNN:
        """Inverse of :meth:`to_bytes`; raises :class:`GNNError` on a foreign blob."""
        try:
            p: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=False)
        except Exception as exc:
            raise GNNError(f"cannot read a stored GNN: {exc}") from None
        if not isinstance(p, dict) or p.get("format") != "priorly.gnn/1":
            raise GNNError("not a stored priorly GNN (format tag missing)")
        schema = GraphSchema(**{k: tuple(v) for k, v in p["schema"].items()})
        config = GNNConfig(**p["config"])
        module = RelationalGNN(schema, config.dim, config.dropout)
        module.load_state_dict(p["params"])
        return cls(
            schema,
            config,
            module,
            p["context_attributes"].long(),
            p["context_responses"].long(),
            TrainingHistory(**p["history"]),
        )


def train_gnn(
    schema: GraphSchema,
    attributes: Tensor,
    responses: Tensor,
    train_members: Sequence[int] | Tensor,
    val_members: Sequence[int] | Tensor,
    config: GNNConfig | None = None,
    *,
    progress: Any = None,
) -> TrainedGNN:
    """Train the GNN with masked answers and early stopping.

    Args:
        schema: node schema.
        attributes: ``[N, A]`` attributes of all training and validation members.
        responses: ``[N, Q]`` answers (``-1`` missing).
        train_members: row indices of the training members.
        val_members: row indices of the validation members (non-empty, disjoint).
        config: settings (defaults: :class:`GNNConfig`).
        progress: optional callable ``progress(epoch, train_loss, val_ce)``.

    Returns:
        :class:`TrainedGNN` with the best-validation parameters; its context is the
        training and validation members with all their answers.
    """
    config = config or GNNConfig()
    attributes, responses = schema.check(attributes, responses)
    tr = torch.as_tensor(train_members, dtype=torch.long).reshape(-1)
    va = torch.as_tensor(val_members, dtype=torch.long).reshape(-1)
    n = attributes.shape[0]
    if len(tr) < 3 or len(va) < 3:
        raise GraphInputError(
            f"training needs >= 3 training and >= 3 validation members, got {len(tr)} and {len(va)}"
        )
    if bool(((tr < 0) | (tr >= n)).any()) or bool(((va < 0) | (va >= n)).any()):
        raise GraphInputError(f"member indices must lie in 0..{n - 1}")
    if len(set(tr.tolist()) & set(va.tolist())):
        raise GraphInputError("training and validation members overlap")

    old_threads = torch.get_num_threads()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    start = time.perf_counter()
    try:
        with torch.random.fork_rng():
            torch.manual_seed(config.seed)
            gen = torch.Generator().manual_seed(config.seed)
            module = RelationalGNN(schema, config.dim, config.dropout)
            history = _fit(schema, module, attributes, responses, tr, va, config, gen, progress)
    finally:
        torch.set_num_threads(old_threads)
    history.seconds = time.perf_counter() - start
    keep = torch.cat([tr, va])
    return TrainedGNN(schema, config, module, attributes[keep], responses[keep], history)


def _fit(
    schema: GraphSchema,
    module: RelationalGNN,
    attributes: Tensor,
    responses: Tensor,
    tr: Tensor,
    va: Tensor,
    config: GNNConfig,
    gen: torch.Generator,
    progress: Any,
) -> TrainingHistory:
    # renumber: training members 0..Nt-1, validation members after them
    order = torch.cat([tr, va])
    attributes, responses = attributes[order], responses[order]
    nt, n = len(tr), len(order)
    sm, sn = attribute_pairs(schema, attributes)
    am, aq, ao = answer_triples(responses)
    is_train_edge = am < nt
    tr_ids, va_ids = torch.arange(nt), torch.arange(nt, n)

    # fixed validation masks; validation graph = all training answers + kept val answers
    v_keep, v_target = _thirds_mask(va_ids, am, n, gen, config.partial_mask)
    v_keep = v_keep | is_train_edge
    v_target = v_target & ~is_train_edge
    val_graph = graph_from_pairs(schema, n, sm, sn, am[v_keep], aq[v_keep], ao[v_keep])
    val_adj = Adjacency(val_graph)
    vt = (am[v_target], aq[v_target], ao[v_target])
    if len(vt[0]) == 0:
        raise GraphInputError("the validation members have no answers to hold out")

    # training graph: training members only
    t_attr = sm < nt
    tsm, tsn = sm[t_attr], sn[t_attr]
    tam, taq, tao = am[is_train_edge], aq[is_train_edge], ao[is_train_edge]
    # every epoch's graph is a sub-graph of the full training graph: sort its edges once
    full_graph = graph_from_pairs(schema, nt, tsm, tsn, tam, taq, tao)
    pattern = AdjacencyPattern(full_graph)
    attr_keep = torch.ones(2 * len(tsm), dtype=torch.bool)

    opt = torch.optim.AdamW(module.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    hist = TrainingHistory()
    best_state: dict[str, Tensor] | None = None
    for epoch in range(config.max_epochs):
        module.train()
        keep, target = _thirds_mask(tr_ids, tam, nt, gen, config.partial_mask)
        # edge order of graph_from_pairs: attribute pairs both ways, then answers both ways
        adj = pattern.adjacency(torch.cat([attr_keep, keep, keep]))
        z_m, z_o = module.encode(full_graph, adj)
        lg = module.logits(z_m[tam[target]], z_o, taq[target])
        loss = torch.nn.functional.cross_entropy(lg, tao[target])
        opt.zero_grad()
        loss.backward()
        opt.step()

        module.eval()
        with torch.no_grad():
            z_m, z_o = module.encode(val_graph, val_adj)
            val_ce = float(
                torch.nn.functional.cross_entropy(module.logits(z_m[vt[0]], z_o, vt[1]), vt[2])
            )
        hist.train_loss.append(float(loss.detach()))
        hist.val_ce.append(val_ce)
        if progress is not None:
            progress(epoch, hist.train_loss[-1], val_ce)
        if val_ce < hist.best_val_ce:
            hist.best_val_ce, hist.best_epoch = val_ce, epoch
            best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        elif epoch - hist.best_epoch >= config.patience:
            break
    assert best_state is not None
    module.load_state_dict(best_state)
    module.eval()
    return hist
