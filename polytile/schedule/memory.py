"""Memory primitives: where results live (store, store_at, set_loc) and caches.

``cache_identity`` copies the elements of a tensor that a computation reads inside one iteration
of a loop into a local buffer (its footprint, computed symbolically by isl at lowering); ``cache``
does the same with a layout of the user's (transposed, packed, padded); ``cache_write``
accumulates a computation's results in a local buffer and writes them back once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..lang.tensor import Tensor
from ..poly.cache import CacheRequest
from ..poly.cache_check import check_buffers
from ..poly.limits import isl_budget
from ..poly.program import StageSchedule
from .unrolling import check_unroll_budget

if TYPE_CHECKING:
    from .state import Schedule, Stage

LOCATIONS = ("auto", "heap", "stack", "global", "shared", "local", "fragment")


def _check_loc(stage: Stage, loc: str) -> str:
    if loc not in LOCATIONS:
        raise ScheduleError(f"unknown memory location {loc!r} for {stage.name}; use one of {', '.join(LOCATIONS)}")
    return loc


def _level(stage: Stage, at: str | None) -> str | None:
    if at is not None:
        stage.state.loops.index(at)
    return at


def _tensor_name(stage: Stage, tensor: Tensor | str) -> str:
    name = tensor if isinstance(tensor, str) else getattr(tensor, "name", None)
    if not isinstance(name, str):
        raise ScheduleError(f"cache for {stage.name}: {tensor!r} is not a tensor; pass a tensor it reads or its name")
    comp = stage.schedule.computation(stage.name)
    if not any(t.name == name for t in comp.inputs()) and name not in _inlined_reads(stage):
        raise ScheduleError(f"computation {stage.name} does not read {name}; nothing to cache")
    return name


def _inlined_reads(stage: Stage) -> set[str]:
    from ..lang.expr import Load, walk
    return {n.tensor.name for n in walk(stage.schedule.bodies[stage.name]) if isinstance(n, Load)}


def _add_cache(stage: Stage, kind: str, tensor: str, at: str | None, name: str | None,
               layout: Callable[..., object] | None, loc: str, also: tuple[str, ...] = (),
               pad: tuple[int, ...] = (), whole: tuple[int, ...] = (), copy_order: str = "") -> Stage:
    from .state import CacheSpec
    sched = stage.schedule
    taken = {t.name for t in sched.func.tensors} | {c.name for c in sched.caches}
    cname = name or (f"{tensor}_{stage.name}_local" if kind == "read" else f"{stage.name}_local")
    if name is None:
        base, k = cname, 1
        while cname in taken:
            cname, k = f"{base}{k}", k + 1
    if not isinstance(cname, str) or not cname.isidentifier():
        raise ScheduleError(f"cache name {cname!r} is not an identifier")
    if cname in taken:
        raise ScheduleError(f"the name {cname!r} is already used; pass name= to the cache primitive")
    for c in sched.caches:
        if c.kind == kind and c.tensor == tensor and c.consumer == stage.name and c.level == at:
            raise ScheduleError(f"{tensor} is already cached for {stage.name} at loop {at}")
    for other in also:
        if other not in sched.states or other == stage.name:
            raise ScheduleError(f"cache of {tensor}: {other!r} is not another computation of the schedule")
    if loc == "fragment" and kind != "write":
        raise ScheduleError(f"cache {cname}: loc='fragment' is for the accumulator of a tensorized computation "
                            "(cache_write); operands come from shared memory")
    if any(not isinstance(p, int) or p < 0 for p in pad):
        raise ScheduleError(f"cache {cname}: pad must be non-negative integers, got {pad!r}")
    spec = CacheSpec(kind, tensor, stage.name, at, cname, layout, loc, also, tuple(pad), whole, copy_order)
    sched.caches.append(spec)
    try:
        check_narrowed_write_caches(sched)
        relaxed = frozenset(n for n, st in sched.states.items() if st.reassociate)
        check_memory(sched, sched._original, sched.stage_schedules(), relaxed)
        for consumer in (stage.name, *also):
            check_unroll_budget(sched, consumer)  # its copy loops inside unrolled loops are copied too
    except BaseException:
        sched.caches.remove(spec)  # transactional: a refused cache leaves the schedule as it was
        raise
    return stage


def cache_identity(self: Stage, tensor: Tensor | str, at: str | None = None, *, name: str | None = None,
                   loc: str = "auto", layout: Callable[..., object] | None = None,
                   also: Sequence[object] = ()) -> Stage:
    """Copy the elements of ``tensor`` read by this computation within one iteration of loop ``at``
    into a local buffer, and read them from there. The footprint may depend on parameters.

    On a GPU, ``loc="shared"`` makes one buffer per thread block (the footprint of all its
    threads), filled cooperatively; ``loc="local"`` keeps a thread's elements in registers.
    ``also`` lists further computations, fused with this one down to ``at``, that read the same
    cache (one copy serves them all)."""
    return _add_cache(self, "read", _tensor_name(self, tensor), _level(self, at), name, layout,
                      _check_loc(self, loc), tuple(getattr(o, "name", o) for o in also))


def cache(self: Stage, tensor: Tensor | str, at: str | None = None, layout: Callable[..., object] | None = None,
          *, name: str | None = None, loc: str = "auto", pad: Sequence[int] = (), whole: Sequence[int] = (),
          copy_order: str = "") -> Stage:
    """Like ``cache_identity`` with a layout: ``layout(*rel)`` gives the buffer index of the element at
    ``rel`` (its index minus the footprint's origin), e.g. ``lambda k, j: (j // 16, k, j % 16)`` packs
    panels; ``pad`` adds elements to each buffer dimension (e.g. ``(0, 8)`` lengthens rows by 8 to
    spread them over shared-memory banks). ``whole`` (one granule per tensor dimension) rounds the
    footprint's box up to multiples of the granules and copies it whole, zeros past the tensor's end:
    on a GPU, ``cache(A, None, loc="global", whole=(1, 8))`` gives a 16-bit matrix whose rows are
    not 16-byte aligned an aligned, zero-padded copy (one copy kernel) that the inner caches read with
    16-byte asynchronous copies. ``copy_order``: the copy loops run over the buffer's layout ("cache":
    contiguous writes; the default off shared memory) or over the tensor's indices ("source":
    contiguous reads — a transposing pack that would otherwise read as many rows at once as its
    panel is wide)."""
    if copy_order not in ("", "cache", "source"):
        raise ScheduleError(f"cache of {tensor} for {self.name}: copy_order must be 'cache' or 'source', "
                            f"got {copy_order!r}")
    if layout is not None and not callable(layout):
        raise ScheduleError(f"cache of {tensor} for {self.name}: layout must be a function of the indices")
    name_t = _tensor_name(self, tensor)
    rank = len(self.schedule.func.tensor(name_t).shape)
    if whole and (len(whole) != rank or any(not isinstance(g, int) or g < 1 for g in whole)):
        raise ScheduleError(f"cache of {name_t} for {self.name}: whole must give a positive granule for each of "
                            f"its {rank} dimensions, got {tuple(whole)!r}")
    return _add_cache(self, "read", name_t, _level(self, at), name, layout, _check_loc(self, loc), (), tuple(pad),
                      tuple(whole), copy_order)


def cache_write(self: Stage, at: str | None = None, *, name: str | None = None, loc: str = "auto",
                layout: Callable[..., object] | None = None, whole: Sequence[int] = ()) -> Stage:
    """Accumulate this computation's results inside one iteration of loop ``at`` in a local buffer
    (registers on a GPU when ``loc="local"``) and write them back once at the end of the iteration.
    ``layout`` packs a scattered footprint densely (as for ``cache``). ``loc="fragment"`` is the
    accumulator of a tensorized computation: the warp's tile held in registers spread over its
    lanes as the tensor-core instruction lays it out.

    ``whole`` (one granule per dimension of the result) makes the buffer a whole tile, the box
    rounded up to the granules: it starts at the reduction's identity, and where the operands come
    from whole caches (``cache(..., whole=...)``, zeros past the tensors' ends) the products run
    over the whole tile, in loops of constant bounds without tests; only the write-back tests the
    tensor's bounds (``lowering/passes/whole_tiles.py``)."""
    rank = len(self.schedule.computation(self.name).shape)
    if whole and (len(whole) != rank or any(not isinstance(g, int) or g < 1 for g in whole)):
        raise ScheduleError(f"cache_write of {self.name}: whole must give a positive granule for each of its {rank} "
                            f"dimensions, got {tuple(whole)!r}")
    return _add_cache(self, "write", self.name, _level(self, at), name, layout, _check_loc(self, loc), (), (),
                      tuple(whole))


def store(self: Stage, layout: Callable[..., object]) -> Stage:
    """Store this (intermediate) computation's element (i, j, …) at buffer index ``layout(i, j, …)``."""
    if any(o.name == self.name for o in self.schedule.func.outputs):
        raise ScheduleError(f"{self.name} is an output: its layout is that of the caller's array")
    if not callable(layout):
        raise ScheduleError(f"store of {self.name}: layout must be a function of the indices")
    st = self.schedule.state_copy(self.name)
    st.store_layout = layout
    self.schedule.commit(self.name, st)
    return self


def store_at(self: Stage, level: str) -> Stage:
    """Keep only the elements written in one iteration of this computation's loop ``level``: the
    buffer is allocated inside that loop, sized to the iteration's footprint (storage folding).
    Consumers fused inside that loop read from it; a value read in another iteration than the one
    that wrote it is refused."""
    if any(o.name == self.name for o in self.schedule.func.outputs):
        raise ScheduleError(f"{self.name} is an output and is stored in the caller's array")
    st = self.schedule.state_copy(self.name)
    st.store_level = _level(self, level)
    self.schedule.commit(self.name, st)
    return self


def set_loc(self: Stage, loc: str) -> Stage:
    """Where this computation's buffer lives: heap, stack (up to 1 MB of constant size; a larger or
    parametric buffer lives on the heap, which cannot overflow), or on a GPU global, shared, local."""
    st = self.schedule.state_copy(self.name)
    st.loc = _check_loc(self, loc)
    self.schedule.commit(self.name, st)
    return self


# --- requests and legality ------------------------------------------------------------------------
def cache_requests(sched: Schedule, copy_order: str = "cache") -> list[CacheRequest]:
    """The buffers the schedule asks for (caches, then stored computations), for the polyhedral layer.

    ``copy_order``: shared-memory copies loop over the tensor's indices (GPU: coalesced global
    reads) when "source"; other copies loop over the cache's layout (dense loops, contiguous
    packed writes)."""
    requests = []
    for c in sched.caches:
        st = sched.states[c.consumer]
        if c.level is not None and c.level not in st.loops.names:
            raise ScheduleError(f"cache {c.name} of {c.tensor} is placed at loop {c.level} of {c.consumer}, which no "
                                f"longer exists (its loops are {', '.join(st.loops.names)}); transform the loops "
                                "before adding caches at them")
        _not_scalar(sched, c.tensor, f"cache {c.name} of {c.tensor}")
        level = None if c.level is None else st.loops.index(c.level)
        threads = frozenset(2 * st.loops.index(loop) + 1 for loop, tag in st.tags.items()
                            if tag.startswith("threadIdx"))
        # register tiles: dense loops to unroll; wgmma's operand tiles: contiguous shared-memory writes
        order = c.copy_order or (copy_order if c.loc == "shared" else "cache")
        layout, fill = c.layout, None
        if c.loc == "fragment":  # a transposed nest's (tensorize) composed with the instruction's lanes
            frame = c.layout
            layout = fragment_layout if frame is None else lambda *e, f=frame: fragment_layout(*f(*e))  # type: ignore[misc,operator]
            fill = sched.computation(c.consumer).reduction.identity().value  # type: ignore[union-attr]
        elif c.kind == "write" and c.whole and sched.computation(c.consumer).reduction is not None:
            fill = sched.computation(c.consumer).reduction.identity().value  # type: ignore[union-attr]
        requests.append(CacheRequest(c.kind, c.tensor, c.consumer, level, c.name, layout, c.loc,
                                     threads if c.loc == "shared" else frozenset(), order, c.also, threads,
                                     c.pad, fill, c.whole))
    for name, st in sched.states.items():
        if st.store_level is not None or st.store_layout is not None:
            if st.store_level is not None and st.store_level not in st.loops.names:
                raise ScheduleError(f"{name} is stored at loop {st.store_level} (store_at), which no longer exists "
                                    f"(its loops are {', '.join(st.loops.names)}); transform the loops first")
            _not_scalar(sched, name, f"store of {name}")
            level = None if st.store_level is None else st.loops.index(st.store_level)
            requests.append(CacheRequest("fold", name, name, level, folded_name(name), st.store_layout, st.loc))
    return requests


def _not_scalar(sched: Schedule, tensor: str, what: str) -> None:
    if sched.func.tensor(tensor).ndim == 0:
        raise ScheduleError(f"{what}: {tensor} is a scalar (0-d), one element that the compiler keeps in a "
                            "register; it takes no buffer or layout of its own")


def reduction_start(sched: Schedule, name: str) -> int:
    """The position of the first loop of computation ``name`` that runs over its reduction axes (the
    number of its loops when none does): a write cache holds all of its reduction at a loop before it."""
    loops = sched.states[name].loops
    reduce_dims = sched.program.statements[name].reduce_dims
    return next((k for k in range(len(loops.names)) if loops.depends_on(k, reduce_dims)), len(loops.names))


def pending_sum_cache(sched: Schedule, name: str) -> str | None | bool:
    """Where lowering will give computation ``name`` the write cache that finishes its sums
    (``cache_narrowed_sums``: a reduction stored narrower than it sums or through an epilogue, with no
    write cache yet): the loop just outside its reduction loops, None outside all of them, or False
    when it gets none."""
    if not sched.func.tensor(name).finished or any(c.kind == "write" and c.consumer == name for c in sched.caches):
        return False
    first = reduction_start(sched, name)
    return sched.states[name].loops.names[first - 1] if first else None


def check_narrowed_write_caches(sched: Schedule) -> None:
    """A reduction stored narrower than it sums (``compute(store_dtype=)``) or through an epilogue
    (``compute(epilogue=)``) finishes its sums once, when complete: refuse write caches of it of which
    none holds all of its reduction (checked by every primitive, so that the one that makes it so is
    refused, not the build)."""
    for comp in sched.computations:
        if not comp.finished:
            continue
        writes = [c for c in sched.caches if c.kind == "write" and c.consumer == comp.name]
        loops = sched.states[comp.name].loops
        if not writes or any(c.level is None or c.level not in loops.names for c in writes):
            continue  # no cache yet, or a cache at a loop that no longer exists (refused by cache_requests)
        first = reduction_start(sched, comp.name)
        if any(loops.index(c.level) < first for c in writes):
            continue
        last = max(loops.index(c.level) for c in writes)
        outer = ", ".join(n for k, n in enumerate(loops.names)
                          if k <= last and loops.depends_on(k, sched.program.statements[comp.name].reduce_dims))
        how = "through its epilogue" if comp.epilogue is not None else f"as {comp.dtype}"
        raise ScheduleError(
            f"{comp.name} sums in {comp.value_dtype} and is stored {how}: its sums are finished "
            f"once, when complete, but its write cache(s) {', '.join(c.name for c in writes)} hold only part "
            f"of the reduction (loop(s) {outer} run outside them). Place the write cache at a loop outside "
            f"every reduction loop ({loops.names[first - 1] if first else 'at the top'} or above), or "
            f"move the reduction loops inside it")


def check_memory(sched: Schedule, original: dict[str, StageSchedule], scheds: dict[str, StageSchedule],
                 relaxed: frozenset[str] = frozenset()) -> None:
    """Raise ScheduleError if a cache or stored buffer of ``sched`` cannot be built or breaks a
    dependence, with the loops scheduled as ``scheds`` (``original``: the program order). Within isl's
    operation budget: the cache primitives check here outside the schedule's own check, and one
    footprint's parametric maximum ran for minutes (fuzz seed 71 case 2282)."""
    requests = cache_requests(sched)
    if requests:
        with isl_budget(ScheduleError, "the schedule"):
            check_buffers(sched.program, original, scheds, requests, relaxed)


def fragment_layout(*e: object) -> tuple[object, ...]:
    """Where mma.m16n8 keeps accumulator element (row, col) of a warp tile: tile (row // 16,
    col // 8), slot ((row % 16) // 8 * 2 + col % 2) of lane (row % 8, (col % 8) // 2) — the last two
    dimensions are the lane (8 × 4 = 32), spread over the warp."""
    *lead, r, c = e
    return (*lead, r // 16, c // 8, (r % 16) // 8 * 2 + c % 2, r % 8, (c % 8) // 2)  # type: ignore[operator]


def folded_name(comp: str) -> str:
    """The buffer of a computation stored with a layout or inside a loop (store / store_at)."""
    return f"{comp}_stored"
