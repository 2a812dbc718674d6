"""On a GPU: tensor-core GEMMs (float16, bfloat16) against a float64 reference on random inputs, with
sizes that do not divide the tiles, for 1 to 6 pipeline stages (pipelined equals unpipelined)."""

import pytest

import polytile as pt
from polytile import ops
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


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5, 6])
def test_pipeline_stages_equal(stages):
    # K = 200 is not a multiple of the 32-wide K tile; M and N cut the block tiles too
    M, N, K = 200, 264, 200
    a, b = _inputs(stages, [(M, K), (K, N)], "float16")
    outs = []
    for st in (1, stages):
        s = pt.Schedule(_hgemm(M, N, K, "float16"))
        gemm_tensorcore(s, "C", "A", "B", stages=st)
        outs.append(pt.build(s, "cuda")(a, b))
    ref = a.double() @ b.double()
    assert _err(outs[0], ref) < 1e-5 and _err(outs[1], ref) < 1e-5
    assert float((outs[0] - outs[1]).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_tensor_core_batch_matmul():
    Bt, M, N, K = 5, 72, 64, 40
    kern = ops.batch_matmul(Bt, M, N, K, "bfloat16").build("cuda")
    a, b = _inputs(7, [(Bt, M, K), (Bt, K, N)], "bfloat16")
    assert _err(kern(a, b), a.double() @ b.double()) < 1e-5
