"""The CPU call path: the signature cache (what misses, what hits), outputs that overlap an input,
index-array checks in C, and the arrays a call takes (read-only, empty, strided, bfloat16)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import polytile as pt
from polytile import ops


def scale_func():
    N, M = pt.param("N"), pt.param("M")
    A = pt.placeholder((N, M), "float32", "A")
    B = pt.compute((N, M), lambda i, j: A[i, j] * 2.0, "B")
    return pt.Func([A], [B], name="scale")


def two_outputs_func():
    N = pt.param("N")
    A = pt.placeholder((N,), "float32", "A")
    B = pt.compute((N,), lambda i: A[i] + 1.0, "B")
    C = pt.compute((N,), lambda i: A[i] * 3.0, "C")
    return pt.Func([A], [B, C], name="two")


def test_signature_cache_misses_only_on_a_new_signature(rng):
    kern = pt.build(scale_func())
    a = rng.standard_normal((5, 7)).astype("float32")
    np.testing.assert_allclose(kern(a), 2 * a)
    assert kern.cache_info() == (1, 1)
    b = rng.standard_normal((5, 7)).astype("float32")  # same signature, other data
    np.testing.assert_allclose(kern(b), 2 * b)
    assert kern.cache_info() == (1, 1)
    c = rng.standard_normal((6, 7)).astype("float32")  # new shape
    np.testing.assert_allclose(kern(c), 2 * c)
    assert kern.cache_info().misses == 2
    strided = rng.standard_normal((5, 14)).astype("float32")[:, ::2]  # new strides: copied
    np.testing.assert_allclose(kern(strided), 2 * strided)
    assert kern.cache_info().misses == 3
    out = np.empty((5, 7), "float32")  # outputs given
    assert kern(a, out) is out
    np.testing.assert_allclose(out, 2 * a)
    assert kern.cache_info() == (4, 4)
    with pytest.raises(pt.InputError, match="dtype float32, got float64"):  # new dtype: checked, refused
        kern(a.astype("float64"))
    with pytest.raises(pt.InputError, match="dtype float32, got float64"):  # and not cached
        kern(a.astype("float64"))
    assert kern.cache_info() == (4, 4)
    np.testing.assert_allclose(kern(b), 2 * b)
    assert kern.cache_info() == (4, 4)


def test_signature_cache_keys_on_parameters(rng):
    N = pt.param("N")
    A = pt.placeholder((N,), "float32", "A")
    K = pt.param("K")
    B = pt.compute((K,), lambda i: A[i] * 1.0, "B")
    kern = pt.build(pt.Func([A], [B], constraints=[K <= N]))
    a = rng.standard_normal(9).astype("float32")
    np.testing.assert_allclose(kern(a, K=3), a[:3])
    np.testing.assert_allclose(kern(a, K=5), a[:5])
    np.testing.assert_allclose(kern(a, K=3), a[:3])
    assert kern.cache_info() == (2, 2)
    with pytest.raises(pt.InputError, match="must be an integer"):
        kern(a, K=[3])  # unhashable: no cache entry, a clear error


def test_signature_reports_the_binding(rng):
    op = ops.spmm(rows=30, cols=40, n=17, nnz=200)
    kern = op.build("cpu")
    sig = kern.signature(*op.make_inputs(rng))
    assert dict(sig.params) == {"M": 30, "K": 40, "N": 17, "NNZ": 200}
    assert sig.output_shapes == ((30, 17),)
    assert [(c.name, c.kind) for c in sig.index_checks] == [("ptr", "range"), ("ptr", "monotonic"), ("col", "range")]


def test_output_that_is_an_input_is_refused_naming_both(rng):
    kern = ops.matmul(64, 64, 64).build("cpu")
    a = rng.standard_normal((64, 64)).astype("float32")
    b = rng.standard_normal((64, 64)).astype("float32")
    with pytest.raises(pt.InputError, match="output C of matmul shares memory with input A"):
        kern(a, b, a)
    with pytest.raises(pt.InputError, match="output C of matmul shares memory with input B"):
        kern(a, b, b)
    buf = rng.standard_normal((128, 64)).astype("float32")
    with pytest.raises(pt.InputError, match="shares memory with input A"):  # overlapping views
        kern(buf[10:74], b, buf[40:104])
    out = kern(buf[:64], b, buf[64:])  # adjacent, not overlapping: computed
    np.testing.assert_allclose(out, buf[:64].astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_duplicated_and_overlapping_outputs_are_refused(rng):
    kern = pt.build(two_outputs_func())
    a = rng.standard_normal(10).astype("float32")
    out = np.empty(10, "float32")
    with pytest.raises(pt.InputError, match="output C of two shares memory with output B"):
        kern(a, out, out)
    buf = np.empty(15, "float32")
    with pytest.raises(pt.InputError, match="output C of two shares memory with output B"):
        kern(a, buf[:10], buf[5:])
    b, c = kern(a, np.empty(10, "float32"), np.empty(10, "float32"))
    np.testing.assert_allclose(b, a + 1)
    np.testing.assert_allclose(c, a * 3)


def test_strided_input_overlapping_an_output_is_copied_first(rng):
    """A non-contiguous input is copied before the call, so it may overlap an output."""
    kern = pt.build(scale_func())
    buf = rng.standard_normal((6, 12)).astype("float32")
    a = buf[:, ::2]
    want = 2 * a
    out = buf[:3].reshape(6, 6)  # contiguous rows 0-2 of buf, which a reads too
    kern(a, out)
    np.testing.assert_allclose(out, want)


def test_repeated_calls_use_each_calls_data(rng):
    kern = ops.matmul(8, 8, 8).build("cpu")
    for _ in range(5):
        a, b = (rng.standard_normal((8, 8)).astype("float32") for _ in range(2))
        np.testing.assert_allclose(kern(a, b), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert kern.cache_info() == (1, 1)


def test_read_only_empty_and_bfloat16_arrays(rng):
    kern = pt.build(scale_func())
    a = rng.standard_normal((4, 3)).astype("float32")
    a.flags.writeable = False
    np.testing.assert_allclose(kern(a), 2 * a)
    assert kern(np.zeros((0, 3), "float32")).shape == (0, 3)
    N = pt.param("N")
    X = pt.placeholder((N,), "bfloat16", "X")
    Y = pt.compute((N,), lambda i: X[i] * 2.0, "Y")
    bkern = pt.build(pt.Func([X], [Y], name="bscale"))
    x = rng.standard_normal(37).astype(pt.bfloat16.numpy)
    np.testing.assert_allclose(bkern(x).astype(np.float32), 2 * x.astype(np.float32))


def test_read_only_output_is_refused(rng):
    kern = pt.build(scale_func())
    a = rng.standard_normal((4, 3)).astype("float32")
    out = np.zeros((4, 3), "float32")
    out.flags.writeable = False
    with pytest.raises(pt.InputError, match="output B of scale is read-only"):
        kern(a, out)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64"])
def test_index_checks_in_c_every_dtype(dtype, rng):
    M, L = pt.param("M"), pt.param("L")
    idx = pt.placeholder((M, 3), dtype, "idx", value_range=(0, L - 1))
    x = pt.placeholder((L,), "float32", "x")
    off = pt.placeholder((M + 1,), dtype, "off", monotonic=True)
    y = pt.compute((M, 3), lambda i, j: x[idx[i, j]] + pt.cast("float32", off[i]), "y")
    kern = pt.build(pt.Func([idx, x, off], [y], name="gather"))
    m, n = 23, 50
    good = rng.integers(0, n, (m, 3)).astype(dtype)
    good[0, 0] = 0
    xs = rng.standard_normal(n).astype("float32")
    offs = np.sort(rng.integers(0, 100, m + 1)).astype(dtype)
    np.testing.assert_allclose(kern(good, xs, offs), xs[good] + offs[:m, None].astype("float32"))
    bad = good.copy()
    bad[17, 2] = n
    with pytest.raises(pt.InputError, match=rf"idx has values in \[0, {n}\] but promises \[0, {n - 1}\]: "
                                            rf"idx\[17, 2\] = {n} \(kernel gather\)"):
        kern(bad, xs, offs)
    if dtype != "uint8":
        bad[17, 2] = -1
        with pytest.raises(pt.InputError, match=r"idx\[17, 2\] = -1"):
            kern(bad, xs, offs)
    down = offs.copy()
    down[9], down[10] = 60, 59
    down[:9] = np.minimum(down[:9], 60)
    down[11:] = np.maximum(down[11:], 59)
    with pytest.raises(pt.InputError, match=r"off must not decrease, but off\[9\] = 60 > off\[10\] = 59"):
        kern(good, xs, down)


def test_index_check_scans_large_arrays(rng):
    """The C scan compares blocks of 4096 without branches and searches only a block with a bad value:
    the first bad position is found in any block, also the last, partial one."""
    op = ops.segment_sum(rows=9000, nnz=20000)
    kern = op.build("cpu")
    offsets, x = op.make_inputs(rng)
    for pos in (1, 4095, 4096, 8999):
        bad = offsets.copy()
        bad[pos] = bad[pos + 1] + 1 if bad[pos + 1] < 20000 else 20001
        with pytest.raises(pt.InputError, match=rf"offsets\[{pos}\]"):
            kern(bad, x)
    np.testing.assert_allclose(kern(offsets, x), op.reference(offsets, x), rtol=1e-5, atol=1e-5)


OMP_ENV = textwrap.dedent("""
    import os
    import numpy as np
    import polytile as pt
    kern = pt.ops.softmax(256, 1024).build("cpu")  # a parallel loop: the library needs libgomp
    kern(np.ones((256, 1024), np.float32))
    print("ENV", os.environ.get("OMP_WAIT_POLICY"))
""")


@pytest.mark.parametrize("given", [None, "ACTIVE"])
def test_openmp_waits_passively_unless_the_environment_says(given):
    """libgomp reads OMP_WAIT_POLICY when the first kernel loads it: passive then, unless the user
    chose; the process environment is left as it was."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"  # libgomp prints its settings when it starts
    if given:
        env["OMP_WAIT_POLICY"] = given
    proc = subprocess.run([sys.executable, "-c", OMP_ENV], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    spins = "30000000000" if given == "ACTIVE" else "0"  # unset, libgomp spins 300000 times
    assert f"GOMP_SPINCOUNT = '{spins}'" in proc.stderr, proc.stderr
    assert f"ENV {given}" in proc.stdout
