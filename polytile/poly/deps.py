"""Exact dependences (isl dataflow) and the legality checks of schedules against them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from ..toolchain import quick_builds
from .lexopt import first_point
from .model import Statement, maps_of, project_out_params


@dataclass
class Dependence:
    kind: str  # "flow" (write then read), "anti" (read then write), "output" (write then write)
    tensor: str
    relation: isl.UnionMap  # source instance -> sink instance


@dataclass
class Violation:
    """A dependence that a schedule breaks, with one pair of instances as an example."""

    dep: Dependence
    source: str
    sink: str
    dim: int  # the schedule dimension (2d+1 position) where the order goes wrong, -1 if equal

    def describe(self) -> str:
        what = {"flow": f"{self.dep.tensor} is written by the first and read by the second",
                "anti": f"{self.dep.tensor} is read by the first and then overwritten by the second",
                "output": f"{self.dep.tensor} is written by both, in this order"}[self.dep.kind]
        return f"{self.source} must run before {self.sink} ({what})"


def _union(maps: list[isl.Map]) -> isl.UnionMap:
    out: isl.UnionMap | None = None
    for m in maps:
        u = isl.UnionMap.from_map(m)
        out = u if out is None else out.union(u)
    assert out is not None
    return out


def schedule_union(sched: Mapping[str, isl.Map]) -> isl.UnionMap:
    return _union(list(sched.values()))


def compute_dependences(stmts: list[Statement], original: Mapping[str, isl.Map]) -> list[Dependence]:
    """Flow, anti and output dependences per tensor under the original (program-order) schedule.

    Domains are over-approximated where bounds are data-dependent, so the dependences are a
    superset of the real ones: a schedule that respects them is legal for any data.
    """
    sched = _union([original[s.name].intersect_domain(s.over_domain()) for s in stmts])
    tensors = sorted({a.tensor for s in stmts for a in s.writes})
    out: list[Dependence] = []
    for t in tensors:
        must_w = [_over(s, a.relation) for s in stmts for a in s.writes if a.tensor == t and a.exact]
        may_w = [_over(s, a.relation) for s in stmts for a in s.writes if a.tensor == t and not a.exact]
        reads = [_over(s, a.relation) for s in stmts for a in s.reads if a.tensor == t]
        writes = must_w + may_w
        if reads:
            info = isl.UnionAccessInfo.from_sink(_union(reads))
            if must_w:
                info = info.set_must_source(_union(must_w))
            if may_w:
                info = info.set_may_source(_union(may_w))
            flow = info.set_schedule_map(sched).compute_flow().get_may_dependence()
            if not flow.is_empty():
                out.append(Dependence("flow", t, flow))
            info = isl.UnionAccessInfo.from_sink(_union(writes)).set_may_source(_union(reads))
            if must_w:
                info = info.set_kill(_union(must_w))
            anti = info.set_schedule_map(sched).compute_flow().get_may_dependence()
            if not anti.is_empty():
                out.append(Dependence("anti", t, anti))
        info = isl.UnionAccessInfo.from_sink(_union(writes))
        if must_w:
            info = info.set_must_source(_union(must_w))
        if may_w:
            info = info.set_may_source(_union(may_w))
        output = info.set_schedule_map(sched).compute_flow().get_may_dependence()
        if not output.is_empty():
            out.append(Dependence("output", t, output))
    return out


def _over(s: Statement, rel: isl.Map) -> isl.Map:
    return project_out_params(rel, s.dyn_params)


def first_violation(deps: list[Dependence], sched: Mapping[str, isl.Map],
                    relaxed: frozenset[str] = frozenset()) -> Violation | None:
    """The first dependence whose source does not run strictly before its sink under ``sched``.

    ``relaxed``: reductions whose accumulation order may change (their update-to-update
    dependences are not enforced; the initialization still comes first)."""
    quick = quick_builds()
    theta: isl.UnionMap | None = None
    ge: isl.UnionMap | None = None
    for d in deps:
        if quick and not _out_of_order(_drop_relaxed(d, d.relation, relaxed), sched):
            continue
        if theta is None:
            theta = schedule_union(sched)
            ge = theta.lex_ge_union_map(theta)
        bad = _drop_relaxed(d, d.relation.intersect(ge), relaxed)
        if not bad.is_empty():
            return _example(d, bad, theta)
    return None


def _times(rel: isl.UnionMap, sched: Mapping[str, isl.Map]) -> list[isl.Map]:
    """The pairs of ``rel`` as pairs of schedule times, one map per pair of statements: each map of
    the dependence taken through its two statements' schedules alone (through the union of every
    statement's schedule, isl matches each map against all of them; a third of a check's time)."""
    out = []
    for m in maps_of(rel):
        src, dst = sched.get(m.get_tuple_name(isl.dim_type.in_)), sched.get(m.get_tuple_name(isl.dim_type.out))
        if src is not None and dst is not None:  # an unscheduled end has no time: no pair, as through the union
            out.append(m.apply_domain(src).apply_range(dst))
    return out


def _out_of_order(rel: isl.UnionMap, sched: Mapping[str, isl.Map]) -> bool:
    """Whether ``sched`` runs the source of some pair of ``rel`` at or after its sink, the same
    question as a non-empty ``rel ∩ theta.lex_ge_union_map(theta)`` asked in the schedule space: the
    instances' order relates every two statements of the schedule (tens of maps, each a disjunction
    over the schedule dimensions), of which a dependence touches a few; building it was half of a
    GEMM candidate's schedule checks (0.17 s). Quick builds ask this first and build the order only
    for a dependence broken, to name its first pair (``toolchain.quick_builds``)."""
    if rel.is_empty():
        return False
    for times in _times(rel, sched):
        space = times.get_space()
        if space.domain().is_equal(space.range()) and not times.intersect(isl.Map.lex_ge(space.domain())).is_empty():
            return True
    return False


def _drop_relaxed(d: Dependence, rel: isl.UnionMap, relaxed: frozenset[str]) -> isl.UnionMap:
    if d.tensor not in relaxed or rel.is_empty():
        return rel
    n = _arity(rel, d.tensor)
    if n < 0:
        return rel
    own = isl.UnionSet(f"{{ {d.tensor}[{', '.join(f'x{k}' for k in range(n))}] }}")
    return rel.subtract(isl.UnionMap.from_domain_and_range(own, own))


def carried_violation(deps: list[Dependence], sched: Mapping[str, isl.Map], dim: int,
                      width: int, reduction_of: frozenset[str] = frozenset(), inside: set[str] | None = None
                      ) -> Violation | None:
    """A dependence carried by schedule dimension ``dim`` (its two ends differ first there).

    ``reduction_of``: update statements of reductions whose own accumulation may be carried
    (a cross-thread reduction combines the partial results in a fixed tree). Quick builds compare
    each dependence's pairs of times (``_times``) first and relate every two statements' instances
    only for a dependence carried, to name its first pair (``toolchain.quick_builds``)."""
    xs = [f"t{k}" for k in range(width)]
    ys = [f"u{k}" for k in range(width)]
    eq = " and ".join(f"{a} = {b}" for a, b in zip(xs[:dim], ys[:dim]))
    text = f"{{ [{', '.join(xs)}] -> [{', '.join(ys)}] : {eq + ' and ' if eq else ''}" \
           f"({xs[dim]} < {ys[dim]} or {xs[dim]} > {ys[dim]}) }}"
    if quick_builds():
        differ = isl.Map(text)  # two times equal before ``dim`` and not at it
        first = next((d for d in deps if _carries(d, sched, differ, reduction_of, inside)), None)
        if first is None:
            return None
        deps = [first]
    theta = schedule_union(sched)
    carried = theta.apply_range(isl.UnionMap(text)).apply_range(theta.reverse())
    for d in deps:
        rel = d.relation.intersect(carried)
        if inside is not None:
            rel = _between(rel, inside)
        if reduction_of:
            rel = _drop_relaxed(d, rel, reduction_of)
        if not rel.is_empty():
            return _example(d, rel, theta)
    return None


def _carries(d: Dependence, sched: Mapping[str, isl.Map], differ: isl.Map, reduction_of: frozenset[str],
             inside: set[str] | None) -> bool:
    """Whether a pair of ``d`` (between statements ``inside``, reductions' own pairs left out) has times
    related by ``differ``."""
    rel = _drop_relaxed(d, d.relation, reduction_of) if reduction_of else d.relation
    if inside is not None:
        rel = _between(rel, inside)
    if rel.is_empty():
        return False
    return any(not times.intersect(differ).is_empty() for times in _times(rel, sched))


def _between(rel: isl.UnionMap, names: set[str]) -> isl.UnionMap:
    """The part of ``rel`` whose both ends are instances of the statements ``names``."""
    out: isl.UnionMap | None = None
    for m in maps_of(rel):
        if m.get_tuple_name(isl.dim_type.in_) in names and m.get_tuple_name(isl.dim_type.out) in names:
            u = isl.UnionMap.from_map(m)
            out = u if out is None else out.union(u)
    return out if out is not None else isl.UnionMap.empty(rel.get_space())


def _arity(rel: isl.UnionMap, name: str) -> int:
    for m in maps_of(rel):
        if m.get_tuple_name(isl.dim_type.in_) == name:
            return m.dim(isl.dim_type.in_)
    return -1


def first_pair(rel: isl.Map) -> isl.Point:
    """The lexicographically first pair of ``rel`` as one point (source coordinates, then target)."""
    return first_point(rel.wrap())


def _example(d: Dependence, bad: isl.UnionMap, theta: isl.UnionMap) -> Violation:
    m = maps_of(bad)[0]
    pt = first_pair(m)  # the first violating pair, for a stable message
    n_in = m.dim(isl.dim_type.in_)
    n_out = m.dim(isl.dim_type.out)
    src_vals = [pt.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(n_in)]
    dst_vals = [pt.get_coordinate_val(isl.dim_type.set, n_in + k).to_python() for k in range(n_out)]
    src_name, dst_name = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
    src = f"{src_name}[{', '.join(map(str, src_vals))}]"
    dst = f"{dst_name}[{', '.join(map(str, dst_vals))}]"
    params = {m.get_dim_name(isl.dim_type.param, k): pt.get_coordinate_val(isl.dim_type.param, k).to_python()
              for k in range(m.dim(isl.dim_type.param))}
    t_src = _image(theta, src_name, src_vals, params)
    t_dst = _image(theta, dst_name, dst_vals, params)
    dim = next((k for k, (a, b) in enumerate(zip(t_src, t_dst)) if a != b), -1)
    return Violation(d, src, dst, dim)


def _image(theta: isl.UnionMap, name: str, vals: list[int], params: dict[str, int]) -> list[int]:
    for m in maps_of(theta):
        if m.get_tuple_name(isl.dim_type.in_) == name:
            for pname, v in params.items():
                pos = m.find_dim_by_name(isl.dim_type.param, pname)
                if pos >= 0:
                    m = m.fix_val(isl.dim_type.param, pos, v)
            for k, v in enumerate(vals):
                m = m.fix_val(isl.dim_type.in_, k, v)
            pt = m.range().sample_point()
            return [pt.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(m.dim(isl.dim_type.out))]
    return []
