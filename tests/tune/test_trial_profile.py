"""benchmarks/trial_profile.py: a CPU candidate built, checked and timed in-process, with the seconds of
its named phases (a phase whose function was renamed would read 0 and fail here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import trial_profile as bench  # noqa: E402


def test_a_cpu_trial_profile_names_its_phases(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "profile.json"
    assert bench.main(["--target", "cpu", "--candidates", "1", "--top", "5", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (row,) = result["candidates"]
    assert row["status"] == "ok" and row["cost_ms"] > 0
    assert all(row["build_phases"][p] > 0 for p in ("schedule", "lower", "ast_generation", "compiler"))
    assert all(row["run_phases"][p] > 0 for p in ("check_inputs", "checked_call", "timing"))
    assert row["build_phases"]["check_inputs"] == 0  # a CPU target's runner draws them
    assert len(result["top_build"]) == 5 and len(result["top_run"]) == 5
