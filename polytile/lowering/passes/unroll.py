"""Unrolling: loops tagged ``unroll`` with a constant extent become copies of their body."""

from __future__ import annotations

from .. import loopir as ir
from .simplify import simplify_expr

MAX_UNROLL = 512


class _Unroll(ir.Mutator):
    def visit_For(self, s: ir.For) -> ir.Stmt:
        body = self.stmt(s.body)
        if s.kind != "unroll":
            return ir.For(s.var, s.lo, s.extent, body, s.kind)
        ext = simplify_expr(s.extent)
        if not isinstance(ext, ir.Const) or int(ext.value) > MAX_UNROLL:
            # a partial tile: its extent is not constant, so it stays a loop
            return ir.For(s.var, s.lo, s.extent, body, "serial")
        copies = [ir.substitute(body, {s.var.name: ir.BinOp("+", s.lo, ir.const(k))})
                  for k in range(int(ext.value))]
        return ir.block(copies)  # type: ignore[arg-type]


def unroll_loops(s: ir.Stmt) -> ir.Stmt:
    """Replace every constant-extent ``unroll`` loop by copies of its body."""
    return _Unroll().stmt(s)
