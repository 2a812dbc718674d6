"""`optimize`: search a faster SASS schedule for a kernel, verify it, and report what paid off.

Steps: describe the kernel as a CubinLaunch (given, read off a polytile CUDA function built with
`pt.build(..., "cuda")`, or compiled from a `@triton.jit` function); disassemble and analyse it;
spend `budget` GPU measurements with the chosen search method (each measured variant is first
screened against the original's outputs); then verify the `candidates` fastest on several fresh
random inputs, re-time each verified one against the original in interleaved rounds, pick the best,
confirm it in fresh interleaved rounds (the ones that picked it would flatter it), and return it. A
candidate that fails verification is never returned; if none passes or none is faster in the
confirmation, the original kernel comes back with speedup 1.0. A polytile function also comes back
as a function (`OptimizedKernel.kernel`), callable like the original.
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass, field

from polytile import is_gpu_function, with_cubin
from polytile.sass.agent import search
from polytile.sass.analysis import KernelAnalysis
from polytile.sass.cubin import Cubin
from polytile.sass.disasm import disassemble
from polytile.sass.game import MeasurementFailed
from polytile.sass.launch import CubinLaunch
from polytile.sass.runner import Runner, RunnerSettings
from polytile.sass.schedule import Schedule

_POLYTILE_OPTIONS = ("kernel_name", "name", "params")  # what polytile_launch takes besides the kernel


@dataclass
class OptimizationReport:
    kernel: str
    method: str
    device: dict
    budget: int
    measurements: int
    failures: int
    baseline_ms: float
    optimized_ms: float
    speedup: float  # confirmed in interleaved timings against the original
    verified: bool
    moves: list[str] = field(default_factory=list)  # the best schedule's moves, with timings
    rejected: list[str] = field(default_factory=list)  # candidates that failed verification
    notes: list[str] = field(default_factory=list)

    def format(self) -> str:
        lines = [
            f"kernel {self.kernel} on {self.device.get('device', '?')}: {self.method}, "
            f"{self.measurements}/{self.budget} measurements, {self.failures} failed variants",
            f"  compiler schedule {self.baseline_ms * 1e3:.2f} us -> {self.optimized_ms * 1e3:.2f} us "
            f"(speedup {self.speedup:.3f}, {'verified' if self.verified else 'original kept'})",
        ]
        lines += [f"  move: {m}" for m in self.moves]
        lines += [f"  rejected: {r}" for r in self.rejected]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass
class OptimizedKernel:
    launch: CubinLaunch  # the launch with the optimized cubin
    schedule: Schedule
    report: OptimizationReport
    kernel: object | None = None  # for a polytile function: the same function with the optimized cubin

    @property
    def cubin(self) -> bytes:
        return self.launch.cubin


class GpuMeasurer:
    """Measurer for the assembly game: patch the cubin, time it in the worker (after a screen)."""

    def __init__(self, runner: Runner, cubin: Cubin, kernel: str) -> None:
        self.runner, self.cubin, self.kernel = runner, cubin, kernel

    def cubin_of(self, schedule: Schedule) -> bytes:
        return self.cubin.with_words(self.kernel, schedule.words())

    def measure(self, schedule: Schedule) -> float:
        return self.runner.time(self.cubin_of(schedule))


def analyse(launch: CubinLaunch, latency_overrides: dict[str, int] | None = None) -> KernelAnalysis:
    cubin = Cubin(launch.cubin, source=f"cubin of {launch.label}")
    instructions = disassemble(cubin)[launch.kernel]
    return KernelAnalysis(cubin.kernel(launch.kernel), instructions, latency_overrides)


def _as_launch(kernel, example_inputs, options: dict) -> CubinLaunch:
    """The CubinLaunch of `kernel` (a CubinLaunch, a polytile GPU function or a `@triton.jit` function)."""
    if isinstance(kernel, CubinLaunch):
        if example_inputs is not None:
            raise TypeError(
                f"{kernel.label}: a CubinLaunch describes its inputs in `args` (Buffer.init); "
                "pass example_inputs=None"
            )
        if options:
            raise TypeError(f"options {sorted(options)} apply to polytile or Triton kernels, not a CubinLaunch")
        return kernel
    if is_gpu_function(kernel):
        from polytile.sass.polytile_kernel import polytile_launch

        name = kernel.func.name
        if example_inputs is None:
            inputs = ", ".join(t.name for t in kernel.func.inputs)
            raise TypeError(
                f"optimizing polytile function {name} needs example_inputs: its input arrays ({inputs}) "
                "as numpy arrays or torch tensors, e.g. optimize(kern, [x], budget=...)"
            )
        unknown = sorted(set(options) - set(_POLYTILE_OPTIONS))
        if unknown:
            raise TypeError(
                f"options {unknown} do not apply to polytile function {name}; it takes {', '.join(_POLYTILE_OPTIONS)}"
            )
        return polytile_launch(kernel, example_inputs, **options)
    if hasattr(kernel, "arg_names") and hasattr(kernel, "fn"):
        from polytile.sass.triton_kernel import triton_launch

        if "grid" not in options:
            raise TypeError(
                "optimizing a Triton kernel needs grid=(programs, ...) and usually constexprs={...}"
            )
        return triton_launch(kernel, list(example_inputs), **options)
    raise TypeError(
        f"cannot optimize a {type(kernel).__name__}: pass a CubinLaunch, a polytile CUDA kernel "
        "(pt.build(..., \"cuda\")) or a @triton.jit function"
    )


def optimize(
    kernel,
    example_inputs=None,
    budget: int = 100,
    method: str = "ppo",
    *,
    seed: int = 0,
    settings: RunnerSettings | None = None,
    verify_seeds: tuple[int, ...] = (11, 12, 13),
    candidates: int = 5,
    confirm_rounds: int = 5,
    max_steps: int = 32,
    latency_overrides: dict[str, int] | None = None,
    runner: Runner | None = None,
    **kernel_options,
) -> OptimizedKernel:
    """A verified, possibly faster variant of `kernel` and a report of what the search found.

    `kernel` is a CubinLaunch; a polytile CUDA function (`pt.build(sched, "cuda")`) with its input
    arrays as `example_inputs` and the options of `polytile_launch` (kernel_name=... for a function
    of several kernels, params=...); or a `@triton.jit` function with its non-constexpr
    `example_inputs` and the options of `triton_launch` (grid=..., constexprs=..., outputs=...,
    num_warps=...). A `runner` already measuring the same launch may be passed to reuse its worker.
    """
    launch = _as_launch(kernel, example_inputs, kernel_options)
    launch.check()
    analysis = analyse(launch, latency_overrides)
    cubin = Cubin(launch.cubin)
    if runner is not None and runner.launch != launch:  # equal launches: a polytile kernel is described anew
        raise ValueError(f"the runner measures {runner.launch.label}, not {launch.label}")
    with contextlib.nullcontext(runner) if runner is not None else Runner(launch, settings) as runner:
        measurer = GpuMeasurer(runner, cubin, launch.kernel)
        result = search(analysis, measurer, budget, method=method, seed=seed, max_steps=max_steps)
        report = OptimizationReport(
            kernel=launch.label,
            method=method,
            device=runner.device or {},
            budget=budget,
            measurements=result.measurements,
            failures=result.failures,
            baseline_ms=result.baseline_time,
            optimized_ms=result.baseline_time,
            speedup=1.0,
            verified=False,
        )
        ranked = sorted(
            ((t, s) for t, s in result.timed if t < result.baseline_time), key=lambda item: item[0]
        )
        chosen = Schedule.original(analysis)
        finalists = []  # (ratio in the selection rounds, schedule, cubin) of the verified candidates
        for _, schedule in ranked[:candidates]:
            patched = measurer.cubin_of(schedule)
            try:
                mismatch = runner.verify(patched, verify_seeds)
            except MeasurementFailed as exc:
                mismatch = str(exc)
            if mismatch is not None:
                report.rejected.append(f"{len(schedule.path)} moves: {mismatch}")
                continue
            try:
                ratio = _confirm(runner, launch.cubin, patched, confirm_rounds)[0]
            except MeasurementFailed as exc:  # verified, yet it failed when re-timed: never returned
                report.rejected.append(f"{len(schedule.path)} moves: failed in the confirmation timings: {exc}")
                continue
            finalists.append((ratio, schedule, patched))
        finalists.sort(key=lambda f: f[0], reverse=True)
        for ratio, schedule, patched in finalists:
            if ratio <= 1.0:
                report.notes.append(
                    f"the best of {len(finalists)} verified candidates was not faster when re-timed ({ratio:.3f})"
                )
                break
            try:  # fresh rounds: the rounds that picked the winner would flatter it
                speedup, base_ms, best_ms = _confirm(runner, launch.cubin, patched, confirm_rounds)
            except MeasurementFailed as exc:  # never returned; the next finalist is tried
                report.rejected.append(f"{len(schedule.path)} moves: failed in the confirmation timings: {exc}")
                continue
            if speedup > 1.0:
                chosen = schedule
                report.speedup, report.baseline_ms, report.optimized_ms = speedup, base_ms, best_ms
                report.verified = True
            else:
                report.notes.append(
                    f"the chosen candidate was not faster in fresh rounds ({ratio:.3f} when chosen, "
                    f"{speedup:.3f} confirmed)"
                )
            break
        if not ranked:
            report.notes.append("no measured variant was faster than the compiler's schedule")
        report.moves = _describe_path(chosen, result, analysis)
    optimized = launch.with_cubin(measurer.cubin_of(chosen))
    return OptimizedKernel(optimized, chosen, report, _with_cubin(kernel, optimized.cubin))


def _with_cubin(kernel, cubin: bytes) -> object | None:
    """A polytile function like `kernel` running `cubin`; else (a cubin or Triton kernel) None."""
    return with_cubin(kernel, cubin) if is_gpu_function(kernel) else None


def _confirm(runner: Runner, original: bytes, candidate: bytes, rounds: int) -> tuple[float, float, float]:
    """Median of per-round ratios original/candidate, timed alternately; and both medians."""
    base, best = [], []
    for _ in range(rounds):
        base.append(runner.time(original))
        best.append(runner.time(candidate))
    ratios = [b / c for b, c in zip(base, best, strict=True)]
    return statistics.median(ratios), statistics.median(base), statistics.median(best)


def _describe_path(schedule: Schedule, result, analysis: KernelAnalysis) -> list[str]:
    times = {s.key: t for t, s in result.timed}
    lines = []
    current = Schedule.original(analysis)
    previous = result.baseline_time
    for move in schedule.path:
        current = current.apply(move)
        t = times.get(current.key)
        if t is None:
            lines.append(f"{move.describe(analysis)}")
            continue
        change = (t - previous) / result.baseline_time * 100
        lines.append(
            f"{move.describe(analysis)}: {t * 1e3:.2f} us ({change:+.2f}%"
            f"{', paid off' if change < 0 else ''})"
        )
        previous = t
    return lines
