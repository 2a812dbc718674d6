"""Partitioning an aten FX graph into groups polytile compiles, and the reasons for what it leaves.

One pass in graph order, greedy as in a fusion scheduler:

- a matrix product or convolution starts a group; the elementwise operations (and views) that
  consume it join it as its epilogue (bias, activation, residual, scale, casts);
- a reduction (sum, mean, amax/amin over trailing dimensions, softmax, layer norm) joins the
  elementwise group that computes its input (the chain is inlined into the reduction: RMSnorm,
  residual + layer norm), and elementwise consumers of the reduction join it too;
- other elementwise operations form elementwise groups; with ``merge_elementwise``, an elementwise
  operation that joins one elementwise group also takes in the other elementwise groups it reads whose
  results nothing else reads (ResNet's downsampling batch norm inside the residual sum + ReLU that
  reads it: one kernel, the branch's result never written to memory).

A node joins a group only if that keeps the graph acyclic (none of its other inputs depends on the
group). Every node left to torch gets a reason (unsupported operation, dtype, dynamic size, device).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .importer import Unsupported, _packet, check_node, meta, node_kind

aten = torch.ops.aten

_COPIES = {"clone", "_to_copy"}

_TUPLE_FIRST = {aten.native_layer_norm, aten._native_batch_norm_legit_no_training}
"""Operations with several results of which a group computes only the first."""


@dataclass(eq=False)
class Group:
    """Nodes fused into one kernel: ``kind`` is "gemm", "conv", "reduce" or "elementwise"."""

    id: int
    kind: str
    nodes: list[fx.Node] = field(default_factory=list)
    rows: tuple[tuple[int, ...], int] | None = None  # reductions: the row shape and the reduced dimensions

    @property
    def anchor(self) -> fx.Node | None:
        return next((n for n in self.nodes if node_kind(n) in ("gemm", "conv", "reduce")), None)

    @property
    def ops(self) -> list[str]:
        """The aten operations of the group (views and tuple reads excluded), in graph order."""
        return [str(_packet(n.target)).removeprefix("aten.") for n in self.nodes
                if node_kind(n) not in ("view", "getitem")]


@dataclass
class Partition:
    groups: list[Group]
    left: dict[fx.Node, str]  # operations left to torch, with the reason


def partition(gm: fx.GraphModule, target_kind: str, exclude: dict[fx.Node, str] | None = None,
              merge_elementwise: bool = False) -> Partition:
    """Group the nodes of ``gm`` (see the module docstring) for a ``target_kind`` ("cpu"/"cuda") target;
    the nodes of ``exclude`` are left to torch with the reason given there."""
    nodes = list(gm.graph.nodes)
    order = {n: k for k, n in enumerate(nodes)}
    group_of: dict[fx.Node, Group] = {}
    groups: list[Group] = []
    left: dict[fx.Node, str] = {}

    def new_group(kind: str, n: fx.Node) -> Group:
        g = Group(len(groups), kind, [n])
        groups.append(g)
        group_of[n] = g
        return g

    def depends_on(x: fx.Node, g: Group) -> bool:
        """Whether ``x`` (outside ``g``) reads, directly or not, a node of ``g``."""
        first = min(order[m] for m in g.nodes)
        seen: set[fx.Node] = set()
        stack = [x]
        while stack:
            y = stack.pop()
            if y in seen or order[y] < first:
                continue
            seen.add(y)
            if group_of.get(y) is g:
                return True
            stack.extend(y.all_input_nodes)
        return False

    def can_join(n: fx.Node, g: Group) -> bool:
        return all(group_of.get(x) is g or not depends_on(x, g) for x in n.all_input_nodes)

    def join(n: fx.Node, g: Group) -> None:
        g.nodes.append(n)
        group_of[n] = g

    def merge_into(g: Group, n: fx.Node, producers: list[Group]) -> None:
        """Move into ``g`` (which ``n`` just joined) each other elementwise group that ``n`` reads and
        nothing outside it and ``n`` reads, where that keeps the graph acyclic."""
        for h in producers:
            if h is g or h.kind != "elementwise" or not h.nodes:
                continue
            members = set(h.nodes)
            if any(u not in members and u is not n for m in h.nodes for u in m.users):
                continue
            if any(x not in members and group_of.get(x) is not g and depends_on(x, g)
                   for m in h.nodes for x in m.all_input_nodes):
                continue
            for m in h.nodes:
                group_of[m] = g
            g.nodes = sorted(g.nodes + h.nodes, key=order.__getitem__)
            h.nodes = []

    def place(n: fx.Node, kind: str) -> None:
        """Put ``n`` in the group of a producer it may join, or in a new group."""
        producers = [group_of[x] for x in n.all_input_nodes if x in group_of]
        if kind in ("gemm", "conv"):
            new_group(kind, n)
        elif kind == "view":
            g = group_of.get(n.args[0]) if isinstance(n.args[0], fx.Node) else None
            if g is not None:
                join(n, g)
        elif kind == "reduce":
            shape = tuple(meta(n.args[0]).shape)
            nred = _nred(n)
            rows = (shape[:len(shape) - nred], nred)
            src = group_of.get(n.args[0]) if isinstance(n.args[0], fx.Node) else None
            if src is not None and src.kind in ("elementwise", "reduce") and src.rows in (None, rows) \
                    and can_join(n, src):
                join(n, src)
                src.kind, src.rows = "reduce", rows
            else:
                new_group("reduce", n).rows = rows
        else:  # elementwise
            rank = {"gemm": 0, "conv": 0, "reduce": 1, "elementwise": 2}
            for g in sorted(dict.fromkeys(producers), key=lambda g: rank[g.kind]):
                if _fits(n, g) and can_join(n, g):
                    join(n, g)
                    if merge_elementwise and g.kind == "elementwise":
                        merge_into(g, n, list(dict.fromkeys(producers)))
                    break
            else:
                new_group("elementwise", n)

    for n in nodes:
        if n.op != "call_function":
            continue
        kind = node_kind(n)
        if exclude and n in exclude:
            left[n] = exclude[n]
            continue
        if kind == "other":
            left[n] = f"{_packet(n.target)} is not an operation polytile imports"
            continue
        if kind == "getitem":
            src = n.args[0]
            g = group_of.get(src) if isinstance(src, fx.Node) else None
            if g is not None and n.args[1] == 0:
                join(n, g)
            continue
        try:
            check_node(n, target_kind)
            if _packet(n.target) in _TUPLE_FIRST and any(
                    u.target is not operator.getitem or u.args[1] != 0 for u in n.users if u.users):
                raise Unsupported(f"{n.name}: a result other than the first is used")
            place(n, kind)
        except Unsupported as err:
            left[n] = str(err)
    kept = []
    for g in groups:
        if not g.ops:
            continue
        if set(g.ops) <= _COPIES:  # nothing to compute: torch's copy is as good as a kernel's
            for m in g.nodes:
                if node_kind(m) not in ("view", "getitem"):
                    left[m] = "a copy on its own: nothing to compute"
            continue
        kept.append(g)
    return Partition(kept, left)


def _nred(n: fx.Node) -> int:
    p = _packet(n.target)
    if p in (aten._softmax, aten._safe_softmax):
        return 1
    if p is aten.native_layer_norm:
        return len(n.args[1])
    from .importer import _reduced_dims
    return len(_reduced_dims(n))


def _fits(n: fx.Node, g: Group) -> bool:
    """Whether elementwise ``n`` may join ``g``: an epilogue of a product or convolution covers no more
    elements than its result (no broadcast to a larger array)."""
    if g.kind in ("gemm", "conv"):
        anchor = g.anchor
        return anchor is not None and meta(n).numel() <= meta(anchor).numel()
    return True


def group_outputs(g: Group, graph_outputs: set[fx.Node]) -> list[fx.Node]:
    """The nodes of ``g`` whose values the rest of the graph reads. A view read outside is computed by
    torch from its source (views are free there), so its first non-view source is the output."""
    members = set(g.nodes)
    outs: dict[fx.Node, None] = {}
    for n in g.nodes:
        if node_kind(n) in ("view",) or _packet(n.target) in _TUPLE_FIRST:
            continue
        if any(u not in members for u in n.users) or n in graph_outputs:
            outs[n] = None
    for n in g.nodes:
        if node_kind(n) == "view" and (any(u not in members for u in n.users) or n in graph_outputs):
            src = n
            while node_kind(src) == "view" and src in members:
                src = src.args[0]
            if src in members:
                outs[src] = None
    return sorted(outs, key=lambda n: g.nodes.index(n))
