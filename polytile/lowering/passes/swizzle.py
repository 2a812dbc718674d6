"""Shared-memory swizzling: the 16-byte chunks of a swizzled buffer's rows are XOR-permuted by the
row number modulo 8 (rows of ``buffer.swizzle`` bytes, 128: the layout Hopper's wgmma reads at full
speed, conflict-free for the copies too).

The layouts before this pass are affine (isl's, checked by the earlier passes); the XOR is applied
last, to the flat index of every load and store of a swizzled buffer — vector accesses keep their
16-byte chunk whole. The operands of wgmma instructions and the destinations of TMA copies are left
alone: they take the unswizzled address and the hardware applies the swizzle.
"""

from __future__ import annotations

from ...errors import LoweringError
from ...intrinsics import instruction
from .. import loopir as ir


def _swizzled(e: ir.Expr, buf: ir.Buffer) -> ir.Expr:
    """Element offset ``e`` of ``buf`` with its 16-byte chunk XOR-ed by its row's number modulo 8."""
    unit = 16 // buf.dtype.itemsize
    row = buf.swizzle // buf.dtype.itemsize
    if isinstance(e, ir.Ramp):
        if not ir.is_const(e.stride, 1) or e.lanes > unit:
            raise LoweringError(f"a vector access of {e.lanes} elements of swizzled buffer {buf.name} crosses a "
                                "16-byte chunk")
        return ir.Ramp(_swizzled(e.base, buf), e.stride, e.lanes)
    chunk = ir.BinOp("*", ir.BinOp("mod", ir.BinOp("div", e, ir.const(row)), ir.const(8)), ir.const(unit))
    return ir.BinOp("^", e, chunk)


class _Swizzle(ir.Mutator):
    def visit_Load(self, e: ir.Load) -> ir.Expr:
        idx = tuple(self.expr(i) for i in e.index)
        if e.buffer.swizzle:
            (i,) = idx
            idx = (_swizzled(i, e.buffer),)
        return ir.Load(e.buffer, idx)

    def visit_Store(self, s: ir.Store) -> ir.Stmt:
        idx = tuple(self.expr(i) for i in s.index)
        if s.buffer.swizzle:
            (i,) = idx
            idx = (_swizzled(i, s.buffer),)
        return ir.Store(s.buffer, idx, self.expr(s.value))

    def visit_Evaluate(self, s: ir.Evaluate) -> ir.Stmt:
        if getattr(instruction(s.call.name), "hardware_swizzle", False):
            return s  # wgmma's descriptors and TMA copies take the unswizzled address: the hardware swizzles
        return self.default_stmt(s)


def swizzle_shared(s: ir.Stmt) -> ir.Stmt:
    """Apply the swizzle of every swizzled buffer to its (flat) accesses: the last pass that touches
    indices, so that the passes before it see the layout's affine offsets."""
    return _Swizzle().stmt(s)
