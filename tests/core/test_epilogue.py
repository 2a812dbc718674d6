"""Reductions with an epilogue (``compute(epilogue=)``, ``with_epilogue``): the complete sums go through
the epilogue (bias, activation, residual, cast) where the write cache is written back, in the same
loop nest, on the CPU at sizes that divide no tile; checked against NumPy, with the refusals."""

import numpy as np
import pytest

import polytile as pt
from polytile.errors import LanguageError, ScheduleError
from polytile.lang.tensor import with_epilogue
from polytile.ops.matmul import cpu_gemm_tiles, schedule_gemm_cpu

M, N, K = 7, 77, 129


def _gemm(dtype: str, epilogue: bool = True) -> pt.Func:
    """relu(A @ B + bias) + R of ``dtype`` operands, summed in float32, stored as ``dtype``."""
    A, B = pt.placeholder((M, K), dtype, "A"), pt.placeholder((K, N), dtype, "B")
    bias, R = pt.placeholder((N,), dtype, "bias"), pt.placeholder((M, N), dtype, "R")
    k = pt.reduce_axis(K, "k")

    def ep(v, i, j):
        return (pt.call("max", v + bias[j].astype("float32"), 0.0) + R[i, j].astype("float32")).astype(dtype)

    C = pt.compute((M, N), lambda i, j: pt.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), "C",
                   epilogue=ep if epilogue else None)
    return pt.Func([A, B, bias, R], [C], name="gemm_epilogue")


def _inputs(dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.uniform(-1, 1, s).astype(dtype) for s in ((M, K), (K, N), (N,), (M, N))]


def _reference(a, b, bias, r):
    wide = [x.astype(np.float64) for x in (a, b, bias, r)]
    return np.maximum(wide[0] @ wide[1] + wide[2], 0) + wide[3]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scheduled", [False, True])
def test_the_epilogue_applies_to_complete_sums_in_one_loop_nest(dtype: str, scheduled: bool) -> None:
    func = _gemm(dtype)
    (C,) = func.computations
    assert C.dtype.name == dtype and C.value_dtype.name == "float32" and C.finished
    s = pt.Schedule(func)
    if scheduled:  # the BLIS schedule with the whole of K in one block: the register tile holds complete sums
        schedule_gemm_cpu(s, "C", "A", "B", dict(cpu_gemm_tiles(M, N, K, pt.CPUTarget()), kc=K))
    kern = pt.build(s, "cpu")
    ins = _inputs(dtype)
    out = np.asarray(kern(*ins))
    assert out.dtype == np.dtype(dtype)
    tol = 1e-5 if dtype == "float32" else 4e-3
    np.testing.assert_allclose(out.astype(np.float64), _reference(*ins), rtol=tol, atol=tol)
    assert "R[" in kern.source and "bias[" in kern.source
    from polytile.fuzz.reference import check
    check(func, ins, [out])  # the fuzzer's independent evaluator applies the epilogue too


def test_a_write_cache_holding_part_of_the_sums_is_refused() -> None:
    s = pt.Schedule(_gemm("float32"))
    with pytest.raises(ScheduleError, match=r"stored through its epilogue.*loop\(s\) kc run outside"):
        schedule_gemm_cpu(s, "C", "A", "B", dict(cpu_gemm_tiles(M, N, K, pt.CPUTarget()), kc=32))


def test_an_epilogue_reads_inputs_only() -> None:
    A = pt.placeholder((M, K), "float32", "A")
    k = pt.reduce_axis(K, "k")
    D = pt.compute((M,), lambda i: A[i, 0] * 2, "D")
    with pytest.raises(LanguageError, match="epilogue of C reads D, a computation"):
        pt.compute((M, M), lambda i, j: pt.sum(A[i, k] * A[j, k], axis=k), "C", epilogue=lambda v, i, j: v + D[i])
    with pytest.raises(LanguageError, match="epilogue of C has a reduction"):
        pt.compute((M,), lambda i: pt.sum(A[i, k], axis=k), "C", epilogue=lambda v, i: v + pt.sum(A[i, k], axis=k))


def test_an_elementwise_computation_composes_its_epilogue() -> None:
    A = pt.placeholder((M, K), "float32", "A")
    C = with_epilogue(pt.compute((M, K), lambda i, j: A[i, j] * 2, "C"), lambda v, i, j: v + 1)
    assert C.epilogue is None and not C.finished
    out = np.asarray(pt.build(pt.Schedule(pt.Func([A], [C])), "cpu")(a := _inputs("float32")[0]))
    np.testing.assert_allclose(out, a * 2 + 1, rtol=1e-6)


def test_the_workload_key_tells_epilogues_apart() -> None:
    from polytile.tune import Workload
    keys = {Workload(f.name, (), f).key for f in (_gemm("float32"), _gemm("float32", epilogue=False))}
    assert len(keys) == 2


@pytest.mark.parametrize("bad", [5, lambda v: v, lambda v, i, j: v])
def test_an_epilogue_that_is_not_a_function_of_the_value_and_axes_is_refused(bad):
    A = pt.placeholder((4, 4), "float32", "A")
    k = pt.reduce_axis(4, "k")
    with pytest.raises(pt.PolytileError, match=r"the epilogue of C is a function of the value and its 1 axes"):
        pt.compute((4,), lambda i: pt.sum(A[i, k], axis=k), "C", epilogue=bad)
