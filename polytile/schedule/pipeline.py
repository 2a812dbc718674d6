"""``pipeline(cache, stages)``: multi-buffer a cache across iterations of its loop (ALCOP §II).

The request is checked here against ALCOP's three rules — the buffer is filled by a copy that can
be asynchronous (global to shared memory, or shared memory to registers for the register level),
inside a sequential load-use loop (not bound to threads, not unrolled), with one producer and its
consumers in one scope — and carried out at lowering (``lowering/passes/pipeline.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ScheduleError

if TYPE_CHECKING:
    from .state import Stage


def pipeline(self: Stage, cache: str, stages: int) -> Stage:
    """Keep ``stages`` copies of cache buffer ``cache`` and load ``stages - 1`` iterations ahead."""
    sched = self.schedule
    spec = next((c for c in sched.caches if c.name == cache), None)
    if spec is None:
        known = ", ".join(c.name for c in sched.caches if c.consumer == self.name) or "none"
        raise ScheduleError(f"pipeline: {self.name} has no cache named {cache!r} (its caches: {known})")
    if spec.consumer != self.name:
        raise ScheduleError(f"pipeline: cache {cache} belongs to {spec.consumer}, not {self.name}")
    if not isinstance(stages, int) or not 1 <= stages <= 8:
        raise ScheduleError(f"pipeline of {cache}: stages must be an integer from 1 to 8, got {stages!r}")
    reason = rejection(self, spec)
    if reason:
        raise ScheduleError(f"pipeline of {cache}: {reason}")
    sched.pipelines[cache] = stages
    return self


def rejection(stage: Stage, spec) -> str | None:  # noqa: ANN001 - a CacheSpec
    """Why ALCOP's rules refuse to pipeline this cache (None when they accept it)."""
    if spec.kind != "read":
        return "it is a write cache; only buffers filled by a copy (cache/cache_identity) are pipelined"
    if spec.loc not in ("shared", "local"):
        return (f"it lives in {spec.loc} memory; pipelined buffers are filled asynchronously into shared "
                "memory (or into registers at the register level): use loc='shared' or 'local'")
    if spec.level is None:
        return "it is not inside a loop; a pipeline needs a sequential load-use loop"
    tag = stage.state.tags.get(spec.level)
    if tag is not None and tag.startswith(("blockIdx", "threadIdx")):
        return f"its loop {spec.level} is bound to {tag}; the load-use loop must be sequential"
    if tag in ("unroll", "parallel", "vectorize"):
        return f"its loop {spec.level} is marked {tag}; the load-use loop must be a sequential loop"
    if spec.also:
        return "it is shared by several computations; its producer and consumers must be in one scope"
    return None
