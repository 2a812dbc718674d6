"""Vectorization: a loop tagged ``vectorize`` with a constant power-of-two extent becomes vector code.

The loop variable becomes ``ramp(lo, 1, lanes)``; operations on it widen (scalars broadcast), loads
and stores with a ramp index move contiguous elements, other indices gather or scatter. Loops that
cannot be vectorized this way (a scalar store fed by vector values, math calls, vector conditions
in control flow, bool values other than comparisons) stay scalar loops with a SIMD hint for the C
compiler (none around a parallel loop: OpenMP forbids a parallel region inside a simd loop).

The only vector booleans are comparisons: in C they are integer masks (0 or -1 per lane), which
``Select`` takes as its condition and the printer turns into 0 or 1 when cast to a number. Bool
buffers, broadcast bools and bool selects have no vector type (GCC has no bool vectors).
"""

from __future__ import annotations

from dataclasses import replace

from ...dtypes import DType, float32, promote
from ...target import CPUTarget
from .. import loopir as ir
from .simplify import simplify_expr

MAX_LANES = 64


class CannotVectorize(Exception):
    pass


def _widen(e: ir.Expr, lanes: int) -> ir.Expr:
    if e.lanes == lanes:
        return e
    if e.dtype.is_bool:
        raise CannotVectorize("a bool broadcast across lanes")
    return ir.Broadcast(e, lanes)


def _vector_type(d: DType) -> DType:
    """The element type of ``d``'s C vectors (bfloat16 values are computed in float32)."""
    return float32 if d.name == "bfloat16" else d


def _common(a: ir.Expr, b: ir.Expr) -> tuple[ir.Expr, ir.Expr]:
    """``a`` and ``b`` cast to their common type where their C vector types differ: C promotes mixed
    scalar operands (an int32 index times an int64 stride) by itself, but the operands of a vector
    operation must have one vector type."""
    if _vector_type(a.dtype) == _vector_type(b.dtype):
        return a, b
    t = promote(a.dtype, b.dtype)
    return (a if a.dtype == t else ir.Cast(t, a)), (b if b.dtype == t else ir.Cast(t, b))


class _Widen(ir.Mutator):
    def __init__(self, var: str, lanes: int, lo: ir.Expr):
        self.var, self.lanes = var, lanes
        self.ramp = ir.Ramp(lo, ir.const(1), lanes)
        self.vector_vars: set[str] = set()

    def visit_Var(self, v: ir.Var) -> ir.Expr:
        return self.ramp if v.name == self.var else v

    def visit_BinOp(self, e: ir.BinOp) -> ir.Expr:
        a, b = self.expr(e.a), self.expr(e.b)
        if a.lanes == 1 and b.lanes == 1:
            return ir.BinOp(e.op, a, b)
        ints = not e.dtype.is_float
        if ints and e.op in ("+", "-"):
            if isinstance(a, ir.Ramp) and b.lanes == 1:
                return ir.Ramp(ir.BinOp(e.op, a.base, b), a.stride, a.lanes)
            if isinstance(b, ir.Ramp) and a.lanes == 1 and e.op == "+":
                return ir.Ramp(ir.BinOp("+", a, b.base), b.stride, b.lanes)
            if isinstance(a, ir.Ramp) and isinstance(b, ir.Ramp):
                return ir.Ramp(ir.BinOp(e.op, a.base, b.base), ir.BinOp(e.op, a.stride, b.stride), a.lanes)
        if ints and e.op == "*":
            if isinstance(a, ir.Ramp) and b.lanes == 1:
                return ir.Ramp(ir.BinOp("*", a.base, b), ir.BinOp("*", a.stride, b), a.lanes)
            if isinstance(b, ir.Ramp) and a.lanes == 1:
                return ir.Ramp(ir.BinOp("*", a, b.base), ir.BinOp("*", a, b.stride), b.lanes)
        a, b = _common(a, b)
        return ir.BinOp(e.op, _widen(a, self.lanes), _widen(b, self.lanes))

    def visit_Cmp(self, e: ir.Cmp) -> ir.Expr:
        a, b = self.expr(e.a), self.expr(e.b)
        if a.lanes == 1 and b.lanes == 1:
            return ir.Cmp(e.op, a, b)
        a, b = _common(a, b)
        return ir.Cmp(e.op, _widen(a, self.lanes), _widen(b, self.lanes))

    def visit_Logic(self, e: ir.Logic) -> ir.Expr:
        args = tuple(self.expr(a) for a in e.args)
        if any(a.lanes > 1 for a in args):
            raise CannotVectorize("vector logic")
        return ir.Logic(e.op, args)

    def visit_Select(self, e: ir.Select) -> ir.Expr:
        c, a, b = self.expr(e.cond), self.expr(e.a), self.expr(e.b)
        if c.lanes == 1 and a.lanes == 1 and b.lanes == 1:
            return ir.Select(c, a, b)
        if e.dtype.is_bool:
            raise CannotVectorize("a select of bool values")
        a, b = _common(a, b)
        if c.lanes > 1:
            width = _cmp_width(c)
            if width != a.dtype.itemsize:
                raise CannotVectorize("a vector condition of another element size")
            # both sides are evaluated in every lane: the loads a lane's condition guards must stay
            # inside their buffers where it does not hold
            a, b = _InBounds().expr(a), _InBounds().expr(b)
        return ir.Select(c, _widen(a, self.lanes), _widen(b, self.lanes))

    def visit_Cast(self, e: ir.Cast) -> ir.Expr:
        a = self.expr(e.a)
        if a.lanes > 1 and e.dtype.is_bool:
            raise CannotVectorize("a cast to bool across lanes")
        return ir.Cast(e.dtype, a)

    def visit_Call(self, e: ir.Call) -> ir.Expr:
        args = tuple(self.expr(a) for a in e.args)
        if any(a.lanes > 1 for a in args):
            raise CannotVectorize(f"call to {e.name}")
        return ir.Call(e.name, args, e.dtype)

    def visit_Load(self, e: ir.Load) -> ir.Expr:
        idx = tuple(self.expr(i) for i in e.index)
        if e.buffer.dtype.is_bool and any(i.lanes > 1 for i in idx):
            raise CannotVectorize(f"a vector load of the bool buffer {e.buffer.name}")
        return ir.Load(e.buffer, idx)

    def visit_Store(self, s: ir.Store) -> ir.Stmt:
        idx = tuple(self.expr(i) for i in s.index)
        v = self.expr(s.value)
        if v.lanes > 1 and all(i.lanes == 1 for i in idx):
            raise CannotVectorize(f"a reduction into {s.buffer.name}")
        if s.buffer.dtype.is_bool and (v.lanes > 1 or any(i.lanes > 1 for i in idx)):
            raise CannotVectorize(f"a vector store into the bool buffer {s.buffer.name}")
        if v.lanes > 1 and _vector_type(v.dtype) != _vector_type(s.buffer.dtype):
            v = ir.Cast(s.buffer.dtype, v)  # C converts an assigned scalar by itself, not a vector
        return ir.Store(s.buffer, idx, v)

    def visit_For(self, s: ir.For) -> ir.Stmt:
        lo, ext = self.expr(s.lo), self.expr(s.extent)
        if lo.lanes > 1 or ext.lanes > 1:
            raise CannotVectorize("a loop whose bounds vary across lanes")
        return replace(s, lo=lo, extent=ext, body=self.stmt(s.body))

    def visit_If(self, s: ir.If) -> ir.Stmt:
        c = self.expr(s.cond)
        if c.lanes > 1:
            raise CannotVectorize("a condition that varies across lanes")
        return ir.If(c, self.stmt(s.then), self.stmt(s.orelse) if s.orelse is not None else None)

    def visit_LetStmt(self, s: ir.LetStmt) -> ir.Stmt:
        v = self.expr(s.value)
        if v.lanes > 1:
            raise CannotVectorize("a vector binding")
        return ir.LetStmt(s.var, v, self.stmt(s.body))

    def visit_Allocate(self, s: ir.Allocate) -> ir.Stmt:
        raise CannotVectorize("an allocation inside the loop")

    def visit_Evaluate(self, s: ir.Evaluate) -> ir.Stmt:
        raise CannotVectorize("a call statement inside the loop")


class _InBounds(ir.Mutator):
    """Vector loads whose lanes a select may discard: each lane's index clamped into its buffer, so
    that a lane evaluated for nothing reads an element of the buffer, never past it (the lanes a
    select keeps are those whose guard holds, whose indices the clamp leaves alone)."""

    def visit_Load(self, e: ir.Load) -> ir.Expr:
        idx = tuple(self.expr(i) for i in e.index)
        if len(idx) != 1 or idx[0].lanes == 1:
            return ir.Load(e.buffer, idx)
        (i,) = idx
        size = e.buffer.shape[0] if e.buffer.shape else ir.const(1)
        for d in e.buffer.shape[1:]:
            size = ir.BinOp("*", size, d)
        last = simplify_expr(ir.BinOp("-", size, ir.const(1)))
        # bounds and index of one vector type (an index read from an int32 array is an int32 vector)
        zero = ir.Broadcast(ir.const(0), i.lanes)
        i, zero = _common(i, zero)
        i, end = _common(i, ir.Broadcast(last, i.lanes))
        clamped = ir.BinOp("min", ir.BinOp("max", i, zero), end)
        return ir.Load(e.buffer, (clamped,))


def _widest(body: ir.Stmt) -> int:
    sizes = [st.buffer.dtype.itemsize for st in ir.walk_stmt(body) if isinstance(st, ir.Store)]
    sizes += [e.buffer.dtype.itemsize for e in ir.all_exprs(body) if isinstance(e, ir.Load)]
    return max(sizes, default=4)


def _cmp_width(c: ir.Expr) -> int:
    if isinstance(c, ir.Cmp):
        return c.a.dtype.itemsize
    return 0


class _Vectorize(ir.Mutator):
    def __init__(self, native_bits: int, max_lanes: int):
        self.native_bits = native_bits
        self.max_lanes = max_lanes

    def visit_For(self, s: ir.For) -> ir.Stmt:
        body = self.stmt(s.body)
        if s.kind != "vectorize":
            return replace(s, body=body)
        ext = simplify_expr(s.extent)
        if not isinstance(ext, ir.Const):
            return _scalar(s, body)
        lanes = int(ext.value)
        if lanes < 2 or lanes & (lanes - 1) or lanes > self.max_lanes:
            return _scalar(s, body)
        # wider than the machine: one native-width vector per chunk, so that every access of a
        # buffer has the same width (register promotion needs that)
        native = max(2, self.native_bits // (8 * _widest(body)))
        width = min(lanes, native)
        try:
            chunks = [_Widen(s.var.name, width, ir.BinOp("+", s.lo, ir.const(k * width))).stmt(body)
                      for k in range(lanes // width)]
        except CannotVectorize:
            return _scalar(s, body)
        return ir.block(chunks)


def _scalar(s: ir.For, body: ir.Stmt) -> ir.For:
    """A ``vectorize`` loop left scalar keeps its SIMD hint for the C compiler, unless a parallel loop
    runs inside it: OpenMP allows no parallel region inside a simd loop (the parallel loop wins)."""
    nested = any(isinstance(st, ir.For) and st.kind == "parallel" for st in ir.walk_stmt(body))
    return replace(s, body=body, kind="serial" if nested else s.kind)


def vectorize_loops(s: ir.Stmt, target: CPUTarget) -> ir.Stmt:
    """Turn vectorizable ``vectorize`` loops into vector statements (others keep a SIMD hint)."""
    return _Vectorize(target.vector_bits, MAX_LANES).stmt(s)
