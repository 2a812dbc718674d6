"""Grouped block order (``Stage.raster``) without a GPU: the grouped grid is a bijection onto the
blocks (partial last groups, batches along blockIdx.z), the refusals, the default GEMM's group read
from the target's L2 and the tile footprint, the model's DRAM traffic by block order, and nvcc's
SASS of a grouped TMA GEMM."""

import re

import pytest

import polytile as pt
from polytile import ops
from polytile.dtypes import as_dtype
from polytile.errors import LoweringError, ScheduleError
from polytile.lowering import loopir as ir
from polytile.lowering.passes.kernels import grouped_blocks
from polytile.ops.gpu_schedules import gemm_choice, gemm_wgmma
from polytile.target import CUDATarget
from polytile.tune.analytical import operand_traffic, raster_group

SM90A = CUDATarget(arch="sm_90a")


@pytest.mark.parametrize("rows,cols,group", [(16, 112, 16), (16, 112, 7), (5, 3, 2), (7, 4, 3), (1, 9, 8),
                                             (9, 1, 4), (13, 11, 1), (4, 4, 9)])
def test_grouped_order_is_a_bijection_down_each_group(rows, cols, group):
    pid = ir.Var("pid")
    r, c = grouped_blocks(ir.const(rows), ir.const(cols), group, pid)
    seen = [(ir.eval_int(r, {"pid": p}), ir.eval_int(c, {"pid": p})) for p in range(rows * cols)]
    assert sorted(seen) == [(i, j) for i in range(rows) for j in range(cols)]
    # consecutive blocks go down a group's rows, then to the next column of the group
    first = min(group, rows)
    assert seen[:first] == [(i, 0) for i in range(first)]
    if cols > 1:
        assert seen[first] == (0, 1)


def _kernel(s):
    (k,) = [st for st in ir.walk_stmt(pt.lower(s, SM90A).body) if isinstance(st, ir.Kernel)]
    return k


def _block_of(k, names):
    """The values of the block loops' lets at each blockIdx.x, blockIdx.z of the grid."""
    lets = {st.var.name: st.value for st in ir.walk_stmt(k.body) if isinstance(st, ir.LetStmt)
            and st.var.name in names}
    gx, gy, gz = (ir.eval_int(g, {}) for g in k.grid)
    assert gy == 1
    return [tuple(ir.eval_int(lets[n], {"blockIdx.x": x, "blockIdx.z": z}) for n in names)
            for z in range(gz) for x in range(gx)]


@pytest.mark.parametrize("producer", ["tma", "threads"])
def test_raster_runs_every_block_once_in_a_one_dimensional_grid(producer):
    # 700 rows in 64-row tiles: 11 rows of blocks in groups of 4 (the last group 3 rows), 5 columns
    s = pt.Schedule(ops.matmul(700, 304, 200, "float16").func)
    gemm_wgmma(s, "C", "A", "B", bm=64, bn=64, bk=64, stages=3, producer=producer, group=4)
    k = _kernel(s)
    assert [ir.eval_int(g, {}) for g in k.grid] == [55, 1, 1]
    assert sorted(_block_of(k, ("bi", "bj"))) == [(i, j) for i in range(11) for j in range(5)]


def test_raster_keeps_the_batch_along_z():
    s = pt.Schedule(ops.batch_matmul(3, 200, 130, 64, "bfloat16").func)
    gemm_wgmma(s, "C", "A", "B", bm=64, bn=64, bk=64, stages=2, batch="bb", group=2)
    k = _kernel(s)
    assert [ir.eval_int(g, {}) for g in k.grid] == [12, 1, 3]
    assert sorted(_block_of(k, ("bb", "bi", "bj"))) == [(b, i, j) for b in range(3) for i in range(4)
                                                        for j in range(3)]


def test_raster_of_one_column_of_blocks_leaves_the_order():
    # ViT's 12 heads of 197×64 (K = 197): one 64-wide column of blocks, its loop of one iteration gone;
    # the tuning space's group 8 failed to lower (TLM's held-out run, 2026-11-28: 51 of xgb's 200 trials)
    s = pt.Schedule(ops.batch_matmul(12, 197, 64, 197, "float16").func)
    gemm_wgmma(s, "C", "A", "B", bm=64, bn=64, bk=64, stages=2, batch="bb", group=8)
    k = _kernel(s)
    assert [ir.eval_int(g, {}) for g in k.grid] == [1, 4, 12]
    (bi,) = [st.value for st in ir.walk_stmt(k.body) if isinstance(st, ir.LetStmt) and st.var.name == "bi"]
    assert [ir.eval_int(bi, {"blockIdx.y": y}) for y in range(4)] == [0, 1, 2, 3]


def test_raster_refusals():
    s = pt.Schedule(ops.matmul(256, 256, 128, "float16").func)
    with pytest.raises(ScheduleError, match="bind a loop to blockIdx.y and blockIdx.x first"):
        s["C"].raster(8)
    gemm_wgmma(s, "C", "A", "B", bm=64, bn=64, bk=64, stages=2)
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ScheduleError, match="group must be a positive integer"):
            s["C"].raster(bad)
    # the rows' loop must enclose the columns' loop
    s = pt.Schedule(ops.matmul(256, 256, 128, "float32").func)
    st = s["C"]
    st.split("i", 16, "bi", "ii").split("j", 16, "bj", "jj").reorder("bj", "bi", "ii", "jj")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("ii", "threadIdx.y").bind("jj", "threadIdx.x")
    st.raster(2)
    with pytest.raises(LoweringError, match="needs a loop inside it bound to blockIdx.x"):
        pt.lower(s, SM90A)


def test_raster_orders_any_nest_bound_to_the_grid():
    # a CUDA-core schedule of its own: 7 rows of 16 in groups of 3 (the last group one row)
    s = pt.Schedule(ops.matmul(100, 90, 30, "float32").func)
    st = s["C"]
    st.split("i", 16, "bi", "ii").split("j", 32, "bj", "jj").reorder("bi", "bj", "ii", "jj")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("ii", "threadIdx.y").bind("jj", "threadIdx.x")
    st.raster(3)
    k = _kernel(s)
    assert sorted(_block_of(k, ("bi", "bj"))) == [(i, j) for i in range(7) for j in range(3)]


# --- the default's group and the model ------------------------------------------------------------

def test_wide_products_launch_their_blocks_in_groups_sized_to_the_l2():
    bf16 = as_dtype("bfloat16")
    # LLaMA's MLP: B (4096×28672 bf16, 235 MB) does not fit in L2; A's 128-row panels are 1 MiB,
    # all 16 fit in half the 50 MB L2: down the columns
    wide = gemm_choice(SM90A, 2048, 28672, 4096, bf16)
    assert wide.params["group"] == 16 and wide.params["producer"] == "tma"
    # a GPU with a quarter of that L2 holds 6 panels of A in half of it
    small_l2 = CUDATarget(arch="sm_90a", l2_bytes=12 * 1024 * 1024)
    assert gemm_choice(small_l2, 2048, 28672, 4096, bf16).params["group"] == 6
    # B fits in half the L2: row by row, as before
    assert "group" not in gemm_choice(SM90A, 4096, 6144, 2048, bf16).params
    assert "group" not in gemm_choice(SM90A, 4096, 4096, 1024, as_dtype("float16")).params


def test_the_model_counts_the_rereads_of_b_row_by_row():
    l2 = SM90A.l2_bytes
    compulsory = (2048 + 28672) * 4096 * 2
    rows = operand_traffic(2048, 28672, 4096, 2, 128, 256, 1, l2)
    grouped = operand_traffic(2048, 28672, 4096, 2, 128, 256, raster_group(2048, 28672, 4096, 2, 128, l2), l2)
    assert grouped == compulsory
    assert rows == 2048 * 4096 * 2 + 16 * 28672 * 4096 * 2  # B once per row of blocks: 3.8 GB
    # operands that fit in half the L2 are read once in any order
    assert operand_traffic(1024, 1024, 1024, 2, 128, 128, 1, l2) == 2 * 1024 * 1024 * 2


def test_one_k_tile_holds_two_stages():
    bf16 = as_dtype("bfloat16")
    one = gemm_choice(SM90A, 1024, 1024, 64, bf16, batch=12).params  # one K tile: nothing in flight
    assert one["stages"] == 2 and one["inflight"] == 0
    two = gemm_choice(SM90A, 2048, 2048, 128, bf16, batch=32).params  # two K tiles: the second loaded ahead
    assert two["stages"] == 4 and two["inflight"] == 1


# --- nvcc ------------------------------------------------------------------------------------------

@pytest.mark.needs_nvcc
def test_grouped_tma_gemm_compiles_without_local_memory():
    from test_wgmma import _sass

    from polytile.runtime.cuda import compile_cuda
    s = pt.Schedule(ops.matmul(1000, 4000, 520, "bfloat16").func)
    gemm_wgmma(s, "C", "A", "B", bm=128, bn=256, bk=64, stages=4, inflight=1, producer="tma", group=3)
    kern = pt.build(s, SM90A)
    assert "blockIdx.y" not in kern.source
    cubin, resources = compile_cuda(kern.source, "sm_90a")
    text = _sass(cubin)
    assert "UTMALDG.2D" in text and "HGMMA.64x256x16" in text
    assert not re.search(r"\bLDL\b|\bSTL\b", text)
    assert all(r.stack_bytes == 0 and r.spill_stores == 0 for r in resources.values())


def test_the_wgmma_tuning_space_chooses_the_block_order():
    from polytile.tune import make_task
    task = make_task("matmul", SM90A, M=2048, N=28672, K=4096, dtype="bfloat16")
    assert task.template.name == "matmul_wgmma"
    base = dict(bm=128, bn=256, bk=64, stages=4, inflight=1, split=1, producer="threads")
    auto, rows, eight = task.predict([dict(base, group=0), dict(base, group=1), dict(base, group=8)])
    assert auto < 0.8 * rows and eight < 0.8 * rows  # B re-read once per row of blocks, row by row
    grids = {}
    for group in (0, 1):  # 0: sized to the L2 (16 rows, down the columns); 1: row by row
        (k,) = [st for st in ir.walk_stmt(pt.lower(task.schedule(dict(base, group=group)), SM90A).body)
                if isinstance(st, ir.Kernel)]
        grids[group] = [ir.eval_int(g, {}) for g in k.grid]
    assert grids == {0: [1792, 1, 1], 1: [112, 16, 1]}


def test_raster_of_parametric_sizes():
    # the grid's extents are expressions of the sizes: the grouping reads them at run time
    M, N = pt.param("M"), pt.param("N")
    A = pt.placeholder((M, 64), "float32", "A")
    B = pt.placeholder((64, N), "float32", "B")
    k = pt.reduce_axis(64, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(A[i, k] * B[k, j], axis=k), "C")
    s = pt.create_schedule(pt.Func([A, B], [C]))
    st = s[C]
    st.split("i", 16, "bi", "ii").split("j", 16, "bj", "jj").reorder("bi", "bj", "ii", "jj", "k")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("ii", "threadIdx.y").bind("jj", "threadIdx.x")
    st.raster(3)
    k = _kernel(s)
    lets = {x.var.name: x.value for x in ir.walk_stmt(k.body)
            if isinstance(x, ir.LetStmt) and x.var.name in ("bi", "bj")}
    for m, n in ((50, 70), (16, 16), (100, 20)):
        env = {"M": m, "N": n}
        grid = ir.eval_int(k.grid[0], env)
        blocks = sorted(tuple(ir.eval_int(lets[n], {**env, "blockIdx.x": x}) for n in ("bi", "bj"))
                        for x in range(grid))
        assert blocks == [(i, j) for i in range(-(-m // 16)) for j in range(-(-n // 16))]
