"""``pt.tune``: tune an operator (or a Func) on a target and return its fastest kernel.

The run is resumable: every trial is appended to the records file as it completes; a new run with
the same file replays the records of the same workload and target into the tuner (never measuring a
configuration again) and continues until the records hold ``trials`` trials. When they already do,
the best configuration is built and returned at once (``apply_best`` does only that).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
              measurer: Measurer | None = None) -> TuneResult:
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
    try:
        if options.get("feature") == "itervar":
            measurer = measurer or Measurer(measure)
            space = task.space
            m = measurer
            options["features_of"] = lambda ds: m.features(task, [space.config(d).values for d in ds])
        if tuner in TUNERS and TUNERS[tuner].needs_model and "predict" not in options:
            space = task.space
            options["predict"] = lambda ds: task.predict([space.config(d).values for d in ds])
            task.predict([])  # fails now, with the reason, when the template has no model
        search = make_tuner(tuner, task.space, seed, **options)
        if len(history) < trials and owned:
            _check_device(task)
        _replay(task, search, prior)
        new = 0
        if len(history) < trials:
            measurer = measurer or Measurer(measure)
            bar = _Progress(progress, trials, len(history), task.workload.key, task.flops)
            try:
                while len(history) < trials:
                    batch = search.next_batch(min(batch_size, trials - len(history)))
                    if not batch:
                        break  # the space holds no unmeasured valid configuration
                    configs = [task.space.config(d) for d in batch]

                    def record(k: int, res: MeasureResult, configs: list[Any] = configs) -> None:
                        rec = Record(task.key, target_key, task.template.name, configs[k].to_json(), res.status,
                                     res.costs, res.error, search.name, len(history), time.time(), res.build_s,
                                     res.run_s, task.flops)
                        if log is not None:
                            log.append(rec)
                        history.append(rec)
                        if on_trial is not None:
                            on_trial(rec)
                        bar.update(min(r.cost for r in history), sum(1 for r in history if not r.ok))

                    results = measurer.measure(task, [c.values for c in configs], record)
                    search.update(batch, [r.cost for r in results], [r.features for r in results])
                    new += len(batch)
            finally:
                bar.close()
        result = TuneResult(task, history, _best(history), new_trials=new)
        if build_best and result.best is not None:
            _finish(result, measure, verify and new > 0)  # complete records: the winner was checked
    finally:
        if owned and measurer is not None:
            measurer.close()  # also after Ctrl-C: no worker outlives the run
    result.seconds = time.perf_counter() - start
    return result


def _check_count(name: str, value: object, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TuneError(f"{name} must be a positive integer, got {value!r}" + (f"; {hint}" if hint else ""))


def _check_device(task: Task) -> None:
    """Measuring a GPU target needs a GPU here: say so before the first candidate is built."""
    if task.target.kind != "cuda":
        return
    from ..runtime.cuda_device import gpu_available
    if not gpu_available():
        raise TuneError(f"no GPU found: tuning {task.workload.key} for {task.target.key} measures every "
                        "candidate on the GPU; run it on a machine with an NVIDIA GPU, or tune for the CPU "
                        "(target='cpu', --target cpu). Without a GPU, `polytile run` compiles a kernel for "
                        "a CUDA target and reports its resources")


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


def _finish(result: TuneResult, measure: MeasureOptions | None, verify: bool) -> None:
    """Build the best configuration; with ``verify``, first check it at sizes that divide no tile (in
    the isolated runner), falling back to the next best when it fails."""
    from ..build import build
    task = result.task
    ranked = sorted((r for r in result.records if r.ok), key=lambda r: r.cost)
    if verify:
        opts = MeasureOptions(**{**(measure or MeasureOptions()).__dict__, "check_odd_shape": True,
                                 "repeat": 1, "min_time": 0.0})
        with Measurer(opts) as checker:
            for rec in ranked[:3]:
                res = checker.measure(task, [rec.config])[0]
                if res.ok:
                    result.best, result.verified = rec, True
                    break
                result.notes.append(f"best configuration rejected at odd sizes ({res.status}: {res.error}): "
                                    f"{rec.config}")
                warnings.warn(result.notes[-1], stacklevel=3)
            else:
                result.best = None
                return
    result.kernel = build(task.schedule(result.best.config), task.target)


def tune(op_or_func: object, *, target: object = "cpu", trials: int = 64, records: str | Path | None = None,
         tuner: str = "xgb", template: str | None = None, batch_size: int = 8,
         measure: MeasureOptions | None = None, seed: int = 0, progress: bool = True, verify: bool = True,
         feature: str = "knob", objective: str = "rank", **shape: object) -> Any:
    """Tune an operator and return its fastest kernel.

    ``op_or_func``: an operator name with its sizes as keywords (``pt.tune("matmul", M=512, N=512,
    K=512)``), a ``polytile.ops`` operator, or a ``pt.Func`` (tuned with the generic template).
    ``trials``: how many trials the records of this workload and target should hold when it returns
    (a resumed run continues; a complete one returns at once). ``records``: the JSON-lines log.
    ``tuner``: "xgb" (cost-model-guided annealing), "random", "grid", "analytical" (measure in the
    order of the template's analytical model) or "analytical+xgboost" (XGBoost pre-trained on the
    analytical model, refined by measurements); ``feature`` ("knob" or "itervar") and ``objective``
    ("rank" or "reg") configure the XGBoost cost model. ``verify`` checks the
    winner at sizes that divide no tile before returning it (not when nothing new was measured).
    Raises ``TuneError`` before anything runs on bad arguments (counts below 1, a records path that
    is not a records file or cannot be written, a CUDA target without a GPU), and at the end when no
    trial succeeded (the failures grouped by status). The kernel's ``tune_result`` attribute holds
    the records and the curve.
    """
    task = make_task(op_or_func, target, template, **shape)
    opts = {"feature": feature, "objective": objective} if tuner in ("xgb", "analytical+xgboost") else {}
    result = tune_task(task, trials, records, tuner=tuner, batch_size=batch_size, measure=measure, seed=seed,
                       progress=progress, verify=verify, tuner_options=opts)
    if result.kernel is None:
        raise TuneError(no_kernel_report(result, records))
    result.kernel.tune_result = result
    return result.kernel


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

