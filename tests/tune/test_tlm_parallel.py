"""``benchmarks/tlm.py --target``: the measured evaluation spread over devices (a worker process each),
several tunings at once through one shared measurer, stopped at a deadline and resumed from its rows
and records. A CPU dry run of the whole pipeline (tiny budget, real builds and timings), and the
split and resume logic on fake devices with a fake measurer."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _devices  # noqa: E402
import tlm as bench  # noqa: E402

from polytile.tune import MeasureResult  # noqa: E402
from polytile.tune.records import RecordLog  # noqa: E402
from polytile.tune.space import Config  # noqa: E402
from polytile.tune.tlm import evaluate as evaluation  # noqa: E402
from polytile.tune.tlm.evaluate import Case, SharedMeasurer, evaluate  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")

# sizes that divide no tile
HELD = [Case("h:softmax", "softmax", dict(M=37, N=53)), Case("h:layernorm", "layernorm", dict(M=29, N=61))]
TRAIN = [Case("t:softmax", "softmax", dict(M=41, N=47))]


def _argv(records: Path, *more: str) -> list[str]:
    return ["tlm.py", "--target", "cpu", "--records-dir", str(records), "--trials", "4", "--reference-trials", "6",
            "--train-trials", "4", "--batch", "2", "--builders", "1", "--jobs", "3", "--finetune-epochs", "2",
            "--out", str(records / "out.json"), "--quiet", *more]


def _trials(records: Path, stage: str, tuner: str) -> list:
    return list(RecordLog(records / stage / f"{tuner}.jsonl"))


@pytest.mark.slow  # ~40 s on 2 cores
def test_cpu_dry_run_of_the_whole_pipeline_on_two_worker_processes(tmp_path, monkeypatch):
    """Real builds and timings: the training workload tuned by the shipped model, the model fine-tuned,
    each held-out workload by every tuner in a worker process of its own, the report assembled."""
    monkeypatch.setattr(bench, "CPU_HELD_OUT", HELD)
    monkeypatch.setattr(bench, "CPU_TRAIN", TRAIN)
    monkeypatch.setattr(sys, "argv", _argv(tmp_path, "--devices", "0,1"))
    assert bench.main() == 0
    report = json.loads((tmp_path / "out.json").read_text())
    assert list(report["workloads"]) == ["h:softmax", "h:layernorm"]
    for w in report["workloads"].values():
        assert list(w["tuners"]) == ["tlm", "random@4", "xgb@6"]
        for spec, t in w["tuners"].items():
            count = int(spec.split("@")[1]) if "@" in spec else 4
            assert len(t["curve"]) == count
            assert all(b >= a for a, b in zip(t["curve"][1:], t["curve"], strict=False))  # a best-so-far curve
            assert 0 < t["curve"][-1] < 1e-2  # seconds of a measured kernel of a few thousand elements
    # each held-out workload went to one of the two workers, and its trials are all recorded
    jobs = [json.loads((tmp_path / f"heldout.gpu{d}.job.json").read_text()) for d in (0, 1)]
    assert sorted(c["name"] for job in jobs for c in job["cases"]) == ["h:layernorm", "h:softmax"]
    assert len(_trials(tmp_path, "heldout", "xgb")) == 2 * 6 and len(_trials(tmp_path, "heldout", "tlm")) == 2 * 4
    assert len(_trials(tmp_path, "train", "tlm")) == 4
    ft = report["fine_tuning"]["finetuned_on"]
    assert ft["workloads"] == 1 and ft["sentences"] >= 1
    assert report["summary"]["per_workload"].keys() == {"h:softmax", "h:layernorm"}
    assert set(report["generation_s_per_100"]) == {"h:softmax", "h:layernorm"}
    # the runner on half of the cores, its own: the target measured has that many cores (prompt, records)
    cores = len(__import__("os").sched_getaffinity(0)) // 2
    assert all(job["runner_cores"] == cores for job in jobs) and report["parallel"]["runner_cores"] == cores
    if cores:
        assert f":{cores}c:" in report["target"]
        assert all(f":{cores}c:" in r.target for r in _trials(tmp_path, "heldout", "xgb"))


# --- fake devices --------------------------------------------------------------------------------------


class FakeMeasurer:
    """Answers every configuration at once with a cost drawn from its key (no build, no run); counts what
    it measured."""

    measured: list[tuple[str, str]] = []

    def __init__(self, *args: object) -> None:
        pass

    def measure(self, task, batch, on_result=None):  # noqa: ANN001, ANN201
        out = []
        for k, values in enumerate(batch):
            key = Config(dict(values)).key
            FakeMeasurer.measured.append((task.key, key))
            out.append(MeasureResult("ok", [1e-6 * (1 + sum(map(ord, key)) % 97)]))
            if on_result is not None:
                on_result(k, out[-1])
        return out

    def close(self) -> None:
        pass

    def __enter__(self) -> FakeMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class InProcess:
    """A worker process run here, at once, unless its device is in ``dead`` (as if it were killed);
    other commands (nvidia-smi) as they are."""

    dead: set[str] = set()
    started: dict[str, list[str]] = {}
    popen = subprocess.Popen

    def __new__(cls, cmd, **kw):  # noqa: ANN001, ANN204
        return super().__new__(cls) if "--worker" in cmd else InProcess.popen(cmd, **kw)

    def __init__(self, cmd, env):  # noqa: ANN001
        device = env["CUDA_VISIBLE_DEVICES"]
        job = cmd[cmd.index("--worker") + 1]
        InProcess.started[device] = [c["name"] for c in json.loads(Path(job).read_text())["cases"]]
        self.status = 137 if device in InProcess.dead else bench.worker(job)

    def wait(self) -> int:
        return self.status


@pytest.fixture
def fake_devices(monkeypatch):
    monkeypatch.setattr(bench, "Measurer", FakeMeasurer)
    monkeypatch.setattr(_devices.subprocess, "Popen", InProcess)
    FakeMeasurer.measured = []
    InProcess.dead, InProcess.started = set(), {}
    cases = [Case(f"h:softmax:{k}", "softmax", dict(M=20 + k, N=31)) for k in range(4)]
    monkeypatch.setattr(bench, "CPU_HELD_OUT", cases)
    monkeypatch.setattr(bench, "CPU_TRAIN", TRAIN)
    return cases


def test_a_killed_device_is_resumed_by_the_same_command(tmp_path, monkeypatch, fake_devices):
    # the workers run in this process, measuring nothing: no runner, so no cores of its own
    monkeypatch.setattr(sys, "argv", _argv(tmp_path, "--devices", "0,1", "--jobs", "4", "--runner-cores", "0"))
    InProcess.dead = {"1"}
    assert bench.main() == _devices.RESUME  # device 1's worker died: its held-out workloads are not done
    assert not (tmp_path / "out.json").exists()
    lost = InProcess.started["1"]
    assert sorted(len(names) for names in InProcess.started.values()) == [2, 2]  # split evenly
    InProcess.dead, InProcess.started = set(), {}
    assert bench.main() == 0
    # only device 1's share handed out again, spread over both devices
    assert sorted(n for names in InProcess.started.values() for n in names) == sorted(lost)
    report = json.loads((tmp_path / "out.json").read_text())
    assert list(report["workloads"]) == [c.name for c in fake_devices]
    # no configuration of a workload measured twice, across tuners or calls
    assert len(FakeMeasurer.measured) == len(set(FakeMeasurer.measured))
    # a third call hands nothing out and reports the same
    InProcess.started = {}
    assert bench.main() == 0
    assert InProcess.started == {}
    assert json.loads((tmp_path / "out.json").read_text())["workloads"] == report["workloads"]


def test_held_out_workloads_of_a_dead_device_are_handed_out_again(tmp_path, monkeypatch, fake_devices):
    monkeypatch.setattr(sys, "argv", _argv(tmp_path, "--devices", "0,1", "--runner-cores", "0"))
    assert bench.main() == 0  # the whole run, to have the stages before the held-out one done
    rows = tmp_path / "heldout.rows.jsonl"
    first = {r["name"]: r for r in _devices.read_rows(rows)}
    on_device1 = InProcess.started["1"]
    # the rows of device 1's workloads lost (and a line cut by a kill): the same command redoes only them
    kept = [json.dumps(first[n]) for n in first if n not in on_device1]
    rows.write_text("\n".join(kept) + '\n{"name": "h:softm')
    InProcess.started = {}
    FakeMeasurer.measured = []
    assert bench.main() == 0
    assert sorted(n for names in InProcess.started.values() for n in names) == sorted(on_device1)
    assert FakeMeasurer.measured == []  # their trials are in the records: replayed, not measured
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["workloads"].keys() == first.keys()
    for n in on_device1:
        assert report["workloads"][n]["tuners"]["xgb@6"]["curve"] == first[n]["tuners"]["xgb@6"]["curve"]


def test_a_deadline_stops_the_tunings_and_a_later_call_completes_them(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(evaluation.time, "time", lambda: clock[0])

    class Ticking(FakeMeasurer):
        def measure(self, task, batch, on_result=None):  # noqa: ANN001, ANN201
            clock[0] += len(batch)  # a second a trial
            return super().measure(task, batch, on_result)

    FakeMeasurer.measured = []
    cases = [Case("a", "softmax", dict(M=37, N=53)), Case("b", "softmax", dict(M=41, N=53))]
    finished: list[str] = []
    kw = dict(records_dir=tmp_path, measurer=Ticking(), progress=False, jobs=1,
              on_workload=lambda name, entry: finished.append(name))
    report = evaluate(None, cases, "cpu", ["random@6", "xgb@10"], batch=2, deadline=1000.0 + 13, **kw)
    # longest first: a's xgb (10 trials, to t = 1010), b's xgb stopped at the first trial recorded after
    # the deadline (its 3rd, t = 1014); no tuning started after it
    assert report["workloads"] == {} and finished == []
    assert len(list(RecordLog(tmp_path / "xgb.jsonl"))) == 13 and not (tmp_path / "random.jsonl").exists()
    recorded = {(r.workload, r.config_key) for r in RecordLog(tmp_path / "xgb.jsonl")}
    before = len(FakeMeasurer.measured)
    report = evaluate(None, cases, "cpu", ["random@6", "xgb@10"], batch=2, **kw)
    assert sorted(finished) == ["a", "b"] and list(report["workloads"]) == ["a", "b"]
    assert all(len(t["curve"]) == int(spec.split("@")[1]) for w in report["workloads"].values()
               for spec, t in w["tuners"].items())
    again = FakeMeasurer.measured[before:]
    assert again and not set(again) & recorded  # a recorded configuration is not measured again, by any tuner


class Streaming:
    """A streaming measurer (submit/collect) whose results come back after a delay, from another thread's
    point of view: what ``Measurer`` does with its builders."""

    def __init__(self) -> None:
        self.submitted: list[str] = []
        self.pending: list[tuple[int, float, str]] = []
        self.next = 0

    def submit(self, task, values):  # noqa: ANN001, ANN201
        assert threading.current_thread() is not None
        self.next += 1
        key = Config(dict(values)).key
        self.submitted.append(key)
        self.pending.append((self.next, time.monotonic() + 0.01, key))
        return self.next

    def collect(self, timeout=None):  # noqa: ANN001, ANN201
        time.sleep(0.002)
        now = time.monotonic()
        done = [(t, MeasureResult("ok", [1e-6 * (1 + len(k))])) for t, due, k in self.pending if due <= now]
        self.pending = [p for p in self.pending if p[1] > now]
        return done

    def close(self) -> None:
        pass


def test_tunings_in_threads_share_one_streaming_measurer_and_measure_each_configuration_once():
    from polytile.tune import make_task
    task = make_task("softmax", "cpu", M=37, N=53)
    configs = [task.space.config_at(k).values for k in range(min(12, len(task.space)))]
    inner = Streaming()
    shared = SharedMeasurer(inner)
    results: dict[int, list] = {}

    def tune(k: int) -> None:  # overlapping batches, as two tuners proposing the same configurations
        results[k] = shared.measure(task, configs[k * 2:k * 2 + 6])

    threads = [threading.Thread(target=tune, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert sorted(inner.submitted) == sorted({Config(dict(c)).key for c in configs[:12]})
    assert shared.measured == len(inner.submitted)
    for k, res in results.items():
        assert [r.costs for r in res] == [[1e-6 * (1 + len(Config(dict(c)).key))] for c in configs[k * 2:k * 2 + 6]]


def test_rows_after_a_cut_line_start_on_a_line_of_their_own(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"name": "a"}\n{"name": "cut by a ki')
    _devices.append_row(rows, {"name": "b"})
    assert [r["name"] for r in _devices.read_rows(rows)] == ["a", "b"]


def test_measure_options_of_the_workers():
    gpu = bench.measure_options("cuda", 7)
    assert gpu.builders == 7 and gpu.same_inputs and gpu.retime == 0
    assert bench.measure_options("cpu", 3).builders == 3


@pytest.mark.slow  # ~30 s on 2 cores
def test_the_gpu_pipeline_on_fake_devices(tmp_path, monkeypatch, fake_devices):
    """``--target cuda`` as the GPU host runs it, its measurements faked (no GPU here): the corpus of the
    training networks without the held-out workloads, the pretraining, the analytical fine-tuning
    sentences, the training stage, the fine-tuning and the held-out stage with the analytical tuner."""
    monkeypatch.setattr(bench, "TRAIN", ("bert-base",))
    monkeypatch.setattr(bench, "HELD_OUT", ("vit-b16",))
    monkeypatch.setattr(sys, "argv", [
        "tlm.py", "--target", "cuda", "--devices", "0,1", "--records-dir", str(tmp_path), "--corpus-size", "600",
        "--pretrain-minutes", "0.02", "--heldout", "2", "--train-workloads", "2", "--train-trials", "4",
        "--trials", "4", "--reference-trials", "6", "--batch", "2", "--builders", "1", "--analytical-top", "1",
        "--finetune-epochs", "1", "--out", str(tmp_path / "out.json"), "--quiet"])
    assert bench.main() == 0
    report = json.loads((tmp_path / "out.json").read_text())
    held = [c.name for c in bench.gpu_cases(("vit-b16",), 2)]
    assert list(report["workloads"]) == held
    for w in report["workloads"].values():
        assert list(w["tuners"]) == ["tlm", "random@4", "xgb@6", "analytical@4"]
        assert all(len(t["curve"]) == (int(s.split("@")[1]) if "@" in s else 4) for s, t in w["tuners"].items())
    header, _ = bench.corpus.read_corpus(tmp_path / "corpus.txt")
    assert set(header["excluded"]) == {bench.key_of(c) for c in bench.gpu_cases(("vit-b16",), 2)}
    analytical = (tmp_path / "analytical.txt").read_text().splitlines()
    assert analytical and report["fine_tuning"]["analytical_sentences"] == len(analytical)
    assert report["fine_tuning"]["finetuned_on"]["extra_sentences"] == len(analytical)
    assert {s.split("@")[0] for s in report["summary"]["geomean"]} == {"tlm", "random", "xgb", "analytical"}
