"""Fragment accumulators: a ``fragment`` cache holds a warp's tile with the element (row, col) in the
registers of lane (row % 8) * 4 + (col % 8) // 2 (mma.m16n8's layout). Its last two dimensions are
that lane: the loops running over them (the fill and the write-back) become the thread's own lane,
and each thread keeps only its slice.
"""

from __future__ import annotations

from dataclasses import replace

from ... import dtypes
from ...errors import LoweringError
from .. import loopir as ir
from .kernels import thread_var
from .simplify import simplify_expr

LANE = ir.Cast(dtypes.INDEX, thread_var("threadIdx.x"))


def _fragment_buffers(s: ir.Stmt) -> dict[str, ir.Buffer]:
    return {st.buffer.name: st.buffer for st in ir.walk_stmt(s)
            if isinstance(st, ir.Allocate) and st.buffer.scope == "fragment"}


def _lane_loop(loop: ir.For, frags: dict[str, ir.Buffer]) -> int | None:
    """1 or 2 if ``loop`` only indexes a fragment's lane dimension (-2 or -1) with its variable."""
    dims = set()
    for st in ir.walk_stmt(loop.body):
        accesses = []
        if isinstance(st, ir.Store) and st.buffer.name in frags:
            accesses.append(st.index)
        for e in ir.stmt_exprs(st):
            accesses += [n.index for n in ir.walk_expr(e) if isinstance(n, ir.Load) and n.buffer.name in frags]
        for idx in accesses:
            for d, i in enumerate(idx):
                if any(isinstance(n, ir.Var) and n.name == loop.var.name for n in ir.walk_expr(i)):
                    if not (isinstance(i, ir.Var) and i.name == loop.var.name) or d < len(idx) - 2:
                        return None
                    dims.add(len(idx) - d)
    return dims.pop() if len(dims) == 1 else None


class _Distribute(ir.Mutator):
    def __init__(self, frags: dict[str, ir.Buffer]):
        self.frags = frags
        self.sliced = {n: replace(b, shape=b.shape[:-2], scope="local") for n, b in frags.items()}

    def visit_For(self, s: ir.For) -> ir.Stmt:
        which = _lane_loop(s, self.frags)
        body = self.stmt(s.body)
        if which is None:
            return replace(s, body=body)
        # the lane's row (8 values) or column pair (4 values); a loop over part of them (the edge of
        # a tile) becomes a test of the lane
        full = 8 if which == 2 else 4
        value = ir.BinOp("div" if which == 2 else "mod", LANE, ir.const(4))
        lo, ext = simplify_expr(s.lo), simplify_expr(s.extent)
        if not (ir.is_const(lo, 0) and ir.is_const(ext, full)):
            body = ir.If(ir.Logic("&&", (ir.Cmp("<=", lo, s.var), ir.Cmp("<", s.var, ir.BinOp("+", lo, ext)))),
                         body)
        return ir.LetStmt(s.var, value, body)

    def _slice(self, buf: ir.Buffer, idx: tuple[ir.Expr, ...]) -> tuple[ir.Buffer, tuple[ir.Expr, ...]]:
        if buf.name not in self.sliced:
            return buf, idx
        return self.sliced[buf.name], idx[:-2]

    def visit_Load(self, e: ir.Load) -> ir.Expr:
        idx = tuple(self.expr(i) for i in e.index)
        buf, idx = self._slice(e.buffer, idx)
        return ir.Load(buf, idx)

    def visit_Store(self, s: ir.Store) -> ir.Stmt:
        idx = tuple(self.expr(i) for i in s.index)
        buf, idx = self._slice(s.buffer, idx)
        return ir.Store(buf, idx, self.expr(s.value))

    def visit_Allocate(self, s: ir.Allocate) -> ir.Stmt:
        return ir.Allocate(self.sliced.get(s.buffer.name, s.buffer), self.stmt(s.body))


def distribute_fragments(s: ir.Stmt) -> ir.Stmt:
    """Give each lane its slice of every fragment accumulator."""
    frags = _fragment_buffers(s)
    if not frags:
        return s
    for b in frags.values():
        if len(b.shape) < 2 or not all(isinstance(d, ir.Const) for d in b.shape[-2:]) or \
                (int(b.shape[-2].value), int(b.shape[-1].value)) != (8, 4):  # type: ignore[union-attr]
            raise LoweringError(f"fragment {b.name} does not have the mma.m16n8 lane layout")
    return _Distribute(frags).stmt(s)
