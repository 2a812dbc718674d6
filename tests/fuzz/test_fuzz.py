"""The differential fuzzer in CI: a fixed list of seeds for a bounded time (about two minutes on two
cores). Any miscompile, crash, hang or internal error fails the test with its replay command;
``polytile fuzz --seed S --case K --minimize`` turns one into a small pytest file."""

import pytest

from polytile.fuzz.runner import Summary, campaign

SEEDS = (101, 102)
CASES_PER_SEED = 60
BUDGET_PER_SEED = 65.0  # seconds; a slower machine runs fewer cases, never for longer
CASE_TIMEOUT = 30.0


@pytest.mark.slow
def test_fuzz_campaign_finds_nothing():
    findings, lines = [], []
    for seed in SEEDS:
        summary: Summary = campaign(seed, CASES_PER_SEED, BUDGET_PER_SEED, jobs=2, timeout=CASE_TIMEOUT)
        lines.append(f"seed {seed}: {summary.line()}")
        findings += summary.findings
    report = "\n".join(lines + [f"{f.kind} at {f.phase}: {f.detail[:200]}\n    {f.replay_command()}"
                                for f in findings])
    print(report)
    assert not findings, report
