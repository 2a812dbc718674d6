"""The test harness itself: each test's random seed is the same in every run and every process."""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_rng_seed_does_not_depend_on_the_hash_seed(tmp_path):
    (tmp_path / "test_draw.py").write_text("def test_draw(rng):\n    print('draw', rng.random())\n")
    draws = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": os.pathsep.join(
            [str(TESTS), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "conftest", "-p", "no:cacheprovider",
                               "--rootdir", str(tmp_path), str(tmp_path / "test_draw.py")],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        draws |= {line for line in proc.stdout.splitlines() if line.startswith("draw")}
    assert len(draws) == 1, draws


def test_a_failing_test_reports_its_seed(tmp_path):
    (tmp_path / "test_fail.py").write_text("def test_fail(rng):\n    assert rng.random() > 1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_fail.py")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1
    assert "rng = np.random.default_rng(" in proc.stdout and "test_fail.py::test_fail" in proc.stdout
