"""Products stored narrower than they are summed in (``out_dtype``, ``compute(store_dtype=)``): float32
sums of 16-bit products rounded once, when complete, to float16 or bfloat16 (what NumPy computes as
``(a.astype(float32) @ b.astype(float32)).astype(float16)``), on the CPU at sizes that divide no tile;
the write cache that makes the rounding happen once, and the refusals."""

import dataclasses

import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.dtypes import as_dtype
from polytile.errors import PolytileError, ScheduleError

HALF = ["float16", "bfloat16"]

OPS = [
    ("matmul", dict(M=37, N=29, K=301)),
    ("matmul", dict(M=37, N=29, K=300, split_k=3)),
    ("matmul", dict(M=3, N=45, K=130)),  # few rows: the streaming form
    ("batch_matmul", dict(batch=3, M=19, N=23, K=45)),
    ("batch_matmul", dict(batch=3, M=19, N=23, K=45, split_k=5)),
    ("conv2d_igemm", dict(N=2, H=7, W=9, C=5, K=11, R=3, S=3, padding=1)),
    ("conv2d", dict(N=2, C=5, H=7, W=9, K=11, R=3, S=3, padding=1)),
    ("conv3d_igemm", dict(N=1, D=4, H=5, W=6, C=3, K=7, T=2, R=3, S=3, padding=1)),
]


def ulps_from_rounded_sums(out: np.ndarray, ref: np.ndarray) -> float:
    """The largest distance of ``out`` from the float64 reference rounded to out's type, in units in
    the last place of out's type there: 0 or 1 when float32 sums were rounded once (1: the sums' own
    order moved a value over a rounding boundary); many where partial sums were rounded."""
    rounded = ref.astype(out.dtype).astype(np.float64)
    ulp = np.spacing(np.abs(rounded).astype(np.float32)).astype(np.float64) * 2.0 ** (23 - _fraction_bits(out.dtype))
    return float(np.max(np.abs(out.astype(np.float64) - rounded) / np.maximum(ulp, 1e-30)))


def _fraction_bits(dtype: np.dtype) -> int:
    return {"float16": 10, "bfloat16": 7, "float32": 23}[as_dtype(dtype).name]


def _run(op: ops.Op, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = op.make_inputs(rng)
    out = op.build("cpu")(*inputs)
    return np.asarray(out), np.asarray(op.reference(*inputs))


@pytest.mark.parametrize("name,dims", OPS, ids=[f"{n}-{'-'.join(map(str, d.values()))}" for n, d in OPS])
@pytest.mark.parametrize("dtype", HALF)
def test_half_outputs_are_float32_sums_rounded_once(name, dims, dtype):
    op = ops.get(name, dtype=dtype, out_dtype=dtype, **dims)
    out, ref = _run(op)
    assert as_dtype(out.dtype).name == dtype and out.shape == ref.shape
    assert ops.rel_error(out, ref) <= op.tolerance
    assert ulps_from_rounded_sums(out, ref) <= 1.0


@pytest.mark.parametrize("dtype", HALF)
def test_float32_output_of_half_inputs(dtype):
    op = ops.matmul(37, 29, 301, dtype, out_dtype="float32")
    out, ref = _run(op)
    assert out.dtype == np.float32 and ops.rel_error(out, ref) <= 1e-6


def test_default_output_is_the_accumulator():
    assert ops.matmul(8, 8, 8, "float16").func.outputs[0].dtype.name == "float32"
    assert ops.conv2d_igemm(1, 4, 4, 8, 8, 1, 1).func.outputs[0].dtype.name == "float32"
    assert "out_dtype" not in ops.matmul(8, 8, 8, "float16").shape


def test_bfloat16_output_of_float16_inputs():
    out, ref = _run(ops.batch_matmul(2, 13, 17, 40, "float16", out_dtype="bfloat16"))
    assert as_dtype(out.dtype).name == "bfloat16" and ulps_from_rounded_sums(out, ref) <= 1.0


@pytest.mark.parametrize("bad", ["int3", "int32", "float64", 7])
def test_an_unknown_or_unfit_out_dtype_is_refused(bad):
    with pytest.raises(PolytileError, match=r"matmul: out_dtype=.* use one of float16, bfloat16, float32"):
        ops.matmul(8, 8, 8, "float16", out_dtype=bad)
    with pytest.raises(PolytileError, match="conv2d_igemm: out_dtype="):
        ops.conv2d_igemm(1, 4, 4, 8, 8, 1, 1, out_dtype=bad)


def test_integer_products_keep_int32():
    assert ops.matmul(4, 4, 4, "int8", out_dtype="int32").func.outputs[0].dtype.name == "int32"
    with pytest.raises(PolytileError, match="use one of int32"):
        ops.matmul(4, 4, 4, "int8", out_dtype="float16")


# --- the language and the write cache ------------------------------------------------------------

def _hgemm(M=21, N=13, K=257):
    A = pt.placeholder((M, K), "float16", "A")
    B = pt.placeholder((K, N), "float16", "B")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), "C",
                   store_dtype="float16")
    return pt.Func([A, B], [C], name="hgemm")


def _check(sched, M=21, N=13, K=257):
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (M, K)).astype(np.float16)
    b = rng.uniform(-1, 1, (K, N)).astype(np.float16)
    out = np.asarray(pt.build(sched, "cpu")(a, b))
    assert out.dtype == np.float16
    return ulps_from_rounded_sums(out, a.astype(np.float64) @ b.astype(np.float64))


def test_store_dtype_keeps_one_computation():
    f = _hgemm()
    C = f.outputs[0]
    assert [c.name for c in f.computations] == ["C"]
    assert C.dtype.name == "float16" and C.value_dtype.name == "float32" and C.narrowed


def test_unscheduled_sums_get_a_float32_write_cache():
    s = pt.Schedule(_hgemm())
    src = pt.build(s, "cpu").source
    assert "float C_local" in src and "(_Float16)C_local" in src
    assert _check(pt.Schedule(_hgemm())) <= 1.0


def test_a_write_cache_outside_the_reduction_rounds_once():
    s = pt.Schedule(_hgemm())
    s["C"].split("k", 64, "ko", "ki").cache_write("j")
    assert _check(s) <= 1.0


def test_a_write_cache_inside_the_reduction_is_refused():
    """Partial sums would be stored rounded to float16 between K blocks. Refused by the primitive that
    makes it so, the cache or a later reorder (it was refused at the build: independent fuzzer, seed
    14 case 10), and the schedule is left as it was."""
    s = pt.Schedule(_hgemm())
    s["C"].split("k", 64, "ko", "ki").reorder("ko", "i", "j", "ki")
    with pytest.raises(ScheduleError, match=r"C sums in float32 and is stored as float16.*loop\(s\) ko run outside"):
        s["C"].cache_write("j")
    assert s.caches == []
    s = pt.Schedule(_hgemm())
    s["C"].split("k", 64, "ko", "ki").cache_write("j")
    with pytest.raises(ScheduleError, match=r"C sums in float32 and is stored as float16.*loop\(s\) ko run outside"):
        s["C"].reorder("ko", "i", "j", "ki")
    assert s["C"].loops == ["i", "j", "ko", "ki"]
    assert _check(s) <= 1.0


def test_reduction_loops_outside_the_data_loops_get_a_whole_cache():
    s = pt.Schedule(_hgemm())
    s["C"].reorder("k", "i", "j")
    assert _check(s) <= 1.0
    assert "allocate C_local[21, 13] float32" in str(pt.lower(s))  # the whole result, in float32
    assert s.caches == []  # the lowering's cache, not the caller's schedule's


# --- the tuning templates ----------------------------------------------------------------------------

TUNED = [("matmul", dict(M=37, N=29, K=301)), ("matmul", dict(M=3, N=45, K=130)),
         ("batch_matmul", dict(batch=3, M=19, N=23, K=45)), ("conv2d", dict(N=1, C=5, H=7, W=9, K=11, R=3, S=3))]


@pytest.mark.parametrize("name,dims", TUNED, ids=[f"{n}-{i}" for i, (n, _) in enumerate(TUNED)])
def test_cpu_template_configurations_round_once(name, dims):
    """The template's default is the default schedule, and its other configurations (K never blocked
    for a GEMM stored as float16) build and round the sums once."""
    from polytile.build import build
    from polytile.tune import make_task
    task = make_task(name, "cpu", dtype="float16", out_dtype="float16", **dims)
    default = task.space.default
    assert build(task.schedule(default.values), task.target).source == task.op.build().source
    rng = np.random.default_rng(5)
    seen = 0
    for row in task.space.random_digits(rng, 400):
        if not task.space.is_valid(list(row)):
            continue
        kern = build(task.schedule(task.space.config(list(row)).values), task.target)
        inputs = task.op.make_inputs(rng)
        out = np.asarray(kern(*inputs))
        assert out.dtype == np.float16 and ulps_from_rounded_sums(out, task.op.reference(*inputs)) <= 1.0
        seen += 1
        if seen == 3:
            break
    assert seen


def test_shape_suite_writes_the_input_dtype_like_torch():
    """benchmarks/shapes.py: 16-bit GEMMs and convolutions store their input dtype (torch's output) by
    default, float32 workloads and the row operators keep theirs; with --float32-out they write float32."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    import shapes
    suite = {w.name: w for w in shapes.gpu_suite()}
    scores = suite["llama3-8b.attn_scores.s2048"]
    assert scores.arguments()["out_dtype"] == "bfloat16"
    assert "out_dtype" not in suite["bert-large.q.t128"].arguments()
    assert "out_dtype" not in suite["softmax.awkward.3000x1000"].arguments()
    conv = suite["mobilenetv2.b2.expand.n32"]
    assert conv.arguments()["out_dtype"] == "float16"
    assert "out_dtype" not in dataclasses.replace(conv, half_out=False).arguments()  # --float32-out
    small = shapes.Workload("t", "conv2d_igemm", (("N", 1), ("H", 5), ("W", 5), ("C", 16), ("K", 8), ("R", 1),
                                                  ("S", 1)), "float16", "conv")
    assert small.op().func.outputs[0].dtype.name == "float16"


def test_building_leaves_the_schedule_as_it_was(rng):
    """The write cache that the lowering adds for sums stored narrower belongs to that build: it
    stayed in the caller's schedule, so a schedule built (or lowered) once and then reordered was
    refused at its next build — the stale cache held only part of the reduction (independent fuzzer,
    seed 13 case 82, where ``pt.lower`` ran between primitives)."""
    A = pt.placeholder((5, 4), "float32", "A")
    k = pt.reduce_axis(5, "k")
    T = pt.compute((32, 4), lambda n, y: pt.sum(A[k, y] * n, axis=k), "T", store_dtype="bfloat16")
    s = pt.create_schedule(pt.Func([A], [T]))
    pt.lower(s)
    pt.build(s)
    assert s.caches == []
    s[T].reorder("k", "y", "n")
    a = rng.random((5, 4), dtype=np.float32)
    got = np.asarray(pt.build(s)(a), np.float32)
    np.testing.assert_allclose(got, np.arange(32)[:, None] * a.sum(0)[None, :], rtol=1e-2)
