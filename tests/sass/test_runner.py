"""Crash, fault and hang isolation of the measurement worker, with a fake worker process."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from polytile.sass.game import MeasurementFailed
from polytile.sass.launch import Buffer, CubinLaunch, LaunchError, Scalar
from polytile.sass.runner import Runner, RunnerSettings, WorkerError
from polytile.sass.verify import POISON, compare, host_inputs

FAKE = [sys.executable, str(Path(__file__).parent / "fake_worker.py")]


def launch(cubin=b"original") -> CubinLaunch:
    return CubinLaunch(
        cubin=cubin,
        kernel="k",
        grid=(1, 1, 1),
        block=(32, 1, 1),
        args=(Buffer("x", "float32", (8,)), Buffer("y", "float32", (8,), role="out")),
    )


@pytest.fixture
def runner():
    with Runner(launch(), RunnerSettings(command=FAKE, timeout_s=2.0)) as r:
        yield r


def pid(runner) -> int:
    return runner.request(("pid", b"x"))


def test_measures_and_keeps_one_worker(runner):
    assert runner.time(b"abc") == 3.0
    first = pid(runner)
    assert runner.time(b"abcdef") == 6.0 and pid(runner) == first
    assert runner.device["device"] == "fake GPU"


@pytest.mark.parametrize(
    "variant, message",
    [
        (b"crash", "worker died"),
        (b"hang", "no answer"),
        (b"fault", "ILLEGAL_ADDRESS"),
    ],
)
def test_a_bad_variant_costs_one_measurement_and_a_restart(runner, variant, message):
    before = pid(runner)
    start = time.monotonic()
    with pytest.raises(MeasurementFailed, match=message):
        runner.time(variant)
    assert time.monotonic() - start < 10
    assert runner.time(b"ok") == 2.0
    assert pid(runner) != before and runner.restarts == 1


def test_wrong_results_keep_the_worker(runner):
    before = pid(runner)
    with pytest.raises(MeasurementFailed, match="wrong results"):
        runner.time(b"wrong")
    assert pid(runner) == before and runner.restarts == 0


def test_verification_reports_the_difference(runner):
    assert runner.verify(b"fine") is None
    assert "differs" in runner.verify(b"subtly-wrong")


def test_setup_failure_is_a_worker_error():
    with (
        Runner(launch(b"broken-original"), RunnerSettings(command=FAKE)) as r,
        pytest.raises(WorkerError, match="could not set up"),
    ):
        r.time(b"x")


def test_inputs_are_random_outputs_poisoned_and_comparison_is_bitwise():
    l = CubinLaunch(
        cubin=b"",
        kernel="k",
        grid=(1, 1, 1),
        block=(1, 1, 1),
        args=(
            Buffer("x", "float16", (64,)),
            Buffer("i", "int32", (64,), init="randint:0:8"),
            Buffer("b", "bfloat16", (4,)),
            Buffer("y", "float32", (64,), role="out"),
        ),
    )
    a, b = host_inputs(l, 1), host_inputs(l, 2)
    assert np.all(a["x"] != 0) and not np.array_equal(a["x"], b["x"])
    assert a["i"].min() >= 0 and a["i"].max() < 8 and a["b"].dtype == np.uint16
    assert np.all(a["y"].view(np.uint8) == POISON)
    out = {"y": np.arange(64, dtype=np.float32)}
    same = {"y": out["y"].copy()}
    assert compare(l, out, same) is None
    changed = {"y": out["y"].copy()}
    changed["y"][5] = np.nextafter(changed["y"][5], np.float32(100))
    mismatch = compare(l, out, changed)
    assert mismatch.elements == 1 and mismatch.first_index == 5


def test_unwritten_poison_is_an_infinite_error_not_zero():
    """Elements a variant never wrote keep the poison, a NaN: that is no error of 0."""
    l = CubinLaunch(b"", "k", (1, 1, 1), (1, 1, 1), (Buffer("y", "float32", (8,), role="out"),))
    want = {"y": np.arange(8, dtype=np.float32)}
    got = {"y": want["y"].copy()}
    got["y"][5:] = host_inputs(l, 0)["y"][5:]  # left as poisoned
    mismatch = compare(l, want, got)
    assert (mismatch.elements, mismatch.first_index, mismatch.max_abs_error) == (3, 5, np.inf)
    assert "max |error| inf" in str(mismatch)
    got["y"][6] = 100.0  # a finite error among the NaNs does not hide them
    assert compare(l, want, got).max_abs_error == np.inf
    nan_bits = np.full(8, np.nan, np.float32)
    other_nan = nan_bits.view(np.uint32) | 1
    assert compare(l, {"y": nan_bits}, {"y": other_nan.view(np.float32)}).max_abs_error == 0.0
    ints = CubinLaunch(b"", "k", (1, 1, 1), (1, 1, 1), (Buffer("y", "int32", (4,), role="out"),))
    assert compare(ints, {"y": np.arange(4, dtype=np.int32)}, {"y": -np.ones(4, np.int32)}).max_abs_error == 4


def test_launch_is_checked_against_the_kernel_parameters(sample_cubins):
    cubin = sample_cubins["sm_90a"].read_bytes()
    good = CubinLaunch(
        cubin,
        "saxpy",
        (4, 1, 1),
        (256, 1, 1),
        (
            Scalar("n", "int32", 1000),
            Scalar("a", "float32", 2.0),
            Buffer("x", "float32", (1000,)),
            Buffer("y", "float32", (1000,), role="inout"),
        ),
    )
    good.check()
    bad = CubinLaunch(
        cubin,
        "saxpy",
        (4, 1, 1),
        (256, 1, 1),
        (
            Scalar("n", "int64", 1000),
            Buffer("x", "float32", (1000,)),
            Buffer("y", "float32", (1000,), role="inout"),
        ),
    )
    with pytest.raises(LaunchError, match="takes 4 parameters"):
        bad.check()
