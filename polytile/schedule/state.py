"""Schedule state: one ``Stage`` per computation, the polyhedral program, and legality checking.

Primitives (in the sibling modules) compute a new state for a stage and call ``Schedule.commit``,
which checks every dependence and either keeps the change or raises ``ScheduleError``. Each
primitive is ``@transactional`` (``transaction.py``): when it raises, the whole schedule is put
back as it was, whatever it had changed on the way.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..lang.expr import Expr
from ..lang.func import Func
from ..lang.tensor import ComputeTensor, Tensor
from ..poly.limits import isl_budget
from ..poly.model import INIT_SUFFIX
from ..poly.program import STATIC_SCALE, PolyProgram, StageSchedule
from ..poly.schedule import LoopSchedule
from ..toolchain import quick_builds
from .memory import check_memory, check_narrowed_write_caches
from .transaction import transactional
from .unrolling import check_unroll_budget

if TYPE_CHECKING:
    from .pipeline import Producer

LOOP_TAGS = ("parallel", "vectorize", "unroll", "serial",
             "blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
PARALLEL_TAGS = ("parallel", "vectorize", *LOOP_TAGS[4:])
PASSED_KEPT = 16  # checked states remembered by a schedule: a primitive's state and the few before it


@dataclass
class Anchor:
    """``stage`` runs after (or before) ``other`` inside ``other``'s loop ``level`` (None: at the top)."""

    other: str
    level: str | None
    after: bool


@dataclass
class CacheSpec:
    """A read cache (``cache_identity`` / ``cache``) or write cache of ``tensor`` for ``consumer``."""

    kind: str  # "read" or "write"
    tensor: str
    consumer: str
    level: str | None  # loop of the consumer inside which the cache lives (None: whole function)
    name: str
    layout: object | None = None  # callable relative index -> cache index, for manual layouts
    loc: str = "auto"
    also: tuple[str, ...] = ()  # further consumers sharing the cache
    pad: tuple[int, ...] = ()  # extra elements per buffer dimension
    whole: tuple[int, ...] = ()  # whole tiles rounded to these granules per dimension (tensor cores)
    copy_order: str = ""  # "cache": the copy loops run over the buffer's layout (set by tensorize for wgmma)
    swizzle: int = 0  # 128: the buffer's 16-byte chunks are XOR-swizzled in 128-byte rows (wgmma)


@dataclass
class StageState:
    loops: LoopSchedule
    tags: dict[str, str] = field(default_factory=dict)
    separate: set[str] = field(default_factory=set)
    anchor: Anchor | None = None
    store_layout: object | None = None  # callable index -> storage index
    store_level: str | None = None
    loc: str = "auto"
    reassociate: bool = False  # the reduction's accumulation order may change
    raster: int = 0  # the blocks run in groups of this many rows of blocks (``raster``; 0: row by row)
    persistent: int = 0  # blocks per multiprocessor looping over the tiles (``persistent``; 0: a block a tile)
    tma_store: bool = False  # the blocks' tiles written by TMA stores (``tma_store``)
    staged_store: bool = False  # the blocks' tiles staged in shared memory, copied out by the threads
    staged_overlay: bool = False  # the staging tile in the storage of shared buffers used before it
    cluster: bool = False  # the kernel's threadIdx.z runs as the blocks of a thread-block cluster (``cluster``)


class Schedule:
    """The schedule of a ``Func``: ``sched[C]`` (or ``sched["C"]``) gives the stage of computation C."""

    def __init__(self, func: Func):
        self.func = func
        self.inlined: list[str] = []
        self.virtual: list[str] = []  # inlined into the copies of their caches (computed while copying)
        self.caches: list[CacheSpec] = []
        self.pipelines: dict[str, int] = {}  # cache buffer -> stages
        self.pipeline_inflight: dict[str, int] = {}  # cache buffer -> wgmma groups left running
        self.pipeline_producer: dict[str, Producer] = {}  # cache buffer -> TMA copies (absent: the threads')
        self._build_program()
        self.states: dict[str, StageState] = self._identity_states()
        self._original = self.stage_schedules()
        self._passed: list[tuple[object, ...]] = []  # states that passed the checks (``_placement``), newest first

    # --- the polyhedral program -----------------------------------------------------------------
    def _build_program(self) -> None:
        from .inline import inline_bodies
        self.bodies: dict[str, Expr] = inline_bodies(self.func, self.inlined)
        self.computations: list[ComputeTensor] = [c for c in self.func.computations
                                                   if c.name not in self.inlined and c.name not in self.virtual]
        self.program = PolyProgram(self.func, self.bodies, self.computations,
                                   [self.func.tensor(v) for v in self.virtual])

    def rebuild(self) -> None:
        """Recompute statements and dependences (after inlining) and re-check the current schedule."""
        self._build_program()
        self.states = {c.name: self.states[c.name] for c in self.computations}
        self._original = self.stage_schedules(self._identity_states())
        self.check()

    def _identity_states(self) -> dict[str, StageState]:
        return {c.name: StageState(self.program.identity_loops(c.name)) for c in self.computations}

    # --- access ---------------------------------------------------------------------------------
    def __getitem__(self, key: Tensor | str) -> Stage:
        name = key if isinstance(key, str) else getattr(key, "name", None)
        if not isinstance(name, str):
            raise ScheduleError(f"{key!r} is not a computation of Func {self.func.name}: index the schedule "
                                f"by a tensor or its name (computations: {', '.join(self.states)})")
        if name in self.inlined or name in self.virtual:
            raise ScheduleError(f"computation {name} was inlined; schedule its consumers instead")
        if name not in self.states:
            known = ", ".join(self.states)
            raise ScheduleError(f"{name!r} is not a computation of Func {self.func.name} (computations: {known})")
        return Stage(self, name)

    def stage_names(self) -> list[str]:
        return [c.name for c in self.computations]

    def computation(self, name: str) -> ComputeTensor:
        return next(c for c in self.computations if c.name == name)

    # --- materialized schedules ------------------------------------------------------------------
    def statics(self, states: dict[str, StageState] | None = None) -> dict[str, list[int]]:
        """Static (ordering) dimensions of every stage, from the root order and the anchors."""
        states = self.states if states is None else states
        out: dict[str, list[int]] = {}
        rank: dict[tuple[str, str | None, bool], int] = {}
        root_order = [n for n in self.stage_names() if states[n].anchor is None]
        visiting: set[str] = set()

        def resolve(name: str) -> list[int]:
            if name in out:
                return out[name]
            if name in visiting:
                raise ScheduleError(f"computation {name} is placed relative to itself (a cycle of after/before)")
            visiting.add(name)
            st = states[name]
            n = len(st.loops.names)
            s = [0] * (n + 1)
            if st.anchor is None:
                s[0] = root_order.index(name)
            else:
                a = st.anchor
                base = resolve(a.other)
                other = states[a.other].loops
                if a.level is not None and a.level not in other.names:
                    raise ScheduleError(f"computation {name} is placed {'after' if a.after else 'before'} {a.other} "
                                        f"at loop {a.level}, which no longer exists (the loops of {a.other} are "
                                        f"{', '.join(other.names)}); transform the loops before fusing at them")
                p = -1 if a.level is None else other.index(a.level)
                if p + 1 > n:
                    raise ScheduleError(f"computation {name} has {n} loop(s); it cannot share loop {a.level} "
                                        f"(loop {p + 1} of {a.other})")
                s[:p + 1] = base[:p + 1]
                key = (a.other, a.level, a.after)
                rank[key] = rank.get(key, 0) + 1
                s[p + 1] = base[p + 1] + (rank[key] if a.after else -rank[key])
            visiting.discard(name)
            out[name] = s
            return s

        for name in self.stage_names():
            resolve(name)
        return out

    def stage_schedules(self, states: dict[str, StageState] | None = None) -> dict[str, StageSchedule]:
        """The loops and materialized statics of every statement (initializations derived)."""
        states = self.states if states is None else states
        out: dict[str, StageSchedule] = {}
        for name, s in self.statics(states).items():
            st = states[name]
            upd = StageSchedule(st.loops, [STATIC_SCALE * v + STATIC_SCALE // 2 for v in s])
            out[name] = upd
            if self.computation(name).reduction is not None:
                out[name + INIT_SUFFIX] = self.program.init_schedule(name, upd)
        return out

    # --- legality -------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise ScheduleError if the current schedule breaks a dependence or a parallel tag."""
        with isl_budget(ScheduleError, "the schedule"):
            self._check()

    def _check(self) -> None:
        scheds = self.stage_schedules()
        relaxed = frozenset(n for n, st in self.states.items() if st.reassociate)
        placement = self._placement(scheds) if quick_builds() else None
        known = placement is not None and placement in self._passed
        if not known:
            v = self.program.violation(self._original, scheds, relaxed)
            if v is not None:
                raise ScheduleError(f"the schedule breaks a dependence: {v.describe()}"
                                    + self._at_loop(v.dim, scheds, v.sink))
        self._check_shared_loop_tags(scheds)
        check_narrowed_write_caches(self)
        if not known:
            unbounded = self.program.unbounded_loop(scheds)
            if unbounded is not None:
                raise ScheduleError(unbounded)
            check_memory(self, self._original, scheds, relaxed)  # caches and stored buffers
            if placement is not None:
                self._passed = [placement, *self._passed[:PASSED_KEPT - 1]]
        for name, st in self.states.items():
            for loop, tag in st.tags.items():
                if tag in PARALLEL_TAGS:
                    self.check_parallel(name, loop, tag, scheds)
            check_unroll_budget(self, name)

    def _placement(self, scheds: dict[str, StageSchedule]) -> tuple[object, ...]:
        """Everything the checks of the loop order and of the buffers read: the program, each stage's
        loops (immutable: compared as objects), static positions, buffer settings and GPU thread
        bindings, and the caches. Loop tags of other kinds (parallel, vectorize, unroll) are left
        out: only the checks of parallel tags read them. Two equal placements pass or fail alike, so
        a primitive that changes none of it (a tag) is not checked again."""
        stages = tuple((name, st.loops, tuple(scheds[name].statics), st.reassociate, st.store_layout,
                        st.store_level, st.loc,
                        tuple(sorted((lp, t) for lp, t in st.tags.items() if t.startswith("threadIdx"))))
                       for name, st in self.states.items())
        caches = tuple(tuple(vars(c).values()) for c in self.caches)  # values: CacheSpecs change in place
        return self.program, stages, caches

    def _check_shared_loop_tags(self, scheds: dict[str, StageSchedule]) -> None:
        """Computations fused in a loop (after/before) give it compatible tags: one loop of the
        generated code cannot be, e.g., both parallel and vectorized, or both vectorized and
        explicitly serial (an untagged loop takes the other's tag)."""
        tagged = [(name, pos, tag) for name, st in self.states.items() for loop, tag in st.tags.items()
                  for pos in [st.loops.index(loop)]]
        for k, (a, pos, tag) in enumerate(tagged):
            for b, pos_b, tag_b in tagged[k + 1:]:
                shared = pos == pos_b and scheds[a].statics[:pos + 1] == scheds[b].statics[:pos + 1]
                if shared and tag != tag_b:
                    raise ScheduleError(f"loop {self.states[a].loops.names[pos]} of {a} is {tag} and loop "
                                        f"{self.states[b].loops.names[pos]} of {b}, fused with it, is {tag_b}; "
                                        "tag the loops of fused computations alike")

    def check_parallel(self, name: str, loop: str, tag: str, scheds: dict[str, StageSchedule]) -> None:
        key = None
        if quick_builds():  # GPU thread bindings read the other stages' tags (cross-thread reductions)
            tags = tuple(tuple(st.tags.items()) for st in self.states.values()) if tag.startswith("threadIdx") else ()
            key = (self._placement(scheds), name, loop, tag, tags)
            if key in self._passed:
                return
        with isl_budget(ScheduleError, f"the schedule of {name}"):
            self._check_parallel(name, loop, tag, scheds)
        if key is not None:
            self._passed = [key, *self._passed[:PASSED_KEPT - 1]]

    def _check_parallel(self, name: str, loop: str, tag: str, scheds: dict[str, StageSchedule]) -> None:
        st = self.states[name]
        pos = st.loops.index(loop)
        dim = 2 * pos + 1
        stmt = self.program.statements[name]
        if tag.startswith("threadIdx"):
            self._check_thread_extent(name, loop, tag)
        cross_thread = (tag.startswith("threadIdx") and bool(stmt.reduce_dims) and st.reassociate
                        and st.loops.depends_on(pos, stmt.reduce_dims)
                        and not st.loops.depends_on(pos, [d for d in stmt.dims if d not in stmt.reduce_dims]))
        if st.reassociate and not cross_thread and st.loops.depends_on(pos, stmt.reduce_dims):
            raise ScheduleError(f"loop {loop} of {name} runs its reduction; it cannot be {tag} (only a "
                                "GPU thread binding turns it into a cross-thread reduction)")
        # a reduction loop bound to threads becomes a cross-thread reduction (a tree of partial sums)
        # the other reductions fused in this loop and bound to the same threads reduce across them too
        relaxed = frozenset(n for n, other in self.states.items() if other.reassociate and any(
            t == tag and 2 * other.loops.index(lp) + 1 == dim for lp, t in other.tags.items())) | {name}
        v = self.program.carried(self._original, scheds, dim, name, relaxed if cross_thread else frozenset())
        if v is not None:
            raise ScheduleError(f"loop {loop} of {name} cannot be {tag}: it carries a dependence "
                                f"({v.describe()})")

    def _check_thread_extent(self, name: str, loop: str, tag: str) -> None:
        """A block has a fixed number of threads: a loop bound to threads needs bounds valid for every
        parameter value (a parameter's or data-dependent extent, unless split by a constant, has none)."""
        st = self.states[name]
        if self.program.thread_bounds(name, st.loops, st.loops.index(loop)) is None:
            raise ScheduleError(f"loop {loop} of {name} cannot be bound to {tag}: its extent is not a constant (a "
                                "parameter's or data-dependent), and a block has a fixed number of threads; split "
                                "it by a constant and bind the inner loop")

    def _at_loop(self, dim: int, scheds: dict[str, StageSchedule], stmt: str) -> str:
        name = stmt.split("[")[0]
        s = scheds.get(name)
        if s is None or dim < 0:
            return ""
        if dim % 2 == 1 and (dim - 1) // 2 < len(s.loops.names):
            return f"; the order is reversed at loop {s.loops.names[(dim - 1) // 2]}"
        return "; the order of the computations is reversed (after/before)"

    def commit(self, name: str, new: StageState) -> None:
        """Replace the state of stage ``name`` if the result is legal; otherwise keep the old one."""
        old = self.states[name]
        self.states[name] = new
        try:
            self.check()
        except ScheduleError:
            self.states[name] = old
            raise

    def state_copy(self, name: str) -> StageState:
        st = self.states[name]
        new = copy.copy(st)
        new.tags = dict(st.tags)
        new.separate = set(st.separate)
        return new


class Stage:
    """The schedule handle of one computation; every primitive returns the stage (chainable)."""

    def __init__(self, sched: Schedule, name: str):
        self.schedule = sched
        self.name = name

    @property
    def state(self) -> StageState:
        return self.schedule.states[self.name]

    @property
    def loops(self) -> list[str]:
        """The names of this computation's loops, outermost first."""
        return list(self.state.loops.names)

    def __repr__(self) -> str:
        tags = ", ".join(f"{k}:{v}" for k, v in self.state.tags.items())
        return f"Stage({self.name}: loops {self.loops}{'; ' + tags if tags else ''})"

    from .loops import apply_sch, fuse, reorder, reverse, separate, shift, skew, split, tile  # noqa: E402
    from .memory import (  # noqa: E402
        cache,
        cache_identity,
        cache_write,
        set_loc,
        store,
        store_at,
    )
    from .order import after, before  # noqa: E402
    from .pipeline import pipeline  # noqa: E402
    from .tags import (  # noqa: E402
        bind,
        cluster,
        parallel,
        persistent,
        raster,
        staged_store,
        tag,
        tma_store,
        unroll,
        vectorize,
    )
    from .tensorize import tensorize  # noqa: E402

    @transactional
    def reassociate(self) -> Stage:
        """Let the order of this reduction's accumulation change (sums of floats may then differ in
        the last bits): reduction loops may be reordered, and bound to GPU threads as a tree."""
        comp = self.schedule.computation(self.name)
        if comp.reduction is None:
            raise ScheduleError(f"computation {self.name} is not a reduction")
        st = self.schedule.state_copy(self.name)
        st.reassociate = True
        self.schedule.commit(self.name, st)
        return self

    @transactional
    def compute_inline(self) -> Schedule:
        """Substitute this computation into its consumers (it must not be a reduction or an output)."""
        from .inline import compute_inline
        return compute_inline(self.schedule, self.name)
