"""Persistent blocks (``Stage.persistent``, ``gemm_wgmma(..., persistent=True)``) without a GPU: the
golden loop IR of a small persistent TMA GEMM, the block tiles each persistent block computes (every
tile once, in the order the grouped grid would launch them), the mbarrier protocol across tiles run
block by block in lock step (``ring_emulator``: a ring whose phases restart at each tile deadlocks
there), the refusals, and nvcc's SASS for sm_90a.

Regenerate the golden file after a reviewed change with POLYTILE_REGEN_GOLDEN=1.
"""

import os
import re
from pathlib import Path

import pytest
from ring_emulator import ProtocolError, run_grid

import polytile as pt
from polytile import ops
from polytile.errors import LoweringError, ScheduleError
from polytile.lowering import loopir as ir
from polytile.lowering.passes import pipeline as pipeline_pass
from polytile.lowering.passes.kernels import grouped_blocks
from polytile.ops.gpu_schedules import align_operands, gemm_wgmma
from polytile.target import CUDATarget

GOLDEN = Path(__file__).parent / "golden"
SM90A = CUDATarget(arch="sm_90a")


def _sched(M, N, K, dtype="float16", batch=None, **cfg):
    func = ops.matmul(M, N, K, dtype).func if batch is None else ops.batch_matmul(batch, M, N, K, dtype).func
    s = pt.Schedule(func)
    gemm_wgmma(s, "C", "A", "B", **({"batch": "bb"} if batch else {}), **cfg)
    return s


def _kernel(s, target=SM90A):
    (k,) = [st for st in ir.walk_stmt(pt.lower(s, target).body) if isinstance(st, ir.Kernel)]
    return k


def test_golden_persistent_tma_ir():
    # 5 × 3 tiles of 64 × 64 on 4 multiprocessors: blocks run 4 or 3 tiles; 5 K tiles, 3 stages
    s = _sched(300, 184, 304, bm=64, bn=64, bk=64, stages=3, inflight=1, producer="tma", persistent=True)
    text = ir.stmt_text(pt.lower(s, CUDATarget(arch="sm_90a", sms=4)).body) + "\n"
    path = GOLDEN / "persistent_tma_gemm.txt"
    if os.environ.get("POLYTILE_REGEN_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("M,N,sms,group", [(300, 184, 4, 1), (300, 184, 4, 2), (700, 328, 7, 4), (129, 264, 132, 1),
                                           (64, 72, 132, 1), (1000, 1000, 16, 3)])
def test_every_tile_once_in_the_grids_order(M, N, sms, group):
    target = CUDATarget(arch="sm_90a", sms=sms)
    k = _kernel(_sched(M, N, 128, bm=64, bn=64, bk=64, stages=3, producer="tma", group=group, persistent=True),
                target)
    rows, cols = -(-M // 64), -(-N // 64)
    tiles = rows * cols
    assert [ir.eval_int(g, {}) for g in k.grid] == [min(tiles, sms), 1, 1]
    trace = run_grid(k)
    assert sorted(trace.tiles) == [(i, j) for i in range(rows) for j in range(cols)]
    # block b runs tiles b, b + grid, …: the order in which a grouped (or row-by-row) grid launches them
    grid = min(tiles, sms)
    order = [grouped_blocks(ir.const(rows), ir.const(cols), group, ir.const(t)) for t in range(tiles)]
    want = [tuple(ir.eval_int(e, {}) for e in order[t]) for b in range(grid) for t in range(b, tiles, grid)]
    assert trace.tiles == want


@pytest.mark.parametrize("stages,inflight", [(2, 0), (3, 1), (4, 1), (4, 2), (5, 0), (6, 2)])
@pytest.mark.parametrize("K", [128, 320, 520])
def test_rings_run_across_tiles_without_a_deadlock(stages, inflight, K):
    # 5 × 4 tiles on 3 multiprocessors: 7, 7 and 6 tiles a block; 2, 5 or 9 K tiles, not multiples of
    # twice the stages, so that phases restarted at each tile would be waited for with the wrong parity
    s = _sched(300, 248, K, dtype="bfloat16", bm=64, bn=64, bk=64, stages=stages, inflight=inflight,
               producer="tma", persistent=True)
    trace = run_grid(_kernel(s, CUDATarget(arch="sm_90a", sms=3)))
    assert sorted(trace.tiles) == [(i, j) for i in range(5) for j in range(4)]
    nk = -(-K // 64)
    full_waits = 20 * nk * 4  # each warp waits for each K tile of each block tile
    assert trace.waits >= full_waits


def test_the_emulator_runs_the_one_tile_kernel_too():
    s = _sched(300, 248, 520, bm=64, bn=64, bk=64, stages=4, inflight=1, producer="tma")
    k = _kernel(s)
    assert k.grid[1] is not None
    # one block tile per block along (x, y): emulate the grid of a grouped launch instead
    s = _sched(300, 248, 520, bm=64, bn=64, bk=64, stages=4, inflight=1, producer="tma", group=2)
    trace = run_grid(_kernel(s))
    assert sorted(trace.tiles) == [(i, j) for i in range(5) for j in range(4)]


def test_phases_restarted_at_each_tile_deadlock(monkeypatch):
    # the classic bug: each tile counts its ring's uses from zero (slots and parities as in a kernel
    # of one tile) while the barriers' phases run on; the emulator must catch it
    monkeypatch.setattr(pipeline_pass.TmaRing, "uses_before", lambda self, loop: ir.const(0))
    s = _sched(300, 248, 320, bm=64, bn=64, bk=64, stages=3, inflight=1, producer="tma", persistent=True)
    with pytest.raises(ProtocolError, match="deadlock"):
        run_grid(_kernel(s, CUDATarget(arch="sm_90a", sms=3)))


def test_slots_in_flight_are_released_at_the_tile_end(monkeypatch):
    # without the releases after the loop, the next tile's prologue waits for slots nobody frees
    real = pipeline_pass._Piped.tma_stmt

    def no_tail_release(self, ring):
        out = real(self, ring)
        return ir.map_stmts(out, lambda st: ir.block([]) if isinstance(st, ir.If) and isinstance(st.cond, ir.Cmp)
                            and st.cond.op == ">=" and "pt_mbar_arrive" in ir.stmt_text(st)
                            and "ko" not in ir.expr_text(st.cond) else None)
    monkeypatch.setattr(pipeline_pass._Piped, "tma_stmt", no_tail_release)
    s = _sched(300, 248, 320, bm=64, bn=64, bk=64, stages=3, inflight=1, producer="tma", persistent=True)
    with pytest.raises(ProtocolError, match="deadlock"):
        run_grid(_kernel(s, CUDATarget(arch="sm_90a", sms=3)))


def test_the_next_tile_is_loaded_during_the_last_iterations():
    s = _sched(300, 248, 320, bm=64, bn=64, bk=64, stages=4, inflight=1, producer="tma", persistent=True)
    k = _kernel(s, CUDATarget(arch="sm_90a", sms=3))
    text = ir.stmt_text(k.body)
    # the prologue runs in the block's first tile only; the K loop's copies past its end load the next
    # tile's first K tiles (2 = 4 stages - 1 - 1 in flight) where the block has one
    assert "if (pt_tile_k == 0):" in text
    assert "if ((pt_tile_k + 1) < (((-1 * int64(blockIdx.x)) + 22) div 3)):" in text
    assert "int32(((64 * ko) - 192))" in text  # K tile ko + 2 − 5 of the next tile


def test_a_prefetch_of_the_wrong_tile_is_caught(monkeypatch):
    # the next tile's copies made with this tile's coordinates: the products of the next tile read
    # slots holding this tile's K tiles
    real = pipeline_pass._TileCount.of

    def this_tile(loop, depth):
        count = real(loop, depth)
        lets = {}
        st = loop.body
        while isinstance(st, ir.LetStmt):
            lets[st.var.name] = st.var
            st = st.body
        return pipeline_pass._TileCount(count.step, count.defined, lets, count.trips, count.depth)
    monkeypatch.setattr(pipeline_pass._TileCount, "of", staticmethod(this_tile))
    s = _sched(300, 248, 320, bm=64, bn=64, bk=64, stages=4, inflight=1, producer="tma", persistent=True)
    with pytest.raises(ProtocolError, match="multiplies slot"):
        run_grid(_kernel(s, CUDATarget(arch="sm_90a", sms=3)))


def test_batched_persistent_tiles_run_every_batch():
    s = _sched(200, 136, 64, dtype="bfloat16", batch=3, bm=64, bn=64, bk=64, stages=2, producer="tma", group=2,
               persistent=True)
    k = _kernel(s, CUDATarget(arch="sm_90a", sms=5))
    assert [ir.eval_int(g, {}) for g in k.grid] == [5, 1, 1]
    lets = {st.var.name: st.value for st in ir.walk_stmt(k.body) if isinstance(st, ir.LetStmt)
            and st.var.name in ("pt_tile", "bb", "bi", "bj")}
    seen = []
    for x in range(5):
        for step in range(-(-36 // 5)):
            env = {"blockIdx.x": x, "pt_tile_k": step}
            env["pt_tile"] = ir.eval_int(lets["pt_tile"], env)
            if env["pt_tile"] < 36:
                seen.append(tuple(ir.eval_int(lets[n], env) for n in ("bb", "bi", "bj")))
    assert sorted(seen) == [(b, i, j) for b in range(3) for i in range(4) for j in range(3)]


def test_threads_copies_wait_for_every_warp_before_refilling():
    s = _sched(300, 248, 320, bm=64, bn=64, bk=64, stages=3, producer="threads", persistent=True)
    k = _kernel(s, CUDATarget(arch="sm_90a", sms=3))
    (tiles,) = [st for st in ir.walk_stmt(k.body) if isinstance(st, ir.For) and st.kind == "persistent"]
    text = ir.stmt_text(tiles)
    # a barrier before the first cp.async of the tile's prologue: the last tile's slots are read
    assert text.index("__syncthreads()") < text.index("pt_cp_async")


def test_blocks_per_sm_multiply_the_grid():
    s = _sched(2000, 2000, 128, bm=64, bn=64, bk=64, stages=3, producer="tma", persistent=2)
    k = _kernel(s, CUDATarget(arch="sm_90a", sms=5))
    assert [ir.eval_int(g, {}) for g in k.grid] == [10, 1, 1]
    assert sorted(run_grid(k).tiles) == [(i, j) for i in range(32) for j in range(32)]


def test_persistent_refusals():
    with pytest.raises(ScheduleError, match="persistent=True with specialize=True"):
        _sched(256, 256, 128, producer="tma", specialize=True, persistent=True)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ScheduleError, match="blocks_per_sm must be a positive integer"):
            pt.Schedule(ops.matmul(256, 256, 128, "float16").func)["C"].bind("i", "blockIdx.x").persistent(bad)
    s = pt.Schedule(ops.matmul(64, 64, 64, "float32").func)
    with pytest.raises(ScheduleError, match="persistent of C: .* bind a loop to blockIdx.x first"):
        s["C"].persistent()
    # the primitives apart: a specialized ring in a persistent kernel is refused at lowering
    s = _sched(256, 256, 128, bm=128, bn=128, bk=64, stages=3, producer="tma", specialize=True)
    s["C"].persistent()
    with pytest.raises(LoweringError, match="specialize=True in a persistent kernel"):
        pt.lower(s, SM90A)


def test_the_schedule_is_unchanged_by_default():
    s = _sched(300, 184, 304, bm=64, bn=64, bk=64, stages=3, inflight=1, producer="tma")
    assert not any(isinstance(st, ir.For) and st.kind == "persistent" for st in ir.walk_stmt(_kernel(s).body))
    assert "persistent" not in pt.build(s, SM90A).source


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("dtype,cfg", [
    ("bfloat16", dict(bm=128, bn=256, bk=64, stages=4, inflight=1, producer="tma", group=8)),
    ("float16", dict(bm=128, bn=128, bk=64, stages=5, inflight=0, producer="tma")),
    ("float16", dict(bm=128, bn=128, bk=64, stages=3, inflight=1, producer="threads")),
])
def test_persistent_gemm_compiles_without_local_memory(dtype, cfg):
    from test_wgmma import _sass

    from polytile.runtime.cuda import compile_cuda
    s = pt.Schedule(ops.matmul(4000, 3000, 1000, dtype).func)
    align_operands(s, "C", ("A", "B"), granule=16 if cfg["producer"] == "tma" else 4)
    gemm_wgmma(s, "C", "A", "B", persistent=True, **cfg)
    kern = pt.build(s, SM90A)
    (k,) = kern.kernels
    assert [ir.eval_int(ir.const(g) if isinstance(g, int) else g, {}) for g in k.grid] == [SM90A.sms, 1, 1]
    assert re.search(r"for \(int pt_tile_k = 0; pt_tile_k < .*\) / 132\); \+\+pt_tile_k\)", kern.source)
    cubin, resources = compile_cuda(kern.source, "sm_90a")
    text = _sass(cubin)
    assert "HGMMA.64x" in text
    assert ("UTMALDG.2D" in text) == (cfg["producer"] == "tma")
    assert not re.search(r"\bLDL\b|\bSTL\b", text)
    assert all(r.stack_bytes == 0 and r.spill_stores == 0 for r in resources.values())


def test_the_wgmma_tuning_space_offers_persistent_blocks():
    from polytile.tune import make_task
    task = make_task("matmul", SM90A, M=2048, N=28672, K=4096, dtype="bfloat16")
    knob = next(k for k in task.space.decisions if k.name == "persistent")
    assert knob.choices == (False, True)  # the default first
    big = dict(bm=128, bn=256, bk=64, stages=4, inflight=1, split=1, producer="tma", group=0)
    small = dict(big, bm=64, bn=64, stages=3)
    # the template launches as many persistent blocks per SM as fit (one per SM measured 0.92× → 0.74×
    # on an H200 where two fit): the model predicts them as the blocks of the usual grid
    same, persistent, old_record = task.predict([dict(big, persistent=False), dict(big, persistent=True), big])
    assert same == persistent == old_record
    shared, alone = task.predict([dict(small, persistent=False), dict(small, persistent=True)])
    assert alone == shared
    k = _kernel(task.schedule(dict(big, persistent=True)))
    assert [ir.eval_int(g, {}) for g in k.grid] == [SM90A.sms, 1, 1]  # 128 × 256 tiles: one block per SM
    k = _kernel(task.schedule(dict(small, persistent=True)))
    assert [ir.eval_int(g, {}) for g in k.grid] == [4 * SM90A.sms, 1, 1]  # 64 × 64, 3 stages: four fit
    # the model's own term: persistent blocks are at most as many per SM as launched
    from polytile.tune.analytical import GemmShape, WgmmaConfig, predict
    shape = GemmShape(2048, 2048, 2048)
    one, four = (predict(shape, WgmmaConfig(64, 64, 64, 3, 1, persistent=n), SM90A) for n in (1, 4))
    assert one > four == predict(shape, WgmmaConfig(64, 64, 64, 3, 1), SM90A)
    assert any(isinstance(st, ir.For) and st.kind == "persistent" for st in ir.walk_stmt(k.body))
    with pytest.raises(Exception, match="persistent blocks loop over the tiles of one product"):
        task.schedule(dict(big, persistent=True, split=2))
