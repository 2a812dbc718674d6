"""``pipeline(cache, stages)``: multi-buffer a cache across iterations of its loop (ALCOP §II).

The request is checked here against ALCOP's three rules — the buffer is filled by a copy that can
be asynchronous (global to shared memory, or shared memory to registers for the register level),
inside a sequential load-use loop (not bound to threads, not unrolled), with one producer and its
consumers in one scope — and carried out at lowering (``lowering/passes/pipeline.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..intrinsics import tensor_intrinsic
from .transaction import transactional

if TYPE_CHECKING:
    from .state import Stage


@transactional
def pipeline(self: Stage, cache: str, stages: int, *, inflight: int = 0, producer: str = "threads",
             specialize: bool = False, registers: tuple[int, int] | None = None) -> Stage:
    """Keep ``stages`` copies of cache buffer ``cache`` and load ``stages - 1`` iterations ahead.

    ``inflight``: for warpgroup MMA (``tensorize(..., "wgmma_m64nNk16")``), how many of the
    asynchronous MMA groups of earlier iterations may still run while an iteration issues its own;
    the copies then run ``stages - 1 - inflight`` iterations ahead (a slot is refilled only once
    the group that read it has completed).

    ``producer``: who fills the slots. ``"threads"`` (default): every thread of the block issues
    ``cp.async`` copies, waited for by commit group and a barrier. ``"tma"`` (sm_90, for the
    128-byte swizzled operand tiles of a wgmma nest): one thread issues the tensor memory
    accelerator's bulk tensor copies (``cp.async.bulk.tensor``, a tensor map per operand made on the
    host, zeros past the tensor's end) that complete on a per-slot mbarrier with the slot's byte
    count; the consumers wait on its phase and release the slot on a second mbarrier once their MMA
    groups that read it have completed.

    ``specialize`` (with ``producer="tma"``, sm_90a): warp specialization — a warpgroup of its own
    (four more warps) issues the copies while the block's warpgroups only compute; registers move
    from the producer to the consumers with ``setmaxnreg``: ``registers`` = (per producer thread,
    per consumer thread), multiples of 8 from 24 to 256 (default: 40, and the most the consumers
    can have). A split over the 64K registers of an SM hangs the GPU; the lowering refuses it."""
    sched = self.schedule
    spec = next((c for c in sched.caches if c.name == cache), None)
    if spec is None and cache.endswith("_frag"):
        return _pipeline_fragments(self, cache, stages)
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
    if not isinstance(inflight, int) or inflight < 0 or (inflight and stages - 1 - inflight < 1):
        raise ScheduleError(f"pipeline of {cache}: inflight={inflight!r} needs an integer ≥ 0 and at least "
                            f"inflight + 2 stages (got {stages})")
    tensorized = [t for t in map(tensor_intrinsic, self.state.tags.values()) if t is not None]
    if inflight and not any(t.asynchronous for t in tensorized):
        raise ScheduleError(f"pipeline of {cache}: inflight applies to asynchronous MMA groups; tensorize "
                            f"{self.name} with 'wgmma_m64nNk16' first")
    if producer not in PRODUCERS:
        raise ScheduleError(f"pipeline of {cache}: producer must be one of {', '.join(map(repr, PRODUCERS))}, "
                            f"got {producer!r}")
    if producer == "tma":
        reason = _tma_rejection(self, spec, stages, tensorized)
        if reason:
            raise ScheduleError(f"pipeline of {cache} with producer='tma': {reason}")
    if (specialize or registers is not None) and producer != "tma":
        raise ScheduleError(f"pipeline of {cache}: specialize and registers apply to producer='tma' (a warpgroup "
                            "that issues the TMA copies)")
    if registers is not None and not (specialize and isinstance(registers, tuple) and len(registers) == 2 and all(
            isinstance(r, int) and 24 <= r <= 256 and r % 8 == 0 for r in registers) and registers[0] <= registers[1]):
        raise ScheduleError(f"pipeline of {cache}: registers={registers!r} must be (producer, consumer) registers per "
                            "thread, multiples of 8 from 24 to 256, the producer's at most the consumers' (with "
                            "specialize=True)")
    sched.pipelines[cache] = stages
    sched.pipeline_inflight[cache] = inflight
    if producer == "tma":
        sched.pipeline_producer[cache] = Producer(bool(specialize), registers)
    else:
        sched.pipeline_producer.pop(cache, None)
    return self


PRODUCERS = ("threads", "tma")
"""Who fills a pipelined shared buffer: the block's threads (cp.async) or the tensor memory accelerator."""


@dataclass(frozen=True)
class Producer:
    """A pipeline filled by TMA copies: issued by one thread of the block, or (``specialize``) by a
    warpgroup of its own with ``registers`` = (producer, consumer) per thread (None: the default)."""

    specialize: bool = False
    registers: tuple[int, int] | None = None


def _tma_rejection(stage: Stage, spec, stages: int, tensorized: list) -> str | None:  # noqa: ANN001 - a CacheSpec
    """Why a cache cannot be filled by TMA copies (None when it can, as far as the schedule tells;
    the lowering checks the copy itself: lowering/passes/tma.py)."""
    if spec.loc != "shared":
        return f"the tensor memory accelerator copies into shared memory; {spec.name} lives in {spec.loc} memory"
    if stages < 2:
        return "a TMA pipeline needs at least 2 stages"
    if not any(t.warpgroup for t in tensorized):
        return (f"TMA copies fill the 128-byte swizzled operand tiles of warpgroup MMA: tensorize {stage.name} "
                "with 'wgmma_m64nNk16' first")
    if spec.swizzle != 128:
        return (f"{spec.name} is not stored in 128-byte swizzled rows (its tile has fewer than 64 16-bit "
                "columns); use 64-wide K tiles and a multiple of 64 columns, or producer='threads'")
    ndim = len(stage.schedule.func.tensor(spec.tensor).shape)
    if not 2 <= ndim <= 5:
        return (f"{spec.tensor} has {ndim} dimensions; TMA pipelines copy tiles of tensors of 2 to 5 dimensions "
                "(take producer='threads')")
    return None


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


def _pipeline_fragments(stage: Stage, name: str, stages: int) -> Stage:
    """The register level: ``<cache>_frag``, the operand fragments a tensorized nest loads from
    shared cache ``<cache>`` with ldmatrix, multi-buffered across the loop around the nest's tile
    loops (the K steps within a shared tile)."""
    sched = stage.schedule
    base = name.removesuffix("_frag")
    spec = next((c for c in sched.caches if c.name == base and c.consumer == stage.name), None)
    st = stage.state
    nest = next((lp for lp, tag in st.tags.items() if getattr(tensor_intrinsic(tag), "fragment_loads", None)), None)
    if spec is None or nest is None or spec.loc != "shared":
        raise ScheduleError(f"pipeline: {name} names no operand fragments of {stage.name}; fragments come from "
                            "a shared cache read by a tensorized nest (tensorize first)")
    if not isinstance(stages, int) or not 1 <= stages <= 2:
        raise ScheduleError(f"pipeline of {name}: register fragments take 1 or 2 stages, got {stages!r}")
    pos = st.loops.index(nest)
    if pos < 3:
        raise ScheduleError(f"pipeline of {name}: no loop around the fragment loads of {stage.name}")
    loop = st.loops.names[pos - 3]  # around the tile rows and columns of the warp
    tag = st.tags.get(loop)
    if tag is not None and tag != "serial":
        raise ScheduleError(f"pipeline of {name}: its load-use loop {loop} is marked {tag}; it must be a "
                            "sequential loop (it is unrolled after pipelining)")
    if spec.level is None or st.loops.index(spec.level) >= pos - 3:
        raise ScheduleError(f"pipeline of {name}: loop {loop} must be inside the loop of the shared tile "
                            f"{base} ({spec.level}), so that the fragments are loaded from one tile")
    sched.pipelines[name] = stages
    return stage
