"""The command line: `polytile run`, `polytile ops`, and clear errors."""

import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "polytile.cli", *args], capture_output=True, text=True,
                          timeout=300)


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
