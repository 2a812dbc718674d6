"""Legal vector accesses on GPUs: a 16-byte (or 8-byte) load or store is kept only where its offset is
provably a multiple of its width; otherwise it is split into scalar accesses."""

from __future__ import annotations

from .. import loopir as ir
from .simplify import Simplifier


def _aligned(base: ir.Expr, lanes: int) -> bool:
    lin = Simplifier().linear(base)
    if lin.const % lanes:
        return False
    for _, (coef, atom) in lin.terms.items():
        if coef % lanes:
            return False
    return True


class _Legalize(ir.Mutator):
    def visit_Store(self, s: ir.Store) -> ir.Stmt:
        (idx,) = s.index
        value = self.expr(s.value)
        if idx.lanes == 1 and value.lanes == 1:
            return ir.Store(s.buffer, s.index, value)
        ok = (isinstance(idx, ir.Ramp) and ir.is_const(idx.stride, 1) and _aligned(idx.base, idx.lanes)
              and isinstance(value, ir.Load) and isinstance(value.index[0], ir.Ramp)
              and ir.is_const(value.index[0].stride, 1) and _aligned(value.index[0].base, idx.lanes))
        if ok:
            return ir.Store(s.buffer, s.index, value)
        return ir.block([ir.Store(s.buffer, (_lane(idx, k),), _lane_value(value, k)) for k in range(idx.lanes)])


def _lane(idx: ir.Expr, k: int) -> ir.Expr:
    if isinstance(idx, ir.Ramp):
        return ir.BinOp("+", idx.base, ir.BinOp("*", ir.const(k), idx.stride))
    if isinstance(idx, ir.Broadcast):
        return idx.value
    return idx


def _lane_value(v: ir.Expr, k: int) -> ir.Expr:
    if isinstance(v, ir.Load):
        return ir.Load(v.buffer, (_lane(v.index[0], k),))
    if isinstance(v, ir.Broadcast):
        return v.value
    return v


def vectorize_copies(s: ir.Stmt) -> ir.Stmt:
    """Keep the aligned 16-byte copies made by the kernel pass; split the others."""
    from .simplify import simplify
    return simplify(_Legalize().stmt(s))
