"""The unroll budget: how much code the ``unroll`` tags of a schedule may ask for.

Lowering unrolls a tagged loop of constant extent up to ``MAX_UNROLL`` iterations into copies of its
body. Copies of straight-line statements are cheap, but copies of a body that still holds loops (a
data-dependent reduction, a cache's copy loops) multiply code the C compiler optimizes loop by loop:
496 copies of a reduction loop and of its cache's copy nest took g++ over three minutes
(independent fuzzer seed 7, case 3189). ``check_unroll_budget`` refuses such a schedule when its
tags are set, where the user can still choose other loops to unroll.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

from ..errors import ScheduleError

if TYPE_CHECKING:
    from .state import Schedule

MAX_UNROLL = 512  # a loop unrolls when its extent is constant and at most this; a longer one stays a loop
MAX_UNROLLED_LOOPS = 128  # loops the unrolled copies of one computation's loops may hold together

_NOT_LOOPS = ("unroll", "vectorize")  # vectorized loops become SIMD operations (or, on GPUs, are unrolled)


def check_unroll_budget(sched: Schedule, name: str) -> None:
    """Raise ScheduleError when unrolling the loops of computation ``name`` copies more loops than
    ``MAX_UNROLLED_LOOPS``: each loop left inside unrolled loops (not unrolled, not vectorized)
    counts once per copy, and so does each loop of the copy nests of its caches placed there
    (register caches, ``loc="local"``, are unrolled with their loops and count as statements), as
    does the write cache lowering gives a reduction stored narrower than it sums (fuzz seed 21 case 8345)."""
    st = sched.states[name]
    if "unroll" not in st.tags.values():
        return
    names = st.loops.names
    unrolled = {p: _unrolled_extent(sched, name, p) for p, lp in enumerate(names) if st.tags.get(lp) == "unroll"}
    extents = [unrolled.get(p) or 1 for p in range(len(names))]
    copied: list[tuple[str, int, int]] = []  # what stays a loop, the copies made of it, the loops it is
    for p, lp in enumerate(names):
        copies = prod(extents[:p])
        if copies > 1 and (st.tags.get(lp) not in _NOT_LOOPS or p in unrolled and unrolled[p] is None):
            copied.append((f"loop {lp}", copies, 1))
    caches = [(c.name, c.tensor, c.level) for c in sched.caches
              if name in (c.consumer, *c.also) and c.level in names and c.loc != "local"]
    from .memory import pending_sum_cache  # memory imports this module
    loop = pending_sum_cache(sched, name)
    if loop:  # the write cache lowering will add (cache_narrowed_sums), at a loop
        caches.append((f"{name}_local", name, loop))
    for cname, tensor, level in caches:
        copies = prod(extents[:names.index(level) + 1])
        if copies > 1:
            ndim = len(sched.func.tensor(tensor).shape)
            copied.append((f"the {ndim} copy loops of cache {cname}", copies, ndim))
    total = sum(copies * loops for _, copies, loops in copied)
    if total > MAX_UNROLLED_LOOPS:
        loops = [names[p] for p, e in unrolled.items() if e]
        what = ", ".join(f"{copies} copies of {thing}" for thing, copies, _ in copied)
        raise ScheduleError(
            f"unrolling loop{'s' if len(loops) > 1 else ''} {', '.join(loops)} of {name} makes {what}: "
            f"{total} loops in all, over the budget of {MAX_UNROLLED_LOOPS}; unroll fewer or shorter loops "
            "(split a loop and unroll its inner part), or unroll the loops inside them first")


def _unrolled_extent(sched: Schedule, name: str, pos: int) -> int | None:
    """How many copies lowering makes of loop ``pos`` of ``name``, tagged ``unroll`` (an upper bound:
    the loop's range over all iterations); None where it stays a loop (no constant range, or longer
    than ``MAX_UNROLL``)."""
    lo, hi = sched.program.loop_range(name, sched.states[name].loops, pos)
    if lo is None or hi is None or hi - lo + 1 > MAX_UNROLL:
        return None
    return max(hi - lo + 1, 1)
