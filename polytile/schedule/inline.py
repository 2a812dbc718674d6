"""compute_inline: substitute an elementwise computation into the expressions of its consumers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..lang.expr import Expr, Load, rebuild, substitute
from ..lang.func import Func
from ..lang.tensor import ComputeTensor

if TYPE_CHECKING:
    from .state import Schedule


def inline_bodies(func: Func, inlined: list[str]) -> dict[str, Expr]:
    """Bodies of the remaining computations with every inlined producer substituted."""
    by_name = {c.name: c for c in func.computations}
    done: dict[str, Expr] = {}

    def body_of(comp: ComputeTensor) -> Expr:
        if comp.name in done:
            return done[comp.name]

        def repl(n: Expr) -> Expr | None:
            if isinstance(n, Load) and n.tensor.name in inlined:
                prod = by_name[n.tensor.name]
                inner = body_of(prod)
                mapping = {ax: rebuild(i, repl) for ax, i in zip(prod.axes, n.indices)}
                return substitute(inner, mapping)  # type: ignore[arg-type]
            return None

        out = rebuild(comp.body, repl)
        done[comp.name] = out
        return out

    return {c.name: body_of(c) for c in func.computations if c.name not in inlined}


def compute_inline(sched: Schedule, name: str) -> Schedule:
    comp = sched.computation(name)
    if comp.reduction is not None:
        raise ScheduleError(f"computation {name} is a reduction and cannot be inlined; fuse it with after/before")
    if any(o is comp for o in sched.func.outputs):
        raise ScheduleError(f"computation {name} is an output of Func {sched.func.name} and cannot be inlined")
    if comp.where is not None:
        raise ScheduleError(f"computation {name} has a where= domain and cannot be inlined")
    for other, st in sched.states.items():
        if st.anchor is not None and st.anchor.other == name:
            raise ScheduleError(f"computation {other} is placed relative to {name}; inline {name} first")
    if any(c.tensor == name or c.consumer == name for c in sched.caches):
        raise ScheduleError(f"computation {name} has caches; inline it before adding caches")
    old_inlined, old_states = list(sched.inlined), dict(sched.states)
    sched.inlined.append(name)
    try:
        sched.rebuild()
    except Exception:
        sched.inlined = old_inlined
        sched.states = old_states
        sched.rebuild()
        raise
    return sched
