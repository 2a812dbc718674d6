"""On a Hopper GPU: wgmma GEMMs whose results are written by TMA stores (``gemm_wgmma(...,
store="tma")``: the block's tile staged in shared memory, one bulk tensor store clipped at the
matrix's end) against a float64 reference on fresh random inputs, outputs filled with NaN first so
that a tile left unwritten shows: rows and K off the tiles (partial boxes clipped by the tensor
map), float32 and 16-bit results, TMA or cp.async loads, persistent blocks (the staging tile reused
tile after tile), batches (3-D boxes), float16 and bfloat16 operands."""

import pytest
from gpu_inputs import rel_error, signed_inputs, skip_unless_hopper
from test_tma_store import added_with_tma_store

import polytile as pt
from polytile import ops
from polytile.ops.gpu_schedules import align_operands, gemm_wgmma

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _hopper():
    skip_unless_hopper(torch, "TMA stores with wgmma")


CASES = [  # (M, N, K), operands, results, schedule; N keeps the results' rows whole 16 bytes
    ((1000, 1000, 517), "bfloat16", None, dict(bm=128, bn=128, bk=64, stages=4, inflight=1)),
    ((129, 264, 64), "float16", None, dict(bm=64, bn=64, bk=64, stages=2)),
    ((17, 256, 129), "bfloat16", "bfloat16", dict(bm=64, bn=128, bk=64, stages=3)),
    ((1000, 1000, 520), "float16", "float16", dict(bm=128, bn=256, bk=64, stages=3, inflight=1)),
    ((3000, 2000, 300), "bfloat16", None, dict(bm=128, bn=128, bk=64, stages=3, inflight=1, persistent=True)),
    ((2000, 1000, 300), "float16", "float16", dict(bm=64, bn=128, bk=64, stages=4, inflight=1, persistent=True,
                                                   group=4)),
    ((1000, 1000, 517), "bfloat16", None, dict(bm=128, bn=128, bk=64, stages=3, inflight=1, producer="threads")),
]


@pytest.mark.parametrize("dims,dtype,out_dtype,cfg", CASES,
                         ids=[f"{'x'.join(map(str, d))}-{t}-{o or 'f32'}-{i}" for i, (d, t, o, _) in enumerate(CASES)])
def test_tma_store_matmul(dims, dtype, out_dtype, cfg):
    M, N, K = dims
    s = pt.Schedule(ops.matmul(M, N, K, dtype, **({"out_dtype": out_dtype} if out_dtype else {})).func)
    producer = cfg.get("producer", "tma")
    align_operands(s, "C", ("A", "B"), granule=16 if producer == "tma" else 4)
    gemm_wgmma(s, "C", "A", "B", store="tma", **{"producer": "tma", **cfg})
    kern = pt.build(s, "cuda")
    assert "pt_tma_store_2d(" in kern.source
    a, b = signed_inputs(torch, [(M, K), (K, N)], dtype, M + N + K)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=getattr(torch, out_dtype or "float32"))
    kern(a, b, out)
    assert not out.isnan().any(), "a tile was left unwritten"
    ref = a.double() @ b.double()
    assert rel_error(out, ref) < (1e-5 if out_dtype is None else 1e-2)


def test_batched_tma_store():
    batch, M, N, K = 3, 200, 136, 200
    s = pt.Schedule(ops.batch_matmul(batch, M, N, K, "bfloat16").func)
    align_operands(s, "C", ("A", "B"), granule=16)
    gemm_wgmma(s, "C", "A", "B", batch="bb", bm=64, bn=64, bk=64, stages=3, inflight=1, producer="tma", store="tma",
               persistent=True, group=2)
    kern = pt.build(s, "cuda")
    a, b = signed_inputs(torch, [(batch, M, K), (batch, K, N)], "bfloat16", 5)
    out = torch.full((batch, M, N), float("nan"), device="cuda")
    kern(a, b, out)
    assert not out.isnan().any(), "a tile was left unwritten"
    assert rel_error(out, a.double() @ b.double()) < 1e-5


def test_elementwise_tma_store():
    # any block tile: a thread per element of a 16 × 32 float32 box, partial at the matrix's end
    M, N = 1000, 300
    kern = pt.build(added_with_tma_store(M, N), "cuda")
    a, b = signed_inputs(torch, [(M, N), (M, N)], "float32", 3)
    out = torch.full((M, N), float("nan"), device="cuda")
    kern(a, b, out)
    assert torch.equal(out, a + b)
