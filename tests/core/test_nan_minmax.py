"""``maximum``/``minimum`` and ``max``/``min`` reductions propagate NaN as NumPy's do: a NaN operand,
in either place, gives NaN, so no schedule (vectorized, reordered, split) changes the result.
``a > b ? a : b`` dropped a NaN ``a``: a maximum over [0..15] with a NaN at 3 gave 15 (independent
fuzzer findings, "NaN semantics of max/min")."""

import numpy as np
import pytest

import polytile as pt
from polytile.dtypes import as_dtype
from polytile.lowering import loopir as ir
from polytile.lowering.passes.simplify import simplify_expr

FLOATS = ["float32", "float64", "float16", "bfloat16"]
N = 40


def assert_same(got, want):
    """Equal, NaN where NaN (compared as float64: NumPy's test does not see bfloat16's NaN)."""
    np.testing.assert_array_equal(np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64))


@pytest.mark.parametrize("schedule", ["plain", "vector", "split-reordered"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_reductions_propagate_nan_like_numpy(dtype, schedule, rng):
    """Maxima and minima of columns (a NaN first, in the middle, last in its column, and in a
    column's partial results); "vector": the columns in vector lanes, "split-reordered": each
    column reduced in a different order."""
    A = pt.placeholder((N, 16), dtype, "A")
    k = pt.reduce_axis(N, "k")
    Mx = pt.compute((16,), lambda j: pt.max(A[k, j], axis=k), "Mx")
    Mn = pt.compute((16,), lambda j: pt.min(A[k, j], axis=k), "Mn")
    s = pt.create_schedule(pt.Func([A], [Mx, Mn]))
    for C in (Mx, Mn):
        if schedule == "vector":
            s[C].reorder("k", "j").split("j", 8).vectorize("ji")
        elif schedule == "split-reordered":
            s[C].reassociate().split("k", 8, "ko", "ki").reorder("j", "ki", "ko")
    a = rng.standard_normal((N, 16)).astype(as_dtype(dtype).numpy)
    for j, k in enumerate([0, 17, N - 1, 8, 9, 1]):
        a[k, j] = np.nan
    mx, mn = pt.build(s)(a)
    assert_same(mx, a.max(axis=0))
    assert_same(mn, a.min(axis=0))
    assert np.isnan(np.asarray(mx, np.float64)[:6]).all()


@pytest.mark.parametrize("vectorize", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_elementwise_maximum_minimum_propagate_nan(dtype, vectorize, rng):
    A = pt.placeholder((N,), dtype, "A")
    B = pt.placeholder((N,), dtype, "B")
    Mx = pt.compute((N,), lambda i: pt.maximum(A[i], B[i]), "Mx")
    Mn = pt.compute((N,), lambda i: pt.minimum(A[i], B[i]), "Mn")
    s = pt.create_schedule(pt.Func([A, B], [Mx, Mn]))
    if vectorize:
        for C in (Mx, Mn):
            s[C].split("i", 8).vectorize("ii")
    npd = as_dtype(dtype).numpy
    a, b = rng.standard_normal(N).astype(npd), rng.standard_normal(N).astype(npd)
    a[::3], b[1::3] = np.nan, np.nan  # NaN on the left, on the right, and neither
    a[5] = b[5] = np.nan
    mx, mn = pt.build(s)(a, b)
    assert_same(mx, np.maximum(a, b))
    assert_same(mn, np.minimum(a, b))


def test_vectorized_row_maximum_stays_vectorized_and_propagates_nan(rng):
    """Softmax's lane-wise row maximum (vector accumulators): a NaN in a row makes that row NaN,
    as NumPy's softmax, and the partial maxima are still vector operations."""
    op = pt.ops.softmax(4, 256)
    kern = op.build("cpu")
    (x,) = op.make_inputs(rng)
    x[1, 100] = np.nan
    y = kern(x)
    assert np.isnan(y[1]).all() and not np.isnan(y[[0, 2, 3]]).any()
    np.testing.assert_allclose(y[[0, 2, 3]], op.reference(x)[[0, 2, 3]], rtol=1e-5, atol=1e-6)
    assert "pt_max(mx_lanes_local_0, pt_vload<" in kern.source


@pytest.mark.parametrize("op", ["max", "min"])
def test_folded_constants_propagate_nan(op):
    f32 = as_dtype("float32")
    for a, b in ((np.nan, 1.0), (1.0, np.nan)):
        e = simplify_expr(ir.BinOp(op, ir.Const(a, f32), ir.Const(b, f32)))
        assert isinstance(e, ir.Const) and np.isnan(e.value)


def cuda_nan_kernel(dtype="float32"):
    """Row maxima and minima of 8 rows of 300, a row per block, reduced across its 64 threads (a
    tree of warp shuffles, then of the warps' results)."""
    A = pt.placeholder((8, 300), dtype, "A")
    k = pt.reduce_axis(300, "k")
    Mx = pt.compute((8,), lambda i: pt.max(A[i, k], axis=k), "Mx")
    Mn = pt.compute((8,), lambda i: pt.min(A[i, k], axis=k), "Mn")
    s = pt.create_schedule(pt.Func([A], [Mx, Mn]))
    for C in (Mx, Mn):
        s[C].split("k", 64, "ko", "kt").reassociate().reorder("i", "kt", "ko")
        s[C].bind("i", "blockIdx.x").bind("kt", "threadIdx.x")
    return s


@pytest.mark.needs_nvcc
def test_cuda_minmax_use_the_nan_instructions():
    kern = pt.build(cuda_nan_kernel(), "cuda:sm_80")
    assert kern.cubin[:4] == b"\x7fELF"
    assert "max.NaN.f32" in kern.source and "min.NaN.f32" in kern.source
    assert "pt_block_allreduce_max(" in kern.source and "pt_block_allreduce_min(" in kern.source
    assert pt.build(cuda_nan_kernel("int32"), "cuda:sm_80").cubin[:4] == b"\x7fELF"


@pytest.mark.gpu
def test_cuda_reductions_propagate_nan(rng):
    a = rng.standard_normal((8, 300)).astype(np.float32)
    for i, k in enumerate([0, 1, 31, 32, 63, 64, 200, 299]):  # every thread's and warp's place
        if i < 7:
            a[i, k] = np.nan
    mx, mn = pt.build(cuda_nan_kernel(), "cuda")(a)
    assert_same(mx, a.max(axis=1))
    assert_same(mn, a.min(axis=1))


@pytest.mark.gpu
def test_cuda_int_extremes_survive_the_block_tree():
    # the lanes past the last warp combined -INT_MAX as the lowest int: a row of INT_MIN had maximum
    # -INT_MAX
    info = np.iinfo(np.int32)
    a = np.full((8, 300), info.min, np.int32)
    a[1::2] = info.max
    mx, mn = pt.build(cuda_nan_kernel("int32"), "cuda")(a)
    np.testing.assert_array_equal(np.asarray(mx), a.max(axis=1))
    np.testing.assert_array_equal(np.asarray(mn), a.min(axis=1))
