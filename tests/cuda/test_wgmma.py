"""Warpgroup MMA (wgmma) without a GPU: the primitive's layouts and checks, the lowering's refusals,
the golden loop IR of a small pipelined wgmma GEMM (one group in flight, swizzled tiles), and the
generated CUDA compiled by nvcc for sm_90a (HGMMA instructions, asynchronous copies, no local memory).

Regenerate the golden file after a reviewed change with POLYTILE_REGEN_GOLDEN=1.
"""

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from source_text import body

import polytile as pt
from polytile import ops
from polytile.errors import LoweringError, ScheduleError
from polytile.ops.gpu_schedules import gemm_wgmma
from polytile.target import CUDATarget

GOLDEN = Path(__file__).parent / "golden"
SM90A = CUDATarget(arch="sm_90a")


def _sched(M=300, N=264, K=200, dtype="float16", **cfg):
    s = pt.Schedule(ops.matmul(M, N, K, dtype).func)
    gemm_wgmma(s, "C", "A", "B", **cfg)
    return s


def _manual(M=256, N=128, K=128, warp_tag="threadIdx.z", rows=16, bm=64, pad=(), b_transposed=False):
    A = pt.placeholder((M, K), "float16", "A")
    B = pt.placeholder((N, K) if b_transposed else (K, N), "float16", "B")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(
        A[i, k].astype("float32") * (B[j, k] if b_transposed else B[k, j]).astype("float32"), axis=k), "C")
    s = pt.Schedule(pt.Func([A, B], [C], name="hgemm"))
    st = s["C"]
    st.split("i", bm, "bi", "i1").split("j", 64, "bj", "j1")
    st.split("i1", rows, "wi", "i2").split("i2", 16, "mi", "i3").split("j1", 8, "nj", "j3")
    st.split("k", 64, "ko", "k1").split("k1", 16, "kk", "k3")
    st.reorder("bi", "bj", "wi", "ko", "kk", "mi", "nj", "i3", "j3", "k3")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("wi", warp_tag)
    st.cache("A", "ko", loc="shared", name="A_shared", pad=pad).cache("B", "ko", loc="shared", name="B_shared")
    st.cache_write("wi", loc="fragment")
    return s


# --- the primitive ---------------------------------------------------------------------------------

def test_tensorize_sets_swizzled_layouts_where_rows_are_whole():
    s = _sched(bm=128, bn=256, bk=64, stages=3)
    caches = {c.name: c for c in s.caches}
    assert caches["A_shared"].swizzle == 128 and caches["B_shared"].swizzle == 128
    assert caches["A_shared"].copy_order == "cache"
    # a 32-wide K tile holds no whole 128-byte rows: A falls back to unswizzled core matrices
    s = _sched(bm=128, bn=256, bk=32, stages=3)
    caches = {c.name: c for c in s.caches}
    assert caches["A_shared"].swizzle == 0 and caches["B_shared"].swizzle == 128


def test_wgmma_refuses_a_layout_of_the_users():
    s = _manual(pad=(0, 8))
    with pytest.raises(ScheduleError, match="wgmma sets the shared layout"):
        s["C"].tensorize("i3", "wgmma_m64nNk16")


def test_wgmma_reads_a_transposed_b_k_major():
    # B stored [n][k] (a linear layer's weight): its tile in 128-byte swizzled rows of k, read by
    # the instruction K-major (as A: LBO 16, 8-row groups 1024 B apart) without its transpose flag
    s = _manual(b_transposed=True)
    s["C"].tensorize("i3", "wgmma_m64nNk16")
    assert {c.name: c.swizzle for c in s.caches}["B_shared"] == 128
    src = body(pt.build(s, SM90A).source)
    assert re.search(r"pt_wgmma_m64n64k16_f16\(&C_local\[0\], .*, 16, 1024, 1, 16, 1024, 1, 0\);", src)
    src = body(pt.build(_sched(M=512, N=512, K=256, bm=128, bn=256, bk=64, stages=3), SM90A).source)
    assert re.search(r"pt_wgmma_m64n256k16_f16\(&C_local\[0\], .*, 1\);", src)  # N-major B: transposed


def test_wgmma_needs_a_k_major():
    A = pt.placeholder((64, 64), "float16", "A")
    B = pt.placeholder((64, 64), "float16", "B")
    k = pt.reduce_axis(64, "k")
    C = pt.compute((64, 64), lambda i, j: pt.sum(A[k, i].astype("float32") * B[k, j].astype("float32"), axis=k), "C")
    s = pt.Schedule(pt.Func([A, B], [C], name="at"))
    st = s["C"]
    st.split("i", 16, "wi", "i3").split("j", 8, "nj", "j3").split("k", 16, "kk", "k3")
    st.reorder("wi", "kk", "nj", "i3", "j3", "k3").bind("wi", "threadIdx.z")
    st.cache("A", "wi", loc="shared").cache("B", "wi", loc="shared").cache_write("wi", loc="fragment")
    with pytest.raises(ScheduleError, match="A\\[..., i, k\\]"):
        s["C"].tensorize("i3", "wgmma_m64nNk16")


def test_inflight_needs_wgmma_and_stages():
    s = _manual()
    with pytest.raises(ScheduleError, match="tensorize"):
        s["C"].pipeline("A_shared", 3, inflight=1)
    s["C"].tensorize("i3", "wgmma_m64nNk16")
    with pytest.raises(ScheduleError, match="inflight \\+ 2 stages"):
        s["C"].pipeline("A_shared", 2, inflight=1)


# --- the lowering's refusals -----------------------------------------------------------------------

def test_wgmma_needs_sm90a():
    with pytest.raises(LoweringError, match=r"wgmma_m64nNk16 at loop i3, which needs wgmma .*sm_90a only.*"
                                            r"use tensorize\(\.\.\., 'mma_m16n8k16'\)"):
        pt.lower(_sched(bm=128, bn=128, bk=64, stages=2), CUDATarget(arch="sm_80"))


def test_wgmma_warps_along_z():
    s = _manual(warp_tag="threadIdx.y")
    s["C"].tensorize("i3", "wgmma_m64nNk16")
    with pytest.raises(LoweringError, match="threadIdx.z"):
        pt.lower(s, SM90A)


def test_wgmma_each_warp_owns_16_rows():
    s = _manual(rows=32, bm=128)
    s["C"].tensorize("i3", "wgmma_m64nNk16")
    with pytest.raises(LoweringError, match="16 rows"):
        pt.lower(s, SM90A)


def test_wgmma_descriptors_match_the_layouts():
    src = body(pt.build(_sched(M=512, N=512, K=256, bm=128, bn=256, bk=64, stages=3), SM90A).source)
    # A: K-major, 128-byte swizzle, 8-row groups 1024 B apart; B: N-major, 64-column groups of
    # 64 rows × 128 B (8192 B) apart, 8-row groups 1024 B apart
    assert re.search(r"pt_wgmma_m64n256k16_f16\(&C_local\[0\], .*, 16, 1024, 1, 8192, 1024, 1, 1\);", src)
    src = body(pt.build(_sched(M=512, N=40, K=64, bm=64, bn=40, bk=32, stages=2), SM90A).source)
    # unswizzled core matrices: A's k groups 128 B apart, row groups 4 × 128 B; B's k groups
    # 5 × 128 B apart, column groups 128 B
    assert re.search(r"pt_wgmma_m64n40k16_f16\(&C_local\[0\], .*, 128, 512, 0, 640, 128, 0, 1\);", src)


def test_golden_wgmma_ir():
    s = _sched(M=128, N=128, K=192, bm=64, bn=64, bk=64, stages=3, inflight=1)
    got = str(pt.lower(s, SM90A)) + "\n"
    path = GOLDEN / "wgmma_gemm.txt"
    if os.environ.get("POLYTILE_REGEN_GOLDEN"):
        path.write_text(got)
    assert got == path.read_text()


# --- nvcc ------------------------------------------------------------------------------------------

def _sass(cubin: bytes) -> str:
    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("dtype,cfg", [
    ("float16", dict(bm=128, bn=256, bk=64, stages=4, inflight=1)),
    ("bfloat16", dict(bm=64, bn=40, bk=32, stages=3)),
])
def test_wgmma_compiles_to_hgmma(dtype, cfg):
    from polytile.runtime.cuda import compile_cuda
    src = pt.build(_sched(dtype=dtype, **cfg), SM90A).source
    cubin, resources = compile_cuda(src, "sm_90a")
    text = _sass(cubin)
    assert "HGMMA.64x" in text and "LDGSTS" in text
    assert "WARPGROUP.ARRIVE" in text and "WARPGROUP.DEPBAR" in text
    assert not re.search(r"\bHMMA\b|\bLDSM\b|\bLDL\b|\bSTL\b", text)


@pytest.mark.needs_nvcc
def test_wide_conv_tile_compiles_without_spills():
    """The convolution template's 64×256 warpgroup tile (one warpgroup, 128 accumulators a thread)
    in two channel chunks with two MMA groups in flight: wgmma.m64n256k16, no local memory."""
    from polytile.ops.conv_choice import IgemmChoice
    from polytile.ops.gpu_schedules import igemm_schedule
    from polytile.runtime.cuda import compile_cuda
    dims = (32, 7, 7, 512, 512, 3, 3, 1, 1)
    s = pt.Schedule(ops.conv2d_igemm(*dims).func)
    split = igemm_schedule(s, SM90A, IgemmChoice("wgmma", dict(bm=64, bn=256, bk=64, stages=5, inflight=2),
                                                 False, 2), *dims)
    cubin, resources = compile_cuda(pt.build(split, SM90A).source, "sm_90a")
    text = _sass(cubin)
    assert "HGMMA.64x256x16" in text and "WARPGROUP.DEPBAR.LE gsb0, 0x2" in text
    assert not re.search(r"\bLDL\b|\bSTL\b", text)


def _guarded_wgmma(body) -> list[str]:
    """Conditions on the threads that enclose a wgmma instruction (they would split a warpgroup)."""
    from polytile.lowering import loopir as ir
    found = []

    def visit(st, conds):
        if isinstance(st, ir.If):
            names = {n.name for n in ir.walk_expr(st.cond) if isinstance(n, ir.Var)}
            inner = conds + ([ir.expr_text(st.cond)] if names & {"wi", "threadIdx.z"} else [])
            visit(st.then, inner)
            if st.orelse is not None:
                visit(st.orelse, conds)
            return
        if isinstance(st, ir.Evaluate) and st.call.name.startswith("pt_wgmma") and conds:
            found.extend(conds)
        for child in ir.stmt_children(st):
            visit(child, conds)
    visit(body, [])
    return found


@pytest.mark.parametrize("make", [
    lambda: _sched(M=1000, N=1000, K=520, bm=128, bn=128, bk=64, stages=3),
    # 1568 output pixels: the last block tile holds 32 rows, two of its eight warps
    lambda: _conv(32, 7, 512, 512),
])
def test_no_warp_guard_around_wgmma(make):
    assert not _guarded_wgmma(pt.lower(make(), SM90A).body)


def _conv(N, H, C, K):
    from polytile.ops.gpu_schedules import igemm_wgmma
    s = pt.Schedule(ops.conv2d_igemm(N, H, H, C, K, 3, 3, 1, 1).func)
    igemm_wgmma(s, "O", "col", "Wt", ["r", "s"], bm=128, bn=64, bk=64, stages=4, inflight=1)
    return s


def test_conv_operand_offsets_follow_the_loops_past_the_channels():
    # 96 channels in 64-wide K tiles: the loop r_s_co fuses r, s and the two channel tiles, and kk
    # (the 16-wide K steps) runs 0..1 on the odd r_s_co (channels 64..95); the wgmma nest runs every
    # kk over the zero-filled tile. The offsets must be the loops' own (16·kk, 1024·kk), not isl's
    # arguments derived under that guard (-16·((4·r_s_co + 7·kk + 5) mod 8) + 80: negative offsets
    # at odd r_s_co and kk >= 2, an illegal address on the GPU; branch hang, test conv0)
    from polytile.lowering import loopir as ir
    from polytile.ops.gpu_schedules import igemm_wgmma

    s = pt.Schedule(ops.conv2d_igemm(2, 9, 9, 96, 72, 3, 3, 1, 1, dtype="float16").func)
    igemm_wgmma(s, "O", "col", "Wt", ["r", "s"], bm=64, bn=64, bk=64, stages=3, inflight=1)
    calls = [st.call for st in ir.walk_stmt(pt.lower(s, SM90A).body)
             if isinstance(st, ir.Evaluate) and st.call.name.startswith("pt_wgmma_m64")]
    assert len(calls) == 1
    a, b = calls[0].args[1], calls[0].args[2]
    assert (a.buffer.name, b.buffer.name) == ("col_shared", "Wt_shared")
    for r_s_co in range(18):
        for kk in range(4):
            for wi in range(4):
                at = {"r_s_co": r_s_co, "kk": kk, "wi": wi}
                assert ir.eval_int(a.index[0], at) == 4096 * (r_s_co % 3) + 16 * kk, at
                assert ir.eval_int(b.index[0], at) == 4096 * (r_s_co % 3) + 1024 * kk, at


def test_layout_check_evaluates_every_element():
    """The descriptor check evaluates the operand's index at every element of the tile (all at once):
    a 64×16 A tile stored as 8×8 core matrices passes with its strides; stored row-major it is refused
    at its first misplaced element, (1, 0); one element moved inside the tile is found too."""
    from polytile.dtypes import float16
    from polytile.lowering import loopir as ir
    from polytile.lowering.passes.wgmma import _check_layout

    r, c = ir.Var("r"), ir.Var("c")

    def load(index):
        return ir.Load(ir.Buffer("As", float16, (ir.const(1024),), "shared"), (index,))

    def at(e):
        return e if isinstance(e, ir.Expr) else ir.const(e)

    def add(*xs):
        out = at(xs[0])
        for x in xs[1:]:
            out = ir.BinOp("+", out, at(x))
        return out

    def mul(a, b):
        return ir.BinOp("*", at(a), at(b))

    def div(a, b):
        return ir.BinOp("//", at(a), at(b))

    def mod(a, b):
        return ir.BinOp("%", at(a), at(b))

    place = lambda rr, cc: {"r": rr, "c": cc}  # noqa: E731
    core = add(mul(add(mul(div(r, 8), 2), div(c, 8)), 64), mul(mod(r, 8), 8), mod(c, 8))
    assert _check_layout(load(core), place, 64, 16, [{}], "t") == (256, 128)
    with pytest.raises(LoweringError, match=r"element \(1, 0\) of the tile is at offset 16, the layout puts it at 8"):
        _check_layout(load(add(mul(r, 16), c)), place, 64, 16, [{}], "t")
    # swap elements (37, 11) and (37, 12): the first wrong one in a scan by rows is (37, 11)
    hit = lambda rr, cc: ir.Logic("&&", (ir.Cmp("==", r, ir.const(rr)), ir.Cmp("==", c, ir.const(cc))))  # noqa: E731
    moved = ir.Select(hit(37, 11), add(core, 1), ir.Select(hit(37, 12), add(core, -1), core))
    with pytest.raises(LoweringError, match=r"element \(37, 11\)"):
        _check_layout(load(moved), place, 64, 16, [{}], "t")


def test_array_evaluation_agrees_with_scalar_evaluation():
    """loopir.eval_int_array gives eval_int's value at every point (floor division and modulo of
    negative values, division by zero as 0, selects, comparisons, logic)."""
    import numpy as np

    from polytile.lowering import loopir as ir

    x, y = ir.Var("x"), ir.Var("y")
    exprs = [ir.BinOp("//", x, y), ir.BinOp("%", x, y), ir.BinOp("div", ir.BinOp("-", x, ir.const(7)), ir.const(3)),
             ir.BinOp("mod", x, ir.const(-4)), ir.BinOp("min", x, y), ir.BinOp("max", ir.BinOp("*", x, y), ir.const(5)),
             ir.Select(ir.Cmp("<", x, y), ir.BinOp("+", x, ir.const(100)), y),
             ir.Logic("||", (ir.Cmp(">=", x, ir.const(2)), ir.Cmp("!=", y, ir.const(0)))),
             ir.Logic("!", (ir.Cmp("==", x, y),))]
    xs, ys = np.meshgrid(np.arange(-9, 10), np.arange(-5, 6), indexing="ij")
    for e in exprs:
        got = ir.eval_int_array(e, {"x": xs, "y": ys})
        want = np.vectorize(lambda a, b, e=e: ir.eval_int(e, {"x": int(a), "y": int(b)}))(xs, ys)
        assert np.array_equal(np.broadcast_to(got, xs.shape), want), ir.expr_text(e)


def test_default_takes_tall_tiles_where_the_calibrated_model_ranks_them_first():
    """``gemm_choice`` ranks warpgroup-MMA tiles by the calibrated model (``wgmma_seconds``), 256×128
    tiles among them: 6000×600×3000 fp16 measured 54.9 µs in 256×128 tiles, 74.1 in the 128×128 the
    wave model picked (H200); 4096³ keeps 128×256 (its four waves are whole either way)."""
    from polytile.dtypes import float16
    from polytile.ops.gpu_schedules import gemm_choice
    tall = gemm_choice(SM90A, 6000, 600, 3000, float16, out_bytes=2)
    assert (tall.kernel, tall.params["bm"], tall.params["bn"]) == ("wgmma", 256, 128)
    assert tall.params.get("producer") == "tma"
    waves = gemm_choice(SM90A, 6000, 600, 3000, float16, out_bytes=2, calibrated=False)
    assert (waves.params["bm"], waves.params["bn"]) == (128, 128)
    square = gemm_choice(SM90A, 4096, 4096, 4096, float16, out_bytes=2)
    assert (square.params["bm"], square.params["bn"]) == (128, 256)
    # no tile taller than twice the rows: 100 rows never take 256-row tiles
    assert gemm_choice(SM90A, 100, 6000, 3000, float16).params["bm"] < 256


@pytest.mark.needs_nvcc
def test_tall_tiles_compile_without_spills():
    """256×128 tiles: four warpgroups of 64 accumulators a thread, 512 threads, TMA loads, no local memory."""
    from polytile.dtypes import float16
    from polytile.ops.gpu_schedules import gemm_choice
    from polytile.runtime.cuda import compile_cuda
    assert gemm_choice(SM90A, 1234, 2345, 777, float16).params["bm"] == 256
    src = ops.matmul(1234, 2345, 777, "float16").build(SM90A).source
    cubin, resources = compile_cuda(src, "sm_90a")
    text = _sass(cubin)
    assert "HGMMA.64x128x16" in text and "UTMALDG" in text
    assert not re.search(r"\bLDL\b|\bSTL\b", text)
    assert all(r.spill_stores == 0 for r in resources.values())
