"""On a GPU: the split reductions over channel tails (chunks of whole K tiles, the last one ending at C;
one chunk per filter row over all the channels), the channel-padded convolution's split filter rows and
small batched products on mma.sync, against a float64 torch reference on fresh random inputs at sizes
off the tiles (primes, odd channels and filters, one pixel row, one batch)."""

import pytest

import polytile as pt
from polytile import ops

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _inputs(op, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    tdt = getattr(torch, op.func.inputs[0].dtype.name)
    shapes = [tuple(int(d.value) for d in t.shape) for t in op.func.inputs]
    return [(torch.rand(s, device="cuda", generator=g) * 2 - 1).to(tdt) for s in shapes]


def _err(out, ref):
    assert torch.isfinite(out).all()
    return float((out.double() - ref).norm() / ref.norm())


def _conv_ref(x, w, stride, pad):
    K = w.shape[-1]
    ref = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(3, 2, 0, 1), stride=stride,
                                     padding=pad)
    return ref.permute(0, 2, 3, 1).reshape(-1, K)


DEFAULTS = [(2, 12, 12, 280, 112, 7, 7, 1, 3),   # random seed 99391: wgmma, rows × uneven channel chunks
            (2, 8, 8, 376, 96, 3, 3, 1, 1),      # 376 = 5 K tiles + 56
            (8, 9, 9, 88, 32, 3, 3, 2, 1),       # mma.sync, 88 = 2 K tiles of 32 + 24
            (1, 8, 8, 264, 461, 7, 7, 2, 3),     # a prime number of filters
            (1, 14, 14, 313, 22, 5, 5, 2, 2),    # seed 99391: channel-padded rows, split
            (32, 19, 19, 81, 12, 5, 5, 2, 2),    # channel-padded, many pixels
            (1, 9, 9, 38, 16, 7, 7, 1, 3),       # channel-padded, 7 filter rows
            (1, 11, 13, 307, 29, 5, 5, 1, 2),    # primes, W ≠ H
            (1, 8, 8, 200, 24, 3, 3, 1, 1)]      # seed 31337: mma.sync, filter rows × channel chunks


@pytest.mark.parametrize("dims", DEFAULTS, ids=["c280-k112-7x7", "c376-k96", "c88-k32-s2", "c264-k461-7x7s2",
                                                "c313-k22-padded", "c81-k12-n32-padded", "c38-k16-7x7-padded",
                                                "primes", "c200-k24"])
def test_default_split_convolution(dims):
    N, H, W, C, K, R, S, stride, pad = dims
    op = ops.conv2d_igemm(*dims, dtype="float16", out_dtype="float16")
    kern = op.build("cuda")
    x, w = _inputs(op, sum(dims))
    assert _err(kern(x, w), _conv_ref(x, w, stride, pad)) <= op.tolerance


EXPLICIT = [((1, 7, 9, 200, 72, 3, 3, 1, 1), "wgmma", (True, 1)),     # 200 = 3 K tiles + 8, rows only
            ((2, 5, 7, 328, 136, 3, 3, 2, 1), "wgmma", (False, 3)),   # chunks of 128, 128, 72
            ((3, 6, 5, 104, 40, 3, 2, 1, 1), "mma", (True, 2)),       # 104 = 3 K tiles of 32 + 8: 64 + 40
            ((1, 13, 13, 776, 40, 1, 1, 1, 0), "mma", (False, 5))]     # a 1×1 filter: 160 × 4 + 136


@pytest.mark.parametrize("dims,kernel,split", EXPLICIT, ids=["wgmma-rows", "wgmma-3-chunks", "mma-rows-2-chunks",
                                                             "mma-1x1-5-chunks"])
def test_explicit_split_over_a_channel_tail(dims, kernel, split):
    from polytile.ops.conv_choice import channel_chunk, igemm_kernel, igemm_splits
    from polytile.ops.gpu_schedules import igemm_split_schedule
    from polytile.ops.igemm import conv2d_igemm_split_func
    from polytile.target import as_target
    N, H, W, C, K, R, S, stride, pad = dims
    P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
    found, params = igemm_kernel(as_target("cuda"), N * P * Q, C, K, R * S)
    assert found == kernel and C % params["bk"] and split in igemm_splits(C, R, S, params["bk"])
    func = conv2d_igemm_split_func(*dims, rows=split[0], channel_chunks=split[1],
                                   channel_chunk=channel_chunk(C, split[1], params["bk"]))
    op = ops.conv2d_igemm(*dims)
    kern = pt.build(igemm_split_schedule(func, kernel, params, split[0]), "cuda")
    x, w = _inputs(op, sum(dims))
    assert _err(kern(x, w), _conv_ref(x, w, stride, pad)) <= op.tolerance


@pytest.mark.parametrize("split", [(True, 1), (False, 4), (True, 3)], ids=["rows", "run-chunks", "rows-run-chunks"])
def test_explicit_split_of_channel_padded_rows(split):
    from polytile.ops.gpu_schedules import igemm_rows
    from polytile.target import as_target
    dims = (2, 13, 11, 45, 40, 5, 5, 1, 2)   # 45 channels padded to 48, runs of 240
    op = ops.conv2d_igemm(*dims)
    kern = pt.build(igemm_rows(as_target("cuda"), *dims, "float16", "float32", split=split), "cuda")
    x, w = _inputs(op, 11)
    assert _err(kern(x, w), _conv_ref(x, w, dims[7], dims[8])) <= op.tolerance


BMMS = [((3, 12, 104, 40), "float16"),    # random seed 97052: 0.44× torch on the GEMV
        ((7, 13, 101, 37), "float16"),    # odd N, K not a multiple of 8 (aligned copies)
        ((2, 5, 16, 85), "float16"),
        ((3, 8, 1209, 99), "bfloat16"),
        ((6, 3, 77, 211), "float16"),     # seed 31337: 0.55× torch on the GEMV
        ((1, 16, 333, 64), "bfloat16")]   # one batch


@pytest.mark.parametrize("dims,dtype", BMMS, ids=[f"{'x'.join(map(str, d))}-{t}" for d, t in BMMS])
def test_small_batched_product(dims, dtype):
    batch, M, N, K = dims
    op = ops.batch_matmul(batch, M, N, K, dtype, out_dtype=dtype)
    kern = op.build("cuda")
    a, b = _inputs(op, sum(dims))
    assert _err(kern(a, b), a.double() @ b.double()) <= op.tolerance


UNEVEN = [((1, 8, 8, 200, 24, 3, 3, 1, 1), False, 4),    # mma.sync: 64 + 64 + 64 + 8 channels (2, 2, 2, 1 K tiles)
          ((2, 12, 12, 280, 112, 7, 7, 1, 3), True, 2),  # wgmma: 192 + 88 (3, 2 K tiles)
          ((1, 8, 8, 264, 461, 7, 7, 2, 3), True, 2)]    # wgmma: 192 + 72, a prime number of filters


@pytest.mark.parametrize("dims,rows,chunks", UNEVEN, ids=["mma-200", "wgmma-280", "wgmma-264"])
def test_uneven_channel_chunks_in_a_fused_k_loop(dims, rows, chunks):
    # a last chunk of fewer K tiles than the others, its taps and channel tiles one K loop: the tiles wholly
    # past C are not copied, and their products must be skipped (wrong numbers on an H200 before the
    # tensorize pass guarded them; igemm_splits still does not offer these splits: not measured since)
    from polytile.ops.conv_choice import channel_chunk, igemm_kernel
    from polytile.ops.gpu_schedules import igemm_split_schedule
    from polytile.ops.igemm import conv2d_igemm_split_func
    from polytile.target import as_target
    N, H, W, C, K, R, S, stride, pad = dims
    P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
    kernel, params = igemm_kernel(as_target("cuda"), N * P * Q, C, K, R * S)
    func = conv2d_igemm_split_func(*dims, rows=rows, channel_chunks=chunks,
                                   channel_chunk=channel_chunk(C, chunks, params["bk"]))
    op = ops.conv2d_igemm(*dims)
    kern = pt.build(igemm_split_schedule(func, kernel, params, rows), "cuda")
    x, w = _inputs(op, sum(dims) + 1)
    assert _err(kern(x, w), _conv_ref(x, w, stride, pad)) <= op.tolerance
