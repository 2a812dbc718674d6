"""On a GPU: reductions split into chunks of whole K tiles, the last one shorter (the tensor cores' and
the CUDA cores' uneven split-K, ``gpu_schedules.tile_chunks``), and GEMVs over whole register tiles, against a float64
torch reference on random non-zero inputs at sizes that divide no tile."""

import pytest
from gpu_inputs import rel_error, signed_inputs

import polytile as pt
from polytile import ops

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


DEFAULTS = [((61, 61, 8191), "bfloat16", "bfloat16"),  # one tile, a prime K: chunks of whole K tiles
            ((37, 70, 5003), "bfloat16", "float32"),
            ((40, 200, 4099), "float16", "float16"),
            ((16, 3002, 1536), "bfloat16", "bfloat16"),  # GEMVs: whole register tiles, 4-byte aligned rows
            ((12, 2222, 3333), "bfloat16", "bfloat16"),
            ((9, 1001, 999), "float16", "float32"),
            ((16, 4096, 4096), "bfloat16", "bfloat16"),
            ((318, 24, 2936), "float32", "float32"),  # CUDA cores: 10 tiles, no even split (2936 = 8 · 367)
            ((129, 4095, 1023), "float32", "float32"),
            ((110, 2755, 229), "float32", "float32")]


@pytest.mark.parametrize("dims,dtype,out", DEFAULTS, ids=[f"{d[0]}x{d[1]}x{d[2]}-{t}-{o}" for d, t, o in DEFAULTS])
def test_default_matmul(dims, dtype, out):
    M, N, K = dims
    op = ops.matmul(M, N, K, dtype, out_dtype=out)
    a, b = signed_inputs(torch, [(M, K), (K, N)], dtype, M + N + K)
    assert rel_error(op.build("cuda")(a, b), a.double() @ b.double()) <= op.tolerance


# (chunks, chunk length, kernel, tile parameters): wgmma and mma.sync, K tiles of 64 and 128, the last chunk
# from one K tile down to a single element of K
FIXED = [(8191, 64, 128, "wgmma", dict(bm=64, bn=64, bk=64, stages=4, inflight=1)),
         (8191, 32, 256, "wgmma", dict(bm=64, bn=64, bk=128, stages=5, inflight=1)),
         (3265, 4, 1088, "wgmma", dict(bm=64, bn=128, bk=64, stages=4, inflight=1)),  # the last chunk: 1 element
         (5003, 20, 256, "mma", dict(bm=64, bn=64, wm=32, wn=32, bk=64, stages=3, reg_stages=2)),
         (3001, 12, 256, "mma", dict(bm=16, bn=128, wm=16, wn=32, bk=64, stages=3, reg_stages=2))]


@pytest.mark.parametrize("K,split,chunk,kernel,params", FIXED, ids=[f"{f[3]}-K{f[0]}-S{f[1]}x{f[2]}" for f in FIXED])
def test_tensor_core_chunks(K, split, chunk, kernel, params):
    from polytile.ops import gpu_schedules as g
    M, N = 61, 99
    sched = pt.Schedule(ops.matmul_func(M, N, K, "bfloat16", split, "float32", chunk=chunk))
    g._gemm_schedule(g.GemmChoice(kernel, params, split, 0.0, chunk), sched, "P", "s")
    g.sum_partials(sched, "C")
    kern = pt.build(sched, "cuda")
    a, b = signed_inputs(torch, [(M, K), (K, N)], "bfloat16", K + split)
    assert rel_error(kern(a, b), a.double() @ b.double()) <= 1e-4


# the CUDA cores' GEMM (float32) in chunks of whole K tiles of 8, the last one shorter, down to one element
CUDA_CORES = [(2936, 92, 32), (1023, 3, 344), (229, 5, 48), (4097, 65, 64), (1001, 7, 144)]


@pytest.mark.parametrize("K,split,chunk", CUDA_CORES, ids=[f"K{k}-S{s}x{c}" for k, s, c in CUDA_CORES])
def test_cuda_core_chunks(K, split, chunk):
    from polytile.ops import gpu_schedules as g
    M, N = 37, 70
    sched = pt.Schedule(ops.matmul_func(M, N, K, "float32", split, "float32", chunk=chunk))
    g._gemm_schedule(g.GemmChoice("cuda", dict(bm=32, bn=64, bk=8, tm=4, tn=4, stages=3), split, 0.0, chunk),
                     sched, "P", "s")
    g.sum_partials(sched, "C")
    kern = pt.build(sched, "cuda")
    a, b = signed_inputs(torch, [(M, K), (K, N)], "float32", K + split)
    assert rel_error(kern(a, b), a.double() @ b.double()) <= 1e-5


@pytest.mark.parametrize("dims", [(32, 1, 128, 2048), (20, 1, 1500, 80), (3, 5, 77, 300), (4, 16, 1001, 999)])
def test_batch_gemv(dims):
    batch, M, N, K = dims
    op = ops.batch_matmul(batch, M, N, K, "float16")
    a, b = signed_inputs(torch, [(batch, M, K), (batch, K, N)], "float16", sum(dims))
    assert rel_error(op.build("cuda")(a, b), a.double() @ b.double()) <= op.tolerance
