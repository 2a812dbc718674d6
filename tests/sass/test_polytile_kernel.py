"""polytile's own CUDA kernels in the SASS optimizer: the launch read off a built function (no GPU),
optimize() on it with a fake worker, and on the GPU the optimized function computing what the
original does."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.runtime.cuda import CUDAKernel, eval_expr
from polytile.sass.api import analyse, optimize
from polytile.sass.launch import Buffer, LaunchError, Scalar
from polytile.sass.polytile_kernel import polytile_launch
from polytile.sass.runner import RunnerSettings

FAKE = [sys.executable, str(Path(__file__).parent / "fake_worker.py")]
ARCH = "cuda:sm_90a"  # builds without a GPU; the GPU test builds for the GPU present

pytestmark = pytest.mark.needs_nvcc  # every test builds polytile's CUDA kernels


@pytest.fixture(scope="module")
def matmul() -> CUDAKernel:
    return ops.matmul(300, 200, 100).build(ARCH)  # sizes that do not divide the tiles


@pytest.fixture(scope="module")
def softmax() -> CUDAKernel:
    return ops.softmax(37, 1000).build(ARCH)


@pytest.fixture(scope="module")
def two_kernels() -> CUDAKernel:
    """C = A * 2 + 1 in two kernels through the global temporary B, with a size parameter N."""
    N = pt.param("N")
    A = pt.placeholder((N,), "float32", "A")
    B = pt.compute((N,), lambda i: A[i] * 2.0, "B")
    C = pt.compute((N,), lambda i: B[i] + 1.0, "C")
    s = pt.create_schedule(pt.Func([A], [C], name="two_kernels"))
    for t in (B, C):
        s[t].split("i", 128, "bx", "tx").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    return pt.build(s, ARCH)


def test_launch_follows_the_kernel_source(matmul):
    a, b = np.zeros((300, 100), np.float32), np.zeros((100, 200), np.float32)
    launch = polytile_launch(matmul, [a, b])
    (source,) = matmul.kernels
    assert launch.cubin == matmul.cubin and launch.kernel == source.name
    assert launch.grid == tuple(eval_expr(g, {}) for g in source.grid)
    assert launch.block == source.block and launch.shared_bytes == source.dynamic_shared
    assert [arg.name for arg in launch.args] == [buf.name for buf in source.args]  # no size parameters
    by_name = {arg.name: arg for arg in launch.args}
    assert by_name["A"] == Buffer("A", "float32", (300, 100))
    assert by_name["B"] == Buffer("B", "float32", (100, 200))
    assert by_name["C"] == Buffer("C", "float32", (300, 200), role="out")
    assert launch.rtol == 0.0  # polytile's kernels are deterministic: compared bit for bit
    launch.check()  # the arguments fit the cubin's parameter table
    assert analyse(launch).movable


def test_softmax_launch_from_torch_tensors(softmax):
    torch = pytest.importorskip("torch")
    launch = polytile_launch(softmax, [torch.zeros(37, 1000)], name="polytile-softmax")
    assert launch.label == "polytile-softmax" and launch.grid == (37, 1, 1)
    assert [(b.name, b.role, b.shape) for b in launch.buffers()] == [("Y", "out", (37, 1000)), ("X", "in", (37, 1000))]
    assert analyse(launch).movable


def test_size_parameters_and_temporaries(two_kernels):
    x = np.zeros(1000, np.float32)
    with pytest.raises(LaunchError, match=r"two_kernels launches 2 kernels \(two_kernels_kernel0, "
                                          r"two_kernels_kernel1\).*pass kernel_name="):
        polytile_launch(two_kernels, [x])
    with pytest.raises(LaunchError, match=r"kernel two_kernels_kernel1 reads B \(written by two_kernels_kernel0\)"
                                          r".*runs one kernel alone.*: two_kernels_kernel0$"):
        polytile_launch(two_kernels, [x], kernel_name="two_kernels_kernel1")
    with pytest.raises(LaunchError, match="no kernel 'k9'; its kernels are two_kernels_kernel0, two_kernels_kernel1"):
        polytile_launch(two_kernels, [x], kernel_name="k9")
    launch = polytile_launch(two_kernels, [x], kernel_name="two_kernels_kernel0")
    assert launch.grid == (8, 1, 1)  # ceil(1000 / 128)
    # B is what the second kernel reads: compared as an output; N is an index-typed value (int64:
    # a symbolic size leaves 64-bit indexing on)
    assert launch.args == (Buffer("B", "float32", (1000,), role="out"), Buffer("A", "float32", (1000,)),
                           Scalar("N", "int64", 1000))
    launch.check()


def test_index_arrays_and_zero_initialised_outputs_are_passed_as_data():
    op = ops.segment_sum(rows=50, nnz=400)
    kern = op.build(ARCH)
    offsets, x = op.make_inputs(np.random.default_rng(0))
    launch = polytile_launch(kern, [offsets, x], params=op.params)
    by_name = {arg.name: arg for arg in launch.args}
    assert by_name["offsets"].init == "data" and np.array_equal(by_name["offsets"].data, offsets)
    assert by_name["x"].init == "normal"
    bad = offsets[::-1].copy()
    with pytest.raises(LaunchError, match="segment_sum: index array offsets must not decrease"):
        polytile_launch(kern, [bad, x], params=op.params)

    n = 100
    A = pt.placeholder((n, n), "float32", "A")
    L = pt.compute((n, n), lambda i, j: A[i, j] + 1.0, "L", where=lambda i, j: j <= i)
    s = pt.create_schedule(pt.Func([A], [L], name="lower"))
    s[L].split("j", 32, "jb", "jt").bind("i", "blockIdx.x").bind("jt", "threadIdx.x")
    launch = polytile_launch(pt.build(s, ARCH), [np.zeros((n, n), np.float32)])
    out = launch.args[0]  # computed only below the diagonal: zeros above, as a call allocates it
    assert (out.name, out.role, out.init) == ("L", "inout", "data") and not out.data.any()
    launch.check()


def test_example_inputs_are_checked(softmax):
    with pytest.raises(LaunchError, match=r"softmax takes 1 input array\(s\) \(X\), optionally followed by 1"):
        polytile_launch(softmax, [])
    with pytest.raises(LaunchError, match="pass example_inputs as a list"):
        polytile_launch(softmax, np.zeros((37, 1000), np.float32))
    with pytest.raises(LaunchError, match="example input X must have dtype float32, got float64"):
        polytile_launch(softmax, [np.zeros((37, 1000))])
    with pytest.raises(TypeError, match=r"polytile function softmax needs example_inputs: .*\(X\)"):
        optimize(softmax, budget=4)
    with pytest.raises(TypeError, match=r"options \['grid'\] do not apply to polytile function softmax"):
        optimize(softmax, [np.zeros((37, 1000), np.float32)], budget=4, grid=(1,))


def test_optimize_returns_a_polytile_function(softmax, monkeypatch):
    """With a fake worker (more moved words: faster; more than 10: wrong) the verified schedule comes
    back as a CUDAKernel that differs from the original in its cubin alone. (The softmax kernel's
    smallest greedy candidates move 9 words since its maxima are single FMNMX.NAN instructions; the
    greedy search still meets candidates of 11 moved words, which the fake rejects.)"""
    x = np.zeros((37, 1000), np.float32)
    monkeypatch.setenv("FAKE_REJECT_ABOVE", "10")
    settings = RunnerSettings(command=FAKE)
    result = optimize(softmax, [x], budget=20, method="greedy", settings=settings, candidates=100, confirm_rounds=1)
    assert result.report.verified and result.cubin != softmax.cubin
    assert isinstance(result.kernel, CUDAKernel) and result.kernel.cubin == result.cubin
    assert replace(result.kernel, cubin=softmax.cubin) == replace(softmax, _functions={})
    monkeypatch.setenv("FAKE_REJECT_ABOVE", "0")
    result = optimize(softmax, [x], budget=6, method="random", settings=settings, confirm_rounds=1)
    assert not result.report.verified and result.kernel.cubin == softmax.cubin
    assert optimize(result.launch, budget=6, method="random", settings=settings).kernel is None


@pytest.mark.gpu
def test_optimized_softmax_computes_what_the_original_does():
    op = ops.softmax(300, 1000)
    kern = op.build("cuda")  # for the GPU present
    x = np.random.default_rng(3).standard_normal((300, 1000)).astype(np.float32)
    settings = RunnerSettings(reps=5, warmup=1)
    result = optimize(kern, [x], budget=6, method="random", settings=settings, confirm_rounds=2)
    assert result.report.speedup >= 1.0 and result.kernel.cubin == result.cubin
    want = kern(x)
    np.testing.assert_array_equal(result.kernel(x), want)  # a legal reordering: the same bits
    assert ops.rel_error(want, op.reference(x)) < op.tolerance


def test_tma_kernels_are_refused_clearly():
    # the optimizer's launches pass pointers and scalars, not the tensor maps a TMA kernel reads through
    from polytile.ops.gpu_schedules import gemm_wgmma
    s = pt.Schedule(ops.matmul(256, 256, 256, "float16").func)
    gemm_wgmma(s, "C", "A", "B", bm=128, bn=128, bk=64, stages=3, producer="tma")
    kern = pt.build(s, ARCH)
    a = np.zeros((256, 256), dtype=np.float16)
    with pytest.raises(LaunchError, match="reads its operands through TMA tensor maps.*producer='threads'"):
        polytile_launch(kern, [a, a])
