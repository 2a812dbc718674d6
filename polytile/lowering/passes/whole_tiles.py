"""Whole tiles: register products over constant loops without tests at the tensors' edges.

A computation whose accumulator is a whole register tile (``cache_write(..., loc="local",
whole=...)``) and whose operands come from whole shared or register tiles (``cache(..., whole=...)``:
zeros past the tensors' ends; the GEMV loads B straight into registers) may compute its partial
tiles whole: the extra products add zeros along the reduction and fill accumulator elements past the
tensor's end, which the write-back (with its own bounds test) leaves out. isl cuts the partial tiles
exactly, with tests of many disjuncts around each product and loops of variable bounds (the register
tile then cannot be indexed by constants); this pass gives such regions back their full ranges, as
``tensorize`` does for the tensor cores.

A region is a loop or test whose statements only write registers and only read whole shared (or
register) tiles, the accumulator, and registers written in the region; each register buffer is
written by one statement in the region, and an accumulation (a store that reads what it writes) by
one statement in the whole body (two copies of one statement, cut by isl for two parts of the
domain, would both run over the whole range and add every product twice; copies of a copy store the
same values). Its loops take their full constant ranges and its tests (with no else branch) go,
when every access then stays inside its buffer; otherwise the region is left as it was. The
schedule checks the rest (``schedule.tensorize.check_whole_products``): the computation's domain is
a box (but for instances reading every operand past its end) and its K tiles do not run into the
next chunk of a split reduction.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from .. import loopir as ir
from .simplify import Simplifier, simplify_expr
from .tensorize import full_range, loop_span


class _Region:
    """Whether a statement is a region of whole-tile products (see the module's docstring)."""

    def __init__(self, whole_reads: set[str], whole_writes: set[str], accumulations: Counter[str]):
        self.whole_reads, self.whole_writes = whole_reads, whole_writes
        self.accumulations = accumulations  # per buffer, its read-modify-write stores in the whole body

    def eligible(self, s: ir.Stmt) -> bool:
        stores: list[ir.Store] = []
        local: set[str] = set()
        loads: list[ir.Load] = []
        for x in ir.walk_stmt(s):
            if isinstance(x, ir.Store):
                stores.append(x)
            elif isinstance(x, ir.Allocate):
                if x.buffer.scope != "local":
                    return False
                local.add(x.buffer.name)
            elif not isinstance(x, (ir.For, ir.If, ir.Block, ir.LetStmt)):
                return False  # calls, barriers, copies: not a product region
            if isinstance(x, ir.For) and x.kind not in ("serial", "unroll", "vectorize"):
                return False
            for e in ir.stmt_exprs(x):
                loads += [n for n in ir.walk_expr(e) if isinstance(n, ir.Load)]
        written = [st.buffer.name for st in stores]
        if not any(n in self.whole_writes for n in written) or len(set(written)) != len(written):
            return False
        if any(self.accumulations[n] > 1 for n in written):
            return False  # an accumulation cut in pieces (elsewhere too): each would run whole
        if any(st.buffer.scope != "local" or (st.buffer.name not in self.whole_writes and st.buffer.name not in local)
               for st in stores):
            return False
        for ld in loads:
            name, scope = ld.buffer.name, ld.buffer.scope
            if scope in ("shared", "local") and name in self.whole_reads:
                continue
            if scope == "local" and (name in self.whole_writes or name in written):
                continue
            return False
        return True


class _WholeTiles(ir.Mutator):
    def __init__(self, region: _Region):
        self.region = region
        self.bounds: dict[str, tuple[float, float]] = {}  # ranges of the enclosing loops

    def visit_For(self, s: ir.For) -> ir.Stmt:
        if s.kind in ("serial", "unroll", "vectorize") and self.region.eligible(s):
            return self.whole(s)
        return self.enter(s)

    def visit_If(self, s: ir.If) -> ir.Stmt:
        if s.orelse is None and self.region.eligible(s):
            return self.whole(s)
        return self.default_stmt(s)

    def enter(self, s: ir.For) -> ir.Stmt:
        """``s`` rebuilt by the default walk, its variable's range known inside."""
        self.bounds[s.var.name] = loop_span(s, self.bounds)
        try:
            return self.default_stmt(s)
        finally:
            del self.bounds[s.var.name]

    def whole(self, s: ir.Stmt) -> ir.Stmt:
        """``s`` with full loops and without tests, if every access stays inside its buffer."""
        bounds = dict(self.bounds)

        def rewrite(x: ir.Stmt) -> ir.Stmt:
            if isinstance(x, ir.If) and x.orelse is None:
                return rewrite(x.then)
            if isinstance(x, ir.For):
                full = full_range(x, bounds) or x
                bounds[x.var.name] = loop_span(full, bounds)
                return replace(full, body=rewrite(x.body))
            if isinstance(x, ir.Block):
                return ir.block([rewrite(y) for y in x.body])
            if isinstance(x, ir.Allocate):
                return replace(x, body=rewrite(x.body))
            if isinstance(x, ir.LetStmt):
                return replace(x, body=rewrite(x.body))
            return x

        out = rewrite(s)
        if _fits(out, bounds):
            return out
        return self.enter(s) if isinstance(s, ir.For) else self.default_stmt(s)


def _fits(s: ir.Stmt, bounds: dict[str, tuple[float, float]]) -> bool:
    """Whether every access of ``s`` stays inside its buffer for the loop ranges in ``bounds``."""
    simp = Simplifier()
    simp.bounds = dict(bounds)
    for x in ir.walk_stmt(s):
        accesses = [ir.Load(x.buffer, x.index)] if isinstance(x, ir.Store) else []
        for e in ir.stmt_exprs(x):
            accesses += [n for n in ir.walk_expr(e) if isinstance(n, ir.Load)]
        for ld in accesses:
            for i, d in zip(ld.index, ld.buffer.shape, strict=True):
                lo, hi = simp.interval(simplify_expr(i))
                if not isinstance(d, ir.Const) or lo < 0 or hi > int(d.value) - 1:
                    return False
    return True


def whole_tiles(s: ir.Stmt, whole_reads: set[str], whole_writes: set[str]) -> ir.Stmt:
    """Run the register products of whole tiles (``whole_writes``: whole register accumulators;
    ``whole_reads``: whole shared tiles) over their full constant ranges without tests."""
    if not whole_writes:
        return s
    accumulations = Counter(x.buffer.name for x in ir.walk_stmt(s) if isinstance(x, ir.Store) and any(
        isinstance(n, ir.Load) and n.buffer.name == x.buffer.name for n in ir.walk_expr(x.value)))
    return _WholeTiles(_Region(whole_reads, whole_writes, accumulations)).stmt(s)
