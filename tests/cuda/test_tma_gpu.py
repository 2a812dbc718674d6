"""On a Hopper GPU: GEMMs whose operand tiles are loaded by TMA copies on mbarrier rings
(``gemm_wgmma(..., producer="tma")``, issued by one thread or by a producer warpgroup) against a float64
reference on fresh random inputs: sizes that
do not divide the tiles (partial boxes zero-filled by the copy engine), rows that are not 16-byte
aligned (copied aligned first), several stage counts and groups in flight, float16 and bfloat16."""

import pytest
from gpu_inputs import skip_unless_hopper

import polytile as pt
from polytile import ops
from polytile.ops.gpu_schedules import align_operands, gemm_wgmma

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(autouse=True)
def _hopper():
    skip_unless_hopper(torch, "TMA with wgmma")


def _tma_gemm(M, N, K, dtype, **cfg):
    s = pt.Schedule(ops.matmul(M, N, K, dtype).func)
    align_operands(s, "C", ("A", "B"), granule=16)
    gemm_wgmma(s, "C", "A", "B", producer="tma", **cfg)
    return pt.build(s, "cuda")


@pytest.fixture(params=[False, True], ids=["one-thread", "specialized"])
def specialize(request):
    return request.param


def _operands(batch, M, N, K, dtype, seed):
    """Fresh random A (``batch`` x M x K, no batch dimension for None) and B in [-1, 1)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    lead = () if batch is None else (batch,)
    return [(torch.rand((*lead, *shape), device="cuda", generator=g) * 2 - 1).to(TORCH_DTYPES[dtype])
            for shape in ((M, K), (K, N))]


def _assert_product(out, a, b):
    """``out`` is A @ B (against float64) and no element was left unwritten (NaN-filled outputs)."""
    ref = a.double() @ b.double()
    assert not out.isnan().any() and float((out.double() - ref).norm() / ref.norm()) < 1e-5


def _run_into_nan(kern, a, b):
    """Call ``kern`` on an output filled with NaN, so that a tile it skips shows."""
    out = torch.full((*a.shape[:-1], b.shape[-1]), float("nan"), device="cuda")
    kern(a, b, out)
    return out


def _check(kern, M, N, K, dtype, seed):
    a, b = _operands(None, M, N, K, dtype, seed)
    _assert_product(kern(a, b), a, b)


SIZES = [
    ((1000, 1500, 700), dict(bm=128, bn=128, bk=64, stages=4, inflight=1)),  # rows copied aligned
    ((257, 129, 4099), dict(bm=128, bn=64, bk=64, stages=3, inflight=1)),
    ((300, 264, 200), dict(bm=128, bn=256, bk=64, stages=3)),  # aligned rows, partial tiles
    ((512, 384, 1024), dict(bm=128, bn=192, bk=128, stages=2)),  # two boxes of A per tile
    ((1000, 1000, 520), dict(bm=192, bn=128, bk=64, stages=5, inflight=2)),
    ((70, 64, 100), dict(bm=64, bn=64, bk=64, stages=2)),  # two K tiles, the second mostly outside
    ((777, 600, 1000), dict(bm=256, bn=128, bk=64, stages=4, inflight=1)),  # four warpgroups (gemm_choice's tall tiles)
]


@pytest.mark.parametrize("dims,cfg", SIZES, ids=[f"{d[0]}x{d[1]}x{d[2]}" for d, _ in SIZES])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tma_matmul(dims, cfg, dtype, specialize):
    M, N, K = dims
    _check(_tma_gemm(M, N, K, dtype, specialize=specialize, **cfg), M, N, K, dtype, seed=M + N + K)


@pytest.mark.parametrize("stages,inflight", [(2, 0), (3, 0), (4, 0), (6, 0), (3, 1), (4, 1), (4, 2), (6, 2)])
def test_tma_pipeline_stages(stages, inflight, specialize):
    M, N, K = 333, 264, 1000  # 16 K tiles: every slot is refilled several times, parities flip
    kern = _tma_gemm(M, N, K, "bfloat16", bm=128, bn=128, bk=64, stages=stages, inflight=inflight,
                     specialize=specialize)
    for seed in (1, 2):  # a second call reuses the tensor maps of the same arrays... and new ones
        _check(kern, M, N, K, "bfloat16", seed)


GROUPED = [
    ((1000, 1000, 520), dict(bm=128, bn=128, bk=64, stages=4, inflight=1, group=3)),  # 8 rows: groups 3, 3, 2
    ((700, 4000, 200), dict(bm=64, bn=256, bk=64, stages=3, inflight=1, group=11)),  # one group, all rows
    ((333, 264, 1000), dict(bm=128, bn=64, bk=64, stages=3, group=2)),  # 3 rows: groups 2, 1
]


@pytest.mark.parametrize("dims,cfg", GROUPED, ids=[f"{d[0]}x{d[1]}x{d[2]}-g{c['group']}" for d, c in GROUPED])
def test_grouped_block_order(dims, cfg):
    # blocks launched in groups of rows (Stage.raster): every output tile written once, at odd sizes
    M, N, K = dims
    kern = _tma_gemm(M, N, K, "bfloat16", **cfg)
    a, b = _operands(None, M, N, K, "bfloat16", M + N + K)
    _assert_product(_run_into_nan(kern, a, b), a, b)


@pytest.mark.parametrize("dims", [(3, 300, 520, 64), (5, 129, 1000, 200)], ids=["3x300x520x64", "5x129x1000x200"])
def test_grouped_batched_gemm(dims):
    # the batch along blockIdx.z, each batch's tiles in groups of 2 rows (cp.async copies)
    batch, M, N, K = dims
    s = pt.Schedule(ops.batch_matmul(batch, M, N, K, "float16").func)
    align_operands(s, "C", ("A", "B"), granule=4)
    gemm_wgmma(s, "C", "A", "B", bm=64, bn=128, bk=64, stages=3, inflight=1, batch="bb", group=2)
    kern = pt.build(s, "cuda")
    a, b = _operands(batch, M, N, K, "float16", batch + M + N + K)
    _assert_product(_run_into_nan(kern, a, b), a, b)


@pytest.mark.parametrize("dims", [(130, 1001, 200), (97, 2049, 513), (1000, 1024, 128)],
                         ids=["130x1001x200", "97x2049x513", "1000x1024x128"])
def test_default_gemm_loads_aligned_copies_with_tma(dims):
    # rows of B (and of A with K = 513) only 2-byte aligned: copied 16-byte aligned, then TMA reads them;
    # 1000 rows: a partial row tile over two whole K tiles
    M, N, K = dims
    kern = ops.matmul(M, N, K, "float16").build("cuda")
    assert "pt_tma_load_2d(" in kern.source
    _check(kern, M, N, K, "float16", seed=M + N + K)


BATCHED = [
    ((3, 300, 264, 200), dict(bm=128, bn=128, bk=64, stages=3, inflight=1)),  # partial tiles in every batch
    ((5, 129, 1000, 520), dict(bm=64, bn=256, bk=64, stages=4, inflight=1, group=2)),  # grouped
    ((12, 1024, 1024, 128), dict(bm=128, bn=128, bk=64, stages=3, inflight=1)),  # two K tiles
    ((2, 70, 64, 100), dict(bm=64, bn=64, bk=64, stages=2)),  # the second K tile mostly outside
]


@pytest.mark.parametrize("dims,cfg", BATCHED, ids=["x".join(map(str, d)) for d, _ in BATCHED])
def test_batched_tma(dims, cfg, specialize):
    # 3-D tensor maps, one batch per box: rows past a batch's end read zeros, not the next batch's rows
    batch, M, N, K = dims
    s = pt.Schedule(ops.batch_matmul(batch, M, N, K, "bfloat16").func)
    align_operands(s, "C", ("A", "B"), granule=16)
    gemm_wgmma(s, "C", "A", "B", batch="bb", producer="tma", specialize=specialize, **cfg)
    kern = pt.build(s, "cuda")
    assert "pt_tma_load_3d(" in kern.source
    a, b = _operands(batch, M, N, K, "bfloat16", batch + M + N + K)
    _assert_product(_run_into_nan(kern, a, b), a, b)


@pytest.mark.parametrize("dims", [(32, 256, 384, 128), (12, 200, 200, 64)], ids=["32x256x384x128", "12x200x200x64"])
def test_default_batched_gemm(dims):
    batch, M, N, K = dims
    kern = ops.batch_matmul(batch, M, N, K, "float16").build("cuda")
    a, b = _operands(batch, M, N, K, "float16", sum(dims))
    _assert_product(kern(a, b), a, b)


@pytest.mark.parametrize("dims,split", [((127, 255, 4096), None), ((256, 520, 8192), 2), ((300, 264, 1024), 4)],
                         ids=["127x255x4096-default", "256x520x8192-s2", "300x264x1024-s4"])
def test_split_gemm_loads_chunks_with_tma(dims, split):
    # the chunks of K are whole K tiles: each chunk's boxes start at its own column of A and row of B
    M, N, K = dims
    kern = ops.matmul(M, N, K, "bfloat16", split_k=split).build("cuda")
    assert "pt_tma_load_2d(" in kern.source and len(kern.kernels) >= 2
    _check(kern, M, N, K, "bfloat16", seed=M + N + K)
