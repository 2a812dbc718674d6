"""The GPU timing harness used by kernels, benchmarks and the tuner: CUDA events around the work on
its stream (the default one unless given), warm-up first, an L2 flush before each timed run, the
median; and the correctness measure ‖out − ref‖ / ‖ref‖."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import numpy as np


def time_gpu(fn: Callable[[], object], repeat: int = 50, warmup: int = 5, flush_l2: bool = True,
             l2_bytes: int | None = None, min_time: float = 0.0, max_runs: int = 10_000, stream: int = 0) -> float:
    """Median seconds of ``fn()`` (which launches GPU work on ``stream``, the default stream unless
    given): at least ``repeat`` timed runs, more until the timed runs add up to ``min_time`` seconds
    or ``min_time`` seconds have passed (at most ``max_runs``). The second bound is the CPU timer's
    (``CPUKernel.benchmark``): a kernel of 20 µs otherwise ran 5,000 times, each after an L2 flush
    (0.3 s of wall time for a median that a few hundred runs already fix to a fraction of a percent)."""
    from .cuda_device import device
    dev = device()
    nbytes = 2 * (l2_bytes or dev.info.l2_bytes or 64 * 1024 * 1024)
    flush = dev.alloc(nbytes) if flush_l2 else None
    try:
        for _ in range(warmup):
            fn()
        dev.synchronize()
        start = time.perf_counter()
        times = _timed_runs(dev, fn, max(1, repeat), flush, nbytes, stream)
        while sum(times) < min_time and len(times) < max_runs:
            wall = time.perf_counter() - start
            if wall >= min_time:
                break
            # the runs so far give the time of one, kernel and wall: enough more to reach either
            # bound, in one batch
            more = min(math.ceil((min_time - sum(times)) / max(statistics.mean(times), 1e-7)),
                       math.ceil((min_time - wall) / max(wall / len(times), 1e-7)))
            times += _timed_runs(dev, fn, min(max(more, 1), max_runs - len(times)), flush, nbytes, stream)
    finally:
        if flush is not None:
            dev.free(flush)
    return statistics.median(times)


def _timed_runs(dev, fn: Callable[[], object], runs: int, flush: int | None, nbytes: int,  # noqa: ANN001
                stream: int) -> list[float]:
    """Seconds of ``runs`` calls of ``fn``, each between two events on ``stream`` (after an L2 flush
    when ``flush``)."""
    cu = dev.cu
    events = []
    for _ in range(runs):
        start = dev._check(cu.cuEventCreate(0), "cuEventCreate")[0]
        end = dev._check(cu.cuEventCreate(0), "cuEventCreate")[0]
        if flush is not None:
            dev._check(cu.cuMemsetD8Async(flush, 1, nbytes, stream), "cuMemsetD8Async (L2 flush)")
        dev._check(cu.cuEventRecord(start, stream), "cuEventRecord")
        fn()
        dev._check(cu.cuEventRecord(end, stream), "cuEventRecord")
        events.append((start, end))
    times = []
    for start, end in events:
        dev._check(cu.cuEventSynchronize(end), "cuEventSynchronize (did a kernel fault?)")
        times.append(float(dev._check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")[0]) / 1e3)
        dev._check(cu.cuEventDestroy(start), "cuEventDestroy")
        dev._check(cu.cuEventDestroy(end), "cuEventDestroy")
    return times


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
