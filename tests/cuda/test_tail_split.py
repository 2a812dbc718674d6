"""The row split of a GEMM's last wave (``gpu_schedules.tail_split_choice``, opt-in) without a GPU: the
split algorithm (``ops.matmul.matmul_tail_split_func``) against NumPy on the CPU at sizes off the
tiles (primes, chunks of unequal length, a one-row tail), the choice (the head's tiles whole waves,
the tail's rows and split), the default's switch, and the kernels nvcc builds for sm_90a (the head
and the tail on warpgroup MMA with TMA loads at the tail's row offset, no local memory).
Numerics on a GPU: test_tail_split_gpu.py."""

import re

import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.dtypes import as_dtype
from polytile.errors import PolytileError, ScheduleError
from polytile.ops import gpu_schedules
from polytile.ops.gpu_schedules import TAIL_MIN_ROWS, gemm_as, gemm_choice, tail_split_choice
from polytile.ops.matmul import matmul_tail_split_func
from polytile.target import CUDATarget
from polytile.tune.analytical import Hardware, WgmmaConfig, occupancy

SM90A = CUDATarget(arch="sm_90a")
f16 = as_dtype("float16")


@pytest.mark.parametrize("dims", [(37, 29, 23, 16, 3, None), (13, 7, 31, 12, 2, 16), (41, 5, 97, 40, 4, 25),
                                  (8, 3, 5, 3, 1, None), (53, 61, 67, 17, 5, None)], ids=str)
def test_split_rows_are_the_product(dims):
    M, N, K, head, split, chunk = dims
    op = ops.matmul(M, N, K, "float32")
    kern = pt.build(pt.Schedule(matmul_tail_split_func(M, N, K, "float32", head, split, chunk=chunk)), "cpu")
    a, b = op.make_inputs(np.random.default_rng(sum(dims[:5])))
    assert ops.rel_error(kern(a, b), op.reference(a, b)) < 1e-6


def test_split_rows_store_the_output_type():
    M, N, K = 19, 11, 45
    func = matmul_tail_split_func(M, N, K, "float16", 8, 3, out_dtype="float16")
    assert func.tensor("C").dtype.name == "float16" and func.tensor("P").dtype.name == "float32"
    assert func.tensor("H").dtype.name == "float16"
    op = ops.matmul(M, N, K, "float16", out_dtype="float16")
    a, b = op.make_inputs(np.random.default_rng(5))
    out = pt.build(pt.Schedule(func), "cpu")(a, b)
    assert out.dtype == np.float16 and ops.rel_error(out, op.reference(a, b)) <= op.tolerance


@pytest.mark.parametrize("head,split,chunk", [(0, 2, None), (10, 2, None), (4, 3, 1), (4, 2, 20), (4, 2, 45)])
def test_splits_that_leave_no_rows_or_cover_not_k_are_refused(head, split, chunk):
    with pytest.raises(PolytileError):
        matmul_tail_split_func(10, 4, 45, "float32", head, split, chunk=chunk)


def _wave(params, it=2):
    hw = Hardware.of(SM90A)
    return hw.sms * max(1, occupancy(WgmmaConfig.of(params, 2), hw, it).blocks)


@pytest.mark.parametrize("M,N,K,dt", [(5096, 840, 4216, "float16"), (4256, 1001, 3001, "float16"),
                                      (1946, 1260, 2052, "bfloat16"), (5633, 768, 3072, "bfloat16")])
def test_the_head_fills_whole_waves_and_the_tail_takes_the_rest(M, N, K, dt):
    dtype = as_dtype(dt)
    whole = gemm_choice(SM90A, M, N, K, dtype, out_bytes=2, tail_split=False)
    c = tail_split_choice(SM90A, whole, M, N, K, dtype, 2)
    assert c is not None and c.params == whole.params and c.split == 1
    head, tail = c.tail.head_rows, c.tail.tail
    bm, bn = whole.params["bm"], whole.params["bn"]
    wave, columns = _wave(whole.params), -(-N // bn)
    assert head % bm == 0 and (head // bm) * columns <= (-(-M // bm) * columns) // wave * wave
    assert (head // bm + 1) * columns > (-(-M // bm) * columns) // wave * wave  # no whole row of tiles more fits
    assert M - head >= TAIL_MIN_ROWS and tail.kernel == "wgmma"
    # chunks of whole K tiles, the last one ending at K (one chunk: all of K)
    length = tail.chunk or -(-K // tail.split)
    assert tail.split == 1 or length % tail.params["bk"] == 0
    assert (tail.split - 1) * length < K <= tail.split * length
    forced = tail_split_choice(SM90A, whole, M, N, K, dtype, 2, tail_split_k=2)
    assert forced.tail.tail.split == 2 and forced.seconds >= c.seconds


def test_no_split_without_a_partial_last_wave():
    # 4224×1024×4096 in 128×256 tiles: 33 × 4 = 132 tiles, one whole wave; fewer tiles than a wave
    for M, N, K in [(4224, 1024, 4096), (1000, 1000, 1000), (256, 256, 4096)]:
        whole = gemm_choice(SM90A, M, N, K, f16, out_bytes=2, tail_split=False)
        tiles = -(-M // whole.params["bm"]) * -(-N // whole.params["bn"])
        if tiles <= _wave(whole.params) or tiles % _wave(whole.params) == 0:
            assert tail_split_choice(SM90A, whole, M, N, K, f16, 2) is None
    whole = gemm_choice(SM90A, 4224, 1024, 4096, f16, out_bytes=2, tail_split=False)
    assert tail_split_choice(SM90A, whole, 4224, 1024, 4096, f16, 2) is None
    split = gemm_choice(SM90A, 64, 64, 8192, f16, out_bytes=2, tail_split=False)
    assert split.split > 1 and tail_split_choice(SM90A, split, 64, 64, 8192, f16, 2) is None


def test_the_default_takes_the_split_only_when_asked_and_predicted_faster(monkeypatch):
    M, N, K = 5096, 840, 4216
    monkeypatch.delenv(gpu_schedules.TAIL_SPLIT_VARIABLE, raising=False)
    assert gemm_choice(SM90A, M, N, K, f16, out_bytes=2).tail is None  # off by default
    # the combination predicted to save a millisecond: the split wins the model's comparison (tails
    # the model chose before are cached: a fresh cache)
    monkeypatch.setattr(gpu_schedules, "_TAILS", {})
    monkeypatch.setattr(gpu_schedules, "tail_combine_seconds", lambda *a: -1e-3)
    assert gemm_choice(SM90A, M, N, K, f16, out_bytes=2).tail is None
    assert gemm_choice(SM90A, M, N, K, f16, out_bytes=2, tail_split=True).tail is not None
    monkeypatch.setenv(gpu_schedules.TAIL_SPLIT_VARIABLE, "1")
    assert gemm_choice(SM90A, M, N, K, f16, out_bytes=2).tail is not None
    assert gemm_choice(SM90A, M, N, K, f16, out_bytes=2, split_k=1).tail is None  # a given split: none
    assert gemm_choice(SM90A, M, N, K, f16, out_bytes=2, batch=2).tail is None
    monkeypatch.setenv(gpu_schedules.TAIL_SPLIT_VARIABLE, "0")
    assert gemm_choice(SM90A, M, N, K, f16, out_bytes=2).tail is None
    monkeypatch.setattr(gpu_schedules, "_TAILS", {})
    monkeypatch.setattr(gpu_schedules, "tail_combine_seconds", lambda *a: 1e-3)  # to cost one: it loses
    assert gemm_choice(SM90A, M, N, K, f16, out_bytes=2, tail_split=True).tail is None


def test_a_batched_or_split_product_refuses_a_row_split():
    whole = gemm_choice(SM90A, 5096, 840, 4216, f16, out_bytes=2, tail_split=False)
    c = tail_split_choice(SM90A, whole, 5096, 840, 4216, f16, 2)
    sched = pt.Schedule(ops.matmul(5096, 840, 4216, "float16", out_dtype="float16").func)
    with pytest.raises(ScheduleError, match="tail_split"):
        gemm_as(sched, c, 5096, 840, 4216, split_k=2)


def _product_kernels(kern):
    src = kern.source
    bodies = {k.name: src.split(f" {k.name}(")[1].split("__global__")[0] for k in kern.kernels}
    return src, bodies


@pytest.mark.needs_nvcc
def test_the_split_builds_head_tail_and_combination_for_sm90a():
    from test_wgmma import _sass

    from polytile.runtime.cuda import compile_cuda
    M, N, K = 5096, 840, 4216
    whole = gemm_choice(SM90A, M, N, K, f16, out_bytes=2, tail_split=False)
    c = tail_split_choice(SM90A, whole, M, N, K, f16, 2, tail_split_k=3)
    head, tail = c.tail.head_rows, c.tail.tail
    op = ops.matmul(M, N, K, "float16", out_dtype="float16")
    sched = gemm_as(pt.Schedule(op.func), c, M, N, K)
    kern = pt.build(sched, SM90A)
    src, bodies = _product_kernels(kern)
    names = [k.name for k in kern.kernels]
    assert len(names) == 3
    h, p, comb = (bodies[n] for n in names)
    assert "pt_wgmma" in h and "pt_wgmma" in p and "pt_wgmma" not in comb
    # the head: its rows' tiles, whole waves; the tail: its chunks along blockIdx.z, A's boxes at its rows
    grid = {k.name: [g if isinstance(g, int) else int(g.value) for g in k.grid] for k in kern.kernels}
    bm, bn = whole.params["bm"], whole.params["bn"]
    assert sorted(grid[names[0]][:2]) == sorted([-(-N // bn), head // bm]) and grid[names[0]][2] == 1
    assert grid[names[1]][2] == tail.split == 3
    assert re.search(rf"pt_tma_load_2d\(&P_A_shared\[[^;]*\({tail.params['bm']} \* bi\) \+ {head}\)", p)
    assert "(H[" in comb and "P[" in comb and f"< {head})" in comb
    cubin, resources = compile_cuda(kern.source, "sm_90a")
    text = _sass(cubin)
    assert text.count("HGMMA.64x") >= 2 and "UTMALDG.2D" in text
    assert not re.search(r"\bLDL\b|\bSTL\b", text)
    assert all(r.stack_bytes == 0 and r.spill_stores == 0 for r in resources.values())


@pytest.mark.needs_nvcc
def test_odd_rows_copy_each_products_operands_under_their_own_names():
    # K = 1031, N = 523: rows of A and B only 2-byte aligned, copied aligned for each product
    M, N, K = 997, 523, 1031
    bf16 = as_dtype("bfloat16")
    whole = gemm_choice(SM90A, M, N, K, bf16, out_bytes=2, tail_split=False)
    c = tail_split_choice(SM90A, whole, M, N, K, bf16, 2, head_rows=512, tail_split_k=3)
    sched = gemm_as(pt.Schedule(ops.matmul(M, N, K, "bfloat16", out_dtype="bfloat16").func), c, M, N, K)
    kern = pt.build(sched, SM90A)
    src = kern.source
    assert "A_aligned" in src and "P_A_aligned" in src and "P_B_aligned" in src
    assert len(kern.kernels) == 7  # two copies for each product, the products, the combination


def test_the_wgmma_tuning_space_offers_the_row_split():
    from polytile.tune import make_task
    from polytile.tune.measure import odd_workload
    from polytile.tune.task import Task
    task = make_task("matmul", SM90A, M=5096, N=840, K=4216, dtype="float16", out_dtype="float16")
    assert task.template.name == "matmul_wgmma"
    knob = next(k for k in task.space.decisions if k.name == "tail")
    assert knob.choices == (False, True)  # the default (off) first
    base = dict(bm=128, bn=192, bk=64, stages=4, inflight=1, group=0, producer="tma", persistent=False,
                store="threads", split=1)
    split = dict(base, tail=True)
    assert task.space.reason_invalid(task.space.from_values(split).digits) is None
    sched = task.schedule(split)
    assert {"H", "P", "C"} <= set(sched.stage_names())
    assert "P" not in task.schedule(dict(base, tail=False)).stage_names()
    whole = gemm_choice(SM90A, 5096, 840, 4216, f16, out_bytes=2, split_k=1)
    expect = tail_split_choice(SM90A, whole, 5096, 840, 4216, f16, 2)
    with_tail, without = task.predict([split, dict(base, tail=False)])
    assert with_tail == pytest.approx(expect.seconds) and with_tail != without
    why = task.space.reason_invalid(task.space.from_values(dict(split, split=2, producer="threads")).digits)
    assert why and "unsplit product" in why
    # one wave of tiles: nothing to split
    one = make_task("matmul", SM90A, M=1024, N=1024, K=1024, dtype="float16")
    why = one.space.reason_invalid(one.space.from_values(dict(base, bn=128, tail=True)).digits)
    assert why and "partial last wave" in why
    # applied at sizes without a partial last wave (the tuner's check at odd sizes): unsplit there
    odd = Task(task.template, odd_workload(task), task.target)
    odd.schedule(split)


@pytest.mark.needs_nvcc
def test_operands_copied_into_whole_lines_only_when_asked(monkeypatch):
    from polytile.ops.gpu_schedules import line_operands
    assert line_operands(5096, 840, 4216, 2, "AB") == "AB"  # rows of 8432 and 1680 bytes
    assert line_operands(5096, 896, 4224, 2, "AB") == ""  # 8448 and 1792: whole lines
    assert line_operands(5096, 840, 4224, 2, "B") == "B" and line_operands(5096, 840, 4224, 2, "A") == ""
    monkeypatch.delenv(gpu_schedules.LINE_ROWS_VARIABLE, raising=False)
    assert "lines" not in gemm_choice(SM90A, 5096, 840, 4216, f16, out_bytes=2).params  # off by default
    monkeypatch.setenv(gpu_schedules.LINE_ROWS_VARIABLE, "B")
    c = gemm_choice(SM90A, 5096, 840, 4216, f16, out_bytes=2)
    assert c.params["lines"] == "B" and "lines" not in gpu_schedules.wgmma_gemm_config(5096, 840, 4216, target=SM90A)
    sched = pt.Schedule(ops.matmul(5096, 840, 4216, "float16", out_dtype="float16").func)
    gemm_as(sched, c, 5096, 840, 4216)
    kern = pt.build(sched, SM90A)
    assert {b.name: [str(d) for d in b.shape] for b in kern.temporaries} == {"B_aligned": ["4216", "896"]}
    assert len(kern.kernels) == 2  # B's rows rounded up to 64 half-precision values by a copy, the product
    # a split product keeps its operands in place
    assert "lines" not in gemm_choice(SM90A, 64, 64, 8192, f16, out_bytes=2).params


@pytest.mark.needs_nvcc
def test_the_line_switch_builds_what_gemm_configs_measured(monkeypatch):
    # benchmarks/gemm_configs.py's 128x192x64/4/1/tma/rows128B at 5096x840x4216 fp16 (H200: 85.5 µs, the
    # default 103.3): the switch's default is the same kernel
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from gemm_configs import build
    monkeypatch.setenv(gpu_schedules.LINE_ROWS_VARIABLE, "B")
    measured, _ = build((5096, 840, 4216), "float16", "128x192x64/4/1/tma/rows128B", SM90A)
    default = ops.matmul(5096, 840, 4216, "float16").build(SM90A)
    assert default.source == measured.source and "B_aligned" in default.source
