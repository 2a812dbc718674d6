"""``make demo`` (python -m polytile.demo): the CPU demo on a machine without a GPU."""

import os
import subprocess
import sys


def test_demo_runs_on_the_cpu_without_a_gpu():
    proc = subprocess.run([sys.executable, "-m", "polytile.demo", "--size", "96"], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "POLYTILE_NO_GPU": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the CPU demo" in proc.stdout and "CPU: " in proc.stdout
    assert "matmul(K=96,M=96,N=96) float32" in proc.stdout and "conv2d(" in proc.stdout
    assert proc.stdout.count("(ok)") == 2 and "x its speed" in proc.stdout
