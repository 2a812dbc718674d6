"""Fixtures shared by the fake-driver tests of the CUDA call path (test_call_path_fake, test_fastcall)."""

from __future__ import annotations

import pytest

from polytile import ops
from polytile.runtime.cuda import CUDAKernel


@pytest.fixture(scope="module")
def matmul(nvcc: str) -> CUDAKernel:
    """A float32 matmul of 70×50×30 that nvcc builds for sm_90a (no GPU needed; skipped without nvcc).
    The GPU tests' modules have their own, built for the GPU present."""
    return ops.matmul(70, 50, 30).build("cuda:sm_90a")
