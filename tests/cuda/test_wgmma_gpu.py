"""On a Hopper GPU: warpgroup-MMA GEMMs (float16, bfloat16) against a float64 reference on random
inputs, with sizes that do not divide the tiles, for several tiles and 1 to 6 pipeline stages."""

import pytest
from gpu_inputs import skip_unless_hopper
from source_text import body

import polytile as pt
from polytile import ops
from polytile.ops.gpu_schedules import gemm_wgmma

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(autouse=True)
def _hopper():
    skip_unless_hopper(torch, "wgmma GEMMs")


def _inputs(seed, shapes, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.rand(s, device="cuda", generator=g) * 2 - 1).to(TORCH_DTYPES[dtype]) for s in shapes]


def _err(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


# swizzled A and B (K tile and N tile multiples of 64), either one, or neither (core matrices)
CONFIGS = [
    ((345, 567, 789), dict(bm=128, bn=256, bk=64, stages=3)),
    ((260, 300, 700), dict(bm=128, bn=256, bk=128, stages=2)),
    ((300, 264, 200), dict(bm=64, bn=128, bk=32, stages=4)),
    ((200, 200, 1000), dict(bm=128, bn=64, bk=16, stages=2)),
    ((64, 40, 48), dict(bm=64, bn=40, bk=32, stages=1)),
    ((1000, 1000, 520), dict(bm=192, bn=96, bk=64, stages=5)),
    ((70, 8, 20), dict(bm=64, bn=8, bk=16, stages=2)),  # one column tile per warp: N = 8
    ((129, 136, 24), dict(bm=128, bn=136, bk=64, stages=3, inflight=1)),  # K: one and a half steps
    ((600, 300, 333), dict(bm=256, bn=128, bk=64, stages=4, inflight=1)),  # four warpgroups, partial tiles
]


@pytest.mark.parametrize("dims,cfg", CONFIGS, ids=[f"{d[0]}x{d[1]}x{d[2]}" for d, _ in CONFIGS])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_matmul(dims, cfg, dtype):
    M, N, K = dims
    s = pt.Schedule(ops.matmul(M, N, K, dtype).func)
    gemm_wgmma(s, "C", "A", "B", **cfg)
    kern = pt.build(s, "cuda")
    a, b = _inputs(M + N + K, [(M, K), (K, N)], dtype)
    out = kern(a, b)
    assert out.dtype == torch.float32
    assert _err(out, a.double() @ b.double()) < 1e-5


@pytest.mark.parametrize("stages,inflight", [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (3, 1), (4, 1),
                                             (4, 2), (6, 2)])
def test_wgmma_pipeline_stages(stages, inflight):
    # K = 200 is not a multiple of the 32-wide K tile; M and N cut the block tiles too; with groups
    # in flight the copies run fewer tiles ahead
    M, N, K = 200, 264, 200
    s = pt.Schedule(ops.matmul(M, N, K, "float16").func)
    gemm_wgmma(s, "C", "A", "B", bm=128, bn=128, bk=32, stages=stages, inflight=inflight)
    a, b = _inputs(11, [(M, K), (K, N)], "float16")
    assert _err(pt.build(s, "cuda")(a, b), a.double() @ b.double()) < 1e-5


def test_wgmma_batch_matmul():
    bt, M, N, K = 6, 100, 72, 80
    s = pt.Schedule(ops.batch_matmul(bt, M, N, K, "bfloat16").func)
    gemm_wgmma(s, "C", "A", "B", bm=64, bn=72, bk=32, stages=3, batch="bb")
    a, b = _inputs(5, [(bt, M, K), (bt, K, N)], "bfloat16")
    assert _err(pt.build(s, "cuda")(a, b), a.double() @ b.double()) < 1e-5


def test_default_batch_matmul_is_wgmma():
    op = ops.batch_matmul(3, 130, 70, 90, "float16")
    kern = op.build("cuda")
    assert "pt_wgmma_m64n" in body(kern.source)
    a, b = _inputs(9, [(3, 130, 90), (3, 90, 70)], "float16")
    assert _err(kern(a, b), a.double() @ b.double()) < 1e-5


CONVS = [
    # (N, H, W, C, K, stride, padding), tiles: channels and filters that cut the 64-wide tiles, stride 2
    ((2, 9, 9, 96, 72, 1, 1), dict(bm=64, bn=64, bk=64, stages=3, inflight=1)),
    ((3, 14, 14, 128, 256, 1, 1), dict(bm=128, bn=128, bk=64, stages=4, inflight=1)),
    ((2, 15, 15, 64, 128, 2, 1), dict(bm=128, bn=64, bk=64, stages=2, inflight=0)),
    # 98 output pixels: the last warp of the second warpgroup has no rows (it still joins the MMA)
    ((2, 7, 7, 128, 64, 1, 1), dict(bm=128, bn=64, bk=64, stages=4, inflight=1)),
    # the tuning space's wide 64-row tiles and MMA groups in flight: 243 pixels, 320 filters (the second
    # 256-wide tile holds 64), 5 channel tiles; 200 filters in 192-wide tiles, stride 2, two groups in flight
    ((3, 9, 9, 320, 320, 1, 1), dict(bm=64, bn=256, bk=64, stages=5, inflight=1)),
    ((1, 15, 15, 192, 200, 2, 1), dict(bm=64, bn=192, bk=64, stages=6, inflight=2)),
    ((3, 7, 7, 256, 128, 1, 1), dict(bm=128, bn=128, bk=64, stages=5, inflight=0)),
]


@pytest.mark.parametrize("dims,cfg", CONVS, ids=[f"conv{k}" for k in range(len(CONVS))])
def test_wgmma_conv2d_igemm(dims, cfg):
    from polytile.ops.gpu_schedules import igemm_wgmma
    N, H, W, C, K, stride, padding = dims
    op = ops.conv2d_igemm(N, H, W, C, K, 3, 3, stride, padding, dtype="float16")
    s = pt.Schedule(op.func)
    igemm_wgmma(s, "O", "col", "Wt", ["r", "s"], **cfg)
    kern = pt.build(s, "cuda")
    x, w = _inputs(N + C, [(N, H, W, C), (3, 3, C, K)], "float16")
    ref = torch.from_numpy(op.reference(x.cpu().numpy(), w.cpu().numpy())).cuda()
    assert _err(kern(x, w), ref) < 1e-5


def test_default_conv3d_is_wgmma():
    op = ops.conv3d_igemm(1, 6, 7, 7, 64, 64, 3, 3, 3, 1, 1, dtype="bfloat16")
    kern = op.build("cuda")
    assert "pt_wgmma_m64n" in body(kern.source)
    x, w = _inputs(3, [(1, 6, 7, 7, 64), (3, 3, 3, 64, 64)], "bfloat16")
    ref = torch.from_numpy(op.reference(x.float().cpu().numpy(), w.float().cpu().numpy())).cuda()
    assert _err(kern(x, w), ref) < 1e-5


def _gemm_bt(M, N, K, dtype):
    """C = A · Bᵀ with B stored [n][k] (a linear layer's weight): wgmma reads it K-major."""
    A = pt.placeholder((M, K), dtype, "A")
    B = pt.placeholder((N, K), dtype, "B")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(A[i, k].astype("float32") * B[j, k].astype("float32"), axis=k), "C")
    return pt.Func([A, B], [C], name="hgemm_bt")


# swizzled K-major B (bk 64 or 128, through TMA or cp.async), core matrices (bk 32), N = 8
BT_CONFIGS = [
    ((345, 567, 789), dict(bm=128, bn=128, bk=64, stages=3, inflight=1)),
    ((128, 768, 768), dict(bm=64, bn=64, bk=64, stages=4, inflight=1, producer="tma")),
    ((128, 768, 3072), dict(bm=64, bn=64, bk=128, stages=5, inflight=1, producer="tma")),
    ((300, 264, 200), dict(bm=64, bn=128, bk=32, stages=4)),
    ((70, 8, 20), dict(bm=64, bn=8, bk=16, stages=2)),
]


@pytest.mark.parametrize("dims,cfg", BT_CONFIGS, ids=[f"{d[0]}x{d[1]}x{d[2]}" for d, _ in BT_CONFIGS])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_matmul_of_a_transposed_b(dims, cfg, dtype):
    M, N, K = dims
    s = pt.Schedule(_gemm_bt(M, N, K, dtype))
    gemm_wgmma(s, "C", "A", "B", **cfg)
    a, b = _inputs(M + N + K, [(M, K), (N, K)], dtype)
    assert _err(pt.build(s, "cuda")(a, b), a.double() @ b.double().T) < 1e-5


@pytest.mark.parametrize("values", [dict(tile="wgmma:64x256x64", split="c2", stages=5, inflight=2),
                                    dict(tile="wgmma:128x128x64", split="rows+c2", stages=4, inflight=0)])
def test_conv_template_wide_tiles_and_groups_in_flight(values):
    """Configurations of the convolution template's new decisions (wide 64-row tiles, MMA groups in
    flight) with a split reduction, at sizes off the tiles: 3×7×7 input, 256 channels in two chunks,
    320 filters."""
    from polytile.tune import make_task
    op = ops.conv2d_igemm(3, 7, 7, 256, 320, 3, 3, 1, 1, dtype="float16")
    task = make_task(op, "cuda")
    cfg = task.space.from_values(values)
    assert task.space.reason_invalid(cfg.digits) is None
    kern = pt.build(task.schedule(cfg.values), "cuda")
    x, w = _inputs(5, [(3, 7, 7, 256), (3, 3, 256, 320)], "float16")
    ref = torch.from_numpy(op.reference(x.cpu().numpy(), w.cpu().numpy())).cuda()
    assert _err(kern(x, w), ref) < 1e-5
