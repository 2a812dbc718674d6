"""Row operators of every width on CUDA (issue 15, item 3): rows narrower than a warp built nothing
("block must have a multiple of 32 threads"); now every width from 1 up builds. Rows of up to
``SEVERAL_ROWS`` elements take several rows a block by default, each row a part of a warp (or a warp)
reduced by shuffles among its
own lanes (``lowering/passes/allreduce.py``: ``pt_group_allreduce``), their statistics in registers;
rows of up to ``NARROW_ROW`` elements are offered that by the tuning templates (and by ``rows=``),
wider ones keep one block a row. Without a GPU: the plans, the
lowered kernels' structure, the reductions' groups (and what is refused), nvcc builds of odd widths
without local memory; the lowered kernels run on the CPU by a lock-step emulation of their blocks
(``block_emulator``: every width, several rows a block, sampled template configurations, row sums
over every kind of group, against the float64 reference row by row). On a GPU (``gpu`` marker):
every width against the float64 reference and torch, row by row, at M = 1 and odd row counts; the
template's configurations; blocks that are not whole warps."""

from __future__ import annotations

import re

import block_emulator
import numpy as np
import pytest
from source_text import body

import polytile as pt
from polytile import ops
from polytile.codegen.cuda import cuda_source
from polytile.errors import LoweringError
from polytile.ops.gpu_schedules import NARROW_ROW, ROW_LANES, SEVERAL_ROWS, RowPlan, row_plan
from polytile.target import CUDATarget
from polytile.tune import make_task

SM90A = CUDATarget(arch="sm_90a")
OPS = ("softmax", "layernorm")
WIDTHS = (1, 2, 3, 7, 20, 24, 31, 32, 33, 64, 97, 128, 255, 256, 257, 511, 512, 513)


def _lowered(name: str, M: int, N: int, dtype: str = "float32", target: CUDATarget = SM90A) -> str:
    op = ops.get(name, M=M, N=N, dtype=dtype)
    return str(pt.lower(op.schedule(target), target))


def _launch(text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    grid, block = re.search(r"grid=\(([^)]*)\) block=\(([^)]*)\)", text).groups()  # type: ignore[union-attr]
    return tuple(int(g) for g in grid.split(", ")), tuple(int(b) for b in block.split(", "))


def _worst_row(out: np.ndarray, ref: np.ndarray) -> float:
    out, ref = np.asarray(out, np.float64).reshape(ref.shape), np.asarray(ref, np.float64)
    return max(ops.rel_error(o, r) for o, r in zip(out, ref))


# --- the plans -------------------------------------------------------------------------------------


def test_narrow_rows_take_several_a_block_of_part_of_a_warp_each():
    # two elements a lane at least, blocks of 128 threads (measured on an H200: SEVERAL_ROWS, _row_lanes)
    assert row_plan(SM90A, "softmax", 20, 4, M=100000) == RowPlan(threads=8, shared_row=False, rows=16)
    assert row_plan(SM90A, "layernorm", 7, 4, M=100000) == RowPlan(threads=4, shared_row=False, rows=32)
    assert row_plan(SM90A, "softmax", 31, 2, M=8192) == RowPlan(threads=16, shared_row=False, rows=8)
    assert row_plan(SM90A, "softmax", 32, 4, M=65536) == RowPlan(threads=16, shared_row=False, rows=8)
    assert row_plan(SM90A, "softmax", 1, 4, M=8192) == RowPlan(threads=1, shared_row=False, rows=32)
    assert row_plan(SM90A, "softmax", 64, 4, M=8192) == RowPlan(threads=32, shared_row=False, rows=4)
    assert row_plan(SM90A, "layernorm", SEVERAL_ROWS, 4, M=16384) == RowPlan(threads=32, shared_row=False, rows=4)
    # few rows: fewer a block, so that every SM has a block (132 on an H100)
    assert row_plan(SM90A, "softmax", 7, 4, M=1000).rows == 4
    assert row_plan(CUDATarget(arch="sm_90a", sms=16), "softmax", 7, 4, M=1000).rows == 32
    assert row_plan(SM90A, "softmax", 7, 4, M=1) == RowPlan(threads=4, shared_row=True, rows=1)
    assert row_plan(SM90A, "softmax", 128, 4, M=1) == RowPlan(threads=32, shared_row=True, rows=1)


def test_wider_rows_keep_one_block_a_row_unless_asked():
    assert row_plan(SM90A, "softmax", SEVERAL_ROWS + 1, 4, M=8192) == RowPlan(threads=32, shared_row=True, rows=1)
    assert row_plan(SM90A, "softmax", NARROW_ROW, 4, M=8192) == RowPlan(threads=32, shared_row=True, rows=1)
    assert row_plan(SM90A, "softmax", 512, 4, M=8192, rows=8, shared_row=False) == RowPlan(32, False, 8)
    assert _lowered("softmax", 8192, 512).count("pt_block_allreduce") == 2
    assert row_plan(SM90A, "layernorm", 768, 4, M=2048) == RowPlan(threads=32, shared_row=True, rows=1)
    assert row_plan(SM90A, "softmax", 30522, 4, M=512) == RowPlan(threads=1024, shared_row=True, rows=1)


def test_choices_several_rows_cannot_take_are_refused():
    with pytest.raises(pt.ScheduleError, match="4 rows a block of 64 threads each; several rows a block take"):
        row_plan(SM90A, "softmax", 1000, 4, threads=64, rows=4)
    with pytest.raises(pt.ScheduleError, match="12 threads per row; a row takes a part of a warp"):
        row_plan(SM90A, "softmax", 100, 4, threads=12)
    with pytest.raises(pt.ScheduleError, match="128 rows of 512 × 4 bytes do not fit in shared memory"):
        row_plan(SM90A, "softmax", 512, 4, threads=1, rows=128, shared_row=True)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("N", WIDTHS)
def test_every_width_lowers(name, N):
    for M in (1, 1001):
        text = _lowered(name, M, N)
        grid, block = _launch(text)
        plan = row_plan(SM90A, name, N, 4, M=M)
        assert block == (min(plan.threads, N), min(plan.rows, M), 1)
        assert grid == (-(-M // plan.rows), 1, 1)
        if plan.rows > 1:  # each row's lanes reduce on their own, the statistics in registers: no barrier
            assert ("pt_group_allreduce_sum(" in text) == (block[0] > 1) and "pt_block_allreduce" not in text
            assert "__syncthreads" not in text and " in shared" not in text
        elif block[0] > 1:  # a block that is not whole warps: its last warp partial
            ragged = block[0] % 32 != 0
            assert bool(re.search(r"\bpt_block_allreduce_sum\(", text)) != ragged
            assert ("pt_ragged_block_allreduce_sum(" in text) == ragged


# --- the reductions' groups (lowering/passes/allreduce.py) ---------------------------------------


def _row_sums(M: int, N: int, lanes: int, rows: int, loc: str | None = None) -> pt.Schedule:
    """S[i] = sum_j X[i, j], ``rows`` rows a block along threadIdx.y, each reduced by ``lanes``
    threads along threadIdx.x; the sum stored in the output (global memory) or, with ``loc``, in a
    buffer at the row (``Y[i] = S[i] * 2`` reads it)."""
    X = pt.placeholder((M, N), "float32", "X")
    j = pt.reduce_axis(N, "j")
    S = pt.compute((M,), lambda i: pt.sum(X[i, j], axis=j), "S")
    outs = [S]
    if loc is not None:
        outs = [pt.compute((M,), lambda i: S[i] * 2.0, "Y")]
    s = pt.create_schedule(pt.Func([X], outs))
    st = s[S].reassociate().split("i", rows, "io", "ii").split("j", lanes, "jo", "jt").reorder("io", "ii", "jt", "jo")
    st.bind("io", "blockIdx.x").bind("ii", "threadIdx.y").bind("jt", "threadIdx.x")
    if loc is not None:
        s["Y"].split("i", rows, "io", "ii").after(s[S], "ii")
        s[S].store_at("ii" if loc == "local" else "io").set_loc(loc)  # shared: one buffer for the block's rows
    return s


def test_an_accumulator_in_registers_takes_the_rows_combined_lanes():
    # before: the per-thread accumulator kept each lane's part (no reduction across the lanes at all)
    text = str(pt.lower(_row_sums(100, 20, 16, 8, loc="local"), SM90A))
    assert re.search(r"S_stored_part = pt_group_allreduce_sum\(S_stored_part, 16\)\n\s+S_stored_0 = \(S_stored_0 \+ "
                     r"S_stored_part\)", text), text
    assert "__syncthreads" not in text and "if (" not in text.split("pt_group_allreduce_sum")[1].split("\n")[1]


def test_an_accumulator_in_memory_is_added_to_by_one_lane_between_syncs_of_the_rows_lanes():
    text = str(pt.lower(_row_sums(100, 20, 16, 8), SM90A))
    after = text.split("pt_group_allreduce_sum(S_part, 16)")[1]
    assert re.match(r"\n\s+pt_group_sync\(16\)\n\s+let jt_first = int64\(threadIdx.x\)\n\s+if \(jt_first < 1\):\n"
                    r"\s+S\[\(ii \+ \(8 \* io\)\)\] = \(S\[\(ii \+ \(8 \* io\)\)\] \+ S_part\)\n\s+pt_group_sync\(16\)",
                    after), text


def test_groups_that_are_no_aligned_part_of_a_warp_are_refused():
    with pytest.raises(LoweringError, match=r"loop jt is bound to threadIdx.x and reduces across threads in a block "
                                            r"of 20 × 8 × 1 threads.*a power of two up to 32"):
        pt.lower(_row_sums(100, 20, 32, 8), SM90A)  # 20 lanes: the row's width
    with pytest.raises(LoweringError, match="block of 64 × 2 × 1 threads"):
        pt.lower(_row_sums(100, 200, 64, 2), SM90A)


@pytest.mark.needs_nvcc
def test_a_block_that_is_not_whole_warps_reduces_with_its_partial_warp():
    # one row a block of 48 threads: before, refused at lowering ("a multiple of 32 threads")
    kern = pt.build(_row_sums(5, 100, 48, 1), SM90A)
    assert kern.kernels[0].block == (48, 1, 1)
    assert "pt_ragged_block_allreduce_sum(" in body(kern.source) and "__shfl_down_sync" in kern.source


# --- on the block emulator (tests/cuda/block_emulator.py: the lowered kernels run on the CPU) ------

SMALL_GPU = CUDATarget(arch="sm_90a", sms=4)  # few SMs: blocks of many rows at small row counts


def _emulated(sched: pt.Schedule, target: CUDATarget, inputs: list[np.ndarray], out_shape: tuple[int, ...]):
    (out,) = block_emulator.run(pt.lower(sched, target), [*inputs, np.zeros(out_shape, np.float32)])
    return out


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("N", [1, 2, 3, 7, 20, 31, 32, 97])
def test_every_width_computes_its_rows_on_the_emulator(name, N, rng):
    # the last block's rows cut short (301 rows, 16 to 256 a block): its groups of lanes skip the rest
    for M, target in ((1, SM90A), (7, SM90A), (301, SMALL_GPU)):
        op = ops.get(name, M=M, N=N)
        inputs = op.make_inputs(rng)
        out = _emulated(op.schedule(target), target, inputs, (M, N))
        assert _worst_row(out, op.reference(*inputs)) < 1e-5, (M, N)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("N,threads,rows", [(64, 32, 8), (97, 32, 4), (257, 16, 4), (512, 32, 2), (33, 1, 32)])
def test_several_rows_a_block_asked_for_compute_their_rows_on_the_emulator(name, N, threads, rows, rng):
    from polytile.ops.gpu_schedules import SCHEDULES
    M = 45
    op = ops.get(name, M=M, N=N)
    sched = pt.Schedule(op.func)
    SCHEDULES[name](sched, SM90A, M, N, threads=threads, rows=rows, shared_row=N * rows < 4096)
    inputs = op.make_inputs(rng)
    assert _worst_row(_emulated(sched, SM90A, inputs, (M, N)), op.reference(*inputs)) < 1e-5


@pytest.mark.parametrize("name,M,N", [("softmax", 37, 20), ("layernorm", 45, 97), ("layernorm", 13, 3)])
def test_sampled_configurations_compute_their_rows_on_the_emulator(name, M, N, rng):
    task = make_task(name, SM90A, M=M, N=N)
    inputs = task.op.make_inputs(rng)
    ref = task.op.reference(*inputs)
    sample = task.space.sample_valid(rng, 10, exclude={task.space.default.digits})
    for config in [task.space.default, *map(task.space.config, sample)]:
        out = _emulated(task.schedule(config.values), SM90A, inputs, (M, N))
        assert _worst_row(out, ref) < 1e-5, config


GROUPS = [(48, 1, None), (7, 1, None), (80, 1, None), (16, 8, None), (16, 8, "local"), (4, 8, "shared"),
          (1, 32, None), (32, 5, None)]


@pytest.mark.parametrize("lanes,rows,loc", GROUPS)
def test_row_sums_over_every_group_on_the_emulator(lanes, rows, loc, rng):
    # blocks that are not whole warps (48, 7, 80 threads: a partial last warp), rows of part of a warp
    # with the sum in global memory, in registers or in shared memory
    M, N = 103, 61
    x = rng.standard_normal((M, N)).astype(np.float32)
    out = _emulated(_row_sums(M, N, lanes, rows, loc), SM90A, [x], (M,))
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=1) * (1.0 if loc is None else 2.0), rtol=1e-5,
                               atol=1e-5)


def test_the_emulator_catches_lanes_of_two_rows_reduced_together(rng, monkeypatch):
    # the reductions' groups are what the results hang on: a group of the whole warp (two rows of 16
    # lanes) mixes them; one left out keeps each lane's part (the accumulator's bug before)
    from polytile.lowering.passes import allreduce
    x = rng.standard_normal((64, 20)).astype(np.float32)
    for group in (lambda self, loop, reduced: 32, lambda self, loop, reduced: 1):
        monkeypatch.setattr(allreduce._CrossThread, "_group", group)
        try:  # wrong sums, or a row's lanes writing different ones
            out = _emulated(_row_sums(64, 20, 16, 8, "local"), SM90A, [x], (64,))
        except AssertionError as err:
            assert "with different values" in str(err)
        else:
            assert not np.allclose(out, x.astype(np.float64).sum(axis=1) * 2.0, rtol=1e-3)


VECTORS = [("softmax", 45, 64, "float32", dict(threads=16, rows=8, vec=4)),
           ("layernorm", 45, 100, "float32", dict(threads=16, rows=4, vec=4)),
           ("softmax", 45, 64, "float16", dict(threads=8, rows=8, vec=8)),
           ("layernorm", 7, 1000, "float32", dict(threads=32, rows=1, vec=4)),
           ("softmax", 45, 97, "float32", dict(threads=8, rows=8, vec=4))]  # rows not 16-byte aligned


def _vector_schedule(name, M, N, dtype, choices):  # noqa: ANN001, ANN202
    from polytile.ops.gpu_schedules import SCHEDULES
    op = ops.get(name, M=M, N=N, dtype=dtype)
    sched = pt.Schedule(op.func)
    SCHEDULES[name](sched, SM90A, M, N, shared_row=False, **choices)
    return op, sched


@pytest.mark.parametrize("name,M,N,dtype,choices", VECTORS, ids=[f"{v[0]}-{v[2]}-{v[3]}" for v in VECTORS])
def test_rows_read_16_bytes_a_thread_compute_their_rows_on_the_emulator(name, M, N, dtype, choices, rng):
    op, sched = _vector_schedule(name, M, N, dtype, choices)
    inputs = op.make_inputs(rng)
    assert _worst_row(_emulated(sched, SM90A, inputs, (M, N)), op.reference(*inputs)) < 1e-5


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("name,M,N,dtype,choices", VECTORS, ids=[f"{v[0]}-{v[2]}-{v[3]}" for v in VECTORS])
def test_rows_read_16_bytes_a_thread_where_their_alignment_is_proven(name, M, N, dtype, choices):
    import subprocess
    import tempfile

    from polytile.sass.disasm import find_nvdisasm
    kern = pt.build(_vector_schedule(name, M, N, dtype, choices)[1], SM90A)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kern.cubin)
        f.flush()
        sass = subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout
    aligned = N * np.dtype(dtype if dtype != "bfloat16" else "float16").itemsize % 16 == 0
    # 16-byte loads in each pass over the rows (softmax: three passes, nothing else read; layernorm:
    # the moments', the output's, beside gamma's and beta's elements), none where unaligned
    loads = re.findall(r"\bLDG\.E[.\w]*", sass)
    wide = [x for x in loads if ".128" in x]
    if not aligned:
        assert not wide
    elif name == "softmax":
        assert len(wide) == len(loads) >= 3, loads
    else:
        assert len(wide) >= 2, loads
    assert not re.search(r"\bLDL\b|\bSTL\b", sass)


def test_the_template_offers_16_byte_reads_where_the_rows_are_aligned():
    def offered(name, N, dtype):  # noqa: ANN001, ANN202
        task = make_task(name, SM90A, M=1000, N=N, dtype=dtype)
        return {c.values["vec"] for c in task.space if task.space.is_valid(c.digits)}
    assert offered("softmax", 64, "float32") == {1, 4}
    assert offered("layernorm", 24, "float16") == {1, 8}
    assert offered("softmax", 97, "float32") == {1}
    assert offered("layernorm", 1001, "bfloat16") == {1}
    assert offered("softmax", 30522, "float32") == {1}  # 30522 × 4 bytes: 8-byte aligned rows only
    assert offered("softmax", 128256, "float16") == {1, 8}


# --- builds ---------------------------------------------------------------------------------------

BUILDS = [(name, N, dtype) for name in OPS for N, dtype in [(1, "float32"), (2, "float32"), (7, "float32"),
                                                            (31, "float16"), (33, "float32"), (97, "bfloat16")]]


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("name,N,dtype", BUILDS, ids=[f"{n}-{N}-{d}" for n, N, d in BUILDS])
def test_narrow_rows_compile_without_local_memory(name, N, dtype):
    for M in (1, 1001):
        kern = ops.get(name, M=M, N=N, dtype=dtype).build(SM90A)
        (k,) = kern.kernels
        res = kern.resources[k.name]
        assert res.spill_stores == 0 and res.stack_bytes == 0, (M, N)


# --- the template ---------------------------------------------------------------------------------

NARROW = [(name, M, N, dtype) for name in OPS for M, N, dtype in [(8192, 64, "float32"), (100000, 20, "bfloat16"),
                                                                  (1000, 7, "float32"), (3, 1, "float16")]]


@pytest.mark.parametrize("name,M,N,dtype", NARROW, ids=[f"{n}-{M}x{N}-{d}" for n, M, N, d in NARROW])
def test_the_templates_default_is_the_default_kernel_and_it_offers_several_rows(name, M, N, dtype):
    task = make_task(name, SM90A, M=M, N=N, dtype=dtype)
    default = task.space.default
    plan = row_plan(SM90A, name, N, task.op.func.inputs[0].dtype.itemsize, M=M)
    assert (default.values["threads"], default.values["rows"]) == (plan.threads, plan.rows)
    assert task.space.reason_invalid(default.digits) is None
    sched = task.schedule(default.values)
    assert cuda_source(pt.lower(sched, SM90A))[0] == cuda_source(pt.lower(task.op.schedule(SM90A), SM90A))[0]
    valid = [c.values for c in task.space if task.space.is_valid(c.digits)]
    assert all(v["threads"] in ROW_LANES for v in valid if v["rows"] > 1)
    assert M < 2 or any(v["rows"] > 1 for v in valid)
    assert all(v["threads"] <= N or v == default.values for v in valid)


# --- on the GPU -----------------------------------------------------------------------------------


def _torch_reference(name: str, inputs: list[np.ndarray]) -> np.ndarray:
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(np.asarray(inputs[0], np.float64))
    if name == "softmax":
        return torch.softmax(x, dim=1).numpy()
    g, b = (torch.from_numpy(np.asarray(a, np.float64)) for a in inputs[1:])
    return torch.nn.functional.layer_norm(x, (x.shape[1],), g, b, 1e-5).numpy()


@pytest.mark.gpu
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("N", WIDTHS)
def test_every_width_matches_torch_row_by_row(name, N, rng):
    for M, dtype in ((1, "float32"), (1001, "float32"), (997, "float16" if N % 2 else "bfloat16")):
        op = ops.get(name, M=M, N=N, dtype=dtype)
        kern = op.build("cuda")
        inputs = op.make_inputs(rng)
        out = np.asarray(kern(*inputs))
        tol = max(op.tolerance, 1e-5)
        assert _worst_row(out, op.reference(*inputs)) < tol, (M, N, dtype)
        assert _worst_row(out, _torch_reference(name, inputs)) < tol, (M, N, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name,M,N", [("softmax", 37, 20), ("layernorm", 45, 97), ("softmax", 301, 7),
                                      ("layernorm", 13, 3)])
def test_sampled_configurations_of_narrow_rows_match(name, M, N, rng):
    task = make_task(name, "cuda", M=M, N=N)
    inputs = task.op.make_inputs(rng)
    ref = task.op.reference(*inputs)
    sample = task.space.sample_valid(rng, 8, exclude={task.space.default.digits})
    assert len(sample) == 8
    for config in [task.space.default, *map(task.space.config, sample)]:
        kern = pt.build(task.schedule(config.values), task.target)
        assert _worst_row(np.asarray(kern(*inputs)), ref) < max(task.op.tolerance, 1e-5), config


@pytest.mark.gpu
@pytest.mark.parametrize("lanes,rows,loc", [(48, 1, None), (7, 1, None), (80, 1, None), (16, 8, None),
                                            (16, 8, "local"), (4, 8, "shared"), (1, 32, None), (32, 5, None)])
def test_row_sums_over_every_group(lanes, rows, loc, rng):
    # blocks that are not whole warps (48, 7, 80 threads: a partial last warp), rows of part of a warp
    # with the sum in global memory, in registers or in shared memory
    M, N = 103, 61
    sched = _row_sums(M, N, lanes, rows, loc)
    x = rng.standard_normal((M, N)).astype(np.float32)
    out = np.asarray(pt.build(sched, "cuda")(x))
    ref = x.astype(np.float64).sum(axis=1) * (1.0 if loc is None else 2.0)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
