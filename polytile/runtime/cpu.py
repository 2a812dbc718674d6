"""CPU kernels: C++ compiled by the system compiler into a content-addressed cache, loaded with
ctypes and called with as little Python per call as the signature cache allows.

A repeated call costs a signature lookup, a data pointer per array (``ctypes.c_char.from_buffer``:
0.2 µs against 0.75 µs for ``a.ctypes.data`` or ``a.__array_interface__``), the output allocations
and one ctypes call with the pointer array and the parameter values prepared for the signature.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from ..codegen.cpu import PREAMBLE
from ..errors import BuildError, InputError
from ..lang.func import Func
from ..lowering import loopir as ir
from ..target import CPUTarget, cpu_target
from ..toolchain import cxx_workarounds, quick_builds, run_compiler
from .args import Signature, bind, numpy_info
from .index_checks import HostScan, host_scans, run_host_scans
from .interrupts import raise_if_interrupted, watching_ctrl_c
from .kernel import Kernel, Plan

CXX_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu++17", "-fno-math-errno",
             "-fno-trapping-math", "-Wno-unused-variable", "-Wno-unused-but-set-variable"]

OMP_WAIT_POLICY = "passive"
"""How OpenMP threads wait for work between parallel regions, unless the environment says otherwise.

Spinning waiters (libgomp's default: 300,000 spins) make a parallel region start in about a
microsecond on an idle machine, but on a busy one they fight the other processes for the cores: on
this project's 2-core machine with two busy processes beside it, a 256^3 matmul took 11.9 ms
instead of 0.13 ms and an 8^3 one 6.4 ms instead of 2.5 µs (commit message of the change). Sleeping
waiters cost a wake-up per region instead (0.13 -> 0.20 ms on that matmul, idle), which the
code generator keeps off small kernels by running their loops serially (``codegen/cpu.py``).
``OMP_WAIT_POLICY=active`` (or ``GOMP_SPINCOUNT``) in the environment wins over this default.
"""

GCC_FLAGS = ["-fno-predictive-commoning", "-fno-tree-loop-if-convert", "-fno-tree-reassoc"]
"""Three GCC transformations that miscompile code polytile generates (GCC 12.2):

- predictive commoning turns the stores of a loop whose iterations write overlapping rows (a
  write cache's or an initialization's ``C[96 * im + 48 * jr + ...]``, im in {0, 1}) into loads
  before and stores after the loop, of elements no iteration of that loop writes: in an OpenMP
  parallel loop, each thread then writes back stale values over its neighbour's results (a data
  race the C++ memory model forbids a compiler to introduce; tests/core/test_runtime.py);
- loop if-conversion miscompiles a guarded read whose index leaves its buffer where the guard is
  false (FINDINGS E1): the vectorized loop computes some rows from the wrong elements, whether the
  buffer is a local cache or a kernel argument, and even with the index clamped into the buffer;
- reassociation (``-O1`` and up) merges the comparisons of one variable in a condition into a bit
  test that drops a value the condition holds for (fuzz seed 43 case 10327): with ``s`` known to
  lie in [-18, 12], ``s <= 0 && (s >= -2 || s == -4 || s == -6)`` becomes false at ``s = 0``
  (``toolchain.REASSOC_PROBE``). polytile writes such conditions where isl guards a domain of
  several pieces (a ``where=`` with two disequalities under a skewed schedule): a reduction then
  skipped every instance of one element.

polytile schedules its own register reuse and vectorization, so its kernels rarely need the first two:
the default schedules of matmul, conv2d, softmax, layernorm and spmm time the same within noise.
A loop that polytile's vectorizer leaves scalar (a ``vectorize`` loop with a condition it cannot
vectorize, e.g. a conv2d written with a padding select, ``pad_stage=False``) is no longer
vectorized by GCC and runs up to 3x slower. Without reassociation, the default schedules of a
256^3 matmul and a 1x1 conv2d took 1.4% and 0.1% longer (interleaved rounds, one thread; a 3x3
conv2d, softmax and layernorm 1 to 3% in rounds that ran them second), within this machine's
noise. Other compilers do not get these GCC flags."""


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


def compile_flags(cxx: str) -> list[str]:
    """The flags of every kernel built with ``cxx``: its defects are probed on the first call
    (``toolchain.cxx_workarounds``; a process that forks builders calls this first, once)."""
    base = (*CXX_FLAGS, *(GCC_FLAGS if is_gcc(cxx) else []))
    return [*base, *cxx_workarounds(cxx, base)]


def compile_shared(source: str, extra_flags: Sequence[str] = ()) -> Path:
    """Compile ``source`` to a shared library, reusing an earlier build of the same text and flags.
    Generated kernels (``source`` starts with ``codegen.cpu.PREAMBLE``) include its headers
    precompiled (``precompiled_prelude``), which gives the same machine code; the library's key is
    the same either way."""
    cxx = compiler()
    flags = [*compile_flags(cxx), *extra_flags]
    key = hashlib.sha256("\0".join([source, cxx, *flags]).encode()).hexdigest()[:24]
    out = cache_dir() / f"pt_{key}.so"
    if out.exists():
        return out
    prelude = precompiled_prelude(cxx, flags) if source.startswith(PREAMBLE) and quick_builds() else None
    include = ["-include", str(prelude)] if prelude is not None else []
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(source)
        obj = Path(tmp) / "kernel.so"
        proc = run_compiler([cxx, *flags, *include, str(src), "-o", str(obj)], "a CPU kernel")
        if proc.returncode != 0:
            # the first error leads: the tail alone may hold only the quoted source of a long line
            first = next((line[:1000] for line in proc.stderr.splitlines() if "error:" in line), "")
            raise BuildError(f"the C++ compiler rejected the generated code: {first}\n{proc.stderr[-4000:]}")
        os.replace(obj, out)  # atomic: concurrent builds of the same kernel are safe
    return out


def precompiled_prelude(cxx: str, flags: Sequence[str]) -> Path | None:
    """The header of the includes every generated kernel starts with (``PREAMBLE``), precompiled by
    ``cxx`` with ``flags`` into the build cache once; None where ``cxx`` is not GCC or cannot
    precompile it (kernels then build as before).

    Parsing those headers (``<math.h>`` is ``<cmath>`` in C++) was half of g++'s time on a tuning
    candidate (0.25 of 0.45 s for a 512³ matmul, -ftime-report's "phase parsing"); ``-include``
    of the precompiled header loads it instead, and the kernel's own includes of the same headers
    stop at their include guards. GCC checks that the header was precompiled with compatible flags
    and otherwise reads its text, so a stale file costs time, never correctness."""
    if not is_gcc(cxx):
        return None
    pch_flags = [f for f in flags if f != "-shared"]
    key = hashlib.sha256("\0".join([PREAMBLE, cxx, *pch_flags]).encode()).hexdigest()[:24]
    header = cache_dir() / f"pt_prelude_{key}.h"
    gch = header.with_name(header.name + ".gch")
    if gch.exists():
        return header
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        text, built = Path(tmp) / "prelude.h", Path(tmp) / "prelude.h.gch"
        text.write_text(PREAMBLE)
        try:
            proc = subprocess.run([cxx, *pch_flags, "-x", "c++-header", str(text), "-o", str(built)],
                                  capture_output=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode != 0:
            return None
        os.replace(text, header)  # the header first: a .gch beside it is complete (atomic renames)
        os.replace(built, gch)
    return header


_omp_started = False


def load_library(path: Path) -> ctypes.CDLL:
    """Load a built library. The first load starts libgomp, which reads its settings from the
    environment then: ``OMP_WAIT_POLICY`` is set for that moment only (other OpenMP runtimes in the
    process, such as torch's, keep theirs)."""
    global _omp_started
    if _omp_started:
        return ctypes.CDLL(str(path))
    with _environment("OMP_WAIT_POLICY", OMP_WAIT_POLICY):
        lib = ctypes.CDLL(str(path))
    _omp_started = True
    return lib


@contextlib.contextmanager
def _environment(name: str, default: str) -> Iterator[None]:
    """``name`` set to ``default`` unless it is set already (or GOMP_SPINCOUNT chooses the policy)."""
    if name in os.environ or "GOMP_SPINCOUNT" in os.environ:
        yield
        return
    os.environ[name] = default
    try:
        yield
    finally:
        os.environ.pop(name, None)


_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


class _CPUPlan(Plan):
    """One signature of a CPU kernel: the bound signature and the call's ctypes pieces."""

    __slots__ = ("signature", "copies", "new_outputs", "args_type", "values", "scans", "buffers", "single")

    def __init__(self, sig: Signature, copies: tuple[bool, ...] | None, n_params: list[int], buffers: bool):
        self.signature = sig
        self.copies = copies  # per input: not C-contiguous, so a contiguous copy is passed
        n_in = sig.n_inputs
        self.new_outputs = () if sig.outputs_given else tuple(
            (np.zeros if zero else np.empty, shape, dt.numpy)
            for zero, shape, dt in zip(sig.zero_init, sig.output_shapes, sig.dtypes[n_in:]))
        self.args_type = ctypes.c_void_p * max(1, len(sig.names))
        self.values = (ctypes.c_int64 * max(1, len(n_params)))(*n_params)
        self.scans: tuple[HostScan, ...] = host_scans(sig.index_checks)
        self.buffers = buffers  # every array exports a buffer (no bfloat16): the fast data pointers
        self.single = len(sig.dtypes) - n_in == 1

    def arguments(self, arrays: Sequence[np.ndarray]) -> tuple[ctypes.Array, Sequence[np.ndarray], list[np.ndarray]]:
        """The pointer array of a call, its outputs, and every array it uses (to keep them alive)."""
        sig = self.signature
        n_in = sig.n_inputs
        inputs = arrays[:n_in]
        if self.copies is not None:
            inputs = [np.ascontiguousarray(a) if c else a for a, c in zip(inputs, self.copies)]
        outputs = arrays[n_in:] if sig.outputs_given else [new(s, d) for new, s, d in self.new_outputs]
        every = [*inputs, *outputs]
        try:
            if not self.buffers:
                raise ValueError
            pointers = [_addressof(_from_buffer(a)) for a in every]
        except (TypeError, ValueError):  # a read-only or empty array, or one without a buffer
            pointers = [self._pointer(a, k) for k, a in enumerate(every)]
        if sig.disjoint:
            sig.check_disjoint(pointers)
        if self.scans:
            run_host_scans(sig.func, self.scans, pointers, arrays)
        return self.args_type(*pointers), outputs, every

    def _pointer(self, a: np.ndarray, k: int) -> int:
        sig = self.signature
        if k >= sig.n_inputs and not a.flags.writeable:
            raise InputError(f"output {sig.names[k]} of {sig.func} is read-only; pass a writeable array")
        return int(a.__array_interface__["data"][0])


class CPUKernel(Kernel):
    """A compiled CPU kernel, called on NumPy arrays (see ``Kernel``)."""

    def __init__(self, func: Func, lowered: ir.LoweredFunc, source: str, extra_flags: Sequence[str] = (),
                 target: CPUTarget | None = None):
        names = [t.name for t in [*func.inputs, *func.outputs]]
        if [b.name for b in lowered.args] != names:
            raise BuildError(f"{lowered.name}: the lowered arguments {[b.name for b in lowered.args]} are not "
                             f"the function's inputs and outputs {names}")
        self.func = func
        self.lowered = lowered
        self.source = source
        self.target = target or cpu_target()
        self.path = compile_shared(source, extra_flags)
        self._lib = load_library(self.path)
        self._fn = getattr(self._lib, lowered.name)
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)]
        self._init_signatures()

    @property
    def resources(self) -> dict[str, object]:
        return {"library": str(self.path)}

    def synchronize(self) -> None:
        """Nothing to wait for: a CPU call returns when its work is done."""

    def _key(self, arrays: Sequence[object], params: Mapping[str, object]) -> Hashable:
        try:
            return tuple([(type(a), a.shape, a.dtype, a.strides) for a in arrays]), tuple(params.items())
        except AttributeError:  # not an array: the new plan says so
            return None

    def _new_plan(self, arrays: Sequence[object], params: Mapping[str, object]) -> _CPUPlan:
        func = self.func
        for t, a in zip([*func.inputs, *func.outputs], arrays):
            if not isinstance(a, np.ndarray):
                raise InputError(f"argument {t.name} of {func.name} must be a NumPy array, got {type(a).__name__}")
        sig = bind(func, [numpy_info(a) for a in arrays], params)  # type: ignore[arg-type]
        contiguous = [a.flags.c_contiguous for a in arrays[:sig.n_inputs]]  # type: ignore[attr-defined]
        copies = None if all(contiguous) else tuple(not c for c in contiguous)
        buffers = all(d.name != "bfloat16" for d in sig.dtypes)
        return _CPUPlan(sig, copies, [sig.params[p.name] for p in self.lowered.params], buffers)

    def __call__(self, *arrays: np.ndarray, **params: object) -> np.ndarray | tuple[np.ndarray, ...]:
        key = self._key(arrays, params)
        try:
            plan = self._plans[key]
        except (KeyError, TypeError):  # a new signature, or an unhashable parameter value
            plan = self._plan(key, arrays, params)
        args, outputs, _alive = plan.arguments(arrays)
        rc = self._fn(args, plan.values)
        if rc != 0:
            raise InputError(f"kernel {self.lowered.name} failed with code {rc}")
        return outputs[0] if plan.single else tuple(outputs)

    def benchmark(self, *arrays: np.ndarray, repeat: int = 20, warmup: int = 3, min_time: float = 0.2,
                  flush_cache: bool = False, **params: object) -> float:
        """Median wall time in seconds of one call (after ``warmup`` calls; at least ``repeat`` runs
        or ``min_time`` seconds). ``flush_cache`` writes a buffer larger than the caches before each run."""
        self._check_timing(repeat, warmup, min_time)
        plan = self._plan(self._key(arrays, params), arrays, params)
        args, _, _alive = plan.arguments(arrays)
        values = plan.values
        flush = np.empty(64 * 1024 * 1024 // 8) if flush_cache else None
        times: list[float] = []
        with watching_ctrl_c():  # Ctrl-C stops the runs even where its KeyboardInterrupt was lost
            for _ in range(warmup):
                self._fn(args, values)
                raise_if_interrupted()
            start = time.perf_counter()
            while len(times) < repeat or (time.perf_counter() - start < min_time and len(times) < 10000):
                if flush is not None:
                    flush.fill(1.0)
                t0 = time.perf_counter()
                self._fn(args, values)
                times.append(time.perf_counter() - t0)
                raise_if_interrupted()
        return statistics.median(times)
