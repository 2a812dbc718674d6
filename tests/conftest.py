"""Test configuration: GPU tests are skipped where no NVIDIA GPU is present; each test gets its own
random generator with a fixed seed printed on failure."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    seed = abs(hash(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)
