"""MeasureOptions.same_inputs: every candidate of a workload is checked on one set of inputs whose
reference is computed once (in the runner); without it each configuration draws its own inputs. A
wrong kernel is still caught."""

from __future__ import annotations

import dataclasses

import numpy as np

from polytile import build
from polytile.tune import MeasureOptions, make_task
from polytile.tune import measure as m


def _counting(task):  # noqa: ANN001, ANN202 - the task's operator, its reference calls counted
    op = task.workload.instantiate()
    calls: list[tuple] = []

    def reference(*inputs):  # noqa: ANN002, ANN202
        calls.append(tuple(float(x.ravel()[0]) for x in inputs))
        return original(*inputs)

    original = op.reference
    return dataclasses.replace(op, reference=reference), calls


def _run(task, values, opts, op):  # noqa: ANN001, ANN202 - run_candidate in this process
    m._OPS.clear()
    m._OPS[task.workload.key] = op
    art = m.pack_kernel(build(task.schedule(values), task.target), task, values)
    return m.run_candidate(task, values, art, None, opts)


def test_same_inputs_compute_the_reference_once():
    task = make_task("softmax", "cpu", M=16, N=40)
    configs = [task.space.config(d).values for d in task.space.sample_valid(np.random.default_rng(0), 3)]
    fast = MeasureOptions(repeat=1, min_time=0.0, warmup=0)
    m._REFERENCES.clear()
    op, calls = _counting(task)
    for values in configs:
        assert _run(task, values, dataclasses.replace(fast, same_inputs=True), op)[0] == "ok"
    assert len(calls) == 1
    m._REFERENCES.clear()
    op, calls = _counting(task)
    for values in configs:
        assert _run(task, values, fast, op)[0] == "ok"
    assert len(calls) == 3 and len(set(calls)) == 3  # fresh inputs per configuration


def test_same_inputs_still_catch_a_wrong_kernel():
    task = make_task("softmax", "cpu", M=16, N=40)
    values = task.space.config(task.space.sample_valid(np.random.default_rng(0), 1)[0]).values
    m._REFERENCES.clear()
    op, _ = _counting(task)
    wrong = dataclasses.replace(op, reference=lambda x: op.reference(x) * 1.5)
    status, costs, error, _ = _run(task, values, MeasureOptions(repeat=1, min_time=0.0, same_inputs=True), wrong)
    assert status == "wrong_result" and not costs and "relative error" in error
