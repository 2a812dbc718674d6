"""0-dimensional computations (``pt.compute((), ...)``): scalars and scalar reductions such as a
total sum, read by other computations as ``S[()]``, against NumPy; caches and layouts of a scalar
are refused by the primitive; on a GPU a scalar is a kernel of one block."""

import numpy as np
import pytest

import polytile as pt


def total_and_centered(n):
    A = pt.placeholder((n, 3), "float32", "A")
    i, j = pt.reduce_axis(n, "i"), pt.reduce_axis(3, "j")
    S = pt.compute((), lambda: pt.sum(A[i, j], axis=[i, j]), "S")
    F = pt.compute((), lambda: A[n - 1, 2] * 2.0, "F")
    C = pt.compute((n, 3), lambda r, c: A[r, c] - S[()] + F[()], "C")
    return pt.Func([A], [S, C]), S, F, C


@pytest.mark.parametrize("schedule", ["default", "fused", "inline_parallel"])
def test_scalar_reduction_and_scalar_read_by_a_consumer(schedule, rng):
    f, S, F, C = total_and_centered(7)
    s = pt.create_schedule(f)
    if schedule == "fused":
        s[C].after(s[F], None)
    elif schedule == "inline_parallel":
        s[F].compute_inline()
        s[C].parallel("r")
    a = rng.standard_normal((7, 3)).astype("float32")
    total = np.array(rng.standard_normal(), np.float32)  # a caller's 0-d output array
    centered = np.empty((7, 3), np.float32)
    pt.build(s)(a, total, centered)
    np.testing.assert_allclose(total, a.sum(), rtol=1e-5)
    np.testing.assert_allclose(centered, a - a.sum() + a[6, 2] * 2, rtol=1e-5, atol=1e-5)


def test_scalar_max_over_a_parameter_size_and_an_empty_input(rng):
    N = pt.param("N")
    B = pt.placeholder((N,), "int32", "B")
    k = pt.reduce_axis(N, "k")
    M = pt.compute((), lambda: pt.max(B[k], axis=k), "M", where=lambda: N > 1)
    kern = pt.build(pt.Func([B], [M]))
    b = rng.integers(-1000, 1000, size=9).astype(np.int32)
    assert kern(b) == b.max()
    out = np.array(17, np.int32)
    kern(b[:1], out)
    assert out == 17  # where= fails: not written


@pytest.mark.parametrize("stored", ["float16", "bfloat16"])
def test_a_scalar_sum_stored_narrower_sums_in_its_own_type(stored):
    """Independent fuzzer, seed 11 case 72: a 0-d reduction with ``store_dtype`` was refused at the
    build (the write cache the lowering adds for narrowed sums is no buffer for a scalar), and summed
    in the narrow type without it (3072 ones gave 2048 in float16)."""
    A = pt.placeholder((3072,), "float32", "A")
    k = pt.reduce_axis(3072, "k")
    S = pt.compute((), lambda: pt.sum(A[k], axis=k), "S", store_dtype=stored)
    T = pt.compute((2,), lambda i: S[()] * 2.0, "T")
    s = pt.create_schedule(pt.Func([A], [S, T]))
    total, twice = pt.build(s)(np.ones(3072, np.float32))  # a float16 sum of ones stops at 2048
    assert str(total.dtype) == stored and float(total) == 3072.0
    np.testing.assert_array_equal(np.asarray(twice, np.float32), [6144.0, 6144.0])


def test_buffers_of_a_scalar_are_refused_at_the_primitive():
    f, S, F, C = total_and_centered(5)
    s = pt.create_schedule(f)
    for primitive in (lambda: s[S].cache_write(), lambda: s[C].cache_identity(F, "r"),
                      lambda: s[F].store(lambda: (0,))):
        with pytest.raises(pt.ScheduleError, match=r"is a scalar \(0-d\)"):
            primitive()
        assert s.caches == [] and s.states["F"].store_layout is None


def gpu_sum(n):
    A = pt.placeholder((n,), "float32", "A")
    k = pt.reduce_axis(n, "k")
    S = pt.compute((), lambda: pt.sum(A[k], axis=k), "S")
    T = pt.compute((), lambda: A[3] * 2.0, "T")
    s = pt.create_schedule(pt.Func([A], [S, T]))
    s[S].reassociate().split("k", 128, "ko", "kt").reorder("kt", "ko").bind("kt", "threadIdx.x")
    return s


@pytest.mark.needs_nvcc
def test_scalars_compile_for_a_gpu():
    kern = pt.build(gpu_sum(300), "cuda:sm_80")
    assert kern.cubin[:4] == b"\x7fELF" and "pt_block_allreduce_sum" in kern.source


@pytest.mark.gpu
def test_scalars_on_a_gpu(rng):
    a = rng.standard_normal(300).astype("float32")
    total, twice = pt.build(gpu_sum(300), "cuda")(a)
    np.testing.assert_allclose(np.asarray(total), a.sum(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(twice), a[3] * 2, rtol=1e-6)
