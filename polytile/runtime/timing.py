"""The GPU timing harness used by kernels, benchmarks and the tuner: CUDA events around the work on
the default stream, warm-up first, an L2 flush before each timed run, the median; and the
correctness measure ‖out − ref‖ / ‖ref‖."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np


def time_gpu(fn: Callable[[], object], repeat: int = 50, warmup: int = 5, flush_l2: bool = True,
             l2_bytes: int | None = None) -> float:
    """Median seconds of ``fn()`` (which launches GPU work on the default stream)."""
    from .cuda_device import device
    dev = device()
    cu = dev.cu
    nbytes = 2 * (l2_bytes or dev.info.l2_bytes or 64 * 1024 * 1024)
    flush = dev.alloc(nbytes) if flush_l2 else None
    try:
        for _ in range(warmup):
            fn()
        dev.synchronize()
        events = []
        for _ in range(repeat):
            start = dev._check(cu.cuEventCreate(0), "cuEventCreate")[0]
            end = dev._check(cu.cuEventCreate(0), "cuEventCreate")[0]
            if flush is not None:
                dev._check(cu.cuMemsetD8Async(flush, 1, nbytes, 0), "cuMemsetD8Async (L2 flush)")
            dev._check(cu.cuEventRecord(start, 0), "cuEventRecord")
            fn()
            dev._check(cu.cuEventRecord(end, 0), "cuEventRecord")
            events.append((start, end))
        times = []
        for start, end in events:
            dev._check(cu.cuEventSynchronize(end), "cuEventSynchronize (did a kernel fault?)")
            times.append(float(dev._check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")[0]))
            dev._check(cu.cuEventDestroy(start), "cuEventDestroy")
            dev._check(cu.cuEventDestroy(end), "cuEventDestroy")
    finally:
        if flush is not None:
            dev.free(flush)
    return statistics.median(times) / 1e3


def rel_error(out: object, ref: object) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 for NumPy, torch or CuPy arrays (NaN anywhere: infinite)."""
    def host(x: object) -> np.ndarray:
        if hasattr(x, "detach"):
            x = x.detach().double().cpu().numpy()  # type: ignore[attr-defined]
        elif hasattr(x, "get"):
            x = x.get()  # type: ignore[attr-defined]
        return np.asarray(x, dtype=np.float64)
    o, r = host(out), host(ref)
    if not np.all(np.isfinite(o)):
        return float("inf")
    denom = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / denom) if denom > 0 else float(np.linalg.norm(o - r))
