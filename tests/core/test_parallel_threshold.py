"""A parallel loop enters an OpenMP parallel region only when it has enough work for one: none for
a small constant one, an ``if`` clause over the sizes for a symbolic one; results are the same."""

import numpy as np

import polytile as pt
from polytile import ops
from polytile.codegen.cpu import PARALLEL_MIN_WORK, UNKNOWN_TRIPS, parallel_work
from polytile.lowering import loopir as ir


def rows_func(rows, cols: int = 64):
    A = pt.placeholder((rows, cols), "float32", "A")
    B = pt.compute((rows, cols), lambda i, j: A[i, j] * 2.0 + 1.0, "B")
    s = pt.create_schedule(pt.Func([A], [B], name="rows"))
    s[B].parallel("i")
    return s


def parallel_loops(kern) -> list[ir.For]:
    return [s for s in ir.walk_stmt(kern.lowered.body) if isinstance(s, ir.For) and s.kind == "parallel"]


def test_small_parallel_loop_runs_serially(rng):
    kern = pt.build(rows_func(37))
    (loop,) = parallel_loops(kern)
    assert ir.is_const(parallel_work(loop), 37 * 64)
    assert "omp parallel" not in kern.source
    assert f"// serial: about {37 * 64} operations" in kern.source
    a = rng.standard_normal((37, 64)).astype("float32")
    np.testing.assert_allclose(kern(a), 2 * a + 1, rtol=1e-6)


def test_large_parallel_loop_runs_in_parallel(rng):
    rows = PARALLEL_MIN_WORK // 64 + 3
    kern = pt.build(rows_func(rows))
    assert "#pragma omp parallel for schedule(static)\n" in kern.source
    a = rng.standard_normal((rows, 64)).astype("float32")
    np.testing.assert_allclose(kern(a), 2 * a + 1, rtol=1e-6)


def test_symbolic_parallel_loop_decides_at_run_time(rng):
    kern = pt.build(rows_func(pt.param("N")))
    assert f"#pragma omp parallel for schedule(static) if((N * 64) >= {PARALLEL_MIN_WORK})" in kern.source
    for rows in (5, PARALLEL_MIN_WORK // 64 + 7):
        a = rng.standard_normal((rows, 64)).astype("float32")
        np.testing.assert_allclose(kern(a), 2 * a + 1, rtol=1e-6)


def test_inner_extents_unknown_at_the_loop_start_are_guessed(rng):
    """Row lengths read from ``offsets`` inside the parallel loop are not known where it starts."""
    op = ops.segment_sum(rows=41, nnz=300)
    s = pt.create_schedule(op.func)
    s["y"].parallel("i")
    kern = pt.build(s)
    (loop,) = parallel_loops(kern)
    assert f"if((M * {UNKNOWN_TRIPS + 1}) >= {PARALLEL_MIN_WORK})" in kern.source, kern.source
    offsets, x = op.make_inputs(rng)
    np.testing.assert_allclose(kern(offsets, x), op.reference(offsets, x), rtol=1e-5, atol=1e-5)


def test_tiny_operators_enter_no_parallel_region():
    """The issue's examples: an 8x8x8 matmul and a 64x64 softmax."""
    assert "omp parallel" not in ops.matmul(8, 8, 8).build("cpu").source
    assert "omp parallel" not in ops.softmax(64, 64).build("cpu").source
    assert "omp parallel" in ops.matmul(512, 512, 512).build("cpu").source
