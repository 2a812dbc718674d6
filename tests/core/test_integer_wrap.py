"""32- and 64-bit integer ``+ - *`` (and negation, ``0 - x``) wrap as NumPy's do (two's
complement), on CPUs and GPUs: the generated code computes them on unsigned types (``pt_wadd``,
``pt_wsub``, ``pt_wmul``), where C leaves a signed overflow undefined; index arithmetic stays
plain. Constant folding wraps alike. (Independent fuzzer's open finding: int overflow was UB.)"""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import polytile as pt
from polytile.dtypes import as_dtype
from polytile.lowering import loopir as ir
from polytile.lowering.passes.simplify import simplify_expr

N = 37


def overflowing(dtype, rng):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=N, endpoint=True).astype(dtype)
    b = rng.integers(info.min, info.max, size=N, endpoint=True).astype(dtype)
    a[:4] = [info.max, info.min, info.max, info.min]
    b[:4] = [1, -1, info.max, info.min]
    return a, b


def wrapping_func(dtype):
    A = pt.placeholder((N,), dtype, "A")
    B = pt.placeholder((N,), dtype, "B")
    k = pt.reduce_axis(N, "k")
    C = pt.compute((N,), lambda i: A[i] * B[i] + A[i] - B[i] * 3 + (-A[i]) * 5 + pt.select(A[i] + B[i] > 0, 1, 2),
                   "C")
    S = pt.compute((), lambda: pt.sum(A[k] * B[k] + 7, axis=k), "S")
    return pt.Func([A, B], [C, S]), C, S


def numpy_wrapping(a, b):
    t = a.dtype.type
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = a * b + a - b * t(3) + (-a) * t(5) + np.where(a + b > 0, t(1), t(2))
        return c, (a * b + t(7)).sum(dtype=a.dtype)


@pytest.mark.parametrize("vectorize", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_overflow_wraps_like_numpy(dtype, vectorize, rng):
    f, C, S = wrapping_func(dtype)
    s = pt.create_schedule(f)
    if vectorize:
        s[C].split("i", 8).vectorize("ii")
    a, b = overflowing(dtype, rng)
    c, total = pt.build(s)(a, b)
    want_c, want_total = numpy_wrapping(a, b)
    np.testing.assert_array_equal(c, want_c)
    assert total == want_total


UNDER_SANITIZER = """
import numpy as np, polytile as pt, sys
sys.path.insert(0, {tests!r})
from test_integer_wrap import wrapping_func, overflowing, numpy_wrapping
for dtype in ("int32", "int64"):
    f, C, S = wrapping_func(dtype)
    s = pt.create_schedule(f)
    s[C].split("i", 8).vectorize("ii")
    kern = pt.build(s, extra_flags=["-fsanitize=signed-integer-overflow", "-fno-sanitize-recover=all"])
    a, b = overflowing(dtype, np.random.default_rng(0))
    c, total = kern(a, b)
    want_c, want_total = numpy_wrapping(a, b)
    assert (c == want_c).all() and total == want_total
print("ok")
"""


def test_overflow_is_not_undefined_behaviour(tmp_path):
    """The sanitizer of signed overflow stops a kernel whose arithmetic overflows as C's int does
    (it fails on ``(a * b)`` of int32 written as plain C)."""
    env = {**os.environ, "POLYTILE_CACHE_DIR": str(tmp_path)}
    script = UNDER_SANITIZER.format(tests=os.path.dirname(__file__))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr[-3000:]


def test_index_arithmetic_stays_plain():
    A = pt.placeholder((64,), "int32", "A")
    C = pt.compute((60,), lambda i: A[i * 2 // 3 + 3] * 2, "C")
    body = pt.build(pt.Func([A], [C])).source.split("func_impl(")[1]
    assert "pt_wmul(A[" in body and "pt_wadd" not in body  # the index (i * 2 // 3 + 3) is not wrapped


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8"])
def test_folded_constants_wrap(dtype):
    d = as_dtype(dtype)
    info = np.iinfo(dtype)
    e = simplify_expr(ir.BinOp("+", ir.Const(int(info.max), d), ir.Const(1, d)))
    assert isinstance(e, ir.Const) and e.value == info.min
    e = simplify_expr(ir.BinOp("*", ir.Const(int(info.min), d), ir.Const(-1, d)))
    assert isinstance(e, ir.Const) and e.value == info.min


def cuda_wrapping_schedule():
    f, C, S = wrapping_func("int32")
    s = pt.create_schedule(f)
    s[C].split("i", 32).bind("io", "blockIdx.x").bind("ii", "threadIdx.x")
    return s


@pytest.mark.needs_nvcc
def test_cuda_wrapping_helpers_compile():
    kern = pt.build(cuda_wrapping_schedule(), "cuda:sm_80")
    assert kern.cubin[:4] == b"\x7fELF"
    assert "pt_wmul(__ldg(&A[" in kern.source and "pt_wsub(0, __ldg(&A[" in kern.source


@pytest.mark.gpu
def test_cuda_overflow_wraps_like_numpy(rng):
    a, b = overflowing("int32", rng)
    c, total = pt.build(cuda_wrapping_schedule(), "cuda")(a, b)
    want_c, want_total = numpy_wrapping(a, b)
    np.testing.assert_array_equal(np.asarray(c), want_c)
    assert np.asarray(total) == want_total



@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "uint8"])
def test_narrow_iterator_arithmetic_in_a_domain_wraps_like_numpy(dtype):
    """Project fuzzer seed 141 case 278: ``where=int8(j) * 17 <= 0`` over iterators went to isl,
    which computes exactly (136 > 0 at j = 8), where NumPy's int8 arithmetic (and the same
    expression in a body) wraps (-120 <= 0). Narrow arithmetic of iterators is now computed at run
    time, where it wraps; a narrow constant is folded wrapped."""
    n = 24
    bits = np.iinfo(dtype).bits
    scale = (1 << bits) // 32 + 1  # j * scale passes the type's maximum (or its wrap) at j ≈ 16 (or 32)
    A = pt.placeholder((n,), "int64", "A")
    W = pt.compute((n,), lambda j: A[j] + 1, "W", where=lambda j: pt.cast(dtype, j) * scale < 64)
    V = pt.compute((n,), lambda j: A[j] + 2, "V", where=lambda j: j < pt.cast("int64", pt.cast(dtype, 1 << bits) + 5))
    U = pt.compute((n,), lambda j: pt.cast(dtype, j) * scale + A[j] * 0, "U")  # the same value in a body
    a = np.arange(n, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        narrow = np.arange(n).astype(dtype) * np.array(scale).astype(dtype)
    w, v, u = np.full(n, 99, np.int64), np.full(n, 99, np.int64), np.full(n, 99, np.int64)
    pt.build(pt.Func([A], [W, V, U]))(a, w, v, u)
    np.testing.assert_array_equal(w, np.where(narrow < 64, a + 1, 99))
    np.testing.assert_array_equal(v, np.where(a < 5, a + 2, 99))
    np.testing.assert_array_equal(u, narrow)
