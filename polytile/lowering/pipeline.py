"""Lowering, read top to bottom: a schedule becomes loop IR through one ordered list of passes.

``POLYTILE_DUMP=<dir>`` writes the IR after every pass to ``<dir>/<func>.<nn>-<pass>.txt``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .. import dtypes
from ..errors import LoweringError, ScheduleError
from ..intrinsics import tensor_intrinsic
from ..lang import expr as lx
from ..poly.materialize import Plan, materialize
from ..schedule.memory import cache_requests, check_narrowed_write_caches, folded_name, pending_sum_cache
from ..schedule.state import Schedule
from ..schedule.tensorize import check_whole_products
from ..schedule.transaction import restore, snapshot
from ..target import FEATURES, Target
from . import loopir as ir
from .from_ast import IRBuilder, aexpr
from .passes.allocate import allocate_intermediates
from .passes.allreduce import cross_thread_reductions
from .passes.barriers import insert_barriers
from .passes.combine_loads import combine_loads
from .passes.exchange_stores import exchange_stores
from .passes.flatten import flatten_storage
from .passes.fragments import distribute_fragments
from .passes.gpu_vectorize import vectorize_copies
from .passes.kernels import outline_kernels
from .passes.pair_stores import pair_stores
from .passes.pipeline import pipeline_buffers
from .passes.realign_loads import realign_loads
from .passes.registers import promote_registers
from .passes.simplify import simplify
from .passes.staged_stores import staged_stores
from .passes.swizzle import swizzle_shared
from .passes.tensorize import tensorize_nests
from .passes.tma_store import tma_stores
from .passes.unroll import unroll_loops
from .passes.vector_lanes import vectorize_lanes
from .passes.vectorize import vectorize_loops
from .passes.wgmma import async_proxy_fences
from .passes.whole_tiles import whole_tiles


class _Log:
    def __init__(self, name: str):
        d = os.environ.get("POLYTILE_DUMP")
        self.dir = Path(d) if d else None
        self.name = name
        self.count = 0
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)

    def __call__(self, stage: str, body: ir.Stmt, before: ir.Stmt | None = None) -> None:
        """Write ``body`` after ``stage``; "(unchanged)" when it prints as ``before`` did."""
        if self.dir is None:
            return
        self.count += 1
        text = ir.stmt_text(body)
        if before is not None and (before is body or ir.stmt_text(before) == text):
            text = "(unchanged)"
        (self.dir / f"{self.name}.{self.count:02d}-{stage}.txt").write_text(text + "\n")


Pass = tuple[str, bool, Callable[[ir.Stmt], ir.Stmt]]


def lower(sched: Schedule, target: Target, name: str | None = None) -> ir.LoweredFunc:
    """The loop IR of ``sched`` for ``target``: the whole compiler between schedule and printer.

    One list of passes for every target; a pass that only some targets need is guarded by a
    feature of the target (``target.has``), and runs only where the guard holds. What the lowering
    adds to the schedule (the write cache of sums stored narrower) is its own: the caller's
    schedule is left as it was, so that it can take more primitives and be built again."""
    saved = snapshot(sched)
    try:
        return _lower(sched, target, name)
    finally:
        restore(sched, saved)


def _lower(sched: Schedule, target: Target, name: str | None) -> ir.LoweredFunc:
    func = sched.func
    name = name or func.name
    log = _Log(name)
    cache_narrowed_sums(sched)
    check_schedule(sched, target)
    gpu = target.has("gpu")
    plan = build_plan(sched, "source" if gpu else "cache")
    buffers = make_buffers(sched, plan, target)
    tags = {n: dict(st.tags) for n, st in sched.states.items()}
    reserved = set(buffers) | {p.name for p in func.params}
    comps = {c.name: c for c in sched.computations}
    virtual = {v: (sched.func.tensor(v), sched.bodies[v]) for v in sched.virtual}
    body = IRBuilder(plan, comps, sched.bodies, buffers, tags, sched.program.dyn.exprs, reserved,
                     virtual).build()
    log("ast-to-ir", body)

    intermediates = [buffers[c.name] for c in sched.computations
                     if c.name not in {o.name for o in func.outputs} and folded_name(c.name) not in buffers]
    # without SIMD vectors (GPUs), a vectorized loop is unrolled: each thread keeps its elements in registers
    unrolled = ("unroll",) if target.has("simd") else ("unroll", "vectorize")
    whole_reads = {c.name for c in sched.caches if c.whole and c.kind == "read" and c.loc in ("shared", "local")}
    whole_writes = {c.name for c in sched.caches if c.whole and c.kind == "write" and c.loc == "local"}
    rasters = {loop: st.raster for st in sched.states.values() if st.raster
               for loop, tag in st.tags.items() if tag == "blockIdx.y"}
    persistent = {loop: st.persistent for st in sched.states.values() if st.persistent
                  for loop, tag in st.tags.items() if tag.startswith("blockIdx")}
    clustered = frozenset(loop for st in sched.states.values() if st.cluster
                          for loop, tag in st.tags.items() if tag.startswith("blockIdx") or tag == "threadIdx.z")
    tma_stored = frozenset(name for name, st in sched.states.items() if st.tma_store)
    if tma_stored and not target.has("tma"):
        raise LoweringError(f"tma_store of {', '.join(sorted(tma_stored))}: the target ({target.key}) has no TMA "
                            "(sm_90 or newer); leave tma_store off")
    staged = {name: st.staged_overlay for name, st in sched.states.items() if st.staged_store}
    passes: list[Pass] = [
        ("allocate", True, lambda s: allocate_intermediates(s, intermediates)),
        ("simplify", True, simplify),
        ("tensorize", gpu, tensorize_nests),
        ("whole-tiles", gpu, lambda s: whole_tiles(s, whole_reads, whole_writes)),
        ("fragments", gpu, distribute_fragments),
        ("allreduce", gpu, lambda s: cross_thread_reductions(s, clustered)),
        ("kernels", gpu, lambda s: outline_kernels(s, target, name, rasters, persistent, clustered)),
        ("pipeline", gpu, lambda s: pipeline_buffers(s, dict(sched.pipelines), dict(sched.pipeline_inflight),
                                                     dict(sched.pipeline_producer))),
        ("tma-stores", target.has("tma"), lambda s: tma_stores(s, tma_stored, target)),
        ("staged-stores", gpu, lambda s: staged_stores(s, staged, target)),
        ("simplify", gpu, simplify),
        ("vector-lanes", gpu, vectorize_lanes),
        ("unroll", True, lambda s: unroll_loops(s, unrolled)),
        ("flatten", True, flatten_storage),
        ("simplify", True, simplify),
        ("vectorize", target.has("simd"), lambda s: vectorize_loops(s, target)),
        ("simplify", target.has("simd"), simplify),
        ("combine-loads", gpu, combine_loads),
        ("gpu-vectorize", gpu, vectorize_copies),
        ("realign-loads", gpu, realign_loads),
        ("registers", True, promote_registers),
        ("barriers", gpu, insert_barriers),
        ("async-proxy", target.has("tma"), async_proxy_fences),
        ("simplify", True, simplify),
        ("exchange-stores", gpu, exchange_stores),
        ("pair-stores", gpu, pair_stores),
        ("swizzle", gpu, swizzle_shared),
    ]
    for stage, guard, fn in passes:
        if guard:
            before, body = body, fn(body)
            log(stage, body, before)

    args = [buffers[t.name] for t in func.inputs] + [buffers[t.name] for t in func.outputs]
    params = [ir.Var(p.name) for p in func.params]
    return ir.LoweredFunc(name, args, params, body, [t.name for t in func.outputs])


def cache_narrowed_sums(sched: Schedule) -> None:
    """Give each reduction stored narrower than it sums (``compute(store_dtype=)``) or through an
    epilogue (``compute(epilogue=)``) a write cache that holds all of its reduction, so that its sums
    are finished once, when complete (as NumPy's float32 product cast to float16; the epilogue
    applied as the cache is written back): one at the loop just outside its reduction loops where it has none
    (added to ``sched``, which ``lower`` restores); a write cache that holds only part of the
    reduction was refused by the primitive that made it so (``check_narrowed_write_caches``)."""
    for comp in sched.computations:
        loop = pending_sum_cache(sched, comp.name)
        if loop is not False:
            sched[comp.name].cache_write(loop)
    check_narrowed_write_caches(sched)


def check_schedule(sched: Schedule, target: Target) -> None:
    """Reject what ``target`` cannot run as scheduled: instructions it lacks (a tensor intrinsic
    or asynchronous copies its features do not include) and, on a GPU, a computation left on the
    host or a per-thread cache (registers) placed above thread-bound loops, which would hold the
    values of many threads that no single thread has."""
    for name, st in sched.states.items():
        for loop, tag in st.tags.items():
            intr = tensor_intrinsic(tag)
            if intr is not None and not all(target.has(f) for f in intr.features):
                lacking = "; ".join(f"{f} ({FEATURES[f]})" for f in intr.features if not target.has(f))
                usable = [t.name for t in target.tensor_intrinsics]
                raise LoweringError(
                    f"{name} is tensorized with {intr.name} at loop {loop}, which needs {lacking}; the target "
                    f"({target.key}) lacks it: "
                    + (f"use tensorize(..., {usable[0]!r}) there" if usable else
                       "it has no tensor-core instructions, so leave the nest to the CUDA cores"))
    copied = [c.name for c in sched.caches if c.name in sched.pipelines and c.loc == "shared"]
    if copied and not target.has("cp.async"):
        raise LoweringError(f"pipeline of {', '.join(copied)} fills shared memory with cp.async, which the target "
                            f"({target.key}) lacks; build for sm_80 or newer, or do not pipeline the caches")
    if target.has("gpu"):
        _check_gpu_schedule(sched)


def _check_gpu_schedule(sched: Schedule) -> None:
    for cache in sched.caches:
        if cache.kind == "write" and cache.whole and cache.loc == "local":
            check_whole_products(sched, cache.consumer)
    for c in sched.computations:
        st = sched.states[c.name]
        if not c.axes:  # a scalar: a kernel of one block (its reduction loops may be bound to threads)
            continue
        if not any(t.startswith(("blockIdx", "threadIdx")) for t in st.tags.values()) and st.anchor is None:
            raise LoweringError(f"computation {c.name} runs on the host: on a GPU every computation needs "
                                f"its outermost loop bound to blockIdx "
                                f"(s[{c.name}].bind(loop, 'blockIdx.x'))")
    for cache in sched.caches:
        if cache.loc not in ("local", "auto"):
            continue
        # the computations reading it too are fused with its consumer down to the cache's loop: their
        # loops at its depth (named as they are named) are outside it
        start = 0 if cache.level is None else list(sched.states[cache.consumer].loops.names).index(cache.level) + 1
        for comp in (cache.consumer, *cache.also):
            loops = list(sched.states[comp].loops.names)
            tags = sched.states[comp].tags
            inner = [f"{loop} ({tags[loop]})" for loop in loops[start:]
                     if tags.get(loop, "").startswith("threadIdx")]
            if inner:
                what = "write cache" if cache.kind == "write" else f"cache of {cache.tensor}"
                where = "at the top" if cache.level is None else f"at loop {cache.level}"
                raise ScheduleError(
                    f"{what} {cache.name} of {comp} lives in the registers of one thread (loc={cache.loc!r}) "
                    f"but is placed {where}, above the thread-bound loop(s) {', '.join(inner)}: one thread "
                    "cannot hold or write back the values of the others. Place it at or inside loop "
                    f"{inner[-1].split()[0]}, or use loc='shared' for one buffer per thread block")
    for cache in sched.caches:  # a write cache inside a thread-bound reduction loop: each thread's part overwrites
        if cache.kind != "write" or cache.loc not in ("local", "auto"):
            continue
        st, stmt = sched.states[cache.consumer], sched.program.statements[cache.consumer]
        if not stmt.reduce_dims:
            continue
        names = list(st.loops.names)
        end = 0 if cache.level is None else names.index(cache.level) + 1
        bound = [f"{loop} ({st.tags[loop]})" for pos, loop in enumerate(names[:end])
                 if st.tags.get(loop, "").startswith("threadIdx") and st.loops.depends_on(pos, stmt.reduce_dims)]
        if bound:
            raise ScheduleError(
                f"write cache {cache.name} of {cache.consumer} is placed at or inside its reduction loop(s) "
                f"{', '.join(bound)} bound to threads: each thread would hold a part of the sum in its own "
                "registers and write it back over the others' (a cross-thread reduction combines partial sums in "
                "the accumulator itself). Drop the write cache, or bind the reduction loops to no threads")


def build_plan(sched: Schedule, copy_order: str = "cache") -> Plan:
    """The polyhedral part: every statement's schedule (caches included) and the isl AST.

    ``copy_order``: shared-memory copies loop over the tensor's indices (GPU: coalesced global
    reads) when "source"; other copies loop over the cache's layout (dense loops, contiguous
    packed writes)."""
    requests = cache_requests(sched, copy_order)
    separate = {n: set(st.separate) for n, st in sched.states.items() if st.separate}
    full = {n: {loop for loop, tag in st.tags.items() if tag in ("unroll", "vectorize")}
            for n, st in sched.states.items() if st.separate}
    return materialize(sched.program, sched.stage_schedules(), separate, requests, full)


def shape_expr(e: lx.Expr) -> ir.Expr:
    """A size expression (integers and parameters) in loop IR."""
    if isinstance(e, lx.Const):
        return ir.Const(int(e.value), dtypes.INDEX)
    if isinstance(e, lx.Param):
        return ir.Var(e.name)
    if isinstance(e, lx.Cast):
        return shape_expr(e.a)
    if isinstance(e, lx.BinOp) and e.op in ("+", "-", "*", "//", "%"):
        return ir.BinOp(e.op, shape_expr(e.a), shape_expr(e.b))
    raise LoweringError(f"size {e} must be built from integers and parameters")


def make_buffers(sched: Schedule, plan: Plan, target: Target) -> dict[str, ir.Buffer]:
    func = sched.func
    out: dict[str, ir.Buffer] = {}
    outputs = {o.name for o in func.outputs}
    for t in func.inputs:
        out[t.name] = ir.Buffer(t.name, t.dtype, tuple(shape_expr(d) for d in t.shape), "arg")
    for c in sched.computations:
        shape = tuple(shape_expr(d) for d in c.shape)
        if c.name in outputs:
            out[c.name] = ir.Buffer(c.name, c.dtype, shape, "arg")
        else:
            scope = _scope(sched.states[c.name].loc, target, c.name)
            if target.has("gpu") and scope == "auto":
                scope = "global"  # a GPU intermediate lives in device memory unless cached elsewhere
            out[c.name] = ir.Buffer(c.name, c.dtype, shape, scope)
    swizzles = {c.name: c.swizzle for c in sched.caches}
    for cb in plan.caches:
        dtype = func.tensor(cb.tensor).dtype
        if cb.kind == "write":  # sums stored narrower (compute(store_dtype=)) accumulate in their own type
            dtype = sched.computation(cb.tensor).value_dtype
        shape = tuple(aexpr(d, {}) for d in cb.shape)
        out[cb.name] = ir.Buffer(cb.name, dtype, shape, _scope(cb.loc, target, cb.name), swizzles.get(cb.name, 0))
    return out


def _scope(loc: str, target: Target, name: str) -> str:
    """The buffer scope of location ``loc`` on ``target`` (the locations it has: ``target.locations``)."""
    if loc not in target.locations:
        raise LoweringError(f"buffer {name}: location {loc!r} does not exist on a {target.kind} target; "
                            f"use one of {', '.join(target.locations)}")
    return target.locations[loc]
