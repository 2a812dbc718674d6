"""16-bit GEMMs whose reduction is shorter than the tensor cores' K step (K < 16) take the CUDA cores:
the tensor-core schedules tensorize whole K steps, and K = 8 did not build (``tensorize of C: loop k3
must run over 0..15``). The choice and the kernels nvcc builds for sm_90a and sm_80; numerics on the CPU's
block emulator (tests/cuda/block_emulator.py) and on a GPU in test_short_reductions_gpu.py."""

import block_emulator
import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.dtypes import as_dtype
from polytile.ops.gpu_schedules import gemm_choice
from polytile.target import CUDATarget

SM90A, SM80 = CUDATarget(arch="sm_90a"), CUDATarget(arch="sm_80")


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("target", [SM90A, SM80], ids=["sm_90a", "sm_80"])
@pytest.mark.parametrize("dims", [(129, 65, 8, "float16"), (64, 64, 1, "bfloat16"), (200, 33, 15, "float16")],
                         ids=["129x65x8", "64x64x1-bf16", "200x33x15"])
def test_short_reductions_build_on_the_cuda_cores(target, dims):
    M, N, K, dt = dims
    assert gemm_choice(target, M, N, K, as_dtype(dt), out_bytes=2).kernel == "cuda"
    kern = pt.build(ops.matmul(M, N, K, dt, out_dtype=dt).schedule(target), target)
    assert len(kern.kernels) == 1 and "mma" not in kern.source


def test_batched_short_reductions_leave_the_tensor_cores():
    for batch, M in ((3, 40), (4, 9)):
        c = gemm_choice(SM90A, M, 33, 5, as_dtype("bfloat16"), batch=batch, out_bytes=2)
        assert c.kernel in ("cuda", "gemv"), (batch, M, c.kernel)
    # 16 is one whole K step: the tensor cores as before
    assert gemm_choice(SM90A, 200, 64, 16, as_dtype("float16"), out_bytes=2).kernel == "wgmma"
    assert gemm_choice(SM80, 200, 64, 16, as_dtype("float16"), out_bytes=2).kernel == "mma"


@pytest.mark.parametrize("dims", [(129, 65, 8, "float16"), (64, 64, 1, "bfloat16"), (37, 70, 3, "float16")],
                         ids=["129x65x8", "64x64x1-bf16", "37x70x3"])
def test_short_reduction_is_the_product_on_the_block_emulator(dims):
    M, N, K, dt = dims
    op = ops.matmul(M, N, K, dt)
    a, b = op.make_inputs(np.random.default_rng(M + N + K))
    (out,) = block_emulator.run(pt.lower(op.schedule(SM90A), SM90A), [a, b, np.zeros((M, N), np.float32)])
    assert ops.rel_error(out, op.reference(a, b)) <= op.tolerance
