"""Loop bounds and iteration domains against NumPy on random data: bounds that are a min or max of
several pieces, data-dependent (CSR) reduction ranges under loop primitives, empty domains and
zero-size tensors."""

import numpy as np
import pytest

import polytile as pt


def test_min_bound_of_three_pieces_default_schedule(rng):
    # k < min(h + 1, 3) and k <= j: isl bounds k by min(2, j, h), three operands
    A = pt.placeholder((3,), "int32", "A")

    def body(j, h):
        k = pt.reduce_axis((0, pt.minimum(h + 1, 3)), "k")
        return pt.sum(A[k], axis=k, where=k <= j)

    T = pt.compute((4, 5), body, "T")
    a = rng.integers(1, 1000, size=3).astype(np.int32)
    ref = np.array([[a[:min(h + 1, 3, j + 1)].sum() for h in range(5)] for j in range(4)])
    np.testing.assert_array_equal(pt.build(pt.Func([A], [T]))(a), ref)


def test_skewed_tiled_matmul_bounds(rng):
    # tiling a skewed domain gives bounds with min(min(1, -2 * c3), -2 * c1 - 2 * c3 - c5 + 3)
    M, N, K = 5, 4, 1
    X = pt.placeholder((M, K), "int32", "X")
    Y = pt.placeholder((K, N), "int32", "Y")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(X[i, k] * Y[k, j], axis=k), "C")
    s = pt.create_schedule(pt.Func([X, Y], [C]))
    s[C].apply_sch("{ [i, j, k] -> [i + j, -i, k] }", ["a", "b", "c"])
    s[C].tile("a", "b", 2, 2)
    x = rng.integers(-50, 50, size=(M, K)).astype(np.int32)
    y = rng.integers(-50, 50, size=(K, N)).astype(np.int32)
    np.testing.assert_array_equal(pt.build(s)(x, y), x @ y)


EMPTY_SCHEDULES = {
    "default": lambda s, T: None,
    "cache_write": lambda s, T: s[T].cache_write(None),
    "split_parallel": lambda s, T: s[T].split("i", 2).parallel("io"),
    "fuse": lambda s, T: s[T].fuse("i", "j"),
    "tile_cache_write": lambda s, T: s[T].tile("i", "j", 2, 2).cache_write("io"),
}


@pytest.mark.parametrize("schedule", sorted(EMPTY_SCHEDULES))
def test_where_that_never_holds_computes_nothing(schedule, rng):
    A = pt.placeholder((3, 4), "float32", "A")
    T = pt.compute((3, 4), lambda i, j: A[i, j] * 2.0, "T", where=lambda i, j: i + j > 9)
    s = pt.create_schedule(pt.Func([A], [T]))
    EMPTY_SCHEDULES[schedule](s, T)
    kern = pt.build(s)
    np.testing.assert_array_equal(kern(rng.standard_normal((3, 4)).astype("float32")), np.zeros((3, 4)))
    out = rng.standard_normal((3, 4)).astype("float32")
    before = out.copy()
    kern(rng.standard_normal((3, 4)).astype("float32"), out)
    np.testing.assert_array_equal(out, before)  # no point is written


@pytest.mark.parametrize("schedule", sorted(EMPTY_SCHEDULES))
@pytest.mark.parametrize("shape", [(0, 5), (4, 0), (0, 0)])
def test_zero_size_tensors(shape, schedule, rng):
    A = pt.placeholder(shape, "float32", "A")
    T = pt.compute(shape, lambda i, j: A[i, j] * 2.0 + 1.0, "T")
    k = pt.reduce_axis(shape[1], "k")
    U = pt.compute((shape[0],), lambda i: pt.sum(T[i, k], axis=k), "U")
    V = pt.compute(shape, lambda i, j: T[i, j] - U[i], "V")
    s = pt.create_schedule(pt.Func([A], [U, V]))
    EMPTY_SCHEDULES[schedule](s, T)
    a = rng.standard_normal(shape).astype("float32")
    u, v = pt.build(s)(a)
    t = a * 2 + 1
    assert u.shape == (shape[0],) and v.shape == shape
    np.testing.assert_allclose(u, t.sum(1), rtol=1e-5)
    np.testing.assert_allclose(v, t - t.sum(1)[:, None], rtol=1e-5)


@pytest.mark.parametrize("op,identity", [("sum", 0.0), ("prod", 1.0), ("max", -np.inf), ("min", np.inf)])
def test_reductions_empty_everywhere_give_the_identity(op, identity, rng):
    A = pt.placeholder((4, 6), "float32", "A")
    B = pt.placeholder((4, 0), "float32", "B")

    def triangle(i, j):
        k = pt.reduce_axis((0, j), "k")  # k < j and k >= j: empty for every (i, j)
        return getattr(pt, op)(A[i, k], axis=k, where=k >= j)

    T = pt.compute((4, 6), triangle, "T")
    kz = pt.reduce_axis(0, "kz")
    Z = pt.compute((4,), lambda i: getattr(pt, op)(B[i, kz], axis=kz), "Z")
    s = pt.create_schedule(pt.Func([A, B], [T, Z]))
    s[T].split("j", 4)
    t, z = pt.build(s)(rng.standard_normal((4, 6)).astype("float32"), np.zeros((4, 0), "float32"))
    np.testing.assert_array_equal(t, np.full((4, 6), identity, "float32"))
    np.testing.assert_array_equal(z, np.full(4, identity, "float32"))
