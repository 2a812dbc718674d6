"""On a GPU: GEMVs of 2 to 16 rows on mma.sync, transposed (``gpu_schedules.gemv_mma``: B's columns as the
instruction's 16 rows, A's rows as its 8 columns), against a float64 torch reference on random
non-zero inputs at sizes that divide no tile — the default's opt-in choice (``POLYTILE_GEMV_MMA=1``), and
fixed tiles and splits."""

import pytest
from gpu_inputs import rel_error, signed_inputs

import polytile as pt
from polytile import ops

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


# rows 2..16 (one and two 8-column tiles, 3/5/7/13 off the tile), N a multiple of 8 but not of the block's
# columns, K odd, prime and not a multiple of 8 (A copied aligned), long K (split)
DEFAULTS = [((8, 6144, 4096), "bfloat16", "bfloat16"),
            ((3, 1000, 1999), "float16", "float32"),
            ((5, 4096, 1003), "bfloat16", "bfloat16"),
            ((7, 776, 769), "float16", "float16"),
            ((13, 3072, 768), "bfloat16", "float32"),
            ((2, 2056, 4093), "bfloat16", "bfloat16"),
            ((16, 4096, 4096), "bfloat16", "bfloat16"),
            ((9, 1000, 3001), "float16", "float16"),
            ((8, 768, 3072), "float16", "float16"),
            ((4, 24, 40), "bfloat16", "bfloat16"),  # a block wider than the matrix, K under one K tile
            ((16, 1032, 33), "float16", "float32")]


@pytest.mark.parametrize("dims,dtype,out", DEFAULTS, ids=[f"{d[0]}x{d[1]}x{d[2]}-{t}-{o}" for d, t, o in DEFAULTS])
def test_opted_in_default_matmul(dims, dtype, out, monkeypatch):
    from polytile.ops.gpu_schedules import GEMV_MMA_VARIABLE, gemm_choice
    from polytile.target import as_target
    M, N, K = dims
    monkeypatch.setenv(GEMV_MMA_VARIABLE, "1")  # the default's opt-in (not the default until measured)
    target = as_target("cuda")
    assert gemm_choice(target, M, N, K, getattr(pt, dtype)).kernel == "gemv_mma"
    op = ops.matmul(M, N, K, dtype, out_dtype=out)
    a, b = signed_inputs(torch, [(M, K), (K, N)], dtype, M + N + K)
    assert rel_error(op.build("cuda")(a, b), a.double() @ b.double()) <= op.tolerance


# (M, N, K, split, chunk, params): 1, 2 and 4 warps of 16..64 columns, K tiles of 16..128, chunks of one
# length and a shorter last one
FIXED = [(8, 1000, 1000, 1, 0, dict(bn=64, warps=4, bk=64, stages=4)),
         (5, 520, 999, 1, 0, dict(bn=128, warps=2, bk=32, stages=3)),
         (11, 264, 517, 1, 0, dict(bn=64, warps=1, bk=16, stages=2)),
         (3, 2048, 4093, 8, 512, dict(bn=256, warps=4, bk=64, stages=4)),
         (16, 800, 3072, 3, 0, dict(bn=128, warps=4, bk=64, stages=4))]


@pytest.mark.parametrize("M,N,K,split,chunk,params", FIXED, ids=[f"{f[0]}x{f[1]}x{f[2]}-S{f[3]}" for f in FIXED])
def test_fixed_tiles(M, N, K, split, chunk, params):
    from polytile.ops import gpu_schedules as g
    func = ops.matmul_func(M, N, K, "bfloat16", split, "bfloat16", chunk=chunk or None) if split > 1 else \
        ops.matmul_func(M, N, K, "bfloat16", out_dtype="bfloat16")
    sched = pt.Schedule(func)
    g.gemv_mma(sched, "P" if split > 1 else "C", "A", "B", batch="s" if split > 1 else None, **params)
    if split > 1:
        g.sum_partials(sched, "C")
    a, b = signed_inputs(torch, [(M, K), (K, N)], "bfloat16", M * N + K)
    out = pt.build(sched, "cuda")(a, b)
    assert rel_error(out, a.double() @ b.double()) <= 2e-2


@pytest.mark.parametrize("dims,dtype", [((5, 1000, 1003), "bfloat16"), ((13, 776, 3001), "float16")])
def test_the_space_s_mma_configurations(dims, dtype):
    # what the tuner draws on the mma kernel (matmul_gemv, kernel="mma"), as it builds it
    import numpy as np

    from polytile.target import as_target
    from polytile.tune import make_task
    M, N, K = dims
    target = as_target("cuda")
    task = make_task("matmul", target, M=M, N=N, K=K, dtype=dtype)
    a, b = signed_inputs(torch, [(M, K), (K, N)], dtype, 7 * M + K)
    ref = a.double() @ b.double()
    done = 0
    for digits in task.space.sample_valid(np.random.default_rng(1), 400):
        values = task.space.config(digits).values
        if values["kernel"] != "mma":
            continue
        out = pt.build(task.schedule(values), target)(a, b)
        assert rel_error(out, ref) <= 2e-2, values
        done += 1
        if done == 4:
            break
    assert done == 4
