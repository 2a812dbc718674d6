"""benchmarks/replan_cost.py: the tuner's seconds per model-guided proposal, and a digest of what it
proposed that is the same from run to run (what two versions of the tuner are compared by)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import replan_cost as bench  # noqa: E402


def test_replanning_is_timed_and_its_proposals_repeat():
    first = bench.replan_costs("cuda", 2)
    again = bench.replan_costs("cuda", 2)
    assert len(first["cpu_s"]) == 2 and all(s > 0 for s in first["cpu_s"])
    assert first["digest"] == again["digest"]
