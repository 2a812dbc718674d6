"""Loop bounds and iteration domains against NumPy on random data: bounds that are a min or max of
several pieces, data-dependent (CSR) reduction ranges under loop primitives, empty domains and
zero-size tensors."""

import numpy as np

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
