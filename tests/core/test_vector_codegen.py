"""Vectorized CPU code for selects, scalar constants, comparisons and bool data: it compiles and agrees
with NumPy, whether the loop became vector code or stayed a scalar loop with a SIMD hint."""

import numpy as np
import pytest
from source_text import body

import polytile as pt
from polytile import ops
from polytile.ops.conv import conv2d_reference

M, N = 5, 64  # N a multiple of every vector width: the full tiles are vectorized


def elementwise(body, dtype="float32", out_dtype=None, write_cache=False, lanes=8):
    """Y[i, j] = body(X[i, j], i, j) with j split by ``lanes`` and vectorized."""
    X = pt.placeholder((M, N), dtype, "X")
    Y = pt.compute((M, N), lambda i, j: body(X[i, j], i, j), "Y")
    s = pt.create_schedule(pt.Func([X], [Y]))
    st = s[Y].split("j", lanes, "jo", "ji")
    if write_cache:
        st.cache_write("jo")
    st.vectorize("ji")
    return pt.build(s, "cpu")


CASES = {
    "step": (lambda x, i, j: (x > 0.0).astype("float32") * 2.0 - 1.0,
             lambda x: (x > 0).astype(np.float64) * 2 - 1),
    "mask_to_int": (lambda x, i, j: (x <= 0.25).astype("int32") + 3, lambda x: (x <= 0.25) + 3),
    "relu_select": (lambda x, i, j: pt.select(x > 0.0, x, 0.0), lambda x: np.where(x > 0, x, 0)),
    "select_constants": (lambda x, i, j: pt.select(x > 0.5, 1.5, -2.0),
                         lambda x: np.where(x > 0.5, 1.5, -2.0)),
    "row_select_constant": (lambda x, i, j: pt.select(i < 2, 0.0, x * 3.0),
                            lambda x: np.where(np.arange(M)[:, None] < 2, 0, x * 3)),
    "clamp": (lambda x, i, j: pt.minimum(pt.maximum(x, -0.5), 0.5), lambda x: np.clip(x, -0.5, 0.5)),
}


@pytest.mark.parametrize("write_cache", [False, True], ids=["direct", "write-cache"])
@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("name", list(CASES))
def test_vector_select_and_comparisons_match_numpy(name, lanes, write_cache, rng):
    body, ref = CASES[name]
    kern = elementwise(body, write_cache=write_cache, lanes=lanes)
    x = rng.uniform(-1, 1, (M, N)).astype("float32")
    np.testing.assert_allclose(kern(x), ref(x.astype(np.float64)), rtol=1e-6, atol=1e-6)


def test_comparison_cast_is_one_not_the_mask(rng):
    """A vector comparison is an integer mask (-1 where true); cast to a number it must be 1."""
    kern = elementwise(lambda x, i, j: (x > 0.0).astype("float32"))
    assert "__builtin_convertvector((-" in body(kern.source)  # the loop was vectorized
    x = rng.uniform(-1, 1, (M, N)).astype("float32")
    np.testing.assert_array_equal(kern(x), (x > 0).astype("float32"))


def test_bool_data_in_a_vectorized_loop(rng):
    """GCC has no bool vectors: loops reading or writing bool buffers stay scalar (with a SIMD hint)."""
    X = pt.placeholder((M, N), "bool", "X")
    Y = pt.compute((M, N), lambda i, j: X[i, j].astype("float32") * 2.0, "Y")
    Z = pt.compute((M, N), lambda i, j: Y[i, j] > 1.0, "Z")
    s = pt.create_schedule(pt.Func([X], [Y, Z]))
    for c in (Y, Z):
        s[c].split("j", 8, "jo", "ji").vectorize("ji")
    kern = pt.build(s, "cpu")
    assert "pt_boolx" not in kern.source and "#pragma omp simd" in body(kern.source)
    x = rng.random((M, N)) > 0.5
    y, z = kern(x)
    np.testing.assert_array_equal(y, x * 2.0)
    np.testing.assert_array_equal(z, x)


@pytest.mark.parametrize("pad_stage", [True, False], ids=["pad-stage", "pad-select"])
@pytest.mark.parametrize("q_tile,order", [(8, ("c", "r", "s")), (16, ("r", "s", "c"))])
def test_conv2d_tuner_style_schedule_with_padding_select(pad_stage, q_tile, order, rng):
    """The CPU tuner's conv2d template (polytile/tune/templates/cpu.py): a k × p × q output tile in a
    write cache over a chosen reduction order, q vectorized, at sizes that divide no tile; the zero
    padding is a select (in its own stage or inside the sum)."""
    op = ops.conv2d(1, 6, 13, 19, 10, 3, 3, padding=1, pad_stage=pad_stage)
    s = pt.create_schedule(op.func)
    st = s["O"].split("k", 4, "ko", "ki").split("p", 2, "po", "pi").split("q", q_tile, "qo", "qi")
    if order != ("c", "r", "s"):
        st.reassociate()
    st.reorder("n", "ko", "po", "qo", *order, "ki", "pi", "qi")
    st.cache("Wt", "ko", layout=lambda kk, cc, rr, ss: (cc, rr, ss, kk))
    st.cache_write("qo").separate("qo")
    st.unroll("ki").unroll("pi").vectorize("qi").parallel("ko")
    kern = pt.build(s, "cpu")
    i, w = op.make_inputs(rng)
    out = kern(i, w)
    ref = conv2d_reference(i, w, 1, 1, 1)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def test_vectorized_math_calls_glibc_vector_functions(tmp_path: object) -> None:
    """exp in a vectorized loop calls libmvec's vector expf (declared `omp declare simd`), not expf per
    element; skipped where glibc has no libmvec."""
    import subprocess

    from polytile.codegen.cpu import _libmvec_functions
    if ("expf", 1) not in _libmvec_functions():
        pytest.skip("this C library has no vector expf (libmvec)")
    X = pt.placeholder((64, 40), "float32", "X")
    Y = pt.compute((64, 40), lambda i, j: pt.exp(X[i, j]) * 2.0, "Y")
    s = pt.create_schedule(pt.Func([X], [Y], name="vexp"))
    s["Y"].split("j", 8, "jo", "jv").vectorize("jv")
    kern = pt.build(s, "cpu")
    assert "#pragma omp declare simd notinbranch\nfloat expf(float);" in kern.source
    symbols = subprocess.run(["nm", "-D", str(kern.path)], capture_output=True, text=True).stdout
    assert "_ZGV" in symbols and "v_expf" in symbols
    x = np.random.default_rng(0).uniform(-3, 3, (64, 40)).astype("float32")
    np.testing.assert_allclose(kern(x), np.exp(x.astype("float64")) * 2, rtol=2e-6)


GUARDED_GATHER = """
import numpy as np, sys
import polytile as pt
A = pt.placeholder((11,), "float64", "A")
C = pt.compute((11, 4), lambda i, j: pt.select(i + 3 * j < 11, A[i + 3 * j], -1.0), "C")
s = pt.create_schedule(pt.Func([A], [C]))
s[C].vectorize("j")
kern = pt.build(s, extra_flags=["-fsanitize=address", "-fno-omit-frame-pointer"])
a = np.random.default_rng(7).standard_normal(11)
ref = np.array([[a[i + 3 * j] if i + 3 * j < 11 else -1.0 for j in range(4)] for i in range(11)])
sys.exit(0 if np.array_equal(kern(a), ref) else 3)
"""


def test_vector_lanes_a_select_discards_read_inside_the_buffer(asan_run):
    """Every lane of a vector select is evaluated: the loads of the lanes whose guard is false must
    not read past the tensor (FINDINGS B6, caught by AddressSanitizer)."""
    proc = asan_run(GUARDED_GATHER)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_parallel_loop_inside_a_vectorize_loop_left_scalar(rng):
    """A triangular inner loop keeps the vectorize loop scalar; it then carries no SIMD hint around
    the parallel loop, which OpenMP forbids (FINDINGS B10: the C++ compiler rejected the code)."""
    A = pt.placeholder((4, 5), "float32", "A")
    C = pt.compute((4, 5), lambda i, j: A[i, j] * 2.0 + 1.0, "C", where=lambda i, j: j <= i)
    s = pt.create_schedule(pt.Func([A], [C]))
    s[C].vectorize("i").parallel("j")
    a = rng.standard_normal((4, 5)).astype(np.float32)
    out = pt.build(s)(a)
    lower = np.arange(5)[None, :] <= np.arange(4)[:, None]
    np.testing.assert_allclose(out[lower], (a * 2 + 1)[lower], rtol=1e-6)


def test_vector_index_arithmetic_mixing_integer_widths(rng):
    """An int32 index read from a buffer times an int64 stride (fuzz seed 7, cases 5015 and 8773): C
    promotes the scalars, but GCC's vector operators take one vector type, so the vectorizer casts."""
    A = pt.placeholder((7, M), "float32", "A")
    idx = pt.placeholder((N,), "int32", "idx", value_range=(0, 6))
    Y = pt.compute((M, N), lambda i, j: A[idx[j], i], "Y")
    s = pt.create_schedule(pt.Func([A, idx], [Y]))
    s[Y].vectorize("j")
    kern = pt.build(s, "cpu")
    assert "__builtin_convertvector(pt_vload<pt_int32x" in body(kern.source)  # the gather was vectorized
    a = rng.uniform(-1, 1, (7, M)).astype("float32")
    ix = rng.integers(0, 7, N).astype("int32")
    np.testing.assert_array_equal(kern(a, ix), a[ix[None, :], np.arange(M)[:, None]])


@pytest.mark.parametrize("dtype", ["float32", "int32", "float16"])
def test_vector_cast_to_bfloat16_rounds_lane_by_lane(dtype, rng):
    """A cast to bfloat16 in a vectorized loop (fuzz seed 7, cases 6893 and 9385) rounds each lane of
    a float32 vector; the scalar rounding helper takes no vector."""
    kern = elementwise(lambda x, i, j: x.astype("bfloat16").astype("float32") * 2.0, dtype=dtype)
    assert "pt_bf16_round_v(" in body(kern.source)
    x = (rng.uniform(-300, 300, (M, N)) if dtype != "int32" else rng.integers(-10**6, 10**6, (M, N))).astype(dtype)
    ref = x.astype(np.float32).astype(pt.bfloat16.numpy).astype(np.float32) * 2
    np.testing.assert_array_equal(kern(x), ref)


@pytest.mark.parametrize("case", ["int32_first_term", "int32_gathered_index"])
def test_guarded_vector_loads_with_int32_indices(case, rng):
    """Lanes a select discards read clamped indices; the clamp's bounds are int64 and the index may
    be an int32 vector: a flattened index whose first term is a load of an int32 array (the sum
    simplified to ``idx[j] + 4 * (i % 2)``, fuzz seed 61 cases 106, 2498), or an index gathered from
    an int32 array (case 3636). GCC's vector operators take one vector type: the code did not compile."""
    A = pt.placeholder((2, 5), "int64", "A")
    idx = pt.placeholder((6,), "int32", "idx", value_range=(0, 4))
    if case == "int32_first_term":
        Y = pt.compute((2, 6), lambda i, j: pt.select(j < i, A[i % 2, idx[j]] * 2, A[0, j % 5]), "Y")
        want = lambda a, ix: np.array([[a[i % 2, ix[j]] * 2 if j < i else a[0, j % 5] for j in range(6)]  # noqa: E731
                                       for i in range(2)])
        loop = "i"
    else:
        R = pt.compute((5,), lambda i: A[1, i] + 1, "R")
        Y = pt.compute((6,), lambda i: pt.select(i % 2 == 0, R[idx[i]], A[0, i % 5]), "Y")
        want = lambda a, ix: np.array([a[1, ix[i]] + 1 if i % 2 == 0 else a[0, i % 5] for i in range(6)])  # noqa: E731
        loop = "i"
    s = pt.create_schedule(pt.Func([A, idx], [Y]))
    if case == "int32_first_term":
        s[Y].reorder("j", "i").vectorize("i")
    else:
        s[Y].split(loop, 2).vectorize("ii")
    a = rng.integers(-9, 9, (2, 5))
    ix = rng.integers(0, 5, 6).astype("int32")
    np.testing.assert_array_equal(pt.build(s)(a, ix), want(a, ix))
