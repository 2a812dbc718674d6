"""Iter features from the lowered IR: fixed length, different between configurations, meaningful."""

from __future__ import annotations

import numpy as np

import polytile as pt
from polytile.lowering import loopir as ir
from polytile.tune import make_task
from polytile.tune.features import coefficient, evaluate, itervar_features, itervar_length


def _lowered(task, **changes):  # noqa: ANN001, ANN202
    base = task.space.config_at(0).values
    return pt.lower(task.schedule({**base, **changes}), task.target)


def test_itervar_features_fixed_length_and_differ_between_configurations():
    task = make_task("matmul", "cpu", M=96, N=64, K=48)
    a = itervar_features(_lowered(task, mr=4, nr_vecs=1, kc=32, unroll_m="unroll"), 2)
    b = itervar_features(_lowered(task, mr=2, nr_vecs=2, kc=48, unroll_m="serial", pack_a=False), 2)
    plain = itervar_features(pt.lower(pt.create_schedule(task.op.func)), 2)
    assert a.shape == b.shape == plain.shape == (itervar_length(),)
    assert np.all(np.isfinite(a)) and not np.array_equal(a, b) and not np.array_equal(a, plain)


def test_hot_loop_features_describe_the_innermost_loop():
    op = make_task("matmul", "cpu", M=32, N=32, K=32).op
    f = itervar_features(pt.lower(pt.create_schedule(op.func)), 1)
    # innermost loop of the plain schedule: k, extent 32, depth 3, serial
    assert np.isclose(f[0], np.log2(33)) and f[1] == 2.0 and f[4] == 1.0
    s = pt.create_schedule(op.func)
    s["C"].split("j", 16, "jo", "ji").reorder("i", "jo", "k", "ji").vectorize("ji")
    g = itervar_features(pt.lower(s), 1)
    assert not np.array_equal(f, g)


def test_index_analysis():
    i, j = ir.Var("i"), ir.Var("j")
    e = ir.BinOp("+", ir.BinOp("*", i, ir.const(64)), j)
    assert coefficient(e, "i") == 64 and coefficient(e, "j") == 1 and coefficient(e, "k") == 0
    assert evaluate(ir.BinOp("min", ir.const(15), ir.BinOp("-", ir.const(85), i)), {"i": 80}) == 5
