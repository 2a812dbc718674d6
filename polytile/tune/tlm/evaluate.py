"""Evaluating the TLM against the other tuners: each workload tuned by each tuner, reporting the best
latency after 1, 4, 10 and 32 trials (and the last).

Every tuner runs through ``tune_task`` (records, resuming, failures as for ``pt.tune``) with one
shared measurer that measures a configuration of a workload once: a configuration two tuners propose
gets the same result for both (as ALCOP's artifact replays logged measurements), so their curves
differ by their search, not by timing noise. A tuner is named with its trial budget as ``xgb@200``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
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
    by any tuner, get the first result."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.results: dict[tuple[str, str], MeasureResult] = {}
        self.measured = 0

    def measure(self, task: Task, batch: Sequence[dict[str, object]],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        keys = [(task.key, Config(dict(v)).key) for v in batch]
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

    def close(self) -> None:
        self.inner.close()


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
             tlm_options: dict[str, object] | None = None) -> dict[str, Any]:
    """Tune every workload with every tuner (``"xgb@200"`` for another trial count than ``trials``)
    and report their curves; ``measurer``: a measurer to use (kept open) instead of a new one."""
    from ..api import check_device, tune_task
    from ..search import TUNERS
    from .model import resolve
    specs = [parse_tuner(t, trials) for t in tuners]
    for name, _ in specs:
        if name not in TUNERS:
            raise TuneError(f"unknown tuner {name!r}; use one of {', '.join(TUNERS)}")
    tasks = [(w, w.task(target)) for w in workloads]
    if measurer is None and tasks:
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
    shared = SharedMeasurer(measurer if measurer is not None else Measurer(measure))
    try:
        for w, task in tasks:
            entry: dict[str, Any] = {"op": w.op, "shape": w.shape, "template": task.template.name, "key": task.key,
                                     "flops": task.flops, "tuners": {}}
            report["workloads"][w.name] = entry
            for spec, (name, count) in zip(tuners, specs, strict=True):
                options: dict[str, object] = {}
                if name == "tlm":
                    options = {"model": tlm, "temperature": temperature, "top_k": top_k, **(tlm_options or {})}
                records = Path(records_dir) / f"{name}.jsonl" if records_dir is not None else None
                start = time.perf_counter()
                result = tune_task(task, count, records, tuner=name, batch_size=batch, seed=seed, progress=progress,
                                   build_best=False, tuner_options=options, measurer=shared)
                curve = result.curve()[:count]
                entry["tuners"][spec] = {"curve": curve, "best_after": best_after(curve, (*CHECKPOINTS, count)),
                                         "failures": result.failures, "seconds": round(time.perf_counter() - start, 1),
                                         "best_config": result.best.config if result.best else None}
    finally:
        if measurer is None:
            shared.close()
    report["measured"] = shared.measured
    return report


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
