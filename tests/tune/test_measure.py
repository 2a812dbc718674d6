"""Measurement survives faulty candidates: a segfaulting kernel, a never-returning one, a wrong result
and a device error each cost one trial, are recorded with their reason, and tuning goes on."""

from __future__ import annotations

import json

import faulty
import pytest

from polytile.tune import MeasureOptions, RecordLog, make_task, tune_task
from polytile.tune.space import TuneError
from polytile.tune.workers import Crashed, Raised, Returned, TimedOut, WorkerPool


def _sleep(seconds: float) -> float:
    import time
    time.sleep(seconds)
    return seconds


def _segfault() -> None:
    import ctypes
    ctypes.string_at(0)


def _fail() -> None:
    raise ValueError("boom")


def _driver_fault() -> None:
    from polytile.runtime.cuda_driver import CudaError
    raise CudaError("cuCtxSynchronize failed: CUDA_ERROR_LAUNCH_FAILED")


def test_worker_pool_reports_each_outcome_and_keeps_serving():
    with WorkerPool(2) as pool:
        outs = pool.map(_sleep, [(0.0,), (30.0,), (0.1,)], timeout=3.0)
        assert isinstance(outs[0], Returned) and outs[0].value == 0.0
        assert isinstance(outs[1], TimedOut)
        assert isinstance(outs[2], Returned)
        crashed = pool.call(_segfault, (), timeout=10.0)
        assert isinstance(crashed, Crashed) and crashed.signal == "SIGSEGV"
        raised = pool.call(_fail, (), timeout=10.0)
        assert isinstance(raised, Raised) and raised.kind == "ValueError" and not raised.polytile
        assert isinstance(pool.call(_sleep, (0.0,), timeout=10.0), Returned)


def test_workers_start_together_and_are_not_waited_for():
    """Submitting calls starts their workers and returns at once (a worker's start is not waited for:
    before, each call waited for its worker to start, so the workers of a batch started one after
    another); the calls then run as the workers become ready, and a worker that dies while starting
    is reported."""
    with WorkerPool(3) as pool:
        tickets = [pool.submit(_sleep, (0.2,), timeout=60.0) for _ in range(3)]
        assert len(pool._workers) == 3 and not any(w.ready for w in pool._workers)
        assert pool.poll(0) == []  # none is ready yet: nothing waits
        outs = {}
        while len(outs) < 3:
            outs.update(pool.poll())
        assert sorted(outs) == tickets and all(isinstance(o, Returned) for o in outs.values())
    with WorkerPool(1, {"PYTHONPATH": "", "PYTHONHOME": "/nonexistent"}) as broken:
        with pytest.raises(TuneError, match="failed to start"):
            broken.call(_sleep, (0.0,), timeout=60.0)


def test_a_driver_error_is_a_device_error_and_replaces_the_runner():
    """CudaError (what the driver layer raises for a faulted kernel) is a DeviceError: the trial is a
    device_error and the runner, whose context is unusable, is replaced."""
    from polytile.tune.measure import _failure
    with WorkerPool(1) as pool:
        raised = pool.call(_driver_fault, (), timeout=30.0)
    assert isinstance(raised, Raised) and raised.kind == "CudaError"
    assert _failure(raised, "")[0] == "device_error"


def test_a_paused_pool_stops_its_calls_and_their_deadlines():
    import time
    with WorkerPool(1) as pool:
        pool.call(_sleep, (0.0,), timeout=30.0)  # started
        pool.submit(_sleep, (1.0,), timeout=2.0)
        pool.pause()
        time.sleep(2.5)  # longer than the deadline: stopped, the call neither runs nor overruns
        assert pool.poll(0) == []
        pool.resume()
        (ticket, outcome), = pool.poll()
        assert isinstance(outcome, Returned) and outcome.value == 1.0


def _placement() -> tuple[list[int], str | None]:
    import os
    return sorted(os.sched_getaffinity(0)), os.environ.get("OMP_NUM_THREADS")


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="needs two cores to split")
def test_runner_cores_keep_the_runner_and_the_builders_on_cores_of_their_own():
    """runner_cores=1: the runner on the last core this process may use, with one OpenMP thread; the
    builders (as many as the other cores, by default) on the others; the builders then build on while a
    kernel is timed (a CPU runner that shares their cores stops them)."""
    import os

    from polytile.tune.measure import Measurer, cpu_partition
    mine = sorted(os.sched_getaffinity(0))
    task = make_task("layernorm", "cpu", M=7, N=33)
    with Measurer(MeasureOptions(runner_cores=1, result_cache=False)) as m:
        assert m.partition == cpu_partition(1)
        assert m.partition.runner == {mine[-1]} and m.partition.others == set(mine[:-1])
        assert m.builders.size == len(mine) - 1
        runner, builder = m.runner.call(_placement, (), 60.0), m.builders.call(_placement, (), 60.0)
        assert not m._pausing(task)
    assert runner.value == ([mine[-1]], "1")
    assert builder.value == (mine[:-1], "1")
    with Measurer(MeasureOptions(result_cache=False)) as shared:
        assert shared.partition is None and shared._pausing(task)
        assert shared.runner.call(_placement, (), 60.0).value[0] == mine
    assert MeasureOptions(runner_cores=1).kernel_threads == 1
    assert MeasureOptions(runner_cores=1, threads=2).kernel_threads == 2
    with pytest.raises(TuneError, match="runner_cores=.* must leave the builders"):
        cpu_partition(len(mine))
    with pytest.raises(TuneError, match="runner_cores must be at least 0"):
        MeasureOptions(runner_cores=-1)
    with pytest.raises(TuneError, match="leave runner_cores at 0 with cluster="):  # before connecting
        tune_task(task, 1, None, measure=MeasureOptions(runner_cores=1), cluster="tcp://127.0.0.1:1",
                  progress=False)


def test_faulty_candidates_are_survived_and_recorded(tmp_path):
    records = tmp_path / "faulty.jsonl"
    task = make_task(faulty.make_func(), "cpu", template=faulty.faulty)
    assert task.space.size == 5
    opts = MeasureOptions(builders=2, run_timeout=8.0, repeat=3, min_time=0.0, result_cache=False,
                          before_run=faulty.misbehave)
    result = tune_task(task, trials=5, records=records, tuner="grid", batch_size=5, measure=opts,
                       progress=False, verify=False)
    by_mode = {r.config["mode"]: r for r in result.records}
    assert set(by_mode) == {"ok", "crash", "hang", "wrong", "device"}
    assert by_mode["ok"].status == "ok" and by_mode["ok"].cost > 0
    assert by_mode["crash"].status == "crash" and "SIGSEGV" in by_mode["crash"].error
    assert by_mode["hang"].status == "timeout"
    assert by_mode["wrong"].status == "wrong_result" and "relative error" in by_mode["wrong"].error
    assert by_mode["device"].status == "device_error" and "ILLEGAL_ADDRESS" in by_mode["device"].error
    assert result.best is not None and result.best.config == {"mode": "ok"}
    assert result.kernel is not None  # built from the one good configuration
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    trials = [x for x in lines if x["role"] == "trial"]
    assert sorted(x["status"] for x in trials) == sorted(r.status for r in result.records)
    assert [x["config"] for x in lines if x["role"] == "winner"] == [{"mode": "ok"}]
    assert len(RecordLog(records).select(task.key, task.target.key)) == 5


def test_odd_shape_check_builds_the_configuration_at_other_sizes():
    from polytile.tune.measure import odd_workload
    task = make_task("matmul", "cpu", M=512, N=384, K=64)
    odd = dict(odd_workload(task).shape)
    assert (odd["M"], odd["N"], odd["K"]) == (509, 383, 61)
    conv = make_task("conv2d", "cpu", N=1, C=16, H=14, W=14, K=16, R=3, S=3, stride=1, padding=1)
    odd_conv = dict(odd_workload(conv).shape)
    assert odd_conv["R"] == 3 and odd_conv["H"] == 13 and odd_conv["N"] == 1


@pytest.mark.slow
def test_best_matmul_is_checked_at_odd_sizes(tmp_path):
    task = make_task("matmul", "cpu", M=64, N=64, K=64)
    result = tune_task(task, trials=2, records=tmp_path / "r.jsonl", tuner="random", batch_size=2,
                       measure=MeasureOptions(repeat=3, min_time=0.0), progress=False, verify=True)
    assert result.verified and result.kernel is not None


def test_kernels_that_do_not_pickle_are_rebuilt_in_the_runner():
    import threading

    import numpy as np

    from polytile.tune.measure import load_kernel, pack_kernel

    class DeviceKernel:  # like a GPU kernel holding driver handles
        lock = threading.Lock()

        def __reduce__(self):  # noqa: ANN204
            raise TypeError("cannot pickle a driver handle")

    task = make_task("softmax", "cpu", M=8, N=24)
    values = task.space.config_at(0).values
    art = pack_kernel(DeviceKernel(), task, values)
    assert art.kind == "rebuild"
    kern = load_kernel(art)
    x = task.op.make_inputs(np.random.default_rng(0))
    assert np.allclose(kern(*x), task.op.reference(*x), rtol=1e-5)


def test_every_status_is_documented():
    from polytile.tune.measure import STATUSES
    text = (__import__("pathlib").Path(__file__).parents[2] / "docs" / "tuning.md").read_text()
    assert all(f"`{s}`" in text for s in STATUSES)


def test_the_streaming_measurer_starts_its_runner_with_the_first_build():
    """The runner is started (and readied: runtime imported, operator instantiated) when the first
    candidate of a workload is submitted, not after its build; the trial's result is unaffected."""
    import numpy as np

    from polytile.tune.measure import Measurer
    task = make_task("matmul", "cpu", M=24, N=20, K=18)
    values = task.space.config(task.space.sample_valid(np.random.default_rng(0), 1)[0]).values
    with Measurer(MeasureOptions(builders=1, repeat=2, min_time=0.0, warmup=0, result_cache=False)) as m:
        trial = m.submit(task, values)
        assert len(m.runner._workers) == 1 and m.unbuilt == 1  # started while the candidate builds
        done = []
        while not done:
            done = m.collect()
    assert done[0][0] == trial and done[0][1].status == "ok" and done[0][1].costs
