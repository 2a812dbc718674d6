"""Measurement: candidates built in parallel worker processes, checked and timed in one long-lived
runner process per device.

Building (template → schedule → lowering → compilation) happens in ``MeasureOptions.builders``
processes; the iter features of the lowered IR come back with the kernel. Builds feed a measurement
queue (``submit``/``collect``): a runner takes each built candidate as soon as it is free, while the
builders go on with the next ones — on a CPU target the builders are stopped while a kernel is timed
(so compilers do not disturb the timings), unless ``MeasureOptions(runner_cores=n)`` keeps the runner
on n cores of its own and the builders on the others (``cpu_partition``); on a GPU they go on building
at the tuner's priority (the kernel is timed on the device). A runner owns its GPU
(``CUDA_VISIBLE_DEVICES``) and its CUDA context for the whole run:
fresh random inputs (seeded per configuration), one call checked against the operator's reference,
then timed (median of repeats, optional cache flush between runs), with the conditions of the timing
(clocks, power, versions: ``hygiene``). A crash (segfault, abort), a hang (deadline), a wrong result
or a device error costs that candidate one failed trial, with its reason; that runner alone is
replaced and tuning goes on. Outcomes that repeat are kept in the result cache (``result_cache``) and not measured
again. ``MeasureOptions(overlap=False)`` gives the batch-synchronous path (a whole batch built, then
run one by one).
"""

from __future__ import annotations

import functools
import os
import pickle
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from ..errors import DeviceError
from ..toolchain import quick_builds_set
from .features import itervar_features
from .hygiene import conditions, toolkit_version
from .result_cache import ResultCache
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
    ``overlap``: stream builds into the measurement queue (False: build a whole batch, then run it).
    ``runner_cores``: the runner kept on this many of this process's CPU cores (the last ones,
    ``cpu_partition``) with as many OpenMP threads (unless ``threads`` says otherwise), the builders on
    the others, so that a timed kernel's threads never share a core with a compiler; the caller keeps
    its own work off them with ``workers.pin_process(measurer.partition.others)``. 0: every process
    on every core.
    ``pause_builds``: stop the builders while a kernel is timed (None: on CPU targets whose runner
    shares the builders' cores, ``runner_cores=0``).
    ``result_cache``: reuse the outcome of a configuration measured before on this target with this
    toolkit and this polytile (``result_cache.ResultCache``).
    ``retime``: how many of the best configurations are timed again in a fresh process before the
    winner is declared; ``noise_band``: relative difference under which two re-timed configurations
    tie (the tie goes to the one whose decisions come first in the template's order).
    ``inputs_in_builders``: the builder of each candidate also draws its check's random inputs and
    computes the reference on them, and sends them with the kernel (at most ``SHIPPED_INPUTS_BYTES``;
    larger ones the runner draws), so that the runner only checks and times — on a GPU target one
    runner per GPU serves every builder. None (the default): on GPU targets; False: the runner draws
    them (as before). Not with ``same_inputs``, whose runner computes one reference for every
    candidate.
    ``quick_build``: builds take the shortcuts that give the same kernels (a precompiled header of
    the generated C++'s includes, no second legality check of an unchanged schedule state,
    legality checks that compare each dependence's pairs in the schedule space:
    ``toolchain.quick_builds``); False builds as before them; None (the default): as the environment
    says (``POLYTILE_QUICK_BUILD=0`` turns them off).
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
    runner_cores: int = 0
    same_inputs: bool = False
    before_run: Callable[[Task, dict[str, object]], None] | None = None
    overlap: bool = True
    pause_builds: bool | None = None
    result_cache: bool = True
    retime: int = 3
    noise_band: float = 0.02
    quick_build: bool | None = None
    inputs_in_builders: bool | None = None

    def __post_init__(self) -> None:
        at_least = {"builders": 0, "repeat": 1, "warmup": 0, "threads": 0, "runner_cores": 0, "min_time": 0.0,
                    "retime": 0, "noise_band": 0.0}
        for name, low in at_least.items():
            if not getattr(self, name) >= low:
                raise TuneError(f"MeasureOptions.{name} must be at least {low}, got {getattr(self, name)!r}")
        for name in ("build_timeout", "run_timeout"):
            if not getattr(self, name) > 0:
                raise TuneError(f"MeasureOptions.{name} must be a positive number of seconds, "
                                f"got {getattr(self, name)!r}")

    def builder_count(self) -> int:
        if self.builders:
            return self.builders
        if self.runner_cores:
            return max(1, len(cpu_partition(self.runner_cores).others))
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))

    def builders_draw_inputs(self, task: Task) -> bool:
        """Whether the builders of ``task``'s candidates draw their check's inputs and reference
        (``inputs_in_builders``)."""
        if not self.check or self.same_inputs:
            return False
        return task.target.kind == "cuda" if self.inputs_in_builders is None else self.inputs_in_builders

    @property
    def kernel_threads(self) -> int:
        """The OpenMP threads of a timed CPU kernel (0: OpenMP's default, every core it may use)."""
        return self.threads or self.runner_cores


@dataclass(frozen=True)
class CorePartition:
    """This process's CPU cores split between the runner that times kernels and everything else (the
    builders, the tuner)."""

    runner: frozenset[int]
    others: frozenset[int]


def cpu_partition(runner_cores: int) -> CorePartition:
    """The last ``runner_cores`` of the cores this process may run on for the runner, the rest for the
    others (``MeasureOptions.runner_cores``). TuneError when that leaves the others none."""
    mine = sorted(os.sched_getaffinity(0))
    if not 0 < runner_cores < len(mine):
        fix = f"give 1 to {len(mine) - 1}, or 0" if len(mine) > 1 else "give 0"
        raise TuneError(f"MeasureOptions.runner_cores={runner_cores} must leave the builders at least one of the "
                        f"{len(mine)} cores this process may use ({fix} to share them)")
    return CorePartition(frozenset(mine[-runner_cores:]), frozenset(mine[:-runner_cores]))


@dataclass
class MeasureResult:
    """One trial: ``status`` (one of ``STATUSES``), timings in seconds, the error text of a failure."""

    status: str
    costs: list[float] = field(default_factory=list)
    error: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    features: np.ndarray | None = None
    conditions: dict[str, object] = field(default_factory=dict)
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def cost(self) -> float:
        """The median time of a successful trial; inf for a failed one."""
        return float(np.median(self.costs)) if self.ok and self.costs else float("inf")


# --- kernels across processes -----------------------------------------------------------------------------


SHIPPED_INPUTS_BYTES = 64 << 20
"""The most bytes of check inputs and reference a builder sends with a kernel
(``MeasureOptions.inputs_in_builders``): the measurer holds those of every built candidate that waits
for a runner."""


@dataclass
class CheckData:
    """A trial's random inputs drawn with ``seed`` and the operator's reference result on them."""

    seed: int
    inputs: list[np.ndarray]
    reference: Any


@dataclass
class KernelArtifact:
    """What a runner needs to load a built kernel without lowering it again; ``check``: the check's
    inputs and reference when the builder drew them (``MeasureOptions.inputs_in_builders``)."""

    kind: str
    payload: Any
    check: CheckData | None = None


def pack_kernel(kern: Any, task: Task, values: dict[str, object]) -> KernelArtifact:
    """CPU kernels travel as their lowered IR, source and shared library (which goes into the build
    cache of a runner on another host); other kernels as themselves when they pickle, else as the
    configuration to build again."""
    from ..runtime.cpu import CPUKernel
    if isinstance(kern, CPUKernel):
        return KernelArtifact("cpu", (kern.func, kern.lowered, kern.source, kern.path.name, kern.path.read_bytes()))
    try:
        pickle.dumps(kern)
    except Exception:  # noqa: BLE001 - any pickling failure means: rebuild in the runner
        return KernelArtifact("rebuild", (task, values))
    return KernelArtifact("pickle", kern)


def load_kernel(art: KernelArtifact) -> Any:
    if art.kind == "cpu":
        from ..runtime.cpu import CPUKernel, cache_dir
        func, lowered, source, name, library = art.payload
        path = cache_dir() / name
        if not path.exists():  # built on another host: the build cache's file name is its content key
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(library)
            os.replace(tmp, path)
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


def build_candidate(task: Task, values: dict[str, object], odd: bool, quick: bool | None = None,
                    inputs: bool = False) -> tuple[KernelArtifact, np.ndarray, KernelArtifact | None, float]:
    """Build one configuration (in a builder process): its kernel, iter features and, when ``odd``,
    the kernel of the same configuration at odd sizes. ``quick``: ``MeasureOptions.quick_build``;
    ``inputs``: the kernel's artifact carries its check's inputs and reference
    (``MeasureOptions.inputs_in_builders``), drawn on a thread of the builder while the kernel is
    lowered and compiled (NumPy's generator, casts and BLAS release the GIL; the compiler is a process
    of its own): the same inputs and reference, sooner."""
    from ..build import build
    t0 = time.perf_counter()
    drawn = _drawing().submit(_check_data, _operator(task), trial_seed(values)) if inputs else None
    try:
        with quick_builds_set(quick):
            kern = build(task.schedule(values), task.target)
            feats = itervar_features(kern.lowered, getattr(task.target, "cores", 1))
            odd_art = None
            if odd:
                odd_task = Task(task.template, odd_workload(task), task.target)
                odd_art = pack_kernel(build(odd_task.schedule(values), task.target), odd_task, values)
        art = pack_kernel(kern, task, values)
        if drawn is not None:
            art.check = drawn.result()
    finally:
        if drawn is not None:
            drawn.cancel()  # a build that failed: its inputs are not drawn if they have not started
    return art, feats, odd_art, time.perf_counter() - t0


@functools.cache
def _drawing() -> ThreadPoolExecutor:
    """The builder's one thread that draws check inputs (started with its first candidate)."""
    return ThreadPoolExecutor(1, thread_name_prefix="pt-check-inputs")


def trial_seed(values: dict[str, object]) -> int:
    """The seed of a configuration's random inputs (each configuration draws its own)."""
    return zlib.crc32(repr(sorted(values.items())).encode())


def _check_data(op: Any, seed: int) -> CheckData | None:
    """The check's inputs and reference for ``seed``; None when they would exceed ``SHIPPED_INPUTS_BYTES``."""
    if _check_bytes(op) > SHIPPED_INPUTS_BYTES:
        return None
    inputs, ref = _reference(op, seed, None)
    return CheckData(seed, inputs, ref)


def _check_bytes(op: Any) -> float:
    """The bytes of an operator's inputs and of its reference results (8-byte elements at most: references
    compute in float64); inf when a size is not a constant."""
    total = 0.0
    for tensors, widest in ((op.func.inputs, 0), (op.func.outputs, 8)):
        for t in tensors:
            sizes = [d if isinstance(d, int) else getattr(d, "value", None) for d in t.shape]
            if not all(isinstance(n, int) for n in sizes):
                return float("inf")
            total += float(np.prod(sizes, dtype=np.float64)) * max(t.dtype.itemsize, widest)
    return total


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


def _check(kern: Any, op: Any, seed: int, keep: str | None = None, drawn: CheckData | None = None
           ) -> tuple[list[np.ndarray], str]:
    inputs, ref = (drawn.inputs, drawn.reference) if drawn is not None else _reference(op, seed, keep)
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
                  opts: MeasureOptions) -> tuple[str, list[float], str, dict[str, object]]:
    """Check and time one built kernel (in the runner process): (status, costs, error, the conditions
    of the timing)."""
    if opts.before_run is not None:
        opts.before_run(task, values)
    key = task.workload.key
    op = _operator(task)
    seed = 0 if opts.same_inputs else trial_seed(values)
    kern = load_kernel(art)
    if odd_art is not None:
        _, err = _check(load_kernel(odd_art), odd_workload(task).instantiate(), seed)
        if err:
            return "wrong_result", [], f"at odd sizes: {err}", {}
    t0 = time.perf_counter()
    if opts.check:
        drawn = art.check if art.check is not None and art.check.seed == seed else None
        inputs, err = _check(kern, op, seed, keep=key if opts.same_inputs else None, drawn=drawn)
        if err:
            return "wrong_result", [], err, {}
    else:
        inputs = op.make_inputs(np.random.default_rng(seed))
        kern(*inputs)
    first = time.perf_counter() - t0
    budget = max(opts.min_time, 0.3 * opts.run_timeout)
    repeat = int(max(3, min(opts.repeat, budget / max(first, 1e-9))))
    extra = {"flush_cache": True} if opts.flush_cache else {}
    costs = [kern.benchmark(*inputs, repeat=repeat, warmup=opts.warmup if first < 0.5 else 0,
                            min_time=min(opts.min_time, budget), **extra)]
    return "ok", costs, "", conditions(task.target)


def prepare_runner(task: Task) -> None:
    """Get a runner ready for ``task`` while the first candidates build (the streaming measurer sends it
    first): the runtime imported, the GPU's context created, the operator instantiated and the
    toolkit's version read — the first trial's run would otherwise pay for them after its build."""
    from ..ops import rel_error  # noqa: F401 - what checking and timing a kernel imports
    if task.target.kind == "cuda":
        from ..runtime import cuda  # noqa: F401
        from ..runtime.cuda_device import device
        device()
    else:
        from ..runtime import cpu  # noqa: F401
    _operator(task)
    toolkit_version(task.target.kind)


def _operator(task: Task) -> Any:
    """The operator of ``task``'s workload, instantiated once per runner (the last workload's only)."""
    key = task.workload.key
    if key not in _OPS:
        _OPS.clear()
        _OPS[key] = task.workload.instantiate()
    return _OPS[key]


# --- the measurer ------------------------------------------------------------------------------------


def _failure(outcome: Outcome, stage: str) -> tuple[str, str]:
    if isinstance(outcome, TimedOut):
        return f"{stage}timeout", f"no result within {outcome.seconds:g} s"
    if isinstance(outcome, Crashed):
        what = outcome.signal or f"exit code {outcome.exitcode}"
        who = "builder" if stage else "runner"
        return ("build_crash" if stage else "crash"), f"the {who} process died ({what})"
    assert isinstance(outcome, Raised)
    if outcome.is_a(InvalidConfig.__name__):
        return "invalid", outcome.message
    if outcome.is_a(DeviceError.__name__):  # CudaError too: the driver's errors are DeviceErrors
        return "device_error", outcome.message
    if stage:
        return "build_error", f"{outcome.kind}: {outcome.message}"
    return "runtime_error", f"{outcome.kind}: {outcome.message}"


def device_environment(ordinal: int | None) -> dict[str, str]:
    """The environment that gives a runner GPU ``ordinal`` of this process (an index into this process's
    ``CUDA_VISIBLE_DEVICES`` when set) as its only device; nothing for None (the default GPU)."""
    if ordinal is None:
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if not 0 <= ordinal < len(ids):
            raise TuneError(f"device {ordinal} is not one of the {len(ids)} GPU(s) that CUDA_VISIBLE_DEVICES="
                            f"{visible} leaves visible; give devices between 0 and {len(ids) - 1}")
        return {"CUDA_VISIBLE_DEVICES": ids[ordinal]}
    return {"CUDA_VISIBLE_DEVICES": str(ordinal)}


def cache_options(opts: MeasureOptions) -> dict[str, object]:
    """The measurement options that change a trial's outcome (part of its result-cache key)."""
    hook = opts.before_run
    return {"check": opts.check, "odd": opts.check_odd_shape, "threads": opts.kernel_threads,
            "flush": opts.flush_cache, "same_inputs": opts.same_inputs,
            "hook": None if hook is None else f"{hook.__module__}.{hook.__qualname__}"}


@dataclass
class _Trial:
    task: Task
    values: dict[str, object]
    cache_key: str | None
    built: Outcome | None = None
    runner: int = -1


def measure_streamed(measurer: Any, task: Task, batch: list[dict[str, object]],
                     on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
    """A batch measured through a streaming measurer's ``submit`` and ``collect``, results in order
    (trials the caller streamed meanwhile stay for its next ``collect``)."""
    results: list[MeasureResult | None] = [None] * len(batch)
    ids = {measurer.submit(task, v): k for k, v in enumerate(batch)}
    left = len(batch)
    others: list[tuple[int, MeasureResult]] = []
    while left:
        for trial, res in measurer.collect():
            if trial not in ids:
                others.append((trial, res))
                continue
            results[ids[trial]] = res
            left -= 1
            if on_result is not None:
                on_result(ids[trial], res)
    measurer._done[:0] = others
    return results  # type: ignore[return-value]


class Measurer:
    """Builds and runs configurations of tasks; owns the builder pool and one runner per device.

    ``devices``: the GPUs to measure on (ordinals; None: the default GPU, or the CPU). Two ways to use
    it: ``measure(task, batch)`` measures a batch and returns its results in order; ``submit`` and
    ``collect`` stream trials (a tuner keeps the builders busy and hears each result as it comes).
    """

    def __init__(self, options: MeasureOptions | None = None, devices: Sequence[int] | None = None):
        self.options = options or MeasureOptions()
        threads = self.options.kernel_threads
        # NumPy's BLAS computes references single-threaded: its idle threads spin after each call
        # and would steal the cores from the kernel timed next
        blas = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # builders too (references, many at once)
        env = dict(blas)
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        self.partition = cpu_partition(self.options.runner_cores) if self.options.runner_cores else None
        runner_cores, builder_cores = (self.partition.runner, self.partition.others) if self.partition else (None, None)
        self.devices: list[int | None] = list(devices) if devices else [None]
        self.builders = WorkerPool(self.options.builder_count(), {**blas, "OMP_NUM_THREADS": "1"}, cores=builder_cores)
        self.runners = [WorkerPool(1, {**env, **device_environment(d)}, cores=runner_cores) for d in self.devices]
        self.cache = ResultCache() if self.options.result_cache else None
        self._trials: dict[int, _Trial] = {}
        self._builds: dict[int, int] = {}  # builder ticket -> trial
        self._lowered: dict[int, Outcome] = {}  # builder ticket -> outcome of a features call
        self._queue: deque[int] = deque()  # built trials waiting for a runner
        self._runs: dict[tuple[int, int], tuple[int, float]] = {}  # (runner, ticket) -> (trial, start)
        self._done: list[tuple[int, MeasureResult]] = []
        self._next = 0
        self._prepared: set[str] = set()  # workloads whose runners were sent ``prepare_runner``

    @property
    def runner(self) -> WorkerPool:
        """The runner of the first device."""
        return self.runners[0]

    # --- streaming -------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Trials submitted and not yet collected."""
        return len(self._trials)

    @property
    def unbuilt(self) -> int:
        """Trials submitted and not yet built: fewer than ``build_slots`` leaves a builder idle."""
        return len(self._builds)

    @property
    def build_slots(self) -> int:
        return self.builders.size

    def submit(self, task: Task, values: dict[str, object]) -> int:
        """Queue one configuration for building and measuring; its id comes back from ``collect``."""
        self._next += 1
        trial = self._next
        key = None
        if self.cache is not None:
            key = ResultCache.key(task.key, task.target.key, toolkit_version(task.target.kind), values,
                                  cache_options(self.options))
            found = self.cache.get(key)
            if found is not None:
                self._done.append((trial, MeasureResult(found["status"], found["costs"], found["error"],
                                                        conditions=found.get("conditions", {}), cached=True)))
                return trial
        self._trials[trial] = _Trial(task, values, key)
        if task.workload.key not in self._prepared:  # the runners start while the first builds run
            self._prepared.add(task.workload.key)
            for runner in self.runners:
                runner.submit(prepare_runner, (task,), self.options.run_timeout)
        opts = self.options
        ticket = self.builders.submit(build_candidate, (task, values, opts.check_odd_shape, opts.quick_build,
                                                        opts.builders_draw_inputs(task)), opts.build_timeout)
        self._builds[ticket] = trial
        return trial

    def collect(self, timeout: float | None = None) -> list[tuple[int, MeasureResult]]:
        """Results of submitted trials that finished, as (id, result); waits up to ``timeout`` seconds
        (None: until at least one finishes) when none has."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done and self._trials:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._pump(left)
        done, self._done = self._done, []
        return done

    def _pump(self, timeout: float | None) -> None:
        """Wait for the first event of any pool (a build or a run done, a deadline) and handle it."""
        pools = [self.builders, *self.runners]
        handles = [c for p in pools for c in p.connections()]
        until = min(p.next_deadline() for p in pools) - time.monotonic()
        wait_s = max(0.0, until) if timeout is None else max(0.0, min(until, timeout))
        if handles:
            wait(handles, timeout=None if wait_s == float("inf") else wait_s)
        for ticket, outcome in self.builders.poll(0):
            if ticket in self._lowered:
                self._lowered[ticket] = outcome
            elif ticket in self._builds:
                trial = self._builds.pop(ticket)
                self._trials[trial].built = outcome
                self._queue.append(trial)
        for k, runner in enumerate(self.runners):
            for ticket, outcome in runner.poll(0):
                found = self._runs.pop((k, ticket), None)
                if found is None:
                    continue  # a ``prepare_runner``: a failure there shows again in the first trial's run
                trial, start = found
                self._finish_run(trial, outcome, time.perf_counter() - start)
        self._start_runs()

    def _pausing(self, task: Task) -> bool:
        pause = self.options.pause_builds
        return task.target.kind != "cuda" and self.partition is None if pause is None else pause

    def _start_runs(self) -> None:
        while self._queue:
            busy = {k for k, _ in self._runs}
            free = next((k for k in range(len(self.runners)) if k not in busy), None)
            if free is None:
                return
            trial = self._queue.popleft()
            t = self._trials[trial]
            if not isinstance(t.built, Returned):
                status, error = _failure(t.built, "build_")  # type: ignore[arg-type]
                self._finish(trial, MeasureResult(status, [], error))
                continue
            art, _feats, odd_art, _build_s = t.built.value
            if self._pausing(t.task):
                self.builders.pause()
            t.runner = free
            ticket = self.runners[free].submit(run_candidate, (t.task, t.values, art, odd_art, self.options),
                                               self.options.run_timeout)
            self._runs[free, ticket] = (trial, time.perf_counter())
        if not self._runs:
            self.builders.resume()

    def _finish_run(self, trial: int, ran: Outcome, run_s: float) -> None:
        t = self._trials[trial]
        _art, feats, _odd, build_s = t.built.value  # type: ignore[union-attr]
        self._finish(trial, self._result(ran, build_s, run_s, feats, self.runners[t.runner]))

    def _result(self, ran: Outcome, build_s: float, run_s: float, feats: np.ndarray | None,
                runner: WorkerPool) -> MeasureResult:
        if isinstance(ran, Returned):
            status, costs, error, cond = ran.value
            return MeasureResult(status, costs, error, build_s, run_s, feats, cond)
        status, error = _failure(ran, "")
        if status == "device_error":
            runner.restart()  # a CUDA error may leave the context unusable
        return MeasureResult(status, [], error, build_s, run_s, feats)

    def _finish(self, trial: int, res: MeasureResult) -> None:
        t = self._trials.pop(trial)
        if self.cache is not None and t.cache_key is not None:
            self.cache.put(t.cache_key, {"status": res.status, "costs": res.costs, "error": res.error,
                                         "conditions": res.conditions})
        self._done.append((trial, res))

    # --- batches ---------------------------------------------------------------------------------

    def measure(self, task: Task, batch: list[dict[str, object]],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Measure every configuration of ``batch``; results in its order (``on_result(k, result)``
        hears each as it comes). With ``overlap=False``: build them all in parallel, then run each in turn."""
        results: list[MeasureResult | None] = [None] * len(batch)
        if not self.options.overlap:
            builds = self.build(task, batch)
            for k, (values, built) in enumerate(zip(batch, builds, strict=False)):
                results[k] = self.run_built(task, values, built)
                if on_result is not None:
                    on_result(k, results[k])  # type: ignore[arg-type]
            return results  # type: ignore[return-value]
        return measure_streamed(self, task, batch, on_result)

    def build(self, task: Task, batch: list[dict[str, object]]) -> list[Outcome]:
        """Build every configuration of ``batch`` in parallel without running them: each outcome's
        value (when it returned) goes to ``run_built`` later, possibly on another machine (it pickles)."""
        opts = self.options
        inputs = opts.builders_draw_inputs(task)
        return self.builders.map(build_candidate, [(task, v, opts.check_odd_shape, opts.quick_build, inputs)
                                                   for v in batch], opts.build_timeout)

    def run_built(self, task: Task, values: dict[str, object], built: Outcome, device: int = 0) -> MeasureResult:
        """Check and time one configuration built by ``build`` (a build failure becomes its result) on
        the runner of ``devices[device]``."""
        opts = self.options
        if not isinstance(built, Returned):
            status, error = _failure(built, "build_")
            return MeasureResult(status, [], error)
        art, feats, odd_art, build_s = built.value
        t0 = time.perf_counter()
        runner = self.runners[device]
        ran = runner.call(run_candidate, (task, values, art, odd_art, opts), opts.run_timeout)
        return self._result(ran, build_s, time.perf_counter() - t0, feats, runner)

    def features(self, task: Task, batch: list[dict[str, object]]) -> list[np.ndarray | None]:
        """Iter features of configurations (lowered in the builder processes); None where lowering fails."""
        tickets = [self.builders.submit(lower_features, (task, v), self.options.build_timeout) for v in batch]
        self._lowered.update({t: None for t in tickets})  # type: ignore[misc]
        while any(self._lowered[t] is None for t in tickets):
            self._pump(None)  # streamed runs go on meanwhile (and resume the builders they stopped)
        outs = [self._lowered.pop(t) for t in tickets]
        return [o.value if isinstance(o, Returned) else None for o in outs]

    def close(self) -> None:
        self.builders.close()
        for runner in self.runners:
            runner.close()
        self._trials.clear()
        self._builds.clear()
        self._queue.clear()
        self._runs.clear()

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
