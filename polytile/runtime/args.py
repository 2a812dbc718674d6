"""Binding a kernel's arguments, shared by the CPU and CUDA runtimes.

A call's arrays are first read into ``ArrayInfo`` (shape, dtype, contiguity, device, framework) by
their framework; ``bind`` then checks them against the function and works out everything that their
shapes, dtypes and the keyword parameters decide: the parameter values, the outputs' shapes, which
outputs start as zeros, the index-array promises to verify and the pairs of arrays that must not
overlap. The result, a ``Signature``, is computed once per signature and kept by the kernel, so a
repeated call only looks it up. Every mistake is a clear ``InputError`` naming the argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..dtypes import DType
from ..errors import InputError
from ..lang import expr as lx
from ..lang.func import Func
from ..lang.tensor import ComputeTensor, Tensor


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


# --- what a call's arrays are ------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayInfo:
    """One array argument as its framework describes it, read once per signature."""

    shape: tuple[int, ...]
    dtype: str  # the polytile dtype name, or the framework's spelling of a type polytile lacks
    contiguous: bool  # C order (row-major, dense)
    device: int | None  # the GPU ordinal; None for host memory
    framework: str  # "NumPy", "torch", "CuPy", "CUDA array interface"


def numpy_info(a: np.ndarray) -> ArrayInfo:
    return ArrayInfo(tuple(a.shape), dtype_name(a.dtype), bool(a.flags.c_contiguous), None, "NumPy")


def dtype_name(dt: np.dtype) -> str:
    """polytile's name of a NumPy dtype (ml_dtypes' bfloat16 included)."""
    return "bool" if dt == np.bool_ else str(dt)


@dataclass(frozen=True)
class IndexCheck:
    """One promise of an index array, verified on every call: its elements lie in [lo, hi]
    (``value_range``) or never decrease (``monotonic``)."""

    arg: int  # position among the inputs
    name: str
    dtype: DType
    size: int  # elements
    kind: str  # "range" or "monotonic"
    lo: int = 0
    hi: int = 0

    @property
    def promise(self) -> str:
        return f"value_range [{self.lo}, {self.hi}]" if self.kind == "range" else "monotonic"


@dataclass(frozen=True)
class Signature:
    """What a call's shapes, dtypes, strides and parameters decide, worked out once.

    Arrays are numbered inputs first, then outputs (``names``, ``shapes``, ``nbytes``).
    """

    func: str
    names: tuple[str, ...]
    dtypes: tuple[DType, ...]
    shapes: tuple[tuple[int, ...], ...]
    nbytes: tuple[int, ...]
    n_inputs: int
    params: Mapping[str, int]
    outputs_given: bool
    zero_init: tuple[bool, ...]  # per output: computed only where a condition holds, zeros elsewhere
    index_checks: tuple[IndexCheck, ...]
    # (output, other array) pairs that must not share memory, both of nonzero size
    disjoint: tuple[tuple[int, int], ...]

    @property
    def output_shapes(self) -> tuple[tuple[int, ...], ...]:
        return self.shapes[self.n_inputs:]

    def check_disjoint(self, pointers: Sequence[int]) -> None:
        """Refuse outputs that overlap an input or another output (``pointers``: every array's
        first byte, in argument order); a kernel would read values it has already overwritten."""
        nbytes = self.nbytes
        for out, other in self.disjoint:
            p, q = pointers[out], pointers[other]
            if p < q + nbytes[other] and q < p + nbytes[out]:
                raise InputError(self._overlap_message(out, other))

    def _overlap_message(self, out: int, other: int) -> str:
        names, n_in = self.names, self.n_inputs
        what = f"input {names[other]}" if other < n_in else f"output {names[other]}"
        fix = (f"pass a separate output array (or a copy of {names[other]})" if other < n_in
               else "pass a separate array for each output")
        return (f"output {names[out]} of {self.func} shares memory with {what}: the kernel would read "
                f"or write values another argument overwrites; {fix}")


def bind(func: Func, infos: Sequence[ArrayInfo], kwargs: Mapping[str, object]) -> Signature:
    """Check a call's arrays (inputs, optionally followed by all outputs) against ``func`` and work out
    its signature. Contiguity and devices of inputs are the runtime's to judge; outputs must be
    C-contiguous everywhere."""
    n_in, n_out = len(func.inputs), len(func.outputs)
    if len(infos) not in (n_in, n_in + n_out):
        names = ", ".join(t.name for t in func.inputs)
        raise InputError(f"{func.name} takes {n_in} input array(s) ({names}), optionally followed by "
                         f"{n_out} output array(s); got {len(infos)}")
    tensors: list[Tensor] = [*func.inputs, *func.outputs]
    for t, info in zip(tensors, infos):
        if info.dtype != t.dtype.name:
            raise InputError(f"argument {t.name} of {func.name} must have dtype {t.dtype}, got {info.dtype}")
    params = bind_params(func, infos, kwargs)
    outputs_given = len(infos) == n_in + n_out
    for t, info in zip(func.outputs, infos[n_in:]):
        if not info.contiguous:
            raise InputError(f"output {t.name} of {func.name} must be a writeable C-contiguous array")
    shapes = [expected_shape(t, params) for t in tensors]
    for t, info, want in zip(tensors, infos, shapes):
        if info.shape != want:
            raise InputError(f"argument {t.name} of {func.name} must have shape {want}, got {info.shape}")
    nbytes = [int(np.prod(s, dtype=np.int64)) * t.dtype.itemsize for t, s in zip(tensors, shapes)]
    disjoint = tuple((o, k) for o in range(n_in, n_in + n_out) for k in range(o)
                     if outputs_given and nbytes[o] and nbytes[k])
    return Signature(
        func=func.name, names=tuple(t.name for t in tensors), dtypes=tuple(t.dtype for t in tensors),
        shapes=tuple(shapes), nbytes=tuple(nbytes), n_inputs=n_in, params=params,
        outputs_given=outputs_given, zero_init=tuple(needs_zero_init(t) for t in func.outputs),
        index_checks=index_checks(func, shapes[:n_in], params), disjoint=disjoint)


def index_checks(func: Func, shapes: Sequence[tuple[int, ...]], params: Mapping[str, int]) -> tuple[IndexCheck, ...]:
    """The promises of ``func``'s index arrays at these input shapes and parameters."""
    out = []
    for k, (t, shape) in enumerate(zip(func.inputs, shapes)):
        size = int(np.prod(shape, dtype=np.int64))
        if t.value_range is not None and size:
            lo = eval_int(t.value_range[0], params, f"value_range of {t.name}")
            hi = eval_int(t.value_range[1], params, f"value_range of {t.name}")
            out.append(IndexCheck(k, t.name, t.dtype, size, "range", lo, hi))
        if t.monotonic and size > 1:
            out.append(IndexCheck(k, t.name, t.dtype, size, "monotonic"))
    return tuple(out)


def bind_params(func: Func, arrays: Sequence[object], kwargs: Mapping[str, object]) -> dict[str, int]:
    """Parameter values from the keyword arguments and from array dimensions that are a parameter
    (``arrays``: anything with a ``shape``, inputs then outputs)."""
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
        shape = tuple(int(s) for s in a.shape)  # type: ignore[attr-defined]
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
        want = expected_shape(t, params)
        got = tuple(int(s) for s in a.shape)  # type: ignore[attr-defined]
        if want != got:
            raise InputError(f"argument {t.name} of {func.name} must have shape {want}, got {got}")


def expected_shape(t: Tensor, params: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(eval_int(s, params, f"dimension of {t.name}") for s in t.shape)


def check_index_arrays(func: Func, host_arrays: Sequence[np.ndarray | None], params: Mapping[str, int]) -> None:
    """Verify the value_range and monotonic promises of index arrays given as host (NumPy) arrays."""
    from .index_checks import check_on_host
    shapes = [tuple(a.shape) if a is not None else (0,) for a in host_arrays]
    for chk in index_checks(func, shapes, params):
        a = host_arrays[chk.arg]
        check_on_host(func.name, chk, np.ascontiguousarray(a, dtype=chk.dtype.numpy))


def needs_zero_init(t: ComputeTensor) -> bool:
    return t.where is not None
