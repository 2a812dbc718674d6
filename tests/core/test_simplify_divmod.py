"""The simplifier's quotient rule (``lowering/passes/simplify.py``, ``Simplifier.merge_divmod``):
a·x − a·c·(x // c) is a·(x % c), also for x a quotient y // c1 beside y // (c1·c) — the indices of a
fused loop (an implicit GEMM's taps and channel tiles) whose bounds then decide its guards. Each
rewrite checked against the expression it replaces at every point of a range, off the divisors."""

import itertools

import pytest

from polytile.lowering import loopir as ir
from polytile.lowering.passes.simplify import simplify_expr

X = ir.Var("x")


def _add(*terms: ir.Expr) -> ir.Expr:
    out = terms[0]
    for t in terms[1:]:
        out = ir.BinOp("+", out, t)
    return out


def _mul(c: int, e: ir.Expr) -> ir.Expr:
    return ir.BinOp("*", ir.const(c), e)


def _div(e: ir.Expr, c: int, op: str = "//") -> ir.Expr:
    return ir.BinOp(op, e, ir.const(c))


def _same(e: ir.Expr, out: ir.Expr, points: range) -> None:
    for x in points:
        assert ir.eval_int(out, {"x": x}) == ir.eval_int(e, {"x": x}), x


@pytest.mark.parametrize("a,c,k", [(64, 4, 2), (1, 3, 0), (-5, 7, 11), (3, 2, -3)])
def test_a_multiple_of_x_less_its_quotient_is_its_remainder(a, c, k):
    y = _add(X, ir.const(k))
    e = _add(_mul(a, X), _mul(-a * c, _div(y, c)), ir.const(9))
    out = simplify_expr(e)
    assert not any(isinstance(n, ir.BinOp) and n.op == "//" for n in ir.walk_expr(out)), ir.expr_text(out)
    _same(e, out, range(-40, 40))


def test_nested_quotients_become_a_remainder():
    # (x + 2) // 4 − 3·((x + 2) // 12): a fused loop's middle index, (x + 2) // 4 % 3
    y = _add(X, ir.const(2))
    e = _add(_div(y, 4), _mul(-3, _div(y, 12)))
    out = simplify_expr(e, {"x": (0, 35)})
    assert not any(isinstance(n, ir.BinOp) and n.op == "//" and ir.is_const(n.b, 12) for n in ir.walk_expr(out))
    _same(e, out, range(-30, 60))


def test_the_remainder_decides_a_guard():
    # the channel guard of a fused loop: 64·x − 256·((x + 2) // 4) + 128 < 256 for every x ≥ 0
    y = _add(X, ir.const(2))
    guard = ir.Cmp("<", _add(_mul(64, X), _mul(-256, _div(y, 4, "div")), ir.const(128)), ir.const(256))
    assert ir.is_const(simplify_expr(guard, {"x": (0, 35)}), True)


@pytest.mark.parametrize("a,coef", [(64, -255), (2, -3)])
def test_other_coefficients_are_left(a, coef):
    y = _add(X, ir.const(2))
    e = _add(_mul(a, X), _mul(coef, _div(y, 4)))
    out = simplify_expr(e)
    assert any(isinstance(n, ir.BinOp) and n.op == "//" for n in ir.walk_expr(out))
    _same(e, out, range(-20, 20))


def test_every_small_combination_keeps_its_value():
    for a, c, c1, k in itertools.product((1, 2, -3), (2, 3, 4), (1, 2, 3), (0, 1, 5)):
        y = _add(X, ir.const(k))
        x1 = _div(y, c1) if c1 > 1 else y
        e = _add(_mul(a, x1), _mul(-a * c, _div(y, c1 * c)))
        _same(e, simplify_expr(e), range(-25, 25))
