"""Test configuration: GPU tests are skipped where no NVIDIA GPU is present, tests marked
``needs_nvcc`` where no CUDA toolkit is (``polytile.toolchain``, the package's own detection), and
each test gets its own random generator."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from polytile.toolchain import find_nvcc


def _has_gpu() -> bool:
    if os.environ.get("POLYTILE_NO_GPU"):
        return False
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


HAS_GPU = _has_gpu()
NVCC = find_nvcc()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    no_nvcc = pytest.mark.skip(reason="needs nvcc (the CUDA toolkit; set NVCC=/path/to/nvcc)")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(no_gpu)
        if "needs_nvcc" in item.keywords and NVCC is None:
            item.add_marker(no_nvcc)


@pytest.fixture(scope="session")
def nvcc() -> str:
    """The path of nvcc (the test is skipped without one)."""
    if NVCC is None:
        pytest.skip("needs nvcc (the CUDA toolkit; set NVCC=/path/to/nvcc)")
    return NVCC


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    seed = abs(hash(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)
