"""Binding a kernel's arguments: shapes, dtypes, parameters and index-array promises, checked
before any call so that a mistake is a clear ``InputError`` and never a crash."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..lang import expr as lx
from ..lang.func import Func
from ..lang.tensor import ComputeTensor, Placeholder, Tensor


def eval_int(e: lx.Expr, params: Mapping[str, int], what: str) -> int:
    if isinstance(e, lx.Const):
        return int(e.value)
    if isinstance(e, lx.Param):
        if e.name not in params:
            raise InputError(f"parameter {e.name} ({what}) has no value; pass {e.name}=... to the kernel")
        return int(params[e.name])
    if isinstance(e, lx.Cast):
        return eval_int(e.a, params, what)
    if isinstance(e, lx.BinOp):
        a, b = eval_int(e.a, params, what), eval_int(e.b, params, what)
        ops = {"+": a + b, "-": a - b, "*": a * b}
        if e.op in ops:
            return ops[e.op]
        if b == 0:
            raise InputError(f"division by zero evaluating {what}")
        return a // b if e.op == "//" else a % b
    if isinstance(e, lx.Call) and e.name in ("min", "max"):
        a, b = eval_int(e.args[0], params, what), eval_int(e.args[1], params, what)
        return min(a, b) if e.name == "min" else max(a, b)
    raise InputError(f"cannot evaluate {e} ({what})")


def eval_bool(e: lx.Expr, params: Mapping[str, int]) -> bool:
    if isinstance(e, lx.Cmp):
        a, b = eval_int(e.a, params, str(e)), eval_int(e.b, params, str(e))
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[e.op]
    if isinstance(e, lx.Logic):
        x, y = eval_bool(e.a, params), eval_bool(e.b, params)
        return (x and y) if e.op == "&&" else (x or y)
    if isinstance(e, lx.Not):
        return not eval_bool(e.a, params)
    if isinstance(e, lx.Const):
        return bool(e.value)
    raise InputError(f"cannot evaluate constraint {e}")


@dataclass
class BoundArgs:
    arrays: list[object]  # inputs then outputs (host or device arrays)
    params: dict[str, int]
    outputs_given: bool


def array_shape(a: object) -> tuple[int, ...]:
    return tuple(int(s) for s in a.shape)


def bind_params(func: Func, arrays: Sequence[object], kwargs: Mapping[str, object]) -> dict[str, int]:
    """Parameter values from the keyword arguments and from array dimensions that are a parameter."""
    known = {p.name for p in func.params}
    params: dict[str, int] = {}
    for k, v in kwargs.items():
        if k not in known:
            raise InputError(f"{func.name} has no parameter {k!r}; its parameters are "
                             + (", ".join(sorted(known)) or "none"))
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise InputError(f"parameter {k} of {func.name} must be an integer, got {v!r}")
        params[k] = int(v)
    tensors: list[Tensor] = [*func.inputs, *func.outputs]
    dims: list[tuple[Tensor, int, lx.Expr, int]] = []
    for t, a in zip(tensors, arrays):
        shape = array_shape(a)
        if len(shape) != t.ndim:
            raise InputError(f"argument {t.name} of {func.name} must have {t.ndim} dimension(s), "
                             f"got an array of shape {shape}")
        dims += [(t, d, s, n) for d, (s, n) in enumerate(zip(t.shape, shape))]
    progress = True
    while progress:  # solve dimensions of the form c * P + d for one unknown parameter P
        progress = False
        for t, d, s, n in dims:
            solved = _solve(s, n, params)
            if solved is None:
                continue
            name, value = solved
            if name in params and params[name] != value:
                raise InputError(f"argument {t.name}: dimension {d} is {n}, which needs {name}={value}, "
                                 f"but {name} is {params[name]}")
            if name not in params:
                params[name] = value
                progress = True
    missing = [p.name for p in func.params if p.name not in params]
    if missing:
        raise InputError(f"{func.name}: no value for parameter(s) {', '.join(missing)}; pass them as keywords")
    for p, v in params.items():
        if v < 0:
            raise InputError(f"parameter {p} of {func.name} is negative ({v})")
    for c in func.constraints:
        if not eval_bool(c, params):
            raise InputError(f"{func.name}: the constraint {c} does not hold for "
                             + ", ".join(f"{k}={v}" for k, v in sorted(params.items())))
    return params


def _solve(e: lx.Expr, n: int, known: Mapping[str, int]) -> tuple[str, int] | None:
    """(P, value) when ``e`` is affine in exactly one unknown parameter P and ``e == n`` fixes it."""
    unknown = {v.name for v in lx.free_vars(e) if isinstance(v, lx.Param) and v.name not in known}
    if len(unknown) != 1:
        return None
    (name,) = unknown
    try:
        f0 = eval_int(e, {**known, name: 0}, str(e))
        f1 = eval_int(e, {**known, name: 1}, str(e))
        f2 = eval_int(e, {**known, name: 2}, str(e))
    except InputError:
        return None
    coef = f1 - f0
    if coef == 0 or f2 - f1 != coef or (n - f0) % coef != 0:
        return None
    return name, (n - f0) // coef


def check_shapes(func: Func, arrays: Sequence[object], params: Mapping[str, int]) -> None:
    for t, a in zip([*func.inputs, *func.outputs], arrays):
        want = tuple(eval_int(s, params, f"dimension of {t.name}") for s in t.shape)
        got = array_shape(a)
        if want != got:
            raise InputError(f"argument {t.name} of {func.name} must have shape {want}, got {got}")


def expected_shape(t: Tensor, params: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(eval_int(s, params, f"dimension of {t.name}") for s in t.shape)


def check_index_arrays(func: Func, host_arrays: Sequence[np.ndarray | None], params: Mapping[str, int]) -> None:
    """Verify value_range and monotonic promises of index arrays (on host copies)."""
    for t, a in zip(func.inputs, host_arrays):
        if not isinstance(t, Placeholder) or a is None:
            continue
        if t.value_range is not None and a.size:
            lo = eval_int(t.value_range[0], params, f"value_range of {t.name}")
            hi = eval_int(t.value_range[1], params, f"value_range of {t.name}")
            amin, amax = int(a.min()), int(a.max())
            if amin < lo or amax > hi:
                raise InputError(f"index array {t.name} has values in [{amin}, {amax}] but promises [{lo}, {hi}]")
        if t.monotonic and a.size > 1 and bool(np.any(np.diff(a.astype(np.int64)) < 0)):
            k = int(np.argmax(np.diff(a.astype(np.int64)) < 0))
            raise InputError(f"index array {t.name} must not decrease, but {t.name}[{k}] > {t.name}[{k + 1}]")


def needs_zero_init(t: ComputeTensor) -> bool:
    return t.where is not None
