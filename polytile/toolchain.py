"""The CUDA toolchain on this machine: where ``nvcc`` is and the flags that build for an architecture.

One detection for the package, the tests (the ``needs_nvcc`` marker), the benchmarks and the scripts:
``$NVCC``, then ``nvcc`` on the ``PATH``, then ``$CUDA_HOME/bin/nvcc``, then ``/usr/local/cuda/bin/nvcc``.
"""

from __future__ import annotations

import os
import shutil

from .errors import BuildError


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


def arch_flags(arch: str) -> list[str]:
    """nvcc's flags that build for ``arch`` ("sm_80", "sm_90a"): the gencode form, because the
    ``-arch`` shorthand of an arch-specific target (``sm_90a``) also runs a plain ``sm_90`` pass."""
    num = arch.removeprefix("sm_")
    return [f"-gencode=arch=compute_{num},code=sm_{num}"]
