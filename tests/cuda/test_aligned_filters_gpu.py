"""On a GPU: implicit-GEMM convolutions whose filters are 2-byte aligned rows (an odd number of 16-bit
filters) read through an aligned copy (``gpu_schedules.aligned_filter``), and the channel-padded
convolution's filter padded to 16-byte rows, against a float64 torch reference on fresh random
inputs at sizes off the tiles (odd and prime filters and pixels, W ≠ H, strides, splits)."""

import pytest

import polytile as pt
from polytile import ops
from polytile.ops.conv_choice import igemm_choice
from polytile.ops.gpu_schedules import igemm_schedule
from polytile.target import as_target

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


CASES = [(1, 23, 19, 304, 33, 3, 3, 1, 1),   # seed 52817's filters, mma.sync
         (1, 9, 7, 48, 17, 3, 3, 2, 1),       # 17 filters, stride 2
         (2, 10, 9, 96, 65, 3, 3, 1, 1),      # wgmma, two 64-wide filter tiles
         (1, 8, 8, 200, 25, 3, 3, 1, 1),      # split over filter rows × channel chunks
         (1, 8, 8, 264, 461, 7, 7, 2, 3),     # wgmma, split, a prime number of filters
         (3, 13, 11, 40, 7, 1, 1, 1, 0),      # 1×1, fewer filters than a tile's 8 columns
         (1, 16, 15, 3, 33, 3, 3, 1, 1),      # 3 channels: the channel-padded filter, 40 filters
         (2, 11, 11, 5, 19, 5, 5, 2, 2)]      # channel-padded, 5×5 stride 2


@pytest.mark.parametrize("dims", CASES, ids=["k33", "k17-s2", "k65-wgmma", "k25-split", "k461-wgmma-split",
                                             "k7-1x1", "c3-k33-padded", "c5-k19-padded"])
def test_default_convolution_of_unaligned_filters(dims):
    N, H, W, C, K, R, S, stride, pad = dims
    op = ops.conv2d_igemm(*dims, dtype="float16", out_dtype="float16")
    kern = op.build("cuda")
    assert C < 16 or "Wt_aligned" in kern.source
    x, w = _inputs(op, sum(dims))
    assert _err(kern(x, w), _conv_ref(x, w, stride, pad)) <= op.tolerance


def test_filter_read_in_place_and_copied_agree():
    # the schedule before (the filter read in place) and the default compute the same convolution
    dims = (1, 12, 10, 304, 33, 3, 3, 1, 1)
    N, H, W, C, K, R, S, stride, pad = dims
    op = ops.conv2d_igemm(*dims, dtype="float16", out_dtype="float16")
    target = as_target("cuda")
    choice = igemm_choice(target, N * H * W, C, K, R, S, 2, N * H * W, 2)
    sched = pt.Schedule(op.func)
    before = pt.build(igemm_schedule(sched, target, choice, *dims, filter_granule=None) or sched, "cuda")
    assert "Wt_aligned" not in before.source
    x, w = _inputs(op, 5)
    ref = _conv_ref(x, w, stride, pad)
    for kern in (op.build("cuda"), before):
        assert _err(kern(x, w), ref) <= op.tolerance
