"""NVRTC through ctypes: generated CUDA C++ to a cubin inside this process (``compile_cuda`` with
``POLYTILE_CUDA_COMPILER=nvrtc``).

nvcc spends about 0.45 s of CPU time on every kernel before the kernel's own code: a process for
gcc's preprocessing (``cuda_runtime.h`` is included in front of every source) and cicc's parsing of
it. NVRTC parses no host headers and starts no process, so a small wgmma GEMM candidate compiles in
0.1 s instead of 0.55 s; ptxas's time, most of a large tile's compile, is the same (2026-11-29, the
2-core VM, CUDA 13.0.88 both). Its code is not nvcc's: NVRTC addresses shared memory with 64-bit
pointers where nvcc's cicc uses 32-bit ones, so the SASS differs (often a few more instructions);
hence an opt-in, whose kernels every build of the process shares (the tuned and the final build).

The generated sources include ``<stdint.h>``, which NVRTC does not ship: it is given here as a header
of its own (the LP64 typedefs of glibc's). Sources that include any other host header (the
index-array checks' ``<limits>``) are compiled by nvcc (``nvrtc_can_compile``).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import re
import threading
from collections.abc import Sequence

from ..errors import BuildError
from ..toolchain import cuda_include, find_nvrtc

STDINT_H = b"""#pragma once
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long uint64_t; typedef long intptr_t; typedef unsigned long uintptr_t;
"""
"""``<stdint.h>`` for NVRTC: glibc's types on x86-64 and aarch64 Linux (LP64), which nvcc's builds see."""

HEADERS = {"stdint.h": STDINT_H}
OPTIONS = ("-std=c++17", "-Xptxas=-v")  # after -arch: C++17 as nvcc's builds; ptxas's resource report in the log
TOOLKIT_HEADERS = frozenset({"cuda_fp16.h", "cuda_bf16.h"})  # found through -I<the toolkit's include>


def nvrtc_can_compile(source: str) -> bool:
    """Whether every header ``source`` includes is one NVRTC is given (``HEADERS``, the toolkit's
    16-bit float headers)."""
    names = re.findall(r"^\s*#\s*include\s*[<\"]([^>\"]+)[>\"]", source, flags=re.MULTILINE)
    return all(name in HEADERS or name in TOOLKIT_HEADERS for name in names)


class Nvrtc:
    """The NVRTC library of one path (its builtins library loaded first, beside it)."""

    def __init__(self, path: str):
        self.path = path
        folder, name = os.path.split(path)
        m = re.match(r"libnvrtc\.so\.(\d+)", name)
        if folder and m:  # NVRTC opens libnvrtc-builtins.so.<major>.<minor> by name: load it first, globally
            for builtins in sorted(glob.glob(os.path.join(folder, f"libnvrtc-builtins.so.{m.group(1)}.*"))):
                if ".alt." not in builtins:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                    break
        self.lib = ctypes.CDLL(path)
        if not hasattr(self.lib, "nvrtcGetCUBIN"):  # before CUDA 11.1: PTX only
            raise BuildError(f"NVRTC ({path}) cannot write cubins; use CUDA 11.1 or later")
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise BuildError(f"NVRTC ({self.path}): {what} failed: {self.lib.nvrtcGetErrorString(status).decode()}")

    def compile(self, source: str, arch: str, name: str = "kernel.cu") -> tuple[bytes, str]:
        """The cubin of ``source`` for ``arch`` ("sm_90a") and the compile log (ptxas's resource report
        included); a ``BuildError`` with the log when NVRTC rejects the source."""
        lib = self.lib
        prog = ctypes.c_void_p()
        names = list(HEADERS)
        texts = (ctypes.c_char_p * len(names))(*(HEADERS[n] for n in names))
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), len(names), texts,
                                           (ctypes.c_char_p * len(names))(*(n.encode() for n in names))),
                    "nvrtcCreateProgram")
        try:
            opts = [f"-arch={arch}", *OPTIONS]
            include = cuda_include()
            if include is not None:
                opts.append(f"-I{include}")
            argv = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
            status = lib.nvrtcCompileProgram(prog, len(opts), argv)
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            log = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            text = log.value.decode(errors="replace")
            if status != 0:
                raise BuildError(f"NVRTC rejected the generated CUDA ({lib.nvrtcGetErrorString(status).decode()}):\n"
                                 f"{text[-4000:]}")
            self._check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            return cubin.raw, text
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


_LOCK = threading.Lock()


@functools.cache
def _load(path: str) -> Nvrtc:
    return Nvrtc(path)


def nvrtc() -> Nvrtc | None:
    """This machine's NVRTC (``toolchain.find_nvrtc``), loaded once; None when there is none or it
    cannot be loaded."""
    path = find_nvrtc()
    if path is None:
        return None
    with _LOCK:
        try:
            return _load(path)
        except (OSError, BuildError):  # not loadable, or too old to write cubins
            return None


def options_key(lib: Nvrtc, arch: str) -> Sequence[str]:
    """What a cubin of ``lib`` depends on besides the source (the build cache's key)."""
    return ["nvrtc", f"{lib.version[0]}.{lib.version[1]}", lib.path, arch, *OPTIONS, str(cuda_include())]
