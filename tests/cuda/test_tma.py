"""TMA pipelines (``pipeline(..., producer="tma")``) without a GPU: the golden loop IR of a small
TMA-pipelined wgmma GEMM (mbarrier rings, prologue, parity waits, releases), the proof that the
threads' copy is one TMA box layout, the refusals, the generated CUDA compiled by nvcc for sm_90a
(UTMALDG and SYNCS instructions, no cp.async, no local memory), and the call path's tensor maps
against a fake driver (made once per array address, passed by value after the other arguments).

Regenerate the golden file after a reviewed change with POLYTILE_REGEN_GOLDEN=1.
"""

import os
import re
from pathlib import Path

import pytest
from fake_gpu import FakeArray, FakeFramework, fake_devices, fake_framework
from source_text import body

import polytile as pt
from polytile import ops
from polytile.errors import InputError, LoweringError, ScheduleError
from polytile.lowering import loopir as ir
from polytile.ops.gpu_schedules import align_operands, gemm_wgmma
from polytile.target import CUDATarget

GOLDEN = Path(__file__).parent / "golden"
SM90A = CUDATarget(arch="sm_90a")


def _sched(M=300, N=264, K=200, dtype="float16", align=False, **cfg):
    s = pt.Schedule(ops.matmul(M, N, K, dtype).func)
    if align:
        align_operands(s, "C", ("A", "B"), granule=16)
    gemm_wgmma(s, "C", "A", "B", producer="tma", **cfg)
    return s


def test_golden_tma_ir():
    # five K tiles in three slots, one group in flight: slots refilled after their release
    s = _sched(M=128, N=128, K=320, bm=64, bn=64, bk=64, stages=3, inflight=1)
    got = str(pt.lower(s, SM90A)) + "\n"
    path = GOLDEN / "tma_gemm.txt"
    if os.environ.get("POLYTILE_REGEN_GOLDEN"):
        path.write_text(got)
    assert got == path.read_text()


def test_golden_specialized_tma_ir():
    # the same GEMM with a producer warpgroup: threadIdx.z 4..7 give registers up and one thread of
    # warp 4 issues every copy; warps 0..3 take the registers and run the kernel's body
    s = _sched(M=128, N=128, K=320, bm=64, bn=64, bk=64, stages=3, inflight=1, specialize=True)
    got = str(pt.lower(s, SM90A)) + "\n"
    path = GOLDEN / "tma_specialized_gemm.txt"
    if os.environ.get("POLYTILE_REGEN_GOLDEN"):
        path.write_text(got)
    assert got == path.read_text()


def _calls(s, name):
    return [st.call for st in ir.walk_stmt(pt.lower(s, SM90A).body)
            if isinstance(st, ir.Evaluate) and st.call.name == name]


def test_boxes_follow_the_tiles():
    # bk = 128: two 64-column boxes of A per stage; bn = 192: three boxes of B, 128 K rows each;
    # every stage expects the bytes of all five boxes
    s = _sched(M=512, N=384, K=1024, bm=128, bn=192, bk=128, stages=2)
    loads = _calls(s, "pt_tma_load_2d")
    boxes = {(c.args[1].buffer.name, ir.eval_int(c.args[5], {}), ir.eval_int(c.args[6], {})) for c in loads}
    assert boxes == {("A", 64, 128), ("B", 64, 128)}
    expect = {ir.eval_int(c.args[1], {}) for c in _calls(s, "pt_mbar_expect_tx")}
    assert expect == {2 * (2 * 128 * 64 + 3 * 128 * 64)}
    # the column of B's third box in block column bj, K tile ko: 192 bj + 128, row 128 ko (+ 128 ahead)
    third = [c for c in loads if c.args[1].buffer.name == "B" and "128)" in ir.expr_text(c.args[3])]
    assert third and all(ir.eval_int(c.args[3], {"bj": 1, "ko": 0}) == 192 + 128 for c in third)


def test_release_lags_by_the_groups_in_flight():
    # with one group in flight, iteration ko releases the slot of ko - 1; without, its own
    for inflight, released in ((1, "((ko - 1) % 4)"), (0, "(ko mod 4)")):
        s = _sched(M=300, N=264, K=1000, bm=128, bn=128, bk=64, stages=4, inflight=inflight)
        (arrive,) = _calls(s, "pt_mbar_arrive")
        assert ir.expr_text(arrive.args[0].index[0]) == released


# --- refusals --------------------------------------------------------------------------------------

def test_tma_refuses_unswizzled_tiles():
    with pytest.raises(ScheduleError, match="not stored in 128-byte swizzled rows.*producer='threads'"):
        _sched(bm=128, bn=128, bk=32, stages=3)


def test_tma_needs_a_warpgroup_nest_first():
    s = pt.Schedule(ops.matmul(256, 256, 256, "float16").func)
    st = s["C"]
    st.split("i", 64, "bi", "i1").split("k", 64, "ko", "k1").bind("bi", "blockIdx.x")
    st.cache("A", "ko", loc="shared", name="A_shared")
    with pytest.raises(ScheduleError, match="tensorize C with 'wgmma_m64nNk16' first"):
        st.pipeline("A_shared", 3, producer="tma")
    assert "A_shared" not in s.pipelines  # transactional


def test_tma_refuses_unknown_producers_and_single_stages():
    s = pt.Schedule(ops.matmul(256, 256, 256, "float16").func)
    gemm_wgmma(s, "C", "A", "B", bm=128, bn=128, bk=64, stages=3)
    with pytest.raises(ScheduleError, match="producer must be one of 'threads', 'tma', got 'dma'"):
        s["C"].pipeline("A_shared", 3, producer="dma")
    with pytest.raises(ScheduleError, match="needs stages >= 2"):
        _sched(bm=128, bn=128, bk=64, stages=1)


def _batched(batch=3, M=200, N=136, K=200, **cfg):
    s = pt.Schedule(ops.batch_matmul(batch, M, N, K, "float16").func)
    gemm_wgmma(s, "C", "A", "B", batch="bb", producer="tma", **cfg)
    return s


def test_batched_products_load_3d_boxes_of_one_batch():
    # A[bb, i, k] and B[bb, k, j]: boxes of the last two dimensions at batch bb (blockIdx.z)
    loads = _calls(_batched(bm=64, bn=64, bk=64, stages=3, inflight=1), "pt_tma_load_3d")
    assert loads and not _calls(_batched(bm=64, bn=64, bk=64, stages=3), "pt_tma_load_2d")
    for c in loads:
        assert ir.expr_text(c.args[5]) == "int32(bb)"
        x, y = (ir.eval_int(c.args[k], {"bi": 2, "bj": 1, "ko": 0}) for k in (3, 4))
        # B's box at column 64 bj, A's at row 64 bi; K tile 0 (prologue) or ko + 1 (ahead)
        assert (x, y in (0, 64)) == (64, True) if c.args[1].buffer.name == "B" else (y, x in (0, 64)) == (128, True)


def test_tma_refuses_rows_that_are_not_16_byte_multiples():
    # K = 100: rows of A are 200 bytes; with the operands copied aligned first (rows of 104) it builds
    with pytest.raises(LoweringError, match=r"rows of A are 100 elements \(200 bytes\).*align_operands"):
        pt.lower(_sched(M=300, N=256, K=100, bm=128, bn=128, bk=64, stages=3), SM90A)
    loads = _calls(_sched(M=300, N=256, K=100, align=True, bm=128, bn=128, bk=64, stages=3), "pt_tma_load_2d")
    assert {c.args[1].buffer.name for c in loads} == {"A_aligned", "B"}


def test_copy_proof_finds_a_misplaced_element():
    # a cooperative copy of a 64 × 64 tile of A by 128 threads (32 elements each), stored in TMA's
    # layout; with row and column swapped in the cache; with a guard of its own
    from polytile import dtypes
    from polytile.dtypes import float16
    from polytile.lowering.passes.tma import tma_tile

    A = ir.Buffer("A", float16, (ir.const(256), ir.const(256)), "arg")
    cache = ir.Buffer("A_shared", float16, (ir.const(64), ir.const(64)), "shared", swizzle=128)
    k, q, bi = ir.Var("k"), ir.Var("q"), ir.Var("bi")
    row, col = ir.BinOp("div", q, ir.const(64)), ir.BinOp("mod", q, ir.const(64))
    src = ir.Load(A, (ir.BinOp("+", row, ir.BinOp("*", ir.const(64), bi)), col))

    def copy(index, value=src):
        tid = ir.Cast(dtypes.INDEX, ir.Var("threadIdx.x", dtypes.int32))
        flat = ir.BinOp("+", tid, ir.BinOp("*", ir.const(128), k))
        return ir.For(k, ir.const(0), ir.const(32), ir.LetStmt(q, flat, ir.Store(cache, index, value)), "coop")

    tile = tma_tile(copy((row, col)), cache, (128, 1, 1))
    assert (tile.rows, tile.width, tile.boxes) == (64, 64, 1)
    assert ir.expr_text(tile.row) == "(64 * bi)" and ir.expr_text(tile.col) == "0"
    with pytest.raises(LoweringError, match=r"element \(0, 1\) of the box is stored at 64, TMA's layout puts it at 1"):
        tma_tile(copy((col, row)), cache, (128, 1, 1))
    guarded = ir.Select(ir.Cmp("<", col, ir.const(32)), src, ir.Const(0.0, float16))
    with pytest.raises(LoweringError, match="reads zeros where A has elements"):
        tma_tile(copy((row, col), guarded), cache, (128, 1, 1))


def test_register_splits_over_the_sm_are_refused():
    # 12 consumer warps × 32 × 232 + 128 × 40 = 94208 registers: setmaxnreg.inc would never return
    s = _sched(M=1000, N=1000, K=520, bm=192, bn=128, bk=64, stages=3)
    s["C"].pipeline("A_shared", 3, producer="tma", specialize=True, registers=(40, 232))
    s["C"].pipeline("B_shared", 3, producer="tma", specialize=True, registers=(40, 232))
    with pytest.raises(LoweringError, match=r"128 producer threads × 40 registers \+ 384 consumer threads × 232 = "
                                            r"94208 registers, more than the 65536 of an SM: setmaxnreg would hang"):
        pt.lower(s, SM90A)
    # the default split for 12 consumer warps: 152 registers each, 40 for the producer
    s["C"].pipeline("A_shared", 3, producer="tma", specialize=True)
    s["C"].pipeline("B_shared", 3, producer="tma", specialize=True)
    inc = [ir.eval_int(c.args[0], {}) for c in _calls(s, "pt_setmaxnreg_inc")]
    assert inc == [152] and [ir.eval_int(c.args[0], {}) for c in _calls(s, "pt_setmaxnreg_dec")] == [40]


def test_register_split_arguments_are_checked():
    s = _sched(bm=128, bn=128, bk=64, stages=3)
    with pytest.raises(ScheduleError, match=r"registers=\(40, 230\) must be \(producer, consumer\) registers"):
        s["C"].pipeline("A_shared", 3, producer="tma", specialize=True, registers=(40, 230))
    with pytest.raises(ScheduleError, match="specialize and registers apply to producer='tma'"):
        s["C"].pipeline("A_shared", 3, specialize=True)


@pytest.mark.needs_nvcc
def test_unreachable_entry_registers_are_refused_at_build():
    # the kernel needs more registers per thread than a consumer count of 24 (ptxas reports 90):
    # setmaxnreg.inc cannot lower them
    from polytile.errors import BuildError
    s = _sched(M=512, N=512, K=256, bm=128, bn=128, bk=64, stages=3)
    for c in ("A_shared", "B_shared"):
        s["C"].pipeline(c, 3, producer="tma", specialize=True, registers=(24, 24))
    with pytest.raises(BuildError, match=r"starts with \d+ registers per thread, outside its warp specialization's "
                                         r"split \(24 for the producer, 24 for the consumers\)"):
        pt.build(s, SM90A)


# --- nvcc ------------------------------------------------------------------------------------------

@pytest.mark.needs_nvcc
@pytest.mark.parametrize("dtype,cfg", [
    ("float16", dict(bm=128, bn=256, bk=64, stages=4, inflight=1)),
    ("bfloat16", dict(bm=128, bn=192, bk=128, stages=2)),
])
def test_tma_compiles_to_utmaldg(dtype, cfg):
    from test_wgmma import _sass

    from polytile.runtime.cuda import compile_cuda
    src = pt.build(_sched(M=1000, N=1000, K=520, dtype=dtype, **cfg), SM90A).source
    assert "const __grid_constant__ pt_tensor_map pt_tmap_A_128x64" in src
    cubin, resources = compile_cuda(src, "sm_90a")
    text = _sass(cubin)
    assert "UTMALDG.2D" in text and "SYNCS.ARRIVE.TRANS64" in text and "SYNCS.PHASECHK.TRANS64.TRYWAIT" in text
    assert "HGMMA.64x" in text
    assert not re.search(r"\bLDGSTS\b|\bLDL\b|\bSTL\b", text)
    assert all(r.stack_bytes == 0 and r.spill_stores == 0 for r in resources.values())


@pytest.mark.needs_nvcc
def test_batched_tma_compiles_to_3d_copies():
    from test_wgmma import _sass

    from polytile.runtime.cuda import compile_cuda
    src = pt.build(_batched(batch=12, M=1000, N=1024, K=128, bm=128, bn=128, bk=64, stages=3, inflight=1, group=4),
                   SM90A).source
    cubin, resources = compile_cuda(src, "sm_90a")
    text = _sass(cubin)
    assert "UTMALDG.3D" in text and "UTMALDG.2D" not in text and "HGMMA.64x128x16" in text
    assert not re.search(r"\bLDGSTS\b|\bLDL\b|\bSTL\b", text)
    assert all(r.stack_bytes == 0 and r.spill_stores == 0 for r in resources.values())


@pytest.mark.needs_nvcc
def test_specialized_tma_compiles_to_setmaxnreg():
    from test_wgmma import _sass

    from polytile.runtime.cuda import compile_cuda
    kern = pt.build(_sched(M=4096, N=4096, K=4096, dtype="bfloat16", bm=128, bn=256, bk=64, stages=4, inflight=1,
                           specialize=True), SM90A)
    assert "__launch_bounds__(384, 1)" in kern.source and kern.kernels[0].block == (32, 1, 12)
    assert kern.kernels[0].register_split == (40, 232)
    cubin, resources = compile_cuda(kern.source, "sm_90a")
    text = _sass(cubin)
    # (ptxas drops setmaxnreg, warning C7508, where a warpgroup's role is not one branch of an if/else)
    assert "USETMAXREG.DEALLOC.CTAPOOL" in text and "USETMAXREG.TRY_ALLOC.CTAPOOL" in text
    assert "UTMALDG.2D" in text and "HGMMA.64x256x16" in text
    assert not re.search(r"\bLDGSTS\b|\bLDL\b|\bSTL\b", text)
    assert all(r.stack_bytes == 0 and r.spill_stores == 0 for r in resources.values())


def test_tma_source_holds_only_what_it_uses():
    src = body(pt.build(_sched(M=512, N=512, K=256, bm=128, bn=128, bk=64, stages=3), SM90A).source)
    assert "pt_cp_async" not in src and "pt_tma_load_2d(" in src and "pt_mbar_wait(" in src


# --- the call path ---------------------------------------------------------------------------------

@pytest.fixture
def fw(monkeypatch) -> FakeFramework:
    return fake_framework(monkeypatch)


@pytest.mark.needs_nvcc
def test_tensor_maps_are_made_once_per_address(monkeypatch, fw, rng):
    kern = pt.build(_sched(M=300, N=264, K=200, bm=128, bn=128, bk=64, stages=3), SM90A)
    driver = fake_devices(monkeypatch)
    (k,) = kern.kernels
    assert [(m.buffer.name, m.rows, m.width) for m in k.tensor_maps] == [("A", 128, 64), ("B", 64, 64)]
    driver.kinds[k.name] = ["pointer"] * len(k.args) + ["int32"] * len(k.params) + ["tensormap"] * 2
    a1, a2 = (FakeArray(rng.standard_normal((300, 200)).astype("float16")) for _ in range(2))
    b = FakeArray(rng.standard_normal((200, 264)).astype("float16"))
    kern(a1, b)
    kern(a1, b)
    kern(a2, b)
    # A: 200 columns × 300 rows of 400 bytes, boxes of 64 × 128; B: 264 × 200 (528-byte rows), 64 × 64
    a_map = lambda a: (a.data.ctypes.data, 200, 300, 400, 64, 128, 3)  # noqa: E731
    b_map = (b.data.ctypes.data, 264, 200, 528, 64, 64, 3)
    assert [m[2:8] + (m[11],) for m in driver.tensor_maps] == [a_map(a1), b_map, a_map(a2)]
    maps = [launch.args[-2:] for launch in driver.launches]
    assert [m[0][:7] for m in maps] == [a_map(a1), a_map(a1), a_map(a2)]
    assert all(m[1][:7] == b_map for m in maps)


@pytest.mark.needs_nvcc
def test_batched_tensor_maps_have_a_batch_dimension(monkeypatch, fw, rng):
    kern = pt.build(_batched(batch=3, M=200, N=136, K=200, bm=64, bn=64, bk=64, stages=3), SM90A)
    driver = fake_devices(monkeypatch)
    (k,) = kern.kernels
    driver.kinds[k.name] = ["pointer"] * len(k.args) + ["int32"] * len(k.params) + ["tensormap"] * 2
    a = FakeArray(rng.standard_normal((3, 200, 200)).astype("float16"))
    b = FakeArray(rng.standard_normal((3, 200, 136)).astype("float16"))
    kern(a, b)
    # rank 3: (columns, rows, batch), strides of a row and of a batch, boxes of one batch
    ranks = {m[1] for m in driver.tensor_maps}
    assert ranks == {3}
    by_ptr = {m[2]: m[3:] for m in driver.tensor_maps}
    assert by_ptr[a.data.ctypes.data][:10] == (200, 200, 3, 400, 400 * 200, 64, 64, 1, 1, 1)
    assert by_ptr[b.data.ctypes.data][:10] == (136, 200, 3, 272, 272 * 200, 64, 64, 1, 1, 1)


def test_unaligned_rows_are_refused_at_the_call():
    # a parametric K: whether A's rows are 16-byte multiples is known only at the call
    from polytile.codegen.cuda import TensorMap
    from polytile.dtypes import float16
    from polytile.runtime.cuda import _tensor_map_encoder

    class Sig:  # the encoder reads the signature's parameters only
        params = {"K": 100}

    A = ir.Buffer("A", float16, (ir.const(300), ir.Var("K")), "arg")
    with pytest.raises(InputError, match=r"A has rows of 100 float16 elements \(200 bytes\).*producer='threads'"):
        _tensor_map_encoder(TensorMap("pt_tmap_A_128x64", A, 128, 64), None, Sig, "matmul")
    Sig.params = {"K": 104}
    assert callable(_tensor_map_encoder(TensorMap("pt_tmap_A_128x64", A, 128, 64), None, Sig, "matmul"))


def test_default_gemms_load_with_tma_where_the_rows_allow():
    from polytile.dtypes import as_dtype
    from polytile.ops.gpu_schedules import gemm_choice

    def producer(M, N, K, **kw):
        return gemm_choice(SM90A, M, N, K, as_dtype("bfloat16"), **kw).params.get("producer", "threads")

    assert producer(4096, 4096, 4096) == "tma" and producer(300, 264, 200) == "tma"
    assert producer(1000, 1500, 700) == "threads"  # rows of 1400 and 3000 bytes: read in pieces, in place
    assert producer(17, 64, 64) == "threads"  # fewer rows than one block tile
    assert producer(4096, 4096, 4096, batch=4) == "tma"  # batched: 3-D tensor maps
    # attention's context product (N = 128): no 192-wide tile past the matrix's columns, which left TMA out
    ctx = gemm_choice(SM90A, 2048, 128, 2048, as_dtype("bfloat16"), batch=32).params
    assert ctx["bn"] == 128 and ctx["producer"] == "tma"
    assert producer(4096, 4096, 4096, split_k=2) == "tma"  # split in chunks of whole K tiles
    src = ops.matmul(300, 264, 200, "bfloat16").build("cuda:sm_90a").source
    assert "pt_tma_load_2d(" in src and "pt_cp_async" not in body(src)
    # rows only 2-byte aligned (GPT-2's vocabulary, N = 50257) are copied 16-byte aligned first:
    # TMA reads the copy, and the tiles may be as wide as for aligned rows (no 4-byte pieces)
    assert producer(128, 50257, 768) == "tma" and producer(997, 1009, 1013) == "tma"
    loads = _calls(_default_sched(128, 50257, 768), "pt_tma_load_2d")
    assert {c.args[1].buffer.name for c in loads} == {"A", "B_aligned"}


def test_guard_of_partial_row_tiles_with_whole_k_tiles():
    # 1000 rows (a partial last row tile) and K = 128 (two whole K tiles): the copy of A guards its
    # rows only; the proof sampled the K loop past K (ko = 5) and refused the guard, so the default
    # 1000×1024×128 GEMM did not build for sm_90a
    src = ops.matmul(1000, 1024, 128, "float16").build(SM90A).source
    assert "pt_tma_load_2d(" in src


def _default_sched(M, N, K, dtype="bfloat16"):
    from polytile.ops.gpu_schedules import matmul as default_matmul
    s = pt.Schedule(ops.matmul(M, N, K, dtype).func)
    assert default_matmul(s, SM90A, M, N, K) is None
    return s


def test_column_raster_binds_the_row_tiles_to_blockidx_x():
    s = _sched(M=2048, N=8192, K=256, bm=128, bn=256, bk=64, stages=3, raster="columns")
    (k,) = [st for st in ir.walk_stmt(pt.lower(s, SM90A).body) if isinstance(st, ir.Kernel)]
    assert [ir.eval_int(g, {}) for g in k.grid] == [16, 32, 1]  # 16 row tiles along x, 32 column tiles along y
    assert "let bi = int64(blockIdx.x)" in str(pt.lower(s, SM90A))
    with pytest.raises(ScheduleError, match="raster must be 'rows' or 'columns'"):
        _sched(bm=128, bn=128, bk=64, stages=3, raster="diagonal")
