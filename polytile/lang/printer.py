"""Infix text of algorithm expressions, for error messages and debugging."""

from __future__ import annotations

from .expr import BinOp, Call, Cast, Cmp, Const, Expr, Load, Logic, Not, Reduce, Select, Var


def expr_str(e: Expr) -> str:
    if isinstance(e, Const):
        return repr(e.value) if not e.dtype.is_float else f"{e.value:g}"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, (BinOp, Cmp, Logic)):
        return f"({expr_str(e.a)} {e.op} {expr_str(e.b)})"
    if isinstance(e, Not):
        return f"!{expr_str(e.a)}"
    if isinstance(e, Select):
        return f"select({expr_str(e.cond)}, {expr_str(e.a)}, {expr_str(e.b)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({expr_str(e.a)})"
    if isinstance(e, Call):
        return f"{e.name}({', '.join(expr_str(a) for a in e.args)})"
    if isinstance(e, Load):
        return f"{e.tensor.name}[{', '.join(expr_str(i) for i in e.indices)}]"
    if isinstance(e, Reduce):
        axes = ", ".join(a.name for a in e.axes)
        where = f", where={expr_str(e.where)}" if e.where is not None else ""
        return f"{e.op}({expr_str(e.body)}, axis=[{axes}]{where})"
    return f"<{type(e).__name__}>"
