"""A smoke run of the independent differential fuzzer (``tools/fuzz_independent.py``): a few cases
of a fixed seed must all pass, and a case must replay in-process with the same outcome."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "fuzz_independent.py"


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_independent_fuzzer_smoke(tmp_path):
    out = tmp_path / "indep.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--seed", "3", "--cases", "4", "--jobs", "2",
                        "--timeout", "120", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    rec = json.loads(out.read_text())
    assert rec["cases"] == 4 and rec["findings"] == 0
    assert sum(rec["counts"].values()) == 4
    assert rec["counts"].get("ok", 0) >= 3, rec["counts"]


def test_independent_fuzzer_replays_a_case():
    p = subprocess.run([sys.executable, str(SCRIPT), "--seed", "3", "--case", "0", "--script"],
                       capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "pt.create_schedule(f)" in p.stdout and '"outcome": "ok"' in p.stdout
