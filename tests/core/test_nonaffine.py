"""Non-affine programs: data-dependent bounds (segment sum, CSR SpMM) as local parameters, split and
cached, against NumPy/SciPy — empty rows, a row longer than the tile — and no out-of-place reads."""

import textwrap

import numpy as np
import pytest

import polytile as pt
from polytile import ops


def offsets_with_edge_cases(rng, rows, tile):
    lens = rng.integers(0, 2 * tile, size=rows)
    lens[0] = 0
    lens[rows // 2] = 0
    lens[-1] = 5 * tile + 3  # longer than the tile
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


@pytest.mark.parametrize("schedule", ["default", "split", "split_cached", "parallel_split"])
def test_segment_sum(schedule, rng):
    op = ops.segment_sum(rows=41, nnz=100)
    s = pt.create_schedule(op.func)
    if schedule in ("split", "split_cached", "parallel_split"):
        s["y"].split("k", 4)
    if schedule == "split_cached":
        s["y"].cache_identity("x", "i")
    if schedule == "parallel_split":
        s["y"].parallel("i")
    kern = pt.build(s)
    off = offsets_with_edge_cases(rng, 41, 4)
    x = rng.standard_normal(int(off[-1])).astype("float32")
    np.testing.assert_allclose(kern(off, x), op.reference(off, x), rtol=1e-5, atol=1e-5)


def test_segment_sum_bound_loads_inside_the_row_loop():
    op = ops.segment_sum(rows=4, nnz=10)
    s = pt.create_schedule(op.func)
    s["y"].split("k", 4)
    text = str(pt.lower(s))
    # the offsets are read once per row, inside the row loop, and nowhere else
    assert text.count("offsets[") == 2
    lines = text.splitlines()
    loop = next(k for k, line in enumerate(lines) if line.strip().startswith("for i in"))
    for k, line in enumerate(lines):
        if "offsets[" in line:
            assert k > loop and "let _d" in line


@pytest.mark.parametrize("schedule", ["default", "split_j", "reorder_vectorize", "split_k"])
def test_spmm_against_scipy(schedule, rng):
    scipy_sparse = pytest.importorskip("scipy.sparse")
    rows, cols, n = 37, 29, 21
    op = ops.spmm(rows=rows, cols=cols, n=n, nnz=1)
    s = pt.create_schedule(op.func)
    if schedule == "split_j":
        s["C"].split("j", 8)
    elif schedule == "reorder_vectorize":
        s["C"].reorder("i", "k", "j").split("j", 8).vectorize("ji").parallel("i")
    elif schedule == "split_k":
        s["C"].split("k", 3)
    kern = pt.build(s)
    ptr = offsets_with_edge_cases(rng, rows, 3)
    nnz = int(ptr[-1])
    col = rng.integers(0, cols, nnz).astype(np.int32)
    val = rng.standard_normal(nnz).astype("float32")
    b = rng.standard_normal((cols, n)).astype("float32")
    ref = scipy_sparse.csr_matrix((val.astype(np.float64), col, ptr), shape=(rows, cols)) @ b.astype(np.float64)
    np.testing.assert_allclose(kern(ptr, col, val, b), ref, rtol=1e-5, atol=1e-5)


def test_index_array_promises_are_checked(rng):
    op = ops.segment_sum(rows=5, nnz=20)
    kern = op.build("cpu")
    x = rng.standard_normal(20).astype("float32")
    bad = np.array([0, 4, 3, 8, 12, 20], dtype=np.int32)
    with pytest.raises(pt.InputError, match="offsets must not decrease"):
        kern(bad, x)
    over = np.array([0, 4, 8, 12, 16, 21], dtype=np.int32)
    with pytest.raises(pt.InputError, match=r"offsets has values in \[0, 21\] but promises \[0, 20\]"):
        kern(over, x)


def test_bound_read_without_value_range_is_refused():
    M, NNZ = pt.param("M"), pt.param("NNZ")
    off = pt.placeholder((M + 1,), "int32", "off")
    x = pt.placeholder((NNZ,), "float32", "x")

    def body(i):
        k = pt.reduce_axis((off[i], off[i + 1]), "k")
        return pt.sum(x[k], axis=k)

    y = pt.compute((M,), body, "y")
    with pytest.raises(pt.LanguageError, match="may access x outside its bounds.*value_range"):
        pt.create_schedule(pt.Func([off, x], [y]))


ASAN_SCRIPT = textwrap.dedent("""
    import numpy as np, sys
    import polytile as pt
    from polytile import ops
    op = ops.segment_sum(rows=97, nnz=1)
    s = pt.create_schedule(op.func)
    s["y"].split("k", 4)
    s["y"].cache_identity("x", "i")
    kern = pt.build(s, extra_flags=["-fsanitize=address", "-fno-omit-frame-pointer"])
    rng = np.random.default_rng(0)
    lens = rng.integers(0, 9, 97); lens[-1] = 0
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)  # exactly M + 1 entries
    x = rng.standard_normal(int(off[-1])).astype("float32")
    out = kern(off, x)
    ref = op.reference(off, x)
    sys.exit(0 if np.allclose(out, ref, atol=1e-5) else 3)
""")

PLANTED_SCRIPT = textwrap.dedent("""
    import ctypes, numpy as np
    from polytile.runtime.cpu import compile_shared
    src = 'extern "C" float f(const int* o, long n) { float s = 0; for (long i = 0; i <= n; ++i) s += o[i]; return s; }'
    lib = ctypes.CDLL(str(compile_shared(src, ["-fsanitize=address"])))
    lib.f.restype = ctypes.c_float
    o = np.arange(8, dtype=np.int32)
    lib.f(o.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(8))  # reads o[8]: out of bounds
""")


def test_split_and_cached_segment_sum_reads_nothing_out_of_bounds(asan_run):
    """The out-of-bounds read of apache/tvm#6596 (PLANT code 3.6) must not happen: under
    AddressSanitizer, with an offsets array of exactly M + 1 entries, the kernel runs clean."""
    planted = asan_run(PLANTED_SCRIPT)
    assert planted.returncode != 0 and "AddressSanitizer" in planted.stderr  # the harness can fail
    proc = asan_run(ASAN_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-3000:]
