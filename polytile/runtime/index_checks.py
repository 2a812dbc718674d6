"""The promises of index arrays (``value_range``, ``monotonic``), verified on every call.

On the host (CPU kernels, and NumPy arguments of CUDA kernels) a small C library scans the array in
one pass and stops at the first broken promise: 0.3-0.5 µs for 100 elements where NumPy's
``min``/``max`` and ``diff`` took 1.0-1.3 µs, half NumPy's time on a million. The error is raised
before the kernel runs.

On the GPU the same scan is a tiny CUDA kernel launched on the call's stream before the kernel
itself, so a call never copies anything back to the host. It reports into *pinned host memory
mapped into the device's address space*: one int64 per promise of the function, 0 while the promise
holds, ``p + 1`` once a call finds it broken at flat position ``p``. The host reads these words
without any CUDA call, so the report surfaces, as an ``InputError`` naming the kernel and the array,

- at the next call of the same kernel (the word is read first, for free), and
- at every synchronization polytile controls: ``pt.synchronize()``, ``kernel.synchronize()``, a
  call with NumPy arguments.

The kernel still runs on the broken indices (nothing on the device can stop it without a host
round trip): its results are wrong and it may fault; a fault surfaces at the same points as a
``DeviceError``, and when a promise was broken first, as this ``InputError`` instead. The reports
work inside captured CUDA graphs too: a replay checks its inputs like a call.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import InputError
from ..lang.func import Func
from .args import IndexCheck

_C_TYPES = {"int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t"}

HOST_SOURCE = r"""// polytile: index-array checks on the host
#include <stdint.h>
#include <limits>

// The first position whose value is outside [lo, hi], or -1; blocks of 4096 compare without
// branches (vectorized), and only a block with a bad value is searched.
template <typename T> static int64_t first_outside(const T* a, int64_t n, int64_t lo64, int64_t hi64) {
  const int64_t tmin = (int64_t)std::numeric_limits<T>::min(), tmax = (int64_t)std::numeric_limits<T>::max();
  if (lo64 > hi64 || lo64 > tmax || hi64 < tmin) return n > 0 ? 0 : -1;
  const T lo = (T)(lo64 < tmin ? tmin : lo64), hi = (T)(hi64 > tmax ? tmax : hi64);
  for (int64_t s = 0; s < n; s += 4096) {
    const int64_t e = n - s < 4096 ? n : s + 4096;
    int bad = 0;
    for (int64_t i = s; i < e; ++i) bad |= (a[i] < lo) | (a[i] > hi);
    if (bad)
      for (int64_t i = s; i < e; ++i)
        if (a[i] < lo || a[i] > hi) return i;
  }
  return -1;
}

// The first position k with a[k] > a[k + 1], or -1.
template <typename T> static int64_t first_decrease(const T* a, int64_t n) {
  for (int64_t s = 0; s + 1 < n; s += 4096) {
    const int64_t e = n - 1 - s < 4096 ? n - 1 : s + 4096;
    int bad = 0;
    for (int64_t i = s; i < e; ++i) bad |= a[i] > a[i + 1];
    if (bad)
      for (int64_t i = s; i < e; ++i)
        if (a[i] > a[i + 1]) return i;
  }
  return -1;
}
""" + "".join(
    f'extern "C" int64_t pt_first_outside_{name}(const {c}* a, int64_t n, int64_t lo, int64_t hi) '
    f"{{ return first_outside(a, n, lo, hi); }}\n"
    f'extern "C" int64_t pt_first_decrease_{name}(const {c}* a, int64_t n) {{ return first_decrease(a, n); }}\n'
    for name, c in _C_TYPES.items())


@functools.cache
def _host_library() -> ctypes.CDLL:
    from .cpu import compile_shared, load_library
    lib = load_library(compile_shared(HOST_SOURCE))
    for name in _C_TYPES:
        outside = getattr(lib, f"pt_first_outside_{name}")
        outside.restype, outside.argtypes = ctypes.c_int64, [ctypes.c_void_p] + [ctypes.c_int64] * 3
        decrease = getattr(lib, f"pt_first_decrease_{name}")
        decrease.restype, decrease.argtypes = ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int64]
    return lib


HostScan = tuple[Callable[..., int], int, tuple[int, ...], IndexCheck]
"""(scan, the input's position, the scan's arguments after the data pointer, the promise)."""


def host_scans(checks: Sequence[IndexCheck]) -> tuple[HostScan, ...]:
    """The C scans of ``checks``, bound once per signature."""
    lib = _host_library()
    out = []
    for chk in checks:
        if chk.kind == "range":
            out.append((getattr(lib, f"pt_first_outside_{chk.dtype.name}"), chk.arg, (chk.size, chk.lo, chk.hi), chk))
        else:
            out.append((getattr(lib, f"pt_first_decrease_{chk.dtype.name}"), chk.arg, (chk.size,), chk))
    return tuple(out)


def run_host_scans(func: str, scans: Sequence[HostScan], pointers: Sequence[int], arrays: Sequence[object]) -> None:
    """Raise for the first broken promise (``pointers``: the inputs' contiguous data, ``arrays``: the
    inputs as the caller gave them, for the message)."""
    for scan, k, rest, chk in scans:
        pos = scan(pointers[k], *rest)
        if pos >= 0:
            raise InputError(host_message(func, chk, np.asarray(arrays[k]), pos))


def check_on_host(func: str, chk: IndexCheck, array: np.ndarray) -> None:
    """Verify one promise on a C-contiguous host array."""
    run_host_scans(func, host_scans([dataclasses.replace(chk, arg=0)]), [array.ctypes.data], [array])


def host_message(func: str, chk: IndexCheck, array: np.ndarray, pos: int) -> str:
    flat = np.ravel(array).astype(np.int64)
    name = chk.name
    if chk.kind == "range":
        where = ", ".join(str(int(i)) for i in np.unravel_index(pos, array.shape))
        return (f"index array {name} has values in [{flat.min()}, {flat.max()}] but promises "
                f"[{chk.lo}, {chk.hi}]: {name}[{where}] = {flat[pos]} (kernel {func})")
    return (f"index array {name} must not decrease, but {name}[{pos}] = {flat[pos]} > "
            f"{name}[{pos + 1}] = {flat[pos + 1]} (kernel {func})")


# --- on the GPU -------------------------------------------------------------------------------------

DEVICE_SOURCE = r"""// polytile: index-array checks on the device; a broken promise stores its position + 1 in *report
// (pinned host memory mapped into the device; any failing thread's position will do)
template <typename T>
__device__ void pt_range(const T* a, long long n, long long lo, long long hi, long long* report) {
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
    const long long v = (long long)a[i];
    if (v < lo || v > hi) *(volatile long long*)report = i + 1;
  }
}
template <typename T>
__device__ void pt_monotonic(const T* a, long long n, long long* report) {
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i + 1 < n; i += step)
    if (a[i] > a[i + 1]) *(volatile long long*)report = i + 1;
}
""" + "".join(
    f'extern "C" __global__ void pt_check_range_{name}(const {c}* a, long long n, long long lo, long long hi, '
    f"long long* report) {{ pt_range(a, n, lo, hi, report); }}\n"
    f'extern "C" __global__ void pt_check_monotonic_{name}(const {c}* a, long long n, long long* report) '
    f"{{ pt_monotonic(a, n, report); }}\n"
    for name, c in {"int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
                    "uint8": "unsigned char"}.items())

CHECK_BLOCK = 256
CHECK_MAX_BLOCKS = 1024  # a grid-stride loop covers larger arrays


def device_kernel(chk: IndexCheck) -> str:
    """The name of the CUDA kernel that checks ``chk``."""
    return f"pt_check_{chk.kind}_{chk.dtype.name}"


def device_launch(chk: IndexCheck) -> tuple[tuple[int, int, int], tuple[int, int, int], list[tuple[str, int]]]:
    """Grid, block and the scalar arguments after the array pointer (the report pointer follows)."""
    blocks = max(1, min(CHECK_MAX_BLOCKS, -(-chk.size // CHECK_BLOCK)))
    scalars = [("int64", chk.size)]
    if chk.kind == "range":
        scalars += [("int64", chk.lo), ("int64", chk.hi)]
    return (blocks, 1, 1), (CHECK_BLOCK, 1, 1), scalars


def promises(func: Func) -> list[tuple[str, str, str]]:
    """(input name, kind, the promise as written) of every index-array promise of ``func``."""
    out = []
    for t in func.inputs:
        if t.value_range is not None:
            out.append((t.name, "range", f"value_range=({t.value_range[0]}, {t.value_range[1]})"))
        if t.monotonic:
            out.append((t.name, "monotonic", "monotonic=True"))
    return out


class _ReportWords:
    """Pinned, device-mapped host memory handed out in int64 words and never freed: a captured CUDA
    graph keeps writing its kernel's words after the kernel object is gone."""

    PAGE_WORDS = 512

    def __init__(self) -> None:
        self.pages: list[int] = []  # host addresses
        self.used = self.PAGE_WORDS  # words taken from the last page
        self.device_pages: dict[tuple[int, int], int] = {}  # (page, GPU) -> device address

    def take(self, device, n: int) -> tuple[int, int]:  # noqa: ANN001 - a cuda_driver.Device
        """``n`` zeroed consecutive words: their host address and their address on ``device``."""
        if n > self.PAGE_WORDS:
            raise InputError(f"a function with {n} index-array promises; polytile checks at most {self.PAGE_WORDS}")
        if self.used + n > self.PAGE_WORDS:
            page = device.host_alloc_mapped(8 * self.PAGE_WORDS)
            ctypes.memset(page, 0, 8 * self.PAGE_WORDS)
            self.pages.append(page)
            self.used = 0
        page = self.pages[-1]
        offset = 8 * self.used
        self.used += n
        key = (page, device.ordinal)
        if key not in self.device_pages:
            self.device_pages[key] = device.mapped_pointer(page)
        return page + offset, self.device_pages[key] + offset


_WORDS = _ReportWords()
_REPORTS: list[DeviceReports] = []  # every kernel's, kept: graphs may outlive their kernels


class DeviceReports:
    """Where one kernel's device-side checks on one GPU report: one int64 word per promise of the
    function in pinned, device-mapped host memory (see the module docstring)."""

    def __init__(self, device, func: Func) -> None:  # noqa: ANN001 - a cuda_driver.Device
        self.func = func.name
        self.promises = promises(func)
        n = max(1, len(self.promises))
        host, self.address = _WORDS.take(device, n)
        self.words = (ctypes.c_int64 * n).from_address(host)
        _REPORTS.append(self)

    def word(self, chk: IndexCheck) -> int:
        """The device address of the word that reports ``chk``."""
        names = [(name, kind) for name, kind, _ in self.promises]
        return self.address + 8 * names.index((chk.name, chk.kind))

    def pending(self) -> bool:
        return any(self.words)

    def raise_pending(self) -> None:
        """Raise for a broken promise reported since the last look, clearing the reports."""
        broken = [(k, w) for k, w in enumerate(self.words) if w]
        if not broken:
            return
        for k, _ in broken:
            self.words[k] = 0
        k, word = broken[0]
        name, _, promise = self.promises[k]
        raise InputError(
            f"index array {name} of kernel {self.func} broke its promise {promise} at (flat) position "
            f"{word - 1} in a call on the GPU since the last check; that call's results are wrong (polytile "
            "checks index arrays on the device and reports at the next call of the kernel or at "
            "pt.synchronize())")


def raise_pending_reports() -> None:
    """Raise for any broken promise reported by any kernel's device-side checks (after a synchronize)."""
    for reports in list(_REPORTS):
        reports.raise_pending()
