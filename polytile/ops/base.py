"""The operator interface: an algorithm (a Func), random inputs, a NumPy reference and default schedules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..dtypes import DType, accumulator, as_dtype
from ..errors import PolytileError
from ..lang.func import Func
from ..schedule.state import Schedule
from ..target import CPUTarget, CUDATarget, as_target


@dataclass
class Op:
    """One operator instance at fixed sizes.

    ``make_inputs(rng)`` draws random inputs (never zeros), ``reference(*inputs)`` computes the
    result with NumPy (float64 where it matters), ``schedules`` maps a target kind to a function that
    schedules ``func`` well for it.
    """

    name: str
    shape: dict[str, int]
    func: Func
    make_inputs: Callable[[np.random.Generator], list[np.ndarray]]
    reference: Callable[..., np.ndarray | tuple[np.ndarray, ...]]
    flops: float
    bytes_moved: float
    schedules: dict[str, Callable[[Schedule, CPUTarget | CUDATarget], Schedule | None]] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)
    tolerance: float = 1e-5
    baseline: Callable[..., object] | None = None  # the library a user would call instead (same dtypes)
    baseline_name: str = "numpy"

    def schedule(self, target: object = "cpu") -> Schedule:
        """A schedule of ``func`` for ``target`` (the default one of this operator). A schedule
        function may restructure the algorithm for the target (split-K): it then returns a schedule of
        an equivalent Func with the same inputs and outputs instead of scheduling the one it got."""
        tgt = as_target(target)
        sched = Schedule(self.func)
        fn = self.schedules.get(tgt.kind)
        if fn is None:
            raise PolytileError(f"operator {self.name} has no default schedule for {tgt.kind}")
        other = fn(sched, tgt)
        if other is None:
            return sched
        _check_same_signature(self.name, self.func, other.func)
        return other

    def build(self, target: object = "cpu"):  # noqa: ANN201 - a kernel
        from ..build import build
        return build(self.schedule(target), target)

    @property
    def key(self) -> str:
        """Identifies the workload for tuning records."""
        dims = ",".join(f"{k}={v}" for k, v in sorted(self.shape.items()))
        return f"{self.name}({dims})"


OUT_DTYPES = ("float16", "bfloat16", "float32")
"""The types a product of floating-point operands may be stored as (``out_dtype``): summed in
``dtypes.accumulator`` (float32 for 16-bit operands) and rounded once, when complete."""


def output_dtype(op: str, dtype: object, out_dtype: object | None) -> DType:
    """The type operator ``op`` with ``dtype`` operands stores its sums as: ``out_dtype``, or by
    default the type it sums in (``dtypes.accumulator(dtype)``); a clear error for another type."""
    acc = accumulator(dtype)
    if out_dtype is None:
        return acc
    allowed = OUT_DTYPES if acc.is_float and acc.bits <= 32 else (acc.name,)
    try:
        out = as_dtype(out_dtype)
    except PolytileError:
        out = None
    if out is None or out.name not in allowed:
        raise PolytileError(f"{op}: out_dtype={out_dtype!r} is not a type its {as_dtype(dtype)} products can be "
                            f"stored as; use one of {', '.join(allowed)} (default {acc}: the type they are "
                            f"summed in)")
    return out


def reference_type(dtype: np.dtype) -> np.dtype:
    """The NumPy type a reference computes ``dtype`` data in: float64 for floats (more precise than any
    kernel), for integers the type the operator sums in (``dtypes.accumulator``) — NumPy's own integer
    arithmetic, so the reference wraps around exactly where the kernel does."""
    d = as_dtype(dtype)
    return accumulator(d).numpy if d.is_int else np.dtype(np.float64)


def _check_same_signature(name: str, func: Func, other: Func) -> None:
    def sig(f: Func) -> list[tuple[str, str, str]]:
        return [(t.name, str(t.dtype), str(t.shape)) for t in (*f.inputs, *f.outputs)]
    if sig(func) != sig(other):
        raise PolytileError(f"operator {name}: the restructured algorithm {sig(other)} does not have the "
                            f"signature of {sig(func)}")


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (0 when both are zero); NaN anywhere is an infinite error."""
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(o)):
        return float("inf")
    denom = np.linalg.norm(r)
    num = np.linalg.norm(o - r)
    return float(num / denom) if denom > 0 else float(num)


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: object, lo: float = -1.0,
                 hi: float = 1.0) -> np.ndarray:
    """Uniform random values in [lo, hi) (integers: small non-zero range) of ``dtype``."""
    d = as_dtype(dtype)
    if d.is_int:
        return rng.integers(1, 8, size=shape).astype(d.numpy)
    return rng.uniform(lo, hi, size=shape).astype(d.numpy)
