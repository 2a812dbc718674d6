"""compute_inline: substitute an elementwise computation into the expressions of its consumers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..lang.expr import Expr, Load, rebuild, substitute, walk
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
    for other in sched.computations:
        if other.where is not None and any(isinstance(n, Load) and n.tensor is comp for n in walk(other.where)):
            raise ScheduleError(f"computation {name} is read by the where= of {other.name}; a where= condition "
                                f"reads computed tensors, not inlined ones: keep {name} a computation")
    for other, st in sched.states.items():
        if st.anchor is not None and st.anchor.other == name:
            raise ScheduleError(f"computation {other} is placed relative to {name}; inline {name} first")
    if any(c.consumer == name for c in sched.caches):
        raise ScheduleError(f"computation {name} has caches of its own; inline it before adding them")
    cached = [c for c in sched.caches if c.tensor == name]
    if cached:
        return _inline_into_caches(sched, name, cached)
    sched.inlined.append(name)  # Stage.compute_inline puts everything back if the rebuild fails
    sched.rebuild()
    return sched


def _inline_into_caches(sched: Schedule, name: str, cached: list) -> Schedule:  # noqa: ANN001 - CacheSpecs
    """ALCOP's order (cache reads and tiling first, inlining after): an elementwise producer whose
    every consumer reads it through a cache is computed inside those caches' copies — the copy of
    ``col = select(inside, I[...], 0)`` reads ``I`` directly (with zeros where the select says so)
    and stays an asynchronous copy. Its consumers keep reading the cache."""
    readers = [c.name for c in sched.computations if c.name != name and any(
        isinstance(n, Load) and n.tensor.name == name for n in _walk(sched.bodies[c.name]))]
    served = {r for c in cached for r in (c.consumer, *c.also)}
    missing = [r for r in readers if r not in served]
    if missing:
        raise ScheduleError(f"computation {name} is read by {', '.join(missing)} without a cache; inline it "
                            f"before caching, or cache it for every reader")
    sched.virtual.append(name)
    sched.rebuild()
    return sched


def _walk(e: Expr) -> list[Expr]:
    out: list[Expr] = []

    def visit(n: Expr) -> Expr | None:
        out.append(n)
        return None
    rebuild(e, visit)
    return out
