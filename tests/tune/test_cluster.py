"""Tuning on a Dask distributed cluster (a LocalCluster of two worker processes on 127.0.0.1): builds
and CPU measurements on the workers, records streamed back; a worker killed mid-trial costs no record
and duplicates none; two tuners at once share one records file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import faulty
import pytest

from polytile.tune import MeasureOptions, RecordLog, make_task, tune_task

distributed = pytest.importorskip("distributed")

FAST = MeasureOptions(repeat=3, min_time=0.0, result_cache=False)
CHILD = Path(__file__).with_name("cluster_child.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):  # noqa: ANN201 - a LocalCluster
    marker = tmp_path_factory.mktemp("kill") / "killed"
    os.environ[faulty.KILL_MARKER] = str(marker)  # the workers inherit it when they start
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                      dashboard_address=None) as lc:
            lc.kill_marker = marker
            yield lc
    finally:
        del os.environ[faulty.KILL_MARKER]


def _trials(path: Path) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["role"] == "trial"]


def test_tuning_on_a_local_cluster_records_every_trial_with_its_conditions(cluster, tmp_path):
    path = tmp_path / "r.jsonl"
    task = make_task("softmax", "cpu", M=48, N=96)
    result = tune_task(task, 6, path, tuner="random", batch_size=3, progress=False, measure=FAST, cluster=cluster)
    trials = _trials(path)
    assert len(trials) == 6 and all(r["status"] == "ok" for r in trials)
    assert len({json.dumps(r["config"], sort_keys=True) for r in trials}) == 6
    assert all(r["conditions"]["toolkit"] and "load" in r["conditions"] for r in trials)
    assert result.kernel is not None and result.best.role == "winner"
    assert RecordLog(path).best(task.key, task.target.key).config == result.best.config


def test_a_worker_killed_mid_trial_loses_and_duplicates_no_record(cluster, tmp_path):
    path = tmp_path / "r.jsonl"
    task = make_task("softmax", "cpu", M=40, N=88)
    opts = MeasureOptions(repeat=3, min_time=0.0, result_cache=False, before_run=faulty.kill_dask_worker_once)
    tune_task(task, 5, path, tuner="random", batch_size=5, progress=False, verify=False, build_best=False,
              measure=opts, cluster=cluster)
    assert cluster.kill_marker.exists()  # a worker was killed during a trial
    trials = _trials(path)
    assert len(trials) == 5 and all(r["status"] == "ok" for r in trials)  # the killed trial ran again
    assert len({json.dumps(r["config"], sort_keys=True) for r in trials}) == 5


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


class _FakeClient:
    """What ``ClusterMeasurer.resolve`` asks a client: each worker's GPU targets."""

    def __init__(self, *targets):  # noqa: ANN002
        self.targets = targets

    def run(self, fn):  # noqa: ANN001, ANN201
        return {f"tcp://w{k}": [t] for k, t in enumerate(self.targets)}


def test_a_tuner_without_the_gpu_tunes_for_the_gpu_workers_model():
    from polytile.target import CUDATarget
    from polytile.tune import TuneError
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
