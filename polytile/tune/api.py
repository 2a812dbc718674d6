"""``pt.tune``: tune an operator (or a Func) on a target and return its fastest kernel.

The run is resumable: every trial is appended to the records file as it completes; a new run with
the same file replays the records of the same workload and target into the tuner (never measuring a
configuration again) and continues until the records hold ``trials`` trials. When they already do,
the best configuration is built and returned at once (``apply_best`` does only that).
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .measure import MeasureOptions, Measurer, MeasureResult
from .records import Record, RecordLog
from .search import TUNERS, Tuner, make_tuner
from .space import TuneError
from .task import Task, make_task
from .workers import check_not_loading_main


@dataclass
class TuneResult:
    """The outcome of a tuning run: this task's records (replayed and new) and the best kernel."""

    task: Task
    records: list[Record]
    best: Record | None
    kernel: Any = None
    new_trials: int = 0
    seconds: float = 0.0
    verified: bool = False
    notes: list[str] = field(default_factory=list)

    def curve(self) -> list[float]:
        """Best cost (seconds) after each trial, in record order (inf until the first success)."""
        out, best = [], math.inf
        for r in self.records:
            best = min(best, r.cost)
            out.append(best)
        return out

    @property
    def failures(self) -> int:
        return sum(1 for r in self.records if not r.ok)


class _Progress:
    """A tqdm bar: trials done, best time and throughput so far, failures."""

    def __init__(self, enabled: bool, total: int, done: int, desc: str, flops: float):
        self.bar = None
        self.flops = flops
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=done, desc=desc, unit="trial", dynamic_ncols=True)

    def update(self, best: float, failures: int) -> None:
        if self.bar is None:
            return
        post = {"failed": failures}
        if math.isfinite(best):
            post["best"] = f"{best * 1e3:.3f} ms"
            if self.flops:
                post["GFLOP/s"] = f"{self.flops / best / 1e9:.1f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _replay(task: Task, tuner: Tuner, prior: list[Record]) -> None:
    space = task.space
    digits, costs = [], []
    for r in prior:
        try:
            cfg = space.from_values(r.config)
        except TuneError:
            continue  # a configuration of an older space: kept in the file, not replayed
        digits.append(cfg.digits)
        costs.append(r.cost)
    tuner.update(digits, costs)


def tune_task(task: Task, trials: int = 64, records: str | Path | None = None, *, tuner: str = "xgb",
              batch_size: int = 8, measure: MeasureOptions | None = None, seed: int = 0,
              progress: bool = True, verify: bool = True, build_best: bool = True,
              tuner_options: dict[str, object] | None = None,
              on_trial: Callable[[Record], None] | None = None,
              measurer: Measurer | None = None, devices: Sequence[int] | None = None,
              cluster: object = None) -> TuneResult:
    """Tune ``task`` until its records hold ``trials`` trials; see ``tune`` for the options.
    ``measurer``: an open ``Measurer`` to reuse (kept open), e.g. by callers that interleave tasks.
    Every argument, the records file and (for a GPU target) the GPU are checked before anything runs."""
    start = time.perf_counter()
    check_not_loading_main()
    _check_count("trials", trials, "to build the best recorded configuration without tuning, use "
                 "pt.tune.apply_best")
    _check_count("batch_size", batch_size)
    log = RecordLog(records) if records is not None else None
    if log is not None:
        log.check(writable=True)  # never append to a file that is not ours, never fail after trial 1
    target_key = task.target.key
    prior = log.select(task.key, target_key) if log is not None else []
    history: list[Record] = list(prior)
    options = dict(tuner_options or {})
    owned = measurer is None
    _check_devices(task, devices, cluster)
    try:
        if cluster is not None and owned:
            measurer = _measurer(measure, None, cluster)
            task = measurer.resolve(task)  # a tuner without the GPU tunes for the workers' model
            target_key = task.target.key
            prior = log.select(task.key, target_key) if log is not None else []
            history = list(prior)
        if options.get("feature") == "itervar":
            measurer = measurer or _measurer(measure, devices, cluster)
            space = task.space
            m = measurer
            options["features_of"] = lambda ds: m.features(task, [space.config(d).values for d in ds])
        if tuner in TUNERS and TUNERS[tuner].needs_task:
            options["task"] = task
        if tuner in TUNERS and TUNERS[tuner].needs_model and "predict" not in options:
            space = task.space
            options["predict"] = lambda ds: task.predict([space.config(d).values for d in ds])
            task.predict([])  # fails now, with the reason, when the template has no model
        search = make_tuner(tuner, task.space, seed, **options)
        if len(history) < trials and owned and cluster is None:
            check_device(task, devices)
        _replay(task, search, prior)
        new = 0
        if len(history) < trials:
            measurer = measurer or _measurer(measure, devices, cluster)
            bar = _Progress(progress, trials, len(history), task.workload.key, task.flops)

            def record(values: dict[str, object], res: MeasureResult) -> None:
                rec = Record(task.key, target_key, task.template.name, task.space.from_values(values).to_json(),
                             res.status, res.costs, res.error, search.name, len(history), time.time(), res.build_s,
                             res.run_s, task.flops, res.conditions, res.cached)
                with _ctrl_c_after():  # a trial written is a trial counted, whenever Ctrl-C comes
                    if log is not None:
                        log.append(rec)
                    history.append(rec)
                    if on_trial is not None:
                        on_trial(rec)
                bar.update(min(r.cost for r in history), sum(1 for r in history if not r.ok))

            try:
                # a measurer of the caller's may only measure batches (``measure``), not stream
                streams = callable(getattr(measurer, "submit", None)) and measurer.options.overlap
                run = _stream if streams else _in_batches
                new = run(task, search, measurer, trials - len(history), batch_size, record)
            finally:
                bar.close()
        result = TuneResult(task, history, _best(history), new_trials=new)
        if new == 0 and log is not None and result.best is not None:
            result.best = log.best(task.key, target_key)  # the winner declared when the records were made
        if build_best and result.best is not None:
            _finish(result, measure, verify, new > 0, devices, log, getattr(measurer, "retime", None))
    finally:
        if owned and measurer is not None:
            measurer.close()  # also after Ctrl-C: no worker outlives the run
    result.seconds = time.perf_counter() - start
    return result


@contextlib.contextmanager
def _ctrl_c_after() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) that comes during the block until its end (in the main thread, where
    Python delivers signals; elsewhere the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[object, ...]] = []
    previous = signal.signal(signal.SIGINT, lambda *frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(*caught[0])  # Python's default handler raises KeyboardInterrupt
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


def _measurer(measure: MeasureOptions | None, devices: Sequence[int] | None, cluster: object) -> Any:
    """The measurer of a run: worker processes on this machine, or a Dask cluster when ``cluster`` is given."""
    if cluster is not None:
        if measure is not None and measure.runner_cores:
            raise TuneError("MeasureOptions.runner_cores places this machine's runner and builders; a cluster's "
                            "workers are placed by Dask: leave runner_cores at 0 with cluster=")
        try:
            from .cluster import ClusterMeasurer
        except ImportError:
            raise TuneError("cluster= needs Dask distributed: pip install 'polytile[cluster]'") from None
        return ClusterMeasurer(measure, cluster)
    return Measurer(measure, devices)


Recorder = Callable[[dict[str, object], MeasureResult], None]


def _in_batches(task: Task, search: Tuner, measurer: Measurer, wanted: int, batch_size: int,
                record: Recorder) -> int:
    """Measure batch after batch (each built whole, then run): the path of ``overlap=False``."""
    new = 0
    while new < wanted:
        batch = search.propose(min(batch_size, wanted - new))
        if not batch:
            break  # the space holds no unmeasured valid configuration
        values = [task.space.config(d).values for d in batch]
        results = measurer.measure(task, values, lambda k, res, values=values: record(values[k], res))
        search.update(batch, [r.cost for r in results], [r.features for r in results])
        new += len(batch)
    return new


def _stream(task: Task, search: Tuner, measurer: Any, wanted: int, batch_size: int, record: Recorder) -> int:
    """Keep the builders busy: whenever fewer candidates wait to be built than there are builders, ask
    the tuner for up to ``batch_size`` more — unless ``batch_size`` built candidates already wait for a
    runner (the measurements are behind: proposals would only grow staler); record each result as it
    comes and tell the tuner."""
    flight: dict[int, tuple[int, ...]] = {}  # trial id -> digits
    new = 0
    exhausted = False
    while True:
        room = wanted - new - len(flight)
        slots = measurer.build_slots
        if room > 0 and not exhausted and measurer.unbuilt < slots and len(flight) < slots + batch_size:
            batch = search.propose(min(batch_size, room))
            exhausted = not batch  # the space holds no unmeasured valid configuration
            for d in batch:
                flight[measurer.submit(task, task.space.config(d).values)] = d
            continue
        if not flight:
            return new
        done = [(flight.pop(trial), res) for trial, res in measurer.collect() if trial in flight]
        for d, res in done:
            record(task.space.config(d).values, res)
        new += len(done)
        search.update([d for d, _ in done], [r.cost for _, r in done], [r.features for _, r in done])


def _check_count(name: str, value: object, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TuneError(f"{name} must be a positive integer, got {value!r}" + (f"; {hint}" if hint else ""))


def _check_devices(task: Task, devices: Sequence[int] | None, cluster: object) -> None:
    """``devices`` is a list of distinct GPU ordinals, for a GPU target, and not given with ``cluster``."""
    if devices is None:
        return
    if cluster is not None:
        raise TuneError("give devices= or cluster=, not both: a cluster's GPU workers each measure on their own GPUs")
    bad = any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices) if isinstance(
        devices, Sequence) and not isinstance(devices, (str, bytes)) else True
    if bad or not devices or len(set(devices)) < len(devices):
        raise TuneError(f"devices must be a non-empty list of distinct GPU numbers (0, 1, ...), got {devices!r}")
    if task.target.kind != "cuda":
        raise TuneError(f"devices={list(devices)} names GPUs, but {task.workload.key} is tuned for {task.target.key}; "
                        "leave devices out for a CPU target")


def check_device(task: Task, devices: Sequence[int] | None = None) -> None:
    """Measuring a GPU target needs a GPU here, and every GPU of ``devices`` must be of the target's model
    (records are per GPU model): say so before the first candidate is built."""
    if task.target.kind != "cuda":
        return
    from ..runtime.cuda_device import gpu_available
    if not gpu_available():
        raise TuneError(f"no GPU found: tuning {task.workload.key} for {task.target.key} measures every "
                        "candidate on the GPU; run it on a machine with an NVIDIA GPU, or tune for the CPU "
                        "(target='cpu', --target cpu). Without a GPU, `polytile run` compiles a kernel for "
                        "a CUDA target and reports its resources")
    if devices:
        names = gpu_names()
        for d in devices:
            if d >= len(names):
                raise TuneError(f"devices={list(devices)}: there is no GPU {d}; this machine shows {len(names)} "
                                f"({', '.join(names)})")
            if names[d] != task.target.name:
                raise TuneError(f"devices={list(devices)}: GPU {d} is a {names[d]}, not a {task.target.name} like "
                                "the target: a workload is measured on one GPU model; give devices of one model")


def gpu_names() -> list[str]:
    """The model of every GPU this process sees, by ordinal, as ``CUDATarget.name`` spells it (read from
    the driver without creating a context on any)."""
    from ..runtime.cuda_driver import load_driver
    cu = load_driver()
    cu.cuInit(0)
    err, count = cu.cuDeviceGetCount()
    names = []
    for k in range(int(count) if int(err) == 0 else 0):
        _, dev = cu.cuDeviceGet(k)
        _, raw = cu.cuDeviceGetName(256, dev)
        name = raw.split(b"\0", 1)[0].decode() if isinstance(raw, bytes) else str(raw)
        names.append(name.replace(" ", "_"))
    return names


def failure_summary(records: list[Record]) -> list[str]:
    """One line per failure status of ``records``: its count and one example error, most frequent first."""
    groups: dict[str, list[Record]] = {}
    for r in records:
        if not r.ok:
            groups.setdefault(r.status, []).append(r)
    return [f"{len(rs)} × {status}: {_gist(rs[0].error) or '(no message)'}"
            for status, rs in sorted(groups.items(), key=lambda kv: -len(kv[1]))]


def _gist(error: str, width: int = 240) -> str:
    """The telling line of an error text: a traceback's last line, else the first, followed by the first
    compiler diagnostic ("error: ...") when the first line only introduces them."""
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    if not lines:
        return ""
    if any(ln.startswith("Traceback (most recent call last)") for ln in lines):
        text = lines[-1]
    else:
        text = lines[0]
        diagnostic = next((ln for ln in lines[1:] if "error" in ln.lower()), None)
        if text.endswith(":") and diagnostic is not None:
            text = f"{text} {diagnostic}"
    return text if len(text) <= width else text[:width - 3] + "..."


def no_kernel_report(result: TuneResult, records: str | Path | None = None) -> str:
    """Why a run returned no kernel: every trial failed (the reasons, grouped) or the best ones were
    wrong at odd sizes; where each error is kept in full (``records``, the run's records file)."""
    task = result.task
    where = f"{task.workload.key} on {task.target.key}"
    if not result.records:
        return f"no trial of {where} was measured: the space holds no valid configuration"
    if any(r.ok for r in result.records):
        return (f"the best configurations of {where} were wrong at sizes that divide no tile: "
                + "; ".join(result.notes))
    lines = [f"every trial failed: no working configuration of {where} in {len(result.records)} trial(s):"]
    lines += [f"  {line}" for line in failure_summary(result.records)]
    if records is not None:
        lines.append(f"each trial's error is in full in {records}")
    return "\n".join(lines)


def _best(history: list[Record]) -> Record | None:
    ok = [r for r in history if r.ok]
    return min(ok, key=lambda r: r.cost) if ok else None


def _finish(result: TuneResult, measure: MeasureOptions | None, verify: bool, measured: bool,
            devices: Sequence[int] | None, log: RecordLog | None, remote: Callable[..., Any] | None = None) -> None:
    """Declare the winner and build it. When this run measured something new, the best configurations
    (``MeasureOptions.retime`` of them, at least the three ``verify`` checks) are timed again in a fresh
    runner process, in interleaved rounds, after a check at sizes that divide no tile (``verify``: one
    that fails is set aside, with a warning); the winner is the fastest, a tie within the noise band
    going to the configuration whose decisions come first. It is written to the records as such. With
    ``retime=0`` the winner is the fastest trial that passes the check, as first measured.
    ``remote``: the re-timing of a cluster's measurer (on a worker with the target's device)."""
    from ..build import build
    task = result.task
    opts = measure or MeasureOptions()
    count = max(opts.retime, 3 if verify else 1)
    if measured and (opts.retime or verify):
        ranked = _distinct(sorted((r for r in result.records if r.ok), key=lambda r: r.cost))[:count]
        configs = [r.config for r in ranked]
        rounds = RETIME_ROUNDS if opts.retime else 1
        timed = remote(task, configs, opts, verify, rounds) if remote is not None else retime(
            task, configs, opts, verify, devices[:1] if devices else None, rounds)
        passed: list[tuple[Record, float]] = []
        for rec, (ok, cost, why) in zip(ranked, timed, strict=False):
            if ok:
                passed.append((rec, cost))
                continue
            result.notes.append(f"best configuration rejected at odd sizes ({why}): {rec.config}")
            warnings.warn(result.notes[-1], stacklevel=3)
        if not passed:
            result.best = None
            return
        result.verified = verify
        if opts.retime:
            winner, cost = pick_winner(task, passed, opts.noise_band)
            result.best = Record(**{**winner.__dict__, "costs": [cost], "role": "winner", "started": time.time(),
                                    "tuner": "retime"})
            if log is not None:
                log.append(result.best)
        else:
            result.best = passed[0][0]
    result.kernel = build(task.schedule(result.best.config), task.target)


def _distinct(records: list[Record]) -> list[Record]:
    seen: set[str] = set()
    out = []
    for r in records:
        if r.config_key not in seen:
            seen.add(r.config_key)
            out.append(r)
    return out


RETIME_ROUNDS = 3


def retime(task: Task, configs: list[dict[str, object]], options: MeasureOptions, check_odd: bool,
           devices: Sequence[int] | None = None, rounds: int = RETIME_ROUNDS) -> list[tuple[bool, float, str]]:
    """Time ``configs`` again in a fresh runner process: each built once (checked at sizes that divide
    no tile when ``check_odd``), then timed in ``rounds`` interleaved rounds so that all meet the same
    machine; per configuration (passed, median of its rounds, why it failed)."""
    opts = MeasureOptions(**{**options.__dict__, "check_odd_shape": check_odd, "check": True,
                             "overlap": False, "result_cache": False})
    with Measurer(opts, devices) as fresh:
        builds = fresh.build(task, configs)
        costs: list[list[float]] = [[] for _ in configs]
        failed: list[str] = [""] * len(configs)
        for _ in range(rounds):
            for k, (values, built) in enumerate(zip(configs, builds, strict=False)):
                if failed[k]:
                    continue
                res = fresh.run_built(task, values, built)
                if res.ok:
                    costs[k].append(res.cost)
                else:
                    failed[k] = f"{res.status}: {res.error}"
            opts.check_odd_shape = False  # checked in the first round; the kernels are the same
    return [(not why, float(np.median(c)) if c and not why else math.inf, why) for c, why in zip(costs, failed)]


def pick_winner(task: Task, timed: list[tuple[Record, float]], band: float) -> tuple[Record, float]:
    """The fastest of ``timed`` (record, re-timed cost); configurations within ``band`` (relative) of it
    tie, and a tie goes to the one whose decisions come first in the template's order (its digits),
    so two runs that find the same near-ties pick the same winner whatever the noise."""
    fastest = min(cost for _, cost in timed)
    tied = [(rec, cost) for rec, cost in timed if cost <= fastest * (1 + band)]

    def order(item: tuple[Record, float]) -> tuple[object, ...]:
        try:
            return (0, task.space.from_values(item[0].config).digits)
        except TuneError:
            return (1, item[0].config_key)  # a configuration of an older space: after the others
    return min(tied, key=order)


def tune(op_or_func: object, *, target: object = "cpu", trials: int = 64, records: str | Path | None = None,
         tuner: str = "xgb", template: str | None = None, batch_size: int = 8,
         measure: MeasureOptions | None = None, seed: int = 0, progress: bool = True, verify: bool = True,
         feature: str = "knob", objective: str = "rank", model: object = None, temperature: float = 1.0,
         top_k: int = 0, devices: Sequence[int] | None = None, cluster: object = None, **shape: object) -> Any:
    """Tune an operator and return its fastest kernel.

    ``op_or_func``: an operator name with its sizes as keywords (``pt.tune("matmul", M=512, N=512,
    K=512)``), a ``polytile.ops`` operator, or a ``pt.Func`` (tuned with the generic template).
    ``trials``: how many trials the records of this workload and target should hold when it returns
    (a resumed run continues; a complete one returns at once). ``records``: the JSON-lines log.
    ``tuner``: "xgb" (cost-model-guided annealing), "random", "grid", "analytical" (measure in the
    order of the template's analytical model) or "analytical+xgboost" (XGBoost pre-trained on the
    analytical model, refined by measurements); ``feature`` ("knob" or "itervar") and ``objective``
    ("rank" or "reg") configure the XGBoost cost model. ``tuner="tlm"`` has each batch written by a
    tensor language model: ``model`` is its directory (``polytile tlm pretrain``/``finetune``) or
    "default" (the model shipped for the CPU), sampled at ``temperature`` among the ``top_k``
    likeliest words (0: all), fine-tuned on the best measurements between batches. ``verify`` checks the
    winner at sizes that divide no tile before returning it (not when nothing new was measured).
    ``devices``: the GPUs to measure on at once, e.g. ``[0, 1]`` (one long-lived runner process each;
    all of the target's model). ``cluster``: a Dask distributed scheduler's address
    (``"tcp://host:8786"``), a ``distributed.Client``, or ``"local"`` for a ``LocalCluster`` on this
    machine: candidates are built on its workers and measured on the workers whose device is the
    target's, the records streamed back to ``records`` here.
    Raises ``TuneError`` before anything runs on bad arguments (counts below 1, a records path that
    is not a records file or cannot be written, a CUDA target without a GPU), and at the end when no
    trial succeeded (the failures grouped by status). The kernel's ``tune_result`` attribute holds
    the records and the curve.
    """
    task = make_task(op_or_func, target, template, **shape)
    opts = tuner_options(tuner, feature=feature, objective=objective, model=model, temperature=temperature,
                         top_k=top_k)
    result = tune_task(task, trials, records, tuner=tuner, batch_size=batch_size, measure=measure, seed=seed,
                       progress=progress, verify=verify, tuner_options=opts, devices=devices, cluster=cluster)
    if result.kernel is None:
        raise TuneError(no_kernel_report(result, records))
    result.kernel.tune_result = result
    return result.kernel


def tuner_options(tuner: str, *, feature: str = "knob", objective: str = "rank", model: object = None,
                  temperature: float = 1.0, top_k: int = 0) -> dict[str, object]:
    """The options of ``tune`` that ``tuner`` takes; TuneError for the TLM's options given to another."""
    if tuner == "tlm":
        return {"model": model, "temperature": temperature, "top_k": top_k}
    if model is not None or temperature != 1.0 or top_k != 0:
        raise TuneError(f"model, temperature and top_k are options of tuner='tlm', not of {tuner!r}")
    return {"feature": feature, "objective": objective} if tuner in ("xgb", "analytical+xgboost") else {}


def apply_best(op_or_func: object, records: str | Path, *, target: object = "cpu",
               template: str | None = None, **shape: object) -> Any:
    """Build the best configuration recorded for this workload on this target, without tuning.

    Raises ``TuneError`` when the records hold no successful trial of it on this target (records of
    other targets are never applied; the message lists the targets they hold).
    """
    log = RecordLog(records)
    log.check()
    if not log.path.exists():
        raise TuneError(f"records file {records} does not exist; tune with records={str(records)!r} first")
    task = make_task(op_or_func, target, template, **shape)
    best = log.best(task.key, task.target.key)
    if best is None:
        others = sorted(log.targets_of(task.key) - {task.target.key})
        hint = f"; the file holds this workload for other targets: {', '.join(others)}" if others else ""
        raise TuneError(f"{records} holds no successful trial of {task.key} on {task.target.key}{hint}; "
                        "tune it on this target first")
    from ..build import build
    return build(task.schedule(best.config), task.target)

