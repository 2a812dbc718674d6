"""Row-wise normalizations: softmax and layer normalization (memory-bound). 16-bit inputs are
computed in float32 and the result stored in the 16-bit type, as torch does."""

from __future__ import annotations

import numpy as np

from .. import lang
from ..dtypes import DType, as_dtype, float32, tolerance
from ..errors import PolytileError
from ..lang.expr import call
from ..lang.func import Func
from ..lang.tensor import compute, placeholder, reduce_axis
from ..schedule.state import Schedule
from ..target import CPUTarget
from .base import Op, random_array
from .baselines import numpy_layernorm, numpy_softmax
from .matmul import _add_cuda


def computed_in(op: str, dtype: str) -> DType:
    """The type a normalization computes ``dtype`` data in: float32 for 16-bit floats, else the type;
    integer data is refused (a normalization's result is fractional)."""
    d = as_dtype(dtype)
    if not d.is_float:
        raise PolytileError(f"{op} normalizes floating-point data; {d} is not (use float32, float16, bfloat16 "
                            "or float64)")
    return float32 if d.bits == 16 else d


def softmax(M: int, N: int, dtype: str = "float32") -> Op:
    """Y[i, j] = exp(X[i, j] - max_j X[i, :]) / sum_j exp(X[i, j] - max)."""
    X = placeholder((M, N), dtype, "X")
    ct = computed_in("softmax", dtype)
    j1, j2 = reduce_axis(N, "j1"), reduce_axis(N, "j2")
    mx = compute((M,), lambda i: lang.tensor.max(X[i, j1].astype(ct), axis=j1), "mx")
    ex = compute((M, N), lambda i, j: call("exp", X[i, j].astype(ct) - mx[i]), "ex")
    sm = compute((M,), lambda i: lang.tensor.sum(ex[i, j2], axis=j2), "sm")
    Y = compute((M, N), lambda i, j: (ex[i, j] / sm[i]).astype(dtype), "Y")
    func = Func([X], [Y], name="softmax")

    def cpu(sched: Schedule, target: CPUTarget) -> None:
        lanes = target.vector_lanes(4)
        sched["ex"].after(sched["mx"], "i")
        sched["sm"].after(sched["ex"], "i")
        sched["Y"].after(sched["sm"], "i")
        sched["Y"].split("j", lanes, "jo", "jl").vectorize("jl")
        sched["mx"].parallel("i")

    def reference(x: np.ndarray) -> np.ndarray:
        x64 = x.astype(np.float64)
        e = np.exp(x64 - x64.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    op = Op("softmax", {"M": M, "N": N}, func, lambda rng: [random_array(rng, (M, N), dtype, -4, 4)],
            reference, 5.0 * M * N, 2.0 * M * N * Y.dtype.itemsize, {"cpu": cpu},
            baseline=numpy_softmax, tolerance=tolerance(Y.dtype, N))
    _add_cuda(op, "softmax", (M, N))
    return op


def layernorm(M: int, N: int, dtype: str = "float32", eps: float = 1e-5) -> Op:
    """Y[i, j] = (X[i, j] - mean_i) / sqrt(var_i + eps) * gamma[j] + beta[j], one pass for the moments."""
    X = placeholder((M, N), dtype, "X")
    gamma = placeholder((N,), dtype, "gamma")
    beta = placeholder((N,), dtype, "beta")
    ct = computed_in("layernorm", dtype)
    j1, j2 = reduce_axis(N, "j1"), reduce_axis(N, "j2")
    s1 = compute((M,), lambda i: lang.tensor.sum(X[i, j1].astype(ct), axis=j1), "s1")
    s2 = compute((M,), lambda i: lang.tensor.sum(X[i, j2].astype(ct) * X[i, j2].astype(ct), axis=j2), "s2")

    def norm(i, j):  # noqa: ANN001, ANN202 - iterators
        mean = s1[i] * (1.0 / N)
        var = s2[i] * (1.0 / N) - mean * mean
        y = (X[i, j].astype(ct) - mean) * call("rsqrt", var + eps) * gamma[j].astype(ct) + beta[j].astype(ct)
        return y.astype(dtype)

    Y = compute((M, N), norm, "Y")
    func = Func([X, gamma, beta], [Y], name="layernorm")

    def cpu(sched: Schedule, target: CPUTarget) -> None:
        lanes = target.vector_lanes(4)
        sched["s2"].after(sched["s1"], "i")
        sched["Y"].after(sched["s2"], "i")
        sched["Y"].split("j", lanes, "jo", "jl").vectorize("jl")
        sched["s1"].parallel("i")

    def reference(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        x64 = x.astype(np.float64)
        mean = x64.mean(axis=1, keepdims=True)
        var = x64.var(axis=1, keepdims=True)
        return (x64 - mean) / np.sqrt(var + eps) * g + b

    op = Op("layernorm", {"M": M, "N": N}, func,
            lambda rng: [random_array(rng, (M, N), dtype), random_array(rng, (N,), dtype),
                         random_array(rng, (N,), dtype)],
            reference, 8.0 * M * N, 2.0 * M * N * Y.dtype.itemsize, {"cpu": cpu},
            tolerance=tolerance(Y.dtype, N), baseline=numpy_layernorm(eps))
    _add_cuda(op, "layernorm", (M, N))
    return op
