"""The CUDA tuning templates of the row operators (issue 15, item 4): softmax and layernorm on cuda
have a space (threads per row, the row in shared memory where it fits) whose default configuration
generates the default schedule's CUDA source at odd and vocabulary widths and every data type; every
configuration lowers and compiles with nvcc without local memory; a choice the block cannot take is
refused with a reason; tuning them without a GPU gives the usual clear error. On a GPU (gpu marker):
configurations of odd widths match the reference, and ``tune_task`` returns a correct kernel."""

from __future__ import annotations

import re

import pytest

import polytile as pt
from polytile import ops
from polytile.codegen.cuda import cuda_source
from polytile.errors import ScheduleError
from polytile.ops.gpu_schedules import ROW_THREADS, row_plan
from polytile.target import CUDATarget
from polytile.tune import MeasureOptions, TuneError, make_task, tune_task

SM90A = CUDATarget(arch="sm_90a")
SM80 = CUDATarget(arch="sm_80")
SM75 = CUDATarget(arch="sm_75")  # 64 KiB of shared memory a block: vocabulary rows do not fit
needs_nvcc = pytest.mark.needs_nvcc
OPS = ("softmax", "layernorm")


def _source(sched, target) -> str:
    return cuda_source(pt.lower(sched, target))[0]


@pytest.mark.parametrize("name", OPS)
def test_row_operators_have_cuda_templates(name):
    task = make_task(name, SM90A, M=3, N=1000)
    assert task.template.name == f"{name}_cuda"
    assert [d.name for d in task.space.decisions] == ["threads", "rows", "shared_row", "vec", "cluster"]


DEFAULTS = [(name, N, dtype, target) for name in OPS
            for N, dtype, target in [(1000, "float32", SM90A), (4093, "float16", SM90A), (4093, "bfloat16", SM80),
                                     (30522, "float32", SM90A), (30522, "bfloat16", SM75),
                                     (50257, "float32", SM90A), (128256, "float16", SM90A),
                                     (128256, "float32", SM80), (767, "float32", SM75)]]


@pytest.mark.parametrize("name,N,dtype,target", DEFAULTS,
                         ids=[f"{n}-{N}-{d}-{t.arch}" for n, N, d, t in DEFAULTS])
def test_the_default_configuration_is_the_default_kernel(name, N, dtype, target):
    task = make_task(name, target, M=5, N=N, dtype=dtype)
    default = task.space.default
    assert task.space.reason_invalid(default.digits) is None
    assert _source(task.schedule(default.values), target) == _source(task.op.schedule(target), target)


def test_the_shape_suites_row_workloads_are_tunable_from_their_default():
    # benchmarks/shapes.py --tune 32 calls pt.tune(w.kind, target="cuda", **w.arguments()) on each
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    import shapes
    rows = [w for w in [*shapes.gpu_suite(), *shapes.offsuite()] if w.kind in OPS]
    assert len(rows) >= 18
    for w in rows:
        task = make_task(w.kind, SM90A, **w.arguments())
        assert task.template.name == f"{w.kind}_cuda"
        assert task.space.reason_invalid(task.space.default.digits) is None
        assert sum(task.space.is_valid(c.digits) for c in task.space) >= 4, w.name
        assert _source(task.schedule(task.space.default.values), SM90A) == _source(task.op.schedule(SM90A), SM90A)


def test_the_row_is_offered_in_shared_memory_only_where_it_fits():
    def choices(N, dtype, target):
        # many rows: one block a row by default (few take a cluster's blocks, from global memory)
        return make_task("softmax", target, M=1000, N=N, dtype=dtype).space.decisions[2].choices
    assert choices(30522, "float32", SM90A) == (True, False)  # 122 KB of 227
    assert choices(30522, "float32", SM75) == (False,)  # of 64 KB
    assert choices(128256, "float16", SM90A) == (False,)  # 257 KB
    assert choices(50257, "float32", SM90A) == (True, False)  # 201 KB


def test_choices_the_block_cannot_take_are_refused_with_a_reason():
    with pytest.raises(ScheduleError, match="48 threads per row; a row takes a part of a warp"):
        row_plan(SM90A, "softmax", 1000, 4, threads=48)
    with pytest.raises(ScheduleError, match="softmax: a row of 128256 × 4 bytes does not fit in shared memory"):
        row_plan(SM90A, "softmax", 128256, 4, shared_row=True)
    task = make_task("layernorm", SM90A, M=4, N=200)
    assert task.space.decisions[0].choices[0] == 32
    reasons = {task.space.reason_invalid(c.digits) for c in task.space}
    assert {"1024 threads for a row of 200 elements", "512 threads for a row of 200 elements",
            "256 threads for a row of 200 elements"} < reasons
    choice = {"threads": 128, "rows": 1, "shared_row": False, "vec": 1, "cluster": 1}
    assert task.space.reason_invalid(task.space.from_values(choice).digits) is None


def test_a_smaller_gpu_discards_wider_blocks():
    small = make_task("softmax", CUDATarget(arch="sm_90a", max_threads_per_block=256), M=2, N=30522)
    valid = [c.values["threads"] for c in small.space if small.space.is_valid(c.digits)]
    assert valid and max(valid) == 256
    assert "threads_per_block 512 exceeds" in small.space.reason_invalid(
        small.space.from_values({"threads": 512, "rows": 1, "shared_row": True, "vec": 1, "cluster": 1}).digits)


COMPILED = [("softmax", 3, 1001, "float32"), ("layernorm", 5, 4093, "float16"), ("softmax", 2, 128257, "bfloat16"),
            ("layernorm", 2, 30522, "bfloat16")]


@needs_nvcc
@pytest.mark.parametrize("name,M,N,dtype", COMPILED, ids=[f"{n}-{N}-{d}" for n, _, N, d in COMPILED])
def test_every_configuration_compiles_without_local_memory(name, M, N, dtype):
    task = make_task(name, SM90A, M=M, N=N, dtype=dtype)
    valid = [c for c in task.space if task.space.is_valid(c.digits)]
    assert len(valid) >= len(ROW_THREADS) - 1
    for config in valid:
        kern = pt.build(task.schedule(config.values), SM90A)
        (k,) = kern.kernels
        assert k.block == (config.values["threads"], min(config.values["rows"], M), 1), config
        row = re.search(r"allocate X_\w+\[\d+, \d+\] \w+ in shared", str(pt.lower(task.schedule(config.values), SM90A)))
        assert bool(row) == config.values["shared_row"], config
        res = kern.resources[k.name]
        assert res.spill_stores == 0 and res.stack_bytes == 0, config


def test_tuning_a_row_operator_for_cuda_without_a_gpu_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYTILE_NO_GPU", "1")
    with pytest.raises(TuneError, match=r"no GPU found: tuning softmax\(M=4,N=1000\) for cuda"):
        pt.tune("softmax", target="cuda", trials=2, progress=False, records=tmp_path / "r.jsonl", M=4, N=1000)


# --- on the GPU ---------------------------------------------------------------------------------------

ODD = [("softmax", 7, 1001, "float32"), ("softmax", 3, 30523, "float16"), ("layernorm", 5, 4093, "bfloat16"),
       ("layernorm", 2, 70001, "float32")]


@pytest.mark.gpu
@pytest.mark.parametrize("name,M,N,dtype", ODD, ids=[f"{n}-{N}-{d}" for n, _, N, d in ODD])
def test_configurations_of_odd_widths_match_the_reference(name, M, N, dtype, rng):
    task = make_task(name, "cuda", M=M, N=N, dtype=dtype)
    sample = task.space.sample_valid(rng, 3, exclude={task.space.default.digits})
    for config in [task.space.default, *map(task.space.config, sample)]:
        kern = pt.build(task.schedule(config.values), task.target)
        inputs = task.op.make_inputs(rng)
        assert ops.rel_error(kern(*inputs), task.op.reference(*inputs)) < task.op.tolerance, config


@pytest.mark.gpu
@pytest.mark.parametrize("name,M,N", [("softmax", 33, 12345), ("layernorm", 9, 5003)])
def test_tuning_a_row_operator_on_the_gpu(name, M, N, tmp_path, rng):
    task = make_task(name, "cuda", M=M, N=N)
    result = tune_task(task, trials=4, records=tmp_path / "rows.jsonl", batch_size=4, progress=False,
                       measure=MeasureOptions(repeat=10, min_time=0.02))
    assert result.best is not None and result.kernel is not None
    # the default is among the trials (records come in the order their builds finished)
    assert task.space.default.to_json() in [r.config for r in result.records]
    inputs = task.op.make_inputs(rng)
    assert ops.rel_error(result.kernel(*inputs), task.op.reference(*inputs)) < task.op.tolerance
