"""Test configuration: GPU tests are skipped where no NVIDIA GPU is present, tests marked
``needs_nvcc`` where no CUDA toolkit is (``polytile.toolchain``, the package's own detection), and
each test gets its own random generator with a fixed seed, printed in the report when it fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import zlib

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


def seed_of(nodeid: str) -> int:
    """The seed of a test's generator: a stable hash of its id, the same in every run and process
    (Python's ``hash()`` of a string changes with PYTHONHASHSEED)."""
    return zlib.crc32(nodeid.encode())


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    seed = seed_of(request.node.nodeid)
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201 - a TestReport
    report = yield
    seed = dict(item.user_properties).get("seed")
    if report.failed and seed is not None:
        report.sections.append(("random seed", f"rng = np.random.default_rng({seed})  # {item.nodeid}"))
    return report
