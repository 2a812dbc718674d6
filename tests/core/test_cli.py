"""The command line: `polytile run`, `polytile ops`, and clear errors."""

import os
import re
import shutil
import subprocess
import sys

import pytest

HAS_NVCC = shutil.which("nvcc") is not None or os.path.exists("/usr/local/cuda/bin/nvcc")
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="needs nvcc")


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "polytile.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_run_matmul_prints_time_and_numpy():
    proc = run("run", "matmul", "--shape", "64,48,40", "--repeat", "3")
    assert proc.returncode == 0, proc.stderr
    assert "relative error" in proc.stdout and "(ok)" in proc.stdout
    assert "GFLOP/s" in proc.stdout and "numpy" in proc.stdout


def test_run_with_named_sizes_and_source():
    proc = run("run", "softmax", "--shape", "M=8,N=33", "--show-source", "--repeat", "2")
    assert proc.returncode == 0, proc.stderr
    assert 'extern "C"' in proc.stdout


def test_ops_lists_operators():
    proc = run("ops")
    assert proc.returncode == 0 and "matmul" in proc.stdout and "spmm" in proc.stdout


def test_unknown_operator_is_a_clear_error():
    proc = run("run", "matmull")
    assert proc.returncode == 2
    assert "unknown operator 'matmull'" in proc.stderr
    assert "Traceback" not in proc.stderr


@needs_nvcc
def test_run_cuda_without_gpu_compiles_and_reports_resources():
    proc = run("run", "matmul", "--shape", "64,48,40", "--target", "cuda:sm_90a", "--source",
               env={"POLYTILE_NO_GPU": "1"})
    assert proc.returncode == 0, proc.stderr
    assert 'extern "C" __global__' in proc.stdout and "(sm_90a)" in proc.stdout
    assert re.search(r"kernel matmul_kernel0: grid \(\d+, \d+, 1\), block \(\d+, \d+, 1\);", proc.stdout)
    assert "registers" in proc.stdout and "B spilled" in proc.stdout
    assert "no GPU found: the kernel was compiled for sm_90a but not run" in proc.stdout


@needs_nvcc
def test_run_cuda_tensor_cores_with_dtype():
    proc = run("run", "matmul", "--shape", "M=64,N=64,K=64", "--dtype", "float16", "--target", "cuda:sm_80",
               "--source", env={"POLYTILE_NO_GPU": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "mma.sync.aligned.m16n8k16" in proc.stdout and "(sm_80)" in proc.stdout


def test_unknown_cuda_architecture_is_a_clear_error():
    proc = run("run", "matmul", "--shape", "64,48,40", "--target", "cuda:sm_12", env={"POLYTILE_NO_GPU": "1"})
    assert proc.returncode == 2
    assert "'sm_12' is not a known architecture" in proc.stderr and "Traceback" not in proc.stderr
