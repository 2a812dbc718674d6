"""Evaluating the TLM against the other tuners: each workload tuned by each tuner, reporting the best
latency after 1, 4, 10 and 32 trials (and the last).

Every tuner runs through ``tune_task`` (records, resuming, failures as for ``pt.tune``) with one
shared measurer that measures a configuration of a workload once: a configuration two tuners propose
gets the same result for both (as ALCOP's artifact replays logged measurements), so their curves
differ by their search, not by timing noise (a resumed evaluation takes the results from the records).
A tuner is named with its trial budget as ``xgb@200``. Several tunings may run at once in threads
(``jobs``), each still batch after batch, so that one builder pool serves them all; a deadline stops
them at a trial, to be resumed from the records.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..measure import MeasureOptions, Measurer, MeasureResult
from ..space import Config, TuneError
from ..task import Task, make_task

CHECKPOINTS = (1, 4, 10, 32)


@dataclass(frozen=True)
class Case:
    """A workload to evaluate on: a display name, an operator and its arguments, optionally a template."""

    name: str
    op: str
    shape: dict[str, object] = field(default_factory=dict)
    template: str | None = None

    def task(self, target: object) -> Task:
        return make_task(self.op, target, self.template, **self.shape)


class SharedMeasurer:
    """Measures each distinct configuration of a task once (through ``inner``); later proposals of it,
    by any tuner, get the first result (``known``: results from before, e.g. the records of a resumed
    run). Tunings in threads may share it (``evaluate(jobs=)``): with a streaming ``inner``
    (``Measurer``'s ``submit``/``collect``) their batches are built side by side, one waiting for a
    configuration another tuner already submitted."""

    def __init__(self, inner: Any, known: dict[tuple[str, str], MeasureResult] | None = None):
        self.inner = inner
        self.results: dict[tuple[str, str], MeasureResult] = dict(known or {})
        self.measured = 0
        self._lock = threading.Condition()
        self._submitted: dict[int, tuple[str, str]] = {}  # the inner measurer's trial id -> key
        self._streams = callable(getattr(inner, "submit", None))

    def measure(self, task: Task, batch: Sequence[dict[str, object]],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        keys = [(task.key, Config(dict(v)).key) for v in batch]
        with self._lock:
            if self._streams:
                self._stream(task, batch, keys)
            else:
                todo = [k for k, key in enumerate(keys) if key not in self.results]
                fresh = self.inner.measure(task, [batch[k] for k in todo]) if todo else []
                self.measured += len(todo)
                for k, res in zip(todo, fresh, strict=True):
                    self.results[keys[k]] = res
            out = [self.results[key] for key in keys]
        for k, res in enumerate(out):
            if on_result is not None:
                on_result(k, res)
        return out

    def _stream(self, task: Task, batch: Sequence[dict[str, object]], keys: list[tuple[str, str]]) -> None:
        """Submit the configurations nobody submitted yet, then collect (for every waiting thread) until
        all of ``keys`` have results; the lock is held, and given up between collections."""
        pending = set(self._submitted.values())
        for values, key in zip(batch, keys, strict=True):
            if key not in self.results and key not in pending:
                self._submitted[self.inner.submit(task, dict(values))] = key
                pending.add(key)
                self.measured += 1
        while any(key not in self.results for key in keys):
            for trial, res in self.inner.collect(timeout=0.05):
                key = self._submitted.pop(trial, None)
                if key is not None:
                    self.results[key] = res
            self._lock.notify_all()
            if any(key not in self.results for key in keys):
                self._lock.wait(0.002)  # another thread may submit or collect meanwhile

    def close(self) -> None:
        self.inner.close()


def recorded_results(records_dir: str | os.PathLike[str], tasks: Sequence[Task],
                     ) -> dict[tuple[str, str], MeasureResult]:
    """The results of ``tasks``' configurations in the records of every tuner in ``records_dir``
    (``<tuner>.jsonl``): a resumed evaluation gives a configuration the result it had for every tuner."""
    from ..records import RecordLog
    from ..search import TUNERS
    keys = {(t.key, t.target.key) for t in tasks}
    known: dict[tuple[str, str], MeasureResult] = {}
    for name in TUNERS:
        for r in RecordLog(Path(records_dir) / f"{name}.jsonl"):
            if (r.workload, r.target) in keys and r.role == "trial":
                known.setdefault((r.workload, Config(r.config).key), MeasureResult(r.status, r.costs, r.error))
    return known


class Stopped(Exception):
    """A tuning stopped at ``evaluate``'s deadline (its trials so far are in the records)."""


def parse_tuner(spec: str, trials: int) -> tuple[str, int]:
    """``"xgb@200"`` → ("xgb", 200); ``"tlm"`` → ("tlm", trials)."""
    name, _, count = spec.partition("@")
    if count and not (count.isdigit() and int(count) > 0):
        raise TuneError(f"tuner {spec!r}: the trial count after '@' must be a positive integer")
    return name, int(count) if count else trials


def best_after(curve: Sequence[float], checkpoints: Sequence[int]) -> dict[str, float | None]:
    """The best latency after each checkpoint's trial count (None before the first success or past the
    curve's end)."""
    out: dict[str, float | None] = {}
    for n in checkpoints:
        v = curve[n - 1] if len(curve) >= n else None
        out[str(n)] = v if v is not None and math.isfinite(v) else None
    return out


def evaluate(model: object, workloads: Sequence[Case], target: object, tuners: Sequence[str], trials: int = 32,
             batch: int = 8, *, records_dir: str | os.PathLike[str] | None = None, corpus: str | None = None,
             temperature: float = 1.0, top_k: int = 0, measure: MeasureOptions | None = None,
             measurer: Any = None, seed: int = 0, progress: bool = True,
             tlm_options: dict[str, object] | None = None, jobs: int = 1, deadline: float = 0.0,
             on_workload: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Tune every workload with every tuner (``"xgb@200"`` for another trial count than ``trials``)
    and report their curves; ``measurer``: a measurer to use (kept open) instead of a new one.

    ``jobs``: tunings run at once, in threads, longest first (each still measures batch after batch,
    so its curve is as if it ran alone; the builders of a shared ``Measurer`` serve them all).
    ``deadline`` (``time.time()``; 0: none): no tuning starts after it, and one running stops at its
    next trial (its trials are in the records; the workload is left out of the report).
    ``on_workload(name, entry)``: called as each workload's tunings have all ended, with its entry."""
    from ..search import TUNERS
    from .model import resolve
    specs = [parse_tuner(t, trials) for t in tuners]
    for name, _ in specs:
        if name not in TUNERS:
            raise TuneError(f"unknown tuner {name!r}; use one of {', '.join(TUNERS)}")
    tasks = [(w, w.task(target)) for w in workloads]
    if measurer is None and tasks:
        from ..api import check_device
        check_device(tasks[0][1])  # measuring a GPU target needs a GPU: said before anything runs
    tlm = resolve(model, tasks[0][1].target.kind) if any(n == "tlm" for n, _ in specs) and tasks else None
    report: dict[str, Any] = {"target": tasks[0][1].target.key if tasks else None, "trials": trials,
                              "tuners": list(tuners), "workloads": {}}
    if tlm is not None:
        report["model"] = {"path": str(tlm.path), "parameters": tlm.parameters, "meta": tlm.meta}
        if corpus is not None:
            from .corpus import read_corpus
            from .train import loss_of
            report["corpus_loss"] = loss_of(tlm, read_corpus(corpus)[1])
    known = recorded_results(records_dir, [t for _, t in tasks]) if records_dir is not None else {}
    shared = SharedMeasurer(measurer if measurer is not None else Measurer(measure), known)
    entries = {w.name: {"op": w.op, "shape": w.shape, "template": task.template.name, "key": task.key,
                        "flops": task.flops, "tuners": {}} for w, task in tasks}
    runs = sorted(((w, task, spec, name, count) for w, task in tasks for spec, (name, count) in zip(tuners, specs,
                                                                                                    strict=True)),
                  key=lambda run: -run[4])
    left = {w.name: len(specs) for w, _ in tasks}
    lock = threading.Lock()

    def tune_one(w: Case, task: Task, spec: str, name: str, count: int) -> None:
        if deadline and time.time() > deadline:
            return
        options: dict[str, object] = {}
        if name == "tlm":
            options = {"model": tlm, "temperature": temperature, "top_k": top_k, **(tlm_options or {})}
        records = Path(records_dir) / f"{name}.jsonl" if records_dir is not None else None
        start = time.perf_counter()
        try:
            result = _tune(task, count, records, name, batch, seed, progress and jobs == 1, options, shared, deadline)
        except Stopped:
            return
        curve = result.curve()[:count]
        entry = entries[w.name]
        with lock:
            entry["tuners"][spec] = {"curve": curve, "best_after": best_after(curve, (*CHECKPOINTS, count)),
                                     "failures": result.failures, "seconds": round(time.perf_counter() - start, 1),
                                     "best_config": result.best.config if result.best else None}
            left[w.name] -= 1
            finished = left[w.name] == 0
        if finished:  # in the order of the tuners given
            entry["tuners"] = {spec: entry["tuners"][spec] for spec in tuners}
            if on_workload is not None:
                on_workload(w.name, entry)

    try:
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            for future in [pool.submit(tune_one, *run) for run in runs]:
                future.result()
    finally:
        if measurer is None:
            shared.close()
    report["workloads"] = {w.name: entries[w.name] for w, _ in tasks if left[w.name] == 0}
    report["measured"] = shared.measured
    return report


def _tune(task: Task, count: int, records: Path | None, tuner: str, batch: int, seed: int, progress: bool,
          options: dict[str, object], measurer: SharedMeasurer, deadline: float) -> Any:
    """One tuning of ``evaluate``, stopped (``Stopped``) at the first trial after ``deadline``."""
    from ..api import tune_task

    def stop_at_deadline(_record: object) -> None:
        if deadline and time.time() > deadline:
            raise Stopped

    return tune_task(task, count, records, tuner=tuner, batch_size=batch, seed=seed, progress=progress,
                     build_best=False, tuner_options=options, measurer=measurer, on_trial=stop_at_deadline)


def print_table(report: dict[str, Any]) -> None:
    """The best latency (ms) after 1, 4, 10, 32 and all trials, per workload and tuner."""
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"best latency (ms) after n trials on {report['target']}")
    table.add_column("workload")
    table.add_column("tuner")
    columns = sorted({int(n) for w in report["workloads"].values() for t in w["tuners"].values()
                      for n in t["best_after"]})
    for n in columns:
        table.add_column(f"@{n}", justify="right")
    for name, w in report["workloads"].items():
        for tuner, t in w["tuners"].items():
            cells = [t["best_after"].get(str(n)) for n in columns]
            table.add_row(name, tuner, *("-" if v is None else f"{v * 1e3:.4f}" for v in cells))
    Console().print(table)
    if "corpus_loss" in report:
        print(f"model loss per decision word on the corpus: {report['corpus_loss']:.3f}")
