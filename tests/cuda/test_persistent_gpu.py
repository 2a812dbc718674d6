"""On a Hopper GPU: persistent wgmma GEMMs (``gemm_wgmma(..., persistent=True)``: one block per
multiprocessor looping over the block tiles, TMA rings carried across tiles) against a float64
reference on fresh random inputs, outputs filled with NaN first so that a tile left unwritten
shows: sizes that do not divide the tiles (M = 17 too), more tiles than multiprocessors (blocks
run several tiles, K tile counts not multiples of twice the stages: the rings' phases carry over
tile boundaries at every parity) and fewer, 2-6 stages with 0-2 MMA groups in flight, grouped
order, cp.async copies, batches, float16 and bfloat16."""

import pytest
from gpu_inputs import rel_error, signed_inputs, skip_unless_hopper

import polytile as pt
from polytile import ops
from polytile.ops.gpu_schedules import align_operands, gemm_wgmma

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _hopper():
    skip_unless_hopper(torch, "persistent wgmma GEMMs")


def _build(M, N, K, dtype, batch=None, producer="tma", **cfg):
    func = ops.matmul(M, N, K, dtype).func if batch is None else ops.batch_matmul(batch, M, N, K, dtype).func
    s = pt.Schedule(func)
    align_operands(s, "C", ("A", "B"), granule=16 if producer == "tma" else 4)
    gemm_wgmma(s, "C", "A", "B", producer=producer, persistent=True, **({"batch": "bb"} if batch else {}), **cfg)
    kern = pt.build(s, "cuda")
    assert "pt_tile_k" in kern.source
    return kern


def _check(kern, M, N, K, dtype, seed, batch=None):
    lead = () if batch is None else (batch,)
    a, b = signed_inputs(torch, [(*lead, M, K), (*lead, K, N)], dtype, seed)
    out = torch.full((*lead, M, N), float("nan"), device="cuda")
    kern(a, b, out)
    assert not out.isnan().any(), "a tile was left unwritten"
    assert rel_error(out, a.double() @ b.double()) < 1e-5


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


SIZES = [
    ((1000, 1003, 517), dict(bm=64, bn=64, bk=64, stages=3, inflight=1)),  # 16 × 16 tiles: more than SMs
    ((2000, 1999, 300), dict(bm=64, bn=64, bk=64, stages=4, inflight=1)),  # ~1000 tiles, 7-8 a block
    ((1000, 1003, 517), dict(bm=128, bn=256, bk=64, stages=4, inflight=1)),  # 8 × 4 tiles: fewer than SMs
    ((129, 257, 64), dict(bm=64, bn=64, bk=64, stages=2)),  # one K tile
    ((17, 255, 129), dict(bm=64, bn=128, bk=64, stages=3)),  # few rows (gemm_wgmma takes M >= 17: GEMVs go elsewhere)
    ((4000, 4000, 200), dict(bm=128, bn=128, bk=64, stages=3, inflight=1, group=8)),  # grouped, 1000 tiles
]


@pytest.mark.parametrize("dims,cfg", SIZES, ids=[f"{d[0]}x{d[1]}x{d[2]}-{c['bm']}x{c['bn']}" for d, c in SIZES])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_persistent_tma_matmul(dims, cfg, dtype):
    M, N, K = dims
    _check(_build(M, N, K, dtype, **cfg), M, N, K, dtype, seed=M + N + K)


@pytest.mark.parametrize("stages,inflight", [(2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (3, 1), (4, 1), (4, 2),
                                             (6, 2)])
def test_persistent_rings_carry_their_phases(stages, inflight):
    # 9 K tiles per block tile, 20 × 16 tiles over the SMs: every block runs 2-3 tiles and each slot's
    # parity flips at a different K tile of each
    M, N, K = 1280, 1000, 520
    kern = _build(M, N, K, "bfloat16", bm=64, bn=64, bk=64, stages=stages, inflight=inflight)
    assert 20 * 16 > _sms()
    for seed in (1, 2):
        _check(kern, M, N, K, "bfloat16", seed)


def test_persistent_threads_copies():
    M, N, K = 1000, 1003, 517
    _check(_build(M, N, K, "float16", producer="threads", bm=64, bn=128, bk=64, stages=3, inflight=1),
           M, N, K, "float16", seed=7)


def test_persistent_batched():
    batch, M, N, K = 5, 300, 264, 520
    _check(_build(M, N, K, "bfloat16", batch=batch, bm=64, bn=64, bk=64, stages=4, inflight=1, group=2),
           M, N, K, "bfloat16", seed=11, batch=batch)
