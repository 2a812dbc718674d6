"""Row-wise normalizations: softmax and layer normalization (memory-bound)."""

from __future__ import annotations

import numpy as np

from .. import lang
from ..lang.expr import call
from ..lang.func import Func
from ..lang.tensor import compute, placeholder, reduce_axis
from ..schedule.state import Schedule
from ..target import CPUTarget
from .base import Op, random_array
from .baselines import numpy_layernorm, numpy_softmax
from .matmul import _add_cuda


def softmax(M: int, N: int, dtype: str = "float32") -> Op:
    """Y[i, j] = exp(X[i, j] - max_j X[i, :]) / sum_j exp(X[i, j] - max)."""
    X = placeholder((M, N), dtype, "X")
    j1, j2 = reduce_axis(N, "j1"), reduce_axis(N, "j2")
    mx = compute((M,), lambda i: lang.tensor.max(X[i, j1], axis=j1), "mx")
    ex = compute((M, N), lambda i, j: call("exp", X[i, j] - mx[i]), "ex")
    sm = compute((M,), lambda i: lang.tensor.sum(ex[i, j2], axis=j2), "sm")
    Y = compute((M, N), lambda i, j: ex[i, j] / sm[i], "Y")
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
            reference, 5.0 * M * N, 2.0 * M * N * np.dtype(dtype).itemsize, {"cpu": cpu},
            baseline=numpy_softmax)
    _add_cuda(op, "softmax", (M, N))
    return op


def layernorm(M: int, N: int, dtype: str = "float32", eps: float = 1e-5) -> Op:
    """Y[i, j] = (X[i, j] - mean_i) / sqrt(var_i + eps) * gamma[j] + beta[j], one pass for the moments."""
    X = placeholder((M, N), dtype, "X")
    gamma = placeholder((N,), dtype, "gamma")
    beta = placeholder((N,), dtype, "beta")
    j1, j2 = reduce_axis(N, "j1"), reduce_axis(N, "j2")
    s1 = compute((M,), lambda i: lang.tensor.sum(X[i, j1], axis=j1), "s1")
    s2 = compute((M,), lambda i: lang.tensor.sum(X[i, j2] * X[i, j2], axis=j2), "s2")

    def norm(i, j):  # noqa: ANN001, ANN202 - iterators
        mean = s1[i] * (1.0 / N)
        var = s2[i] * (1.0 / N) - mean * mean
        return (X[i, j] - mean) * call("rsqrt", var + eps) * gamma[j] + beta[j]

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
            reference, 8.0 * M * N, 2.0 * M * N * np.dtype(dtype).itemsize, {"cpu": cpu}, tolerance=1e-4,
            baseline=numpy_layernorm(eps))
    _add_cuda(op, "layernorm", (M, N))
    return op
