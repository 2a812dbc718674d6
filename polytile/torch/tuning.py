"""Model-level tuning: ``polytile.torch.tune(model, example_inputs, trials=..., records=...)``.

The model is traced as the backend sees it (dynamo, AOT autograd, the partition into groups); each
imported group is a tuning task of ``pt.tune`` (its Func with the template "torch_group_<target>"),
tasks with equal workload keys are one task weighted by how often the model runs it. A global trial
budget is then spent where the expected gain is largest, with the gradient task scheduler of Ansor
(Zheng et al., OSDI 2020, §6): the model's latency is f = Σ wᵢ·gᵢ, gᵢ the best time of task i after
tᵢ trials, and each round tunes the task with the most negative estimate of ∂f/∂tᵢ:

    wᵢ · (α·(gᵢ(tᵢ) − gᵢ(tᵢ − Δ))/Δ + (1 − α)·(−gᵢ(tᵢ)/tᵢ))

(the backward difference over the last Δ trials, and the optimistic guess that the next tᵢ trials
would take gᵢ to zero; Ansor's similar-task term is left out: tasks of one model rarely share a
template and a workload). Every task first gets one round. All trials go to one records file,
which the backend reads (``torch.compile(..., options={"records": path})``); a run resumes from it
like ``pt.tune``: the trials a task already has count towards the budget and are not measured again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import PolytileError
from ..target import as_target

ALPHA = 0.2  # Ansor's weight of the backward difference
WINDOW = 3  # Δ: trials in the backward difference (Ansor's backward_window_size)


@dataclass
class ModelTask:
    """A distinct workload of a model: its tuning task, how often the model runs it, its operations."""

    task: Any  # pt.tune.Task
    weight: int
    kind: str
    ops: list[str]
    curve: list[float] = field(default_factory=list)  # best time after each trial (records order)

    @property
    def best(self) -> float:
        return self.curve[-1] if self.curve else math.inf

    @property
    def trials(self) -> int:
        return len(self.curve)


@dataclass
class TuneReport:
    """The outcome of a model-level tuning run."""

    tasks: list[ModelTask]
    records: str
    new_trials: int
    seconds: float
    order: list[int] = field(default_factory=list)  # the task tuned in each round

    @property
    def estimated_s(self) -> float:
        """Σ weight × best time over the tasks that have a successful trial (seconds)."""
        return sum(t.weight * t.best for t in self.tasks if math.isfinite(t.best))

    def __str__(self) -> str:
        lines = [f"{len(self.tasks)} distinct workload(s), {sum(t.trials for t in self.tasks)} trial(s) in "
                 f"{self.records} ({self.new_trials} new, {self.seconds:.1f} s); estimated kernel time "
                 f"{self.estimated_s * 1e3:.3f} ms"]
        for t in sorted(self.tasks, key=lambda t: -t.weight * (t.best if math.isfinite(t.best) else 0)):
            best = f"{t.best * 1e6:.1f} µs" if math.isfinite(t.best) else "-"
            lines.append(f"  ×{t.weight:<3} {t.kind:<11} trials {t.trials:<4} best {best:<12} {' + '.join(t.ops)}")
        return "\n".join(lines)


def extract_tasks(model: Any, example_inputs: Sequence[Any], target: object = None,
                  channels_last: bool | None = None) -> list[ModelTask]:
    """The distinct workloads the backend would compile for ``model`` on ``example_inputs`` as tuning
    tasks, each weighted by its occurrences (the model is run once, in torch, to trace it);
    ``channels_last``: the backend's option of that name (with it, the groups read NHWC activations)."""
    from torch._dynamo.backends.common import aot_autograd

    from ..tune import TuneError, make_task
    from .compiler import Options, _channels_last, _target_of, channels_last_wanted, check_model, extract, template_name
    from .explain import Report
    tasks: dict[str, ModelTask] = {}

    def collect(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        tgt = as_target(target) if target is not None else _target_of(gm, Options())
        layouts = channels_last_wanted(Options(channels_last=channels_last), tgt, grad=False)
        imported, _, _ = extract(_channels_last(gm, Report()) if layouts else gm, tgt)
        for g, imp in imported:
            try:
                task = make_task(imp.func, tgt, template=template_name(tgt))
            except TuneError:
                continue
            if task.key in tasks:
                tasks[task.key].weight += 1
            else:
                tasks[task.key] = ModelTask(task, 1, g.kind, g.ops)
        return gm.forward

    check_model(model, "extract_tasks")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=collect), dynamic=False)
    with torch.no_grad():
        compiled(*example_inputs)
    torch._dynamo.reset()
    return list(tasks.values())


def tune(model: Any, example_inputs: Sequence[Any], *, trials: int | None = None,
         trials_per_task: int | None = None, records: str | Path, target: object = None, tuner: str = "xgb",
         batch_size: int = 8, measure: Any = None, seed: int = 0, progress: bool = True,
         channels_last: bool | None = None) -> TuneReport:
    """Tune the distinct workloads of ``model`` (see the module docstring) and return the report.

    ``trials``: the global budget (trials over all tasks, those already in ``records`` included);
    ``trials_per_task`` instead sets it to that many per distinct workload. ``records``: the JSON-lines
    file the trials are appended to (and resumed from). ``target``: default where the inputs live.
    ``tuner``, ``batch_size``, ``measure`` and ``seed`` are ``pt.tune``'s. ``channels_last``: tune the
    workloads of the backend's option of that name (compile with it to use the records).
    """
    from ..tune import MeasureOptions, Measurer, RecordLog, TuneError, tune_task
    start = time.perf_counter()
    if (trials is None) == (trials_per_task is None):
        raise TuneError("give one of trials= (the model's budget) and trials_per_task=")
    for name, v in (("trials", trials), ("trials_per_task", trials_per_task), ("batch_size", batch_size)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise TuneError(f"{name} must be a positive integer, got {v!r}")
    log = RecordLog(records)
    log.check(writable=True)
    tasks = extract_tasks(model, example_inputs, target, channels_last)
    if not tasks:
        raise TuneError("the model has no workload polytile compiles (see polytile.torch.explain)")
    tgt = tasks[0].task.target
    if tgt.kind == "cuda":
        from ..runtime.cuda_device import gpu_available
        if not gpu_available():
            raise TuneError("no GPU found: tuning a model for CUDA measures on the GPU; run it on a machine with "
                            "an NVIDIA GPU, or tune for the CPU (target='cpu' with CPU inputs)")
    budget = trials if trials is not None else trials_per_task * len(tasks)  # type: ignore[operator]
    for t in tasks:
        t.curve = _curve(log.select(t.task.key, tgt.key))
    exhausted: set[int] = set()
    order: list[int] = []
    new = 0
    spent = sum(t.trials for t in tasks)
    with Measurer(measure or MeasureOptions()) as measurer:
        while spent < budget:
            k = _next_task(tasks, exhausted)
            if k is None:
                break
            t = tasks[k]
            n = min(batch_size, budget - spent)
            try:
                res = tune_task(t.task, t.trials + n, records, tuner=tuner, batch_size=n, seed=seed + k,
                                progress=progress, verify=False, build_best=False, measurer=measurer)
            except TuneError as err:
                raise PolytileError(f"tuning {' + '.join(t.ops)} ({t.task.workload.key}) failed: {err}") from err
            t.curve = res.curve()
            order.append(k)
            if res.new_trials == 0:
                exhausted.add(k)
            new += res.new_trials
            spent += res.new_trials
    return TuneReport(tasks, str(records), new, time.perf_counter() - start, order)


def _curve(records: list[Any]) -> list[float]:
    out, best = [], math.inf
    for r in records:
        best = min(best, r.cost)
        out.append(best)
    return out


def _next_task(tasks: list[ModelTask], exhausted: set[int]) -> int | None:
    """The task the next round goes to: an untried one (heaviest first), else the most negative gradient."""
    live = [k for k in range(len(tasks)) if k not in exhausted]
    if not live:
        return None
    untried = [k for k in live if tasks[k].trials == 0]
    if untried:
        return max(untried, key=lambda k: tasks[k].weight)
    return min(live, key=lambda k: gradient(tasks[k]))


def gradient(t: ModelTask) -> float:
    """Ansor's estimate of ∂(model time)/∂(trials of task ``t``) (negative: more trials should help)."""
    g, n = t.best, t.trials
    if not math.isfinite(g):
        return 0.0  # every trial failed so far: no gain to expect from more of the same
    past = t.curve[-1 - WINDOW] if n > WINDOW else t.curve[0]
    delta = min(WINDOW, n - 1) or 1
    backward = (g - past) / delta if math.isfinite(past) else 0.0
    forward = -g / n
    return t.weight * (ALPHA * backward + (1 - ALPHA) * forward)
