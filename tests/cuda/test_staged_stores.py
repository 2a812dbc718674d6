"""Staged stores of a block's results (``Stage.staged_store``, ``gemm_wgmma``/``gemm_tensorcore``
``store="staged"``): the write-back of each block's tile into a shared staging tile (rows padded by
16 bytes), a barrier, then the threads' copy-out row by row under the tensor's bounds. Numerics of the
pass on the CPU's block emulator (a CUDA-core schedule at sizes off the tiles), the tensor-core
kernels' source and SASS for sm_90a (the accumulators' stores into shared memory, the copy-out's
global stores consecutive by thread), the refusals, and the default's decision
(``gpu_schedules.STAGED_ODD_STORES``). Numerics on a GPU: test_staged_stores_gpu.py."""

import re
import subprocess
import tempfile

import block_emulator
import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.codegen.cuda import cuda_source
from polytile.dtypes import as_dtype
from polytile.errors import ScheduleError
from polytile.lowering import loopir as ir
from polytile.lowering.pipeline import lower
from polytile.ops import gpu_schedules
from polytile.ops.gpu_schedules import align_operands, gemm_choice, gemm_cuda, gemm_tensorcore, gemm_wgmma
from polytile.runtime.cuda import index32_ok
from polytile.target import CUDATarget

SM90A = CUDATarget(arch="sm_90a")
needs_nvcc = pytest.mark.needs_nvcc


def _cuda_core(M, N, K, staged=True, bm=8, bn=32, per=1):
    """``per`` × ``per`` results a thread (bm/per × bn/per threads), bm × bn blocks, the sums in registers: a
    write-back of one box per block."""
    s = pt.Schedule(ops.matmul(M, N, K, "float32").func)
    st = s["C"]
    st.split("i", bm, "bi", "i1").split("j", bn, "bj", "j1").split("i1", per, "ti", "ii").split("j1", per, "tj", "jj")
    st.reorder("bi", "bj", "ti", "tj", "k", "ii", "jj")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("ti", "threadIdx.y").bind("tj", "threadIdx.x")
    st.cache_write("tj", loc="local")
    if staged:
        st.staged_store()
    return s


@pytest.mark.parametrize("dims", [(13, 37, 5, 1), (1, 97, 3, 1), (8, 32, 4, 1), (29, 1, 7, 1), (13, 37, 5, 2),
                                  (31, 67, 3, 2)], ids=str)
def test_staged_store_is_the_product_on_the_block_emulator(dims):
    M, N, K, per = dims  # per × per results a thread: several elements of the copy-out a thread
    op = ops.matmul(M, N, K, "float32")
    a, b = op.make_inputs(np.random.default_rng(M * N + K))
    low = pt.lower(_cuda_core(M, N, K, per=per), SM90A)
    stages = [st.buffer for st in ir.walk_stmt(low.body) if isinstance(st, ir.Allocate) and st.buffer.scope == "shared"]
    assert [b.name for b in stages] == ["C_stage"]
    assert [int(d.value) for d in stages[0].shape] == [min(M, 8), min(N, 32) + 4]  # rows padded by 16 bytes
    (out,) = block_emulator.run(low, [a, b, np.full((M, N), np.nan, np.float32)])
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-6, atol=1e-6)


def test_the_copy_out_is_row_major_by_thread():
    # the global stores: element e = q·threads + tid of the tile, (e div cols, e mod cols) from the origin
    text = ir.stmt_text(pt.lower(_cuda_core(13, 37, 5), SM90A).body)
    assert "C_stage_e" in text and "__syncthreads" in text
    (store,) = [line for line in text.splitlines() if line.strip().startswith("C[")]
    assert "C_stage_e div 32" in store and "C_stage_e mod 32" in store
    unstaged = ir.stmt_text(pt.lower(_cuda_core(13, 37, 5, staged=False), SM90A).body)
    assert "C_stage" not in unstaged


def test_staged_store_refusals():
    s = pt.Schedule(ops.matmul(9, 9, 9, "float32").func)
    with pytest.raises(ScheduleError, match="bind a loop"):
        s["C"].staged_store()
    s = _cuda_core(9, 9, 9, staged=False)
    s["C"].tma_store()
    with pytest.raises(ScheduleError, match="already written by TMA"):
        s["C"].staged_store()
    s = _cuda_core(9, 9, 9)
    with pytest.raises(ScheduleError, match="already staged"):
        s["C"].tma_store()
    with pytest.raises(ScheduleError, match="store must be"):
        gemm_tensorcore(pt.Schedule(ops.matmul(64, 64, 64, "float16").func), "C", "A", "B", store="tma")


def _tensor_core(M, N, K, dtype, kernel, store="staged", bn=128):
    s = pt.Schedule(ops.matmul(M, N, K, dtype, out_dtype=dtype).func)
    align_operands(s, "C", granule=4)
    if kernel == "wgmma":
        gemm_wgmma(s, "C", "A", "B", bm=128, bn=bn, bk=64, stages=4, inflight=1, store=store)
    else:
        gemm_tensorcore(s, "C", "A", "B", bm=128, bn=128, wm=64, wn=64, bk=64, stages=3, reg_stages=2, store=store)
    return s


def _source(s) -> str:
    low = lower(s, SM90A)
    return cuda_source(low, index32_ok(low))[0]


@pytest.mark.parametrize("kernel", ["wgmma", "mma"])
def test_tensor_core_write_back_goes_through_the_stage(kernel):
    src = _source(_tensor_core(1001, 10781, 72, "float16", kernel))
    product = src[src.index("C_stage"):]
    # the accumulators into the padded tile (rows of 136), the copy-out's global stores from it
    assert re.search(r"C_stage\[.*136 \* C_local_q3", product)
    assert re.search(r"C\[\(+10781 \* \(C_stage_e / 128\)\) \+ \(C_stage_e % 128\)", product)
    assert "__syncthreads();\n" in product.split("C_stage_q")[0]
    assert "C_stage" not in _source(_tensor_core(1001, 10781, 72, "float16", kernel, store="threads"))


def _sass(kern) -> str:
    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kern.cubin)
        f.flush()
        return subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout


@needs_nvcc
@pytest.mark.parametrize("kernel", ["wgmma", "mma"])
def test_staged_kernels_build_without_local_memory(kernel):
    kern = pt.build(_tensor_core(1001, 10781, 71, "bfloat16", kernel), SM90A)
    sass = _sass(kern)
    assert "STL" not in sass and "LDL" not in sass
    product = sass[sass.index("matmul_kernel2"):] if "matmul_kernel2" in sass else sass
    assert "STS.U16" in product or "STS" in product  # the accumulators into the stage
    assert re.search(r"STG\.E\.U16", product)  # the copy-out, an element a thread


def test_the_rule_stages_only_odd_16_bit_rows_of_unsplit_tensor_core_products(monkeypatch):
    f16, bf16, f32 = (as_dtype(d) for d in ("float16", "bfloat16", "float32"))
    for M, N, K, dt in [(1001, 10781, 71, f16), (128, 50257, 768, f16), (77, 30523, 512, f16), (2048, 4097, 1023, bf16),
                        (2085, 3175, 113, bf16)]:
        on = gemm_choice(SM90A, M, N, K, dt, out_bytes=2, staged_stores=True)
        off = gemm_choice(SM90A, M, N, K, dt, out_bytes=2, staged_stores=False)
        assert on.params.pop("store") == "staged" and on.kernel in ("wgmma", "mma") and on.split == 1
        # the same tiles, their stages fewer only where the staging tile would not fit beside them
        assert {k: v for k, v in on.params.items() if k not in ("stages", "inflight")} == \
            {k: v for k, v in off.params.items() if k not in ("stages", "inflight")}
        p = on.params
        assert 2 <= p["stages"] <= off.params["stages"]
        stage = p["bm"] * (p["bn"] + 8) * 2
        pad = 8 if on.kernel == "mma" else 0  # mma.sync's operand rows padded by 8 elements
        assert p["stages"] * (p["bm"] + p["bn"]) * (p["bk"] + pad) * 2 + stage <= SM90A.shared_per_block
        assert gemm_choice(SM90A, M, N, K, dt, out_bytes=2).params["store"] == "staged"  # the default (measured)
    for M, N, K, dt, out in [(16, 4097, 512, f16, 2),     # 65K results: measured slower staged
                             (300, 517, 71, f16, 2),      # 155K results: within ±2% where measured
                             (128, 50256, 768, f16, 2),   # even N: paired or exchanged stores
                             (1001, 10781, 71, f16, 4),   # float32 results
                             (8, 50257, 768, f16, 2),     # the GEMV writes its own rows
                             (61, 61, 8191, f16, 2)]:     # split: the partial sums, then their sum
        assert "store" not in gemm_choice(SM90A, M, N, K, dt, out_bytes=out, staged_stores=True).params, (M, N, K)
    assert "store" not in gemm_choice(SM90A, 128, 301, 4096, f32, out_bytes=2, staged_stores=True).params
    batched = gemm_choice(SM90A, 333, 555, 96, f16, batch=7, out_bytes=2)  # batched products: not yet measured
    assert "store" not in batched.params
    monkeypatch.setattr(gpu_schedules, "STAGED_ODD_STORES", False)  # the A/B switch: as before
    assert "store" not in gemm_choice(SM90A, 1001, 10781, 71, f16, out_bytes=2).params
    assert gemm_choice(SM90A, 1001, 10781, 71, f16, out_bytes=2, staged_stores=True).params["store"] == "staged"
    # overlaid (STAGED_OVERLAY): the default's stages kept, where an operand's tiles hold the staging tile
    for M, N, K, dt in [(1001, 10781, 71, f16), (77, 30523, 512, f16), (2048, 4097, 1023, bf16), (16, 4097, 512, f16),
                        (300, 517, 64, f16)]:
        off = gemm_choice(SM90A, M, N, K, dt, out_bytes=2)
        on = gpu_schedules.staged_stores_choice(SM90A, off, N, K, 2, 2, overlay=True)
        assert on.params == {**off.params, "store": "staged overlaid"}, (M, N, K)
    # the suite's aligned neighbours (BERT's linears, LLaMA's decode and vocabulary) are left as they were
    for M, N, K in [(128, 768, 768), (128, 3072, 768), (2048, 768, 3072), (8, 4096, 4096), (8, 14336, 4096),
                    (2048, 128256, 4096), (1, 50257, 768)]:
        for dt in (f16, bf16):
            assert gemm_choice(SM90A, M, N, K, dt, out_bytes=2, staged_stores=True) == \
                gemm_choice(SM90A, M, N, K, dt, out_bytes=2, staged_stores=False), (M, N, K)


def test_the_wide_one_step_gemv_fills_the_sms(monkeypatch):
    f32, f16 = as_dtype("float32"), as_dtype("float16")
    c = gemm_choice(SM90A, 1, 8424, 48, f32)
    assert c.kernel == "gemv" and c.split == 1 and c.params["direct"] and c.params["bk"] == 48
    threads = c.params["bn"] // c.params["vec"]
    assert threads == 32 and -(-8424 // c.params["bn"]) >= SM90A.sms  # a block on every SM
    assert gemm_choice(SM90A, 4, 8424, 48, f32).params["direct"]  # measured 16.3 -> 6.9 µs
    # measured slower on the wide step: K a multiple of the staged GEMV's K tile, 16-bit operands
    for M, N, K, dt in [(1, 12000, 32, f32), (1, 20000, 64, f32), (1, 8424, 48, f16)]:
        assert not gemm_choice(SM90A, M, N, K, dt).params.get("direct"), (M, N, K)
    for M, N, K in [(1, 20000, 128), (1, 50000, 63)]:  # K past one step, B past WIDE_ONE_STEP_BYTES
        assert not gemm_choice(SM90A, M, N, K, f32).params.get("stages") == 1
    monkeypatch.setattr(gpu_schedules, "WIDE_ONE_STEP", False)  # the A/B switch: the staged GEMV, as before
    assert not gemm_choice(SM90A, 1, 8424, 48, f32).params.get("direct")


@pytest.mark.parametrize("dims", [(1, 8424, 48), (3, 9002, 33), (1, 20006, 64)], ids=str)  # 8-byte rows of B
def test_the_wide_one_step_gemv_is_the_product_on_the_block_emulator(dims):
    M, N, K = dims
    op = ops.matmul(M, N, K, "float32")
    sched = _wide(op, M, N, K, 4)
    a, b = op.make_inputs(np.random.default_rng(M * N + K))
    (out,) = block_emulator.run(pt.lower(sched, SM90A), [a, b, np.full((M, N), np.nan, np.float32)])
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dims", [(1001, 10781, 71, False), (77, 30523, 512, False), (77, 30523, 512, True)],
                         ids=str)
def test_the_wgmma_template_starts_at_the_staged_default(monkeypatch, dims):
    from polytile.tune import make_task
    *mnk, overlay = dims
    monkeypatch.setattr(gpu_schedules, "STAGED_ODD_STORES", True)
    monkeypatch.setattr(gpu_schedules, "STAGED_OVERLAY", overlay)
    op = ops.matmul(*mnk, "float16", out_dtype="float16")
    task = make_task(op, SM90A)
    default = task.space.default
    assert task.space.reason_invalid(default.digits) is None
    assert default.values["store"] == ("staged overlaid" if overlay else "staged")
    source = _source(task.schedule(default.values))
    assert source == _source(op.schedule(SM90A)) and "C_stage" in source
    # the store is a knob of the space: the threads' stores are a configuration of it
    threads = task.schedule({**default.values, "store": "threads"})
    assert "C_stage" not in _source(threads)


def test_the_wgmma_template_offers_staged_stores_only_for_rows_2_byte_aligned():
    from polytile.tune import make_task
    for N, offered in [(10781, True), (10782, False), (768, False)]:
        task = make_task(ops.matmul(1001, N, 72, "float16", out_dtype="float16"), SM90A)
        space = task.space
        staged = [c for c in space if c.values.get("store") == "staged" and space.is_valid(c.digits)]
        assert bool(staged) == offered, N


def _wide(op, M, N, K, itemsize):
    """``op``'s schedule as the wide one-step GEMV (``gpu_schedules.wide_one_step``'s)."""
    one = gpu_schedules.one_step_gemv(M, N, K, itemsize, gpu_schedules.WIDE_ONE_STEP_BYTES, SM90A.sms)
    sched = pt.Schedule(op.func)
    return gpu_schedules.gemm_as(sched, gpu_schedules.GemmChoice("gemv", one, 1, 0.0), M, N, K) or sched


def _overlaid_cuda_core(M, N, K, bk=64):
    s = pt.Schedule(ops.matmul(M, N, K, "float32").func)
    gemm_cuda(s, "C", "A", "B", bm=32, bn=32, bk=bk, tm=4, tn=4, stages=1)
    s["C"].staged_store(overlay=True)
    return s


@pytest.mark.parametrize("dims", [(37, 45, 70), (1, 33, 129), (64, 31, 5)], ids=str)
def test_overlaid_stage_is_the_product_on_the_block_emulator(dims):
    # the staging tile in the storage of A's shared tile (the emulator's view of it), after the K loop
    M, N, K = dims
    op = ops.matmul(M, N, K, "float32")
    low = pt.lower(_overlaid_cuda_core(M, N, K), SM90A)
    shared = {x.buffer.name: x.buffer.overlays for x in ir.walk_stmt(low.body)
              if isinstance(x, ir.Allocate) and x.buffer.scope == "shared"}
    assert shared["C_stage"] in ("A_shared", "B_shared")
    a, b = op.make_inputs(np.random.default_rng(M + N * K))
    (out,) = block_emulator.run(low, [a, b, np.full((M, N), np.nan, np.float32)])
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-6, atol=1e-6)


def test_overlay_needs_a_large_enough_buffer_unused_after_the_k_loop():
    def overlays(s):
        low = pt.lower(s, SM90A)
        (stage,) = [x for x in ir.walk_stmt(low.body) if isinstance(x, ir.Allocate) and x.buffer.name == "C_stage"]
        # a barrier first: every warp done with the operand tiles before their storage is written
        first = stage.body.body[0] if isinstance(stage.body, ir.Block) else stage.body
        return stage.buffer.overlays, ir.stmt_text(first).strip()
    assert overlays(_overlaid_cuda_core(37, 45, 70)) == ("A_shared", "__syncthreads()")
    assert overlays(_overlaid_cuda_core(37, 45, 70, bk=8))[0] == ""  # operand tiles smaller than the stage
    wgmma = _tensor_core(77, 30523, 512, "float16", "wgmma", store="staged overlaid")
    src = _source(wgmma)
    assert re.search(r"__half\* C_stage = \(__half\*\)[AB]_shared;", src)
    # 4 stages of 128×128 operand tiles and the stage would not fit beside them: overlaid, they do
    from polytile.errors import LoweringError
    with pytest.raises(LoweringError, match="exceed"):
        _source(_tensor_core(77, 30523, 512, "float16", "wgmma", store="staged", bn=256))
    _source(_tensor_core(77, 30523, 512, "float16", "wgmma", store="staged overlaid", bn=256))
