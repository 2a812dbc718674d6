"""Softmax and layernorm rows split over the blocks of a thread-block cluster (issue 15: few wide rows,
e.g. 1–32 vocabulary rows of 128256, used 1–32 of an H100's 132 SMs). Without a GPU: the choice rule
(``row_cluster``: from the target's SMs and the rows; none without clusters or for narrow rows; off by
default until measured, ``POLYTILE_ROW_CLUSTERS``); the lowered kernels (grid of the cluster's blocks
by the rows, ``__cluster_dims__``, the statistics combined by ``pt_cluster_allreduce``) and what is
refused; nvcc builds for sm_90a at odd widths and 16-bit types without local memory, sm_80 keeping the
kernel of one block a row; the tuning templates' ``cluster`` knob; the lowered kernels run on the
block emulator, a cluster's blocks together with a copy of the shared buffers each (odd widths, one
row, every cluster size, float16, layernorm rows of mean 300) — and a cluster whose blocks do not
combine their statistics computes wrong rows there. The GPU side: test_row_clusters_gpu.py."""

from __future__ import annotations

import block_emulator
import numpy as np
import pytest
from source_text import body

import polytile as pt
from polytile import ops
from polytile.codegen.cuda import cuda_source
from polytile.errors import LoweringError
from polytile.lowering import loopir as ir
from polytile.ops.gpu_schedules import (
    ROW_CLUSTERS_DEFAULT,
    ROW_CLUSTERS_VARIABLE,
    SCHEDULES,
    RowPlan,
    cluster_slice,
    row_cluster,
    row_plan,
)
from polytile.target import CUDATarget
from polytile.tune import make_task

SM90A = CUDATarget(arch="sm_90a")  # 132 SMs
SM80 = CUDATarget(arch="sm_80")
OPS = ("softmax", "layernorm")


@pytest.fixture
def clusters_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROW_CLUSTERS_VARIABLE, "1")


# --- the rule --------------------------------------------------------------------------------------


def test_few_wide_rows_take_the_blocks_that_fill_the_sms():
    assert [row_cluster(SM90A, M, 128256) for M in (1, 8, 16, 17, 33, 34, 66, 67, 128)] == [8, 8, 8, 4, 4, 2, 2, 1, 1]
    assert row_cluster(SM90A, 8, 50257) == 8 and row_cluster(SM90A, 1, 8193) == 8
    assert row_cluster(CUDATarget(arch="sm_90a", sms=16), 4, 128256) == 4  # from the target's SMs
    assert row_cluster(CUDATarget(arch="sm_90a", sms=16, max_cluster_blocks=4), 1, 128256) == 4


def test_no_split_without_clusters_for_narrow_rows_or_many_rows():
    assert row_cluster(SM80, 1, 128256) == 1  # no clusters before sm_90
    assert row_cluster(SM90A, 1, 8192) == 1  # a block of 1024 threads or fewer is short already
    assert row_cluster(SM90A, None, 128256) == 1  # rows not known: many
    assert row_cluster(SM90A, 512, 30522) == 1


def test_the_split_is_the_default_and_the_switch_turns_it_off(monkeypatch):
    # measured on an H200 (ROW_CLUSTERS_DEFAULT's record): 32×128256 65.3 → 34.0 µs, 1×128256 58.6 → 17.8
    assert ROW_CLUSTERS_DEFAULT is True
    monkeypatch.delenv(ROW_CLUSTERS_VARIABLE, raising=False)
    assert row_plan(SM90A, "softmax", 128256, 4, M=32) == RowPlan(1024, False, 1, 1, 4, 32064)
    assert row_plan(SM80, "softmax", 128256, 4, M=32).cluster == 1
    monkeypatch.setenv(ROW_CLUSTERS_VARIABLE, "0")
    assert row_plan(SM90A, "softmax", 128256, 4, M=32) == RowPlan(1024, False, 1, 1)
    monkeypatch.setenv(ROW_CLUSTERS_VARIABLE, "1")
    assert row_plan(SM90A, "softmax", 128256, 4, M=32).cluster == 4


def test_a_row_one_block_holds_in_shared_memory_is_split_over_4_blocks_or_none():
    # 64×32000 over 2 blocks measured 0.91× of one block a row holding the row in shared memory
    assert row_cluster(SM90A, 64, 32000) == 1 and row_cluster(SM90A, 64, 32000, itemsize=2) == 1
    assert row_cluster(SM90A, 64, 128256) == 2  # 513 KB: no block holds it
    assert row_cluster(SM90A, 34, 50257) == 1 and row_cluster(SM90A, 17, 50257) == 4
    assert row_cluster(SM90A, 34, 128256, itemsize=2) == 2  # 257 KB of bfloat16: does not fit either
    assert row_cluster(SM90A, 8, 50257) == 8 and row_cluster(SM90A, 3, 12345) == 8


def test_slices_are_whole_16_elements_and_every_block_has_one():
    for N in (8193, 12345, 32769, 50257, 128256, 128257):
        for blocks in (2, 4, 8):
            part = cluster_slice(N, blocks)
            assert part % 16 == 0 and -(-N // part) == blocks and part * (blocks - 1) < N <= part * blocks


def test_splits_a_target_or_a_row_cannot_take_are_refused():
    with pytest.raises(pt.ScheduleError, match="has no clusters"):
        row_plan(SM80, "softmax", 128256, 4, M=1, cluster=2)
    with pytest.raises(pt.ScheduleError, match="a cluster holds 2 to 8 blocks"):
        row_plan(SM90A, "softmax", 128256, 4, M=1, cluster=16)
    with pytest.raises(pt.ScheduleError, match="leaves one without its slice"):
        row_plan(SM90A, "softmax", 20, 4, M=1, cluster=8)
    with pytest.raises(pt.ScheduleError, match="one row a block, read from global memory"):
        row_plan(SM90A, "layernorm", 50257, 4, M=1, cluster=2, shared_row=True)
    with pytest.raises(pt.ScheduleError, match="take a block of whole warps"):
        row_plan(SM90A, "softmax", 50257, 4, M=1, cluster=2, threads=16)
    with pytest.raises(pt.ScheduleError, match="would shrink to its slice's reads"):
        row_plan(SM90A, "softmax", 1024, 2, M=1, cluster=8, threads=32, vec=8)


# --- the kernels ----------------------------------------------------------------------------------


def _grid(kernel) -> tuple[int, ...]:  # noqa: ANN001 - a KernelSource
    return tuple(int(ir.eval_int(g, {})) for g in kernel.grid)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("M,N,blocks", [(32, 128256, 4), (1, 128257, 8), (16, 128256, 8), (8, 50257, 8)])
def test_the_default_splits_few_wide_rows_over_a_cluster(name, M, N, blocks, clusters_on):
    lowered = pt.lower(ops.get(name, M=M, N=N).schedule(SM90A), SM90A)
    source, (kernel,) = cuda_source(lowered)
    assert (_grid(kernel), kernel.block, kernel.cluster) == ((blocks, M, 1), (1024, 1, 1), blocks)
    code = body(source)
    assert f"__cluster_dims__({blocks}, 1, 1)" in code
    # the statistics: max and sum, or both shifted moments, combined over the cluster's blocks
    calls = ["max", "sum"] if name == "softmax" else ["sum", "sum"]
    assert [c for c in calls if f"pt_cluster_allreduce_{c}(" in code] == calls
    assert code.count("pt_cluster_allreduce_") == 2 and "pt_block_allreduce" not in code
    # the rows along y (one row: no loop), the slices along x
    assert ("const int i = ((int)((int)blockIdx.y));" in code) == (M > 1)


@pytest.mark.parametrize("name", OPS)
def test_many_rows_and_targets_without_clusters_keep_one_block_a_row(name, clusters_on, monkeypatch):
    for target, M, N in ((SM80, 1, 128256), (SM90A, 512, 30522), (SM90A, 8, 4096)):
        with_rule = cuda_source(pt.lower(ops.get(name, M=M, N=N).schedule(target), target))
        monkeypatch.setenv(ROW_CLUSTERS_VARIABLE, "0")
        without = cuda_source(pt.lower(ops.get(name, M=M, N=N).schedule(target), target))
        monkeypatch.setenv(ROW_CLUSTERS_VARIABLE, "1")
        assert with_rule[0] == without[0] and "__cluster_dims__" not in with_rule[0]
        assert with_rule[1][0].cluster == 1 and _grid(with_rule[1][0])[0] == M


def _split(name: str, M: int, N: int, target: CUDATarget = SM90A, dtype: str = "float32",
           **choices: int) -> pt.Schedule:
    op = ops.get(name, M=M, N=N, dtype=dtype)
    sched = pt.Schedule(op.func)
    SCHEDULES[name](sched, target, M, N, **choices)
    return sched


def test_a_cluster_on_a_target_without_clusters_is_refused():
    sched = _split("softmax", 2, 1001, threads=64, cluster=2)
    with pytest.raises(LoweringError, match=r"runs its threadIdx.z as the blocks of a cluster .* lacks"):
        pt.lower(sched, SM80)


def test_cluster_primitive_refuses_blocks_along_x():
    op = ops.get("softmax", M=4, N=100)
    sched = pt.Schedule(op.func)
    sched["mx"].bind("i", "blockIdx.x")
    with pytest.raises(pt.ScheduleError, match="the cluster's blocks take the grid's x dimension"):
        sched["mx"].cluster()
    with pytest.raises(pt.ScheduleError, match="bind a loop of it to blockIdx.y or threadIdx.z first"):
        sched["sm"].cluster()


def test_a_buffer_one_block_writes_and_another_reads_is_refused():
    # Y's row sums written by the cluster's blocks (threadIdx.z) into an intermediate the kernel reads
    X = pt.placeholder((4, 64), "float32", "X")
    T = pt.compute((4, 64), lambda i, j: X[i, j] * 2.0, "T")
    Y = pt.compute((4, 64), lambda i, j: T[i, 63 - j], "Y")
    s = pt.create_schedule(pt.Func([X], [Y]))
    s[T].split("j", 16, "jc", "js").bind("i", "blockIdx.y").bind("jc", "threadIdx.z").bind("js", "threadIdx.x")
    s[Y].split("j", 16, "jc", "js").bind("jc", "threadIdx.z").bind("js", "threadIdx.x").after(s[T], "i")
    s[T].cluster()
    with pytest.raises(LoweringError, match="T is written inside loop .* where the other blocks do not see it"):
        pt.lower(s, SM90A)


BUILDS = [("softmax", 32, 128256, "float32", None), ("softmax", 1, 128257, "bfloat16", None),
          ("layernorm", 16, 128256, "float32", None), ("layernorm", 3, 12345, "float16", None),
          ("softmax", 8, 50257, "float16", 2), ("layernorm", 1, 50257, "float32", 4)]
VECTOR_BUILDS = [("softmax", 32, 128256, "float32", 4), ("layernorm", 16, 128256, "float32", 4),
                 ("softmax", 16, 128256, "bfloat16", 8)]


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("name,M,N,dtype,cluster", BUILDS, ids=[f"{b[0]}-{b[1]}x{b[2]}-{b[3]}" for b in BUILDS])
def test_cluster_kernels_compile_for_sm90a_without_local_memory(name, M, N, dtype, cluster, clusters_on):
    sched = ops.get(name, M=M, N=N, dtype=dtype).schedule(SM90A) if cluster is None else \
        _split(name, M, N, dtype=dtype, cluster=cluster)
    kern = pt.build(sched, SM90A)
    (k,) = kern.kernels
    assert k.cluster == (cluster or row_cluster(SM90A, M, N)) > 1
    res = kern.resources[k.name]
    assert res.spill_stores == 0 and res.stack_bytes == 0


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("name,M,N,dtype,vec", VECTOR_BUILDS, ids=[f"{b[0]}-{b[3]}" for b in VECTOR_BUILDS])
def test_cluster_kernels_read_16_bytes_a_thread_where_asked(name, M, N, dtype, vec):
    # each thread's elements in its registers (inside the cluster's loops: a block's own), 16-byte loads
    import re
    import subprocess
    import tempfile

    from polytile.sass.disasm import find_nvdisasm
    kern = pt.build(_split(name, M, N, dtype=dtype, cluster=4, vec=vec), SM90A)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kern.cubin)
        f.flush()
        sass = subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout
    loads = re.findall(r"\bLDG\.E[.\w]*", sass)
    wide = [x for x in loads if ".128" in x]
    assert len(wide) >= 2 and "UCGABAR_ARV" in sass and not re.search(r"\bLDL\b|\bSTL\b", sass), loads


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("name", OPS)
def test_sm80_builds_its_one_block_a_row_kernel(name, clusters_on):
    kern = ops.get(name, M=16, N=128256).build(SM80)
    assert kern.kernels[0].cluster == 1 and "cluster" not in body(kern.source)


# --- the templates --------------------------------------------------------------------------------


def test_the_templates_offer_the_split_where_the_target_has_clusters():
    def offered(target, M, N):  # noqa: ANN001, ANN202
        task = make_task("layernorm", target, M=M, N=N)
        return sorted({c.values["cluster"] for c in task.space if task.space.is_valid(c.digits)})
    assert offered(SM90A, 32, 128256) == [1, 2, 4, 8]
    assert offered(SM80, 32, 128256) == [1]
    assert offered(SM90A, 1000, 256) == [1]  # narrow rows: one block a row at most


@pytest.mark.parametrize("name", OPS)
def test_the_templates_default_is_the_rules_kernel(name, clusters_on):
    task = make_task(name, SM90A, M=16, N=128256)
    assert task.space.default.values["cluster"] == 8
    assert cuda_source(pt.lower(task.schedule(task.space.default.values), SM90A))[0] == \
        cuda_source(pt.lower(task.op.schedule(SM90A), SM90A))[0]


# --- on the block emulator ------------------------------------------------------------------------


def _emulated(sched: pt.Schedule, inputs: list[np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    (out,) = block_emulator.run(pt.lower(sched, SM90A), [*inputs, np.zeros(shape, np.float32)])
    return out


def _worst_row(out: np.ndarray, ref: np.ndarray) -> float:
    return max(ops.rel_error(o, r) for o, r in zip(np.asarray(out, np.float64), np.asarray(ref, np.float64)))


EMULATED = [("softmax", 3, 1001, 4, 64, "float32"), ("softmax", 1, 12345, 8, 128, "float32"),
            ("softmax", 2, 997, 2, 32, "float16"), ("layernorm", 2, 997, 8, 32, "float32"),
            ("layernorm", 1, 333, 2, 64, "float16"), ("layernorm", 5, 1000, 4, 32, "float32"),
            ("softmax", 2, 1000, 4, 32, "float32", 4), ("layernorm", 3, 2048, 8, 32, "float16", 8)]
"""(operator, rows, width, blocks of the cluster, threads, type[, elements a read])."""


@pytest.mark.parametrize("case", EMULATED, ids=[f"{e[0]}-{e[1]}x{e[2]}-c{e[3]}-{e[5]}{'-v' if len(e) > 6 else ''}"
                                                for e in EMULATED])
def test_rows_split_over_a_cluster_compute_their_rows_on_the_emulator(case, rng):
    name, M, N, cluster, threads, dtype, *vec = case
    op = ops.get(name, M=M, N=N, dtype=dtype)
    inputs = op.make_inputs(rng)
    if name == "layernorm":  # rows of mean ~300: each block's moments shifted by the same first element
        inputs[0] = (inputs[0].astype(np.float32) + 300).astype(inputs[0].dtype)
    out = _emulated(_split(name, M, N, dtype=dtype, threads=threads, cluster=cluster, vec=vec[0] if vec else 1),
                    inputs, (M, N))
    assert _worst_row(out, op.reference(*inputs)) < 1e-5


def test_sampled_template_configurations_with_clusters_compute_their_rows_on_the_emulator(rng):
    task = make_task("softmax", SM90A, M=2, N=1001)
    inputs = task.op.make_inputs(rng)
    ref = task.op.reference(*inputs)
    valid = [c for c in task.space if task.space.is_valid(c.digits) and c.values["cluster"] > 1
             and c.values["threads"] <= 128]
    assert {c.values["cluster"] for c in valid} == {2, 4, 8}
    for config in valid[:: max(1, len(valid) // 6)]:
        assert _worst_row(_emulated(task.schedule(config.values), inputs, (2, 1001)), ref) < 1e-5, config.values


@pytest.mark.parametrize("name", OPS)
def test_blocks_that_do_not_combine_their_statistics_compute_wrong_rows(name, rng, monkeypatch):
    # the cluster's reductions taken as the block's own (the lowering blind to the cluster): each block
    # normalizes its slice by its own statistics, or writes a shared statistic other blocks disagree on
    from polytile.lowering.passes import allreduce
    blind = allreduce._CrossThread.__init__
    monkeypatch.setattr(allreduce._CrossThread, "__init__", lambda self, block, cluster=False: blind(self, block))
    op = ops.get(name, M=2, N=1001)
    inputs = op.make_inputs(rng)
    try:
        out = _emulated(_split(name, 2, 1001, threads=64, cluster=4), inputs, (2, 1001))
    except AssertionError as err:
        assert "with different values" in str(err)
    else:
        assert _worst_row(out, op.reference(*inputs)) > 1e-2


def test_a_grid_of_part_of_a_cluster_is_refused(clusters_on):
    from dataclasses import replace
    lowered = pt.lower(ops.get("softmax", M=2, N=50257).schedule(SM90A), SM90A)
    assert cuda_source(lowered)[1][0].cluster == 8
    cut = ir.map_stmts(lowered.body, lambda s: replace(s, grid=(ir.const(12), *s.grid[1:]))
                       if isinstance(s, ir.Kernel) else None)
    with pytest.raises(LoweringError, match="a grid of 12 blocks along x in clusters of 8; the grid must be whole"):
        cuda_source(replace(lowered, body=cut))
