"""The fuzzer's NumPy reference against hand-written NumPy: CSR segment sums, triangular and empty
reductions, integer division and casts, where= domains, float16 tolerances and invalid programs."""

import numpy as np
import pytest

import polytile as pt
from polytile.fuzz import inputs, reference


def test_csr_segment_sum_with_where(rng):
    rows, nnz = 6, 17
    offs = pt.placeholder((rows + 1,), "int32", "offs", value_range=(0, nnz), monotonic=True)
    vals = pt.placeholder((nnz,), "float32", "vals")

    def seg(i):
        k = pt.reduce_axis((offs[i], offs[i + 1]), "k")
        return pt.sum(vals[k] * 2.0, axis=k, where=k % 2 == 0)

    T = pt.compute((rows,), seg, "T")
    o = np.sort(rng.integers(0, nnz + 1, rows + 1)).astype(np.int32)
    v = rng.uniform(-2, 2, nnz).astype(np.float32)
    ref = reference.evaluate(pt.Func([offs, vals], [T]), [o, v])["T"]
    want = [sum(2.0 * float(v[k]) for k in range(o[i], o[i + 1]) if k % 2 == 0) for i in range(rows)]
    np.testing.assert_allclose(ref.value, want, rtol=1e-12)
    terms = np.array([sum(k % 2 == 0 for k in range(o[i], o[i + 1])) for i in range(rows)])
    assert (ref.err[terms > 0] > 0).all() and (ref.err < 1e-5).all()  # float32 rounding of a few terms
    assert (ref.err[terms == 0] == 0).all()  # an empty sum is exactly 0


def test_triangular_and_empty_max_reduction(rng):
    n = 7
    A = pt.placeholder((n,), "float64", "A")

    def body(i):
        k = pt.reduce_axis((0, i), "k")  # empty for i = 0
        return pt.max(A[k], axis=k)

    T = pt.compute((n,), body, "T")
    a = rng.uniform(-2, 2, n)
    ref = reference.evaluate(pt.Func([A], [T]), [a])["T"].value
    assert ref[0] == -np.inf
    np.testing.assert_array_equal(ref[1:], [a[:i].max() for i in range(1, n)])


def test_integer_division_floors_and_by_zero_is_the_single_rule():
    X = pt.placeholder((5,), "int32", "X")
    Z = pt.placeholder((5,), "int32", "Z")
    Q = pt.compute((5,), lambda i: X[i] // Z[i], "Q")
    R = pt.compute((5,), lambda i: X[i] % Z[i], "R")
    x = np.array([7, -7, 7, -7, 5], np.int32)
    z = np.array([2, 2, -2, -2, 0], np.int32)
    out = reference.evaluate(pt.Func([X, Z], [Q, R]), [x, z])
    np.testing.assert_array_equal(out["Q"].value, [3, -4, -4, 3, 0])
    np.testing.assert_array_equal(out["R"].value, [1, 1, -1, -1, 0])
    np.testing.assert_array_equal(reference.int_divide(np.array([9]), np.array([0]), "//"), [0])


def test_casts_truncate_and_wrap():
    A = pt.placeholder((4,), "float32", "A")
    B = pt.placeholder((4,), "int32", "B")
    T = pt.compute((4,), lambda i: pt.cast("int32", A[i]), "T")
    U = pt.compute((4,), lambda i: pt.cast("int8", B[i]), "U")
    a = np.array([1.75, -1.75, 2.5, -0.25], np.float32)
    b = np.array([127, 128, -129, 300], np.int32)
    out = reference.evaluate(pt.Func([A, B], [T, U]), [a, b])
    np.testing.assert_array_equal(out["T"].value, [1, -1, 2, 0])
    np.testing.assert_array_equal(out["U"].value, b.astype(np.int8))


def test_where_domain_keeps_the_sentinel_outside(rng):
    A = pt.placeholder((4, 4), "float32", "A")
    T = pt.compute((4, 4), lambda i, j: A[i, j] + 1.0, "T", where=lambda i, j: j <= i)
    func = pt.Func([A], [T])
    a = rng.uniform(-2, 2, (4, 4)).astype(np.float32)
    out = np.full((4, 4), inputs.SENTINEL, np.float32)
    out[np.tril_indices(4)] = (a + 1)[np.tril_indices(4)]
    assert reference.differences(func, [a], [out]) == []
    out[0, 3] = 0.0  # written outside the domain
    (problem,) = reference.differences(func, [a], [out])
    assert "(0, 3): got 0.0, expected 99" in problem


def test_float16_sum_within_its_rounding_and_not_beyond(rng):
    n = 40
    A = pt.placeholder((3, n), "float16", "A")
    k = pt.reduce_axis(n, "k")
    T = pt.compute((3,), lambda i: pt.sum(A[i, k], axis=k), "T")
    func = pt.Func([A], [T])
    a = rng.uniform(0.5, 2, (3, n)).astype(np.float16)
    acc = np.zeros(3, np.float16)  # what a float16 accumulator computes, in order
    for j in range(n):
        acc = (acc + a[:, j]).astype(np.float16)
    assert reference.differences(func, [a], [acc]) == []
    assert reference.differences(func, [a], [(acc + np.float16(4.0)).astype(np.float16)]) != []


def test_uncertain_comparisons_are_not_compared():
    A = pt.placeholder((2,), "float32", "A")
    T = pt.compute((2,), lambda i: pt.select(A[i] * 3.0 > 1.0, 1, 0), "T")
    a = np.array([np.float32(1 / 3), 2.0], np.float32)  # 3 * a[0] rounds to 1 or just above
    ref = reference.evaluate(pt.Func([A], [T]), [a])["T"]
    assert np.isinf(ref.err[0]) and ref.err[1] == 0


def test_integer_overflow_wraps_as_numpy():
    A = pt.placeholder((4,), "int8", "A")
    B = pt.placeholder((4,), "int32", "B")
    k = pt.reduce_axis(4, "k")
    T = pt.compute((4,), lambda i: A[i] * A[i], "T")
    S = pt.compute((), lambda: pt.sum(B[k] * 3, axis=k), "S")
    a, b = np.array([1, 2, 12, -128], np.int8), np.full(4, 2 ** 30, np.int32)
    ref = reference.evaluate(pt.Func([A, B], [T, S]), [a, b])
    assert ref["T"].value.tolist() == (a * a).tolist()  # 144 wraps to -112, (-128)^2 to 0
    assert ref["S"].value == (b * np.int32(3)).sum(dtype=np.int32)


def test_nan_inputs_must_stay_nan_where_numpy_has_them():
    A = pt.placeholder((2, 3), "float32", "A")
    k = pt.reduce_axis(3, "k")
    T = pt.compute((2,), lambda i: pt.max(A[i, k], axis=k), "T")
    func = pt.Func([A], [T])
    a = np.array([[np.nan, 1.0, 2.0], [0.0, 1.0, 2.0]], np.float32)
    assert reference.differences(func, [a], [np.array([np.nan, 2.0], np.float32)]) == []
    assert reference.differences(func, [a], [np.array([2.0, 2.0], np.float32)]) != []  # a dropped NaN
    assert reference.differences(func, [a], [np.array([np.nan, np.nan], np.float32)]) != []


def test_invalid_programs_are_reported():
    A = pt.placeholder((4,), "float16", "A")
    T = pt.compute((4,), lambda i: A[i] * 1000.0, "T")
    with pytest.raises(reference.InvalidProgram, match="overflows float16"):
        reference.evaluate(pt.Func([A], [T]), [np.array([1, 2, 300, 3], np.float16)])
    idx = pt.placeholder((2,), "int32", "idx")
    B = pt.placeholder((3,), "float32", "B")
    U = pt.compute((2,), lambda i: B[idx[i]], "U")
    with pytest.raises(reference.InvalidProgram, match="index 0 is 5"):
        reference.evaluate(pt.Func([B, idx], [U]), [np.ones(3, np.float32), np.array([0, 5], np.int32)])


def test_unwritten_boolean_outputs_keep_the_sentinel():
    A = pt.placeholder((3,), "float32", "A")
    T = pt.compute((3,), lambda i: A[i] > 0.0, "T", where=lambda i: i >= 1)
    a = np.array([1.0, -1.0, 2.0], np.float32)
    out = np.full(3, inputs.SENTINEL, bool)  # True
    out[1:] = [False, True]
    assert reference.differences(pt.Func([A], [T]), [a], [out]) == []
    out[0] = False
    assert reference.differences(pt.Func([A], [T]), [a], [out]) != []


def test_a_zero_from_exact_operands_is_exact():
    # fuzz seed 7 case 1075: floor(0.0 - 0.0) was undecidable (the subtraction's rounding bound was
    # the type's smallest subnormal), so a where= predicate downstream was unknown, and a wrong sum
    # passed within the bound of its unknown terms
    A = pt.placeholder((4,), "bfloat16", "A")
    T = pt.compute((4,), lambda i: pt.floor(0.0 - pt.select(i >= 4, A[i], 0.0)), "T")
    V = pt.compute((4,), lambda i: T[i] + A[i], "V")

    def f_W(i):
        k = pt.reduce_axis((0, 4), "k")
        return pt.sum(pt.cast("float32", A[k]), axis=k, where=pt.cast("float32", V[i]) * A[k] > 0.0)

    W = pt.compute((4,), f_W, "W", dtype="float32")
    func = pt.Func([A], [W])
    a = np.array([0.5, 1.25, 2.0, 0.75], dtype=pt.bfloat16.numpy)
    assert (reference.evaluate(func, [a])["T"].err == 0).all()
    total = np.float32(a.astype(np.float32).sum())
    assert reference.differences(func, [a], [np.full(4, total, np.float32)]) == []
    assert reference.differences(func, [a], [np.zeros(4, np.float32)]) != []


def test_a_product_with_an_exact_zero_factor_is_exactly_zero():
    # fuzz seed 7 case 1075: 0.0 times a factor of unknown bound gave the bound 0 * inf = NaN,
    # which compared as exact
    B = pt.placeholder((2,), "float32", "B")
    F = pt.compute((2,), lambda i: pt.floor(B[i] * 3.0), "F")  # 3 * (1/3) rounds to 1 or just below

    def f_P(i):
        k = pt.reduce_axis((0, 2), "k")
        return pt.prod(pt.select(k < 1, F[k], 0.0), axis=k) + 1.0

    P = pt.compute((2,), f_P, "P")
    b = np.full(2, 1 / 3, np.float32)
    out = reference.evaluate(pt.Func([B], [P]), [b])
    assert np.isinf(out["F"].err).all()
    np.testing.assert_array_equal(out["P"].value, [1.0, 1.0])
    assert (out["P"].err < 1e-6).all()  # the rounding of 0 + 1, not NaN


def test_an_undecided_select_next_to_a_nan_sum_is_unknown_not_exact():
    # seed 143 cases 892 and 1431: a select whose condition NaN leaves undecided (a cast of NaN to
    # int) took the bound of a sum over a NaN (NaN) and read as exact, so the other branch rounded
    # once in float32 (or float16) was called wrong
    A = pt.placeholder((3,), "float32", "A")
    k = pt.reduce_axis(3, "k")
    S = pt.compute((1,), lambda i: pt.sum(A[k], axis=k), "S")
    T = pt.compute((1,), lambda i: pt.select(pt.cast("int32", A[0]) > 1, S[i], A[1] * 3.0), "T")
    func = pt.Func([A], [T])
    a = np.array([np.nan, 1 / 3, 1.0], np.float32)
    ref = reference.evaluate(func, [a])
    assert np.isnan(ref["S"].value[0]) and ref["S"].err[0] == 0  # exactly NaN
    assert np.isinf(ref["T"].err[0])
    assert reference.differences(func, [a], [a[1:2] * np.float32(3.0)]) == []  # the product in float32
    assert reference.differences(func, [a], [np.array([np.nan], np.float32)]) == []  # the NaN sum


def _maybe_nan_sum():
    """A sum with a NaN term that its where= may or may not keep: ``int32(NaN)`` is unknown to the
    reference (NumPy gives INT_MIN, so the term is kept and the sum is NaN)."""
    A = pt.placeholder((3,), "float32", "A")

    def f_S(i):
        k = pt.reduce_axis((0, 3), "k")
        return pt.sum(A[k], axis=k, where=pt.cast("int32", A[k]) <= 4)

    return A, pt.compute((1,), f_S, "S"), np.array([1.0, np.nan, 2.0], np.float32)


def test_a_sum_that_may_keep_a_nan_term_is_unknown():
    # fuzz seed 143 cases 4350, 3482, 9270: the unknown term's size |NaN| made the bound NaN, which
    # compared as a number, so the kernel's right NaN (NumPy's) was reported as a miscompile
    A, S, a = _maybe_nan_sum()
    func = pt.Func([A], [S])
    assert np.isinf(reference.evaluate(func, [a])["S"].err).all()
    assert reference.differences(func, [a], [np.array([np.nan], np.float32)]) == []
    assert reference.differences(func, [a], [np.array([3.0], np.float32)]) == []


def test_zero_times_a_value_that_may_be_nan_is_unknown():
    # fuzz seed 143 case 855: 0 * (a sum that may be NaN) was exactly 0 (0 times an unknown bound),
    # but 0 * NaN is NaN; so also a product with an exact 0 factor and a factor that may be NaN
    A, S, a = _maybe_nan_sum()
    Z = pt.compute((1,), lambda i: S[i] * (A[0] - A[0]), "Z")

    def f_P(i):
        k = pt.reduce_axis((0, 2), "k")
        return pt.prod(pt.select(k < 1, S[i], 0.0), axis=k)

    P = pt.compute((1,), f_P, "P")
    func = pt.Func([A], [Z, P])
    nan = np.array([np.nan], np.float32)
    assert reference.differences(func, [a], [nan, nan]) == []
    zero = np.zeros(1, np.float32)
    assert reference.differences(func, [a], [zero, zero]) == []
