"""Fixtures of the core tests: running a script under AddressSanitizer."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest


@pytest.fixture
def asan_run() -> Callable[[str], subprocess.CompletedProcess]:
    """Run a Python script in a process with the AddressSanitizer runtime preloaded (kernels built
    with ``-fsanitize=address`` then report any access outside their buffers)."""
    libs = [subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
            for name in ("libasan.so", "libstdc++.so")]
    if not all(lib and os.path.exists(lib) for lib in libs):
        pytest.skip("AddressSanitizer runtime not installed")
    # libstdc++ must be loaded with the sanitizer for the C++ exceptions of islpy to work under it
    env = dict(os.environ, LD_PRELOAD=":".join(libs), ASAN_OPTIONS="detect_leaks=0:abort_on_error=0")

    def run(script: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    return run
