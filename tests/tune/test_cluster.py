"""Tuning on a Dask distributed cluster (a LocalCluster of two worker processes on 127.0.0.1): builds
and CPU measurements on the workers, records streamed back; a worker killed mid-trial costs no record
and duplicates none; two tuners at once share one records file; workers are tagged with what their
host can build and measure.

The tests of a pytest worker share one LocalCluster, with the Dask timeouts raised for a loaded CI
machine; every port is chosen by the system (no dashboard). (pytest-xdist's loadgroup cannot keep them
on one pytest worker: with pytest 9 it ignores xdist_group marks.)"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dask
import distributed  # the cluster extra is in dev: CI must have it, not skip these tests
import faulty
import pytest

from polytile.tune import MeasureOptions, RecordLog, TuneError, make_task, tune_task
from polytile.tune import cluster as cluster_module

FAST = MeasureOptions(repeat=3, min_time=0.0, result_cache=False)
CHILD = Path(__file__).with_name("cluster_child.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):  # noqa: ANN201 - a LocalCluster
    marker = tmp_path_factory.mktemp("kill") / "killed"
    os.environ[faulty.KILL_MARKER] = str(marker)  # the workers inherit it when they start
    slow_machine = {"distributed.comm.timeouts.connect": "120s", "distributed.comm.timeouts.tcp": "120s"}
    try:
        with dask.config.set(slow_machine), distributed.LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", scheduler_port=0,
                dashboard_address=cluster_module.LOCAL_HTTP) as lc:
            lc.kill_marker = marker
            yield lc
    finally:
        del os.environ[faulty.KILL_MARKER]


def _trials(path: Path) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["role"] == "trial"]


def test_tuning_on_a_local_cluster_records_every_trial_with_its_conditions(cluster, tmp_path):
    path = tmp_path / "r.jsonl"
    task = make_task("softmax", "cpu", M=48, N=96)
    opts = MeasureOptions(repeat=3, min_time=0.0, result_cache=False, retime=2)  # the winner re-timed on a worker
    result = tune_task(task, 4, path, tuner="random", batch_size=2, progress=False, verify=False, measure=opts,
                       cluster=cluster)
    trials = _trials(path)
    assert len(trials) == 4 and all(r["status"] == "ok" for r in trials)
    assert len({json.dumps(r["config"], sort_keys=True) for r in trials}) == 4
    assert all(r["conditions"]["toolkit"] and "load" in r["conditions"] for r in trials)
    assert result.kernel is not None and result.best.role == "winner"
    assert RecordLog(path).best(task.key, task.target.key).config == result.best.config


def test_a_worker_killed_mid_trial_loses_and_duplicates_no_record(cluster, tmp_path):
    path = tmp_path / "r.jsonl"
    task = make_task("softmax", "cpu", M=40, N=88)
    opts = MeasureOptions(repeat=3, min_time=0.0, result_cache=False, before_run=faulty.kill_dask_worker_once)
    tune_task(task, 4, path, tuner="random", batch_size=4, progress=False, verify=False, build_best=False,
              measure=opts, cluster=cluster)
    assert cluster.kill_marker.exists()  # a worker was killed during a trial
    trials = _trials(path)
    assert len(trials) == 4 and all(r["status"] == "ok" for r in trials)  # the killed trial ran again
    assert len({json.dumps(r["config"], sort_keys=True) for r in trials}) == 4


def test_two_tuners_at_once_share_one_records_file(cluster, tmp_path):
    path = tmp_path / "shared.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, str(CHILD), cluster.scheduler_address, str(path), str(rows), "4"],
                              env=env, stderr=subprocess.PIPE) for rows in (24, 40)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()[-2000:]
    log = RecordLog(path)
    for rows in (24, 40):
        task = make_task("softmax", "cpu", M=rows, N=72)
        mine = log.select(task.key, task.target.key)
        assert len(mine) == 4 and all(r.ok for r in mine)
    assert len(path.read_text().splitlines()) == 8  # every line whole: no interleaved writes


def test_workers_are_tagged_with_what_their_host_has_and_a_trial_no_worker_can_measure_is_refused(
        cluster, monkeypatch):
    """The workers here have this host's CPU and no GPU: a CUDA trial waits for a worker tagged to measure
    on its GPU model, and is refused (naming the tags the workers have) when none has it."""
    from polytile.target import cpu_target
    from polytile.toolchain import find_nvcc
    monkeypatch.setattr(cluster_module, "CONNECT_TIMEOUT", 3.0)
    task = make_task("matmul", "cuda:sm_90a", M=64, N=64, K=64)
    with cluster_module.ClusterMeasurer(FAST, cluster) as measurer:
        held = {r for w in measurer.client.scheduler_info(n_workers=-1)["workers"].values() for r in w["resources"]}
        assert {cluster_module.BUILD + cpu_target().key, cluster_module.MEASURE + cpu_target().key} <= held
        assert (cluster_module.BUILD + "cuda" in held) == (find_nvcc() is not None)
        with pytest.raises(TuneError, match=r"no worker of the Dask cluster can .*polytile-measure:.*its workers have: "
                                            ".*" + re.escape(cluster_module.MEASURE + cpu_target().key)):
            measurer.submit(task, faulty.first_valid(task).values)


def test_a_worker_probes_its_host_once_however_many_tuners_connect(cluster):
    def probed(dask_worker=None):  # noqa: ANN001, ANN202 - run on each worker by Client.run
        from polytile.tune.cluster import _LOCAL
        return _LOCAL.found is not None, id(_LOCAL.found)

    with cluster_module.ClusterMeasurer(FAST, cluster) as first:
        before = first.client.run(probed)
    assert len(before) == 2 and all(found for found, _ in before.values())
    with cluster_module.ClusterMeasurer(FAST, cluster) as second:
        assert second.client.run(probed) == before  # the second tuner's plugin reused each worker's probe


class _FakeClient:
    """What ``ClusterMeasurer.resolve`` asks a client: each worker's GPU targets."""

    def __init__(self, *targets):  # noqa: ANN002
        self.targets = targets

    def run(self, fn):  # noqa: ANN001, ANN201
        return {f"tcp://w{k}": [t] for k, t in enumerate(self.targets)}


def test_a_tuner_without_the_gpu_tunes_for_the_gpu_workers_model():
    from polytile.target import CUDATarget
    from polytile.tune.cluster import ClusterMeasurer
    h100 = CUDATarget(name="NVIDIA_H100_80GB_HBM3", arch="sm_90a", sms=132)
    task = make_task("matmul", "cuda:sm_90a", M=256, N=256, K=256)  # a datasheet target: no GPU here
    measurer = object.__new__(ClusterMeasurer)
    measurer.client = _FakeClient(h100, CUDATarget(name="NVIDIA_A100", arch="sm_80"))
    resolved = measurer.resolve(task)
    assert resolved.target.key == h100.key and resolved.target.sms == 132
    assert resolved.workload == task.workload and resolved.template == task.template
    measurer.client = _FakeClient(h100, CUDATarget(name="NVIDIA_H200", arch="sm_90a"))
    with pytest.raises(TuneError, match="pass target= one of"):
        measurer.resolve(task)
    assert measurer.resolve(make_task("softmax", "cpu", M=8, N=8)).target.kind == "cpu"


def test_cluster_local_starts_workers_on_this_machine_without_fixed_ports():
    """cluster="local": one single-threaded worker per builder on 127.0.0.1; the scheduler's HTTP server
    takes a free port, not 8787 (taken here, as by another tuner's LocalCluster)."""
    import socket
    import warnings
    taken = socket.socket()
    with contextlib.suppress(OSError):  # already taken by something else: as good
        taken.bind(("127.0.0.1", 8787))
        taken.listen()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            client, started = cluster_module.connect("local")
        try:
            workers = client.scheduler_info(n_workers=-1)["workers"]
            assert len(workers) == MeasureOptions().builder_count()
            assert all(w.startswith("tcp://127.0.0.1:") and info["nthreads"] == 1 for w, info in workers.items())
        finally:
            client.close()
            started.close()
    finally:
        taken.close()
    assert not [w for w in caught if "already in use" in str(w.message)]
