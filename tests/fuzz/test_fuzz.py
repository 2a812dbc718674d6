"""The differential fuzzer in CI: cases 0, 1, … of one seed (at most CASES), as many as start within
BUDGET seconds; the ones running then finish, so a slower machine runs a shorter prefix, never for
much longer. A miscompile, crash, hang or internal error fails the test with its replay command
(``polytile fuzz --seed S --case K --minimize`` turns one into a small pytest file); refusals do
not.

KNOWN lists the cases that fail today because of a finding another branch fixes (the findings are
described, with minimized snippets, in the project's fuzz findings notes). A known case that no
longer fails also fails the test, so that the list shrinks as the fixes land: remove its entry (a
known hang is not checked: whether a slow build ends within the time limit depends on the machine)."""

import os

import pytest

from polytile.fuzz.runner import Result, campaign

SEED = 101
CASES = 240
BUDGET = 140.0  # seconds of starting cases; the ones running then finish
CASE_TIMEOUT = 60.0

KNOWN: dict[int, tuple[str, str]] = {}  # case of SEED: (kind, finding; who fixes it)


@pytest.mark.slow
def test_fuzz_campaign_finds_nothing_new():
    summary = campaign(SEED, CASES, BUDGET, jobs=min(2, os.cpu_count() or 1), timeout=CASE_TIMEOUT)
    failed = {r.index: r for r in summary.findings}
    new = [r for i, r in sorted(failed.items()) if i not in KNOWN]
    # cases 0 … cases-1 ran
    fixed = [i for i, (kind, _) in sorted(KNOWN.items()) if i < summary.cases and i not in failed and kind != "hang"]
    report = "\n".join([f"seed {SEED}: {summary.line()}"]
                       + [f"NEW {_line(r)}" for r in new]
                       + [f"known ({KNOWN[i][1]}): {_line(r)}" for i, r in sorted(failed.items()) if i in KNOWN]
                       + [f"FIXED (remove it from KNOWN): case {i}, {KNOWN[i][1]}" for i in fixed])
    print(report)
    assert not new and not fixed, report


def _line(r: Result) -> str:
    return f"{r.kind} at {r.phase}: {r.detail[:200]}\n    {r.replay_command()}"
