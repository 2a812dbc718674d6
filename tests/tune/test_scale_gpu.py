"""Measurement at scale on GPUs (gpu marker): the per-GPU runner survives a faulting candidate, two
GPUs measured at once pick the same winner as one, and the Dask backend measures on a GPU worker."""

from __future__ import annotations

import faulty
import pytest

from polytile.tune import MeasureOptions, make_task, tune_task
from polytile.tune.api import gpu_names

pytestmark = pytest.mark.gpu

FAST = MeasureOptions(repeat=20, min_time=0.05, result_cache=False)


def test_the_gpu_runner_survives_a_faulting_candidate(tmp_path):
    task = make_task("matmul", "cuda", M=256, N=256, K=256)
    opts = MeasureOptions(repeat=5, min_time=0.0, result_cache=False, before_run=faulty.trap_on_gpu)
    result = tune_task(task, 6, tmp_path / "r.jsonl", tuner="grid", batch_size=3, progress=False, measure=opts,
                       verify=False)
    (faulted,) = [r for r in result.records if r.config == faulty.first_valid(task).to_json()]
    assert faulted.status == "device_error" and "LAUNCH_FAILED" in faulted.error.upper()
    others = [r for r in result.records if r is not faulted]
    assert len(others) == 5 and sum(r.ok for r in others) >= 4  # the runner was replaced and went on
    assert all(r.conditions.get("sm_clock_mhz") and r.conditions.get("driver") and r.conditions.get("gpu_bus_id")
               for r in others if r.ok)
    assert all(r.conditions["toolkit"].startswith("nvcc") for r in others if r.ok)


def test_two_gpus_at_once_pick_the_winner_of_one(tmp_path):
    names = gpu_names()
    if len(names) < 2 or names[0] != names[1]:
        pytest.skip("needs two GPUs of one model")
    task = make_task("matmul", "cuda", M=1024, N=1024, K=1024)
    one = tune_task(task, 12, tmp_path / "one.jsonl", tuner="grid", batch_size=4, progress=False, measure=FAST,
                    devices=[0])
    two = tune_task(task, 12, tmp_path / "two.jsonl", tuner="grid", batch_size=4, progress=False, measure=FAST,
                    devices=[0, 1])
    assert {r.config_key for r in one.records} == {r.config_key for r in two.records}  # the same 12 candidates
    assert one.best.config == two.best.config
    assert all(r.conditions.get("sm_clock_mhz") for r in two.records if r.ok)
    assert len({r.conditions["gpu_bus_id"] for r in two.records if r.ok}) == 2  # both GPUs measured
    assert len({r.conditions["gpu_bus_id"] for r in one.records if r.ok}) == 1


def test_devices_of_another_model_or_absent_are_refused(tmp_path):
    from polytile.tune import TuneError
    task = make_task("matmul", "cuda", M=256, N=256, K=256)
    with pytest.raises(TuneError, match="there is no GPU"):
        tune_task(task, 2, tmp_path / "r.jsonl", progress=False, devices=[len(gpu_names())])


def test_a_dask_cluster_measures_on_its_gpu_workers(tmp_path):
    """The Dask backend on the GPU host: a LocalCluster worker tagged with this host's GPUs (one
    measurement at a time per GPU) builds and measures; trials carry the GPU's conditions, the winner
    is re-timed on the worker."""
    import distributed

    from polytile.tune.cluster import LOCAL_HTTP, MEASURE
    task = make_task("matmul", "cuda", M=256, N=256, K=256)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=4, processes=True, host="127.0.0.1",
                                  dashboard_address=LOCAL_HTTP) as lc:
        result = tune_task(task, 6, tmp_path / "r.jsonl", tuner="grid", batch_size=3, progress=False,
                           measure=MeasureOptions(repeat=10, min_time=0.0, result_cache=False, retime=2),
                           verify=False, cluster=lc)
        with distributed.Client(lc) as client:
            (held,) = [w["resources"] for w in client.scheduler_info(n_workers=-1)["workers"].values()]
    assert held[MEASURE + task.target.key] == sum(name == task.target.name for name in gpu_names())
    assert len(result.records) == 6 and sum(r.ok for r in result.records) >= 5
    assert all(r.conditions.get("gpu_bus_id") and r.conditions["toolkit"].startswith("nvcc")
               for r in result.records if r.ok)
    assert result.best.role == "winner" and result.kernel is not None
