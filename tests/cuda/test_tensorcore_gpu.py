"""On a GPU: tensor-core GEMMs (float16, bfloat16) against a float64 reference on random inputs, with
sizes that do not divide the tiles, for 1 to 6 pipeline stages (pipelined equals unpipelined)."""

import numpy as np
import pytest
from source_text import body

import polytile as pt
from polytile import ops
from polytile.ops.base import rel_error
from polytile.ops.gpu_schedules import gemm_tensorcore

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _inputs(seed, shapes, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.rand(s, device="cuda", generator=g) * 2 - 1).to(TORCH_DTYPES[dtype]) for s in shapes]


def _err(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


def _hgemm(M, N, K, dtype):
    A = pt.placeholder((M, K), dtype, "A")
    B = pt.placeholder((K, N), dtype, "B")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), "C")
    return pt.Func([A, B], [C], name="hgemm")


@pytest.mark.parametrize("M,N,K", [(345, 567, 789), (300, 264, 200), (256, 256, 256), (64, 48, 32)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_matmul(M, N, K, dtype):
    kern = ops.matmul(M, N, K, dtype).build("cuda")
    a, b = _inputs(M * N + K, [(M, K), (K, N)], dtype)
    out = kern(a, b)
    assert out.dtype == torch.float32
    assert _err(out, a.double() @ b.double()) < 1e-5


@pytest.mark.parametrize("M,N,K", [(345, 567, 789), (128, 768, 768), (64, 48, 32)])
def test_tensor_core_matmul_of_a_transposed_b(M, N, K):
    # B stored [n][k] (a linear layer's weight): fragments loaded by ldmatrix without .trans
    A = pt.placeholder((M, K), "float16", "A")
    B = pt.placeholder((N, K), "float16", "B")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(A[i, k].astype("float32") * B[j, k].astype("float32"), axis=k), "C")
    s = pt.Schedule(pt.Func([A, B], [C], name="hgemm_bt"))
    gemm_tensorcore(s, "C", "A", "B", bm=64, bn=64, wm=32, wn=32, bk=32, stages=3, reg_stages=2)
    a, b = _inputs(M + N + K, [(M, K), (N, K)], "float16")
    assert _err(pt.build(s, "cuda")(a, b), a.double() @ b.double().T) < 1e-5


_UNPIPELINED: dict = {}


def _run(stages, reg_stages, a, b):
    M, N, K = 200, 264, 200
    s = pt.Schedule(_hgemm(M, N, K, "float16"))
    gemm_tensorcore(s, "C", "A", "B", stages=stages, reg_stages=reg_stages)
    return pt.build(s, "cuda")(a, b)


@pytest.mark.parametrize("reg_stages", [1, 2])
@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5, 6])
def test_pipeline_stages_equal(stages, reg_stages):
    # K = 200 is not a multiple of the 32-wide K tile; M and N cut the block tiles too; with two
    # register stages the pipelines are multi-level (fused when the tiles are whole)
    a, b = _inputs(11, [(200, 200), (200, 264)], "float16")
    if "ref" not in _UNPIPELINED:
        _UNPIPELINED["ref"] = _run(1, 1, a, b)
    out = _run(stages, reg_stages, a, b)
    ref = a.double() @ b.double()
    assert _err(out, ref) < 1e-5
    assert float((out - _UNPIPELINED["ref"]).abs().max()) <= 1e-5 * float(ref.abs().max())


@pytest.mark.parametrize("stages", [2, 4])
def test_fused_multi_level_pipeline(stages):
    # whole tiles: the register pipeline is fused into the shared one (inner prologue in the loop)
    M, N, K = 256, 256, 512
    a, b = _inputs(stages, [(M, K), (K, N)], "bfloat16")
    s = pt.Schedule(_hgemm(M, N, K, "bfloat16"))
    gemm_tensorcore(s, "C", "A", "B", stages=stages, bk=64, reg_stages=2)
    kern = pt.build(s, "cuda")
    assert "} else {" in body(kern.source)  # the last inner step loads the next tile's fragments
    assert _err(kern(a, b), a.double() @ b.double()) < 1e-5


def test_tensor_core_batch_matmul():
    Bt, M, N, K = 5, 72, 64, 40
    kern = ops.batch_matmul(Bt, M, N, K, "bfloat16").build("cuda")
    a, b = _inputs(7, [(Bt, M, K), (Bt, K, N)], "bfloat16")
    assert _err(kern(a, b), a.double() @ b.double()) < 1e-5


@pytest.mark.parametrize("shape", [(3, 9, 11, 64, 72, 3, 3, 1, 1), (2, 14, 14, 256, 256, 3, 3, 1, 1),
                                   (2, 15, 13, 32, 40, 3, 3, 2, 1),
                                   # 16 pixels, 4 and 1 (mma.sync; the CUDA cores): test_shapes.py's builds
                                   (1, 4, 4, 256, 256, 3, 3, 1, 1), (1, 2, 2, 128, 64, 3, 3, 1, 1),
                                   (1, 1, 1, 256, 96, 3, 3, 1, 1)])
def test_conv2d_implicit_gemm(shape):
    op = ops.conv2d_igemm(*shape)
    kern = op.build("cuda")
    rng = np.random.default_rng(11)
    args = op.make_inputs(rng)
    out = kern(*args)
    assert rel_error(out, op.reference(*args)) < 1e-4


def test_conv3d_implicit_gemm():
    op = ops.conv3d_igemm(2, 5, 9, 10, 32, 48, 3, 3, 3, 1, 1)
    kern = op.build("cuda")
    args = op.make_inputs(np.random.default_rng(12))
    assert rel_error(kern(*args), op.reference(*args)) < 1e-4
