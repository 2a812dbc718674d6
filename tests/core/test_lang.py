"""The algorithm language: expressions, dtypes, functions, and clear errors for malformed programs."""

import numpy as np
import pytest

import polytile as pt


def test_dtypes_and_promotion():
    A = pt.placeholder((4,), "float16", "A")
    B = pt.placeholder((4,), "int32", "B")
    assert (A[0] + 1).dtype == pt.float16
    assert (A[0] + 1.5).dtype == pt.float16
    assert (B[0] + A[0]).dtype == pt.float16
    assert (B[0] + 1).dtype == pt.int32
    assert (B[0] < 3).dtype == pt.bool_
    assert pt.exp(B[0]).dtype == pt.float32
    assert pt.dtypes.as_dtype("bf16") == pt.bfloat16
    assert pt.dtypes.as_dtype(np.float64) == pt.float64


def test_unknown_dtype_is_named():
    with pytest.raises(pt.LanguageError, match="unknown dtype 'float13'"):
        pt.placeholder((4,), "float13")


def test_expression_has_no_truth_value():
    A = pt.placeholder((4,), "float32", "A")
    with pytest.raises(pt.LanguageError, match="pt.select"):
        if A[0] > 1:
            pass


def test_index_count_and_slices():
    A = pt.placeholder((4, 5), "float32", "A")
    with pytest.raises(pt.LanguageError, match="A has 2 dimension"):
        A[1]
    with pytest.raises(pt.LanguageError, match="slice"):
        A[1, 0:3]
    with pytest.raises(pt.LanguageError, match="integers"):
        A[1, 0.5]


def test_integer_true_division_rejected():
    B = pt.placeholder((4,), "int32", "B")
    with pytest.raises(pt.LanguageError, match="use //"):
        B[0] / B[1]


def test_reduce_axis_outside_reduction():
    A = pt.placeholder((8, 8), "float32", "A")
    k = pt.reduce_axis(8, "k")
    C = pt.compute((8,), lambda i: A[i, k] * 2.0, "C")
    with pytest.raises(pt.LanguageError, match="reduce axis k outside a reduction"):
        pt.Func([A], [C])


def test_missing_input_named():
    A = pt.placeholder((8,), "float32", "A")
    B = pt.placeholder((8,), "float32", "B")
    C = pt.compute((8,), lambda i: A[i] + B[i], "C")
    with pytest.raises(pt.LanguageError, match="C reads B, which is not among the inputs"):
        pt.Func([A], [C])


def test_duplicate_tensor_names():
    A = pt.placeholder((8,), "float32", "A")
    C = pt.compute((8,), lambda i: A[i] + 1.0, "A")
    with pytest.raises(pt.LanguageError, match="two tensors are named A"):
        pt.Func([A], [C])


def test_lambda_arity_checked():
    with pytest.raises(pt.LanguageError, match="takes 1 argument"):
        pt.compute((4, 4), lambda i: i, "C")


def test_nested_reduction_becomes_its_own_tensor():
    A = pt.placeholder((8, 8), "float32", "A")
    k = pt.reduce_axis(8, "k")
    C = pt.compute((8,), lambda i: pt.sum(A[i, k], axis=k) * 2.0 + 1.0, "C")
    f = pt.Func([A], [C])
    assert [c.name for c in f.computations] == ["C_red", "C"]


def test_params_collected_and_constraints_checked(rng):
    N = pt.param("N")
    A = pt.placeholder((N,), "float32", "A")
    C = pt.compute((N,), lambda i: A[i] * 3.0, "C")
    f = pt.Func([A], [C], constraints=[N % 4 == 0])
    assert [p.name for p in f.params] == ["N"]
    kern = pt.build(f)
    a = rng.random(8).astype("float32")
    np.testing.assert_allclose(kern(a), a * 3)
    with pytest.raises(pt.InputError, match="constraint"):
        kern(rng.random(6).astype("float32"))


def test_out_of_bounds_read_is_a_clear_error():
    A = pt.placeholder((10,), "float32", "A")
    C = pt.compute((10,), lambda i: A[i + 1], "C")
    with pytest.raises(pt.LanguageError, match=r"C may access A outside its bounds, e.g. A\[10\]"):
        pt.create_schedule(pt.Func([A], [C]))


def test_select_guards_out_of_bounds_reads(rng):
    A = pt.placeholder((10,), "float32", "A")
    C = pt.compute((10,), lambda i: pt.select(i < 9, A[i + 1], 0.0), "C")
    a = rng.random(10).astype("float32")
    out = pt.build(pt.Func([A], [C]))(a)
    np.testing.assert_allclose(out, np.append(a[1:], 0))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "int8", "int16", "int64", "uint8"])
def test_dtypes_end_to_end(dtype, rng):
    A = pt.placeholder((37,), dtype, "A")
    B = pt.placeholder((37,), dtype, "B")
    C = pt.compute((37,), lambda i: pt.maximum(A[i], B[i]) + A[i], "C")
    d = pt.dtypes.as_dtype(dtype)
    a = (rng.integers(1, 5, 37) if d.is_int else rng.uniform(-2, 2, 37)).astype(d.numpy)
    b = (rng.integers(1, 5, 37) if d.is_int else rng.uniform(-2, 2, 37)).astype(d.numpy)
    out = pt.build(pt.Func([A, B], [C]))(a, b)
    ref = (np.maximum(a.astype(np.float64), b.astype(np.float64)) + a.astype(np.float64))
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-2)


def test_math_functions(rng):
    A = pt.placeholder((29,), "float32", "A")
    fns = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs}
    a = rng.uniform(0.1, 2.0, 29).astype("float32")
    for name, ref in fns.items():
        C = pt.compute((29,), lambda i, name=name: pt.call(name, A[i]), "C")
        np.testing.assert_allclose(pt.build(pt.Func([A], [C]))(a), ref(a), rtol=1e-5)
    import math
    C = pt.compute((29,), lambda i: pt.erf(A[i]) + pt.sigmoid(A[i]), "C")
    want = np.array([math.erf(x) + 1 / (1 + math.exp(-x)) for x in a])
    np.testing.assert_allclose(pt.build(pt.Func([A], [C]))(a), want, rtol=1e-5)


def test_bool_and_cast(rng):
    A = pt.placeholder((16,), "float32", "A")
    M = pt.compute((16,), lambda i: (A[i] > 0.5) & ~(A[i] > 0.9), "M")
    C = pt.compute((16,), lambda i: pt.cast("int32", A[i] * 10.0), "C")
    a = rng.uniform(0, 1, 16).astype("float32")
    m, c = pt.build(pt.Func([A], [M, C]))(a)
    np.testing.assert_array_equal(m, (a > 0.5) & ~(a > 0.9))
    np.testing.assert_array_equal(c, (a * np.float32(10)).astype(np.int32))
