"""The CPU tuning templates contain the operators' default schedules (issue 15, item 4): the first
choice of every decision is the default schedule of the workload — the same generated code — at
shapes no benchmark uses (odd, prime, M = 1, 5, 13); configurations that use the choices the
defaults brought (the streaming GEMM, channel vectors, lane-wise row reductions) build and match
NumPy on fresh random data at sizes off the tiles; every tuner's first batch starts with the
default configuration."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fake_measure import HashMeasurer

import polytile as pt
from polytile import ops
from polytile.build import build
from polytile.target import cpu_target
from polytile.tune import GridTuner, ModelTuner, RandomTuner, make_task, tune_task

WIDE = dataclasses.replace(cpu_target(), vector_bits=512, cores=4)

DEFAULTS = [("matmul", dict(M=1, N=37, K=53)), ("matmul", dict(M=5, N=1000, K=999)),
            ("matmul", dict(M=13, N=71, K=17)), ("matmul", dict(M=97, N=131, K=61)),
            ("batch_matmul", dict(batch=3, M=1, N=45, K=27)), ("batch_matmul", dict(batch=1, M=13, N=45, K=27)),
            ("batch_matmul", dict(batch=3, M=37, N=45, K=27)), ("dense", dict(M=31, N=45, K=27)),
            ("dense", dict(M=5, N=43, K=29)), ("dense", dict(M=1, N=37, K=53)), ("dense", dict(M=8, N=19, K=101)),
            ("dense", dict(M=3, N=45, K=5)),
            ("conv2d", dict(N=1, C=57, H=19, W=23, K=57, R=1, S=1)),
            ("conv2d", dict(N=1, C=13, H=7, W=7, K=37, R=3, S=3, padding=1)),
            ("conv2d", dict(N=1, C=7, H=11, W=16, K=13, R=3, S=3, padding=1)),
            ("softmax", dict(M=5, N=31)), ("softmax", dict(M=13, N=101)), ("softmax", dict(M=1, N=1009)),
            ("layernorm", dict(M=5, N=31)), ("layernorm", dict(M=13, N=257))]


def _func() -> pt.Func:
    A = pt.placeholder((37, 29), "float32", "A")
    B = pt.placeholder((29, 45), "float32", "B")
    k = pt.reduce_axis(29, "k")
    return pt.Func([A, B], pt.compute((37, 45), lambda i, j: pt.sum(A[i, k] * B[k, j], axis=k), "C"))


@pytest.mark.parametrize("name,shape", DEFAULTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(DEFAULTS)])
def test_the_default_configuration_is_the_default_schedule(name, shape):
    task = make_task(name, "cpu", **shape)
    default = task.space.default
    assert task.space.reason_invalid(default.digits) is None
    assert build(task.schedule(default.values), task.target).source == task.op.build().source


@pytest.mark.parametrize("name,shape", [("matmul", dict(M=1, N=131, K=29)), ("softmax", dict(M=3, N=1001)),
                                        ("conv2d", dict(N=1, C=11, H=9, W=15, K=45, R=3, S=3, padding=1))])
def test_the_default_configuration_on_a_wider_machine(name, shape):
    task = make_task(name, WIDE, **shape)
    assert task.space.reason_invalid(task.space.default.digits) is None
    assert build(task.schedule(task.space.default.values), WIDE).source == task.op.build(WIDE).source


def test_a_plain_funcs_default_is_the_generic_templates_first_configuration():
    task = make_task(_func(), "cpu", "generic_cpu")
    assert build(task.schedule(task.space.default.values), task.target).source == build(_func(), "cpu").source


def _configs_with(task, fixed: dict[str, object], n: int, rng: np.random.Generator) -> list[dict[str, object]]:
    """Up to ``n`` distinct valid random configurations of ``task`` with the decisions ``fixed``."""
    space = task.space
    names = [d.name for d in space.decisions]
    out: dict[tuple[int, ...], dict[str, object]] = {}
    for row in space.random_digits(rng, 4000):
        digits = list(row)
        for key, value in fixed.items():
            digits[names.index(key)] = space.decisions[names.index(key)].choices.index(value)
        if space.is_valid(digits):
            out.setdefault(tuple(digits), space.config(digits).values)
        if len(out) == n:
            break
    assert out, f"no valid configuration of {task.key} with {fixed}"
    return list(out.values())


def _check(task, values, rng: np.random.Generator) -> None:
    kern = build(task.schedule(values), task.target)
    inputs = task.op.make_inputs(rng)
    assert ops.rel_error(kern(*inputs), task.op.reference(*inputs)) < task.op.tolerance, values


CHOICES = [  # the choices the shape-aware defaults brought into the spaces, at sizes off every tile
    ("matmul", dict(M=5, N=43, K=37), {"pack_a": False, "pack_b": False, "kc": 8}),
    # 64 columns of B a register tile: 8 vectors of 8 lanes, 4 of 16 (AVX-512)
    ("matmul", dict(M=1, N=77, K=29), {"nr_vecs": 64 // cpu_target().vector_lanes(4), "parallel": None}),
    ("matmul", dict(M=13, N=71, K=19), {"pack_b": False, "mr": 5}),
    ("batch_matmul", dict(batch=3, M=3, N=29, K=23), {"pack_a": False, "pack_b": False}),
    ("dense", dict(M=3, N=37, K=41), {"kernel": "dot"}),
    ("dense", dict(M=13, N=29, K=19), {"kernel": "dot", "epilogue": "fused_row"}),
    ("dense", dict(M=3, N=37, K=41), {"kernel": "gemm", "pack_b": False}),
    ("conv2d", dict(N=1, C=5, H=9, W=11, K=19, R=3, S=3, padding=1), {"vectors": "channels"}),
    ("conv2d", dict(N=2, C=3, H=13, W=7, K=9, R=1, S=1, stride=2), {"vectors": "channels", "p_tile": 2}),
    ("conv2d", dict(N=1, C=6, H=11, W=16, K=13, R=3, S=3, padding=1), {"vectors": "columns"}),
    ("softmax", dict(M=5, N=101), {"lanewise": True}),
    ("softmax", dict(M=3, N=67), {"lanewise": True, "fuse_rows": False}),
    ("softmax", dict(M=7, N=45), {"lanewise": False}),
    ("layernorm", dict(M=5, N=77), {"lanewise": True}),
    ("layernorm", dict(M=3, N=19), {"lanewise": False}),
]


@pytest.mark.parametrize("name,shape,fixed", CHOICES, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(CHOICES)])
def test_configurations_of_the_new_choices_build_and_match_numpy(name, shape, fixed, rng):
    task = make_task(name, "cpu", **shape)
    for values in _configs_with(task, fixed, 3, rng):
        _check(task, values, rng)


def test_generic_template_configurations_match_the_default(rng):
    task = make_task(_func(), "cpu", "generic_cpu")
    for values in _configs_with(task, {}, 3, rng):
        _check(task, values, rng)


# --- tuners start from the default -------------------------------------------------------------------

@pytest.mark.parametrize("tuner", ["xgb", "random", "grid"])
def test_every_tuners_first_batch_starts_with_the_default(tuner, tmp_path):
    task = make_task("matmul", "cpu", M=5, N=1000, K=999)
    measurer = HashMeasurer()
    tune_task(task, 4, tmp_path / "r.jsonl", tuner=tuner, batch_size=4, progress=False, build_best=False,
              measurer=measurer, seed=3)
    assert measurer.seen[0] == task.space.default.values
    # a resumed run does not measure it again
    again = HashMeasurer()
    tune_task(task, 8, tmp_path / "r.jsonl", tuner=tuner, batch_size=4, progress=False, build_best=False,
              measurer=again, seed=3)
    assert len(again.seen) == 4 and task.space.default.values not in again.seen


@pytest.mark.parametrize("cls", [RandomTuner, GridTuner, ModelTuner])
def test_propose_leads_with_the_default_once(cls):
    space = make_task("softmax", "cpu", M=13, N=101).space
    tuner = cls(space, seed=0)
    first = tuner.propose(3)
    assert first[0] == space.default.digits and len(set(first)) == 3
    assert space.default.digits not in tuner.propose(3)
