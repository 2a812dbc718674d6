"""Measurement: candidates built in parallel worker processes, run one at a time in a runner process.

Building (template → schedule → lowering → compilation) happens in ``MeasureOptions.builders``
processes; the iter features of the lowered IR come back with the kernel. Running happens in one
separate runner process, after the batch is built (so compilers do not disturb the timings): fresh
random inputs (seeded per configuration), one call checked against the operator's reference, then
timed (median of repeats, optional cache flush between runs). A crash (segfault, abort), a hang
(deadline), a wrong result or a device error costs that candidate one failed trial, with its reason;
the runner is replaced and tuning goes on.
"""

from __future__ import annotations

import os
import pickle
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DeviceError
from .features import itervar_features
from .space import InvalidConfig, TuneError
from .task import Task, Workload
from .workers import Crashed, Outcome, Raised, Returned, TimedOut, WorkerPool

STATUSES = ("ok", "invalid", "build_error", "build_timeout", "build_crash", "wrong_result", "crash",
            "timeout", "runtime_error", "device_error")


@dataclass
class MeasureOptions:
    """How candidates are built and timed.

    ``builders``: parallel build processes (default: the CPU cores). ``repeat``/``min_time``/``warmup``:
    timing (median of at least ``repeat`` runs or ``min_time`` seconds, capped by ``run_timeout``).
    ``flush_cache``: write a buffer larger than the caches before every timed run (CPU).
    ``check``: compare one call with the reference first. ``check_odd_shape``: also build the
    configuration at sizes that divide no tile (``odd_shape`` of the template) and check it.
    ``threads``: OpenMP threads of the timed kernels (0: the OpenMP default, every core).
    ``same_inputs``: check and time every candidate of a workload on one set of random inputs, its
    reference computed once (for operators whose NumPy reference costs seconds, e.g. a 4096³ GEMM).
    ``before_run``: a module-level function ``f(task, values)`` called in the runner before the
    kernel runs — a test hook to simulate faulty kernels; leave it None.
    """

    builders: int = 0
    build_timeout: float = 300.0
    run_timeout: float = 30.0
    repeat: int = 10
    min_time: float = 0.1
    warmup: int = 2
    flush_cache: bool = False
    check: bool = True
    check_odd_shape: bool = False
    threads: int = 0
    same_inputs: bool = False
    before_run: Callable[[Task, dict[str, object]], None] | None = None

    def __post_init__(self) -> None:
        at_least = {"builders": 0, "repeat": 1, "warmup": 0, "threads": 0, "min_time": 0.0}
        for name, low in at_least.items():
            if not getattr(self, name) >= low:
                raise TuneError(f"MeasureOptions.{name} must be at least {low}, got {getattr(self, name)!r}")
        for name in ("build_timeout", "run_timeout"):
            if not getattr(self, name) > 0:
                raise TuneError(f"MeasureOptions.{name} must be a positive number of seconds, "
                                f"got {getattr(self, name)!r}")

    def builder_count(self) -> int:
        return self.builders or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                    else (os.cpu_count() or 1))


@dataclass
class MeasureResult:
    """One trial: ``status`` (one of ``STATUSES``), timings in seconds, the error text of a failure."""

    status: str
    costs: list[float] = field(default_factory=list)
    error: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    features: np.ndarray | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def cost(self) -> float:
        """The median time of a successful trial; inf for a failed one."""
        return float(np.median(self.costs)) if self.ok and self.costs else float("inf")


# --- kernels across processes -----------------------------------------------------------------------------


@dataclass
class KernelArtifact:
    """What a runner needs to load a built kernel without lowering it again."""

    kind: str
    payload: Any


def pack_kernel(kern: Any, task: Task, values: dict[str, object]) -> KernelArtifact:
    """CPU kernels travel as their lowered IR and source (the shared library is in the build cache);
    other kernels as themselves when they pickle, else as the configuration to build again."""
    from ..runtime.cpu import CPUKernel
    if isinstance(kern, CPUKernel):
        return KernelArtifact("cpu", (kern.func, kern.lowered, kern.source))
    try:
        pickle.dumps(kern)
    except Exception:  # noqa: BLE001 - any pickling failure means: rebuild in the runner
        return KernelArtifact("rebuild", (task, values))
    return KernelArtifact("pickle", kern)


def load_kernel(art: KernelArtifact) -> Any:
    if art.kind == "cpu":
        from ..runtime.cpu import CPUKernel
        func, lowered, source = art.payload
        return CPUKernel(func, lowered, source)
    if art.kind == "rebuild":
        from ..build import build
        task, values = art.payload
        return build(task.schedule(values), task.target)
    return art.payload


# --- what the workers run ------------------------------------------------------------------------------


def odd_workload(task: Task) -> Workload:
    """The workload at sizes that divide no tile: every size above 8 lowered to the closest prime
    (structural sizes — filter, stride, padding, dilation — kept)."""
    structural = {"R", "S", "stride", "padding", "dilation"}
    shape = dict(task.workload.shape)
    odd = {k: (_prime_below(v) if isinstance(v, int) and k not in structural and v > 8 else v)
           for k, v in shape.items()}
    return task.workload.with_shape(odd)


def _prime_below(n: int) -> int:
    def prime(m: int) -> bool:
        return m > 1 and all(m % p for p in range(2, int(m ** 0.5) + 1))
    m = n - 1
    while not prime(m):
        m -= 1
    return m


def build_candidate(task: Task, values: dict[str, object], odd: bool) -> tuple[KernelArtifact, np.ndarray,
                                                                              KernelArtifact | None, float]:
    """Build one configuration (in a builder process): its kernel, iter features and, when ``odd``,
    the kernel of the same configuration at odd sizes."""
    from ..build import build
    t0 = time.perf_counter()
    kern = build(task.schedule(values), task.target)
    feats = itervar_features(kern.lowered, getattr(task.target, "cores", 1))
    odd_art = None
    if odd:
        odd_task = Task(task.template, odd_workload(task), task.target)
        odd_art = pack_kernel(build(odd_task.schedule(values), task.target), odd_task, values)
    return pack_kernel(kern, task, values), feats, odd_art, time.perf_counter() - t0


def lower_features(task: Task, values: dict[str, object]) -> np.ndarray:
    """Iter features of one configuration (lowering only; in a builder process)."""
    from ..build import lower
    lowered = lower(task.schedule(values), task.target)
    return itervar_features(lowered, getattr(task.target, "cores", 1))


_OPS: dict[str, Any] = {}
_REFERENCES: dict[tuple[str, int], tuple[list[np.ndarray], Any]] = {}  # the last workload's only


def _reference(op: Any, seed: int, keep: str | None) -> tuple[list[np.ndarray], Any]:
    """Random inputs drawn with ``seed`` and the operator's reference result, kept under the workload
    key ``keep`` when given."""
    if keep is not None and (keep, seed) in _REFERENCES:
        return _REFERENCES[keep, seed]
    inputs = op.make_inputs(np.random.default_rng(seed))
    found = inputs, op.reference(*inputs)
    if keep is not None:
        _REFERENCES.clear()
        _REFERENCES[keep, seed] = found
    return found


def _check(kern: Any, op: Any, seed: int, keep: str | None = None) -> tuple[list[np.ndarray], str]:
    inputs, ref = _reference(op, seed, keep)
    out = kern(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    from ..ops import rel_error
    for o, r in zip(outs, refs, strict=False):
        err = rel_error(np.asarray(o), np.asarray(r))
        if not err <= op.tolerance:
            return inputs, f"relative error {err:.3g} exceeds {op.tolerance:g}"
    return inputs, ""


def run_candidate(task: Task, values: dict[str, object], art: KernelArtifact, odd_art: KernelArtifact | None,
                  opts: MeasureOptions) -> tuple[str, list[float], str]:
    """Check and time one built kernel (in the runner process): (status, costs, error)."""
    if opts.before_run is not None:
        opts.before_run(task, values)
    key = task.workload.key
    if key not in _OPS:
        _OPS.clear()
        _OPS[key] = task.workload.instantiate()
    op = _OPS[key]
    seed = 0 if opts.same_inputs else zlib.crc32(repr(sorted(values.items())).encode())
    kern = load_kernel(art)
    if odd_art is not None:
        _, err = _check(load_kernel(odd_art), odd_workload(task).instantiate(), seed)
        if err:
            return "wrong_result", [], f"at odd sizes: {err}"
    t0 = time.perf_counter()
    if opts.check:
        inputs, err = _check(kern, op, seed, keep=key if opts.same_inputs else None)
        if err:
            return "wrong_result", [], err
    else:
        inputs = op.make_inputs(np.random.default_rng(seed))
        kern(*inputs)
    first = time.perf_counter() - t0
    budget = max(opts.min_time, 0.3 * opts.run_timeout)
    repeat = int(max(3, min(opts.repeat, budget / max(first, 1e-9))))
    extra = {"flush_cache": True} if opts.flush_cache else {}
    costs = [kern.benchmark(*inputs, repeat=repeat, warmup=opts.warmup if first < 0.5 else 0,
                            min_time=min(opts.min_time, budget), **extra)]
    return "ok", costs, ""


# --- the measurer ------------------------------------------------------------------------------------


def _failure(outcome: Outcome, stage: str) -> tuple[str, str]:
    if isinstance(outcome, TimedOut):
        return f"{stage}timeout", f"no result within {outcome.seconds:g} s"
    if isinstance(outcome, Crashed):
        what = outcome.signal or f"exit code {outcome.exitcode}"
        who = "builder" if stage else "runner"
        return ("build_crash" if stage else "crash"), f"the {who} process died ({what})"
    assert isinstance(outcome, Raised)
    if outcome.kind == InvalidConfig.__name__:
        return "invalid", outcome.message
    if outcome.kind == DeviceError.__name__:
        return "device_error", outcome.message
    if stage:
        return "build_error", f"{outcome.kind}: {outcome.message}"
    return "runtime_error", f"{outcome.kind}: {outcome.message}"


class Measurer:
    """Builds and runs batches of configurations of tasks; owns the builder pool and the runner."""

    def __init__(self, options: MeasureOptions | None = None):
        self.options = options or MeasureOptions()
        threads = self.options.threads
        # NumPy's BLAS computes references single-threaded: its idle threads spin after each call
        # and would steal the cores from the kernel timed next
        env = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        self.builders = WorkerPool(self.options.builder_count(), {"OMP_NUM_THREADS": "1"})
        self.runner = WorkerPool(1, env)

    def measure(self, task: Task, batch: list[dict[str, object]],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Build every configuration of ``batch`` in parallel, then check and time each in turn."""
        builds = self.build(task, batch)
        results: list[MeasureResult] = []
        for k, (values, built) in enumerate(zip(batch, builds, strict=False)):
            res = self.run_built(task, values, built)
            results.append(res)
            if on_result is not None:
                on_result(k, res)
        return results

    def build(self, task: Task, batch: list[dict[str, object]]) -> list[Outcome]:
        """Build every configuration of ``batch`` in parallel without running them: each outcome's
        value (when it returned) goes to ``run_built`` later, possibly on another machine (it pickles)."""
        opts = self.options
        return self.builders.map(build_candidate, [(task, v, opts.check_odd_shape) for v in batch],
                                 opts.build_timeout)

    def run_built(self, task: Task, values: dict[str, object], built: Outcome) -> MeasureResult:
        """Check and time one configuration built by ``build`` (a build failure becomes its result)."""
        opts = self.options
        if not isinstance(built, Returned):
            status, error = _failure(built, "build_")
            return MeasureResult(status, [], error)
        art, feats, odd_art, build_s = built.value
        t0 = time.perf_counter()
        ran = self.runner.call(run_candidate, (task, values, art, odd_art, opts), opts.run_timeout)
        run_s = time.perf_counter() - t0
        if isinstance(ran, Returned):
            status, costs, error = ran.value
            return MeasureResult(status, costs, error, build_s, run_s, feats)
        status, error = _failure(ran, "")
        if status == "device_error":
            self.runner.restart()  # a CUDA error may leave the context unusable
        return MeasureResult(status, [], error, build_s, run_s, feats)

    def features(self, task: Task, batch: list[dict[str, object]]) -> list[np.ndarray | None]:
        """Iter features of configurations (lowered in the builder processes); None where lowering fails."""
        outs = self.builders.map(lower_features, [(task, v) for v in batch], self.options.build_timeout)
        return [o.value if isinstance(o, Returned) else None for o in outs]

    def close(self) -> None:
        self.builders.close()
        self.runner.close()

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
