"""Records: append-only, tolerant of a torn last line, looked up by workload and target; records of
another target are never applied."""

from __future__ import annotations

import pytest

from polytile.target import CPUTarget
from polytile.tune import Record, RecordLog, TuneError, apply_best, make_task, tune_task
from polytile.tune.measure import MeasureOptions


def _rec(workload: str, target: str, cost: float | None, **config: object) -> Record:
    return Record(workload, target, "t", dict(config), "ok" if cost else "crash", [cost] if cost else [],
                  "" if cost else "the runner process died (SIGSEGV)")


def test_append_read_best_and_torn_line(tmp_path):
    log = RecordLog(tmp_path / "r.jsonl")
    log.append(_rec("w", "cpu:a", 2.0, x=1))
    log.append(_rec("w", "cpu:a", 1.0, x=2))
    log.append(_rec("w", "cpu:b", 0.5, x=3))
    log.append(_rec("w", "cpu:a", None, x=4))
    with open(log.path, "a") as f:
        f.write('{"workload": "w", "target": "cpu:a", "conf')  # a writer killed mid-line
    assert [r.config["x"] for r in log.select("w", "cpu:a")] == [1, 2, 4]
    assert log.best("w", "cpu:a").config == {"x": 2}
    assert log.best("w", "cpu:b").config == {"x": 3}
    assert log.best("w", "cpu:c") is None
    log.append(_rec("w", "cpu:a", 0.1, x=5))  # the torn line is ended, the new one stays readable
    assert log.best("w", "cpu:a").config == {"x": 5}
    assert log.targets_of("w") == {"cpu:a", "cpu:b"}


def test_records_of_another_target_are_not_applied(tmp_path):
    here = CPUTarget(cores=2, model="here")
    there = CPUTarget(cores=64, model="elsewhere")
    task_there = make_task("softmax", there, M=32, N=48)
    path = tmp_path / "r.jsonl"
    cfg = task_there.space.config_at(0).to_json()
    RecordLog(path).append(Record(task_there.key, there.key, task_there.template.name, cfg, "ok", [1e-6]))
    with pytest.raises(TuneError, match="other targets: cpu:elsewhere"):
        apply_best("softmax", path, target=here, M=32, N=48)
    # tuning here replays nothing from there: the trial is measured anew and recorded for this target
    task_here = make_task("softmax", here, M=32, N=48)
    result = tune_task(task_here, trials=1, records=path, tuner="grid", batch_size=1, progress=False,
                       verify=False, build_best=False, measure=MeasureOptions(repeat=3, min_time=0.0))
    assert result.new_trials == 1 and result.records[0].target == here.key
    assert RecordLog(path).best(task_here.key, here.key).config == cfg
    assert apply_best("softmax", path, target=here, M=32, N=48) is not None


def test_unknown_or_newer_files_are_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    with pytest.raises(TuneError, match="not a polytile records file"):
        list(RecordLog(bad))
    newer = tmp_path / "newer.jsonl"
    newer.write_text('{"workload": "w", "target": "t", "version": 99}\n')
    with pytest.raises(TuneError, match="newer polytile"):
        list(RecordLog(newer))
