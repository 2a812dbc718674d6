"""On the GPU: patched kernels run and match the original; an illegal move is caught and rejected."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from polytile.sass.api import analyse, optimize
from polytile.sass.cubin import Control, Cubin
from polytile.sass.game import MeasurementFailed
from polytile.sass.launch import Buffer, CubinLaunch, Scalar
from polytile.sass.runner import Runner, RunnerSettings
from polytile.sass.schedule import random_legal
from polytile.sass.verify import host_inputs

pytestmark = pytest.mark.gpu

SETTINGS = RunnerSettings(reps=5, warmup=1)


@pytest.fixture(scope="module")
def fma_launch():
    pytest.importorskip("triton")
    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    from triton_kernels import fma3_launch

    return fma3_launch()


def test_patched_kernels_run_and_match(fma_launch):
    analysis = analyse(fma_launch)
    cubin = Cubin(fma_launch.cubin)
    with Runner(fma_launch, SETTINGS) as runner:
        assert runner.time(fma_launch.cubin) > 0
        for seed in range(3):
            schedule = random_legal(analysis, 12, seed)
            assert not schedule.is_original()
            patched = cubin.with_words(fma_launch.kernel, schedule.words())
            assert runner.verify(patched, seeds=(1, 2)) is None
            assert runner.time(patched) > 0


def _illegal_variant(analysis, cubin: Cubin, kernel: str) -> bytes:
    """Move a global load below the first instruction that reads its result, ignoring the mask."""
    for i, sem in enumerate(analysis.semantics):
        if analysis.instructions[i].base != "LDG" or not sem.defs:
            continue
        block = analysis.blocks[analysis.block_of[i]]
        for j in range(i + 1, block.end):
            if analysis.semantics[j].uses & sem.defs:
                order = list(range(len(analysis.instructions)))
                order.insert(j, order.pop(i))
                words = [analysis.kernel.words[k] for k in order]
                return cubin.with_words(kernel, words)
    pytest.skip("no global load with a reader in its block")


def test_illegal_move_is_caught_by_verification(fma_launch):
    analysis = analyse(fma_launch)
    cubin = Cubin(fma_launch.cubin)
    bad = _illegal_variant(analysis, cubin, fma_launch.kernel)
    with Runner(fma_launch, SETTINGS) as runner:
        try:
            verdict = runner.verify(bad, seeds=(1, 2, 3))
        except MeasurementFailed as exc:  # a fault is also a rejection
            verdict = str(exc)
        assert verdict is not None
        with pytest.raises(MeasurementFailed):
            runner.time(bad)  # the screen before timing rejects it too
        assert runner.verify(fma_launch.cubin, seeds=(4,)) is None  # the worker recovered


def test_optimize_returns_a_verified_kernel(fma_launch):
    result = optimize(fma_launch, budget=12, method="greedy", settings=SETTINGS, confirm_rounds=3)
    with Runner(fma_launch, SETTINGS) as runner:
        assert runner.verify(result.cubin, seeds=(21, 22)) is None
    assert result.report.speedup >= 1.0
    assert result.report.verified or result.cubin == fma_launch.cubin


def test_nvcc_sample_kernels(sample_cubins):
    n = 256
    launch = CubinLaunch(
        sample_cubins["sm_90a"].read_bytes(),
        "matmul",
        (n // 32, n // 32, 1),
        (256, 1, 1),
        (
            Buffer("a", "float32", (n, n)),
            Buffer("b", "float32", (n, n)),
            Buffer("c", "float32", (n, n), "out"),
            Scalar("m", "int32", n),
            Scalar("n", "int32", n),
            Scalar("k", "int32", n),
        ),
    )
    analysis = analyse(launch)
    cubin = Cubin(launch.cubin)
    with Runner(launch, SETTINGS) as runner:
        outputs = runner.outputs(launch.cubin, 5)
        inputs = host_inputs(launch, 5)
        ref = inputs["a"].astype(np.float64) @ inputs["b"].astype(np.float64)
        assert np.linalg.norm(outputs["c"] - ref) / np.linalg.norm(ref) < 1e-5
        for seed in range(2):
            patched = cubin.with_words("matmul", random_legal(analysis, 30, seed).words())
            assert runner.verify(patched, seeds=(1, 2)) is None


def _warp_sums_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """warp_sums of tests/sass/kernels/sample.cu in numpy: (y, the even elements of partial)."""
    s = np.concatenate([x.reshape(-1, 32), np.zeros((x.size // 32, 32), np.float32)], axis=1)
    for d in (16, 8, 4, 2, 1):
        s[:, :32] = s[:, :32] + s[:, d : d + 32]
    v = s[:, :32]
    y = v.copy()
    y[:, :31] = v[:, :31] - v[:, 1:]
    return y.reshape(-1), v.reshape(-1)


def test_lanes_that_talk_through_memory(sample_cubins):
    """warp_sums: each lane loads what another lane stored at an address that, for the lane itself,
    is disjoint from its own store. Hoisting such a load over the store (which the rules allowed
    while the same registers with other offsets counted as disjoint in shared memory) reads the
    step before's value; random legal schedules compute what the original does."""
    n = 32 * 512
    launch = CubinLaunch(
        sample_cubins["sm_90a"].read_bytes(),
        "warp_sums",
        (n // 32, 1, 1),
        (32, 1, 1),
        (
            Buffer("x", "float32", (n,)),
            Buffer("y", "float32", (n,), "out"),
            Buffer("partial", "float32", (2 * n,), "out"),
        ),
    )
    analysis = analyse(launch)
    cubin = Cubin(launch.cubin)
    # `vs[t] += vs[t + d]` after the store of the step before: STS [R7], R; LDS [R7]; LDS [R7+off]
    hoisted = None
    for i in range(2, len(analysis.instructions)):
        store, reload, load = (analysis.semantics[k].memory for k in (i - 2, i - 1, i))
        bases = [analysis.instructions[k].base for k in (i - 2, i - 1, i)]
        if bases == ["STS", "LDS", "LDS"] and store.address == reload.address == load.address:
            if store.offset == reload.offset != load.offset:
                hoisted = i
                break
    # (this nvcc may compile the steps differently: then the hoisting check has nothing to hoist, and
    # the reference and random-schedule checks below still run)
    bad = None
    if hoisted is not None:
        order = list(range(len(analysis.instructions)))
        order.insert(hoisted - 2, order.pop(hoisted))
        words = [replace(Control.from_word(w), reuse=0).apply(w) for w in analysis.kernel.words]
        bad = cubin.with_words("warp_sums", [words[k] for k in order])
    with Runner(launch, SETTINGS) as runner:
        outputs = runner.outputs(launch.cubin, 5)
        y, partial = _warp_sums_reference(host_inputs(launch, 5)["x"])
        np.testing.assert_array_equal(outputs["y"], y)
        np.testing.assert_array_equal(outputs["partial"][0::2], partial)
        if bad is not None:
            assert runner.verify(bad, seeds=(1, 2)) is not None  # the hazard is real on this GPU
        schedules = [random_legal(analysis, 20, seed) for seed in range(4)]
        assert sum(not s.is_original() for s in schedules) >= 2  # few moves are legal here
        for schedule in schedules:
            patched = cubin.with_words("warp_sums", schedule.words())
            assert runner.verify(patched, seeds=(1, 2)) is None, [m.describe(analysis) for m in schedule.path]
