"""GEMMs of 16-bit results whose rows are only 2-byte aligned (an odd N) computed in padded rows and
copied out (``gpu_schedules.padded_output``, where ``PADDED_OUTPUT_ELEMENTS`` admits them): the
padded algorithm against NumPy on the CPU at sizes off the tiles, the default's decision, and the
kernels nvcc builds for sm_90a (16-byte stores of the product, the copy-out a thread per element).
Numerics on a GPU: test_padded_output_gpu.py."""

import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.codegen.cuda import cuda_source
from polytile.dtypes import as_dtype
from polytile.lowering.pipeline import lower
from polytile.ops import gpu_schedules
from polytile.ops.gpu_schedules import gemm_choice, pads_output
from polytile.ops.matmul import matmul_padded_func
from polytile.runtime.cuda import index32_ok
from polytile.target import CUDATarget
from polytile.tune import make_task

SM90A = CUDATarget(arch="sm_90a")
f16 = as_dtype("float16")


@pytest.mark.parametrize("dims", [(5, 7, 3), (3, 9, 11), (1, 1, 1), (17, 33, 8)], ids=str)
def test_padded_product_is_the_product(dims):
    M, N, K = dims
    op = ops.matmul(M, N, K, "float32")
    func = matmul_padded_func(M, N, K, "float32")
    assert int(func.tensor("Cp").shape[-1].value) == -(-N // 4) * 4  # float32: rows of 16-byte multiples
    kern = pt.build(pt.Schedule(func), "cpu")
    a, b = op.make_inputs(np.random.default_rng(sum(dims)))
    assert ops.rel_error(kern(a, b), op.reference(a, b)) < 1e-6


def test_only_large_odd_16_bit_outputs_are_padded():
    c = gemm_choice(SM90A, 1001, 10781, 71, f16, out_bytes=2)
    assert pads_output(c, 1001, 10781, 2, least=1 << 20)
    assert not pads_output(c, 1001, 10781, 2, least=0)            # the bound off
    assert not pads_output(c, 1001, 10781, 4, least=1 << 20)      # float32 results: pairs are 8-byte aligned
    assert not pads_output(c, 1001, 10782, 2, least=1 << 20)      # even N: 4-byte pairs
    assert not pads_output(c, 101, 1001, 2, least=1 << 20)        # few results
    gemv = gemm_choice(SM90A, 2, 10781, 71, f16, out_bytes=2)
    assert not pads_output(gemv, 2, 10781, 2, least=1)            # the GEMVs write their own rows


def test_the_measured_bound_is_off_by_default():
    # padded where measured faster on an H200 (1001×10781×71 fp16 53.1 µs against 67.5; 2085×3175×113
    # bf16 39.9 against 47.0) with a bound of 6M results; off by default since GPT-2's 128×50257×768
    # vocabulary projection (6.4M results) measured 1.8× slower padded
    measured = [(1001, 10781, 71, "float16"), (2085, 3175, 113, "bfloat16")]
    for M, N, K, dt in measured:
        choice = gemm_choice(SM90A, M, N, K, as_dtype(dt), out_bytes=2)
        assert pads_output(choice, M, N, 2, least=6_000_000) and not pads_output(choice, M, N, 2)
    assert not pads_output(gemm_choice(SM90A, 300, 517, 71, f16, out_bytes=2), 300, 517, 2, least=6_000_000)


@pytest.mark.needs_nvcc
def test_the_default_pads_where_the_bound_admits(monkeypatch):
    monkeypatch.setattr(gpu_schedules, "PADDED_OUTPUT_ELEMENTS", 1 << 16)
    kern = pt.build(ops.matmul(300, 517, 71, "float16", out_dtype="float16").schedule(SM90A), SM90A)
    names = [k.name for k in kern.kernels]
    src = kern.source
    # B padded, A aligned (K = 71), the product, the copy-out
    assert len(names) == 4 and "Bp" in src and "A_aligned" in src and "Cp" in src
    product = next(k for k in kern.kernels if "pt_wgmma" in src.split(f" {k.name}(")[1].split("__global__")[0])
    body = src.split(f" {product.name}(")[1].split("__global__")[0]
    assert "pt_store_packed(&Cp[" in body  # exchanged accumulators, 16-byte stores
    monkeypatch.setattr(gpu_schedules, "PADDED_OUTPUT_ELEMENTS", 0)
    assert len(pt.build(ops.matmul(300, 517, 71, "float16", out_dtype="float16").schedule(SM90A),
                        SM90A).kernels) == 3


def test_the_wgmma_template_starts_at_the_padded_default(monkeypatch):
    monkeypatch.setattr(gpu_schedules, "PADDED_OUTPUT_ELEMENTS", 6_000_000)

    def code(sched):
        low = lower(sched, SM90A)
        source, kernels = cuda_source(low, index32_ok(low))
        return source, [(k.name, [str(g) for g in k.grid], list(k.block)) for k in kernels]

    op = ops.matmul(1001, 10781, 71, "float16", out_dtype="float16")
    task = make_task(op, SM90A)
    default = task.space.default
    assert task.space.reason_invalid(default.digits) is None
    source, kernels = code(task.schedule(default.values))
    assert (source, kernels) == code(op.schedule(SM90A)) and len(kernels) == 4 and "Cp" in source
