"""``pt.build``: lower a function (or its schedule) and compile it for a target."""

from __future__ import annotations

from collections.abc import Sequence

from .errors import BuildError, PolytileError
from .lang.func import Func
from .lang.names import check_function_name
from .schedule.state import Schedule
from .target import Target, as_target


def lower(obj: Func | Schedule, target: object = "cpu"):  # noqa: ANN201 - returns LoweredFunc
    """The loop IR of a function (default schedule) or of a schedule."""
    from .lowering.pipeline import lower as _lower
    sched = obj if isinstance(obj, Schedule) else Schedule(_func(obj))
    return _lower(sched, as_target(target))


def build(obj: Func | Schedule, target: object = "cpu", *, name: str | None = None,
          extra_flags: Sequence[str] = ()):  # noqa: ANN201 - CPUKernel or CUDAKernel
    """Compile ``obj`` for ``target`` ("cpu", "cuda", "cuda:sm_80") and return a callable kernel.

    A Func gets the default schedule (every computation in its own nest, in order); pass a
    Schedule to control loops and memory.
    """
    from .lowering.pipeline import lower as _lower
    if (isinstance(extra_flags, (str, bytes)) or not isinstance(extra_flags, Sequence)
            or not all(isinstance(f, str) for f in extra_flags)):
        raise BuildError(f"extra_flags must be a list of compiler flags (strings), e.g. ['-O2'], "
                         f"got {extra_flags!r}")
    sched = obj if isinstance(obj, Schedule) else Schedule(_func(obj))
    tgt = as_target(target)
    lowered = _lower(sched, tgt, name=check_function_name(name) if name is not None else None)
    return _BACKENDS[tgt.kind](sched, lowered, tgt, extra_flags)


def build_lowered(sched: Schedule, lowered, target: Target, extra_flags: Sequence[str] = ()):  # noqa: ANN001,ANN201
    """The kernel of ``sched`` already lowered for ``target`` (``build`` after lowering: callers that
    lower several schedules first, and compile their code in parallel)."""
    return _BACKENDS[target.kind](sched, lowered, target, extra_flags)


def _build_cpu(sched: Schedule, lowered, target: Target, extra_flags: Sequence[str]):  # noqa: ANN001,ANN202
    from .codegen.cpu import cpu_source
    from .runtime.cpu import CPUKernel
    return CPUKernel(sched.func, lowered, cpu_source(lowered), extra_flags, target)


def _build_cuda(sched: Schedule, lowered, target: Target, extra_flags: Sequence[str]):  # noqa: ANN001,ANN202
    from .runtime.cuda import build_cuda_kernel
    return build_cuda_kernel(sched, lowered, target)  # type: ignore[arg-type]


_BACKENDS = {"cpu": _build_cpu, "cuda": _build_cuda}  # by Target.kind: the code generator and runtime


def _func(obj: object) -> Func:
    if isinstance(obj, Func):
        return obj
    raise PolytileError(f"pt.build takes a pt.Func or a schedule, got {type(obj).__name__}")
