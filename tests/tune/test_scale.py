"""Cheaper trials and their options: the result cache answers a configuration measured before (across
records files, not across toolkits), streaming records every trial once, and bad devices or cluster
arguments are one-line errors before anything runs."""

from __future__ import annotations

import pytest

from polytile.tune import MeasureOptions, TuneError, make_task, tune, tune_task
from polytile.tune import measure as measure_module
from polytile.tune.cli import tune_main
from polytile.tune.result_cache import ResultCache

FAST = MeasureOptions(repeat=3, min_time=0.0, builders=2)


def _run(task, path, opts=FAST):  # noqa: ANN001, ANN202
    return tune_task(task, 3, path, tuner="grid", batch_size=3, progress=False, verify=False, build_best=False,
                     measure=opts)


def test_the_result_cache_answers_a_configuration_measured_before(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    task = make_task("softmax", "cpu", M=32, N=56)
    first = _run(task, tmp_path / "a.jsonl")
    assert [r.status for r in first.records] == ["ok"] * 3 and not any(r.cached for r in first.records)
    again = _run(task, tmp_path / "b.jsonl")  # another records file: nothing there to resume from
    assert all(r.cached for r in again.records)
    assert sorted((r.config_key, r.costs) for r in again.records) == sorted((r.config_key, r.costs)
                                                                             for r in first.records)
    assert not any(r.cached for r in _run(task, tmp_path / "c.jsonl", MeasureOptions(
        repeat=3, min_time=0.0, builders=2, result_cache=False)).records)
    monkeypatch.setattr(measure_module, "toolkit_version", lambda kind: "g++ 99.1")  # another compiler
    assert not any(r.cached for r in _run(task, tmp_path / "d.jsonl").records)


def test_outcomes_that_may_not_repeat_are_not_cached(tmp_path):
    cache = ResultCache(tmp_path)
    for status in ("crash", "timeout", "device_error", "runtime_error", "build_timeout", "build_crash"):
        cache.put(status, {"status": status, "costs": [], "error": "x"})
        assert cache.get(status) is None
    cache.put("k", {"status": "wrong_result", "costs": [], "error": "relative error 0.5"})
    assert cache.get("k")["status"] == "wrong_result"


@pytest.mark.parametrize("kwargs, message", [
    (dict(devices=[0]), "names GPUs, but"),
    (dict(devices=[0, 0]), "distinct GPU numbers"),
    (dict(devices="0"), "distinct GPU numbers"),
    (dict(devices=[0], cluster="local"), "not both"),
    (dict(cluster=3.5), "Dask scheduler address"),
])
def test_bad_devices_and_clusters_are_refused_before_anything_runs(kwargs, message):
    with pytest.raises(TuneError, match=message):
        tune("softmax", M=8, N=16, trials=2, progress=False, **kwargs)


@pytest.mark.parametrize("args, words", [(["--devices", "0,x"], "GPU numbers"), (["--devices", "1,1"], "distinct"),
                                         (["--devices", "0"], "names GPUs")])
def test_bad_devices_on_the_command_line_are_one_line(capsys, args, words):
    with pytest.raises(SystemExit) as exit_:
        rc = tune_main(["softmax", "--shape", "8,16", "--quiet", *args])
        raise SystemExit(rc)
    assert exit_.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and words in err[0] and "Traceback" not in err[0]


def test_an_unreachable_scheduler_is_one_line(capsys, monkeypatch):
    from polytile.tune import cluster
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT", 2.0)
    rc = tune_main(["softmax", "--shape", "8,16", "--quiet", "--cluster", "tcp://127.0.0.1:9"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in err[0]


def test_ctrl_c_while_a_record_is_written_counts_that_record(tmp_path, monkeypatch):
    """A Ctrl-C that comes while a trial's record is written (during the fsync) stops the run after the
    record is counted: the trials the run reports saved are the lines in the file."""
    import signal
    import threading

    from polytile.tune.records import RecordLog
    write = RecordLog.append

    def append_then_ctrl_c(self, rec):  # noqa: ANN001, ANN202
        write(self, rec)
        # to this thread, so that it is handled here, before the caller counts the record (os.kill lets the
        # kernel pick any thread of the process: on a loaded machine the handler then ran after the run ended)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    monkeypatch.setattr(RecordLog, "append", append_then_ctrl_c)
    counted: list[object] = []
    path = tmp_path / "r.jsonl"
    with pytest.raises(KeyboardInterrupt):
        tune_task(make_task("softmax", "cpu", M=16, N=24), 3, path, tuner="grid", batch_size=1, progress=False,
                  measure=FAST, on_trial=counted.append)
    assert len(path.read_text().splitlines()) == len(counted) == 1


def test_one_runner_per_device_shares_the_measurements(tmp_path, monkeypatch, rng):
    """Measurer(devices=[0, 1]) starts a runner per GPU (CUDA_VISIBLE_DEVICES set to it) and hands each
    built candidate to a free one: both measure (on a CPU task here, the GPUs named but unused)."""
    import faulty

    from polytile.tune import Measurer
    monkeypatch.setenv(faulty.RUNNERS_FILE, str(tmp_path / "runners"))
    task = make_task("softmax", "cpu", M=16, N=24)
    configs = [task.space.config(d).values for d in task.space.sample_valid(rng, 6)]
    opts = MeasureOptions(repeat=3, min_time=0.0, builders=2, result_cache=False, pause_builds=False,
                          before_run=faulty.note_runner)
    with Measurer(opts, devices=[0, 1]) as measurer:
        results = measurer.measure(task, configs)
    assert [r.status for r in results] == ["ok"] * 6
    used = (tmp_path / "runners").read_text().split()
    assert len(used) == 6 and set(used) == {"0", "1"}


def test_a_device_is_a_gpu_this_process_sees(monkeypatch):
    from polytile.tune.measure import device_environment
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device_environment(1) == {"CUDA_VISIBLE_DEVICES": "1"} and device_environment(None) == {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-5f3e")
    assert device_environment(1) == {"CUDA_VISIBLE_DEVICES": "GPU-5f3e"}
    with pytest.raises(TuneError, match="not one of the 2 GPU"):
        device_environment(2)


def test_a_gpu_trial_names_the_gpu_that_measured_it(monkeypatch):
    """Trials measured on several GPUs merge in one file: each says which GPU of the host timed it."""
    from polytile.tune import hygiene
    monkeypatch.setattr(hygiene, "_bus_id", lambda: "00000000:19:00.0")
    monkeypatch.setattr(hygiene, "_nvml", lambda: None)  # no NVML: no clock or power, the GPU still named
    found = hygiene.conditions(make_task("matmul", "cuda:sm_90a", M=64, N=64, K=64).target)
    assert found["gpu_bus_id"] == "00000000:19:00.0" and "sm_clock_mhz" not in found
    monkeypatch.setattr(hygiene, "_bus_id", lambda: None)  # no GPU readable: nothing guessed
    assert "gpu_bus_id" not in hygiene.conditions(make_task("matmul", "cuda:sm_90a", M=64, N=64, K=64).target)
