"""Legal vector accesses on GPUs: a 16-byte (or 8-byte) load, store or asynchronous copy is kept only
where its offset is provably a multiple of its width; otherwise it is split into scalar accesses."""

from __future__ import annotations

import math

from .. import loopir as ir
from .simplify import Simplifier


def aligned(base: ir.Expr, lanes: int) -> bool:
    """Whether index ``base`` is a multiple of ``lanes`` for every value of its variables (its constant
    and every coefficient are); buffers start 16-byte aligned (runtime.cuda.ALIGNMENT)."""
    lin = Simplifier().linear(base)
    if lin.const % lanes:
        return False
    return all(coef % lanes == 0 or _multiple(atom, lanes // math.gcd(coef, lanes))
               for coef, atom in lin.terms.values())


def _multiple(e: ir.Expr, m: int) -> bool:
    """Whether ``e`` is a multiple of ``m`` for every value of its variables: ``A % D`` is where A is and
    m divides D (a channel index of a fused channels-last loop)."""
    return (isinstance(e, ir.BinOp) and e.op in ("%", "mod") and isinstance(e.b, ir.Const) and int(e.b.value) % m == 0
            and aligned(e.a, m))


class _Legalize(ir.Mutator):
    def visit_Store(self, s: ir.Store) -> ir.Stmt:
        (idx,) = s.index
        value = self.expr(s.value)
        if idx.lanes == 1 and value.lanes == 1:
            return ir.Store(s.buffer, s.index, value)
        src = value.a if isinstance(value, ir.Select) else value
        ok = (isinstance(idx, ir.Ramp) and ir.is_const(idx.stride, 1) and aligned(idx.base, idx.lanes)
              and isinstance(src, ir.Load) and isinstance(src.index[0], ir.Ramp)
              and ir.is_const(src.index[0].stride, 1) and aligned(src.index[0].base, idx.lanes))
        if ok:
            return ir.Store(s.buffer, s.index, value)
        return ir.block([ir.Store(s.buffer, (lane(idx, k),), lane(value, k)) for k in range(idx.lanes)])


    def visit_Evaluate(self, s: ir.Evaluate) -> ir.Stmt:
        call = s.call
        if not (isinstance(call, ir.Call) and call.name in ("pt_cp_async", "pt_cp_async_zfill")):
            return self.default_stmt(s)
        dst, src = call.args[:2]
        assert isinstance(dst, ir.Load) and isinstance(src, ir.Load)
        (idx,) = dst.index
        (sidx,) = src.index
        n = idx.lanes
        if n == 1 or (isinstance(idx, ir.Ramp) and aligned(idx.base, n) and isinstance(sidx, ir.Ramp)
                      and aligned(sidx.base, n)):
            return s
        width = _aligned_width(call, idx, sidx)
        if width > 1:  # the widest asynchronous copies the proven alignment allows (8 or 4 bytes)
            return ir.block([ir.Evaluate(ir.Call(call.name, tuple(_piece(a, k, width) for a in call.args), call.dtype))
                             for k in range(0, n, width)])
        # not even 4-byte aligned: element by element (asynchronous if 4 bytes, else a plain copy)
        out: list[ir.Stmt] = []
        for k in range(n):
            d, v = lane(dst, k), lane(src, k)
            assert isinstance(d, ir.Load)
            cond = lane(call.args[2], k) if call.name == "pt_cp_async_zfill" else None
            if dst.buffer.dtype.itemsize == 4:
                args = (d, v) if cond is None else (d, v, cond)
                out.append(ir.Evaluate(ir.Call(call.name, args, call.dtype)))
            else:
                value = v if cond is None else ir.Select(cond, v, ir.Const(0.0 if v.dtype.is_float else 0, v.dtype))
                out.append(ir.Store(d.buffer, d.index, value))
        return ir.block(out)


def _aligned_width(call: ir.Call, idx: ir.Expr, sidx: ir.Expr) -> int:
    """The most lanes of an asynchronous copy (at least 4 bytes) whose destination and source offsets
    are multiples of it; for a zero-filling copy also dividing the source's rows (a piece is then
    inside the tensor or past its end, never across). 1: none."""
    dst, src = call.args[:2]
    assert isinstance(dst, ir.Load) and isinstance(src, ir.Load)
    size = dst.buffer.dtype.itemsize
    if not (isinstance(idx, ir.Ramp) and isinstance(sidx, ir.Ramp)):
        return 1
    row = src.buffer.shape[-1]
    width = idx.lanes // 2
    while width * size >= 4:
        fits_rows = call.name != "pt_cp_async_zfill" or (isinstance(row, ir.Const) and int(row.value) % width == 0)
        if fits_rows and aligned(idx.base, width) and aligned(sidx.base, width):
            return width
        width //= 2
    return 1


def _piece(e: ir.Expr, start: int, width: int) -> ir.Expr:
    """Lanes [start, start + width) of a vector expression (a load of a ramp, a comparison of ramps)."""
    return _Piece(start, width).expr(e) if e.lanes > 1 else e


class _Piece(ir.Mutator):
    def __init__(self, start: int, width: int):
        self.start, self.width = start, width

    def visit_Ramp(self, e: ir.Ramp) -> ir.Expr:
        base = ir.BinOp("+", self.expr(e.base), ir.BinOp("*", ir.const(self.start), self.expr(e.stride)))
        return ir.Ramp(base, e.stride, self.width)

    def visit_Broadcast(self, e: ir.Broadcast) -> ir.Expr:
        return ir.Broadcast(self.expr(e.value), self.width)


class _Lane(ir.Mutator):
    def __init__(self, k: int):
        self.k = k

    def visit_Ramp(self, e: ir.Ramp) -> ir.Expr:
        return ir.BinOp("+", self.expr(e.base), ir.BinOp("*", ir.const(self.k), self.expr(e.stride)))

    def visit_Broadcast(self, e: ir.Broadcast) -> ir.Expr:
        return self.expr(e.value)

    def visit_Const(self, e: ir.Const) -> ir.Expr:
        return ir.Const(e.value, e.dtype) if e.lanes > 1 else e


def lane(e: ir.Expr, k: int) -> ir.Expr:
    """Lane ``k`` of a vector expression, as a scalar expression."""
    return _Lane(k).expr(e) if e.lanes > 1 else e


def vectorize_copies(s: ir.Stmt) -> ir.Stmt:
    """Keep the aligned 16-byte copies made by the kernel pass; split the others."""
    from .simplify import simplify
    return simplify(_Legalize().stmt(s))
