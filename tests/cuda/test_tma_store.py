"""TMA stores of a GEMM's results (``Stage.tma_store``, ``gemm_wgmma(..., store="tma")``) without a
GPU: the golden loop IR of a small TMA-stored wgmma GEMM (the accumulators staged in shared memory
without bounds tests, a barrier with the async-proxy fence, one thread's bulk tensor store, its
commit and wait), the barrier a persistent block puts before its next tile's staging, the
refusals (the option's values, a target without TMA, rows of the result that are not 16-byte
multiples, a staging tile beyond the shared memory), the call path's store tensor map against a
fake driver, and nvcc's SASS for sm_90a (UTMASTG, no local memory).

Regenerate the golden file after a reviewed change with POLYTILE_REGEN_GOLDEN=1.
"""

import os
import re
from pathlib import Path

import pytest
from fake_gpu import FakeArray, fake_devices, fake_framework

import polytile as pt
from polytile import ops
from polytile.errors import LoweringError, ScheduleError
from polytile.lowering import loopir as ir
from polytile.lowering.passes import tma_store as tma_store_pass
from polytile.ops.gpu_schedules import align_operands, gemm_wgmma
from polytile.target import CUDATarget

GOLDEN = Path(__file__).parent / "golden"
SM90A = CUDATarget(arch="sm_90a")


def _sched(M, N, K, dtype="bfloat16", out_dtype=None, **cfg):
    s = pt.Schedule(ops.matmul(M, N, K, dtype, **({"out_dtype": out_dtype} if out_dtype else {})).func)
    gemm_wgmma(s, "C", "A", "B", store="tma", **{"producer": "tma", **cfg})
    return s


def _kernel(s, target=SM90A):
    (k,) = [st for st in ir.walk_stmt(pt.lower(s, target).body) if isinstance(st, ir.Kernel)]
    return k


def test_golden_tma_store_ir():
    s = _sched(300, 248, 200, out_dtype="bfloat16", bm=128, bn=64, bk=64, stages=3, inflight=1)
    text = ir.stmt_text(pt.lower(s, SM90A).body) + "\n"
    path = GOLDEN / "tma_store_gemm.txt"
    if os.environ.get("POLYTILE_REGEN_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("out_dtype,cfg,box", [
    ("bfloat16", dict(bm=128, bn=64, bk=64, stages=3), (128, 64)),
    (None, dict(bm=128, bn=128, bk=64, stages=4, inflight=1), (128, 128)),  # float32 results
    ("float16", dict(bm=64, bn=256, bk=64, stages=2), (64, 256)),
])
def test_the_write_back_stages_one_box(out_dtype, cfg, box):
    s = _sched(1000, 1000, 520, dtype="float16" if out_dtype == "float16" else "bfloat16", out_dtype=out_dtype,
               **cfg)
    k = _kernel(s)
    stores = [st for st in ir.walk_stmt(k.body) if isinstance(st, ir.Store)]
    assert not any(st.buffer.name == "C" for st in stores)  # every result goes through the staging tile
    (stage,) = [st.buffer for st in ir.walk_stmt(k.body) if isinstance(st, ir.Allocate) and st.buffer.name == "C_stage"]
    assert [ir.eval_int(d, {}) for d in stage.shape] == list(box)
    (call,) = [e for e in ir.all_exprs(k.body) if isinstance(e, ir.Call) and e.name == "pt_tma_store_2d"]
    *_, width, rows = call.args
    assert (ir.eval_int(rows, {}), ir.eval_int(width, {})) == box
    # the box at the block's tile: (column, row) = (bj · bn, bi · bm)
    x, y = call.args[2:4]
    assert ir.eval_int(x, {"bi": 3, "bj": 2}) == 2 * box[1] and ir.eval_int(y, {"bi": 3, "bj": 2}) == 3 * box[0]
    src = pt.build(s, SM90A).source
    assert "pt_tma_store_2d(&pt_tmap_C_" in src and "cp.async.bulk.commit_group" in src
    assert "cp.async.bulk.wait_group.read 0" in src


def test_the_staging_stores_need_no_barriers_between_them():
    # whole tiles (no warp guard around the write-back): the barrier pass once put a __syncthreads
    # after every store into the staging tile (write after write), 162 barriers a tile, 0.61× torch
    # at 4096³ (H200); each element is written by one thread (the proof), so only the copy waits
    k = _kernel(_sched(512, 512, 256, out_dtype="bfloat16", bm=128, bn=256, bk=64, stages=3, inflight=1))
    text = ir.stmt_text(k.body)
    staging = text[text.index("allocate C_stage"):text.index("pt_tma_store_2d(")]
    assert staging.count("__syncthreads()") == 1  # the one before the copy


def test_a_static_staging_tile_is_aligned_for_the_copy():
    # one K tile and 64 × 64 tiles: 32 KiB of shared memory, declared statically; the bulk copy reads
    # its shared operand at a 128-byte aligned address (16 would be the default alignment)
    src = pt.build(_sched(129, 264, 64, dtype="float16", bm=64, bn=64, bk=64, stages=2), SM90A).source
    assert "__shared__ __align__(128) float C_stage[(64) * (64)];" in src


def test_a_barrier_and_a_fence_precede_the_store_and_the_next_tile():
    s = _sched(1000, 1000, 520, out_dtype="bfloat16", bm=128, bn=128, bk=64, stages=3, inflight=1, persistent=True)
    k = _kernel(s)
    (tiles,) = [st for st in ir.walk_stmt(k.body) if isinstance(st, ir.For) and st.kind == "persistent"]
    text = ir.stmt_text(tiles.body)
    store = text.index("pt_tma_store_2d(")
    before = text[:store]
    assert before.rstrip().rsplit("\n", 3)[-3:][0].strip() == "pt_fence_proxy_async()"
    assert before.rstrip().rsplit("\n", 2)[-2].strip() == "__syncthreads()"
    after = text[store:]
    # the issuing thread waits until the tile is read; the tile loop's last statement is a barrier, so
    # that no thread stages the next tile's results before then
    assert after.index("pt_bulk_commit()") < after.index("pt_bulk_wait_read()")
    assert text.rstrip().endswith("__syncthreads()")


def test_tma_store_refusals():
    with pytest.raises(ScheduleError,
                       match="store must be one of 'threads', 'tma', 'staged', 'staged overlaid', got 'bulk'"):
        gemm_wgmma(pt.Schedule(ops.matmul(256, 256, 128, "float16").func), "C", "A", "B", store="bulk")
    s = pt.Schedule(ops.matmul(64, 64, 64, "float32").func)
    with pytest.raises(ScheduleError, match="tma_store of C: .*bind a loop to blockIdx.x first"):
        s["C"].tma_store()
    # rows of 250 bf16 results: 500 bytes, not whole 16-byte units
    with pytest.raises(LoweringError, match="TMA store of C .* rows of C are 500 bytes long"):
        pt.lower(_sched(300, 250, 200, out_dtype="bfloat16", bm=128, bn=64, bk=64, stages=2, producer="threads"), SM90A)
    # a 128 × 256 float32 tile (128 KiB) beside 4 stages of operand tiles (192 KiB)
    with pytest.raises(LoweringError, match="staging tile \\(131072 bytes\\) .* leave tma_store off"):
        pt.lower(_sched(1024, 1024, 1024, bm=128, bn=256, bk=64, stages=4, inflight=1), SM90A)
    s = pt.Schedule(ops.matmul(256, 256, 128, "float32").func)
    st = s["C"]
    st.split("i", 16, "bi", "ii").split("j", 32, "bj", "jj").reorder("bi", "bj", "ii", "jj")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("ii", "threadIdx.y").bind("jj", "threadIdx.x")
    st.tma_store()
    with pytest.raises(LoweringError, match="tma_store of C: the target .* has no TMA"):
        pt.lower(s, CUDATarget(arch="sm_80"))


def test_a_box_of_more_than_256_rows_is_refused():
    with pytest.raises(LoweringError, match="a box of 320 × 64 elements; a TMA box has at most 256"):
        pt.lower(_sched(1000, 1000, 200, out_dtype="bfloat16", bm=320, bn=64, bk=64, stages=2, producer="threads"),
                 SM90A)


def test_an_element_written_twice_is_refused(monkeypatch):
    # the proof enumerates the threads' stores: a write-back whose columns 4c + 1 go to 4c (a
    # deliberately broken index; the box stays the same) writes some elements twice and others never
    real = tma_store_pass._the_write

    def collapsed(root, name, where):
        found = real(root, name, where)
        i, j = found.store.index
        m = ir.BinOp("mod", j, ir.const(4))
        one = ir.BinOp("-", ir.BinOp("min", m, ir.const(1)), ir.BinOp("min", ir.BinOp("div", m, ir.const(2)),
                                                                        ir.const(1)))
        bad = ir.Store(found.store.buffer, (i, ir.BinOp("-", j, one)), found.store.value)
        return tma_store_pass._Store(bad, found.scopes)
    monkeypatch.setattr(tma_store_pass, "_the_write", collapsed)
    with pytest.raises(LoweringError, match="is written 2 times by the block's threads"):
        pt.lower(_sched(256, 256, 128, out_dtype="bfloat16", bm=128, bn=64, bk=64, stages=2), SM90A)


@pytest.mark.needs_nvcc
def test_store_tensor_map_is_unswizzled_float32(monkeypatch, rng):
    fake_framework(monkeypatch)
    kern = pt.build(_sched(300, 264, 200, dtype="float16", bm=128, bn=128, bk=64, stages=3), SM90A)
    driver = fake_devices(monkeypatch)
    (k,) = kern.kernels
    assert [(m.buffer.name, m.rows, m.width, m.swizzle) for m in k.tensor_maps] == [
        ("A", 128, 64, 128), ("B", 64, 64, 128), ("C", 128, 128, 0)]
    driver.kinds[k.name] = ["pointer"] * len(k.args) + ["int32"] * len(k.params) + ["tensormap"] * 3
    a = FakeArray(rng.standard_normal((300, 200)).astype("float16"))
    b = FakeArray(rng.standard_normal((200, 264)).astype("float16"))
    out = FakeArray(rng.standard_normal((300, 264)).astype("float32"))
    kern(a, b, out)
    (c_map,) = [m for m in driver.tensor_maps if m[2] == out.data.ctypes.data]
    # float32 (7), 264 columns × 300 rows of 1056 bytes, boxes of 128 × 128, no swizzle (0)
    assert c_map[:8] == (7, 2, out.data.ctypes.data, 264, 300, 1056, 128, 128) and c_map[11] == 0


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("dtype,out_dtype,cfg", [
    ("bfloat16", "bfloat16", dict(bm=128, bn=256, bk=64, stages=3, inflight=1)),
    ("float16", None, dict(bm=128, bn=128, bk=64, stages=4, inflight=1, persistent=True, group=8)),
    ("bfloat16", None, dict(bm=128, bn=128, bk=64, stages=3, inflight=1, producer="threads")),
])
def test_tma_store_compiles_to_utmastg(dtype, out_dtype, cfg):
    from test_wgmma import _sass

    from polytile.runtime.cuda import compile_cuda
    s = pt.Schedule(ops.matmul(4000, 3000, 1000, dtype, **({"out_dtype": out_dtype} if out_dtype else {})).func)
    align_operands(s, "C", ("A", "B"), granule=16 if cfg.get("producer", "tma") == "tma" else 4)
    gemm_wgmma(s, "C", "A", "B", store="tma", **{"producer": "tma", **cfg})
    kern = pt.build(s, SM90A)
    cubin, resources = compile_cuda(kern.source, "sm_90a")
    text = _sass(cubin)
    assert "UTMASTG.2D" in text and "UTMACMDFLUSH" in text and "HGMMA.64x" in text
    if cfg.get("producer", "tma") == "tma":  # (the threads' copies wait at a barrier each K tile)
        assert text.count("BAR.SYNC") <= 3  # after the barriers' initialization, before the copy (and a tile's end)
    assert ("UTMALDG.2D" in text) == (cfg.get("producer", "tma") == "tma")
    assert not re.search(r"\bLDL\b|\bSTL\b", text)
    assert all(r.stack_bytes == 0 and r.spill_stores == 0 for r in resources.values())


def test_the_wgmma_tuning_space_offers_tma_stores():
    from polytile.tune import make_task
    task = make_task("matmul", SM90A, M=4096, N=4096, K=4096, dtype="bfloat16")
    knob = next(k for k in task.space.decisions if k.name == "store")
    assert knob.choices == ("threads", "tma", "staged", "staged overlaid")  # the default first
    cfg = dict(bm=128, bn=128, bk=64, stages=4, inflight=1, split=1, producer="tma", group=0)
    k = _kernel(task.schedule(dict(cfg, store="tma")))
    assert any(isinstance(e, ir.Call) and e.name == "pt_tma_store_2d" for e in ir.all_exprs(k.body))
    # the model counts the staging tile's shared memory: 128 × 256 float32 (128 KiB) beside 4 stages
    # of 48 KiB does not fit a block
    wide = dict(cfg, bn=256)
    fits, too_big = task.predict([dict(wide, store="threads"), dict(wide, store="tma")])
    assert fits < float("inf") and too_big == float("inf")


@pytest.mark.needs_nvcc
def test_batched_tma_store_compiles_to_3d_stores():
    from test_wgmma import _sass

    from polytile.runtime.cuda import compile_cuda
    s = pt.Schedule(ops.batch_matmul(3, 200, 136, 200, "bfloat16").func)
    align_operands(s, "C", ("A", "B"), granule=16)
    gemm_wgmma(s, "C", "A", "B", batch="bb", bm=64, bn=64, bk=64, stages=3, inflight=1, producer="tma", store="tma",
               persistent=True, group=2)
    kern = pt.build(s, SM90A)
    # the box at (column, row, batch) of the block's tile
    assert re.search(r"pt_tma_store_3d\(&pt_tmap_C_64x64_store, &C_stage\[0\], \(\(int32_t\)\(64 \* bj\)\), "
                     r"\(\(int32_t\)\(64 \* bi\)\), \(\(int32_t\)bb\)\);", kern.source)
    cubin, resources = compile_cuda(kern.source, "sm_90a")
    text = _sass(cubin)
    assert "UTMASTG.3D" in text and "UTMALDG.3D" in text
    assert not re.search(r"\bLDL\b|\bSTL\b", text)


def added_with_tma_store(M, N):  # noqa: ANN001, ANN201 - sizes (or parameters); a Schedule
    """C = A + B in 16 × 32 blocks of float32, a thread per element, written by TMA stores (the GPU test's too)."""
    A = pt.placeholder((M, N), "float32", "A")
    B = pt.placeholder((M, N), "float32", "B")
    C = pt.compute((M, N), lambda i, j: A[i, j] + B[i, j], "C")
    s = pt.create_schedule(pt.Func([A, B], [C]))
    st = s[C]
    st.split("i", 16, "bi", "ii").split("j", 32, "bj", "jj").reorder("bi", "bj", "ii", "jj")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("ii", "threadIdx.y").bind("jj", "threadIdx.x")
    st.tma_store()
    return s


def test_any_block_tile_is_staged():
    # an elementwise sum, a thread per element: 16 × 32 float32 boxes (128-byte rows), partial at the end
    k = _kernel(added_with_tma_store(100, 300))
    (call,) = [e for e in ir.all_exprs(k.body) if isinstance(e, ir.Call) and e.name == "pt_tma_store_2d"]
    assert [ir.eval_int(a, {}) for a in call.args[-2:]] == [32, 16]
    assert not any(isinstance(st, ir.Store) and st.buffer.name == "C" for st in ir.walk_stmt(k.body))


def test_parametric_sizes_are_refused():
    with pytest.raises(LoweringError, match="C's shape depends on M; the proof of the staged box needs constant sizes"):
        pt.lower(added_with_tma_store(pt.param("M"), 256), SM90A)


def test_a_tuned_tma_store_applies_at_sizes_it_cannot_store():
    # a winner with store="tma" is checked at sizes that divide no tile (primes: rows of 761 float16
    # results, 1522 bytes): applied there it stores from the threads, as producer="tma" loads with
    # the threads' copies where TMA cannot; the space itself still refuses it at such sizes
    from polytile.tune import make_task
    from polytile.tune.measure import odd_workload
    from polytile.tune.task import Task
    task = make_task("matmul", SM90A, M=512, N=768, K=3072, dtype="float16")
    assert task.template.name == "matmul_wgmma"
    values = dict(bm=64, bn=64, bk=128, stages=6, inflight=1, group=0, producer="threads", persistent=True,
                  store="tma", split=1, tail=False)
    assert "pt_tma_store_2d" in _source(task.schedule(values))
    odd = Task(task.template, odd_workload(task), task.target)
    assert dict(odd.workload.shape)["N"] % 8
    assert "pt_tma_store_2d" not in _source(odd.schedule(values))
    why = odd.space.reason_invalid(odd.space.from_values(values).digits)
    assert why and "TMA stores write an unsplit product's results in rows of whole 16 bytes" in why


def _source(s):
    kernels = [st for st in ir.walk_stmt(pt.lower(s, SM90A).body) if isinstance(st, ir.Kernel)]
    return " ".join(e.name for k in kernels for e in ir.all_exprs(k.body) if isinstance(e, ir.Call))
