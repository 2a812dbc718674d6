"""Tuning on a Dask distributed cluster: candidates built on the workers that can build them,
measured on the workers whose device is the target's, results streamed back to the tuner (which
alone writes the records file).

Every worker is tagged, when it joins, with Dask resources named after what it has (a plugin that
asks a fresh process of the worker's host): ``polytile-build:cuda`` (nvcc found) and
``polytile-build:<CPU target key>`` with one unit per worker thread; ``polytile-measure:<CPU target
key>`` (one unit) and ``polytile-measure:<GPU target key>`` (one unit per GPU of that model). A
trial is two Dask tasks: a build that asks for the build tag of its target (any host with nvcc for a
GPU; a host of the target's CPU model for a CPU, since CPU kernels are built for the host's
instruction set), and a measurement that asks for the measure tag of its target, so it runs only on
a worker with that device, one at a time per device. Inside a worker, builds and measurements run in
worker processes of their own (``workers.WorkerPool``: a crashing or hanging candidate costs one
trial, never the Dask worker), each GPU measured by one long-lived runner that owns its context.
When a Dask worker dies mid-trial, Dask runs the trial's tasks again elsewhere: the trial is
measured once and recorded once. On a CPU target, a worker's measurements share the host with the
builds of other workers there: give CPU hosts one measuring worker each, or expect noisier times.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from distributed import WorkerPlugin

from .hygiene import toolkit_version
from .measure import (
    MeasureOptions,
    MeasureResult,
    _failure,
    build_candidate,
    cache_options,
    device_environment,
    lower_features,
    measure_streamed,
    run_candidate,
)
from .result_cache import ResultCache
from .space import TuneError
from .task import Task
from .workers import Returned, WorkerPool

BUILD = "polytile-build:"
MEASURE = "polytile-measure:"
LOCAL_HTTP = "127.0.0.1:0"  # a LocalCluster's scheduler HTTP server (and dashboard): any free local port
CONNECT_TIMEOUT = 30.0  # seconds to reach the scheduler, and for a worker with the tags a trial needs


def build_tag(task: Task) -> str:
    return BUILD + ("cuda" if task.target.kind == "cuda" else task.target.key)


def measure_tag(task: Task) -> str:
    return MEASURE + task.target.key


# --- on the workers ------------------------------------------------------------------------------------


def host_devices() -> dict[str, object]:
    """What this host can build and measure (run in a fresh process): its CPU target key, whether
    nvcc is here, and the target of each GPU by ordinal (``gpus``: their keys; ``targets``: the
    ``CUDATarget`` objects, facts as the driver reports them)."""
    from ..runtime.cuda_device import device_target
    from ..target import cpu_target
    from ..toolchain import find_nvcc
    targets = []
    try:
        from ..runtime.cuda_driver import Device, load_driver
        cu = load_driver()
        cu.cuInit(0)
        err, count = cu.cuDeviceGetCount()
        targets = [device_target(Device(k, cu)) for k in range(int(count) if int(err) == 0 else 0)]
    except Exception:  # noqa: BLE001 - no driver, no bindings, no GPU: a CPU host
        targets = []
    return {"cpu": cpu_target().key, "nvcc": find_nvcc() is not None, "gpus": [t.key for t in targets],
            "targets": targets, "toolkits": {kind: toolkit_version(kind) for kind in ("cpu", "cuda")}}


def worker_resources(found: dict[str, Any], threads: int) -> dict[str, float]:
    """The Dask resources of a worker with ``threads`` threads on a host described by ``host_devices``."""
    out: dict[str, float] = {BUILD + found["cpu"]: threads, MEASURE + found["cpu"]: 1}
    if found["nvcc"]:
        out[BUILD + "cuda"] = threads
    for key in found["gpus"]:
        out[MEASURE + key] = out.get(MEASURE + key, 0) + 1
    return out


class _Local:
    """A Dask worker's own processes: one builder per thread, one runner per device of each target."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.builders: list[WorkerPool] = []
        self.runners: dict[str, list[tuple[WorkerPool, bool]]] = {}  # measure tag -> (runner, busy)
        self.gpus: list[str] | None = None  # target keys of this host's GPUs, by ordinal
        self.targets: list[Any] = []
        self.toolkits: dict[str, str] = {}
        self.found: dict[str, Any] | None = None  # host_devices() of this host, once probed

    def builder(self) -> WorkerPool:
        with self.lock:
            if not self.builders:
                return WorkerPool(1, {"OMP_NUM_THREADS": "1"})
            return self.builders.pop()

    def give_back(self, pool: WorkerPool) -> None:
        with self.lock:
            self.builders.append(pool)

    def ordinals(self, task: Task) -> list[int | None]:
        """The GPUs of this host of ``task``'s model (None: the CPU)."""
        if task.target.kind != "cuda":
            return [None]
        if self.gpus is None:
            found = _probe()
            self.gpus = found["gpus"] if found is not None else []
        return [k for k, key in enumerate(self.gpus) if key == task.target.key]

    def runner(self, task: Task, opts: MeasureOptions) -> tuple[int, WorkerPool]:
        """A free runner for ``task``'s device, reserved until ``release`` (Dask's resources let no more
        measurements in than there are devices)."""
        tag = measure_tag(task)
        with self.lock:
            if tag not in self.runners:
                env = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
                if opts.threads:
                    env["OMP_NUM_THREADS"] = str(opts.threads)
                self.runners[tag] = [(WorkerPool(1, {**env, **device_environment(d)}), False)
                                     for d in self.ordinals(task)]
            for k, (pool, busy) in enumerate(self.runners[tag]):
                if not busy:
                    self.runners[tag][k] = (pool, True)
                    return k, pool
        raise TuneError(f"no free {task.target.key} on this worker: its resources allow more measurements than "
                        "it has devices")

    def release(self, task: Task, k: int) -> None:
        with self.lock:
            pool, _ = self.runners[measure_tag(task)][k]
            self.runners[measure_tag(task)][k] = (pool, False)


_LOCAL = _Local()


def build_on_worker(task: Task, values: dict[str, object], odd: bool, timeout: float, quick: bool | None = None) -> Any:
    """A Dask task: build one configuration in a builder process of this worker; the outcome."""
    pool = _LOCAL.builder()
    try:
        return pool.call(build_candidate, (task, values, odd, quick), timeout)
    finally:
        _LOCAL.give_back(pool)


def measure_on_worker(task: Task, values: dict[str, object], built: Any, opts: MeasureOptions) -> MeasureResult:
    """A Dask task: check and time a built configuration on this worker's runner of the target's device."""
    if not isinstance(built, Returned):
        status, error = _failure(built, "build_")
        return MeasureResult(status, [], error)
    art, feats, odd_art, build_s = built.value
    k, runner = _LOCAL.runner(task, opts)
    try:
        t0 = time.perf_counter()
        ran = runner.call(run_candidate, (task, values, art, odd_art, opts), opts.run_timeout)
        run_s = time.perf_counter() - t0
        if isinstance(ran, Returned):
            status, costs, error, cond = ran.value
            return MeasureResult(status, costs, error, build_s, run_s, feats, cond)
        status, error = _failure(ran, "")
        if status == "device_error":
            runner.restart()  # a CUDA error may leave the context unusable
        return MeasureResult(status, [], error, build_s, run_s, feats)
    finally:
        _LOCAL.release(task, k)


def retime_on_worker(task: Task, configs: list[dict[str, object]], opts: MeasureOptions, check_odd: bool,
                     rounds: int) -> list[tuple[bool, float, str]]:
    """A Dask task: ``api.retime`` on a GPU of the target's model of this worker (reserved meanwhile),
    in fresh processes."""
    from .api import retime
    k, _ = _LOCAL.runner(task, opts)
    try:
        device = _LOCAL.ordinals(task)[k]
        return retime(task, configs, opts, check_odd, None if device is None else [device], rounds)
    finally:
        _LOCAL.release(task, k)


def _lower_on_worker(task: Task, values: dict[str, object], timeout: float) -> np.ndarray | None:
    pool = _LOCAL.builder()
    try:
        out = pool.call(lower_features, (task, values), timeout)
    finally:
        _LOCAL.give_back(pool)
    return out.value if isinstance(out, Returned) else None


def _probe() -> dict[str, Any] | None:
    """``host_devices`` in a fresh process (a Dask worker never holds a CUDA context itself)."""
    probe = WorkerPool(1)
    try:
        found = probe.call(host_devices, (), 300.0)
    finally:
        probe.close()
    return found.value if isinstance(found, Returned) else None


class DeviceTags(WorkerPlugin):
    """Tags every worker, present and future (a restarted one too), with the resources of its devices."""

    name = "polytile-device-tags"

    async def setup(self, worker: Any) -> None:
        # every tuner that connects registers the plugin again: a worker probes its host once (a
        # restarted worker is a new process, and probes again)
        found = _LOCAL.found or await asyncio.to_thread(_probe)
        if found is not None:
            _LOCAL.found = found
            _LOCAL.gpus = found["gpus"]
            _LOCAL.targets = found["targets"]
            _LOCAL.toolkits = found["toolkits"]
            await worker.set_resources(**worker_resources(found, worker.state.nthreads))


def _gpu_targets_here(dask_worker: Any = None) -> list[Any]:
    """The GPU targets of the worker this runs on (``Client.run``), as its tags were made."""
    return list(_LOCAL.targets)


def _toolkits_here(dask_worker: Any = None) -> dict[str, str]:
    return dict(_LOCAL.toolkits)


# --- the tuner's side ----------------------------------------------------------------------------------


def gpu_targets(client: Any) -> dict[str, Any]:
    """The ``CUDATarget`` of every GPU model of a Dask cluster's workers, by target key (each as the
    driver of its host reports it): pass one as ``target=`` to tune for it."""
    found: dict[str, Any] = {}
    for targets in client.run(_gpu_targets_here).values():
        found.update({t.key: t for t in targets})
    return found


def connect(cluster: object) -> tuple[Any, Any]:
    """A ``distributed.Client`` for ``cluster`` (an address, a Client, a cluster object, or "local" for a
    ``LocalCluster`` of one single-threaded worker per core on 127.0.0.1), and the cluster this call
    started (to close with the client), if any."""
    from distributed import Client, LocalCluster
    if isinstance(cluster, Client):
        return cluster, None
    started = None
    if cluster == "local":
        # the scheduler's HTTP server starts even without a dashboard, on port 8787 unless told: a port
        # the system chooses, so that two tuners on one machine do not clash
        started = LocalCluster(n_workers=MeasureOptions().builder_count(), threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address=LOCAL_HTTP)
        cluster = started
    if not isinstance(cluster, str) and not hasattr(cluster, "scheduler_address"):
        raise TuneError(f"cluster must be a Dask scheduler address such as 'tcp://host:8786', 'local', a "
                        f"distributed.Client or a cluster object, got {type(cluster).__name__}")
    try:
        return Client(cluster, timeout=CONNECT_TIMEOUT), started
    except (OSError, TimeoutError) as err:
        if started is not None:
            started.close()
        raise TuneError(f"cannot reach the Dask scheduler at {cluster} ({err}); start it with `dask scheduler` "
                        "and its workers with `dask worker <address>`, or pass cluster='local'") from None


class ClusterMeasurer:
    """``Measurer``'s streaming interface (``submit``, ``collect``, ``measure``, ``features``) on a Dask
    cluster."""

    def __init__(self, options: MeasureOptions | None, cluster: object):
        self.options = options or MeasureOptions()
        self.client, self._started = connect(cluster)
        self.client.register_plugin(DeviceTags(), name=DeviceTags.name)  # waits for every worker's tags
        self.cache = ResultCache() if self.options.result_cache else None
        self._builds: dict[int, Any] = {}  # trial -> build future
        self._runs: dict[Any, tuple[int, str | None]] = {}  # measure future -> (trial, cache key)
        self._done: list[tuple[int, MeasureResult]] = []
        self._next = 0
        self._tags_seen: set[str] = set()
        self._slots = (1, -float("inf"))  # (worker threads, when asked)
        self._toolkits: dict[str, str] = {}

    @property
    def in_flight(self) -> int:
        return len(self._runs)

    @property
    def unbuilt(self) -> int:
        for trial in [t for t, f in self._builds.items() if f.done()]:
            del self._builds[trial]
        return len(self._builds)

    @property
    def build_slots(self) -> int:
        """The cluster's worker threads (asked of the scheduler at most every few seconds)."""
        now = time.monotonic()
        if now - self._slots[1] > 5.0:
            self._slots = (max(1, sum(self.client.nthreads().values())), now)
        return self._slots[0]

    def _toolkit(self, kind: str) -> str:
        """The compilers of the cluster's workers for targets of ``kind`` (part of the result-cache key:
        the workers build, not this host)."""
        if kind not in self._toolkits:
            found = {t.get(kind, "") for t in self.client.run(_toolkits_here).values()}
            self._toolkits[kind] = " | ".join(sorted(found))
        return self._toolkits[kind]

    def _wait_for_tag(self, tag: str, what: str) -> None:
        """Wait until some worker holds resource ``tag``; TuneError naming what the cluster has when none
        does after a while (the tuner would otherwise wait forever)."""
        if tag in self._tags_seen:
            return
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while True:
            held = {r for w in self.client.scheduler_info(n_workers=-1)["workers"].values()
                    for r in w.get("resources", {})}
            if tag in held:
                self._tags_seen.add(tag)
                return
            if time.monotonic() > deadline:
                have = sorted(r for r in held if r.startswith((BUILD, MEASURE))) or ["no polytile tags yet"]
                raise TuneError(f"no worker of the Dask cluster can {what} ({tag}); its workers have: "
                                f"{', '.join(have)}")
            time.sleep(0.2)

    def submit(self, task: Task, values: dict[str, object]) -> int:
        self._next += 1
        trial = self._next
        key = None
        if self.cache is not None:
            key = ResultCache.key(task.key, task.target.key, self._toolkit(task.target.kind), values,
                                  cache_options(self.options))
            found = self.cache.get(key)
            if found is not None:
                self._done.append((trial, MeasureResult(found["status"], found["costs"], found["error"],
                                                        conditions=found.get("conditions", {}), cached=True)))
                return trial
        self._wait_for_tag(build_tag(task), f"build for {task.target.key}")
        self._wait_for_tag(measure_tag(task), f"measure on {task.target.key}")
        name = uuid.uuid4().hex[:12]
        opts = self.options
        build = self.client.submit(build_on_worker, task, values, opts.check_odd_shape, opts.build_timeout,
                                   opts.quick_build, resources={build_tag(task): 1}, key=f"polytile-build-{name}",
                                   pure=False)
        run = self.client.submit(measure_on_worker, task, values, build, opts, resources={measure_tag(task): 1},
                                 key=f"polytile-measure-{name}", pure=False)
        self._builds[trial] = build
        self._runs[run] = (trial, key)
        return trial

    def resolve(self, task: Task) -> Task:
        """``task`` on the cluster's GPU model when its target names none the workers have: a tuner on a
        host without that GPU (whose "cuda" target is a datasheet's) tunes for the GPU workers' model of
        the same architecture; TuneError when there are several (pass one as ``target=``)."""
        if task.target.kind != "cuda":
            return task
        found = gpu_targets(self.client)
        if task.target.key in found or not found:
            return task
        same_arch = [t for t in found.values() if t.arch == task.target.arch]
        if len(same_arch) != 1:
            raise TuneError(f"the Dask cluster's GPU workers have {', '.join(sorted(found))}, and {task.target.key} "
                            "is none of them; pass target= one of their CUDATargets "
                            "(polytile.tune.cluster.gpu_targets(client))")
        return Task(task.template, task.workload, same_arch[0])

    def retime(self, task: Task, configs: list[dict[str, object]], opts: MeasureOptions, check_odd: bool,
               rounds: int) -> list[tuple[bool, float, str]]:
        """``api.retime`` on a worker with the target's device."""
        fut = self.client.submit(retime_on_worker, task, configs, opts, check_odd, rounds,
                                 resources={measure_tag(task): 1}, pure=False)
        return fut.result()

    def collect(self, timeout: float | None = None) -> list[tuple[int, MeasureResult]]:
        from distributed import wait
        if not self._done and self._runs:
            try:
                wait(list(self._runs), timeout=timeout, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
        for fut in [f for f in self._runs if f.done()]:
            trial, key = self._runs.pop(fut)
            self._builds.pop(trial, None)
            try:
                res = fut.result()
            except Exception as err:  # noqa: BLE001 - e.g. KilledWorker: the task killed several workers
                res = MeasureResult("crash", [], f"the Dask task failed: {type(err).__name__}: {err}")
            if self.cache is not None and key is not None:
                self.cache.put(key, {"status": res.status, "costs": res.costs, "error": res.error,
                                     "conditions": res.conditions})
            self._done.append((trial, res))
        done, self._done = self._done, []
        return done

    def measure(self, task: Task, batch: list[dict[str, object]],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        return measure_streamed(self, task, batch, on_result)

    def features(self, task: Task, batch: Sequence[dict[str, object]]) -> list[np.ndarray | None]:
        self._wait_for_tag(build_tag(task), f"build for {task.target.key}")
        futures = [self.client.submit(_lower_on_worker, task, v, self.options.build_timeout,
                                      resources={build_tag(task): 1}, pure=False) for v in batch]
        return self.client.gather(futures)

    def close(self) -> None:
        for fut in [*self._runs, *self._builds.values()]:
            fut.cancel()
        self._runs.clear()
        self._builds.clear()
        self.client.close()
        if self._started is not None:
            self._started.close()

    def __enter__(self) -> ClusterMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
