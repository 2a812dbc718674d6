"""MeasureOptions.same_inputs: every candidate of a workload is checked on one set of inputs whose
reference is computed once (in the runner); without it each configuration draws its own inputs. A
wrong kernel is still caught. MeasureOptions.inputs_in_builders: the builder draws a candidate's
inputs and reference, the runner checks on them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

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


def test_builders_draw_the_inputs_that_the_runner_would():
    task = make_task("softmax", "cpu", M=13, N=37)
    values = task.space.config(task.space.sample_valid(np.random.default_rng(1), 1)[0]).values
    art, *_ = m.build_candidate(task, values, False, None, inputs=True)
    assert art.check is not None and art.check.seed == m.trial_seed(values)
    op = task.workload.instantiate()
    drawn = op.make_inputs(np.random.default_rng(m.trial_seed(values)))
    ref = op.reference(*drawn)
    for a, b in zip(art.check.inputs, drawn, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(art.check.reference, ref)
    assert m.build_candidate(task, values, False, None)[0].check is None


def test_builders_draw_the_inputs_on_a_thread_while_the_kernel_builds(monkeypatch):
    """The inputs are drawn beside the build (the same ones: the test above); a build that fails raises
    its own error, and the builder's next candidate gets its own inputs."""
    import threading

    from polytile.errors import ScheduleError
    task = make_task("softmax", "cpu", M=13, N=37)
    first, second = (task.space.config(d).values for d in task.space.sample_valid(np.random.default_rng(3), 2))
    where = []
    real = m._check_data
    monkeypatch.setattr(m, "_check_data", lambda op, seed: where.append(threading.current_thread()) or real(op, seed))
    art, *_ = m.build_candidate(task, first, False, None, inputs=True)
    assert art.check.seed == m.trial_seed(first) and where and where[0] is not threading.main_thread()

    def broken(values):
        raise ScheduleError("a schedule that does not apply")

    monkeypatch.setattr(task, "schedule", broken)
    with pytest.raises(ScheduleError, match="does not apply"):
        m.build_candidate(task, first, False, None, inputs=True)
    monkeypatch.undo()
    art, *_ = m.build_candidate(task, second, False, None, inputs=True)
    assert art.check.seed == m.trial_seed(second)


def test_the_runner_checks_on_the_inputs_its_builder_drew():
    task = make_task("softmax", "cpu", M=13, N=37)
    values = task.space.config(task.space.sample_valid(np.random.default_rng(1), 1)[0]).values
    m._OPS.clear()
    fast = MeasureOptions(repeat=1, min_time=0.0, warmup=0)
    art, *_ = m.build_candidate(task, values, False, None, inputs=True)
    op, calls = _counting(task)
    m._OPS[task.workload.key] = op
    assert m.run_candidate(task, values, art, None, fast)[0] == "ok"
    assert not calls  # the runner computed no reference of its own
    art.check.reference = art.check.reference * 1.5  # a kernel that disagrees with the builder's reference
    status, costs, error, _ = m.run_candidate(task, values, art, None, fast)
    assert status == "wrong_result" and not costs and "relative error" in error


def test_builders_draw_inputs_on_gpu_targets_unless_told_otherwise():
    cpu, gpu = make_task("softmax", "cpu", M=16, N=40), make_task("softmax", "cuda:sm_90a", M=16, N=40)
    assert MeasureOptions().builders_draw_inputs(gpu) and not MeasureOptions().builders_draw_inputs(cpu)
    assert MeasureOptions(inputs_in_builders=True).builders_draw_inputs(cpu)
    assert not MeasureOptions(inputs_in_builders=False).builders_draw_inputs(gpu)
    assert not MeasureOptions(same_inputs=True).builders_draw_inputs(gpu)
    assert not MeasureOptions(check=False).builders_draw_inputs(gpu)


def test_the_measurer_sends_builder_drawn_inputs_to_its_runner():
    task = make_task("softmax", "cpu", M=13, N=37)
    batch = [task.space.config(d).values for d in task.space.sample_valid(np.random.default_rng(2), 2)]
    with m.Measurer(MeasureOptions(builders=1, repeat=1, min_time=0.0, inputs_in_builders=True,
                                   result_cache=False)) as meas:
        built = meas.build(task, batch)
        assert all(b.value[0].check is not None for b in built)
        assert all(r.ok for r in meas.measure(task, batch))


def test_builders_leave_large_inputs_to_the_runner():
    from polytile import ops
    small, large = ops.get("matmul", M=37, N=29, K=61), ops.get("matmul", M=4096, N=4096, K=4096)
    assert m._check_bytes(small) == 4 * (37 * 61 + 61 * 29) + 8 * 37 * 29  # float32 inputs, float64 reference
    assert m._check_data(large, 0) is None  # 64 MiB of float32 inputs: drawn by the runner
    assert m._check_data(small, 0) is not None
