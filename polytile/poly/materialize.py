"""From a schedule to an AST: every statement (computations, caches, bindings) with its 2d+1 map.

Returns a ``Plan`` made of plain data: the AST and, per statement, what the loop-IR builder needs
(its kind, dimension names, the loop names of the schedule dimensions, cache index expressions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial

from .astgen import Binding, Scheduled, dim_range, full_tiles, generate
from .astnodes import AExpr, AstNode
from .cache import CacheBuffer, CachePlan, CacheRequest, CacheRewrite, build_caches, copy_width
from .program import PolyProgram, StageSchedule
from .schedule import full_function, full_inverse, full_map, full_map_everywhere


@dataclass
class StmtPlan:
    """How to emit statement ``name``: ``kind`` is compute, init, copy_in, copy_out, fill, alloc, free."""

    name: str
    kind: str
    owner: str  # computation, or cache buffer for copies
    dims: list[str]
    loop_names: dict[int, str]  # odd schedule dimension -> loop name of the owner
    elem_index: list[AExpr] = field(default_factory=list)  # copies: the tensor element, over ``dims``
    cache_index: list[AExpr] = field(default_factory=list)  # copies in cache order: the cache element
    cache_rewrite: CacheRewrite | None = None  # copies in source order: tensor element -> cache element
    fill_value: object = None  # "fill" statements: the value every element of the cache starts with
    zfill: bool = False  # copies of whole tiles: elements outside the tensor read as zero
    guard_inside: bool = False  # write-backs of whole tiles: only the elements inside the tensor
    rewrites: list[CacheRewrite] = field(default_factory=list)  # reads/writes redirected to caches


@dataclass
class Plan:
    ast: AstNode
    statements: dict[str, StmtPlan]
    bindings: list[Binding]
    caches: list[CacheBuffer]
    width: int
    items: list[Scheduled] = field(default_factory=list)

    def dim_range(self, d: int, stmts: set[str], constant: bool = False) -> tuple[AExpr, AExpr]:
        """[lo, hi] of schedule dimension ``d`` over the statements ``stmts`` (GPU launch bounds)."""
        return dim_range(self.context, [it for it in self.items if it.stmt.name in stmts], d, constant)

    context: object = None


def plan_statements(program: PolyProgram, scheds: Mapping[str, StageSchedule], caches: list[CacheRequest],
                    codegen: bool = True) -> tuple[list[Scheduled], dict[str, StmtPlan], CachePlan, int]:
    """Every statement to generate (computations and the caches' copies and scopes) with its full
    schedule and plan, the caches' plan, and the schedule width (``codegen``: with the index
    expressions the code generator needs). Statements that never run get no code (isl cannot
    schedule or measure empty sets), nor do caches serving only them."""
    live = {name for name in scheds if program.runs(name)}
    scheds = {name: s for name, s in scheds.items() if name in live}
    caches = [replace(r, also=tuple(o for o in r.also if o in live)) for r in caches if r.consumer in live]
    width = program.width(scheds) if scheds else 1
    for req in caches:
        width = max(width, copy_width(req, program.func.tensor(req.tensor).ndim))
    items: list[Scheduled] = []
    plans: dict[str, StmtPlan] = {}
    for name, s in scheds.items():
        stmt = program.statements[name]
        owner = program.owner_of[name]
        kind = "init" if name != owner else "compute"
        items.append(Scheduled(stmt, full_map(s.loops, s.statics, width),
                               partial(full_map_everywhere, s.loops, s.statics, width),
                               full_function(s.loops, s.statics, width), full_inverse(s.loops, width)))
        plans[name] = StmtPlan(name, kind, owner, list(stmt.dims),
                               {2 * k + 1: n for k, n in enumerate(s.loops.names)})
    cache_plan = build_caches(program, items, scheds, caches, width, program.dyn_sources(), codegen)
    items = [it for it in items if it.stmt.name not in cache_plan.dropped]
    for it, plan in cache_plan.statements:
        items.append(it)
        plans[plan.name] = plan  # type: ignore[attr-defined]
    for stmt_name, rws in cache_plan.rewrites.items():
        plans[stmt_name].rewrites.extend(rws)
    return items, plans, cache_plan, width


def materialize(program: PolyProgram, scheds: Mapping[str, StageSchedule], separate: Mapping[str, set[str]],
                caches: list[CacheRequest], full_loops: Mapping[str, set[str]] | None = None) -> Plan:
    """``separate``: loops whose full tiles are generated apart; ``full_loops``: the inner loops that
    must be full there (those to unroll or vectorize; all inner loops when not given)."""
    items, plans, cache_plan, width = plan_statements(program, scheds, caches)
    separate = {name: loops for name, loops in separate.items() if name in plans}
    isolate = []
    by_name = {it.stmt.name: it for it in items}
    for name, loops in separate.items():
        if loops:
            sl = scheds[name].loops
            d = max(2 * sl.index(loop) + 1 for loop in loops)
            wanted = (full_loops or {}).get(name)
            need = [2 * k + 1 for k, n in enumerate(sl.names) if 2 * k + 1 > d and (wanted is None or n in wanted)]
            if not need:
                # no unrolled or vectorized loop inside: every tile is full for them, and isolating
                # the whole image only splits every statement of the band (with a cache's copies
                # of a skewed, fused nest, isl's AST ran past its budget: fuzz seed 97 case 8543)
                continue
            isolate.append(full_tiles(by_name[name], d, width, need))
    ast, bindings = generate(program.context, items, dict(program.dyn.owners), program.dyn_sources(),
                             program.dyn_constraints, isolate, width)
    return Plan(ast, plans, bindings, cache_plan.buffers, width, items, program.context)
