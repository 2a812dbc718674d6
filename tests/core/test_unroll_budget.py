"""``unroll`` copies a loop's body; copies of a body that holds loops (a data-dependent reduction, a
cache's copy loops) are refused beyond a budget at the primitive that exceeds it, leaving the schedule
as it was: past it, the C compiler ran for minutes (independent fuzzer seed 7, case 3189)."""

import numpy as np
import pytest
from test_transactions import refused

import polytile as pt
from polytile.schedule.unrolling import MAX_UNROLLED_LOOPS


def test_unrolling_two_loops_around_a_data_dependent_reduction_is_refused():
    # independent fuzzer seed 7, case 3189: 16 × 31 copies of the reduction loop k2 and of the copy
    # loops of a cache of B1 inside it made g++ run for over three minutes
    B1 = pt.placeholder((16, 17), "float32", "B1")
    off3 = pt.placeholder((18,), "int64", "off3", value_range=(0, 2), monotonic=True)

    def D4_fn(z, n_, y):
        k2 = pt.reduce_axis((off3[n_], off3[n_ + 1]), "k2")
        return pt.max(pt.select(B1[k2, y // 2] < B1[k2, 16 - k2], B1[k2 % 16, 16 - z] * B1[k2 // 2, n_ % 17],
                                B1[z, 8] * pt.cast("float32", z)), axis=[k2])
    D4 = pt.compute((16, 17, 31), D4_fn, "D4")
    s = pt.create_schedule(pt.Func([B1, off3], [D4]))
    s[D4].unroll("y")
    s[D4].shift("k2", 2)
    s[D4].cache_identity(B1, "k2")
    refused(s, lambda: s[D4].unroll("z"),
            rf"unrolling loops z, y of D4 makes .*496 copies of loop k2, 496 copies of the 2 copy loops of cache "
            rf"B1_D4_local: 1504 loops in all, over the budget of {MAX_UNROLLED_LOOPS}; unroll fewer or shorter loops")
    assert s[D4].state.tags == {"y": "unroll"}


def csr_rows(width):
    vals = pt.placeholder((40, width), "float32", "vals")
    off = pt.placeholder((9,), "int32", "off", value_range=(0, 40), monotonic=True)

    def f(i, y):
        k = pt.reduce_axis((off[i], off[i + 1]), "k")
        return pt.sum(vals[k, y], axis=k)
    R = pt.compute((8, width), f, "R")
    return pt.Func([vals, off], [R]), vals, R


def test_a_cache_inside_unrolled_loops_counts_its_copy_loops(rng):
    func, vals, R = csr_rows(50)
    s = pt.create_schedule(func)
    s[R].unroll("y")  # 50 copies of loop k: within the budget
    refused(s, lambda: s[R].cache_identity(vals, "k"),
            r"unrolling loop y of R makes 50 copies of loop k, 50 copies of the 2 copy loops of cache vals_R_local: "
            rf"150 loops in all, over the budget of {MAX_UNROLLED_LOOPS}")
    assert s.caches == []
    v = rng.standard_normal((40, 50)).astype("float32")
    o = np.array([0, 3, 3, 10, 17, 25, 30, 39, 40], "int32")
    expect = np.stack([v[o[i]:o[i + 1]].sum(0) for i in range(8)])
    np.testing.assert_allclose(pt.build(s)(v, o), expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("first, second", [("i", "y"), ("y", "i")])
def test_the_unroll_that_exceeds_the_budget_is_refused(first, second):
    func, vals, R = csr_rows(20)
    s = pt.create_schedule(func)
    s[R].unroll(first)
    refused(s, lambda: s[R].unroll(second),
            rf"unrolling loops i, y of R makes 160 copies of loop k: 160 loops in all, "
            rf"over the budget of {MAX_UNROLLED_LOOPS}")


def test_the_write_cache_of_a_narrowed_reduction_counts_before_lowering_adds_it(rng):
    # independent fuzzer seed 21, case 8345: a reduction stored as float16 gets its write cache
    # S_local (3 copy loops) at the build; unroll("m") was accepted counting 96 loops and the build
    # refused 192. The primitive counts the cache lowering will add and is refused.
    X = pt.placeholder((32, 32), "float32", "X")

    def S_fn(h, m, l):
        k4 = pt.reduce_axis(13, "k4")
        k5 = pt.reduce_axis(13, "k5")
        return pt.sum(X[k5 // 2, k5 // 2] - X[m, k5], axis=[k4, k5])
    S = pt.compute((32, 32, 32), S_fn, "S", store_dtype="float16")
    s = pt.create_schedule(pt.Func([X], [S]))
    refused(s, lambda: s[S].unroll("m"),
            r"unrolling loop m of S makes 32 copies of loop l, 32 copies of loop k4, 32 copies of loop k5, "
            rf"32 copies of the 3 copy loops of cache S_local: 192 loops in all, over the budget of "
            rf"{MAX_UNROLLED_LOOPS}")
    s[S].unroll("k5")  # no loop inside: the cache sits outside it, at l
    x = rng.standard_normal((32, 32)).astype("float32")
    ref = 13 * (np.diagonal(x)[np.arange(13) // 2].sum() - x[:, :13].sum(1))
    np.testing.assert_allclose(pt.build(s)(x)[0, :, 0], ref.astype("float16"), rtol=2e-3, atol=2e-2)
