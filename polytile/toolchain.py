"""The toolchains on this machine: where ``nvcc`` is and the flags that build for an architecture,
and the C++ compiler's defects that the CPU runtime works around, each probed once.

One nvcc detection for the package, the tests (the ``needs_nvcc`` marker), the benchmarks and the
scripts: ``$NVCC``, then ``nvcc`` on the ``PATH``, then ``$CUDA_HOME/bin/nvcc``, then
``/usr/local/cuda/bin/nvcc``; the toolkit's headers for the C call path (``cuda_include``); NVRTC's
library for builds that ask for it (``cuda_compiler``, ``find_nvrtc``).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence

from .errors import BuildError

QUICK_BUILD_VARIABLE = "POLYTILE_QUICK_BUILD"


def quick_builds() -> bool:
    """Whether builds take the shortcuts that leave every kernel the same: a precompiled header of
    the includes that generated C++ starts with (``runtime.cpu.precompiled_prelude``), no second
    legality check of a schedule state checked already (``Schedule.check``), and legality checks
    that compare the times of each dependence's pairs instead of building the order of every two
    instances of the schedule first (``poly.deps.first_violation``). On unless
    ``POLYTILE_QUICK_BUILD=0``: the builds of before, which ``MeasureOptions(quick_build=False)``
    gives its builder processes (the baseline of ``benchmarks/tuning_throughput.py``)."""
    return os.environ.get(QUICK_BUILD_VARIABLE, "1") != "0"


COMPILE_TIMEOUT_VARIABLE = "POLYTILE_COMPILE_TIMEOUT"
DEFAULT_COMPILE_TIMEOUT = 600.0


def compile_timeout() -> float:
    """Seconds one compiler run may take (``POLYTILE_COMPILE_TIMEOUT``, default 600)."""
    raw = os.environ.get(COMPILE_TIMEOUT_VARIABLE, "")
    try:
        seconds = float(raw) if raw else DEFAULT_COMPILE_TIMEOUT
    except ValueError:
        raise BuildError(f"{COMPILE_TIMEOUT_VARIABLE}={raw!r} is not a number of seconds") from None
    if seconds <= 0:
        raise BuildError(f"{COMPILE_TIMEOUT_VARIABLE}={raw!r}: give a positive number of seconds")
    return seconds


def run_compiler(cmd: Sequence[str], what: str) -> subprocess.CompletedProcess[str]:
    """Run the compiler command ``cmd`` (building ``what``), its output captured as text; a
    ``BuildError`` naming ``what`` when it runs past ``compile_timeout()`` or cannot start (the
    caller reads the return code and stderr)."""
    seconds = compile_timeout()
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{os.path.basename(cmd[0])} ran past {seconds:g} s building {what} and was stopped; "
                         f"simplify the schedule (fewer unrolled loops) or raise {COMPILE_TIMEOUT_VARIABLE}") from None
    except OSError as err:
        raise BuildError(f"could not run {cmd[0]} to build {what}: {err}") from None


@contextlib.contextmanager
def quick_builds_set(on: bool | None) -> Iterator[None]:
    """``quick_builds()`` is ``on`` inside (None: as the environment says)."""
    if on is None:
        yield
        return
    before = os.environ.get(QUICK_BUILD_VARIABLE)
    os.environ[QUICK_BUILD_VARIABLE] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(QUICK_BUILD_VARIABLE, None)
        else:
            os.environ[QUICK_BUILD_VARIABLE] = before


def find_nvcc() -> str | None:
    """The path of ``nvcc``, or None when no CUDA toolkit is found."""
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), os.path.join(home, "bin", "nvcc"),
                 "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    return None


def nvcc() -> str:
    """The path of ``nvcc`` (a ``BuildError`` saying how to get one when there is none)."""
    path = find_nvcc()
    if path is None:
        raise BuildError("nvcc was not found; install the CUDA toolkit or set NVCC=/path/to/nvcc")
    return path


def cuda_include() -> str | None:
    """The CUDA toolkit's include directory (the one with ``cuda.h``): ``$CUDA_HOME/include``, then next to
    nvcc's real path, then ``/usr/local/cuda/include``, then the newest ``/usr/local/cuda-*/include``; None
    when there is none."""
    places = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")]
    found = find_nvcc()
    if found is not None:
        places.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(found))), "include"))
    places += ["/usr/local/cuda/include", *sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True)]
    return next((p for p in places if os.path.exists(os.path.join(p, "cuda.h"))), None)


CUDA_COMPILER_VARIABLE = "POLYTILE_CUDA_COMPILER"
CUDA_COMPILERS = ("nvcc", "nvrtc")


def cuda_compiler() -> str:
    """What compiles generated CUDA (``POLYTILE_CUDA_COMPILER``): "nvcc" (the default) or "nvrtc", which
    compiles in the process, about 0.4 s of CPU time less per kernel, to other code than nvcc's
    (``runtime.nvrtc``); builds fall back to nvcc where NVRTC is not found."""
    raw = os.environ.get(CUDA_COMPILER_VARIABLE, "") or "nvcc"
    if raw not in CUDA_COMPILERS:
        raise BuildError(f"{CUDA_COMPILER_VARIABLE}={raw!r}: give one of {', '.join(CUDA_COMPILERS)}")
    return raw


NVRTC_VARIABLE = "POLYTILE_NVRTC"


def find_nvrtc() -> str | None:
    """The path of NVRTC's library (``libnvrtc.so.<major>``), or None: ``$POLYTILE_NVRTC``, then the
    toolkit's library folders (``$CUDA_HOME``, nvcc's), then the ``nvidia-cuda-nvrtc`` wheel's
    (``pip install polytile[nvrtc]``) on ``sys.path``."""
    given = os.environ.get(NVRTC_VARIABLE)
    if given:
        return given if os.path.exists(given) else None
    roots = [os.environ.get("CUDA_HOME", "/usr/local/cuda")]
    found = find_nvcc()
    if found is not None:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(found))))
    folders = [os.path.join(r, sub) for r in roots for sub in ("lib64", "lib", "targets/x86_64-linux/lib",
                                                                  "targets/sbsa-linux/lib")]
    folders += [os.path.join(p, "nvidia", sub, "lib") for p in sys.path if p for sub in ("cu13", "cuda_nvrtc")]
    for folder in folders:
        libs = sorted(glob.glob(os.path.join(folder, "libnvrtc.so.[0-9]*")), key=len)
        if libs:
            return libs[0]
    return None


def arch_flags(arch: str) -> list[str]:
    """nvcc's flags that build for ``arch`` ("sm_80", "sm_90a"): the gencode form, because the
    ``-arch`` shorthand of an arch-specific target (``sm_90a``) also runs a plain ``sm_90`` pass."""
    num = arch.removeprefix("sm_")
    return [f"-gencode=arch=compute_{num},code=sm_{num}"]


AVX512FP16_PROBE = r"""
#include <stdint.h>
static inline _Float16 pt_max(_Float16 a, _Float16 b) { return a > b ? a : b; }
void probe(const double* __restrict__ A, const int32_t* __restrict__ idx, _Float16* __restrict__ W) {
  double V[125];
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t h = 0; h < 5; ++h) {
        V[h + 25 * i + 5 * j] = 0.0;
        if (((h != 4) ? (double)i : 1.5) != 3.0) V[h + 25 * i + 5 * j] += A[h % 2 + 5 * (i / 2)];
      }
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 2; ++j)
      W[2 * i + j] = pt_max((_Float16)0.0f, (_Float16)((i >= 1) ? V[(idx[j] * 5 + i - 1) * 5 + i] : 1.0));
}
"""
"""A float16 maximum stored under a condition, as polytile generates it (fuzz finding E2). GCC 12.2
with ``-O3 -march=native`` on an AVX512-FP16 CPU (Sapphire Rapids) folds the zero-masked register
move of ``pt_max`` into the store, ``vmovsh %xmm0, 4(%r9){%k1}{z}``: EVEX zero-masking exists for
register destinations only, so the instruction cannot be encoded and binutils refuses it
("unsupported masking for `vmovsh'"); the assembler itself handles AVX512-FP16 (merge-masked
stores assemble). A GCC defect, not an assembler one; it needs ``-O3`` (``-O2`` and
``-fno-tree-slp-vectorize`` both avoid it here) but no smaller reproducer was found."""


REASSOC_PROBE = r"""
extern "C" int probe(long s) {
  if (s < -18 || s > 12) __builtin_unreachable();
  return s <= 0 && (s >= -2 || s == -4 || s == -6);
}
"""
"""A condition of the form isl guards a domain of several pieces with, as polytile generates it
(fuzz seed 43 case 10327): ``probe(0)`` is 1, but GCC 12.2 from ``-O1`` on returns 0. Its
reassociation pass merges the four comparisons of ``s`` into a range check and a bit test whose
mask leaves out ``s = 0``. ``-fno-tree-reassoc`` (in ``runtime.cpu.GCC_FLAGS``, given to GCC
always) avoids it; so does ``-fno-tree-vrp``, which costs the bounds that polytile's loops rely on."""


def compiles(cxx: str, flags: Sequence[str], source: str) -> bool:
    """Whether ``cxx`` with ``flags`` compiles and assembles the C++ ``source`` to an object file."""
    with tempfile.TemporaryDirectory(prefix="polytile-probe-") as tmp:
        src = os.path.join(tmp, "probe.cpp")
        with open(src, "w") as f:
            f.write(source)
        cmd = [cxx, *(f for f in flags if f != "-shared"), "-c", src, "-o", os.path.join(tmp, "probe.o")]
        try:
            return subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False


@functools.cache
def cxx_workarounds(cxx: str, flags: tuple[str, ...]) -> list[str]:
    """Flags that keep ``cxx`` with ``flags`` off its known defects on this machine:
    ``-mno-avx512fp16`` where it cannot assemble its own AVX512-FP16 code (``AVX512FP16_PROBE``;
    float16 arithmetic then runs in float, exactly rounded to float16 after each operation), nothing
    where the probe builds or fails for another reason (a compiler without ``_Float16``)."""
    if compiles(cxx, flags, AVX512FP16_PROBE):
        return []
    without = [*flags, "-mno-avx512fp16"]
    return ["-mno-avx512fp16"] if compiles(cxx, without, AVX512FP16_PROBE) else []
