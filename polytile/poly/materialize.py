"""From a schedule to an AST: every statement (computations, caches, bindings) with its 2d+1 map.

Returns a ``Plan`` made of plain data: the AST and, per statement, what the loop-IR builder needs
(its kind, dimension names, the loop names of the schedule dimensions, cache index expressions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .astgen import Binding, Scheduled, generate
from .astnodes import AExpr, AstNode
from .cache import CacheBuffer, CacheRequest, CacheRewrite, build_caches
from .program import PolyProgram, StageSchedule
from .schedule import full_map


@dataclass
class StmtPlan:
    """How to emit statement ``name``: ``kind`` is compute, init, copy_in or copy_out."""

    name: str
    kind: str
    owner: str  # computation, or cache buffer for copies
    dims: list[str]
    loop_names: dict[int, str]  # odd schedule dimension -> loop name of the owner
    src_index: list[AExpr] = field(default_factory=list)  # copies: element read, over ``dims``
    dst_index: list[AExpr] = field(default_factory=list)  # copies: element written, over ``dims``
    rewrites: list[CacheRewrite] = field(default_factory=list)  # reads/writes redirected to caches


@dataclass
class Plan:
    ast: AstNode
    statements: dict[str, StmtPlan]
    bindings: list[Binding]
    caches: list[CacheBuffer]
    width: int


def materialize(program: PolyProgram, scheds: Mapping[str, StageSchedule], separate: Mapping[str, set[str]],
                caches: list[CacheRequest]) -> Plan:
    width = program.width(scheds)
    items: list[Scheduled] = []
    plans: dict[str, StmtPlan] = {}
    for name, s in scheds.items():
        stmt = program.statements[name]
        owner = program.owner_of[name]
        kind = "init" if name != owner else "compute"
        items.append(Scheduled(stmt, full_map(s.loops, s.statics, width)))
        plans[name] = StmtPlan(name, kind, owner, list(stmt.dims),
                               {2 * k + 1: n for k, n in enumerate(s.loops.names)})
    dyn_sources = program.dyn_sources()
    extra, buffers, rewrites = build_caches(program, items, scheds, caches, width, dyn_sources)
    for it, plan in extra:
        items.append(it)
        plans[plan.name] = plan
    for stmt_name, rws in rewrites.items():
        plans[stmt_name].rewrites.extend(rws)
    sep_dims: set[int] = set()
    for name, loops in separate.items():
        s = scheds[name]
        sep_dims |= {2 * s.loops.index(loop) + 1 for loop in loops}
    ast, bindings = generate(program.context, items, dict(program.dyn.owners), dyn_sources,
                             program.dyn_constraints, sep_dims, width)
    return Plan(ast, plans, bindings, buffers, width)
