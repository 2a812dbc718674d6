"""The CPU kernels of the model targets (issue 18) through the backend, at sizes off every tile: a
linear layer's product with its epilogue (K in one block: the column block sized for it, A read in
place, W packed row by row), and a convolution's batch norm, ReLU and residual over maps whose rows
are shorter than a vector (the map's rows fused into one vector loop, the channels outside it).
Compared with eager torch on fresh random inputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch_helpers import compile_and_compare

from polytile.ops.matmul import cpu_gemm_tiles
from polytile.target import cpu_target
from polytile.torch.schedules import inner_dims


@pytest.mark.parametrize("M,N,K", [(37, 53, 1031), (1, 19, 127), (130, 67, 97)])
@pytest.mark.parametrize("gelu", [False, True])
def test_linear_with_epilogue_whole_k(M: int, N: int, K: int, gelu: bool) -> None:
    torch.manual_seed(M + N + K)
    lin = torch.nn.Linear(K, N)
    x, r = torch.randn(M, K), torch.randn(M, N)

    def fn(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        y = lin(x)
        return (F.gelu(y) if gelu else y) + r

    report = compile_and_compare(fn, x, r)
    assert [g.kind for g in report.taken] == ["gemm"] and not report.left


def test_whole_k_tiles_fit_the_packed_panel_in_l2() -> None:
    """K in one block: B's packed panel (K × NC) within half the L2 cache (one register tile of
    columns at least), A not packed; the default tiles keep their K block and packed A."""
    for target in (cpu_target(), dataclasses.replace(cpu_target(), vector_bits=256, l2_bytes=512 * 1024)):
        for M, N, K in [(128, 768, 3072), (128, 768, 768), (37, 53, 1031)]:
            t = cpu_gemm_tiles(M, N, K, target, whole_k=True)
            assert t["kc"] == K and t["pack_a"] is False
            assert t["nc"] == t["nr"] or t["nc"] * K * 4 <= target.l2_bytes // 2
            assert t["nc"] % t["nr"] == 0
        assert "pack_a" not in cpu_gemm_tiles(128, 768, 3072, target) and \
            cpu_gemm_tiles(128, 768, 3072, target)["kc"] < 3072


@pytest.mark.parametrize("C,H,W,K,R,stride", [(5, 7, 7, 19, 3, 1), (13, 13, 13, 37, 1, 1), (6, 9, 5, 17, 3, 2),
                                              (3, 11, 11, 35, 1, 1)])
@pytest.mark.parametrize("residual", [False, True])
def test_conv_batch_norm_relu_residual_on_short_rows(C: int, H: int, W: int, K: int, R: int, stride: int,
                                                     residual: bool) -> None:
    torch.manual_seed(C * H + K)
    conv = torch.nn.Conv2d(C, K, R, stride=stride, padding=R // 2, bias=False)
    bn = torch.nn.BatchNorm2d(K).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    x = torch.randn(1, C, H, W)
    r = torch.randn_like(conv(x))

    def fn(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        y = bn(conv(x))
        return torch.relu(y + r if residual else y)

    report = compile_and_compare(fn, x, r)
    assert [g.kind for g in report.taken] == ["conv"] and not report.left


@pytest.mark.parametrize("shape,width,inner", [([1, 256, 56, 56], 16, 1), ([1, 256, 14, 14], 16, 2),
                                               ([1, 2048, 7, 7], 16, 2), ([1, 3, 3, 3], 16, 3), ([5], 16, 1),
                                               ([128, 768], 16, 1), ([4, 2, 3], 4, 2)])
def test_elementwise_vector_loop_spans_short_rows(shape: list[int], width: int, inner: int) -> None:
    assert inner_dims(shape, width) == inner
