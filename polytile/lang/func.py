"""A function: the inputs, outputs and constraints of an algorithm, with its computations in order."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import LanguageError
from .expr import Expr, IterVar, Load, Param, Reduce, Var, as_expr, walk
from .names import check_function_name
from .tensor import ComputeTensor, Placeholder, Tensor


class Func:
    """``pt.Func(inputs, outputs, constraints=[...])``.

    ``computations`` lists every computed tensor reachable from the outputs, producers first.
    ``constraints`` are boolean expressions over parameters (``N >= 1``, ``N % 8 == 0``) that the
    polyhedral model may assume; they are checked when the kernel is called.
    """

    def __init__(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor] | Tensor,
                 constraints: Sequence[Expr] = (), name: str = "func"):
        self.name = check_function_name(name)
        outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
        self.inputs: list[Placeholder] = []
        for t in inputs:
            if not isinstance(t, Placeholder):
                raise LanguageError(f"Func {name}: input {getattr(t, 'name', t)!r} is not a placeholder; "
                                    "inputs are made with pt.placeholder")
            if any(t is x for x in self.inputs):
                raise LanguageError(f"Func {name}: input {t.name} is listed twice; list each input once")
            self.inputs.append(t)
        for k, t in enumerate(outs):
            if any(t is x for x in outs[:k]):
                raise LanguageError(f"Func {name}: output {t.name} is listed twice; list each output once")
            if not isinstance(t, ComputeTensor):
                raise LanguageError(f"Func {name}: output {getattr(t, 'name', t)!r} is not a computed tensor")
        if not outs:
            raise LanguageError(f"Func {name} has no outputs")
        self.outputs: list[ComputeTensor] = outs  # type: ignore[assignment]
        self.computations = _topological(self.outputs)
        self._check_inputs()
        self._check_names()
        self.constraints = [self._check_constraint(c) for c in constraints]
        self.params = self._collect_params()
        self._check_param_names()

    # --- analysis -------------------------------------------------------------------------------
    def _check_inputs(self) -> None:
        known = {id(t) for t in self.inputs}
        for comp in self.computations:
            for t in comp.inputs():
                if isinstance(t, Placeholder) and id(t) not in known:
                    raise LanguageError(f"Func {self.name}: computation {comp.name} reads {t.name}, which is "
                                        "not among the inputs; add it to the inputs list")
            _check_axes(comp)

    def _check_names(self) -> None:
        seen: dict[str, Tensor] = {}
        for t in [*self.inputs, *self.computations]:
            if not t.name.isidentifier():
                raise LanguageError(f"tensor name {t.name!r} is not an identifier")
            if t.name in seen and seen[t.name] is not t:
                raise LanguageError(f"Func {self.name}: two tensors are named {t.name}; give them distinct names")
            seen[t.name] = t

    def _check_param_names(self) -> None:
        """Tensors and parameters are arguments of one generated function, and axes share the
        polyhedral model's name space with parameters: their names must differ."""
        tensors = {t.name for t in self.tensors}
        params = {p.name for p in self.params}
        for p in self.params:
            if p.name in tensors:
                raise LanguageError(f"Func {self.name}: parameter {p.name} has the name of a tensor; rename one")
        for comp in self.computations:
            for ax in (*comp.axes, *comp.reduce_axes):
                if ax.name in params or re.fullmatch(r"_d\d+", ax.name):
                    raise LanguageError(f"computation {comp.name}: axis {ax.name} has the name of a parameter"
                                        + ("" if ax.name in params else " of data-dependent bounds") + "; rename it")

    def _check_constraint(self, c: object) -> Expr:
        e = as_expr(c)  # type: ignore[arg-type]
        if not e.dtype.is_bool:
            raise LanguageError(f"Func {self.name}: constraint {e} is not a boolean expression")
        for n in walk(e):
            if isinstance(n, (Load, IterVar)):
                raise LanguageError(f"Func {self.name}: constraint {e} may only use parameters and integers")
        return e

    def _collect_params(self) -> list[Param]:
        found: dict[str, Param] = {}

        def visit(e: Expr) -> None:
            for n in walk(e):
                if isinstance(n, Param):
                    if n.name in found and found[n.name] is not n:
                        raise LanguageError(f"Func {self.name}: two parameters are named {n.name}")
                    found[n.name] = n
                if isinstance(n, IterVar) and n.is_reduce:
                    visit(n.lo)
                    visit(n.hi)

        for t in [*self.inputs, *self.computations]:
            for s in t.shape:
                visit(s)
        for t in self.inputs:
            if t.value_range is not None:
                visit(t.value_range[0])
                visit(t.value_range[1])
        for comp in self.computations:
            visit(comp.body)
            for extra in (comp.where, comp.epilogue):
                if extra is not None:
                    visit(extra)
        for c in self.constraints:
            visit(c)
        return sorted(found.values(), key=lambda p: p.name)

    @property
    def tensors(self) -> list[Tensor]:
        return [*self.inputs, *self.computations]

    def tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise LanguageError(f"Func {self.name} has no tensor named {name!r}; it has "
                            + ", ".join(t.name for t in self.tensors))

    def consumers(self, tensor: Tensor) -> list[ComputeTensor]:
        return [c for c in self.computations if any(t is tensor for t in c.inputs())]

    def __repr__(self) -> str:
        return f"Func({self.name}: {[t.name for t in self.inputs]} -> {[t.name for t in self.outputs]})"


def _topological(outputs: Sequence[ComputeTensor]) -> list[ComputeTensor]:
    order: list[ComputeTensor] = []
    state: dict[int, str] = {}

    def visit(t: ComputeTensor) -> None:
        s = state.get(id(t))
        if s == "done":
            return
        if s == "active":
            raise LanguageError(f"computation {t.name} depends on itself")
        state[id(t)] = "active"
        for dep in t.inputs():
            if isinstance(dep, ComputeTensor):
                visit(dep)
        state[id(t)] = "done"
        order.append(t)

    for o in outputs:
        visit(o)
    return order


def _check_axes(comp: ComputeTensor) -> None:
    """Reduce axes appear only inside their reduction; data axes only of this computation."""
    own = {id(a) for a in comp.axes} | {id(a) for a in comp.reduce_axes}
    red = comp.reduction
    roots: list[tuple[str, Expr]] = [("body", red.body if red is not None else comp.body)]
    if comp.where is not None:
        roots.append(("where", comp.where))
    if red is not None and red.where is not None:
        roots.append(("reduction condition", red.where))
    for what, root in roots:
        for n in walk(root):
            if isinstance(n, IterVar) and id(n) not in own:
                if n.is_reduce:
                    raise LanguageError(f"computation {comp.name} uses reduce axis {n.name} outside a reduction "
                                        f"over it; wrap the expression in pt.sum/max/min(..., axis={n.name})")
                raise LanguageError(f"computation {comp.name}: its {what} uses axis {n.name} of another "
                                    "computation; use this computation's own lambda arguments")
            if isinstance(n, Reduce) and n is not red:
                raise LanguageError(f"computation {comp.name}: a reduction must be the whole body")
    for k, ax in enumerate(comp.reduce_axes):
        allowed = {id(a) for a in comp.axes} | {id(a) for a in comp.reduce_axes[:k]}
        for b in (ax.lo, ax.hi):
            for n in walk(b):
                if isinstance(n, IterVar) and id(n) not in allowed:
                    raise LanguageError(f"computation {comp.name}: bound {b} of reduce axis {ax.name} uses "
                                        f"{n.name}, which is not an enclosing axis")
                if isinstance(n, Var) and not isinstance(n, (IterVar, Param)):
                    raise LanguageError(f"computation {comp.name}: unknown variable {n.name} in a bound")
