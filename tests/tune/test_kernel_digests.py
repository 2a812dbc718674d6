"""benchmarks/kernel_digests.py: one line per candidate with its source's digest, the same from run to
run (what two commits are compared by when a change must leave every kernel as it was)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import kernel_digests as bench  # noqa: E402


def test_candidates_digests_repeat(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    first = bench.digests(["cpu"], 1, seed=3)
    assert len(first) == 3 and all(" source " in line for line in first)
    assert bench.digests(["cpu"], 1, seed=3) == first
    assert bench.digests(["cpu"], 1, seed=4) != first
