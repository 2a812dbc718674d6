"""Row-wise normalizations: softmax and layer normalization (memory-bound). 16-bit inputs are
computed in float32 and the result stored in the 16-bit type, as torch does.

On a CPU a row's sum or maximum accumulated in one variable cannot be vectorized (the compiler may
not reorder a float sum), so the CPU schedules restructure each row reduction into ``row_lanes``
partial results — one per vector lane of a few vector accumulators, each summing every
``row_lanes``-th element in order — and a short final reduction over the partials
(``lanewise_row_reduce``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import lang
from ..dtypes import DType, as_dtype, float32, tolerance
from ..errors import PolytileError
from ..lang.expr import Expr, call, select
from ..lang.func import Func
from ..lang.tensor import ComputeTensor, compute, placeholder, reduce_axis
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


ROW_ACCUMULATORS = 4
"""Vector accumulators of a CPU row reduction: a float add has a latency of about 3–4 cycles at up to
2 per cycle, so one accumulator would leave the vector unit mostly waiting."""


def row_lanes(target: CPUTarget, itemsize: int = 4) -> int:
    """The partial results of a CPU row reduction: ``ROW_ACCUMULATORS`` vectors of lanes."""
    return ROW_ACCUMULATORS * target.vector_lanes(itemsize)


def lanewise_row_reduce(M: int, N: int, width: int, value: Callable[..., Expr], kind: str, name: str,
                        cols: int = 0) -> ComputeTensor:
    """``name[i] = kind_j value(i, j)`` (``kind`` "sum" or "max") over j < N as two computations:
    ``name_lanes[i, lane]`` reduces ``value(i, v * width + lane)`` over the whole vectors v < N // width
    (in order), then ``name[i]`` reduces the ``width`` partials together with the last N % width
    elements (for a maximum, simply the last ``width`` elements again). Needs N ≥ width. With
    ``cols`` > 0 every pair (i, j < cols) is a row: ``name[i, j]`` reduces ``value(i, j, k)`` over
    k < N through ``name_lanes[i, j, lane]`` (dot products: a product with B transposed)."""
    nv = N // width
    tail = N - nv * width
    red = lang.tensor.max if kind == "max" else lang.tensor.sum
    v = reduce_axis(nv, f"{name}_v")
    lane = reduce_axis(width, f"{name}_l")

    def final(of: Callable[[Expr], Expr], partial: Expr) -> Expr:
        if kind == "max":
            return red(call("max", partial, of(N - width + lane)) if tail else partial, axis=lane)
        return red(partial + select(lane >= width - tail, of(N - width + lane), 0) if tail else partial, axis=lane)

    if cols:
        lanes2 = compute((M, cols, width), lambda i, j, lane: red(value(i, j, v * width + lane), axis=v),
                         f"{name}_lanes")
        return compute((M, cols), lambda i, j: final(lambda k: value(i, j, k), lanes2[i, j, lane]), name)
    lanes = compute((M, width), lambda i, lane: red(value(i, v * width + lane), axis=v), f"{name}_lanes")
    return compute((M,), lambda i: final(lambda k: value(i, k), lanes[i, lane]), name)


def schedule_lanewise_cpu(sched: Schedule, name: str, vector: int) -> None:
    """The partials of ``lanewise_row_reduce``'s ``name`` in registers: the lanes innermost (one
    vector of ``vector`` lanes, the accumulators unrolled), the whole vectors of a row outside."""
    st = sched[f"{name}_lanes"]
    st.reorder("i", f"{name}_v", "lane").split("lane", vector, "lo", "ll")
    st.cache_write("i").unroll("lo").vectorize("ll")


ROW_FORM: dict[str, Any] = {"lanewise": True, "accumulators": ROW_ACCUMULATORS, "vectors": 1, "fuse": True,
                            "parallel": True, "separate": True, "row_buffer": True}
"""The default form of a CPU row operator's schedule (``rows_cpu_default``; the tuning template
chooses each): row reductions as lane-wise partials of ``accumulators`` vectors, elementwise stages
in ``vectors`` vectors a step with whole vectors separated from the row's tail, the stages fused
at the row loop, that loop run in ``parallel``, softmax's exponentials kept in a ``row_buffer``."""


def rows_cpu_default(N: int, target: CPUTarget) -> dict[str, Any]:
    """The default form for rows of ``N``: lane-wise reductions unless a row is shorter than the
    partials (then reduced one element at a time, without a row buffer)."""
    lanewise = N >= row_lanes(target)
    return {**ROW_FORM, "lanewise": lanewise, "row_buffer": lanewise}


def schedule_rows_cpu(sched: Schedule, order: list[str], target: CPUTarget,
                      form: dict[str, Any] | None = None) -> None:
    """The computations ``order`` of a row operator (``form``: ``ROW_FORM``'s values): one row at a
    time through all of them (fused at the row loop ``i``, run in parallel) or each over all rows
    (each row loop in parallel); every elementwise computation split into vectors, lane-wise
    partials as ``schedule_lanewise_cpu``."""
    f = {**ROW_FORM, **(form or {})}
    lanes = target.vector_lanes(4)
    if f["fuse"]:
        for prev, name in zip(order, order[1:]):
            sched[name].after(sched[prev], "i")
    for name in order:
        if name.endswith("_lanes"):
            schedule_lanewise_cpu(sched, name[:-len("_lanes")], lanes)
        elif len(sched.computation(name).shape) == 2:
            st = sched[name].split("j", lanes * f["vectors"], "jo", "jl")
            if f["separate"]:
                st.separate("jo")
            st.vectorize("jl")
    if f["parallel"]:
        for name in order[:1] if f["fuse"] else order:
            sched[name].parallel("i")


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

    def cpu(sched: Schedule, target: CPUTarget, form: dict[str, Any] | None = None) -> Schedule | None:
        """The default schedule, or the one of ``form`` (``ROW_FORM``'s values; the tuning template's)."""
        f = {**rows_cpu_default(N, target), **(form or {})}
        if not f["lanewise"]:  # e.g. rows shorter than the partials: reduced one element at a time
            schedule_rows_cpu(sched, ["mx", "ex", "sm", "Y"], target, f)
            return None
        width = f["accumulators"] * target.vector_lanes(4)
        mx_ = lanewise_row_reduce(M, N, width, lambda i, j: X[i, j].astype(ct), "max", "mx")
        ex_ = compute((M, N), lambda i, j: call("exp", X[i, j].astype(ct) - mx_[i]), "ex")
        sm_ = lanewise_row_reduce(M, N, width, lambda i, j: ex_[i, j], "sum", "sm")
        Y_ = compute((M, N), lambda i, j: (ex_[i, j] / sm_[i]).astype(dtype), "Y")
        lanewise = Schedule(Func([X], [Y_], name="softmax"))
        schedule_rows_cpu(lanewise, ["mx_lanes", "mx", "ex", "sm_lanes", "sm", "Y"], target, f)
        if f["row_buffer"]:
            lanewise["ex"].store_at("i")
        return lanewise

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
    """Y[i, j] = (X[i, j] - mean_i) / sqrt(var_i + eps) * gamma[j] + beta[j], both moments in one pass over
    the row, taken of the row shifted by its first element (``x0``): the moments of X itself lose
    var / mean² of their digits to the cancellation of E[x²] - mean² (float32 rows of mean 300 and
    deviation 1 came out 5–8% off at 768 wide, rows of two close values entirely; the mean first and
    then the squared deviations from it, 1e-4 and 1e-2 off), the shifted ones keep them
    (tests/core/test_layernorm_offset.py)."""
    X = placeholder((M, N), dtype, "X")
    gamma = placeholder((N,), dtype, "gamma")
    beta = placeholder((N,), dtype, "beta")
    ct = computed_in("layernorm", dtype)
    j1, j2 = reduce_axis(N, "j1"), reduce_axis(N, "j2")
    x0 = compute((M,), lambda i: X[i, 0].astype(ct), "x0")

    def shifted(i, j):  # noqa: ANN001, ANN202 - iterators
        return X[i, j].astype(ct) - x0[i]

    s1 = compute((M,), lambda i: lang.tensor.sum(shifted(i, j1), axis=j1), "s1")
    s2 = compute((M,), lambda i: lang.tensor.sum(shifted(i, j2) * shifted(i, j2), axis=j2), "s2")

    def norm(i, j, s1=s1, s2=s2):  # noqa: ANN001, ANN202 - iterators and the moments' sums
        mean = s1[i] * (1.0 / N)  # of the shifted row
        var = s2[i] * (1.0 / N) - mean * mean
        y = (shifted(i, j) - mean) * call("rsqrt", var + eps) * gamma[j].astype(ct) + beta[j].astype(ct)
        return y.astype(dtype)

    Y = compute((M, N), norm, "Y")
    func = Func([X, gamma, beta], [Y], name="layernorm")

    def cpu(sched: Schedule, target: CPUTarget, form: dict[str, Any] | None = None) -> Schedule | None:
        """The default schedule, or the one of ``form`` (``ROW_FORM``'s values; the tuning template's)."""
        f = {**rows_cpu_default(N, target), **(form or {})}
        if not f["lanewise"]:  # e.g. rows shorter than the partials: reduced one element at a time
            schedule_rows_cpu(sched, ["x0", "s1", "s2", "Y"], target, f)
            return None
        width = f["accumulators"] * target.vector_lanes(4)
        s1_ = lanewise_row_reduce(M, N, width, shifted, "sum", "s1")
        s2_ = lanewise_row_reduce(M, N, width, lambda i, j: shifted(i, j) * shifted(i, j), "sum", "s2")
        Y_ = compute((M, N), lambda i, j: norm(i, j, s1_, s2_), "Y")
        lanewise = Schedule(Func([X, gamma, beta], [Y_], name="layernorm"))
        schedule_rows_cpu(lanewise, ["x0", "s1_lanes", "s1", "s2_lanes", "s2", "Y"], target, f)
        return lanewise

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
