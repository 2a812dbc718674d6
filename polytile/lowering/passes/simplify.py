"""Simplification: constant folding, canonical linear integer forms, and bound-based rewriting.

Integer expressions are put in a canonical linear form over atoms (variables and irreducible
subterms); loop variables carry intervals from their loops so that ``min``/``max``, comparisons,
floor division and modulo are resolved where the bounds decide them. Loops of one iteration are
replaced by their body; loops with no iteration disappear.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ... import dtypes
from .. import loopir as ir

INF = math.inf
Interval = tuple[float, float]


def _is_int(e: ir.Expr) -> bool:
    return e.lanes == 1 and (e.dtype.is_int or e.dtype.is_bool) and e.dtype.bits == 64 and e.dtype.kind == "int"


class Linear:
    """sum(coef * atom) + const over atoms keyed by their printed text."""

    def __init__(self, terms: dict[str, tuple[int, ir.Expr]] | None = None, const: int = 0):
        self.terms = terms or {}
        self.const = const

    def add(self, other: Linear, sign: int = 1) -> Linear:
        terms = dict(self.terms)
        for k, (c, a) in other.terms.items():
            old = terms.get(k, (0, a))[0]
            if old + sign * c == 0:
                terms.pop(k, None)
            else:
                terms[k] = (old + sign * c, a)
        return Linear(terms, self.const + sign * other.const)

    def scale(self, k: int) -> Linear:
        if k == 0:
            return Linear()
        return Linear({n: (c * k, a) for n, (c, a) in self.terms.items()}, self.const * k)

    def expr(self) -> ir.Expr:
        """The sum as an int64 expression: a binary operation has its first operand's type, so the
        first term is int64 (a narrower atom, such as a load of an int32 index array, first among
        the sorted terms would make the sum an int32 one, and a vector of it an int32 vector among
        int64 ones)."""
        out: ir.Expr | None = None
        for _, (c, a) in sorted(self.terms.items(), key=lambda kv: (kv[1][1].dtype != dtypes.INDEX, kv[0] != "",
                                                                    kv[0])):
            if out is None and a.dtype != dtypes.INDEX:
                a = ir.Cast(dtypes.INDEX, a)
            if c == 1:
                t = a
            elif c == -1 and out is not None:
                out = ir.BinOp("-", out, a)
                continue
            else:
                t = ir.BinOp("*", ir.const(c), a) if c != 1 else a
            out = t if out is None else ir.BinOp("+", out, t)
        if out is None:
            return ir.const(self.const)
        if self.const > 0:
            return ir.BinOp("+", out, ir.const(self.const))
        if self.const < 0:
            return ir.BinOp("-", out, ir.const(-self.const))
        return out


class Simplifier(ir.Mutator):
    def __init__(self) -> None:
        self.bounds: dict[str, Interval] = {}

    # --- intervals --------------------------------------------------------------------------------
    def interval(self, e: ir.Expr) -> Interval:
        if isinstance(e, ir.Const) and e.lanes == 1 and not e.dtype.is_float:
            return (e.value, e.value)  # type: ignore[return-value]
        if isinstance(e, ir.Var):
            return self.bounds.get(e.name, (-INF, INF))
        if isinstance(e, ir.Cast) and e.dtype.is_int and e.a.dtype.is_int:
            return self.interval(e.a)
        if isinstance(e, ir.BinOp) and e.lanes == 1 and not e.dtype.is_float:
            a, b = self.interval(e.a), self.interval(e.b)
            if e.op == "+":
                return (a[0] + b[0], a[1] + b[1])
            if e.op == "-":
                return (a[0] - b[1], a[1] - b[0])
            if e.op == "*":
                prods = [x * y for x in a for y in b if not (math.isinf(x) and y == 0 or math.isinf(y) and x == 0)]
                return (min(prods), max(prods)) if prods else (-INF, INF)
            if e.op == "min":
                return (min(a[0], b[0]), min(a[1], b[1]))
            if e.op == "max":
                return (max(a[0], b[0]), max(a[1], b[1]))
            if e.op in ("//", "div") and b[0] == b[1] and b[0] > 0:
                c = b[0]
                return (math.floor(a[0] / c) if not math.isinf(a[0]) else -INF,
                        math.floor(a[1] / c) if not math.isinf(a[1]) else INF)
            if e.op in ("%", "mod") and b[0] == b[1] and b[0] > 0:
                return (0, b[0] - 1)
        if isinstance(e, ir.Select):
            a, b = self.interval(e.a), self.interval(e.b)
            return (min(a[0], b[0]), max(a[1], b[1]))
        return (-INF, INF)

    # --- linear forms -----------------------------------------------------------------------------
    def linear(self, e: ir.Expr) -> Linear:
        if isinstance(e, ir.Const) and _is_int(e):
            return Linear(const=int(e.value))
        if isinstance(e, ir.BinOp) and _is_int(e):
            if e.op in ("+", "-"):
                return self.linear(e.a).add(self.linear(e.b), 1 if e.op == "+" else -1)
            if e.op == "*":
                la, lb = self.linear(e.a), self.linear(e.b)
                if not la.terms:
                    return lb.scale(la.const)
                if not lb.terms:
                    return la.scale(lb.const)
        key = ir.expr_text(e)
        return Linear({key: (1, e)})

    # --- expressions ------------------------------------------------------------------------------
    def visit_BinOp(self, e: ir.BinOp) -> ir.Expr:
        a, b = self.expr(e.a), self.expr(e.b)
        ramp = _ramp_arith(e.op, a, b)
        if ramp is not None:
            return self.expr(ramp)
        if isinstance(a, ir.Const) and isinstance(b, ir.Const) and a.lanes == 1 and b.lanes == 1:
            folded = _fold(e.op, a, b, e.dtype)
            if folded is not None:
                return folded
        if _is_int(e):
            if e.op in ("+", "-", "*"):
                return self.merge_divmod(self.linear(ir.BinOp(e.op, a, b))).expr()
            if e.op in ("min", "max"):
                ia, ib = self.interval(a), self.interval(b)
                if e.op == "min":
                    if ia[1] <= ib[0]:
                        return a
                    if ib[1] <= ia[0]:
                        return b
                else:
                    if ia[0] >= ib[1]:
                        return a
                    if ib[0] >= ia[1]:
                        return b
                if ir.expr_text(a) == ir.expr_text(b):
                    return a
            if e.op in ("//", "%") and isinstance(b, ir.Const) and int(b.value) > 0:
                out = self.divmod(e.op, a, int(b.value))
                if isinstance(out, ir.BinOp) and out.op in ("//", "%") and self.interval(out.a)[0] >= 0:
                    # a non-negative numerator: C's truncating division is floor division
                    return ir.BinOp("div" if out.op == "//" else "mod", out.a, out.b)
                return out
        if e.dtype.is_float and e.lanes == 1:
            if e.op == "+" and ir.is_const(b, 0):
                return a
            if e.op == "*" and ir.is_const(b, 1):
                return a
        return e if (a is e.a and b is e.b) else ir.BinOp(e.op, a, b)

    def merge_divmod(self, lin: Linear) -> Linear:
        """a*(x % c) + a*c*(x // c) = a*x (floor division and modulo recombine); and the other way,
        a*x - a*c*(x // c) = a*(x % c), also where x is itself a quotient y // c1 that the sum holds
        beside y // (c1·c) (a fused loop's indices: 64*r - 256*((r + 2) // 4) is 64*((r + 2) % 4) - 128,
        whose bounds decide its comparisons)."""
        for key, (coef, atom) in list(lin.terms.items()):
            if not (isinstance(atom, ir.BinOp) and atom.op in ("%", "mod") and isinstance(atom.b, ir.Const)):
                continue
            c = int(atom.b.value)
            div_key = ir.expr_text(ir.BinOp("//" if atom.op == "%" else "div", atom.a, atom.b))
            if key in lin.terms and div_key in lin.terms and lin.terms[div_key][0] == coef * c:
                lin = lin.add(Linear({key: (coef, atom), div_key: (coef * c, lin.terms[div_key][1])}), -1)
                lin = lin.add(self.linear(atom.a).scale(coef))
        for key, (coef, atom) in list(lin.terms.items()):
            if key in lin.terms and isinstance(atom, ir.BinOp) and atom.op in ("//", "div") and \
                    isinstance(atom.b, ir.Const) and int(atom.b.value) > 1:
                lin = self._split_quotient(lin, key, coef, atom)
        return lin

    def _split_quotient(self, lin: Linear, key: str, coef: int, atom: ir.BinOp) -> Linear:
        """``lin`` with ``coef * atom`` (atom = y // c) and a*x, where x = y // c1 for a divisor c1 of c
        (c1 = 1: x = y) and coef = -a*(c // c1), as a*(x % (c // c1)) and a constant."""
        c = int(atom.b.value)
        mod = "%" if atom.op == "//" else "mod"
        for c1 in (d for d in range(1, c) if c % d == 0):
            q = c // c1
            if coef % q:
                continue
            a = -coef // q
            x = atom.a if c1 == 1 else ir.BinOp(atom.op, atom.a, ir.const(c1))
            inner = self.linear(x)
            if not inner.terms or any(lin.terms.get(k, (0, None))[0] != a * v for k, (v, _) in inner.terms.items()):
                continue
            whole = Linear({k: (a * v, e) for k, (v, e) in inner.terms.items()})
            lin = lin.add(whole, -1).add(Linear({key: (coef, atom)}), -1)
            return lin.add(Linear(const=-a * inner.const)).add(self.linear(ir.BinOp(mod, x, ir.const(q))).scale(a))
        return lin

    def divmod(self, op: str, a: ir.Expr, c: int) -> ir.Expr:
        if c == 1:
            return a if op == "//" else ir.const(0)
        lin = self.linear(a)
        whole = Linear({k: (v // c, x) for k, (v, x) in lin.terms.items() if v % c == 0}, lin.const // c)
        rest = Linear({k: (v, x) for k, (v, x) in lin.terms.items() if v % c != 0}, lin.const % c)
        lo, hi = self.interval(rest.expr())
        if 0 <= lo and hi < c:
            if op == "//":
                return whole.expr()
            return rest.expr()
        lo_a, hi_a = self.interval(a)
        if 0 <= lo_a and hi_a < c:
            return ir.const(0) if op == "//" else a
        return ir.BinOp(op, a, ir.const(c))

    def visit_Cmp(self, e: ir.Cmp) -> ir.Expr:
        a, b = self.expr(e.a), self.expr(e.b)
        if e.lanes == 1 and _is_int(a) and _is_int(b):
            diff = self.linear(a).add(self.linear(b), -1)
            lo, hi = self.interval(diff.expr())
            verdict = _decide(e.op, lo, hi)
            if verdict is not None:
                return ir.Const(verdict, dtypes.bool_)
        if isinstance(a, ir.Const) and isinstance(b, ir.Const) and a.lanes == b.lanes == 1:
            return ir.Const(_CMP_FN[e.op](a.value, b.value), dtypes.bool_)
        return e if (a is e.a and b is e.b) else ir.Cmp(e.op, a, b)

    def visit_Logic(self, e: ir.Logic) -> ir.Expr:
        args = [self.expr(x) for x in e.args]
        if e.op == "!":
            if isinstance(args[0], ir.Const):
                return ir.Const(not args[0].value, dtypes.bool_)
            return ir.Logic("!", (args[0],))
        absorbing = e.op == "||"
        kept = []
        for x in args:
            if isinstance(x, ir.Const) and x.lanes == 1:
                if bool(x.value) == absorbing:
                    return ir.Const(absorbing, dtypes.bool_)
                continue
            kept.append(x)
        if not kept:
            return ir.Const(not absorbing, dtypes.bool_)
        return kept[0] if len(kept) == 1 else ir.Logic(e.op, tuple(kept))

    def visit_Select(self, e: ir.Select) -> ir.Expr:
        c = self.expr(e.cond)
        if isinstance(c, ir.Const) and c.lanes == 1:
            return self.expr(e.a if c.value else e.b)
        a, b = self.expr(e.a), self.expr(e.b)
        return ir.Select(c, a, b)

    def visit_Cast(self, e: ir.Cast) -> ir.Expr:
        a = self.expr(e.a)
        if a.dtype == e.dtype:
            return a
        if isinstance(a, ir.Const) and a.lanes == 1:
            if e.dtype.is_float:
                return ir.Const(float(a.value), e.dtype)
            if e.dtype.is_int and not a.dtype.is_float:
                return ir.Const(int(a.value), e.dtype)
        return ir.Cast(e.dtype, a)

    # --- statements -------------------------------------------------------------------------------
    def visit_For(self, s: ir.For) -> ir.Stmt:
        lo, ext = self.expr(s.lo), self.expr(s.extent)
        ilo, iext = self.interval(lo), self.interval(ext)
        if iext[1] <= 0:
            return ir.Block(())
        if ir.is_const(ext, 1) and s.kind in ("serial", "unroll", "vectorize", "parallel"):
            return self.stmt(ir.substitute(s.body, {s.var.name: lo}))  # type: ignore[arg-type]
        saved = self.bounds.get(s.var.name)
        self.bounds[s.var.name] = (ilo[0], ilo[1] + iext[1] - 1)
        body = self.stmt(s.body)
        if saved is None:
            del self.bounds[s.var.name]
        else:
            self.bounds[s.var.name] = saved
        if isinstance(body, ir.Block) and not body.body:
            return body
        return replace(s, lo=lo, extent=ext, body=body)

    def visit_If(self, s: ir.If) -> ir.Stmt:
        c = self.expr(s.cond)
        if isinstance(c, ir.Const) and c.lanes == 1:
            if c.value:
                return self.stmt(s.then)
            return self.stmt(s.orelse) if s.orelse is not None else ir.Block(())
        then = self.stmt(s.then)
        orelse = self.stmt(s.orelse) if s.orelse is not None else None
        return ir.If(c, then, orelse)

    def visit_Kernel(self, s: ir.Kernel) -> ir.Stmt:
        saved = dict(self.bounds)
        self.bounds.update(kernel_bounds(s))
        body = self.stmt(s.body)
        self.bounds = saved
        return replace(s, body=body)

    def visit_LetStmt(self, s: ir.LetStmt) -> ir.Stmt:
        v = self.expr(s.value)
        if isinstance(v, (ir.Const, ir.Var)):
            return self.stmt(ir.substitute(s.body, {s.var.name: v}))  # type: ignore[arg-type]
        saved = self.bounds.pop(s.var.name, None)
        self.bounds[s.var.name] = self.interval(v)
        body = self.stmt(s.body)
        self.bounds.pop(s.var.name, None)
        if saved is not None:
            self.bounds[s.var.name] = saved
        return ir.LetStmt(s.var, v, body)


def _ramp_arith(op: str, a: ir.Expr, b: ir.Expr) -> ir.Expr | None:
    """Keep index vectors as ramps: ramp + scalar, scalar + ramp, ramp * constant."""
    if op == "+" and isinstance(a, ir.Ramp) and b.lanes == 1:
        return ir.Ramp(ir.BinOp("+", a.base, b), a.stride, a.lanes)
    if op == "+" and isinstance(b, ir.Ramp) and a.lanes == 1:
        return ir.Ramp(ir.BinOp("+", a, b.base), b.stride, b.lanes)
    if op == "-" and isinstance(a, ir.Ramp) and b.lanes == 1:
        return ir.Ramp(ir.BinOp("-", a.base, b), a.stride, a.lanes)
    if op == "*" and isinstance(a, ir.Ramp) and isinstance(b, ir.Const) and b.lanes == 1:
        return ir.Ramp(ir.BinOp("*", a.base, b), ir.BinOp("*", a.stride, b), a.lanes)
    if op == "*" and isinstance(b, ir.Ramp) and isinstance(a, ir.Const) and a.lanes == 1:
        return ir.Ramp(ir.BinOp("*", a, b.base), ir.BinOp("*", a, b.stride), b.lanes)
    return None


_CMP_FN = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
           ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _decide(op: str, lo: float, hi: float) -> bool | None:
    """Decide ``d op 0`` for d in [lo, hi]."""
    if op == "<":
        return True if hi < 0 else False if lo >= 0 else None
    if op == "<=":
        return True if hi <= 0 else False if lo > 0 else None
    if op == ">":
        return True if lo > 0 else False if hi <= 0 else None
    if op == ">=":
        return True if lo >= 0 else False if hi < 0 else None
    if op == "==":
        return True if lo == hi == 0 else False if (lo > 0 or hi < 0) else None
    if op == "!=":
        return False if lo == hi == 0 else True if (lo > 0 or hi < 0) else None
    return None


def _fold(op: str, a: ir.Const, b: ir.Const, dtype: dtypes.DType) -> ir.Const | None:
    x, y = a.value, b.value
    try:
        if op == "+":
            v = x + y
        elif op == "-":
            v = x - y
        elif op == "*":
            v = x * y
        elif op == "/":
            v = x / y
        elif op in ("//", "div"):
            v = x // y
        elif op in ("%", "mod"):
            v = x % y
        elif op in ("min", "max"):  # a NaN operand gives NaN, as the generated code's (codegen.c_like)
            v = x if x != x else y if y != y else min(x, y) if op == "min" else max(x, y)
        else:
            return None
    except (ZeroDivisionError, OverflowError):
        return None
    if not dtype.is_float and not dtype.is_bool:  # integers wrap to their type, as the generated code's
        v = dtypes.wrap_int(int(v), dtype)
    return ir.Const(v, dtype)


def kernel_bounds(s: ir.Kernel) -> dict[str, Interval]:
    """The intervals of a kernel's thread and block indices."""
    out: dict[str, Interval] = {}
    for axis, n in zip("xyz", s.block):
        out[f"threadIdx.{axis}"] = (0, n - 1)
        out[f"blockIdx.{axis}"] = (0, INF)
    return out


def simplify(s: ir.Stmt) -> ir.Stmt:
    """Simplify every expression and statement of ``s``."""
    return Simplifier().stmt(s)


def simplify_expr(e: ir.Expr, bounds: dict[str, Interval] | None = None) -> ir.Expr:
    simp = Simplifier()
    if bounds:
        simp.bounds.update(bounds)
    return simp.expr(e)
