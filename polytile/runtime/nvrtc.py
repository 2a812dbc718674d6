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
import struct
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
            if not re.search(r"Used \d+ registers", text):  # no report in the log (seen on the H200 host's 13.0)
                text += "".join(f"ptxas info    : Function properties for {name}\n"
                                f"ptxas info    : Used {n} registers (read from the cubin)\n"
                                for name, n in cubin_registers(cubin.raw).items())
            return cubin.raw, text
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


EIATTR_REGCOUNT = 0x2F  # a kernel's registers in a cubin's .nv.info: (symbol index, count)
EIFMT_SVAL = 0x04  # an attribute with a 16-bit size and that many bytes of value; the others take 4 bytes


def cubin_registers(cubin: bytes) -> dict[str, int]:
    """The registers of each kernel of a cubin, read from the ``EIATTR_REGCOUNT`` attributes of its
    ``.nv.info`` section and the symbol table; {} when the ELF is not one of these."""
    try:
        if cubin[:5] != b"\x7fELF\x02":
            return {}
        shoff, = struct.unpack_from("<Q", cubin, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
        sections = [struct.unpack_from("<IIQQQQII", cubin, shoff + k * shentsize) for k in range(shnum)]

        def text_at(table: int, at: int) -> str:
            start = sections[table][4] + at
            return cubin[start:cubin.index(b"\0", start)].decode()

        names = [text_at(shstrndx, sec[0]) for sec in sections]
        counts: dict[int, int] = {}
        if ".nv.info" in names:
            _, _, _, _, start, size, _, _ = sections[names.index(".nv.info")]
            at = start
            while at + 4 <= start + size:
                fmt, attr, length = cubin[at], cubin[at + 1], struct.unpack_from("<H", cubin, at + 2)[0]
                if fmt == EIFMT_SVAL:
                    if attr == EIATTR_REGCOUNT:
                        symbol, count = struct.unpack_from("<II", cubin, at + 4)
                        counts[symbol] = count
                    at += 4 + length
                else:
                    at += 4
        if not counts or ".symtab" not in names:
            return {}
        _, _, _, _, start, _, strings, _ = sections[names.index(".symtab")]
        return {text_at(strings, struct.unpack_from("<I", cubin, start + 24 * sym)[0]): count
                for sym, count in counts.items()}
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):
        return {}


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
