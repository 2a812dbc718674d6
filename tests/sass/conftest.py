"""Fixtures for the SASS optimizer tests: cubins built by nvcc, synthetic kernels, GPU skips."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

from polytile.sass.cubin import Control, KernelText
from polytile.sass.disasm import instruction_from_text
from polytile.toolchain import arch_flags

KERNELS = Path(__file__).parent / "kernels"
ARCHS = {"sm_90a": arch_flags("sm_90a"), "sm_90": ["-arch=sm_90"]}


def _gpu_available() -> bool:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sample_cubins(tmp_path_factory, nvcc) -> dict[str, Path]:
    """tests/sass/kernels/sample.cu built for sm_90a and sm_90."""
    out = tmp_path_factory.mktemp("cubins")
    paths = {}
    for arch, flags in ARCHS.items():
        path = out / f"sample_{arch}.cubin"
        subprocess.run([nvcc, "-cubin", *flags, "-o", str(path), str(KERNELS / "sample.cu")], check=True)
        paths[arch] = path
    return paths


def synthetic_kernel(
    rows: list[tuple[str, dict]], name: str = "synthetic", pinned: dict[int, str] | None = None
):
    """A KernelText and its instructions from (assembly text, control fields) rows.

    Words carry the row index in their low bits (so words differ) and the given control bits;
    unspecified fields default to stall 1, no barriers, no waits, no reuse.
    """
    words, instructions = [], []
    for i, (text, fields) in enumerate(rows):
        control = Control(
            **{
                "stall": 1,
                "yield_bit": 1,
                "write_barrier": 7,
                "read_barrier": 7,
                "wait_mask": 0,
                "reuse": 0,
                **fields,
            }
        )
        words.append(control.apply(i + 1))
        instructions.append(instruction_from_text(16 * i, text))
    kernel = KernelText(
        name=name,
        section_name=f".text.{name}",
        file_offset=0,
        words=tuple(words),
        pinned=pinned or {},
        params=(),
        param_bytes=0,
    )
    return kernel, instructions


@pytest.fixture
def synthetic():
    """The `synthetic_kernel` builder, for tests (a fixture, since tests/ is not a package)."""
    return synthetic_kernel
