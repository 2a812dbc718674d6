"""Matrix products: matmul, batch_matmul and dense + bias + ReLU, with their default schedules.

The CPU schedule follows the BLIS structure, written with polytile's primitives: panels of B
packed at the kc loop, blocks of A packed at the ic loop, an MR×NR accumulator tile kept in
registers (write cache, unrolled and vectorized), full tiles separated from the edges, and the
block loop run in parallel.
"""

from __future__ import annotations

import math

import numpy as np

from .. import lang
from ..dtypes import accumulator, as_dtype, tolerance
from ..errors import PolytileError
from ..lang.func import Func
from ..lang.tensor import compute, placeholder, reduce_axis
from ..schedule.state import Schedule
from ..target import CPUTarget
from .base import Op, random_array, reference_type


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def cpu_gemm_tiles(M: int, N: int, K: int, target: CPUTarget, itemsize: int = 4) -> dict[str, int]:
    """Default BLIS-style tile sizes for ``target``: register tile MR×NR, cache blocks MC, NC, KC."""
    lanes = target.vector_lanes(itemsize)
    regs = 32 if target.vector_bits >= 512 else 16
    nr_vecs = 4 if regs >= 32 else 2
    nr = lanes * nr_vecs
    mr = max(1, min(6, (regs - nr_vecs - 2) // nr_vecs))
    kc = min(256, K)
    nc = min(_round_up(N, nr), max(nr, (target.l2_bytes // 2) // (kc * itemsize) // nr * nr))
    blocks = target.cores * math.ceil(M / (target.cores * 96))
    mc = min(_round_up(M, mr), _round_up(math.ceil(M / max(1, blocks)), mr))
    return {"mc": max(mr, mc), "nc": nc, "kc": max(1, kc), "mr": mr, "nr": nr, "lanes": lanes}


def schedule_gemm_cpu(sched: Schedule, out: str, a: str, b: str, tiles: dict[str, int],
                      b_transposed: bool = False, batch: str | None = None) -> None:
    """Schedule ``out[i, j] = sum_k a[i, k] * b[k, j]`` (``b[j, k]`` when ``b_transposed``; a leading
    batch loop ``batch`` when given, indexing all three tensors)."""
    mc, nc, kc, mr, nr, lanes = (tiles[k] for k in ("mc", "nc", "kc", "mr", "nr", "lanes"))
    lead = (batch,) if batch else ()
    st = sched[out]
    st.split("j", nc, "jc", "j1").split("k", kc, "kc", "k1").split("i", mc, "ic", "i1")
    st.split("j1", nr, "jr", "jn").split("i1", mr, "ir", "im").split("jn", lanes, "jv", "jl")
    st.reorder(*lead, "jc", "kc", "ic", "jr", "ir", "k1", "im", "jv", "jl")
    if b_transposed:
        st.cache(b, "kc", layout=lambda *e: (*e[:-2], e[-2] // nr, e[-1], e[-2] % nr))
    else:
        st.cache(b, "kc", layout=lambda *e: (*e[:-2], e[-1] // nr, e[-2], e[-1] % nr))
    st.cache(a, "ic", layout=lambda *e: (*e[:-2], e[-2] // mr, e[-1], e[-2] % mr))
    st.cache_write("ir")
    st.separate("ir")
    st.unroll("im").unroll("jv").vectorize("jl")
    st.parallel(batch if batch else "ic")


def product(a: lang.expr.Expr, b: lang.expr.Expr, dtype: object) -> lang.expr.Expr:
    """``a * b`` of two ``dtype`` operands in the type they are summed in (``dtypes.accumulator``:
    16-bit floats in float32, 8- and 16-bit integers in int32), so sums neither lose precision nor
    wrap around."""
    acc = accumulator(dtype)
    return a.astype(acc) * b.astype(acc)


def _nbytes(dtype: str) -> int:
    return as_dtype(dtype).itemsize


def _reference_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    wide = reference_type(a.dtype)
    return np.matmul(a.astype(wide), b.astype(wide))


def matmul(M: int, N: int, K: int, dtype: str = "float32") -> Op:
    """C[i, j] = sum_k A[i, k] * B[k, j], summed in and returned as ``dtypes.accumulator(dtype)``
    (float16/bfloat16 inputs: float32; int8/uint8/int16: int32)."""
    A = placeholder((M, K), dtype, "A")
    B = placeholder((K, N), dtype, "B")
    k = reduce_axis(K, "k")
    C = compute((M, N), lambda i, j: lang.tensor.sum(product(A[i, k], B[k, j], dtype), axis=k), "C")
    func = Func([A, B], [C], name="matmul")

    def cpu(sched: Schedule, target: CPUTarget) -> None:
        schedule_gemm_cpu(sched, "C", "A", "B", cpu_gemm_tiles(M, N, K, target, C.dtype.itemsize))

    op = Op("matmul", {"M": M, "N": N, "K": K}, func,
            lambda rng: [random_array(rng, (M, K), dtype), random_array(rng, (K, N), dtype)], _reference_matmul,
            2.0 * M * N * K, _nbytes(dtype) * (M * K + K * N) + C.dtype.itemsize * M * N, {"cpu": cpu},
            baseline=lambda a, b: a @ b, tolerance=tolerance(C.dtype, K, dtype))
    _add_cuda(op, "matmul", (M, N, K))
    return op


def batch_matmul(batch: int, M: int, N: int, K: int, dtype: str = "float32") -> Op:
    """C[b, i, j] = sum_k A[b, i, k] * B[b, k, j] (summed in and returned as ``dtypes.accumulator(dtype)``,
    as in ``matmul``)."""
    A = placeholder((batch, M, K), dtype, "A")
    B = placeholder((batch, K, N), dtype, "B")
    k = reduce_axis(K, "k")
    C = compute((batch, M, N), lambda bb, i, j: lang.tensor.sum(product(A[bb, i, k], B[bb, k, j], dtype), axis=k),
                "C")
    func = Func([A, B], [C], name="batch_matmul")

    def cpu(sched: Schedule, target: CPUTarget) -> None:
        tiles = cpu_gemm_tiles(M, N, K, target, C.dtype.itemsize)
        tiles["mc"] = _round_up(M, tiles["mr"]) if batch >= target.cores else tiles["mc"]
        schedule_gemm_cpu(sched, "C", "A", "B", tiles, batch="bb" if batch >= target.cores else None)

    op = Op("batch_matmul", {"batch": batch, "M": M, "N": N, "K": K}, func,
            lambda rng: [random_array(rng, (batch, M, K), dtype), random_array(rng, (batch, K, N), dtype)],
            _reference_matmul,
            2.0 * batch * M * N * K, batch * (_nbytes(dtype) * (M * K + K * N) + C.dtype.itemsize * M * N),
            {"cpu": cpu}, baseline=np.matmul, tolerance=tolerance(C.dtype, K, dtype))
    _add_cuda(op, "batch_matmul", (batch, M, N, K))
    return op


def dense(M: int, N: int, K: int, dtype: str = "float32", activation: str = "relu") -> Op:
    """Y[i, j] = act(sum_k X[i, k] * W[j, k] + bias[j]) — a fully connected layer (W is N×K), summed in
    and returned as ``dtypes.accumulator(dtype)`` (as in ``matmul``)."""
    if activation not in ("relu", "none"):
        raise PolytileError(f"dense: unknown activation {activation!r}; use 'relu' or 'none'")
    X = placeholder((M, K), dtype, "X")
    W = placeholder((N, K), dtype, "W")
    bias = placeholder((N,), dtype, "bias")
    k = reduce_axis(K, "k")
    mm = compute((M, N), lambda i, j: lang.tensor.sum(product(X[i, k], W[j, k], dtype), axis=k), "XW")

    def act(v: lang.expr.Expr) -> lang.expr.Expr:
        return lang.expr.call("max", v, 0) if activation == "relu" else v  # 0 of v's type

    Y = compute((M, N), lambda i, j: act(mm[i, j] + bias[j].astype(mm.dtype)), "Y")
    func = Func([X, W, bias], [Y], name="dense")

    def cpu(sched: Schedule, target: CPUTarget) -> None:
        tiles = cpu_gemm_tiles(M, N, K, target, Y.dtype.itemsize)
        schedule_gemm_cpu(sched, "XW", "X", "W", tiles, b_transposed=True)
        ep = sched["Y"]
        ep.split("j", tiles["lanes"], "jo", "jl").vectorize("jl").parallel("i")

    def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        y = _reference_matmul(x, w.T) + b.astype(reference_type(b.dtype))
        return np.maximum(y, 0) if activation == "relu" else y

    op = Op("dense", {"M": M, "N": N, "K": K}, func,
            lambda rng: [random_array(rng, (M, K), dtype), random_array(rng, (N, K), dtype),
                         random_array(rng, (N,), dtype)],
            reference, 2.0 * M * N * K, _nbytes(dtype) * (M * K + N * K) + Y.dtype.itemsize * M * N, {"cpu": cpu},
            baseline=lambda x, w, b: np.maximum(x @ w.T + b, 0) if activation == "relu" else x @ w.T + b,
            tolerance=tolerance(Y.dtype, K, dtype))
    _add_cuda(op, "dense", (M, N, K))
    return op


def _add_cuda(op: Op, kind: str, dims: tuple[int, ...]) -> None:
    """Attach the CUDA schedule when the GPU operator module provides one."""
    from . import gpu_schedules
    fn = gpu_schedules.SCHEDULES.get(kind)
    if fn is not None:
        op.schedules["cuda"] = lambda sched, target: fn(sched, target, *dims)  # type: ignore[misc]

