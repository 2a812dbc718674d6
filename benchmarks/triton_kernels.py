"""Triton's tutorial kernels (matmul fp16, fused softmax, layer-norm forward), written after the
public tutorials for the SASS benchmark, and `fma3`, the small kernel of the SASS GPU tests. Each is a
plain `@triton.jit` function; `tutorial_launches` and `fma3_launch` compile them through
`polytile.sass.triton_kernel.triton_launch` with the launch options the benchmark, the GPU tests and
tests/sass/kernels/triton/build.py share."""

import numpy as np
import triton
import triton.language as tl

from polytile.sass.launch import CubinLaunch
from polytile.sass.triton_kernel import triton_launch


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(c_ptr.dtype.element_ty)  # fp16 for the SASS benchmark, fp32 in benchmarks/pipelining.py
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn, c, mask=mask)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols, BLOCK_SIZE: tl.constexpr):
    start = tl.program_id(0)
    step = tl.num_programs(0)
    for row in tl.range(start, n_rows, step):
        cols = tl.arange(0, BLOCK_SIZE)
        x = tl.load(in_ptr + row * in_row_stride + cols, mask=cols < n_cols, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)


@triton.jit
def layernorm_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, stride, N, eps, BLOCK_SIZE: tl.constexpr
):
    row = tl.program_id(0)
    x_ptr += row * stride
    y_ptr += row * stride
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        acc += tl.load(x_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(x_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        x = tl.where(cols < N, x - mean, 0.0)
        acc += x * x
    rstd = 1 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(w_ptr + cols, mask=mask)
        b = tl.load(b_ptr + cols, mask=mask)
        x = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + cols, ((x - mean) * rstd * w + b).to(tl.float16), mask=mask)


@triton.jit
def fma3(x_ptr, y_ptr, z_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    z = tl.load(z_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * y + z * x - y, mask=mask)


def fma3_launch(n: int = 1 << 20, **options) -> CubinLaunch:
    """fma3 over n float32 elements, 1024 per program (`options` go to `triton_launch`)."""
    arrays = [np.zeros(n, np.float32) for _ in range(4)]
    return triton_launch(fma3, [*arrays, n], grid=(n // 1024,), constexprs={"BLOCK": 1024},
                         outputs=["out_ptr"], **options)


def tutorial_launches(**options) -> dict[str, CubinLaunch]:
    """The SASS benchmark's Triton workloads by name: fp16 matmul 2048³ (128×128×64 tiles, 8 warps,
    3 stages), softmax and layernorm of 2048×4096 rows (`options` go to `triton_launch`)."""
    m = n = k = 2048
    a, b, c = np.zeros((m, k), np.float16), np.zeros((k, n), np.float16), np.zeros((m, n), np.float16)
    rows, cols = 2048, 4096
    x = np.zeros((rows, cols), np.float32)
    xh, w = np.zeros((rows, cols), np.float16), np.zeros(cols, np.float16)
    stats = np.zeros(rows, np.float32)
    return {
        "triton-matmul-fp16": triton_launch(
            matmul_kernel, [a, b, c, m, n, k, k, 1, n, 1, n, 1], grid=((m // 128) * (n // 128),),
            constexprs={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, outputs=["c_ptr"],
            num_warps=8, num_stages=3, name="triton-matmul-fp16", **options),
        "triton-softmax": triton_launch(
            softmax_kernel, [np.zeros_like(x), x, cols, cols, rows, cols], grid=(rows,),
            constexprs={"BLOCK_SIZE": cols}, outputs=["out_ptr"], num_warps=8, num_stages=2,
            name="triton-softmax", **options),
        "triton-layernorm": triton_launch(
            layernorm_kernel, [xh, np.zeros_like(xh), w, w.copy(), stats, stats.copy(), cols, cols, 1e-5],
            grid=(rows,), constexprs={"BLOCK_SIZE": 1024}, outputs=["y_ptr", "mean_ptr", "rstd_ptr"],
            num_warps=8, name="triton-layernorm", **options),
    }
