"""The heterogeneous member / subgroup / question-option graph (docs/methods.md §3).

Three node types:

* **member** — one node per respondent of the group (and per context respondent);
  members carry no features: they are represented only through message passing, so a
  new member needs no retraining.
* **subgroup** — one node per (attribute, value), e.g. ``educ = C``;
* **option** — one node per (question, option), e.g. ``330a = B``.

Four relation types (edges are directed, each with its reverse):

====  =========================  ==========================================
id    relation                   one edge per
====  =========================  ==========================================
0     subgroup -> member         observed attribute value of a member
1     member -> subgroup         (reverse of 0)
2     option -> member           observed answer of a member (the chosen option)
3     member -> option           (reverse of 2)
====  =========================  ==========================================

The graph is PyG data: :attr:`GroupGraph.data` is the *homogeneous view* (a
:class:`torch_geometric.data.Data` with ``edge_index [2, E]``, ``edge_type [E]``,
``node_type [V]``; nodes numbered ``[members | subgroups | options]``), the form the
relational layers of :mod:`gnn.model` consume; :meth:`GroupGraph.to_hetero` gives the same
graph as a :class:`torch_geometric.data.HeteroData` with the node and edge types above.
Missing values (``-1``) produce no edge.

Example::

    schema = GraphSchema((2, 3), (2, 3, 2))              # 2 attributes, 3 questions
    g = build_graph(schema, torch.tensor([[0, 2]]), torch.tensor([[1, -1, 0]]))
    g.data                 # Data(edge_index=[2, 8], edge_type=[8], node_type=[13], num_nodes=13)
    g.to_hetero()["member", "answered", "option"].edge_index  # [[0, 0], [1, 5]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

REL_SUBGROUP_TO_MEMBER = 0
REL_MEMBER_TO_SUBGROUP = 1
REL_OPTION_TO_MEMBER = 2
REL_MEMBER_TO_OPTION = 3
N_RELATIONS = 4

NODE_MEMBER = 0
NODE_SUBGROUP = 1
NODE_OPTION = 2

#: node type names of :meth:`GroupGraph.to_hetero`, indexed by node type id
NODE_TYPES = ("member", "subgroup", "option")
#: ``(source, relation, destination)`` of :meth:`GroupGraph.to_hetero`, indexed by relation id
EDGE_TYPES = (
    ("subgroup", "includes", "member"),
    ("member", "belongs_to", "subgroup"),
    ("option", "chosen_by", "member"),
    ("member", "answered", "option"),
)


class GNNError(Exception):
    """Base error of the ``gnn`` package."""


class GraphInputError(GNNError, ValueError):
    """A response or attribute matrix that does not fit the graph schema."""


@dataclass(frozen=True)
class GraphSchema:
    """What the subgroup and option nodes are: fixed by the training data.

    Attributes:
        attribute_cardinalities: number of values of each attribute column (``A`` entries).
        n_options: ``O_q`` of each question (``Q`` entries), each >= 2.
        attribute_names: optional names of the attribute columns (for messages).
        question_names: optional names of the questions (for messages).
    """

    attribute_cardinalities: tuple[int, ...]
    n_options: tuple[int, ...]
    attribute_names: tuple[str, ...] = ()
    question_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        cards = tuple(int(c) for c in self.attribute_cardinalities)
        opts = tuple(int(o) for o in self.n_options)
        object.__setattr__(self, "attribute_cardinalities", cards)
        object.__setattr__(self, "n_options", opts)
        object.__setattr__(self, "attribute_names", tuple(str(a) for a in self.attribute_names))
        object.__setattr__(self, "question_names", tuple(str(q) for q in self.question_names))
        if any(c < 1 for c in cards):
            raise GraphInputError(f"attribute cardinalities must be >= 1, got {list(cards)}")
        if not opts or any(o < 2 for o in opts):
            raise GraphInputError(f"every question needs >= 2 options, got {list(opts)}")
        if self.attribute_names and len(self.attribute_names) != len(cards):
            raise GraphInputError("attribute_names and attribute_cardinalities differ in length")
        if self.question_names and len(self.question_names) != len(opts):
            raise GraphInputError("question_names and n_options differ in length")

    @property
    def n_attributes(self) -> int:
        return len(self.attribute_cardinalities)

    @property
    def n_questions(self) -> int:
        return len(self.n_options)

    @property
    def max_options(self) -> int:
        return max(self.n_options)

    @property
    def n_subgroups(self) -> int:
        return sum(self.attribute_cardinalities)

    @property
    def n_option_nodes(self) -> int:
        return sum(self.n_options)

    def subgroup_offsets(self) -> Tensor:
        """``[A]``: index of the first subgroup node of each attribute (subgroup numbering)."""
        c = torch.tensor((0,) + self.attribute_cardinalities[:-1], dtype=torch.long)
        return torch.cumsum(c, 0)

    def option_offsets(self) -> Tensor:
        """``[Q]``: index of the first option node of each question (option numbering)."""
        c = torch.tensor((0,) + self.n_options[:-1], dtype=torch.long)
        return torch.cumsum(c, 0)

    def option_table(self) -> tuple[Tensor, Tensor]:
        """Option node of each (question, option) slot, padded.

        Returns:
            ``index [Q, O]`` (option-node number, 0 in padded slots) and
            ``mask [Q, O]`` (true where ``o < O_q``).
        """
        o = torch.arange(self.max_options)
        mask = o.unsqueeze(0) < torch.tensor(self.n_options).unsqueeze(1)
        index = (self.option_offsets().unsqueeze(1) + o.unsqueeze(0)) * mask
        return index, mask

    def _name(self, names: tuple[str, ...], j: int, kind: str) -> str:
        return repr(names[j]) if names else f"{kind} {j}"

    def check(self, attributes: Tensor, responses: Tensor) -> tuple[Tensor, Tensor]:
        """Validate ``attributes [N, A]`` and ``responses [N, Q]`` (``-1`` = missing).

        Returns both as int64; raises :class:`GraphInputError` naming the bad cell.
        """
        attributes = torch.as_tensor(attributes).long()
        responses = torch.as_tensor(responses).long()
        if attributes.dim() != 2 or attributes.shape[1] != self.n_attributes:
            raise GraphInputError(
                f"attributes must have shape [N, {self.n_attributes}], got {list(attributes.shape)}"
            )
        if responses.dim() != 2 or responses.shape[1] != self.n_questions:
            raise GraphInputError(
                f"responses must have shape [N, {self.n_questions}], got {list(responses.shape)}"
            )
        if attributes.shape[0] != responses.shape[0]:
            raise GraphInputError(
                f"attributes have {attributes.shape[0]} rows but responses {responses.shape[0]}"
            )
        for mat, limits, names, kind in (
            (attributes, self.attribute_cardinalities, self.attribute_names, "attribute"),
            (responses, self.n_options, self.question_names, "question"),
        ):
            if mat.shape[1] == 0:
                continue
            lim = torch.tensor(limits).unsqueeze(0)
            bad = (mat < -1) | (mat >= lim)
            if bool(bad.any()):
                r, c = (int(v) for v in bad.nonzero()[0])
                raise GraphInputError(
                    f"row {r}, {self._name(names, c, kind)}: value {int(mat[r, c])} is outside "
                    f"0..{limits[c] - 1} (or -1 for missing)"
                )
        return attributes, responses


@dataclass(frozen=True)
class GroupGraph:
    """A built graph: the node schema and the PyG homogeneous view.

    Attributes:
        schema: the node schema.
        n_members: number of member nodes (numbered ``0 .. n_members - 1``).
        data: :class:`torch_geometric.data.Data` with ``edge_index [2, E]`` (source and
            destination node numbers), ``edge_type [E]`` (relation ids ``0..3``, see the
            module docstring), ``node_type [V]`` (0 member, 1 subgroup, 2 option) and
            ``num_nodes = V``.
    """

    schema: GraphSchema
    n_members: int
    data: Data

    @property
    def edge_index(self) -> Tensor:
        """``[2, E]`` source and destination node numbers."""
        return self.data.edge_index

    @property
    def edge_type(self) -> Tensor:
        """``[E]`` relation id of each edge."""
        return self.data.edge_type

    @property
    def n_nodes(self) -> int:
        return self.n_members + self.schema.n_subgroups + self.schema.n_option_nodes

    @property
    def subgroup_start(self) -> int:
        return self.n_members

    @property
    def option_start(self) -> int:
        return self.n_members + self.schema.n_subgroups

    def node_type(self) -> Tensor:
        """``[n_nodes]``: 0 member, 1 subgroup, 2 option."""
        return self.data.node_type

    def count_edges(self) -> dict[int, int]:
        """Number of edges of each relation id."""
        counts = torch.bincount(self.edge_type, minlength=N_RELATIONS)
        return {r: int(counts[r]) for r in range(N_RELATIONS)}

    def to_hetero(self) -> HeteroData:
        """The same graph as :class:`~torch_geometric.data.HeteroData`.

        Node types :data:`NODE_TYPES` (each numbered from 0 in the order of the
        homogeneous view), edge types :data:`EDGE_TYPES`; e.g.
        ``h["member", "answered", "option"].edge_index [2, M]`` holds each observed
        answer as (member number, option-node number).
        """
        return self.data.to_heterogeneous(
            node_type_names=list(NODE_TYPES), edge_type_names=list(EDGE_TYPES)
        )


def _homogeneous(
    schema: GraphSchema, n_members: int, edge_index: Tensor, edge_type: Tensor
) -> Data:
    node_type = torch.repeat_interleave(
        torch.tensor([NODE_MEMBER, NODE_SUBGROUP, NODE_OPTION]),
        torch.tensor([n_members, schema.n_subgroups, schema.n_option_nodes]),
    )
    return Data(
        edge_index=edge_index, edge_type=edge_type, node_type=node_type, num_nodes=len(node_type)
    )


def attribute_pairs(schema: GraphSchema, attributes: Tensor) -> tuple[Tensor, Tensor]:
    """Observed (member, subgroup-node number) pairs of ``attributes [N, A]``."""
    member, col = (attributes >= 0).nonzero(as_tuple=True)
    sub = schema.subgroup_offsets()[col] + attributes[member, col]
    return member, sub


def answer_triples(responses: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Observed (member, question, option) triples of ``responses [N, Q]``, row-major."""
    member, question = (responses >= 0).nonzero(as_tuple=True)
    return member, question, responses[member, question]


def graph_from_pairs(
    schema: GraphSchema,
    n_members: int,
    sub_member: Tensor,
    sub_node: Tensor,
    ans_member: Tensor,
    ans_question: Tensor,
    ans_option: Tensor,
) -> GroupGraph:
    """Build the graph from observed attribute pairs and answer triples.

    Args:
        schema: node schema.
        n_members: number of member nodes.
        sub_member, sub_node: ``[P]`` member and subgroup-node number of each attribute value.
        ans_member, ans_question, ans_option: ``[M]`` observed answers.

    Returns:
        The graph with ``2 P + 2 M`` edges (each observation and its reverse).
    """
    sub_h = n_members + sub_node
    opt_h = n_members + schema.n_subgroups + schema.option_offsets()[ans_question] + ans_option
    src = torch.cat([sub_h, sub_member, opt_h, ans_member])
    dst = torch.cat([sub_member, sub_h, ans_member, opt_h])
    etype = torch.cat(
        [
            torch.full_like(sub_member, REL_SUBGROUP_TO_MEMBER),
            torch.full_like(sub_member, REL_MEMBER_TO_SUBGROUP),
            torch.full_like(ans_member, REL_OPTION_TO_MEMBER),
            torch.full_like(ans_member, REL_MEMBER_TO_OPTION),
        ]
    )
    n = int(n_members)
    return GroupGraph(schema, n, _homogeneous(schema, n, torch.stack([src, dst]), etype))


def build_graph(schema: GraphSchema, attributes: Tensor, responses: Tensor) -> GroupGraph:
    """Build the graph of ``N`` members from their attributes and observed answers.

    Args:
        schema: node schema (attribute cardinalities, option counts).
        attributes: ``[N, A]`` value index of each attribute, ``-1`` = unknown.
        responses: ``[N, Q]`` chosen option of each question, ``-1`` = not observed.

    Returns:
        :class:`GroupGraph` with ``2 * (#known attributes + #observed answers)`` edges.

    Raises:
        GraphInputError: shapes or values that do not fit ``schema``.
    """
    attributes, responses = schema.check(attributes, responses)
    sm, sn = attribute_pairs(schema, attributes)
    am, aq, ao = answer_triples(responses)
    return graph_from_pairs(schema, attributes.shape[0], sm, sn, am, aq, ao)


def schema_from_data(
    attributes: Tensor,
    responses: Tensor,
    attribute_cardinalities: Sequence[int],
    n_options: Sequence[int],
    attribute_names: Sequence[str] = (),
    question_names: Sequence[str] = (),
) -> GraphSchema:
    """A schema, checked against the data it will be used with."""
    schema = GraphSchema(
        tuple(attribute_cardinalities),
        tuple(n_options),
        tuple(attribute_names),
        tuple(question_names),
    )
    schema.check(attributes, responses)
    return schema
