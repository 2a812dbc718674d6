"""polytile: a polyhedral tensor compiler for CPUs and NVIDIA GPUs."""

from . import dtypes
from .build import build, lower
from .dtypes import bfloat16, bool_, float16, float32, float64, int8, int16, int32, int64, uint8
from .errors import (
    BuildError,
    DeviceError,
    InputError,
    LanguageError,
    LoweringError,
    PolytileError,
    ScheduleError,
)
from .lang.expr import Expr, call, cast, select
from .lang.func import Func
from .lang.tensor import Tensor, compute, max, min, param, placeholder, prod, reduce_axis, sum
from .launch_plan import KernelLaunch, LaunchBuffer, is_gpu_function, launch_plan, with_cubin
from .schedule import Schedule, Stage
from .target import CPUTarget, CUDATarget, Target, cpu_target

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``pt.sass``, ``pt.ops`` and ``pt.tune`` load on first use (they pull heavier dependencies).
    ``pt.tune`` is the package ``polytile.tune``, which is also callable as the function ``tune``."""
    import importlib
    if name in ("sass", "ops", "tune"):
        return importlib.import_module(f"polytile.{name}")
    raise AttributeError(f"module 'polytile' has no attribute {name!r}")


def synchronize() -> None:
    """Wait for the GPU work polytile queued (calls on GPU arrays return before it is done) and raise
    what the device-side index-array checks of any kernel found; nothing to do without a GPU."""
    from .runtime.cuda import synchronize as _synchronize
    _synchronize()


def create_schedule(func: Func) -> Schedule:
    """A fresh (default) schedule of ``func``: every computation in its own loop nest, in order."""
    return Schedule(func)


def exp(x): return call("exp", x)  # noqa: E704
def log(x): return call("log", x)  # noqa: E704
def sqrt(x): return call("sqrt", x)  # noqa: E704
def rsqrt(x): return call("rsqrt", x)  # noqa: E704
def tanh(x): return call("tanh", x)  # noqa: E704
def erf(x): return call("erf", x)  # noqa: E704
def sigmoid(x): return call("sigmoid", x)  # noqa: E704
def abs(x): return call("abs", x)  # noqa: A001,E704
def floor(x): return call("floor", x)  # noqa: E704
def ceil(x): return call("ceil", x)  # noqa: E704
def pow(x, y): return call("pow", x, y)  # noqa: A001,E704
def maximum(x, y): return call("max", x, y)  # noqa: E704
def minimum(x, y): return call("min", x, y)  # noqa: E704


__all__ = [
    "BuildError", "CPUTarget", "CUDATarget", "DeviceError", "Expr", "Func", "InputError", "KernelLaunch",
    "LanguageError", "LaunchBuffer", "LoweringError",
    "PolytileError", "Schedule", "ScheduleError", "Stage", "Target", "Tensor", "abs", "bfloat16", "bool_", "build",
    "call", "cast", "ceil", "compute", "cpu_target", "create_schedule", "dtypes", "erf", "exp", "float16", "float32",
    "float64", "floor", "int8", "int16", "int32", "int64", "is_gpu_function", "launch_plan", "log", "lower", "max",
    "maximum", "min", "minimum", "param", "placeholder", "pow", "prod", "reduce_axis", "rsqrt", "select", "sigmoid",
    "sqrt", "sum", "synchronize", "tanh", "uint8", "with_cubin",
]
