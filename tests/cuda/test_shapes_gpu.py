"""On a GPU: the default schedules of the shape suite's new paths against a float64 torch reference, on
fresh random inputs at sizes off the tiles — matrix–vector products (M = 1, 8), split reductions,
rows that are not 16-byte aligned (odd K or N), primes, convolutions of 3 input channels and rows
too wide for shared memory."""

import pytest

import polytile as pt
from polytile import ops

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _inputs(op, seed, lo=-1.0, hi=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    tdt = getattr(torch, op.func.inputs[0].dtype.name)
    shapes = [tuple(int(d.value) for d in t.shape) for t in op.func.inputs]
    return [(torch.rand(s, device="cuda", generator=g) * (hi - lo) + lo).to(tdt) for s in shapes]


def _err(out, ref):
    assert torch.isfinite(out).all()
    return float((out.double() - ref).norm() / ref.norm())


MATMULS = [
    ((1, 4097, 4093), "bfloat16"),   # M = 1, odd N and a prime K: split in chunks of unequal length
    ((8, 768, 3072), "float16"),     # decoding: a split reduction over the GEMV kernel
    ((1, 1025, 1023), "float32"),
    ((16, 1000, 999), "float16"),    # the last GEMV size, odd K
    ((127, 255, 4096), "bfloat16"),  # few output tiles, long K: split wgmma on aligned copies of B
    ((33, 1000, 999), "float16"),    # K not a multiple of 8: aligned copy of A
    ((997, 1009, 1013), "float16"),  # primes
    ((128, 1024, 4096), "float32"),  # split on the CUDA cores
    ((4095, 4097, 1023), "float16"),  # the odd K and N
    ((13, 1001, 999), "float16"),    # odd N, 13 rows: B read in place by the direct GEMV
    ((1, 50257, 768), "float16"),    # GPT-2's vocabulary row: odd N
    ((5, 2000, 8191), "float16"),    # a prime K, 5 rows
]


@pytest.mark.parametrize("dims,dtype", MATMULS, ids=[f"{d[0]}x{d[1]}x{d[2]}-{t}" for d, t in MATMULS])
def test_default_matmul(dims, dtype):
    M, N, K = dims
    op = ops.matmul(M, N, K, dtype)
    kern = op.build("cuda")
    a, b = _inputs(op, M + N + K)
    out = kern(a, b)
    assert out.shape == (M, N) and out.dtype == torch.float32
    assert _err(out, a.double() @ b.double()) <= op.tolerance


@pytest.mark.parametrize("M,K,split", [(64, 1024, 2), (64, 1024, 4), (8, 1000, 5), (8, 1001, 7), (8, 1001, 6),
                                       (1, 4093, 16)])
def test_explicit_split(M, K, split):
    # tensor cores: whole chunks of K tiles; the GEMV kernel: chunks of 200 and 143, not whole tiles
    op = ops.matmul(M, 200, K, "float16", split_k=split)
    kern = op.build("cuda")
    a, b = _inputs(op, split)
    assert len(kern.kernels) >= 2
    assert _err(kern(a, b), a.double() @ b.double()) <= op.tolerance


@pytest.mark.parametrize("dims", [(12, 1, 1024, 64), (32, 1, 128, 2048), (3, 5, 77, 300)])
def test_default_batch_gemv(dims):
    batch, M, N, K = dims
    op = ops.batch_matmul(batch, M, N, K, "float16")
    kern = op.build("cuda")
    a, b = _inputs(op, sum(dims))
    assert _err(kern(a, b), a.double() @ b.double()) <= op.tolerance


@pytest.mark.parametrize("dims", [(2, 29, 31, 3, 24, 7, 7, 2, 3), (1, 17, 17, 3, 32, 3, 3, 2, 1),
                                  (4, 32, 32, 3, 24, 3, 3, 1, 1),   # 4 pixels per thread, 8 channels per block
                                  (1, 16, 16, 3, 8, 3, 3, 1, 1),    # 2 pixels per thread
                                  (2, 64, 64, 3, 20, 5, 5, 2, 2),   # 4 pixels, 4 channels (20 = 5 × 4)
                                  (3, 19, 23, 3, 20, 5, 5, 2, 2),   # partial pixel tiles
                                  (8, 96, 96, 3, 32, 5, 5, 1, 2), (32, 224, 224, 3, 64, 7, 7, 2, 3),
                                  (2, 17, 19, 1, 16, 5, 5, 1, 2),   # one channel (padded to 4)
                                  (1, 21, 18, 5, 24, 3, 3, 2, 1),   # five channels (padded to 8)
                                  (2, 9, 11, 12, 40, 2, 2, 1, 0),   # twelve (padded to 16), an even filter
                                  # channels that are no whole 16-byte vectors, padded to a multiple of 16
                                  (32, 19, 19, 81, 12, 5, 5, 2, 2), (32, 17, 17, 209, 16, 1, 1, 1, 0),
                                  (8, 12, 12, 17, 115, 7, 7, 1, 3), (2, 33, 33, 100, 256, 3, 3, 1, 1),
                                  (1, 7, 7, 1001, 64, 3, 3, 1, 1),
                                  # aligned channels, fewer filters than a 128-wide wgmma tile (did not build)
                                  (2, 12, 12, 280, 112, 7, 7, 1, 3), (2, 8, 8, 376, 96, 3, 3, 1, 1)])
def test_conv_three_channels(dims):
    N, H, W, C, K, R, S, stride, pad = dims
    op = ops.conv2d_igemm(N, H, W, C, K, R, S, stride, pad, dtype="float16")
    kern = op.build("cuda")
    x, w = _inputs(op, sum(dims))
    ref = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(3, 2, 0, 1), stride=stride,
                                     padding=pad)
    ref = ref.permute(0, 2, 3, 1).reshape(-1, K)
    assert _err(kern(x, w), ref) <= op.tolerance


def _conv_nhwc_ref(x, w, stride, pad):
    K = w.shape[-1]
    ref = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(3, 2, 0, 1), stride=stride,
                                     padding=pad)
    return ref.permute(0, 2, 3, 1).reshape(-1, K)


SPLITS = [((1, 7, 7, 512, 512, 3, 3, 1, 1), None),            # the default's split (ResNet-50 l4 at batch 1)
          ((1, 9, 11, 128, 72, 3, 3, 2, 1), (True, 1)),       # odd sizes, stride 2: a chunk per filter row
          ((2, 5, 7, 128, 136, 3, 3, 1, 1), (True, 2)),       # rows and channel chunks, partial tiles
          ((1, 13, 13, 256, 64, 1, 1, 1, 0), (False, 4)),     # a 1×1 convolution in channel chunks
          ((3, 6, 5, 64, 40, 3, 2, 1, 1), (True, 1))]         # mma.sync (40 filters), a 3×2 filter


@pytest.mark.parametrize("dims,split", SPLITS, ids=["default-l4", "rows-odd", "rows-channels", "1x1", "mma-3x2"])
def test_conv_split_reduction(dims, split):
    from polytile.ops.conv_choice import igemm_kernel
    from polytile.ops.gpu_schedules import igemm_split_schedule
    from polytile.ops.igemm import conv2d_igemm_split_func
    from polytile.target import as_target
    N, H, W, C, K, R, S, stride, pad = dims
    op = ops.conv2d_igemm(*dims)
    if split is None:
        kern = op.build("cuda")
        assert len(kern.kernels) == 2
    else:
        P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
        kernel, params = igemm_kernel(as_target("cuda"), N * P * Q, C, K, R * S)
        func = conv2d_igemm_split_func(*dims, rows=split[0], channel_chunks=split[1])
        kern = pt.build(igemm_split_schedule(func, kernel, params, split[0]), "cuda")
    x, w = _inputs(op, sum(dims))
    assert _err(kern(x, w), _conv_nhwc_ref(x, w, stride, pad)) <= op.tolerance


CHOICES = [(32, 7, 7, 512, 512, 3, 3, 1, 1),   # ResNet-50 l4 at batch 32: 128×128 tiles in 2 channel chunks
           (3, 45, 45, 96, 160, 3, 3, 1, 1),  # 96 → 160: 128-wide filter tiles, half a K tile of zeros
           (2, 64, 64, 48, 72, 5, 5, 2, 2),   # 48 → 72, 5×5 stride 2 (mma.sync): K tiles of 16
           (3, 13, 11, 96, 136, 3, 3, 1, 1),  # odd map, filters off the 128-wide tiles
           (2, 9, 7, 48, 40, 3, 3, 2, 1),     # 40 filters (32-wide tiles), 48 channels, stride 2
           (4, 15, 15, 320, 200, 3, 3, 1, 1)]  # channels and filters off the tiles, several splits


@pytest.mark.parametrize("dims", CHOICES, ids=["l4-n32", "c96-k160", "c48-k72-5x5s2", "c96-k136-odd", "c48-k40",
                                               "c320-k200"])
def test_conv_model_choices(dims):
    # the default and the model's next two choices of tiles and split (igemm_options), each against
    # float64: the tiles and splits the gather-rate model may pick elsewhere
    from polytile.ops.conv_choice import igemm_options
    from polytile.ops.gpu_schedules import igemm_schedule
    from polytile.target import as_target
    N, H, W, C, K, R, S, stride, pad = dims
    op = ops.conv2d_igemm(*dims)
    x, w = _inputs(op, sum(dims))
    ref = _conv_nhwc_ref(x, w, stride, pad)
    assert _err(op.build("cuda")(x, w), ref) <= op.tolerance
    P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
    for choice in igemm_options(as_target("cuda"), N * P * Q, C, K, R, S, 2)[1:3]:
        sched = pt.Schedule(op.func)
        kern = pt.build(igemm_schedule(sched, as_target("cuda"), choice, *dims) or sched, "cuda")
        assert _err(kern(x, w), ref) <= op.tolerance, choice


NARROW = [(3, 17, 19, 16, 24, 3, 3, 2, 1),    # 16 channels (K tiles of 16), 24 filters (32-wide tiles)
          (2, 15, 13, 144, 24, 1, 1, 1, 0),  # MobileNet-v2's projection, off the tiles
          (2, 21, 19, 16, 96, 1, 1, 1, 0)]   # its expansion


@pytest.mark.parametrize("dims", NARROW, ids=["3x3-c16-k24", "1x1-c144-k24", "1x1-c16-k96"])
def test_conv_mma_narrow(dims):
    N, H, W, C, K, R, S, stride, pad = dims
    op = ops.conv2d_igemm(*dims)
    x, w = _inputs(op, sum(dims))
    assert _err(op.build("cuda")(x, w), _conv_nhwc_ref(x, w, stride, pad)) <= op.tolerance


NCHW = [(1, 1024, 14, 14, 256, 1, 1, 1, 0, 1),   # ResNet-50 l3.reduce: split reduction, a 1×1 filter
        (1, 512, 7, 7, 512, 3, 3, 1, 1, 1),      # l4 3×3: 49 pixels
        (3, 17, 9, 11, 40, 5, 5, 2, 2, 1),       # odd sizes, stride 2, padding 2
        (2, 13, 15, 13, 24, 3, 3, 1, 2, 2),      # dilation 2
        (2, 5, 9, 7, 11, 3, 3, 1, 1, 1)]         # 11 filters: the direct kernel


@pytest.mark.parametrize("dims", NCHW, ids=["1x1", "3x3-7x7", "odd-stride2", "dilated", "direct"])
@pytest.mark.parametrize("pad_stage", [True, False], ids=["pad-stage", "pad-select"])
def test_conv_nchw_float32(dims, pad_stage):
    N, C, H, W, K, R, S, stride, pad, dil = dims
    op = ops.conv2d(N, C, H, W, K, R, S, stride, pad, dil, pad_stage=pad_stage)
    kern = op.build("cuda")
    x, w = _inputs(op, sum(dims))
    ref = torch.nn.functional.conv2d(x.double(), w.double(), stride=stride, padding=pad, dilation=dil)
    out = kern(x, w)
    assert out.shape == ref.shape
    assert _err(out, ref) <= op.tolerance


def test_conv_nchw_int8_gemm():
    # int8 operands take the CUDA-core GEMM too (24 filters: not the direct kernel): exact int32 sums
    import numpy as np
    op = ops.conv2d(2, 5, 9, 7, 24, 3, 3, 1, 1, dtype="int8")
    rng = np.random.default_rng(3)
    inputs = [rng.integers(-128, 128, a.shape).astype(np.int8) for a in op.make_inputs(rng)]
    np.testing.assert_array_equal(np.asarray(op.build("cuda")(*inputs)), op.reference(*inputs))


@pytest.mark.parametrize("M,N", [(1, 128256), (8, 50257), (3, 30522), (5, 70001)])
def test_wide_softmax(M, N):
    op = ops.softmax(M, N)
    kern = op.build("cuda")
    (x,) = _inputs(op, N, -4.0, 4.0)
    assert _err(kern(x), torch.softmax(x.double(), dim=1)) <= op.tolerance


@pytest.mark.parametrize("M,N", [(16, 128256), (3, 70001)])
def test_wide_layernorm(M, N):
    op = ops.layernorm(M, N)
    kern = op.build("cuda")
    x, g, b = _inputs(op, N)
    ref = torch.nn.functional.layer_norm(x.double(), (N,), g.double(), b.double(), 1e-5)
    assert _err(kern(x, g, b), ref) <= op.tolerance


# --- float32 GEMMs on the CUDA cores: whole register tiles at sizes that divide no tile -------------

FP32_GEMMS = [(1009, 2003, 509), (17, 33, 7), (127, 129, 131), (129, 127, 1), (128, 1024, 4096), (777, 1531, 999),
              (256, 3000, 2000), (4099, 65, 3)]


def _poisoned(shape):
    return torch.full(shape, float("nan"), device="cuda", dtype=torch.float32)


@pytest.mark.parametrize("dims", FP32_GEMMS, ids=["x".join(map(str, d)) for d in FP32_GEMMS])
def test_fp32_matmul_whole_tiles(dims):
    M, N, K = dims
    op = ops.matmul(M, N, K, "float32")
    kern = op.build("cuda")
    for seed in (1, 2):  # fresh inputs each time, the output poisoned: every element must be written
        a, b = _inputs(op, seed + M + N + K)
        out = _poisoned((M, N))
        kern(a, b, out)
        assert _err(out, a.double() @ b.double()) <= op.tolerance


@pytest.mark.parametrize("tiles", [dict(bm=128, bn=128, tm=8, tn=8), dict(bm=128, bn=64, tm=8, tn=8),
                                   dict(bm=64, bn=128, tm=8, tn=8), dict(bm=64, bn=64, tm=8, tn=4),
                                   dict(bm=64, bn=64, tm=4, tn=4), dict(bm=32, bn=64, tm=4, tn=4),
                                   dict(bm=64, bn=64, tm=2, tn=8, bk=4, stages=1)],
                         ids=lambda t: "-".join(f"{k}{v}" for k, v in t.items()))
def test_fp32_gemm_cuda_tiles(tiles):
    import polytile as pt
    from polytile.ops.gpu_schedules import gemm_cuda
    op = ops.matmul(131, 197, 83, "float32")
    s = pt.Schedule(op.func)
    gemm_cuda(s, "C", "A", "B", **tiles)
    kern = pt.build(s, "cuda")
    a, b = _inputs(op, 7)
    out = _poisoned((131, 197))
    kern(a, b, out)
    assert _err(out, a.double() @ b.double()) <= op.tolerance


def test_fp32_user_split_of_chunks_that_are_not_whole_k_tiles():
    # chunks of 50: K tiles of 2 (whole tiles must not reach into the next chunk)
    op = ops.matmul(100, 70, 150, "float32", split_k=3)
    kern = op.build("cuda")
    a, b = _inputs(op, 3)
    assert _err(kern(a, b), a.double() @ b.double()) <= op.tolerance


def test_fp32_batch_matmul_and_dense_whole_tiles():
    op = ops.batch_matmul(3, 77, 65, 129, "float32")
    a, b = _inputs(op, 5)
    assert _err(op.build("cuda")(a, b), a.double() @ b.double()) <= op.tolerance
    op = ops.dense(97, 131, 45, "float32")
    x, w, bias = _inputs(op, 6)
    ref = torch.relu(x.double() @ w.double().T + bias.double())
    assert _err(op.build("cuda")(x, w, bias), ref) <= op.tolerance


@pytest.mark.parametrize("dims,dtype,cfg", [
    ((1, 4096, 4096), "bfloat16", dict(threads=128, vector=16, bk=8, stages=3, direct=True, split=16)),
    ((3, 1000, 333), "bfloat16", dict(threads=64, vector=16, bk=8, stages=3, direct=True, split=1)),  # K off the tile
    ((5, 1001, 777), "float16", dict(threads=64, vector=16, bk=16, stages=2, direct=True, split=7)),  # odd N
    ((7, 1003, 500), "float32", dict(threads=32, vector=16, bk=8, stages=3, direct=True, split=4)),
    ((8, 768, 3072), "float16", dict(threads=256, vector=8, bk=16, stages=4, direct=False, split=12)),
    ((1, 4097, 4093), "bfloat16", dict(threads=128, vector=16, bk=16, stages=3, direct=True, split=64)),  # uneven
    ((4, 1000, 1999), "float16", dict(threads=64, vector=16, bk=16, stages=3, direct=True, split=25)),
    ((2, 600, 2999), "float16", dict(threads=64, vector=8, bk=8, stages=4, direct=False, split=24)),
    ((3, 2222, 3333), "bfloat16", dict(threads=128, vector=16, bk=16, stages=3, direct=True, split=53)),  # 4-byte rows
])
def test_gemv_template_variants(dims, dtype, cfg):
    from polytile.build import build
    from polytile.target import as_target
    from polytile.tune import make_task
    M, N, K = dims
    target = as_target("cuda")
    task = make_task("matmul", target, M=M, N=N, K=K, dtype=dtype, template="matmul_gemv")
    assert task._check(cfg) is None
    kern = build(task.schedule(cfg), target)
    op = ops.matmul(M, N, K, dtype)
    a, b = _inputs(op, M * N + K)
    assert _err(kern(a, b), a.double() @ b.double()) <= op.tolerance
