"""A compiler run that hangs is stopped after ``POLYTILE_COMPILE_TIMEOUT`` seconds with a ``BuildError``
naming what was being built and the variable to raise (``polytile.toolchain.run_compiler``), not a
build that never returns."""

from __future__ import annotations

import os
import stat
import time

import numpy as np
import pytest

import polytile as pt
from polytile import toolchain
from polytile.errors import BuildError


def _hanging_compiler(tmp_path):
    path = tmp_path / "slowcc"
    # hangs on a kernel, fails at once on the toolchain's probes
    path.write_text('#!/bin/sh\ncase "$*" in *kernel.c*) sleep 30;; *) exit 1;; esac\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_hanging_compiler_is_stopped_with_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(toolchain.COMPILE_TIMEOUT_VARIABLE, "0.5")
    start = time.monotonic()
    with pytest.raises(BuildError, match=r"slowcc ran past 0.5 s building a test kernel.*POLYTILE_COMPILE_TIMEOUT"):
        toolchain.run_compiler([_hanging_compiler(tmp_path), "kernel.cpp"], "a test kernel")
    assert time.monotonic() - start < 10


def test_a_cpu_build_with_a_hanging_compiler_raises_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv(toolchain.COMPILE_TIMEOUT_VARIABLE, "0.5")
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", _hanging_compiler(tmp_path))
    A = pt.placeholder((7,), "float32", "A")
    B = pt.compute((7,), lambda i: A[i] * 3.0 + float(np.pi), "B")
    with pytest.raises(BuildError, match="building a CPU kernel"):
        pt.build(pt.Func([A], [B]), target="cpu")


@pytest.mark.parametrize("raw", ["soon", "0", "-3"])
def test_a_bad_timeout_setting_is_refused(monkeypatch, raw):
    monkeypatch.setenv(toolchain.COMPILE_TIMEOUT_VARIABLE, raw)
    with pytest.raises(BuildError, match=toolchain.COMPILE_TIMEOUT_VARIABLE):
        toolchain.compile_timeout()


def test_the_default_timeout_leaves_real_builds_alone():
    os.environ.pop(toolchain.COMPILE_TIMEOUT_VARIABLE, None)
    assert toolchain.compile_timeout() == toolchain.DEFAULT_COMPILE_TIMEOUT
