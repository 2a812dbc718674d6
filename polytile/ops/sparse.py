"""Sparse and segmented operators with data-dependent loop bounds: segment_sum and CSR SpMM.

Row bounds read from ``offsets``/``ptr`` become local parameters of the polyhedral model: they are
loaded inside the row loop, where the row index is known, so splitting or caching the inner loop
never reads the offsets out of place.
"""

from __future__ import annotations

import numpy as np

from .. import lang
from ..dtypes import accumulator, as_dtype, tolerance
from ..lang.func import Func
from ..lang.tensor import compute, param, placeholder, reduce_axis
from ..schedule.state import Schedule
from ..target import CPUTarget
from .base import Op, random_array, reference_type
from .baselines import numpy_segment_sum, scipy_spmm
from .matmul import _add_cuda, product


def random_offsets(rng: np.random.Generator, rows: int, nnz: int) -> np.ndarray:
    """Monotone offsets of ``rows`` segments over ``nnz`` elements, with some empty rows."""
    cuts = np.sort(rng.integers(0, nnz + 1, size=rows - 1)) if rows > 1 else np.array([], dtype=np.int64)
    return np.concatenate([[0], cuts, [nnz]]).astype(np.int32)


def _mean_length(rows: int, nnz: int) -> int:
    """The average row length: the reduction length a sparse operator's tolerance scales with."""
    return max(1, nnz // max(1, rows))


def segment_sum(rows: int, nnz: int, dtype: str = "float32") -> Op:
    """y[i] = sum(x[offsets[i]:offsets[i + 1]]), summed in and returned as ``dtypes.accumulator(dtype)``;
    sizes are parameters (M, NNZ)."""
    M, NNZ = param("M"), param("NNZ")
    off = placeholder((M + 1,), "int32", "offsets", value_range=(0, NNZ), monotonic=True)
    x = placeholder((NNZ,), dtype, "x")

    def body(i):  # noqa: ANN001, ANN202 - iterator
        k = reduce_axis((off[i], off[i + 1]), "k")
        return lang.tensor.sum(x[k].astype(accumulator(dtype)), axis=k)

    y = compute((M,), body, "y")
    func = Func([off, x], [y], name="segment_sum")

    def cpu(sched: Schedule, target: CPUTarget) -> None:
        sched["y"].parallel("i")

    def inputs(rng: np.random.Generator) -> list[np.ndarray]:
        return [random_offsets(rng, rows, nnz), random_array(rng, (nnz,), dtype)]

    def reference(o: np.ndarray, xv: np.ndarray) -> np.ndarray:
        wide = reference_type(xv.dtype)
        return np.array([xv[o[i]:o[i + 1]].sum(dtype=wide) for i in range(len(o) - 1)], wide)

    op = Op("segment_sum", {"rows": rows, "nnz": nnz}, func, inputs, reference, float(nnz),
            as_dtype(dtype).itemsize * nnz + 4.0 * rows + y.dtype.itemsize * rows, {"cpu": cpu},
            baseline=numpy_segment_sum, tolerance=tolerance(y.dtype, _mean_length(rows, nnz), dtype))
    _add_cuda(op, "segment_sum", (rows, nnz))
    return op


def spmm(rows: int, cols: int, n: int, nnz: int, dtype: str = "float32") -> Op:
    """C[i, j] = sum_{k in ptr[i]..ptr[i+1]} val[k] * B[col[k], j] (CSR × dense), summed in and returned
    as ``dtypes.accumulator(dtype)``."""
    M, K, N, NNZ = param("M"), param("K"), param("N"), param("NNZ")
    ptr = placeholder((M + 1,), "int32", "ptr", value_range=(0, NNZ), monotonic=True)
    col = placeholder((NNZ,), "int32", "col", value_range=(0, K - 1))
    val = placeholder((NNZ,), dtype, "val")
    B = placeholder((K, N), dtype, "B")

    def body(i, j):  # noqa: ANN001, ANN202 - iterators
        k = reduce_axis((ptr[i], ptr[i + 1]), "k")
        return lang.tensor.sum(product(val[k], B[col[k], j], dtype), axis=k)

    C = compute((M, N), body, "C")
    func = Func([ptr, col, val, B], [C], name="spmm")

    def cpu(sched: Schedule, target: CPUTarget) -> None:
        lanes = target.vector_lanes(4)
        st = sched["C"]
        st.reorder("i", "k", "j").split("j", lanes, "jo", "jl").vectorize("jl").parallel("i")

    def inputs(rng: np.random.Generator) -> list[np.ndarray]:
        p = random_offsets(rng, rows, nnz)
        return [p, rng.integers(0, cols, nnz).astype(np.int32), random_array(rng, (nnz,), dtype),
                random_array(rng, (cols, n), dtype)]

    def reference(p: np.ndarray, c: np.ndarray, v: np.ndarray, b: np.ndarray) -> np.ndarray:
        wide = reference_type(b.dtype)
        out = np.zeros((len(p) - 1, b.shape[1]), wide)
        for i in range(len(p) - 1):
            for k in range(p[i], p[i + 1]):
                out[i] += v[k].astype(wide) * b[c[k]].astype(wide)
        return out

    op = Op("spmm", {"rows": rows, "cols": cols, "n": n, "nnz": nnz}, func, inputs, reference,
            2.0 * nnz * n, 4.0 * (nnz * (2 + n) + rows * n), {"cpu": cpu},
            tolerance=tolerance(C.dtype, _mean_length(rows, nnz), dtype))
    base = scipy_spmm()
    if base is not None:
        op.baseline, op.baseline_name = base
    _add_cuda(op, "spmm", (rows, cols, n, nnz))
    return op
