"""The C fast path of CUDA kernel calls: a small CPython extension (``_fastcall.c``), built with the
system C compiler at first use and kept in polytile's cache directory.

The Python call path (``cuda._CUDAPlan``) stays the reference: it handles every first call of a
signature, every error, NumPy and CuPy arrays, ``stream=``, keyword parameters, index-array checks
and TMA operands. Once it has run a call of a signature that needs none of those, the
kernel keeps a ``Call`` for it (``call_for``), and later calls with arrays of exactly that signature
run in one C call: the same signature checks, pointers, allocators (outputs and temporaries), current
stream, memsets and launches as the Python path, on the same driver. Whatever does not match returns to the Python path.

``POLYTILE_FASTCALL=0`` turns the C path off. When it cannot be built (no C compiler, no Python or
CUDA headers, a free-threaded Python) calls take the Python path, and the reason is logged once at
debug level on the ``polytile`` logger.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import BuildError
from ..toolchain import cuda_include, run_compiler
from .cpu import cache_dir

SOURCE = Path(__file__).with_name("_fastcall.c")
VARIABLE = "POLYTILE_FASTCALL"
FLAGS = ["-O2", "-shared", "-fPIC", "-fvisibility=hidden"]  # no -Werror: another compiler's new warning
# must not cost the C path (the tests build it with -Wall -Wextra -Werror)
MAX_ARRAYS = 64  # arrays of a call in C (_fastcall.c's MAX_ARRAYS)
CALLS_KEPT = 8  # C calls a kernel keeps (each one signature), newest first

log = logging.getLogger("polytile")


def enabled() -> bool:
    return os.environ.get(VARIABLE, "1") != "0"


def describe() -> str:
    """Which path calls take, in words (benchmarks record it)."""
    if not enabled():
        return f"Python ({VARIABLE}=0)"
    return "C" if module() is not None else "Python (the C call path could not be built)"


@functools.cache
def module() -> ModuleType | None:
    """The built extension, or None (the C path is off or cannot be built: the reason is logged)."""
    if not enabled():
        return None
    try:
        return _load(build())
    except (BuildError, OSError, ImportError) as err:
        log.debug("polytile: CUDA kernel calls take the Python path, the C call path is unavailable: %s", err)
        return None


def build() -> Path:
    """The extension built from ``SOURCE`` for this Python, reusing an earlier build of the same source,
    compiler and Python (the cache key)."""
    cc = c_compiler()
    source = SOURCE.read_text()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256("\0".join([source, cc, sys.version, suffix, *FLAGS]).encode()).hexdigest()[:24]
    out = cache_dir() / f"pt_fastcall_{key}{suffix}"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        lib = Path(tmp) / f"_fastcall{suffix}"
        compile_command(cc, lib, FLAGS)
        os.replace(lib, out)
    return out


def compile_command(cc: str, out: Path, flags: Sequence[str]) -> None:
    """Compile ``SOURCE`` with ``cc`` and ``flags`` to the extension ``out``."""
    python = Path(sysconfig.get_paths()["include"])
    if not (python / "Python.h").exists():
        raise BuildError(f"the Python headers are missing ({python}/Python.h)")
    cuda = cuda_include()
    if cuda is None:
        raise BuildError("the CUDA toolkit's cuda.h was not found (set CUDA_HOME)")
    proc = run_compiler([cc, *flags, f"-I{python}", f"-I{cuda}", str(SOURCE), "-o", str(out)], "the C call path")
    if proc.returncode != 0:
        raise BuildError(f"{cc} rejected {SOURCE.name}: {proc.stderr[-2000:]}")


def c_compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise BuildError("no C compiler found (set CC)")
    return cc


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("polytile.runtime._fastcall", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def driver_entry_points(cu: object) -> tuple[int, int, int]:
    """The addresses of cuLaunchKernel, cuMemsetD8Async and cuCtxGetCurrent in libcuda (the library the
    bindings use; a driver object may give its own: the tests' fake does)."""
    own = getattr(cu, "c_entry_points", None)
    if own is not None:
        return own()
    lib = ctypes.CDLL("libcuda.so.1")
    names = ("cuLaunchKernel", "cuMemsetD8Async", "cuCtxGetCurrent")
    return tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names)  # type: ignore[return-value]


def call_for(arrays: Sequence[object], n_inputs: int, probes: Sequence[tuple[str, bool]], pointer: tuple[str, bool],
             allocators: Sequence[tuple[int | None, Callable[..., Any]]], current_stream: Callable[[int], int],
             ordinal: int, zero: Sequence[tuple[int, int]], nbytes: Sequence[int],
             disjoint: Sequence[tuple[int, int]], context: int, launches: Sequence[tuple],
             on_error: Callable[[int, int], None], keep: object, cu: object) -> Any:
    """A C ``Call`` of one signature (None when the C path is unavailable): ``arrays``, a call's arrays
    of that signature, whose ``probes`` (attribute names, or names of methods called without
    arguments, with True) it records as the signature; ``launches``: per kernel, (function handle,
    grid, block, shared bytes, packed argument values, each argument's offset in them, the call's
    array of each per-call pointer, which fill the first 8-byte words); ``on_error(k, status)``
    raises the Python path's error for launch k (-1: a memset); ``keep``: what the launches' function
    handles belong to. Neither may hold the Call (it takes no part in garbage collection)."""
    mod = module()
    if mod is None:
        return None
    try:
        entry_points = driver_entry_points(cu)
    except OSError as err:
        log.debug("polytile: CUDA kernel calls take the Python path, libcuda's entry points: %s", err)
        return None
    return mod.Call(tuple(arrays), n_inputs, tuple(probes), pointer, tuple(allocators), current_stream, ordinal,
                    tuple(x for pair in zero for x in pair), tuple(nbytes), tuple(x for pair in disjoint for x in pair),
                    context, tuple(launches), on_error, keep, entry_points)
