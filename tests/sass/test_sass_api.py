"""optimize() end to end with a fake worker: wrong variants are never returned."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from polytile.sass.api import optimize
from polytile.sass.cubin import Cubin
from polytile.sass.launch import Buffer, CubinLaunch, Scalar
from polytile.sass.runner import RunnerSettings

FAKE = [sys.executable, str(Path(__file__).parent / "fake_worker.py")]


def matmul_launch(path: Path) -> CubinLaunch:
    n = 64
    return CubinLaunch(
        path.read_bytes(),
        "matmul",
        (2, 2, 1),
        (256, 1, 1),
        (
            Buffer("a", "float32", (n, n)),
            Buffer("b", "float32", (n, n)),
            Buffer("c", "float32", (n, n), role="out"),
            Scalar("m", "int32", n),
            Scalar("n", "int32", n),
            Scalar("k", "int32", n),
        ),
    )


def changed(a: bytes, b: bytes) -> int:
    return sum(a[i : i + 16] != b[i : i + 16] for i in range(0, len(a), 16))


def test_rejected_candidates_are_skipped_and_the_returned_one_verifies(sample_cubins, monkeypatch):
    monkeypatch.setenv("FAKE_REJECT_ABOVE", "6")
    launch = matmul_launch(sample_cubins["sm_90a"])
    result = optimize(
        launch,
        budget=30,
        method="greedy",
        settings=RunnerSettings(command=FAKE),
        candidates=100,
        confirm_rounds=1,
    )
    report = result.report
    assert report.rejected, "the fake should have rejected the most changed candidates"
    assert 0 < changed(launch.cubin, result.cubin) <= 6
    assert report.verified and report.speedup > 1.0
    assert len(report.moves) == len(result.schedule.path) and any("paid off" in m for m in report.moves)
    assert Cubin(result.cubin).kernel("matmul").words == tuple(result.schedule.words())
    assert "matmul" in report.format()


def test_a_candidate_failing_when_re_timed_is_rejected_and_the_run_goes_on(sample_cubins, monkeypatch):
    """A variant may pass the screen and the verification and still fault later (a timing-dependent
    hazard): the confirmation timings reject it and the run goes on with the next candidate; what comes
    back is a confirmed variant or the original."""
    monkeypatch.setenv("FAKE_REJECT_ABOVE", "100")
    monkeypatch.setenv("FAKE_FLAKY_ABOVE", "0")
    launch = matmul_launch(sample_cubins["sm_90a"])
    result = optimize(
        launch, budget=12, method="greedy", settings=RunnerSettings(command=FAKE), confirm_rounds=1
    )
    report = result.report
    assert any("confirmation" in r for r in report.rejected)
    assert report.verified == (result.cubin != launch.cubin)
    assert report.verified or report.speedup == 1.0


def test_nothing_verified_returns_the_original(sample_cubins, monkeypatch):
    monkeypatch.setenv("FAKE_REJECT_ABOVE", "0")
    launch = matmul_launch(sample_cubins["sm_90a"])
    result = optimize(
        launch, budget=10, method="random", settings=RunnerSettings(command=FAKE), confirm_rounds=1
    )
    assert result.cubin == launch.cubin and not result.report.verified and result.report.speedup == 1.0


def test_other_objects_are_refused():
    with pytest.raises(TypeError, match="CubinLaunch"):
        optimize(object())
