"""Loop primitives: split, tile, reorder, fuse, skew, shift, reverse, separate and any affine map."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ScheduleError
from .transaction import transactional

if TYPE_CHECKING:
    from .state import Stage


def _untagged(tags: dict[str, str], *loops: str) -> dict[str, str]:
    for loop in loops:
        if loop in tags:
            raise ScheduleError(f"loop {loop} is tagged {tags[loop]}; transform loops before tagging them")
    return tags


@transactional
def split(self: Stage, loop: str, factor: int, outer: str | None = None, inner: str | None = None) -> Stage:
    """Split ``loop`` into ``outer`` (iterations / factor) and ``inner`` (0..factor-1).

    Default names append "o" and "i" (``i`` gives ``io`` and ``ii``).
    """
    st = self.schedule.state_copy(self.name)
    st.loops = st.loops.split(loop, factor, outer, inner)
    _untagged(st.tags, loop)
    st.separate.discard(loop)
    self.schedule.commit(self.name, st)
    return self


@transactional
def tile(self: Stage, outer_loop: str, inner_loop: str, outer_factor: int, inner_factor: int,
         names: Sequence[str] | None = None) -> Stage:
    """Tile two nested loops: split both and move the two tile loops outside the point loops."""
    if names is not None and len(names) != 4:
        raise ScheduleError(f"tile of {self.name}: give four names (outer-tile, inner-tile, outer-point, "
                            f"inner-point), got {list(names)}")
    n = list(names) if names else [None] * 4
    sched = self.state.loops
    p, q = sched.index(outer_loop), sched.index(inner_loop)
    if q != p + 1:
        raise ScheduleError(f"tile of {self.name}: loop {inner_loop} must be directly inside {outer_loop}")
    st = self.schedule.state_copy(self.name)
    loops = st.loops.split(outer_loop, outer_factor, n[0], n[2])
    oo, oi = loops.names[p], loops.names[p + 1]
    loops = loops.split(inner_loop, inner_factor, n[1], n[3])
    io, ii = loops.names[p + 2], loops.names[p + 3]
    st.loops = loops.reorder([oo, io, oi, ii])
    _untagged(st.tags, outer_loop, inner_loop)
    st.separate -= {outer_loop, inner_loop}
    self.schedule.commit(self.name, st)
    return self


@transactional
def reorder(self: Stage, *loops: str) -> Stage:
    """Put the named loops in the given order (the positions they occupy are reused)."""
    order = list(loops[0]) if len(loops) == 1 and isinstance(loops[0], (list, tuple)) else list(loops)
    st = self.schedule.state_copy(self.name)
    st.loops = st.loops.reorder(order)
    self.schedule.commit(self.name, st)
    return self


@transactional
def fuse(self: Stage, outer: str, inner: str, name: str | None = None) -> Stage:
    """Merge two directly nested loops into one (the inner one needs a constant extent)."""
    st = self.schedule.state_copy(self.name)
    st.loops = st.loops.fuse(outer, inner, self.schedule.program.statements[self.name].over_domain(), name)
    _untagged(st.tags, outer, inner)
    st.separate -= {outer, inner}
    self.schedule.commit(self.name, st)
    return self


@transactional
def skew(self: Stage, outer: str, inner: str, factor: int = 1) -> Stage:
    """Replace loop ``inner`` by ``inner + factor * outer`` (wavefronts for stencils)."""
    st = self.schedule.state_copy(self.name)
    st.loops = st.loops.skew(outer, inner, factor)
    self.schedule.commit(self.name, st)
    return self


@transactional
def shift(self: Stage, loop: str, offset: int) -> Stage:
    """Run iteration x of ``loop`` at position x + offset (aligns producers before fusion)."""
    st = self.schedule.state_copy(self.name)
    st.loops = st.loops.shift(loop, offset)
    self.schedule.commit(self.name, st)
    return self


@transactional
def reverse(self: Stage, loop: str) -> Stage:
    """Run ``loop`` backwards."""
    st = self.schedule.state_copy(self.name)
    st.loops = st.loops.reverse(loop)
    self.schedule.commit(self.name, st)
    return self


@transactional
def apply_sch(self: Stage, isl_map: str, names: Sequence[str] | None = None) -> Stage:
    """Apply any affine map to the loops, e.g. ``"{ [i, j] -> [j, i + j] }"`` (dimensions by position).

    The map must be a one-to-one function; new loop names come from ``names`` or the map's output
    dimension names.
    """
    if self.state.tags:
        raise ScheduleError(f"apply_sch on {self.name}: remove loop tags first (tag loops last)")
    st = self.schedule.state_copy(self.name)
    st.loops = st.loops.apply(isl_map, names)
    st.separate = set()
    self.schedule.commit(self.name, st)
    return self


@transactional
def separate(self: Stage, loop: str) -> Stage:
    """Generate full tiles of ``loop`` apart from the partial ones at the edges (constant extents
    in the full tiles let unrolling and vectorization apply)."""
    st = self.schedule.state_copy(self.name)
    st.loops.index(loop)
    st.separate.add(loop)
    self.schedule.commit(self.name, st)
    return self
