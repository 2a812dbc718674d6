"""Storage flattening: multi-dimensional indices become one row-major offset per access."""

from __future__ import annotations

from .. import loopir as ir


def flat_index(buf: ir.Buffer, index: tuple[ir.Expr, ...]) -> ir.Expr:
    if len(index) == 1:
        return index[0]
    if not index and not buf.shape:  # a scalar: its one element
        return ir.const(0)
    if len(index) != len(buf.shape):
        raise AssertionError(f"{buf.name}: {len(index)} indices for {len(buf.shape)} dimensions")
    out = index[0]
    for dim, i in zip(buf.shape[1:], index[1:]):
        out = ir.BinOp("+", ir.BinOp("*", out, dim), i)
    return out


class _Flatten(ir.Mutator):
    def visit_Load(self, e: ir.Load) -> ir.Expr:
        idx = tuple(self.expr(i) for i in e.index)
        return ir.Load(e.buffer, (flat_index(e.buffer, idx),))

    def visit_Store(self, s: ir.Store) -> ir.Stmt:
        idx = tuple(self.expr(i) for i in s.index)
        return ir.Store(s.buffer, (flat_index(s.buffer, idx),), self.expr(s.value))


def flatten_storage(s: ir.Stmt) -> ir.Stmt:
    """Rewrite every load and store to a single flat index (buffers keep their shapes for sizing)."""
    return _Flatten().stmt(s)
