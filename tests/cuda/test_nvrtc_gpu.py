"""On a Hopper GPU: kernels compiled by NVRTC (``POLYTILE_CUDA_COMPILER=nvrtc``) against a float64
reference on random inputs at sizes off the tiles: wgmma and mma.sync GEMMs (``runtime.nvrtc``; its
code differs from nvcc's). M = 1 is not among them: these schedules refuse it at tensorize."""

import pytest
from gpu_inputs import skip_unless_hopper

import polytile as pt
from polytile import ops
from polytile.ops.gpu_schedules import gemm_tensorcore, gemm_wgmma
from polytile.toolchain import find_nvrtc

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(find_nvrtc() is None, reason="needs NVRTC")]
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _nvrtc(monkeypatch, tmp_path):
    skip_unless_hopper(torch, "NVRTC's sm_90a kernels")
    monkeypatch.setenv("POLYTILE_CUDA_COMPILER", "nvrtc")
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path))


def _inputs(seed, shapes):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.rand(s, device="cuda", generator=g) * 2 - 1).half() for s in shapes]


@pytest.mark.parametrize("dims,cfg", [((345, 567, 789), dict(bm=128, bn=256, bk=64, stages=3)),
                                      ((97, 130, 61), dict(bm=64, bn=128, bk=32, stages=4, inflight=1)),
                                      ((70, 8, 20), dict(bm=64, bn=8, bk=16, stages=2))])
def test_nvrtc_wgmma_matmul(dims, cfg):
    M, N, K = dims
    s = pt.Schedule(ops.matmul(M, N, K, "float16").func)
    gemm_wgmma(s, "C", "A", "B", **cfg)
    kern = pt.build(s, "cuda")
    a, b = _inputs(M + N + K, [(M, K), (K, N)])
    ref = a.double() @ b.double()
    assert float((kern(a, b).double() - ref).norm() / ref.norm()) < 1e-5


def test_nvrtc_mma_sync_matmul():
    M, N, K = 131, 77, 53
    s = pt.Schedule(ops.matmul(M, N, K, "float16").func)
    gemm_tensorcore(s, "C", "A", "B")
    kern = pt.build(s, "cuda")
    assert "mma.sync" in kern.source
    a, b = _inputs(7, [(M, K), (K, N)])
    ref = a.double() @ b.double()
    assert float((kern(a, b).double() - ref).norm() / ref.norm()) < 1e-5
