"""Features of a candidate for the cost model (PLANT §4.2, after AutoTVM's itervar features).

* **Knob features** come from the configuration alone: each decision's value (log-scaled numbers,
  one-hot annotations and categories, loop positions of a reorder) — ``ConfigSpace.knob_features``.
* **Iter features** come from the lowered loop IR. The *hot loop body* (the statements directly
  inside one loop, with the most arithmetic times trip count) and its enclosing loops are described
  loop by loop, innermost first: extent, depth, products of extents above and below, annotation
  one-hot, arithmetic counts per iteration; and for each buffer the hot body touches: the stride of the
  loop variable in its index, the elements touched from that loop inward (count) and the iterations
  that touch the same element (reuse). Whole-program counts follow (operations, memory by scope,
  parallel work, code size). Every number is log-scaled and the vector has a fixed length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..lowering import loopir as ir

LOOP_SLOTS = 10
BUFFER_SLOTS = 4
LOOP_KINDS = ("serial", "parallel", "vectorize", "unroll", "block", "thread")
OP_CLASSES = ("add", "mul", "div", "cmp", "call", "load", "store")
SCOPES = ("arg", "heap", "stack", "auto", "register", "shared", "local", "global")
_LOOP_FEATS = 4 + len(LOOP_KINDS) + len(OP_CLASSES)
_BUF_FEATS = 3
_BUFFER_GLOBAL_FEATS = len(SCOPES) + 2
_GLOBAL_FEATS = 12 + 2 * len(SCOPES) + len(OP_CLASSES)


def itervar_length() -> int:
    """The length of every iter-feature vector."""
    return (LOOP_SLOTS * (_LOOP_FEATS + BUFFER_SLOTS * _BUF_FEATS) + BUFFER_SLOTS * _BUFFER_GLOBAL_FEATS
            + _GLOBAL_FEATS)


def slog(x: float) -> float:
    """sign(x) · log2(1 + |x|): the scale every feature is stored in."""
    return math.copysign(math.log2(1.0 + abs(x)), x)


# --- small analyses of the loop IR ------------------------------------------------------------------------


def evaluate(e: ir.Expr, env: dict[str, int]) -> int | None:
    """The integer value of a scalar index expression with variables from ``env`` (others: 0)."""
    if isinstance(e, ir.Const):
        return int(e.value) if not isinstance(e.value, float) else None
    if isinstance(e, ir.Var):
        return env.get(e.name, 0)
    if isinstance(e, ir.BinOp):
        a, b = evaluate(e.a, env), evaluate(e.b, env)
        if a is None or b is None:
            return None
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if e.op in ("//", "/"):
            return a // b if b else None
        if e.op == "%":
            return a % b if b else None
        if e.op == "min":
            return min(a, b)
        if e.op == "max":
            return max(a, b)
    if isinstance(e, ir.Cast):
        return evaluate(e.a, env)
    return None


def coefficient(e: ir.Expr, var: str) -> float:
    """How much ``e`` changes when ``var`` grows by one (exact for affine indices, approximate for
    divisions and remainders)."""
    if isinstance(e, ir.Var):
        return 1.0 if e.name == var else 0.0
    if isinstance(e, ir.BinOp):
        if e.op == "+":
            return coefficient(e.a, var) + coefficient(e.b, var)
        if e.op == "-":
            return coefficient(e.a, var) - coefficient(e.b, var)
        if e.op == "*":
            if isinstance(e.b, ir.Const):
                return coefficient(e.a, var) * float(e.b.value)
            if isinstance(e.a, ir.Const):
                return coefficient(e.b, var) * float(e.a.value)
            return coefficient(e.a, var) + coefficient(e.b, var)
        if e.op in ("//", "/"):
            d = float(e.b.value) if isinstance(e.b, ir.Const) and e.b.value else 1.0
            return coefficient(e.a, var) / d
        return coefficient(e.a, var)
    if isinstance(e, ir.Ramp):
        return coefficient(e.base, var)
    if isinstance(e, (ir.Broadcast,)):
        return coefficient(e.value, var)
    if isinstance(e, ir.Cast):
        return coefficient(e.a, var)
    return 0.0


_OP_CLASS = {"+": "add", "-": "add", "*": "mul", "/": "div", "//": "div", "%": "div"}


def op_counts(exprs: Sequence[ir.Expr]) -> dict[str, int]:
    """Instruction counts by class in expressions (a vector operation counts once)."""
    counts = dict.fromkeys(OP_CLASSES, 0)
    for root in exprs:
        for e in ir.walk_expr(root):
            if isinstance(e, ir.BinOp):
                if e.dtype.is_float or e.op in ("+", "-", "*"):
                    cls = _OP_CLASS.get(e.op, "cmp")
                    if e.dtype.is_float or cls != "add":
                        counts[cls] += 1
            elif isinstance(e, (ir.Cmp, ir.Select, ir.Logic)):
                counts["cmp"] += 1
            elif isinstance(e, ir.Call):
                counts["call"] += 1
            elif isinstance(e, ir.Load):
                counts["load"] += 1
    return counts


@dataclass
class _Loop:
    var: str
    extent: float
    kind: str


@dataclass
class _Leaf:
    """The stores and assignments directly inside one innermost loop (a loop body), with its loops."""

    loops: list[_Loop]
    stmts: list[ir.Stmt]
    counts: dict[str, int]
    lanes: int

    @property
    def trips(self) -> float:
        return math.prod(lp.extent for lp in self.loops)

    @property
    def work(self) -> float:
        return self.trips * (sum(self.counts.values()) + 1) * self.lanes


def _kind_class(kind: str) -> str:
    if kind.startswith("blockIdx"):
        return "block"
    if kind.startswith("threadIdx"):
        return "thread"
    return kind if kind in LOOP_KINDS else "serial"


def _leaves(body: ir.Stmt) -> tuple[list[_Leaf], dict[str, int], list[ir.Buffer]]:
    leaves: dict[int, _Leaf] = {}
    stats = {"loops": 0, "ifs": 0, "stmts": 0, "allocs": 0}
    allocs: list[ir.Buffer] = []

    def visit(s: ir.Stmt, loops: list[_Loop], env: dict[str, int], nest: int) -> None:
        stats["stmts"] += 1
        if isinstance(s, ir.For):
            stats["loops"] += 1
            ext = evaluate(s.extent, env)
            lp = _Loop(s.var.name, float(max(1, ext if ext is not None else 1)), _kind_class(s.kind))
            lo = evaluate(s.lo, env) or 0
            visit(s.body, [*loops, lp], {**env, s.var.name: lo}, id(s))
            return
        if isinstance(s, ir.If):
            stats["ifs"] += 1
        if isinstance(s, ir.Allocate):
            stats["allocs"] += 1
            allocs.append(s.buffer)
        if isinstance(s, (ir.Store, ir.Assign)):
            counts = op_counts(ir.stmt_exprs(s))
            counts["store"] += isinstance(s, ir.Store)
            leaf = leaves.setdefault(nest, _Leaf(list(loops), [], dict.fromkeys(OP_CLASSES, 0), 1))
            leaf.stmts.append(s)
            leaf.lanes = max(leaf.lanes, s.value.lanes)
            for c in OP_CLASSES:
                leaf.counts[c] += counts[c]
        for child in ir.stmt_children(s):
            visit(child, loops, env, nest)

    visit(body, [], {}, 0)
    return list(leaves.values()), stats, allocs


def _buffer_accesses(stmts: Sequence[ir.Stmt]) -> list[tuple[ir.Buffer, ir.Expr]]:
    """(buffer, flat index) of the hot loop body, first access of each buffer: stores, then loads."""
    out: list[tuple[ir.Buffer, ir.Expr]] = []
    for stmt in stmts:
        if isinstance(stmt, ir.Store):
            out.append((stmt.buffer, stmt.index[-1]))
    for stmt in stmts:
        for root in ir.stmt_exprs(stmt):
            for e in ir.walk_expr(root):
                if isinstance(e, ir.Load):
                    out.append((e.buffer, e.index[-1]))
    seen: set[str] = set()
    unique = []
    for buf, idx in out:
        if buf.name not in seen:
            seen.add(buf.name)
            unique.append((buf, idx))
    return unique


def _buffer_bytes(buf: ir.Buffer) -> float:
    n = 1.0
    for d in buf.shape:
        v = evaluate(d, {})
        n *= max(1, v if v is not None else 1)
    return n * buf.dtype.bits / 8


def itervar_features(lowered: ir.LoweredFunc, cores: int = 1) -> np.ndarray:
    """The fixed-length iter-feature vector of a lowered function (see the module docstring)."""
    leaves, stats, allocs = _leaves(lowered.body)
    out = np.zeros(itervar_length(), dtype=np.float32)
    if not leaves:
        return out
    hot = max(leaves, key=lambda lf: lf.work)
    chain = hot.loops
    accesses = _buffer_accesses(hot.stmts)[:BUFFER_SLOTS]
    pos = 0

    def put(values: Sequence[float]) -> None:
        nonlocal pos
        out[pos:pos + len(values)] = [slog(v) for v in values]
        pos += len(values)

    # loops of the hot body, innermost first
    inner_work = dict(hot.counts)
    for slot in range(LOOP_SLOTS):
        k = len(chain) - 1 - slot
        if k < 0:
            pos += _LOOP_FEATS + BUFFER_SLOTS * _BUF_FEATS
            continue
        lp = chain[k]
        top = math.prod(x.extent for x in chain[:k + 1])
        bottom = math.prod(x.extent for x in chain[k:])
        put([lp.extent, k + 1, top, bottom])
        out[pos + LOOP_KINDS.index(lp.kind)] = 1.0
        pos += len(LOOP_KINDS)
        inner_trips = math.prod(x.extent for x in chain[k + 1:])
        put([inner_work[c] * inner_trips for c in OP_CLASSES])
        for b in range(BUFFER_SLOTS):
            if b >= len(accesses):
                pos += _BUF_FEATS
                continue
            _, index = accesses[b]
            stride = coefficient(index, lp.var)
            count, reuse = 1.0, 1.0
            for x in chain[k:]:
                if coefficient(index, x.var) != 0.0:
                    count *= x.extent
                else:
                    reuse *= x.extent
            put([stride, count * max(1, index.lanes), reuse])
    # buffers of the hot body: scope, size, lanes
    for b in range(BUFFER_SLOTS):
        if b >= len(accesses):
            pos += _BUFFER_GLOBAL_FEATS
            continue
        buf, index = accesses[b]
        scope = buf.scope if buf.scope in SCOPES else "heap"
        out[pos + SCOPES.index(scope)] = 1.0
        pos += len(SCOPES)
        put([_buffer_bytes(buf), index.lanes])
    # the whole program
    total = dict.fromkeys(OP_CLASSES, 0.0)
    for lf in leaves:
        for c in OP_CLASSES:
            total[c] += lf.counts[c] * lf.trips
    parallel = [lp.extent for lf in leaves for lp in lf.loops if lp.kind in ("parallel", "block")]
    par_extent = max(parallel, default=1.0)
    balance = par_extent / (math.ceil(par_extent / max(1, cores)) * max(1, cores))
    vector_lanes = max(lf.lanes for lf in leaves)
    hot_share = hot.work / sum(lf.work for lf in leaves)
    put([total[c] for c in OP_CLASSES])
    put([stats["loops"], stats["ifs"], stats["stmts"], stats["allocs"], len(leaves), par_extent, balance * 8,
         vector_lanes, hot_share * 8, hot.trips, len(chain), sum(1 for lp in chain if lp.kind == "unroll")])
    alloc_bytes = dict.fromkeys(SCOPES, 0.0)
    alloc_count = dict.fromkeys(SCOPES, 0.0)
    for buf in allocs:
        scope = buf.scope if buf.scope in SCOPES else "heap"
        alloc_bytes[scope] += _buffer_bytes(buf)
        alloc_count[scope] += 1
    put([alloc_bytes[s] for s in SCOPES])
    put([alloc_count[s] for s in SCOPES])
    assert pos == len(out), (pos, len(out))
    return out
