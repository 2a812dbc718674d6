"""Turning algorithm expressions into isl's affine syntax, with non-affine parts named as parameters.

``Affine`` is an exact quasi-affine form: integer coefficients over named atoms (variables, or
floor/mod terms of other forms). Anything else (a tensor read, a product of variables) is
``NotAffine``, or, where the caller allows it, a *dynamic parameter*: a fresh isl parameter whose
value is the expression, read at run time where the loops it depends on are fixed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .. import dtypes
from ..lang.expr import BinOp, Call, Cast, Cmp, Const, Expr, IterVar, Load, Logic, Not, Param, Var, walk
from ..lang.printer import expr_str


class NotAffine(Exception):
    """The expression cannot be written as an isl quasi-affine expression."""


@dataclass(frozen=True)
class Affine:
    terms: tuple[tuple[str, int], ...]  # sorted (atom, coefficient), no zero coefficients
    const: int

    @staticmethod
    def of(terms: dict[str, int], const: int) -> Affine:
        return Affine(tuple(sorted((a, c) for a, c in terms.items() if c != 0)), const)

    @property
    def is_const(self) -> bool:
        return not self.terms

    def scaled(self, k: int) -> Affine:
        return Affine.of({a: c * k for a, c in self.terms}, self.const * k)

    def plus(self, other: Affine, sign: int = 1) -> Affine:
        terms = dict(self.terms)
        for a, c in other.terms:
            terms[a] = terms.get(a, 0) + sign * c
        return Affine.of(terms, self.const + sign * other.const)

    def atoms(self) -> set[str]:
        return {a for a, _ in self.terms}

    def __str__(self) -> str:
        parts = []
        for a, c in self.terms:
            parts.append(a if c == 1 else f"-{a}" if c == -1 else f"{c}*{a}")
        if self.const or not parts:
            parts.append(str(self.const))
        return "(" + " + ".join(parts).replace("+ -", "- ") + ")"


@dataclass
class DynParams:
    """Non-affine bound expressions named as isl parameters ``_d0, _d1, …``, shared within a program."""

    exprs: dict[str, Expr] = field(default_factory=dict)  # name -> expression
    owners: dict[str, str] = field(default_factory=dict)  # name -> computation whose iterators it reads
    keys: dict[str, str] = field(default_factory=dict)  # owner and structural text -> name

    def name_for(self, e: Expr, owner: str) -> str:
        key = f"{owner}:{expr_str(e)}"
        if key not in self.keys:
            name = f"_d{len(self.exprs)}"
            self.keys[key] = name
            self.exprs[name] = e
            self.owners[name] = owner
        return self.keys[key]


Namer = Callable[[Var], str]


def affine(e: Expr, name_of: Namer, dyn: DynParams | None = None, owner: str = "") -> Affine:
    """The affine form of integer expression ``e``; non-affine parts become dynamic parameters when
    ``dyn`` is given, else raise NotAffine.

    isl computes exactly, but arithmetic and casts in a type narrower than the iterators' wrap (as
    NumPy's do and the generated code does): ``int8(j) * 17`` is -120 at j = 8. Such a part is affine
    only where it is a constant (wrapped here); otherwise it is computed at run time like a tensor's
    value (project fuzzer seed 141 case 278, a ``where=`` of it kept 0 of the 5 elements NumPy keeps)."""
    if not _may_wrap(e):
        return _exact_affine(e, name_of, dyn, owner)
    try:
        form = _exact_affine(e, name_of, None, owner)
    except NotAffine:
        form = None
    if form is not None and form.is_const:
        return Affine.of({}, dtypes.wrap_int(form.const, e.dtype))
    if dyn is not None:
        return Affine.of({dyn.name_for(e, owner): 1}, 0)
    raise NotAffine(f"{expr_str(e)} is computed in {e.dtype}, where it may wrap")


def _may_wrap(e: Expr) -> bool:
    """Whether ``e`` is integer arithmetic or a cast whose type may not hold its exact value."""
    if not e.dtype.is_int or e.dtype.bits >= dtypes.INDEX.bits and e.dtype.kind == "int":
        return False
    if isinstance(e, Cast):
        a = e.a.dtype
        widening = a.is_bool or a.is_int and (a.kind == e.dtype.kind and a.bits <= e.dtype.bits
                                                or a.kind == "uint" and a.bits < e.dtype.bits)
        return not widening
    return isinstance(e, BinOp)


def _exact_affine(e: Expr, name_of: Namer, dyn: DynParams | None, owner: str) -> Affine:
    if isinstance(e, Const):
        if not (e.dtype.is_int or e.dtype.is_bool):
            raise NotAffine(f"{e} is not an integer")
        return Affine.of({}, int(e.value))
    if isinstance(e, Var):
        return Affine.of({name_of(e): 1}, 0)
    if isinstance(e, Cast) and e.dtype.is_int and e.a.dtype.is_int:
        return affine(e.a, name_of, dyn, owner)
    if isinstance(e, BinOp) and e.dtype.is_int:
        try:
            a = affine(e.a, name_of, dyn, owner)
            b = affine(e.b, name_of, dyn, owner)
            if e.op == "+":
                return a.plus(b)
            if e.op == "-":
                return a.plus(b, -1)
            if e.op == "*":
                if a.is_const:
                    return b.scaled(a.const)
                if b.is_const:
                    return a.scaled(b.const)
            if e.op in ("//", "%") and b.is_const and b.const > 0:
                if a.is_const:
                    return Affine.of({}, a.const // b.const if e.op == "//" else a.const % b.const)
                atom = f"floor({a}/{b.const})" if e.op == "//" else f"({a} mod {b.const})"
                return Affine.of({atom: 1}, 0)
        except NotAffine:
            if dyn is None:
                raise
    if dyn is not None and e.dtype.is_int:
        return Affine.of({dyn.name_for(e, owner): 1}, 0)
    raise NotAffine(f"{expr_str(e)} is not affine")


_CMP = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "="}
_FLIP = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def condition(e: Expr, name_of: Namer, negate: bool = False) -> str:
    """An isl constraint string for a boolean expression of affine comparisons; raise NotAffine."""
    if isinstance(e, Not):
        return condition(e.a, name_of, not negate)
    if isinstance(e, Logic):
        op = e.op
        if negate:
            op = "||" if op == "&&" else "&&"
        a = condition(e.a, name_of, negate)
        b = condition(e.b, name_of, negate)
        return f"({a} {'and' if op == '&&' else 'or'} {b})"
    if isinstance(e, Const) and e.dtype.is_bool:
        return "1 = 1" if bool(e.value) != negate else "1 = 0"
    if isinstance(e, Cmp):
        op = _FLIP[e.op] if negate else e.op
        a, b = affine(e.a, name_of), affine(e.b, name_of)
        if op == "!=":
            return f"({a} < {b} or {a} > {b})"
        return f"{a} {_CMP[op]} {b}"
    raise NotAffine(f"{expr_str(e)} is not a condition on affine expressions")


def is_affine_condition(e: Expr, name_of: Namer) -> bool:
    try:
        condition(e, name_of)
        return True
    except NotAffine:
        return False


def minmax_bounds(e: Expr) -> tuple[str, list[Expr]]:
    """Split ``min(a, b, …)`` / ``max(…)`` bounds into their operands (each bound separately)."""
    if isinstance(e, Call) and e.name in ("min", "max"):
        out: list[Expr] = []
        for a in e.args:
            kind, parts = minmax_bounds(a)
            if kind in (e.name, "one"):
                out += parts
            else:
                out.append(a)
        return e.name, out
    return "one", [e]


def uses_loads(e: Expr) -> bool:
    return any(isinstance(n, Load) for n in walk(e))


def iter_vars(e: Expr) -> list[IterVar]:
    seen: dict[int, IterVar] = {}
    for n in walk(e):
        if isinstance(n, IterVar):
            seen.setdefault(id(n), n)
    return list(seen.values())


def params_of(e: Expr) -> list[Param]:
    return [n for n in walk(e) if isinstance(n, Param)]
