"""Unrolling: loops tagged ``unroll`` with a constant extent become copies of their body."""

from __future__ import annotations

from dataclasses import replace

from .. import loopir as ir
from .simplify import simplify_expr

MAX_UNROLL = 512


class _Unroll(ir.Mutator):
    def __init__(self, kinds: tuple[str, ...]):
        self.kinds = kinds

    def visit_For(self, s: ir.For) -> ir.Stmt:
        body = self.stmt(s.body)
        if s.kind not in self.kinds:
            return replace(s, body=body)
        ext = simplify_expr(s.extent)
        if not isinstance(ext, ir.Const) or int(ext.value) > MAX_UNROLL:
            # a partial tile: its extent is not constant, so it stays a loop
            return replace(s, body=body, kind="serial")
        copies = [ir.substitute(body, {s.var.name: ir.BinOp("+", s.lo, ir.const(k))})
                  for k in range(int(ext.value))]
        return ir.block(copies)  # type: ignore[arg-type]


def unroll_loops(s: ir.Stmt, kinds: tuple[str, ...] = ("unroll",)) -> ir.Stmt:
    """Replace every constant-extent loop of the given kinds by copies of its body (on GPUs,
    vectorized loops are unrolled too: each thread keeps its elements in registers)."""
    return _Unroll(kinds).stmt(s)
