"""The operator interface: an algorithm (a Func), random inputs, a NumPy reference and default schedules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

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
    schedules: dict[str, Callable[[Schedule, CPUTarget | CUDATarget], None]] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)
    tolerance: float = 1e-5
    baseline: Callable[..., object] | None = None  # the library a user would call instead (same dtypes)
    baseline_name: str = "numpy"

    def schedule(self, target: object = "cpu") -> Schedule:
        """A schedule of ``func`` for ``target`` (the default one of this operator)."""
        tgt = as_target(target)
        sched = Schedule(self.func)
        fn = self.schedules.get(tgt.kind)
        if fn is None:
            raise PolytileError(f"operator {self.name} has no default schedule for {tgt.kind}")
        fn(sched, tgt)
        return sched

    def build(self, target: object = "cpu"):  # noqa: ANN201 - a kernel
        from ..build import build
        return build(self.schedule(target), target)

    @property
    def key(self) -> str:
        """Identifies the workload for tuning records."""
        dims = ",".join(f"{k}={v}" for k, v in sorted(self.shape.items()))
        return f"{self.name}({dims})"


def reference_type(dtype: np.dtype) -> np.dtype:
    """The NumPy type a reference computes ``dtype`` data in: float64 for floats (more precise than any
    kernel), for integers the type the operator sums in (``dtypes.accumulator``) — NumPy's own integer
    arithmetic, so the reference wraps around exactly where the kernel does."""
    from ..dtypes import accumulator, as_dtype
    d = as_dtype(dtype)
    return accumulator(d).numpy if d.is_int else np.dtype(np.float64)


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
    from ..dtypes import as_dtype
    d = as_dtype(dtype)
    if d.is_int:
        return rng.integers(1, 8, size=shape).astype(d.numpy)
    return rng.uniform(lo, hi, size=shape).astype(d.numpy)
