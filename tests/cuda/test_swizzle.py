"""The shared-memory swizzle (``lowering/passes/swizzle.py``) without a GPU: the XOR of an offset's
16-byte chunk by its row modulo 8, applied to the part of the offset that is not a multiple of 8 rows
(a pipeline stage's base is added after it, so the XOR is loop-invariant), checked against the
swizzle of the whole offset at every point, and kept whole where that part may be negative."""

import itertools

import pytest

import polytile as pt
from polytile import ops
from polytile.dtypes import float16
from polytile.lowering import loopir as ir
from polytile.lowering.passes.swizzle import swizzle_shared
from polytile.target import CUDATarget

SM90A = CUDATarget(name="H100", arch="sm_90a")
TILE = ir.Buffer("tile", float16, (ir.const(4 * 8192),), "shared", swizzle=128)


def _xors(e: ir.Expr) -> list[ir.BinOp]:
    return [x for x in ir.walk_expr(e) if isinstance(x, ir.BinOp) and x.op == "^"]


def _swizzled_index(index: ir.Expr, threads: int, steps: int) -> ir.Expr:
    """``index`` of a store into ``TILE`` inside a loop ``ko`` of ``steps`` in a kernel of ``threads``
    threads, after the swizzle pass."""
    ko = ir.Var("ko")
    store = ir.Store(TILE, (index,), ir.Const(0.0, float16))
    kern = ir.Kernel("k", (ir.const(1), ir.const(1), ir.const(1)), (threads, 1, 1),
                     ir.For(ko, ir.const(0), ir.const(steps), store))
    (out,) = [s for s in ir.walk_stmt(swizzle_shared(kern)) if isinstance(s, ir.Store)]
    return out.index[0]


def _reference(e: int) -> int:
    return e ^ (e // 64 % 8 * 8)


@pytest.mark.parametrize("base", [0, 8192, -512, 600, -8])
def test_stage_base_is_added_after_the_xor(base):
    t, ko = ir.Var("threadIdx.x"), ir.Var("ko")
    # a stage's base (4096 elements: 8 swizzled rows of 64 × 8) that moves with the loop, a thread's chunk
    index = ir.BinOp("+", ir.BinOp("+", ir.BinOp("*", ir.const(4096), ir.BinOp("mod", ir.BinOp("+", ko, ir.const(2)),
                                                                               ir.const(4))),
                                   ir.BinOp("*", ir.const(8), t)), ir.const(base + 512))
    out = _swizzled_index(index, 256, 6)
    (xor,) = _xors(out)
    assert not ir.uses_var(xor, "ko"), ir.expr_text(out)  # the XOR is loop-invariant
    for k, x in itertools.product(range(6), range(256)):
        e = ir.eval_int(index, {"ko": k, "threadIdx.x": x})
        assert ir.eval_int(out, {"ko": k, "threadIdx.x": x}) == _reference(e), (k, x)


def test_a_part_that_may_be_negative_keeps_the_whole_xor():
    # n has no known bounds: 8·n may be negative, where C's division is not floor division
    n, ko = ir.Var("n"), ir.Var("ko")
    index = ir.BinOp("+", ir.BinOp("*", ir.const(4096), ko), ir.BinOp("*", ir.const(8), n))
    out = _swizzled_index(index, 256, 3)
    (xor,) = _xors(out)
    assert ir.uses_var(xor, "ko")
    for k, x in itertools.product(range(3), range(256)):
        env = {"ko": k, "n": x}
        assert ir.eval_int(out, env) == _reference(ir.eval_int(index, env))


def test_implicit_gemm_copies_swizzle_outside_the_k_loop():
    """The gathered and filter tiles' copies of a pipelined wgmma convolution: no swizzle XOR depends on
    the K loop (each copy's shared address is the stage's base plus a loop-invariant swizzled offset)."""
    from polytile.ops.gpu_schedules import igemm_wgmma
    s = pt.Schedule(ops.conv2d_igemm(3, 7, 7, 128, 128, 3, 3, 1, 1).func)
    igemm_wgmma(s, "O", "col", "Wt", ["r", "s"], bm=64, bn=64, bk=64, stages=4, inflight=1)
    body = pt.lower(s, SM90A).body
    (loop,) = [f for f in ir.walk_stmt(body) if isinstance(f, ir.For) and f.var.name == "r_s_co"]
    xors = [x for e in ir.all_exprs(loop) for x in _xors(e)]
    assert xors and not any(ir.uses_var(x, "r_s_co") for x in xors)
