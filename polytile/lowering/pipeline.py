"""Lowering, read top to bottom: a schedule becomes loop IR through one ordered list of passes.

``POLYTILE_DUMP=<dir>`` writes the IR after every pass to ``<dir>/<func>.<nn>-<pass>.txt``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .. import dtypes
from ..errors import LoweringError, ScheduleError
from ..lang import expr as lx
from ..poly.materialize import Plan, materialize
from ..schedule.memory import cache_requests, folded_name
from ..schedule.state import Schedule
from ..target import CPUTarget, CUDATarget
from . import loopir as ir
from .from_ast import IRBuilder, aexpr
from .passes.allocate import allocate_intermediates
from .passes.allreduce import cross_thread_reductions
from .passes.barriers import insert_barriers
from .passes.flatten import flatten_storage
from .passes.fragments import distribute_fragments
from .passes.gpu_vectorize import vectorize_copies
from .passes.kernels import outline_kernels
from .passes.pair_stores import pair_stores
from .passes.pipeline import pipeline_buffers
from .passes.registers import promote_registers
from .passes.simplify import simplify
from .passes.swizzle import swizzle_shared
from .passes.tensorize import tensorize_nests
from .passes.unroll import unroll_loops
from .passes.vectorize import vectorize_loops
from .passes.wgmma import async_proxy_fences


class _Log:
    def __init__(self, name: str):
        d = os.environ.get("POLYTILE_DUMP")
        self.dir = Path(d) if d else None
        self.name = name
        self.count = 0
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)

    def __call__(self, stage: str, body: ir.Stmt) -> None:
        if self.dir is None:
            return
        self.count += 1
        (self.dir / f"{self.name}.{self.count:02d}-{stage}.txt").write_text(ir.stmt_text(body) + "\n")


def lower(sched: Schedule, target: CPUTarget | CUDATarget, name: str | None = None) -> ir.LoweredFunc:
    """The loop IR of ``sched`` for ``target``: the whole compiler between schedule and printer."""
    func = sched.func
    name = name or func.name
    log = _Log(name)
    if isinstance(target, CUDATarget):
        check_gpu_schedule(sched, target)
    plan = build_plan(sched, "source" if isinstance(target, CUDATarget) else "cache")
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
    passes: list[tuple[str, Callable[[ir.Stmt], ir.Stmt]]]
    if isinstance(target, CUDATarget):
        passes = [
            ("allocate", lambda s: allocate_intermediates(s, intermediates)),
            ("simplify", simplify),
            ("tensorize", tensorize_nests),
            ("fragments", distribute_fragments),
            ("allreduce", cross_thread_reductions),
            ("kernels", lambda s: outline_kernels(s, target, name)),
            ("pipeline", lambda s: pipeline_buffers(s, dict(sched.pipelines), dict(sched.pipeline_inflight))),
            ("simplify", simplify),
            ("unroll", lambda s: unroll_loops(s, ("unroll", "vectorize"))),
            ("flatten", flatten_storage),
            ("simplify", simplify),
            ("gpu-vectorize", lambda s: vectorize_copies(s)),
            ("registers", promote_registers),
            ("barriers", insert_barriers),
            ("async-proxy", async_proxy_fences),
            ("simplify", simplify),
            ("pair-stores", pair_stores),
            ("swizzle", swizzle_shared),
        ]
    else:
        passes = [
            ("allocate", lambda s: allocate_intermediates(s, intermediates)),
            ("simplify", simplify),
            ("unroll", unroll_loops),
            ("flatten", flatten_storage),
            ("simplify", simplify),
            ("vectorize", lambda s: vectorize_loops(s, target)),
            ("simplify", simplify),
            ("registers", promote_registers),
            ("simplify", simplify),
        ]
    for stage, fn in passes:
        body = fn(body)
        log(stage, body)

    args = [buffers[t.name] for t in func.inputs] + [buffers[t.name] for t in func.outputs]
    params = [ir.Var(p.name) for p in func.params]
    return ir.LoweredFunc(name, args, params, body, [t.name for t in func.outputs])


def check_gpu_schedule(sched: Schedule, target: CUDATarget) -> None:
    """Reject what a GPU cannot run as scheduled: a computation left on the host, a per-thread
    cache (registers) placed above thread-bound loops, which would hold the values of many threads
    that no single thread has, and instructions the target lacks (wgmma outside sm_90a)."""
    for name, st in sched.states.items():
        if "tensorize_wgmma" in st.tags.values() and target.arch != "sm_90a":
            raise LoweringError(f"{name} is tensorized with wgmma, which only sm_90a (H100/H200) has; the target is "
                                f"{target.arch}: use tensorize(..., 'mma_m16n8k16') (gemm_tensorcore) there")
    for c in sched.computations:
        st = sched.states[c.name]
        if not any(t.startswith(("blockIdx", "threadIdx")) for t in st.tags.values()) and st.anchor is None:
            raise LoweringError(f"computation {c.name} runs on the host: on a GPU every computation needs "
                                f"its outermost loop bound to blockIdx "
                                f"(s[{c.name}].bind(loop, 'blockIdx.x'))")
    for cache in sched.caches:
        if cache.loc not in ("local", "auto"):
            continue
        for comp in (cache.consumer, *cache.also):
            loops = list(sched.states[comp].loops.names)
            tags = sched.states[comp].tags
            start = 0 if cache.level is None else loops.index(cache.level) + 1
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


def make_buffers(sched: Schedule, plan: Plan, target: CPUTarget | CUDATarget) -> dict[str, ir.Buffer]:
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
            if isinstance(target, CUDATarget) and scope == "auto":
                scope = "global"  # a GPU intermediate lives in device memory unless cached elsewhere
            out[c.name] = ir.Buffer(c.name, c.dtype, shape, scope)
    swizzles = {c.name: c.swizzle for c in sched.caches}
    for cb in plan.caches:
        dtype = func.tensor(cb.tensor).dtype
        shape = tuple(aexpr(d, {}) for d in cb.shape)
        out[cb.name] = ir.Buffer(cb.name, dtype, shape, _scope(cb.loc, target, cb.name), swizzles.get(cb.name, 0))
    return out


_CPU_SCOPES = {"auto": "auto", "heap": "heap", "stack": "stack"}
_GPU_SCOPES = {"auto": "auto", "global": "global", "shared": "shared", "local": "local",
               "constant": "constant", "heap": "global", "fragment": "fragment"}


def _scope(loc: str, target: CPUTarget | CUDATarget, name: str) -> str:
    table = _GPU_SCOPES if isinstance(target, CUDATarget) else _CPU_SCOPES
    if loc not in table:
        raise LoweringError(f"buffer {name}: location {loc!r} does not exist on a {target.kind} target; "
                            f"use one of {', '.join(table)}")
    return table[loc]
