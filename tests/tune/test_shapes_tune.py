"""``benchmarks/shapes.py --tune``: workloads spread over GPUs by expected cost, one process per GPU
sharing the records (locked appends), resumable across calls (a workload already timed is not handed
out again, one whose records hold its trials costs only its timing) and stopping before a workload
that would overrun ``--max-seconds``. The tuning itself is mocked: no GPU here."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from polytile.tune.records import Record, RecordLog

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import _devices  # noqa: E402
import shapes  # noqa: E402

SUITE = shapes.gpu_suite()


def test_spread_balances_the_expected_cost_and_keeps_every_workload_once():
    costs = {w.name: shapes.expected_seconds(w, 32, 15) for w in SUITE}
    shares = _devices.spread(SUITE, lambda w: costs[w.name], [0, 1])
    names = [w.name for share in shares.values() for w in share]
    assert sorted(names) == sorted(w.name for w in SUITE)
    loads = [sum(costs[w.name] for w in share) for share in shares.values()]
    assert max(loads) - min(loads) <= max(costs.values())  # within one workload of even
    order = [w.name for w in SUITE]
    for share in shares.values():  # each share in the suite's order
        assert [w.name for w in share] == sorted((w.name for w in share), key=order.index)


def test_expected_cost_falls_with_the_trials_recorded():
    w = SUITE[0]
    assert shapes.expected_seconds(w, 32, 15) > shapes.expected_seconds(w, 8, 15) > shapes.expected_seconds(w, 0, 15)


def _args(tmp_path: Path, **over: object) -> argparse.Namespace:
    base = dict(tune=32, records=str(tmp_path / "tune.jsonl"), devices="0,1", builders=4, max_seconds=0.0,
                repeat=20, rounds=3, half_out=True, deadline=0.0)
    return argparse.Namespace(**{**base, **over})


def _row(w: shapes.Workload, trials: int = 32) -> dict:
    return {**shapes._describe(w), "tune": {"trials": trials}, "speed": 1.0}


def test_a_resumed_run_hands_out_only_what_is_left(tmp_path, monkeypatch):
    ws = SUITE[:6]
    args = _args(tmp_path)
    rows = shapes.results_path(Path(args.records))
    _devices.append_row(rows, _row(ws[0]))
    _devices.append_row(rows, _row(ws[1], trials=8))  # timed after another number of trials: again
    rows.open("a").write('{"name": "cut by a ki')  # a line cut by a kill is skipped
    # the records of ws[2] hold all its trials: it costs only its timing
    log = RecordLog(args.records)
    trial = Record(f"matmul_gemv/{shapes.tune_key(ws[2])}/sig", "cuda:fake:sm_90a", "matmul_gemv",
                   {"threads": 32}, "ok", [1e-5])
    for k in range(32):
        log.append(dataclasses.replace(trial, trial=k))
    log.append(dataclasses.replace(trial, role="winner"))  # not a trial: not counted
    with open(args.records, "a") as f:  # the trial in flight when a tuner was killed: not counted
        f.write(trial.to_line()[:40])
    launched: dict[str, list[str]] = {}

    class FakeProcess:
        def __init__(self, cmd, env):  # noqa: ANN001
            names = Path(cmd[cmd.index("--tune-worker") + 1]).read_text().split()
            launched[env["CUDA_VISIBLE_DEVICES"]] = names
            assert cmd[cmd.index("--builders") + 1] == "4"
            self.returncode = 0

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(shapes.subprocess, "Popen", FakeProcess)
    out = shapes.tune_gpu(ws, args)
    handed = sorted(n for names in launched.values() for n in names)
    assert handed == sorted(w.name for w in ws[1:])
    assert set(launched) == {"0", "1"}
    assert not out["complete"] and [r["name"] for r in out["results"]] == [ws[0].name]
    assert shapes.trials_done(Path(args.records))[shapes.tune_key(ws[2])] == 32


def test_the_worker_skips_what_is_timed_and_stops_before_the_deadline(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import polytile.tune
    ws = [w for w in SUITE if w.kind == "softmax"][:4]
    args = _args(tmp_path, builders=2)
    rows = shapes.results_path(Path(args.records))
    _devices.append_row(rows, _row(ws[0]))
    tuned: list[str] = []

    class FakeMeasurer:
        def __init__(self, options):  # noqa: ANN001
            assert options.builders == 2 and options.same_inputs

        def __enter__(self):  # noqa: ANN204
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def fake_tune(w, args, *rest):  # noqa: ANN001, ANN202
        tuned.append(w.name)
        return {"trials": args.tune, "template": "fake"}, {"threads": 32}

    def fake_time(w, args, info, default, best):  # noqa: ANN001, ANN202
        assert default == (w.name, "default kernel", 1.0) and best == (w.name, {"threads": 32}, 2.0)
        return {**_row(w), "tune": info}

    monkeypatch.setattr(polytile.tune, "Measurer", FakeMeasurer)
    monkeypatch.setattr(shapes, "ProcessPoolExecutor", lambda n, **_: ThreadPoolExecutor(n))  # built in threads
    monkeypatch.setattr(shapes, "build_one", lambda w: (w.name, "default kernel", 1.0))
    monkeypatch.setattr(shapes, "build_config", lambda w, config: (w.name, config, 2.0))
    monkeypatch.setattr(shapes, "tune_one", fake_tune)
    monkeypatch.setattr(shapes, "time_one", fake_time)
    assert shapes.tune_worker(ws, args) == 0
    assert tuned == [w.name for w in ws[1:]]
    assert set(shapes.read_rows(rows, 32)) == {w.name for w in ws}
    # a deadline closer than the next workload's expected time: nothing more is started
    more = [w for w in SUITE if w.kind == "layernorm"][:2]
    tuned.clear()
    shapes.tune_worker(more, _args(tmp_path, builders=2, deadline=time.time() + 5))
    assert tuned == []


def test_a_tuned_record_summarizes_default_and_tuned():
    rows = [{**_row(w), "family": "rows", "correct": True, "speed": 1.2, "speed_call": 1.0, "default_s": 2e-6,
             "default_speed": 1.0, "tuned_vs_default": 1.2, "polytile_s": 1e-6, "torch_s": 1.2e-6,
             "polytile_call_s": 1e-5, "torch_call_s": 1e-5,
             "tune": {"trials": 32, "template": "softmax_cuda", "winner_is_default": i == 0}}
            for i, w in enumerate(SUITE[:2])]
    record = {"results": rows, "tune_trials": 32}
    s = shapes.summary(record)
    assert s["geomean_default_kernel"] == pytest.approx(1.0) and s["geomean_tuned_vs_default"] == pytest.approx(1.2)
    assert s["winner_is_default"] == 1
    text = shapes.table(record)
    assert "| default µs | default ratio | template |" in text and "softmax_cuda" in text
