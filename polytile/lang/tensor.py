"""Tensors of the algorithm language: placeholders (inputs) and computations, reductions and parameters."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence

from .. import dtypes
from ..dtypes import DType
from ..errors import LanguageError
from .expr import (
    Const,
    Expr,
    ExprLike,
    IterVar,
    Load,
    Param,
    Reduce,
    Var,
    as_expr,
    cast,
    rebuild,
    walk,
)
from .names import check_name

_names = itertools.count()


def _fresh(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


class Tensor:
    """An n-dimensional array: an input (``placeholder``) or the result of ``compute``."""

    def __init__(self, name: str, shape: tuple[Expr, ...], dtype: DType):
        self.name = name
        self.shape = shape
        self.dtype = dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, index: object) -> Expr:
        idx = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, slice) for i in idx):
            raise LanguageError(f"tensor {self.name} is indexed with a slice; index it with one expression "
                                "per dimension (use a reduce axis to range over elements)")
        if len(idx) != self.ndim:
            raise LanguageError(f"tensor {self.name} has {self.ndim} dimension(s) but is indexed with "
                                f"{len(idx)} index(es)")
        exprs = []
        for d, i in enumerate(idx):
            e = as_expr(i)  # type: ignore[arg-type]
            if not e.dtype.is_int:
                raise LanguageError(f"index {d} of tensor {self.name} is {e} of type {e.dtype}; "
                                    "indices must be integers")
            exprs.append(e)
        return Load(self, tuple(exprs))

    def __repr__(self) -> str:
        dims = ", ".join(str(s) for s in self.shape)
        return f"{type(self).__name__}({self.name}, ({dims}), {self.dtype})"

    # Tensors are used as dictionary keys by identity.
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __bool__(self) -> bool:
        return True


class Placeholder(Tensor):
    """An input tensor. ``value_range`` and ``monotonic`` describe index arrays (CSR offsets…);
    they become constraints of the polyhedral model and are checked when the kernel is called."""

    def __init__(self, name: str, shape: tuple[Expr, ...], dtype: DType,
                 value_range: tuple[Expr, Expr] | None, monotonic: bool):
        super().__init__(name, shape, dtype)
        self.value_range = value_range
        self.monotonic = monotonic


class ComputeTensor(Tensor):
    """The result of ``compute``: ``body`` over data axes ``axes`` (optionally a reduction at the top),
    computed only where ``where`` holds (a non-rectangular domain). ``dtype`` is the type it is
    stored as: the body's type, or for a reduction stored narrower (``compute(store_dtype=...)``)
    another one, the sums rounded to it once, when they are complete (``value_dtype``: the type they
    are summed in). A reduction with an ``epilogue`` stores that expression of its complete sums
    (``accumulated``, a variable in it) and its data axes instead (``compute(epilogue=...)``), in the
    epilogue's type."""

    def __init__(self, name: str, shape: tuple[Expr, ...], axes: tuple[IterVar, ...], body: Expr,
                 where: Expr | None, dtype: DType | None = None,
                 epilogue: tuple[Var, Expr] | None = None):
        stored = dtype if dtype is not None else epilogue[1].dtype if epilogue is not None else body.dtype
        super().__init__(name, shape, stored)
        self.axes = axes
        self.body = body
        self.where = where
        self.accumulated, self.epilogue = epilogue if epilogue is not None else (None, None)

    @property
    def value_dtype(self) -> DType:
        """The type the body is computed in (a reduction: summed in); ``dtype`` may be narrower."""
        return self.body.dtype

    @property
    def narrowed(self) -> bool:
        """Whether the sums of this reduction are stored in another type than they are summed in."""
        return self.dtype != self.body.dtype

    @property
    def finished(self) -> bool:
        """Whether the sums of this reduction are finished once complete, before they are stored
        (rounded to a narrower type, or through an epilogue): a schedule then accumulates them in a
        write cache that holds all of its reduction."""
        return self.reduction is not None and (self.narrowed or self.epilogue is not None)

    @property
    def reduction(self) -> Reduce | None:
        return self.body if isinstance(self.body, Reduce) else None

    @property
    def reduce_axes(self) -> tuple[IterVar, ...]:
        red = self.reduction
        return red.axes if red is not None else ()

    def inputs(self) -> list[Tensor]:
        """Tensors read by this computation (body, condition and reduction bounds), in first-use order."""
        out: dict[int, Tensor] = {}
        roots: list[Expr] = [self.body]
        if self.where is not None:
            roots.append(self.where)
        for ax in self.reduce_axes:
            roots += [ax.lo, ax.hi]
        red = self.reduction
        if red is not None and red.where is not None:
            roots.append(red.where)
        if self.epilogue is not None:
            roots.append(self.epilogue)
        for r in roots:
            for n in walk(r):
                if isinstance(n, Load):
                    out.setdefault(id(n.tensor), n.tensor)
        return list(out.values())


def _shape(shape: object, what: str) -> tuple[Expr, ...]:
    dims = shape if isinstance(shape, (tuple, list)) else (shape,)
    out = []
    for d in dims:
        e = as_expr(d)  # type: ignore[arg-type]
        if not e.dtype.is_int:
            raise LanguageError(f"dimension {d!r} of {what} is not an integer")
        if isinstance(e, Const) and e.value < 0:
            raise LanguageError(f"dimension {d!r} of {what} is negative")
        for n in walk(e):
            if isinstance(n, Load) or isinstance(n, IterVar):
                raise LanguageError(f"dimension {d!r} of {what} must be built from integers and pt.param")
        out.append(e)
    return tuple(out)


def param(name: str) -> Param:
    """A symbolic size, e.g. ``N = pt.param("N")``; bound at call time from array shapes or keywords."""
    return Param(check_name(name, "parameter"))


def placeholder(shape: object, dtype: object = "float32", name: str | None = None, *,
                value_range: tuple[ExprLike, ExprLike] | None = None, monotonic: bool = False) -> Placeholder:
    """An input tensor of ``shape`` and ``dtype``.

    ``value_range=(lo, hi)`` promises lo <= every element <= hi (for index arrays), ``monotonic=True``
    that elements never decrease (CSR row offsets); both are verified when the kernel is called.
    """
    name = check_name(name, "tensor") if name is not None else _fresh("input")
    d = dtypes.as_dtype(dtype)
    vr = None
    if value_range is not None:
        if not d.is_int:
            raise LanguageError(f"value_range is for integer index arrays; {name} is {d}")
        vr = (as_expr(value_range[0]), as_expr(value_range[1]))
    if monotonic and (not d.is_int or len(_shape(shape, name)) != 1):
        raise LanguageError(f"monotonic=True is for one-dimensional integer arrays; {name} is not one")
    return Placeholder(name, _shape(shape, f"placeholder {name}"), d, vr, monotonic)


def reduce_axis(extent: object, name: str | None = None) -> IterVar:
    """A reduction iterator over ``range(extent)`` or ``[lo, hi)`` for a pair.

    Bounds may be affine in the enclosing iterators (triangular loops) or read tensors
    (``(offsets[i], offsets[i + 1])``: data-dependent, turned into local parameters).
    """
    name = name or _fresh("r")
    if isinstance(extent, (tuple, list)):
        if len(extent) != 2:
            raise LanguageError(f"reduce_axis {name}: give an extent or a pair (lo, hi), got {extent!r}")
        lo, hi = as_expr(extent[0]), as_expr(extent[1])
    else:
        lo, hi = Const(0, dtypes.INDEX), as_expr(extent)  # type: ignore[arg-type]
    for b in (lo, hi):
        if not b.dtype.is_int:
            raise LanguageError(f"reduce_axis {name}: bound {b} is not an integer")
    return IterVar(name, cast(dtypes.INDEX, lo), cast(dtypes.INDEX, hi), "reduce")


def _axes_list(axis: IterVar | Sequence[IterVar], what: str) -> tuple[IterVar, ...]:
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    for a in axes:
        if not isinstance(a, IterVar) or not a.is_reduce:
            raise LanguageError(f"{what}: axis {a!r} is not a reduce axis; create it with pt.reduce_axis")
    if len({id(a) for a in axes}) != len(axes):
        raise LanguageError(f"{what}: an axis is listed twice")
    return axes


def _reduction(op: str) -> Callable[..., Expr]:
    def reducer(expr: ExprLike, axis: IterVar | Sequence[IterVar], where: ExprLike | None = None) -> Expr:
        body = as_expr(expr)
        axes = _axes_list(axis, f"pt.{op}")
        cond = None
        if where is not None:
            cond = as_expr(where)
            if not cond.dtype.is_bool:
                raise LanguageError(f"pt.{op}: where= must be a boolean expression, got {cond}")
        for n in walk(body):
            if isinstance(n, Reduce):
                raise LanguageError(f"pt.{op}: nested reductions; compute the inner one as its own tensor")
        return Reduce(op, body, axes, cond)
    reducer.__name__ = op
    reducer.__doc__ = f"The {op} of ``expr`` over reduce ``axis`` (one or several), where ``where`` holds."
    return reducer


sum = _reduction("sum")  # noqa: A001 - the public names mirror NumPy's
max = _reduction("max")  # noqa: A001
min = _reduction("min")  # noqa: A001
prod = _reduction("prod")


def _lambda_names(fn: Callable[..., object], ndim: int, name: str) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    if params and params[0].kind == inspect.Parameter.VAR_POSITIONAL:
        return [f"i{d}" for d in range(ndim)]
    params = [p for p in params if p.default is inspect.Parameter.empty
              and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(params) != ndim:
        raise LanguageError(f"compute {name}: the function takes {len(params)} argument(s) but the shape has "
                            f"{ndim} dimension(s)")
    return [p.name for p in params]


def compute(shape: object, fn: Callable[..., ExprLike], name: str | None = None, *,
            where: Callable[..., ExprLike] | None = None, dtype: object | None = None,
            store_dtype: object | None = None, epilogue: Callable[..., ExprLike] | None = None) -> ComputeTensor:
    """A tensor whose element at (i, j, …) is ``fn(i, j, …)``.

    ``where`` restricts the computed points to a sub-domain (e.g. ``lambda i, j: j <= i`` for a
    triangle); points outside it are not written (allocated outputs start as zeros).
    A reduction nested inside an expression is computed as its own tensor ``<name>_red`` first.
    ``dtype`` casts the body (a reduction then becomes such a tensor of its own). ``store_dtype``
    keeps a reduction in this one computation, summed in its own type and stored rounded to
    ``store_dtype`` once complete (float32 sums of float16 products stored as float16, as a GEMM
    with a float16 output does): a schedule then accumulates it in a write cache of the summation
    type that holds all of its reduction (``cache_write``; the lowering adds one where there is none).
    A scalar (0-d) takes no write cache: its reduction becomes a scalar of its own (``<name>_red``,
    summed in its type) that this one rounds, as with ``dtype``.
    ``epilogue(value, i, j, …)``: what is stored at (i, j, …) instead of the value (``with_epilogue``):
    a reduction's complete sums go through it as they are written back (a GEMM's bias, activation,
    residual and cast), in the registers that summed them.
    """
    name = check_name(name, "tensor") if name is not None else _fresh("compute")
    dims = _shape(shape, f"compute {name}")
    names = _lambda_names(fn, len(dims), name)
    axes = tuple(IterVar(n, Const(0, dtypes.INDEX), d, "data") for n, d in zip(names, dims))
    body = as_expr(fn(*axes))  # type: ignore[arg-type]
    if dtype is not None:
        body = cast(dtype, body)
    cond = None
    if where is not None:
        cond = as_expr(where(*axes))  # type: ignore[arg-type]
        if not cond.dtype.is_bool:
            raise LanguageError(f"compute {name}: where= must return a boolean expression, got {cond}")
    body = _hoist_nested_reductions(body, dims, axes, name, cond)
    stored = None
    if store_dtype is not None:
        stored = dtypes.as_dtype(store_dtype)
        if not isinstance(body, Reduce):
            body, stored = cast(stored, body), None
        elif not dims:
            body, stored = _hoist_nested_reductions(cast(stored, body), dims, axes, name, cond), None
    out = ComputeTensor(name, dims, axes, body, cond, stored)
    return out if epilogue is None else with_epilogue(out, epilogue)


def with_epilogue(t: ComputeTensor, fn: Callable[..., ExprLike]) -> ComputeTensor:
    """``t`` storing ``fn(value, *axes)`` in place of each of its values: for a reduction, its complete
    sums (in ``t.value_dtype``) go through ``fn`` when they are written back, the result rounded to
    ``t.dtype`` where ``t`` is stored narrower; otherwise ``fn`` is composed into the body. The
    epilogue may read inputs (placeholders) only: a computation it would read is not ordered before
    the write-back."""
    usage = (f"the epilogue of {t.name} is a function of the value and its {len(t.axes)} axes, e.g. "
             f"lambda v{''.join(', ' + a.name for a in t.axes)}: ...")
    if not callable(fn):
        raise LanguageError(f"{usage}; got {type(fn).__name__}")
    red = t.reduction
    acc = Var(f"{t.name}_acc", t.value_dtype if red is not None else t.dtype)
    try:
        inspect.signature(fn).bind(acc, *t.axes)
    except TypeError:
        raise LanguageError(f"{usage} ({len(t.axes) + 1} arguments)") from None
    except ValueError:  # a callable whose signature Python cannot tell (a builtin): calling it will say
        pass
    value = as_expr(fn(acc, *t.axes))  # type: ignore[arg-type]
    own = {id(a) for a in t.axes}
    for n in walk(value):
        if isinstance(n, Load) and not isinstance(n.tensor, Placeholder):
            raise LanguageError(f"the epilogue of {t.name} reads {n.tensor.name}, a computation; an epilogue reads "
                                "inputs only: compute the expression as a computation of its own")
        if isinstance(n, Reduce):
            raise LanguageError(f"the epilogue of {t.name} has a reduction; compute it as a tensor of its own")
        if isinstance(n, IterVar) and id(n) not in own:
            raise LanguageError(f"the epilogue of {t.name} uses axis {n.name}, which is not one of {t.name}'s "
                                "data axes")
    if red is None:
        return ComputeTensor(t.name, t.shape, t.axes, rebuild(value, lambda n: t.body if n is acc else None),
                             t.where)
    if t.narrowed:
        value = cast(t.dtype, value)
    return ComputeTensor(t.name, t.shape, t.axes, t.body, t.where, epilogue=(acc, value))


def _hoist_nested_reductions(body: Expr, dims: tuple[Expr, ...], axes: tuple[IterVar, ...], name: str,
                             cond: Expr | None) -> Expr:
    if isinstance(body, Reduce):
        return body
    nested = [n for n in walk(body) if isinstance(n, Reduce)]
    if not nested:
        return body
    temps: dict[int, Expr] = {}
    for k, red in enumerate(nested):
        tname = f"{name}_red" if len(nested) == 1 else f"{name}_red{k}"
        temp = ComputeTensor(tname, dims, axes, red, cond)
        temps[id(red)] = Load(temp, tuple(axes))
    return rebuild(body, lambda n: temps.get(id(n)))

