"""Expressions of the algorithm language: constants, iterators, parameters, arithmetic and tensor reads.

Nodes are immutable and compared by identity; Python operators build new nodes. ``==`` builds a
comparison node, so expressions are never used as truth values (``if a == b`` raises).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Union

from .. import dtypes
from ..dtypes import DType
from ..errors import LanguageError

if TYPE_CHECKING:
    from .tensor import Tensor

ExprLike = Union["Expr", int, float, bool]


class Expr:
    """Base class of every expression node."""

    __slots__ = ()
    dtype: DType

    # --- arithmetic -------------------------------------------------------------------------
    def __add__(self, other: ExprLike) -> Expr:
        return binary("+", self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return binary("+", other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return binary("-", self, other)

    def __rsub__(self, other: ExprLike) -> Expr:
        return binary("-", other, self)

    def __mul__(self, other: ExprLike) -> Expr:
        return binary("*", self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return binary("*", other, self)

    def __truediv__(self, other: ExprLike) -> Expr:
        return binary("/", self, other)

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return binary("/", other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return binary("//", self, other)

    def __rfloordiv__(self, other: ExprLike) -> Expr:
        return binary("//", other, self)

    def __mod__(self, other: ExprLike) -> Expr:
        return binary("%", self, other)

    def __rmod__(self, other: ExprLike) -> Expr:
        return binary("%", other, self)

    def __neg__(self) -> Expr:
        return binary("-", Const(0, self.dtype), self)

    def __pos__(self) -> Expr:
        return self

    def __abs__(self) -> Expr:
        return call("abs", self)

    # --- comparisons and logic --------------------------------------------------------------
    def __lt__(self, other: ExprLike) -> Expr:
        return compare("<", self, other)

    def __le__(self, other: ExprLike) -> Expr:
        return compare("<=", self, other)

    def __gt__(self, other: ExprLike) -> Expr:
        return compare(">", self, other)

    def __ge__(self, other: ExprLike) -> Expr:
        return compare(">=", self, other)

    def __eq__(self, other: object) -> Expr:  # type: ignore[override]
        return compare("==", self, other)  # type: ignore[arg-type]

    def __ne__(self, other: object) -> Expr:  # type: ignore[override]
        return compare("!=", self, other)  # type: ignore[arg-type]

    def __and__(self, other: ExprLike) -> Expr:
        return logical("&&", self, other)

    def __rand__(self, other: ExprLike) -> Expr:
        return logical("&&", other, self)

    def __or__(self, other: ExprLike) -> Expr:
        return logical("||", self, other)

    def __ror__(self, other: ExprLike) -> Expr:
        return logical("||", other, self)

    def __invert__(self) -> Expr:
        return Not(as_expr(self))

    def __bool__(self) -> bool:
        raise LanguageError(
            f"the expression {self} has no truth value while the algorithm is being written; "
            "use pt.select(cond, a, b) for a choice and & | ~ for logic")

    __hash__ = object.__hash__

    def astype(self, dtype: object) -> Expr:
        return cast(dtype, self)

    def __repr__(self) -> str:
        from .printer import expr_str
        return expr_str(self)


class Const(Expr):
    __slots__ = ("value", "dtype")

    def __init__(self, value: int | float | bool, dtype: DType):
        if dtype.is_float:
            value = float(value)
        elif dtype.is_bool:
            value = bool(value)
        else:
            if isinstance(value, float) and not float(value).is_integer():
                raise LanguageError(f"constant {value} does not fit the integer type {dtype}")
            value = int(value)
        self.value = value
        self.dtype = dtype


class Var(Expr):
    """A named integer: loop iterators and parameters derive from this."""

    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: DType = dtypes.INDEX):
        self.name = name
        self.dtype = dtype


class IterVar(Var):
    """A loop iterator of a computation: a data axis or a reduction axis over [lo, hi)."""

    __slots__ = ("lo", "hi", "kind")

    def __init__(self, name: str, lo: Expr, hi: Expr, kind: str):
        super().__init__(name)
        self.lo = lo
        self.hi = hi
        self.kind = kind  # "data" or "reduce"

    @property
    def is_reduce(self) -> bool:
        return self.kind == "reduce"


class Param(Var):
    """A symbolic size, bound when the kernel is called (``kern(..., N=512)`` or from array shapes)."""

    __slots__ = ()


class BinOp(Expr):
    __slots__ = ("op", "a", "b", "dtype")

    def __init__(self, op: str, a: Expr, b: Expr, dtype: DType):
        self.op, self.a, self.b, self.dtype = op, a, b, dtype


class Cmp(Expr):
    __slots__ = ("op", "a", "b", "dtype")

    def __init__(self, op: str, a: Expr, b: Expr):
        self.op, self.a, self.b, self.dtype = op, a, b, dtypes.bool_


class Logic(Expr):
    __slots__ = ("op", "a", "b", "dtype")

    def __init__(self, op: str, a: Expr, b: Expr):
        self.op, self.a, self.b, self.dtype = op, a, b, dtypes.bool_


class Not(Expr):
    __slots__ = ("a", "dtype")

    def __init__(self, a: Expr):
        if not a.dtype.is_bool:
            raise LanguageError(f"~ needs a boolean operand, got {a} of type {a.dtype}")
        self.a, self.dtype = a, dtypes.bool_


class Select(Expr):
    __slots__ = ("cond", "a", "b", "dtype")

    def __init__(self, cond: Expr, a: Expr, b: Expr):
        self.cond, self.a, self.b, self.dtype = cond, a, b, a.dtype


class Cast(Expr):
    __slots__ = ("a", "dtype")

    def __init__(self, dtype: DType, a: Expr):
        self.a, self.dtype = a, dtype


class Call(Expr):
    """A math function: exp, log, sqrt, tanh, erf, abs, max, min, pow, floor, ceil, sigmoid…"""

    __slots__ = ("name", "args", "dtype")

    def __init__(self, name: str, args: tuple[Expr, ...], dtype: DType):
        self.name, self.args, self.dtype = name, args, dtype


class Load(Expr):
    """A read of a tensor element."""

    __slots__ = ("tensor", "indices", "dtype")

    def __init__(self, tensor: Tensor, indices: tuple[Expr, ...]):
        self.tensor, self.indices, self.dtype = tensor, indices, tensor.dtype


class Reduce(Expr):
    """A reduction (sum, max, min, prod) of ``body`` over ``axes``, counting only points where ``where`` holds."""

    __slots__ = ("op", "body", "axes", "where", "dtype")

    def __init__(self, op: str, body: Expr, axes: tuple[IterVar, ...], where: Expr | None):
        self.op, self.body, self.axes, self.where, self.dtype = op, body, axes, where, body.dtype

    def identity(self) -> Const:
        return reduce_identity(self.op, self.dtype)


def reduce_identity(op: str, dtype: DType) -> Const:
    if op == "sum":
        return Const(0, dtype)
    if op == "prod":
        return Const(1, dtype)
    if dtype.is_float:
        return Const(-math.inf if op == "max" else math.inf, dtype)
    info_min = -(1 << (dtype.bits - 1)) if dtype.kind == "int" else 0
    info_max = (1 << (dtype.bits - 1)) - 1 if dtype.kind == "int" else (1 << dtype.bits) - 1
    if dtype.is_bool:
        return Const(op == "min", dtype)
    return Const(info_min if op == "max" else info_max, dtype)


# --- construction helpers -----------------------------------------------------------------------

def as_expr(value: ExprLike, like: DType | None = None) -> Expr:
    """Wrap a Python number as a constant, typed like ``like`` when given (weak scalar typing).
    NumPy's scalars (``np.int64(5)``, a size from ``a.shape[0] // 2``) are numbers too."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, numbers.Number) and not isinstance(value, (bool, int, float)) and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool):
        return Const(value, dtypes.bool_)
    if isinstance(value, int):
        if like is not None and not like.is_bool:
            return Const(value, like)
        return Const(value, dtypes.INDEX)
    if isinstance(value, float):
        if like is not None and like.is_float:
            return Const(value, like)
        return Const(value, dtypes.float32)
    from .tensor import Tensor
    if isinstance(value, Tensor):
        raise LanguageError(f"tensor {value.name} is used as a value; index it, e.g. {value.name}[i, j]")
    raise LanguageError(f"cannot use {value!r} (a {type(value).__name__}) in an expression")


def _operands(a: ExprLike, b: ExprLike) -> tuple[Expr, Expr]:
    if isinstance(a, Expr) and not isinstance(b, Expr):
        return a, as_expr(b, a.dtype)
    if isinstance(b, Expr) and not isinstance(a, Expr):
        return as_expr(a, b.dtype), b
    return as_expr(a), as_expr(b)


def _coerce(e: Expr, dtype: DType) -> Expr:
    return e if e.dtype == dtype else Cast(dtype, e)


def binary(op: str, a: ExprLike, b: ExprLike) -> Expr:
    x, y = _operands(a, b)
    dtype = dtypes.promote(x.dtype, y.dtype)
    if dtype.is_bool:
        dtype = dtypes.int32
    if op == "/" and not dtype.is_float:
        raise LanguageError(f"'/' between integers ({x} / {y}); use // for floor division or cast to a float")
    if op in ("//", "%") and dtype.is_float:
        raise LanguageError(f"'{op}' needs integer operands, got {x.dtype} and {y.dtype}")
    return BinOp(op, _coerce(x, dtype), _coerce(y, dtype), dtype)


def compare(op: str, a: ExprLike, b: ExprLike) -> Expr:
    x, y = _operands(a, b)
    dtype = dtypes.promote(x.dtype, y.dtype)
    return Cmp(op, _coerce(x, dtype), _coerce(y, dtype))


def logical(op: str, a: ExprLike, b: ExprLike) -> Expr:
    x, y = as_expr(a), as_expr(b)
    for e in (x, y):
        if not e.dtype.is_bool:
            raise LanguageError(f"'{'&' if op == '&&' else '|'}' needs boolean operands; {e} is {e.dtype}")
    return Logic(op, x, y)


def select(cond: ExprLike, a: ExprLike, b: ExprLike) -> Expr:
    """``a`` where ``cond`` holds, else ``b`` (only the chosen side is evaluated)."""
    c = as_expr(cond)
    if not c.dtype.is_bool:
        raise LanguageError(f"pt.select needs a boolean condition, got {c} of type {c.dtype}")
    x, y = _operands(a, b)
    dtype = dtypes.promote(x.dtype, y.dtype)
    return Select(c, _coerce(x, dtype), _coerce(y, dtype))


def cast(dtype: object, a: ExprLike) -> Expr:
    d = dtypes.as_dtype(dtype)
    e = as_expr(a, d)
    return e if e.dtype == d else Cast(d, e)


FLOAT_FUNCS = {"exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "sin", "cos", "floor", "ceil",
               "exp2", "log2", "pow", "fma"}
ANY_FUNCS = {"abs", "max", "min"}


def call(name: str, *args: ExprLike) -> Expr:
    if name not in FLOAT_FUNCS | ANY_FUNCS:
        raise LanguageError(f"unknown math function {name!r}")
    if name in ("max", "min", "pow"):
        if len(args) != 2:
            raise LanguageError(f"pt.{name} takes two arguments, got {len(args)}")
        x, y = _operands(args[0], args[1])
        dtype = dtypes.promote(x.dtype, y.dtype)
        operands: tuple[Expr, ...] = (_coerce(x, dtype), _coerce(y, dtype))
    elif name == "fma":
        ops = [as_expr(a) for a in args]
        dtype = ops[0].dtype
        for o in ops[1:]:
            dtype = dtypes.promote(dtype, o.dtype)
        operands = tuple(_coerce(o, dtype) for o in ops)
    else:
        if len(args) != 1:
            raise LanguageError(f"pt.{name} takes one argument, got {len(args)}")
        operands = (as_expr(args[0]),)
        dtype = operands[0].dtype
    if name in FLOAT_FUNCS and not dtype.is_float:
        dtype = dtypes.float32
        operands = tuple(_coerce(o, dtype) for o in operands)
    return Call(name, operands, dtype)


# --- traversal ----------------------------------------------------------------------------------

def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (BinOp, Cmp, Logic)):
        return (e.a, e.b)
    if isinstance(e, (Not, Cast)):
        return (e.a,)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, Reduce):
        return (e.body,) + ((e.where,) if e.where is not None else ())
    return ()


def walk(e: Expr) -> Iterator[Expr]:
    """Every node of ``e``, parents before children."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def rebuild(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up; ``fn`` may return a replacement for a node (or None to keep it)."""
    memo: dict[int, Expr] = {}

    def go(node: Expr) -> Expr:
        key = id(node)
        if key in memo:
            return memo[key]
        replaced = fn(node)
        if replaced is not None:
            memo[key] = replaced
            return replaced
        kids = children(node)
        new_kids = tuple(go(k) for k in kids)
        if all(a is b for a, b in zip(kids, new_kids)):
            out = node
        else:
            out = _with_children(node, new_kids)
        memo[key] = out
        return out

    return go(e)


def _with_children(e: Expr, kids: Sequence[Expr]) -> Expr:
    if isinstance(e, BinOp):
        return BinOp(e.op, kids[0], kids[1], e.dtype)
    if isinstance(e, Cmp):
        return Cmp(e.op, kids[0], kids[1])
    if isinstance(e, Logic):
        return Logic(e.op, kids[0], kids[1])
    if isinstance(e, Not):
        return Not(kids[0])
    if isinstance(e, Cast):
        return Cast(e.dtype, kids[0])
    if isinstance(e, Select):
        return Select(kids[0], kids[1], kids[2])
    if isinstance(e, Call):
        return Call(e.name, tuple(kids), e.dtype)
    if isinstance(e, Load):
        return Load(e.tensor, tuple(kids))
    if isinstance(e, Reduce):
        return Reduce(e.op, kids[0], e.axes, kids[1] if len(kids) > 1 else None)
    raise AssertionError(type(e))


def substitute(e: Expr, mapping: dict[Var, Expr]) -> Expr:
    """Replace variables (by identity) with expressions."""
    if not mapping:
        return e
    return rebuild(e, lambda n: mapping.get(n) if isinstance(n, Var) else None)  # type: ignore[arg-type]


def free_vars(e: Expr) -> list[Var]:
    seen: dict[int, Var] = {}
    for n in walk(e):
        if isinstance(n, Var) and id(n) not in seen:
            seen[id(n)] = n
    return list(seen.values())


def loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]
