"""CPU kernels: compile C++ with the system compiler into a content-addressed cache, load with ctypes."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import BuildError, InputError
from ..lang.func import Func
from ..lowering import loopir as ir
from .args import bind_params, check_index_arrays, check_shapes, expected_shape, needs_zero_init

CXX_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu++17", "-fno-math-errno",
             "-fno-trapping-math", "-Wno-unused-variable", "-Wno-unused-but-set-variable"]

GCC_FLAGS = ["-fno-predictive-commoning", "-fno-tree-loop-if-convert"]
"""Two GCC -O3 loop transformations that miscompile code polytile generates (GCC 12.2):

- predictive commoning turns the stores of a loop whose iterations write overlapping rows (a
  write cache's or an initialization's ``C[96 * im + 48 * jr + ...]``, im in {0, 1}) into loads
  before and stores after the loop, of elements no iteration of that loop writes: in an OpenMP
  parallel loop, each thread then writes back stale values over its neighbour's results (a data
  race the C++ memory model forbids a compiler to introduce; tests/core/test_runtime.py);
- loop if-conversion miscompiles a guarded read whose index leaves its buffer where the guard is
  false (FINDINGS E1): the vectorized loop computes some rows from the wrong elements, whether the
  buffer is a local cache or a kernel argument, and even with the index clamped into the buffer.

polytile schedules its own register reuse and vectorization, so its kernels rarely need either:
the default schedules of matmul, conv2d, softmax, layernorm and spmm time the same within noise.
A loop that polytile's vectorizer leaves scalar (a ``vectorize`` loop with a condition it cannot
vectorize, e.g. a conv2d written with a padding select, ``pad_stage=False``) is no longer
vectorized by GCC and runs up to 3x slower. Other compilers do not get these GCC flags."""


def cache_dir() -> Path:
    """Where built kernels are kept: ``$POLYTILE_CACHE_DIR`` or ``~/.cache/polytile``."""
    d = os.environ.get("POLYTILE_CACHE_DIR")
    path = Path(d) if d else Path.home() / ".cache" / "polytile"
    path.mkdir(parents=True, exist_ok=True)
    return path


def compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        raise BuildError("no C++ compiler found; install g++ or set CXX")
    return cxx


@functools.cache
def is_gcc(cxx: str) -> bool:
    """Whether the C++ compiler ``cxx`` is GCC (clang also answers to g++ on some systems)."""
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Free Software Foundation" in out and "clang" not in out.lower()


def compile_shared(source: str, extra_flags: Sequence[str] = ()) -> Path:
    """Compile ``source`` to a shared library, reusing an earlier build of the same text and flags."""
    cxx = compiler()
    flags = [*CXX_FLAGS, *(GCC_FLAGS if is_gcc(cxx) else []), *extra_flags]
    key = hashlib.sha256("\0".join([source, cxx, *flags]).encode()).hexdigest()[:24]
    out = cache_dir() / f"pt_{key}.so"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(source)
        obj = Path(tmp) / "kernel.so"
        proc = subprocess.run([cxx, *flags, str(src), "-o", str(obj)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"the C++ compiler rejected the generated code:\n{proc.stderr[-4000:]}")
        os.replace(obj, out)  # atomic: concurrent builds of the same kernel are safe
    return out


class CPUKernel:
    """A compiled CPU kernel: call it on NumPy arrays (outputs are allocated when not given).

    ``source`` is the C++ text, ``ir`` the final loop IR, ``benchmark()`` times it.
    """

    def __init__(self, func: Func, lowered: ir.LoweredFunc, source: str, extra_flags: Sequence[str] = ()):
        self.func = func
        self.lowered = lowered
        self.source = source
        self.path = compile_shared(source, extra_flags)
        self._lib = ctypes.CDLL(str(self.path))
        self._fn = getattr(self._lib, lowered.name)
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)]
        self.target = "cpu"

    @property
    def ir(self) -> str:
        return str(self.lowered)

    @property
    def resources(self) -> dict[str, object]:
        return {"library": str(self.path)}

    def prepare(self, arrays: Sequence[np.ndarray], params: dict[str, object]
                ) -> tuple[list[np.ndarray], dict[str, int], list[np.ndarray]]:
        func = self.func
        n_in, n_out = len(func.inputs), len(func.outputs)
        if len(arrays) not in (n_in, n_in + n_out):
            names = ", ".join(t.name for t in func.inputs)
            raise InputError(f"{func.name} takes {n_in} input array(s) ({names}), optionally followed by "
                             f"{n_out} output array(s); got {len(arrays)}")
        arrs: list[np.ndarray] = []
        for t, a in zip([*func.inputs, *func.outputs], arrays):
            if not isinstance(a, np.ndarray):
                raise InputError(f"argument {t.name} of {func.name} must be a NumPy array, got {type(a).__name__}")
            if a.dtype != t.dtype.numpy:
                raise InputError(f"argument {t.name} of {func.name} must have dtype {t.dtype}, got {a.dtype}")
            arrs.append(a)
        bound = bind_params(func, arrs, params)
        outs: list[np.ndarray] = arrs[n_in:]
        if not outs:
            for t in func.outputs:
                shape = expected_shape(t, bound)
                alloc = np.zeros if needs_zero_init(t) else np.empty
                outs.append(alloc(shape, dtype=t.dtype.numpy))
        for t, o in zip(func.outputs, outs):
            if not o.flags.c_contiguous or not o.flags.writeable:
                raise InputError(f"output {t.name} of {func.name} must be a writeable C-contiguous array")
        ins = [np.ascontiguousarray(a) for a in arrs[:n_in]]
        check_shapes(func, ins + outs, bound)
        check_index_arrays(func, ins, bound)
        return ins + outs, bound, outs

    def _raw_args(self, arrays: Sequence[np.ndarray], params: dict[str, int]):
        ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        vals = (ctypes.c_int64 * max(1, len(self.lowered.params)))(*[params[p.name] for p in self.lowered.params])
        return ptrs, vals

    def __call__(self, *arrays: np.ndarray, **params: object) -> np.ndarray | tuple[np.ndarray, ...]:
        all_arrays, bound, outs = self.prepare(arrays, params)
        ptrs, vals = self._raw_args(all_arrays, bound)
        rc = self._fn(ptrs, vals)
        if rc != 0:
            raise InputError(f"kernel {self.lowered.name} failed with code {rc}")
        return outs[0] if len(outs) == 1 else tuple(outs)

    def benchmark(self, *arrays: np.ndarray, repeat: int = 20, warmup: int = 3, min_time: float = 0.2,
                  flush_cache: bool = False, **params: object) -> float:
        """Median wall time in seconds of one call (after ``warmup`` calls; at least ``repeat`` runs
        or ``min_time`` seconds). ``flush_cache`` writes a buffer larger than the caches before each run."""
        all_arrays, bound, _ = self.prepare(arrays, params)
        ptrs, vals = self._raw_args(all_arrays, bound)
        flush = np.empty(64 * 1024 * 1024 // 8) if flush_cache else None
        for _ in range(warmup):
            self._fn(ptrs, vals)
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < repeat or (time.perf_counter() - start < min_time and len(times) < 10000):
            if flush is not None:
                flush.fill(1.0)
            t0 = time.perf_counter()
            self._fn(ptrs, vals)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
