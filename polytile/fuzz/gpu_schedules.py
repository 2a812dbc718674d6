"""Random GPU schedules for ``polytile fuzz --target cuda``: every computation's loops mapped onto
the grid and the block (outer loops to ``blockIdx``, inner ones to ``threadIdx``, at most
``BLOCK_THREADS`` threads a block), now and then a reduction loop bound to threads after
``reassociate()`` (a cross-thread reduction), then primitives drawn around the mapping: caches in
shared or local memory at the bound loops, unroll, vectorize, splits, fusion.

Calls are texts applied one at a time, as ``schedules`` does for the CPU: a refused one is legal and
the case goes on (a later call naming the loops it would have made is refused too).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..schedule.state import Schedule
from .schedules import Applied, ScheduleGenerator, apply

BLOCK_THREADS = 1024
THREAD_FACTORS = (1, 2, 3, 4, 5, 7, 8, 16, 32, 64, 128, 256)
THREAD_WEIGHTS = (1, 3, 1, 4, 1, 1, 4, 4, 4, 2, 1, 0.5)
CROSS_THREAD = 0.5
"""How often a reduction gets one of its loops bound to threads (after ``reassociate()``)."""
INSIDE_TREE = 0.25
"""How often a cross-thread reduction keeps one of its data loops inside the thread-bound loop (the
shape of the lead's miscompile of 31a2c35, refused since)."""
LOCS = ("shared", "local", "global", "auto")
LOC_WEIGHTS = (4, 3, 1, 1)

GPU_PRIMITIVES = {
    "split": 4, "tile": 1, "reorder": 2, "fuse": 0.5, "shift": 0.5, "reverse": 0.5, "after": 3, "before": 1,
    "vectorize": 2, "unroll": 3, "compute_inline": 2, "reassociate": 0.5, "cache": 2, "cache_identity": 4,
    "cache_write": 4, "store_at": 0.5, "set_loc": 1.5,
}
"""The primitives drawn around the mapping (no ``parallel``: a CPU tag)."""


class GpuScheduleGenerator(ScheduleGenerator):
    """``ScheduleGenerator`` with the GPU's primitives, memory locations, and the mapping of loops
    onto blocks and threads."""

    primitives = GPU_PRIMITIVES

    def loc(self) -> str:
        return str(self.pick(LOCS, LOC_WEIGHTS))

    def p_cache_identity(self, s: Schedule, stage: str) -> str | None:
        t = self.read_tensor(s, stage)
        return None if t is None else f'cache_identity("{t}", {self.level(s, stage, 0.1)}, loc="{self.loc()}")'

    def p_cache(self, s: Schedule, stage: str) -> str | None:
        t = self.read_tensor(s, stage)
        if t is None:
            return None
        layout = self.layout(self.ndim_of(s, t)) if self.rng.random() < 0.5 else None
        extra = f", layout={layout}" if layout else ""
        return f'cache("{t}", {self.level(s, stage, 0.1)}{extra}, loc="{self.loc()}")'

    def p_cache_write(self, s: Schedule, stage: str) -> str | None:
        return f'cache_write({self.level(s, stage, 0.1)}, loc="{self.loc()}")'

    def p_set_loc(self, s: Schedule, stage: str) -> str | None:
        return f'set_loc("{self.loc()}")'

    def threads(self, left: int, warp_part: bool = False) -> int:
        """A thread count of one block dimension, at most ``left``; ``warp_part``: mostly a power of
        two up to 32 (the lanes of a cross-thread reduction that is not the whole block)."""
        fits = [(f, w) for f, w in zip(THREAD_FACTORS, THREAD_WEIGHTS) if f <= left
                and (not warp_part or f in (1, 2, 4, 8, 16, 32) or self.rng.random() < 0.1)]
        return int(self.pick([f for f, _ in fits], [w for _, w in fits]))

    def mapping(self, s: Schedule, stage: str) -> list[str]:
        """The calls that map ``stage``'s loops onto the grid and the block: some of its data loops
        split, outer parts to ``blockIdx.x/y``, inner parts to ``threadIdx.x/y/z`` (a loop mapped
        whole to the grid now and then), maybe a reduction loop split with its inner part on a thread
        axis of its own, then a reorder: blocks, threads, the rest."""
        comp = s.computation(stage)
        loops = s[stage].loops
        data = [a.name for a in comp.axes if a.name in loops]
        reduce = [] if comp.reduction is None else [a.name for a in comp.reduction.axes if a.name in loops]
        if not data and not reduce:
            return []
        at = f's["{stage}"]'
        calls: list[str] = []
        n = min(len(data), int(self.pick([1, 2, 3], [4, 4, 1])))
        chosen = sorted(self.rng.choice(len(data), size=n, replace=False).tolist()) if n else []
        bound_data = [data[k] for k in chosen]
        cross = reduce and n < 3 and self.rng.random() < CROSS_THREAD
        thread_axes = list("xyz")[:n + bool(cross)]
        if cross:  # the reduction's lanes: mostly x (warp shuffles), else an outer axis
            red_axis = thread_axes.pop(0 if self.rng.random() < 0.7 else -1)
        blocks, threads, inside = [], [], []
        left = BLOCK_THREADS
        for k, loop in enumerate(reversed(bound_data)):  # the innermost chosen loop gets threadIdx.x
            axis = thread_axes[k]
            grid = "xyz"[len(blocks)] if len(blocks) < 2 or self.rng.random() < 0.3 else None
            if grid is not None and self.rng.random() < 0.15:  # the whole loop onto the grid
                calls.append(f'{at}.bind("{loop}", "blockIdx.{grid}")')
                blocks.insert(0, loop)
                continue
            f = self.threads(left, warp_part=bool(cross) and axis == "x")
            left //= f
            outer, inner = f"{loop}_b", f"{loop}_t"
            calls.append(f'{at}.split("{loop}", {f}, "{outer}", "{inner}")')
            if grid is not None:
                calls.append(f'{at}.bind("{outer}", "blockIdx.{grid}")')
                blocks.insert(0, outer)
            else:
                inside.append(outer)
            calls.append(f'{at}.bind("{inner}", "threadIdx.{axis}")')
            threads.insert(0, inner)
        if cross:
            loop = str(self.pick(reduce))
            f = self.threads(left, warp_part=red_axis == "x" and n > 0)
            calls.append(f"{at}.reassociate()")
            calls.append(f'{at}.split("{loop}", {f}, "{loop}_s", "{loop}_t")')
            calls.append(f'{at}.bind("{loop}_t", "threadIdx.{red_axis}")')
            threads.append(f"{loop}_t")
            inside.append(f"{loop}_s")
        rest = [x for x in loops if x not in bound_data and x not in (reduce if cross else [])]
        if cross and rest and self.rng.random() < INSIDE_TREE:  # a data loop inside the reduction's threads
            moved = [x for x in rest if x in data]
            if moved:
                order = blocks + threads[:-1] + inside + [x for x in rest if x not in moved] + [threads[-1]] + moved
                calls.append(f"{at}.reorder({', '.join(repr(x) for x in order)})".replace("'", '"'))
                return calls
        order = blocks + threads + inside + rest
        if len(order) > 1:
            calls.append(f"{at}.reorder({', '.join(repr(x) for x in order)})".replace("'", '"'))
        return calls


def generate_calls(rng: np.random.Generator, s: Schedule, namespace: dict,
                   on_call: Callable[[str, Applied], bool]) -> None:
    """Draw and apply a GPU schedule to ``s``: a few primitives before the mapping (inlining,
    reversal, shifts), the mapping of every computation, then a few primitives around it;
    ``on_call`` sees each call and returns False to stop (after an internal error)."""
    gen = GpuScheduleGenerator(rng)

    def run(text: str) -> bool:
        applied = apply(s, text, namespace)
        if applied.outcome == "accepted" and (".after(" in text or ".before(" in text):
            gen.fused_with(s, text)
        return on_call(text, applied)

    for _ in range(int(gen.pick([0, 1, 2], [6, 3, 1]))):
        stage = gen.pick(s.stage_names())
        prim = gen.pick(["compute_inline", "reverse", "shift", "reassociate"], [3, 1, 1, 1])
        text = getattr(gen, f"p_{prim}")(s, stage)
        if text is not None and not run(f's["{stage}"].{text}'):
            return
    for stage in list(s.stage_names()):
        if stage in s.stage_names():
            for text in gen.mapping(s, stage):
                if not run(text):
                    return
    left = int(gen.pick([0, 1, 2, 3, 4], [3, 4, 3, 2, 1]))
    while left > 0 or gen.follow_up:
        left -= not gen.follow_up
        if not run(gen.call(s)):
            return
