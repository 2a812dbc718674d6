"""Shared-memory swizzling: the 16-byte chunks of a swizzled buffer's rows are XOR-permuted by the
row number modulo 8 (rows of ``buffer.swizzle`` bytes, 128: the layout Hopper's wgmma reads at full
speed, conflict-free for the copies too).

The layouts before this pass are affine (isl's, checked by the earlier passes); the XOR is applied
last, to the flat index of every load and store of a swizzled buffer — vector accesses keep their
16-byte chunk whole. The operands of wgmma instructions and the destinations of TMA copies are left
alone: they take the unswizzled address and the hardware applies the swizzle.

The XOR repeats every 8 rows: terms of the offset that are multiples of 8 rows (a pipeline stage's
base, a constant) are added after it, so that the XOR is of the loop-invariant rest (a thread's
place in the tile), which the compiler then computes once outside the K loop rather than at every
copy of every step (the implicit-GEMM copies spent 11 instructions each on it).
"""

from __future__ import annotations

from ...errors import LoweringError
from ...intrinsics import instruction
from .. import loopir as ir
from .simplify import Linear, Simplifier, kernel_bounds


def _swizzled(e: ir.Expr, buf: ir.Buffer, ranges: Simplifier) -> ir.Expr:
    """Element offset ``e`` of ``buf`` with its 16-byte chunk XOR-ed by its row's number modulo 8: the
    XOR of the part of ``e`` that is not a multiple of 8 rows, where that part is provably
    non-negative (``ranges``: the bounds of the loop and thread indices in scope), the rest added."""
    unit = 16 // buf.dtype.itemsize
    row = buf.swizzle // buf.dtype.itemsize
    if isinstance(e, ir.Ramp):
        if not ir.is_const(e.stride, 1) or e.lanes > unit:
            raise LoweringError(f"a vector access of {e.lanes} elements of swizzled buffer {buf.name} crosses a "
                                "16-byte chunk")
        return ir.Ramp(_swizzled(e.base, buf, ranges), e.stride, e.lanes)
    period = 8 * row  # the XOR of an offset and of the offset plus a multiple of this are the same
    lin = ranges.linear(e)
    whole = Linear({k: (c, a) for k, (c, a) in lin.terms.items() if c % period == 0}, lin.const // period * period)
    rest = Linear({k: (c, a) for k, (c, a) in lin.terms.items() if c % period}, lin.const % period)
    if whole.terms or whole.const:
        part = rest.expr()
        if ranges.interval(part)[0] >= 0:
            return ir.BinOp("+", whole.expr(), _xor(part, row, unit))
    return _xor(e, row, unit)


def _xor(e: ir.Expr, row: int, unit: int) -> ir.Expr:
    chunk = ir.BinOp("*", ir.BinOp("mod", ir.BinOp("div", e, ir.const(row)), ir.const(8)), ir.const(unit))
    return ir.BinOp("^", e, chunk)


class _Swizzle(ir.Mutator):
    def __init__(self) -> None:
        self.ranges = Simplifier()  # for its intervals of the loop, thread and let variables in scope

    def visit_Kernel(self, s: ir.Kernel) -> ir.Stmt:
        saved = dict(self.ranges.bounds)
        self.ranges.bounds.update(kernel_bounds(s))
        out = self.default_stmt(s)
        self.ranges.bounds = saved
        return out

    def visit_For(self, s: ir.For) -> ir.Stmt:
        lo, ext = self.ranges.interval(s.lo), self.ranges.interval(s.extent)
        return self._scoped(s.var.name, (lo[0], lo[1] + ext[1] - 1), s)

    def visit_LetStmt(self, s: ir.LetStmt) -> ir.Stmt:
        return self._scoped(s.var.name, self.ranges.interval(s.value), s)

    def _scoped(self, name: str, bounds: tuple[float, float], s: ir.Stmt) -> ir.Stmt:
        saved = self.ranges.bounds.get(name)
        self.ranges.bounds[name] = bounds
        out = self.default_stmt(s)
        if saved is None:
            del self.ranges.bounds[name]
        else:
            self.ranges.bounds[name] = saved
        return out

    def visit_Load(self, e: ir.Load) -> ir.Expr:
        idx = tuple(self.expr(i) for i in e.index)
        if e.buffer.swizzle:
            (i,) = idx
            idx = (_swizzled(i, e.buffer, self.ranges),)
        return ir.Load(e.buffer, idx)

    def visit_Store(self, s: ir.Store) -> ir.Stmt:
        idx = tuple(self.expr(i) for i in s.index)
        if s.buffer.swizzle:
            (i,) = idx
            idx = (_swizzled(i, s.buffer, self.ranges),)
        return ir.Store(s.buffer, idx, self.expr(s.value))

    def visit_Evaluate(self, s: ir.Evaluate) -> ir.Stmt:
        if getattr(instruction(s.call.name), "hardware_swizzle", False):
            return s  # wgmma's descriptors and TMA copies take the unswizzled address: the hardware swizzles
        return self.default_stmt(s)


def swizzle_shared(s: ir.Stmt) -> ir.Stmt:
    """Apply the swizzle of every swizzled buffer to its (flat) accesses: the last pass that touches
    indices, so that the passes before it see the layout's affine offsets."""
    return _Swizzle().stmt(s)
