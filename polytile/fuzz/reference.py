"""An independent NumPy evaluator of a ``pt.Func``, and the comparison of a kernel's outputs with it.

The evaluator walks each computation's expression tree over its whole domain at once (NumPy
arrays over the iteration space; a reduction adds one array dimension per reduce axis, masked to
its bounds); it shares nothing with polytile's lowering or code generation. Integers are computed
exactly. Floats are computed in float64 together with a bound on how far a correct
implementation in the program's own types may be from that value (a running error analysis: each
operation adds its rounding error, a function adds its sensitivity to its argument's error, a sum
of n terms adds ``n·u·Σ|x|``). Comparisons of outputs are exact for integers and booleans and
within that bound for floats. Where a discontinuous operation (a comparison, a float-to-integer
cast, ``floor``) meets an argument too close to its threshold for the bound to decide, the
result is marked unknown and not compared.

Integer ``+ - *`` (and sums and products) wrap to their type, as NumPy's and polytile's do
(``wrapped``). NaN propagates where inputs hold NaN, and an output must be NaN exactly where the
reference is; there a value of unknown bound may be NaN, so 0 times it, or a sum that may or may
not keep a NaN term, is unknown too.

The evaluator also checks that the program means something on the given inputs: every read it
needs lies inside its tensor and was written, no float overflows or becomes NaN from inputs
without NaN. A program that fails this is the generator's fault (``InvalidProgram``), not
polytile's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..dtypes import DType
from ..dtypes import bool_ as BOOL
from ..lang import expr as lx
from ..lang.func import Func
from ..lang.tensor import ComputeTensor, Tensor
from .inputs import SENTINEL


class InvalidProgram(Exception):
    """The program has no defined result on these inputs (an out-of-bounds or unwritten read, an
    integer overflow, a float overflow or NaN): the fuzzer generated something it should not have."""


class Mismatch(AssertionError):
    """A kernel's output differs from the reference."""


# --- the arithmetic polytile documents --------------------------------------------------------------

def int_divide(a: np.ndarray, b: np.ndarray, op: str) -> np.ndarray:
    """Integer ``a // b`` or ``a % b``: floor division and its modulo (the sign of the divisor), as
    NumPy and Python define them. Division by zero gives 0 for both (NumPy's result); this is the
    one place that rule lives."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.floor_divide(a, b) if op == "//" else np.remainder(a, b)
    return np.where(b == 0, 0, out)


_UNIT = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
_TINY = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float32": 2.0 ** -149, "float64": 2.0 ** -1074}
_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
        "float64": 1.7976931348623157e308}
_FN_ULPS = 8  # libm and vector-math functions are within a few ulps; half precision rounds once more


def wrapped(v: np.ndarray, d: DType) -> np.ndarray:
    """Integers ``v`` (int64, where int64 arithmetic wraps by itself) wrapped into ``d``'s range."""
    if d.bits >= 64 or d.is_bool:
        return v
    lo, hi = int_range(d)
    return (v - lo) % (hi - lo + 1) + lo


def int_range(d: DType) -> tuple[int, int]:
    if d.is_bool:
        return 0, 1
    if d.kind == "uint":
        return 0, (1 << d.bits) - 1
    return -(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1


def rounding(v: np.ndarray, d: DType) -> np.ndarray:
    """The error of rounding the real ``v`` to type ``d`` once."""
    u, tiny = _UNIT[d.name], _TINY[d.name]
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(np.isfinite(v), u * np.abs(v) + tiny, 0.0)


def rounded(v: np.ndarray, e: np.ndarray, d: DType, zero_is_exact: object = True) -> np.ndarray:
    """The bound ``e`` of the real ``v`` once rounded to type ``d``. A zero known exactly (bound 0)
    rounds to itself in every type, where ``zero_is_exact`` says a float64 zero is the real result
    (not the underflow of a product or quotient of nonzero values)."""
    return e + np.where((e == 0) & (v == 0) & zero_is_exact, 0.0, rounding(v, d))


def _bound(v: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The bound ``e`` of the values ``v`` with no NaN in it. Arithmetic on a NaN value (a sum over
    a NaN) gives a NaN bound; that NaN is the expected value itself, so its bound is 0 (exactly NaN).
    A NaN bound on a number is unknown. Left NaN, it leaked into what a select with an undecided
    condition or a max of bounds keeps, and read as exact (seed 143 cases 892 and 1431)."""
    with np.errstate(invalid="ignore"):
        nan_value = np.isnan(v.astype(np.float64)) if v.dtype.kind == "f" else np.zeros(np.shape(v), bool)
    return np.where(np.isnan(e), np.where(nan_value, 0.0, np.inf), e)


def _mul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x * y`` for error terms, where 0 times an unknown (inf) bound is 0."""
    with np.errstate(invalid="ignore"):
        p = np.multiply(x, y)
    return np.where(np.isnan(p), 0.0, p)


# --- values -----------------------------------------------------------------------------------------

@dataclass
class Val:
    """Values of an expression over (a broadcast of) the iteration space: ``v`` exact integers or
    float64 reals, ``e`` the error bound (0 exact, inf unknown)."""

    v: np.ndarray
    e: np.ndarray
    dtype: DType

    @staticmethod
    def exact(v: object, dtype: DType) -> Val:
        arr = np.asarray(v)
        return Val(arr, np.zeros(arr.shape), dtype)


@dataclass
class TensorValue:
    """A computed tensor: values, error bounds and which elements its computation writes."""

    value: np.ndarray
    err: np.ndarray
    written: np.ndarray
    dtype: DType


def _as_int(e: np.ndarray) -> np.ndarray:
    """Integers are exact or unknown."""
    return np.where(e > 0, np.inf, 0.0)


class Evaluator:
    """Evaluates the computations of a Func in order; ``tensors`` holds every tensor's values."""

    def __init__(self, func: Func, args: Sequence[np.ndarray], params: Mapping[str, int]):
        self.func = func
        self.params = dict(params)
        self.tensors: dict[int, TensorValue] = {}
        self.nan_inputs = False  # NaN in the inputs: NaN results mean something
        for t, a in zip(func.inputs, args):
            d = t.dtype
            arr = np.asarray(a)
            vals = arr.astype(np.float64) if d.is_float else arr.astype(np.int64) if d.is_int else arr.astype(bool)
            self.nan_inputs |= bool(d.is_float and np.isnan(vals).any())
            self.tensors[id(t)] = TensorValue(vals, np.zeros(arr.shape), np.ones(arr.shape, bool), d)
        for comp in func.computations:
            self.tensors[id(comp)] = self.computation(comp)

    def value_of(self, t: Tensor) -> TensorValue:
        return self.tensors[id(t)]

    # --- a computation ---------------------------------------------------------------------------
    def computation(self, comp: ComputeTensor) -> TensorValue:
        shape = tuple(self.scalar(s) for s in comp.shape)
        red_axes = comp.reduce_axes
        ndim = len(shape) + len(red_axes)
        env: dict[int, Val] = {}
        for d, ax in enumerate(comp.axes):
            env[id(ax)] = Val.exact(np.arange(shape[d], dtype=np.int64).reshape(_at(d, shape[d], ndim)), ax.dtype)
        mask = np.ones(shape + (1,) * len(red_axes), bool)
        unknown = np.zeros_like(mask)
        if comp.where is not None:
            w = self.eval(comp.where, env, mask)
            unknown = mask & np.isinf(np.broadcast_to(w.e, mask.shape))
            mask = mask & np.broadcast_to(w.v, mask.shape).astype(bool)
            mask = mask | unknown
        body = self.eval(comp.body, env, mask, ndim=ndim, ndata=len(shape))
        if comp.epilogue is not None:  # what is stored: the epilogue of the complete sums
            env[id(comp.accumulated)] = body
            body = self.eval(comp.epilogue, env, mask, ndim=ndim, ndata=len(shape))
        d = comp.dtype
        v = np.broadcast_to(body.v, mask.shape).reshape(shape).copy()
        e = np.broadcast_to(body.e, mask.shape).reshape(shape).astype(np.float64)
        written = mask.reshape(shape)
        if d.is_float:
            self.check_float(v, written, d, comp.name)
            e = rounded(v, e, d)
        elif d.is_int:
            self.check_int(v, e, written, d, comp.name)
            e = _as_int(e)
        e = np.where(unknown.reshape(shape), np.inf, e)
        return TensorValue(np.where(written, v, 0), np.where(written, e, 0.0), written, d)

    def scalar(self, e: lx.Expr) -> int:
        val = self.eval(e, {}, np.ones((), bool))
        return int(val.v)

    # --- checks of meaning ------------------------------------------------------------------------
    def check_int(self, v: np.ndarray, e: np.ndarray, mask: np.ndarray, d: DType, what: str) -> None:
        lo, hi = int_range(d)
        vb = np.broadcast_to(v, np.broadcast_shapes(v.shape, mask.shape))
        m = np.broadcast_to(mask, vb.shape) & (np.broadcast_to(e, vb.shape) == 0)
        bad = m & ((vb < lo) | (vb > hi))
        if bad.any():
            raise InvalidProgram(f"{what}: integer value {vb[bad].flat[0]} leaves {d}")

    def check_float(self, v: np.ndarray, mask: np.ndarray, d: DType, what: str) -> None:
        vb = np.broadcast_to(v, np.broadcast_shapes(v.shape, mask.shape))
        m = np.broadcast_to(mask, vb.shape)
        if not self.nan_inputs and (m & np.isnan(vb)).any():
            raise InvalidProgram(f"{what}: NaN")
        big = m & np.isfinite(vb) & (np.abs(vb) > _MAX[d.name])
        if big.any():
            raise InvalidProgram(f"{what}: {vb[big].flat[0]} overflows {d}")

    # --- expressions ------------------------------------------------------------------------------
    def eval(self, e: lx.Expr, env: dict[int, Val], mask: np.ndarray, ndim: int = 0, ndata: int = 0) -> Val:
        """``e`` where ``mask`` holds (elsewhere its values are arbitrary but harmless)."""
        val = self.node(e, env, mask, ndim, ndata)
        return Val(val.v, _bound(val.v, val.e), val.dtype)

    def node(self, e: lx.Expr, env: dict[int, Val], mask: np.ndarray, ndim: int, ndata: int) -> Val:
        if isinstance(e, lx.Const):
            if not e.dtype.is_float:
                return Val.exact(e.value, e.dtype)
            v = np.asarray(float(e.value))
            return Val(v, np.abs(v - v.astype(e.dtype.numpy).astype(np.float64)), e.dtype)
        if isinstance(e, lx.IterVar) or (isinstance(e, lx.Var) and id(e) in env):  # (an epilogue's sums)
            return env[id(e)]
        if isinstance(e, lx.Param):
            return Val.exact(np.int64(self.params[e.name]), e.dtype)
        if isinstance(e, lx.Reduce):
            return self.reduce(e, env, mask, ndim, ndata)
        if isinstance(e, lx.Load):
            return self.load(e, env, mask)
        if isinstance(e, lx.Select):
            return self.select(e, env, mask)
        if isinstance(e, lx.Cast):
            return self.cast(e.dtype, self.eval(e.a, env, mask), mask, str(e))
        if isinstance(e, lx.BinOp):
            return self.binop(e, self.eval(e.a, env, mask), self.eval(e.b, env, mask), mask)
        if isinstance(e, lx.Cmp):
            return _compare(e.op, self.eval(e.a, env, mask), self.eval(e.b, env, mask))
        if isinstance(e, lx.Logic):
            return _logic(e.op, self.eval(e.a, env, mask), self.eval(e.b, env, mask))
        if isinstance(e, lx.Not):
            a = self.eval(e.a, env, mask)
            return Val(~a.v.astype(bool), a.e, e.dtype)
        if isinstance(e, lx.Call):
            return self.call(e, [self.eval(a, env, mask) for a in e.args], mask)
        raise InvalidProgram(f"the reference cannot evaluate {type(e).__name__} nodes")

    def load(self, e: lx.Load, env: dict[int, Val], mask: np.ndarray) -> Val:
        t = self.value_of(e.tensor)
        idx = [self.eval(i, env, mask) for i in e.indices]
        shape = np.broadcast_shapes(mask.shape, *(i.v.shape for i in idx))
        m = np.broadcast_to(mask, shape)
        unknown = np.zeros(shape, bool)
        clipped = []
        for d, (i, n) in enumerate(zip(idx, t.value.shape)):
            iv = np.broadcast_to(i.v, shape).astype(np.int64)
            unknown |= np.broadcast_to(np.isinf(i.e), shape)
            outside = m & ~unknown & ((iv < 0) | (iv >= n))
            if outside.any():
                at = tuple(int(x[0]) for x in np.nonzero(outside))
                raise InvalidProgram(f"{e}: index {d} is {iv[outside].flat[0]} (tensor {e.tensor.name} "
                                     f"has {n}) at {at}")
            clipped.append(np.clip(iv, 0, max(n - 1, 0)))
        if t.value.size == 0:
            if (m & ~unknown).any():
                raise InvalidProgram(f"{e}: a read of the empty tensor {e.tensor.name}")
            return Val(np.zeros(shape, t.value.dtype), np.full(shape, np.inf), t.dtype)
        key = tuple(clipped)
        unwritten = m & ~unknown & ~t.written[key]
        if unwritten.any():
            raise InvalidProgram(f"{e}: reads an element of {e.tensor.name} that is never written")
        err = np.where(unknown, np.inf, t.err[key])
        return Val(t.value[key], err, t.dtype)

    def select(self, e: lx.Select, env: dict[int, Val], mask: np.ndarray) -> Val:
        c = self.eval(e.cond, env, mask)
        cv, unk = c.v.astype(bool), np.isinf(c.e)
        a = self.eval(e.a, env, mask & (cv | unk))
        b = self.eval(e.b, env, mask & (~cv | unk))
        v = np.where(cv, a.v, b.v)
        with np.errstate(invalid="ignore"):
            gap = np.abs(a.v.astype(np.float64) - b.v.astype(np.float64))
        gap = np.where(np.isnan(gap), np.inf, gap)
        err = np.where(unk, np.maximum(a.e, b.e) + gap, np.where(cv, a.e, b.e))
        if not e.dtype.is_float:
            err = _as_int(err)
        return Val(v, err, e.dtype)

    def binop(self, e: lx.BinOp, a: Val, b: Val, mask: np.ndarray) -> Val:
        d, op = e.dtype, e.op
        if not d.is_float:
            x, y = a.v.astype(np.int64), b.v.astype(np.int64)
            if op in ("//", "%"):
                v = int_divide(x, y, op)
            else:
                with np.errstate(over="ignore"):
                    v = wrapped({"+": np.add, "-": np.subtract, "*": np.multiply}[op](x, y), d)
            err = _as_int(a.e + b.e)
            self.check_int(v, err, mask, d, str(e))
            return Val(v, err, d)
        x, y = a.v.astype(np.float64), b.v.astype(np.float64)
        ax, ay = np.abs(x), np.abs(y)
        with np.errstate(all="ignore"):
            if op == "+":
                v, err = x + y, a.e + b.e
            elif op == "-":
                v, err = x - y, a.e + b.e
            elif op == "*":
                v, err = x * y, _mul(ax, b.e) + _mul(ay, a.e) + _mul(a.e, b.e)
                if self.nan_inputs:  # a factor of unknown bound may be NaN, and 0 * NaN is NaN (case 855)
                    err = np.where(np.isinf(a.e) | np.isinf(b.e), np.inf, err)
            elif op == "/":
                v = x / y
                room = ay - b.e
                err = np.where(room > 0, (a.e + _mul(np.abs(v), b.e)) / np.where(room > 0, room, 1.0), np.inf)
            else:
                raise InvalidProgram(f"{e}: operator {op} on floats")
            # x - x, 0 * y and 0 / y are exactly 0; a float64 zero from nonzero factors may be an underflow
            zero_is_exact = (x == 0) | (y == 0) if op == "*" else (x == 0) if op == "/" else True
        self.check_float(v, mask, d, str(e))
        return Val(v, rounded(v, err, d, zero_is_exact), d)

    def cast(self, d: DType, a: Val, mask: np.ndarray, what: str) -> Val:
        src = a.dtype
        if d.is_bool:
            v = a.v != 0
            return Val(v, np.where((a.e > 0) & (np.abs(a.v.astype(np.float64)) <= a.e), np.inf, 0.0), d)
        if d.is_float:
            v = a.v.astype(np.float64)
            if src.is_float:
                return Val(v, rounded(v, a.e, d), d)
            exact_err = np.abs(v - v.astype(d.numpy).astype(np.float64)) if d.name != "bfloat16" else rounding(v, d)
            self.check_float(v, mask, d, what)
            return Val(v, a.e + exact_err, d)
        if src.is_float:
            with np.errstate(invalid="ignore"):
                v = np.trunc(a.v)
                unk = (np.trunc(a.v - a.e) != v) | (np.trunc(a.v + a.e) != v)
            lo, hi = int_range(d)
            bad = mask & ~unk & ((v < lo) | (v > hi) | ~np.isfinite(v))
            if np.broadcast_to(bad, np.broadcast_shapes(bad.shape, mask.shape)).any():
                raise InvalidProgram(f"{what}: a float outside {d} is cast to it")
            return Val(np.where(np.isfinite(v), v, 0).astype(np.int64), np.where(unk, np.inf, 0.0), d)
        return Val(wrapped(a.v.astype(np.int64), d), a.e, d)

    def call(self, e: lx.Call, args: list[Val], mask: np.ndarray) -> Val:
        d, name = e.dtype, e.name
        if name in ("max", "min"):
            f = np.maximum if name == "max" else np.minimum
            v = f(args[0].v, args[1].v)
            err = np.maximum(args[0].e, args[1].e)
            return Val(v, err if d.is_float else _as_int(err), d)
        if name == "abs" and not d.is_float:
            v = wrapped(np.abs(args[0].v.astype(np.int64)), d)  # abs(MIN) == MIN
            self.check_int(v, args[0].e, mask, d, str(e))
            return Val(v, args[0].e, d)
        x = [a.v.astype(np.float64) for a in args]
        with np.errstate(all="ignore"):
            if name in ("floor", "ceil"):
                f = np.floor if name == "floor" else np.ceil
                v = f(x[0])
                unk = (f(x[0] - args[0].e) != v) | (f(x[0] + args[0].e) != v)
                err = np.where(unk, np.inf, 0.0)
            elif name == "abs":
                v, err = np.abs(x[0]), args[0].e
            elif name in ("sin", "cos"):
                v = np.sin(x[0]) if name == "sin" else np.cos(x[0])
                err = args[0].e + _FN_ULPS * rounding(v, d)
            elif name == "pow":
                v = np.power(x[0], x[1])
                err = _spread(lambda p, q: np.power(p, q), x, [a.e for a in args], v) + _FN_ULPS * rounding(v, d)
            elif name == "fma":
                v = x[0] * x[1] + x[2]
                err = (_mul(np.abs(x[0]), args[1].e) + _mul(np.abs(x[1]), args[0].e) + _mul(args[0].e, args[1].e)
                       + args[2].e + rounding(v, d))
            else:
                f = _MONOTONE[name]
                v = f(x[0])
                err = _spread(lambda p: f(p), x, [args[0].e], v) + _FN_ULPS * rounding(v, d)
        self.check_float(v, mask, d, str(e))
        return Val(v, err, d)

    def reduce(self, r: lx.Reduce, env: dict[int, Val], mask: np.ndarray, ndim: int, ndata: int) -> Val:
        env = dict(env)
        m = mask
        for k, ax in enumerate(r.axes):
            lo, hi = self.eval(ax.lo, env, m), self.eval(ax.hi, env, m)
            if np.isinf(lo.e).any() or np.isinf(hi.e).any():
                raise InvalidProgram(f"bounds of {ax.name} are not exact")
            shape = np.broadcast_shapes(m.shape, lo.v.shape, hi.v.shape)
            mb = np.broadcast_to(m, shape)
            lov, hiv = np.broadcast_to(lo.v, shape), np.broadcast_to(hi.v, shape)
            start = int(lov[mb].min()) if mb.any() else 0
            stop = int(hiv[mb].max()) if mb.any() else 0
            kk = np.arange(start, max(stop, start), dtype=np.int64).reshape(_at(ndata + k, max(stop - start, 0), ndim))
            env[id(ax)] = Val.exact(kk, ax.dtype)
            m = m & (lo.v <= kk) & (kk < hi.v)
        unknown_where = np.zeros((), bool)
        if r.where is not None:
            w = self.eval(r.where, env, m)
            unknown_where = m & np.isinf(w.e)
            m = m & (w.v.astype(bool) | unknown_where)
        body = self.eval(r.body, env, m)
        red = tuple(range(ndata, ndim))
        shape = np.broadcast_shapes(m.shape, body.v.shape)
        m = np.broadcast_to(m, shape)
        x = np.broadcast_to(body.v, shape)
        ex = np.broadcast_to(body.e, shape)
        sure = m & ~np.broadcast_to(unknown_where, shape)
        d = r.dtype
        ident = _identity(r.op, d)
        with np.errstate(all="ignore"):
            if r.op == "sum":
                v = np.where(sure, x, 0).sum(axis=red, keepdims=True)
                if d.is_float:
                    ax_ = np.abs(x.astype(np.float64))
                    n = m.sum(axis=red, keepdims=True)
                    err = (np.where(m, ex, 0.0).sum(axis=red, keepdims=True)
                           + n * _UNIT[d.name] * np.where(m, ax_, 0.0).sum(axis=red, keepdims=True) + n * _TINY[d.name]
                           + np.where(m & ~sure, ax_, 0.0).sum(axis=red, keepdims=True))
                    # a NaN term that the where= may or may not keep leaves the sum NaN or not: unknown
                    # (not a NaN bound, which compared as a number: seed 143 cases 4350, 3482, 9270, 855)
                    err = np.where((m & ~sure & np.isnan(x)).any(axis=red, keepdims=True), np.inf, err)
                else:
                    err = _as_int(np.where(m, ex, 0.0).sum(axis=red, keepdims=True)
                                  + (m & ~sure).sum(axis=red, keepdims=True))
            elif r.op == "prod":
                v = np.where(sure, x, 1).prod(axis=red, keepdims=True)
                if d.is_float:
                    n = m.sum(axis=red, keepdims=True)
                    mag = np.where(m, np.abs(x.astype(np.float64)), 1.0)
                    err = ((np.where(m, mag + ex, 1.0).prod(axis=red, keepdims=True)
                            * (1 + _UNIT[d.name]) ** n) - mag.prod(axis=red, keepdims=True) + n * _TINY[d.name])
                    err = np.where(np.isnan(err), np.inf, err)  # an unknown bound times a 0: unknown
                else:
                    err = _as_int(np.where(m, ex, 0.0).sum(axis=red, keepdims=True))
                err = np.where((m & ~sure).any(axis=red, keepdims=True), np.inf, err)
                # a factor that is surely in the product and exactly 0 makes it exactly 0 (as `_mul`
                # does for one product), whatever the other factors and their bounds
                exact_zero = (sure & (x == 0) & (ex == 0)).any(axis=red, keepdims=True)
                if self.nan_inputs:  # unless a factor of unknown bound may be NaN
                    exact_zero &= ~(m & np.isinf(ex)).any(axis=red, keepdims=True)
                err = np.where(exact_zero, 0.0, err)
            else:
                f = np.max if r.op == "max" else np.min
                v = f(np.where(sure, x, ident), axis=red, keepdims=True) if x.size else np.full(
                    [1 if a in red else s for a, s in enumerate(shape)], ident)
                err = np.where(m, ex, 0.0).max(axis=red, keepdims=True) if x.size else np.zeros_like(v, float)
                err = np.where((m & ~sure).any(axis=red, keepdims=True), np.inf, err)
                if not d.is_float:
                    err = _as_int(err)
        if d.is_float:
            self.check_float(v, mask, d, str(r))
        else:
            v = wrapped(v, d)
            self.check_int(v, err, mask, d, str(r))
        return Val(v, err, d)


def _at(pos: int, n: int, ndim: int) -> tuple[int, ...]:
    return tuple(n if k == pos else 1 for k in range(ndim))


def _identity(op: str, d: DType) -> float | int:
    if op == "sum":
        return 0
    if op == "prod":
        return 1
    if d.is_float:
        return -math.inf if op == "max" else math.inf
    lo, hi = int_range(d)
    return lo if op == "max" else hi


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


_erf = np.vectorize(math.erf, otypes=[np.float64])

_MONOTONE = {
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "tanh": np.tanh, "sigmoid": _sigmoid,
    "erf": _erf,
}


def _spread(f, x: list[np.ndarray], e: list[np.ndarray], v: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """How far ``f`` moves when each argument moves by its error bound (the corners of the box:
    exact for functions monotone in each argument)."""
    worst = np.zeros(np.broadcast_shapes(v.shape, *(a.shape for a in x)))
    corners = [[-1.0, 1.0]] * len(x)
    for signs in np.array(np.meshgrid(*corners)).reshape(len(x), -1).T:
        with np.errstate(all="ignore"):
            moved = f(*[a + s * err for a, s, err in zip(x, signs, e)])
            gap = np.abs(moved - v)
        worst = np.maximum(worst, np.where(np.isnan(gap), np.inf, gap))
    unknown = np.zeros(worst.shape, bool)
    for err in e:
        unknown |= np.broadcast_to(np.isinf(err), worst.shape)
    return np.where(unknown, np.inf, worst)


def _compare(op: str, a: Val, b: Val) -> Val:
    x, y = a.v, b.v
    v = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
         "==": np.equal, "!=": np.not_equal}[op](x, y)
    slack = a.e + b.e
    with np.errstate(invalid="ignore"):
        gap = np.abs(x.astype(np.float64) - y.astype(np.float64))
    gap = np.where(np.isnan(gap), np.inf, gap)  # two equal infinities are exact
    unknown = np.isinf(slack) | ((slack > 0) & (gap <= slack))
    return Val(v, np.where(unknown, np.inf, 0.0), BOOL)


def _logic(op: str, a: Val, b: Val) -> Val:
    av, bv = a.v.astype(bool), b.v.astype(bool)
    ua, ub = np.isinf(a.e), np.isinf(b.e)
    if op == "&&":
        v = av & bv
        decided = (~av & ~ua) | (~bv & ~ub)  # one side surely false
    else:
        v = av | bv
        decided = (av & ~ua) | (bv & ~ub)  # one side surely true
    unknown = (ua | ub) & ~decided
    return Val(v, np.where(unknown, np.inf, 0.0), BOOL)


# --- the public checks ------------------------------------------------------------------------------

def evaluate(func: Func, args: Sequence[np.ndarray], params: Mapping[str, int] | None = None
             ) -> dict[str, TensorValue]:
    """Every computed tensor of ``func`` on inputs ``args``, by name."""
    ev = Evaluator(func, args, params or {})
    return {c.name: ev.value_of(c) for c in func.computations}


def differences(func: Func, args: Sequence[np.ndarray], outs: Sequence[np.ndarray],
                params: Mapping[str, int] | None = None, limit: int = 3) -> list[str]:
    """What is wrong in a kernel's outputs ``outs`` (arrays that held ``SENTINEL`` before the call),
    one line per wrong output naming its first few wrong elements; empty when all are right."""
    ref = evaluate(func, args, params)
    problems = []
    for t, out in zip(func.outputs, outs):
        r = ref[t.name]
        got = np.asarray(out)
        if got.shape != r.value.shape:
            problems.append(f"output {t.name}: shape {got.shape}, expected {r.value.shape}")
            continue
        wrong, expected, tol = _wrong(r, got)
        if wrong.any():
            idx = np.argwhere(wrong)[:limit]
            shown = "; ".join(f"{tuple(int(x) for x in i)}: got {_item(got[tuple(i)])}, expected "
                              f"{_item(expected[tuple(i)])}" + (f" ± {tol[tuple(i)]:.3g}" if tol[tuple(i)] else "")
                              for i in idx)
            problems.append(f"output {t.name}: {int(wrong.sum())} of {wrong.size} elements wrong ({shown})")
    return problems


def _item(x: object) -> str:
    v = np.asarray(x).astype(np.float64).item() if np.asarray(x).dtype.kind == "V" else np.asarray(x).item()
    return repr(v)


def _wrong(r: TensorValue, got: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which elements of ``got`` are wrong, what was expected and how far off it may be."""
    as_compared = np.float64 if r.dtype.is_float else np.int64 if r.dtype.is_int else bool
    sentinel = np.asarray(SENTINEL).astype(r.dtype.numpy).astype(as_compared)
    expected = np.where(r.written, r.value, sentinel).astype(as_compared)
    err = np.where(r.written, r.err, 0.0)
    if not r.dtype.is_float:
        return ~np.isinf(err) & (got.astype(as_compared) != expected), expected, np.zeros(err.shape)
    g = got.astype(np.float64)
    tol = np.where(err > 0, 4.0 * err + 4.0 * _TINY[r.dtype.name], 0.0)
    with np.errstate(invalid="ignore"):
        close = (g == expected) | (np.abs(g - expected) <= np.maximum(tol, 4.0 * _TINY[r.dtype.name]))
    close |= np.isinf(err)
    nan_got, nan_expected = np.isnan(g), np.isnan(expected)
    # NaN exactly where NumPy's is, unless unknown (a where= or select on a comparison that NaN or a
    # tie leaves undecided: seed 141 case 66, a kernel that rightly kept an element outside its domain)
    close = np.where(nan_got | nan_expected, (nan_got & nan_expected) | np.isinf(err), close)
    return ~close, expected, tol


def check(func: Func, args: Sequence[np.ndarray], outs: Sequence[np.ndarray],
          params: Mapping[str, int] | None = None) -> None:
    """Raise ``Mismatch`` naming the wrong elements if ``outs`` differ from the reference."""
    problems = differences(func, args, outs, params)
    if problems:
        raise Mismatch("; ".join(problems))
