"""The (i, j, k) loop nest a ``tensorize`` tag marks, taken apart: its three loop variables, the
accumulating update and its two factors (shared by the mma.sync and wgmma lowerings)."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import LoweringError
from .. import loopir as ir


@dataclass
class NestParts:
    names: list[str]  # the row, column and reduction loops' variables
    store: ir.Store  # acc[...] = acc[...] + a * b
    a: ir.Load
    b: ir.Load


def parse_nest(loop: ir.For) -> NestParts:
    """Tests inside the nest only cut it at the tensors' ends (the computation's domain is a box,
    checked by the primitive): the instruction computes the whole nest on zero-filled operands."""
    j_loop = ir.unguard(loop.body)
    if not isinstance(j_loop, ir.For) or not isinstance(ir.unguard(j_loop.body), ir.For):
        raise LoweringError(f"tensorized loop {loop.var.name} must hold exactly two loops")
    k_loop = ir.unguard(j_loop.body)
    assert isinstance(k_loop, ir.For)
    st = ir.unguard(k_loop.body)
    if not isinstance(st, ir.Store):
        raise LoweringError(f"tensorized nest {loop.var.name} must hold one update")
    v = st.value
    if not (isinstance(v, ir.BinOp) and v.op == "+" and isinstance(v.a, ir.Load) and v.a.buffer is st.buffer
            and isinstance(v.b, ir.BinOp) and v.b.op == "*"):
        raise LoweringError(f"tensorized nest {loop.var.name} is not an accumulation of products")
    a, b = ir.strip_casts(v.b.a), ir.strip_casts(v.b.b)
    if not (isinstance(a, ir.Load) and isinstance(b, ir.Load)):
        raise LoweringError(f"tensorized nest {loop.var.name}: the factors must be buffer reads")
    if st.buffer.scope != "fragment":
        raise LoweringError(f"tensorized nest {loop.var.name} accumulates into {st.buffer.name}, which is not a "
                            "fragment cache; use cache_write(..., loc='fragment')")
    return NestParts([loop.var.name, j_loop.var.name, k_loop.var.name], st, a, b)
