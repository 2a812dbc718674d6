"""Lowering's ``vector_lanes`` pass (``polytile/lowering/passes/vector_lanes.py``): a CUDA loop tagged
``vectorize`` whose body is one store becomes vector loads into registers, the lanes, one vector store —
where the indices prove it — and is left to unrolling otherwise. Checked on the lowered IR and the
source, and by running the lowered kernels on the CPU (``block_emulator``) against NumPy, at sizes
that do not divide the blocks."""

from __future__ import annotations

import block_emulator
import numpy as np
import pytest

import polytile as pt
from polytile.lowering import loopir as ir
from polytile.lowering.passes.gpu_vectorize import aligned
from polytile.target import CUDATarget

SM90A = CUDATarget(arch="sm_90a")


def _scaled(rows: int, cols: int, dtype: str, lanes: int, threads: int = 64) -> tuple[pt.Func, pt.Schedule]:
    """Y[i, j] = X[i, j] * s[j] + t[0] (a per-column vector and a scalar), its two loops fused, split into
    ``lanes``-wide vectors (tagged vectorize) and blocks of ``threads``."""
    X = pt.placeholder((rows, cols), dtype, "X")
    s = pt.placeholder((cols,), dtype, "s")
    t = pt.placeholder((1,), dtype, "t")
    Y = pt.compute((rows, cols), lambda i, j: X[i, j] * s[j] + t[0], "Y")
    f = pt.Func([X, s, t], [Y])
    sch = pt.Schedule(f)
    sch[Y].fuse("i", "j", "e").split("e", lanes, "eo", "ev").split("eo", threads, "eb", "et")
    sch[Y].bind("eb", "blockIdx.x").bind("et", "threadIdx.x").vectorize("ev")
    return f, sch


def _run(sch: pt.Schedule, rows: int, cols: int, dtype: str) -> tuple[np.ndarray, np.ndarray, str]:
    low = pt.lower(sch, SM90A)
    rng = np.random.default_rng(rows * cols)
    x, s, t = (rng.standard_normal(shape).astype(dtype) for shape in ((rows, cols), (cols,), (1,)))
    (got,) = block_emulator.run(low, [x.astype(np.float64), s.astype(np.float64), t.astype(np.float64),
                                      np.zeros((rows, cols))])
    want = x.astype(np.float64) * s.astype(np.float64) + t.astype(np.float64)[0]
    return got, want, str(low)


@pytest.mark.parametrize("rows, cols, dtype, lanes", [(7, 24, "float16", 8), (13, 20, "float32", 4),
                                                      (5, 64, "float16", 4)], ids=str)
def test_vector_loads_and_stores_compute_the_loops_values(rows: int, cols: int, dtype: str, lanes: int) -> None:
    _, sch = _scaled(rows, cols, dtype, lanes)
    got, want, text = _run(sch, rows, cols, dtype)
    np.testing.assert_allclose(got, want, rtol=1e-2 if dtype == "float16" else 1e-5, atol=1e-2)
    # X and s loaded as vectors (s's index: the fused index modulo the columns), t as it was, Y stored as one
    assert "vectorize" not in text
    assert text.count(f"ramp(0, 1, {lanes})") >= 3, text
    assert "t[0]" in text


def test_lanes_that_cross_a_row_of_the_per_column_vector_stay_scalar() -> None:
    # 20 columns, vectors of 8: a vector of X may end in the next row, where s starts again — s's lanes
    # are not contiguous, so s stays a load per lane; X and Y are contiguous and vectorized
    rows, cols, dtype = 6, 20, "float16"
    _, sch = _scaled(rows, cols, dtype, 8)
    got, want, text = _run(sch, rows, cols, dtype)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
    assert "allocate X_v" in text and "allocate s_v" not in text, text


def test_a_guarded_lane_is_left_to_unrolling() -> None:
    # 7 × 5 = 35 elements in vectors of 8: the last vector is partial, guarded inside the loop
    rows, cols, dtype = 7, 5, "float16"
    _, sch = _scaled(rows, cols, dtype, 8)
    got, want, text = _run(sch, rows, cols, dtype)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
    assert "ramp" not in text


def test_aligned_knows_a_remainder_of_a_multiple() -> None:
    e, t = ir.Var("e"), ir.Var("t")
    eight_e = ir.BinOp("*", ir.const(8), e)
    assert aligned(ir.BinOp("%", eight_e, ir.const(64)), 8)
    assert aligned(ir.BinOp("+", ir.BinOp("*", ir.const(2), ir.BinOp("mod", ir.BinOp("*", ir.const(4), t),
                                                                      ir.const(12))), eight_e), 8)
    assert not aligned(ir.BinOp("%", eight_e, ir.const(20)), 8)  # 8e mod 20 is 4 at e = 3
    assert not aligned(ir.BinOp("%", ir.BinOp("*", ir.const(4), e), ir.const(64)), 8)


def test_mixed_widths_vectorize_each_tensor_by_its_own_bytes() -> None:
    # a float32 result of float16 values: vectors of 4 lanes, X read 8 bytes at a time, s 16
    rows, cols = 5, 12
    X = pt.placeholder((rows, cols), "float16", "X")
    s = pt.placeholder((cols,), "float32", "s")
    Y = pt.compute((rows, cols), lambda i, j: pt.cast("float32", X[i, j]) * s[j], "Y")
    sch = pt.Schedule(pt.Func([X, s], [Y]))
    sch[Y].fuse("i", "j", "e").split("e", 4, "eo", "ev").split("eo", 32, "eb", "et")
    sch[Y].bind("eb", "blockIdx.x").bind("et", "threadIdx.x").vectorize("ev")
    low = pt.lower(sch, SM90A)
    rng = np.random.default_rng(3)
    x, sv = rng.standard_normal((rows, cols)).astype(np.float16), rng.standard_normal(cols).astype(np.float32)
    (got,) = block_emulator.run(low, [x.astype(np.float64), sv.astype(np.float64), np.zeros((rows, cols))])
    np.testing.assert_allclose(got, x.astype(np.float64) * sv, rtol=1e-6)
    source = str(low)
    assert "allocate X_v" in source and "allocate s_v" in source and "Y[ramp(" in source, source
