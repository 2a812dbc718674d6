"""The legality of caches and stored buffers: their copies checked against the exact dependences.

A buffer changes where values travel, not what is computed. A statement whose accesses of tensor X
go to a buffer K (one per iteration P of K's loop) exchanges values with the rest of the program
only through K's copies: the copy-in at the start of the iteration stands for its reads of X, the
write-back at the end for its writes. So every dependence on X whose end is served by K is carried
over to the copy of that end's iteration, unless both ends are served by K in the same iteration
(the buffer carries that one). A stored buffer (store / store_at) has no copies: a value cannot
travel from one iteration to another. Buffers of one tensor are taken innermost first, so that a
chain (a cache whose copies reach the next buffer out) hands each dependence outward copy by copy.

The carried dependences, with each copy taken as one instance per iteration at its static position
(its inner loops run between two static positions, so nothing else interleaves with them), are then
checked against the schedule as the code will run it. The final values of an output are read by a
last statement, so that a write-back that comes too late (or never) is a broken dependence too.
"""

from __future__ import annotations

from collections.abc import Mapping

import islpy as isl

from ..errors import ScheduleError
from .cache import CachePlan, CacheUse
from .deps import Dependence, first_violation
from .model import INIT_SUFFIX, header, maps_of, project_out_params, tensor_bounds
from .program import STATIC_SCALE, PolyProgram, StageSchedule

_SIDES = {"flow": ("write", "read"), "anti": ("read", "write"), "output": ("write", "write")}
"""For each kind of dependence, the access of its source and of its sink."""

_COPY_OF_SIDE = {"read": "copy_in", "write": "copy_out"}


def check_caches(program: PolyProgram, original: Mapping[str, StageSchedule], scheds: Mapping[str, StageSchedule],
                 plan: CachePlan, width: int, relaxed: frozenset[str] = frozenset()) -> None:
    """Raise ScheduleError naming the buffer, the computations and the loop if a buffer of ``plan``
    (built for ``scheds``) breaks a dependence of the program; ``relaxed``: reassociated reductions."""
    if not plan.uses:
        return
    view = _View(program, scheds, plan, width)
    by_tensor: dict[str, list[CacheUse]] = {}
    for use in plan.uses:
        by_tensor.setdefault(use.tensor, []).append(use)
    outputs = {t.name for t in program.func.outputs}
    for tensor, uses in by_tensor.items():
        deps = [(d.kind, m) for d in program.dependences(original) if d.tensor == tensor for m in maps_of(d.relation)]
        if tensor in outputs:
            deps += [("flow", m) for m in maps_of(_final_writers(program, original, tensor))]
        for use in sorted(uses, key=lambda u: (-u.m, u.kind == "fold")):
            deps = [(kind, carried) for kind, m in deps for carried in view.carry(kind, m, use, relaxed)]
        for kind, m in deps:
            a, b = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
            if a in program.statements and b in program.statements:
                continue  # between computations: the schedule's own check covers it
            v = first_violation([Dependence(kind, tensor, isl.UnionMap.from_map(m))],
                                {a: view.schedule(a), b: view.schedule(b)})
            if v is not None:
                raise ScheduleError(view.explain(kind, tensor, v.source, v.sink))


def _final(tensor: str) -> str:
    return f"{tensor}__final"


def _final_writers(program: PolyProgram, original: Mapping[str, StageSchedule], tensor: str) -> isl.UnionMap:
    """{ W[x] -> X__final[e] }: the writes of output X that leave its final values."""
    width = program.width(original)
    bounds = tensor_bounds(program.func.tensor(tensor), program.params)
    final = _final(tensor)
    es = [f"e{k}" for k in range(bounds.dim(isl.dim_type.set))]
    sink = isl.Map(f"{header(program.params)}{{ {final}[{', '.join(es)}] -> {tensor}[{', '.join(es)}] }}")
    sink = sink.intersect_range(bounds)
    sched = isl.UnionMap.from_map(_final_schedule(final, len(es), len(original), width)
                                  .intersect_domain(sink.domain()))
    for m in program.full_maps(original).values():
        sched = sched.union(isl.UnionMap.from_map(m))
    writes = [project_out_params(a.relation, st.dyn_params) for st in program.statements.values()
              for a in st.writes if a.tensor == tensor]
    must = isl.UnionMap.from_map(writes[0])
    for w in writes[1:]:
        must = must.union(isl.UnionMap.from_map(w))
    info = isl.UnionAccessInfo.from_sink(isl.UnionMap.from_map(sink)).set_must_source(must)
    return info.set_schedule_map(sched).compute_flow().get_may_dependence()


def _final_schedule(name: str, ndim: int, n_comps: int, width: int) -> isl.Map:
    """The final reads of an output after everything else (static positions stay below this)."""
    es = [f"e{k}" for k in range(ndim)]
    outs = [str(STATIC_SCALE * (n_comps + 2))] + ["0"] * (width - 1)
    return isl.Map(f"{{ {name}[{', '.join(es)}] -> [{', '.join(outs)}] }}")


class _View:
    """The statements as the checked code runs them: computations by their full schedules, each
    copy as one instance per iteration of its buffer's loop, and the final reads of outputs."""

    def __init__(self, program: PolyProgram, scheds: Mapping[str, StageSchedule], plan: CachePlan, width: int):
        self.program = program
        self.scheds = scheds
        self.width = width
        self.full = program.full_maps(scheds, width)
        self.uses = {u.name: u for u in plan.uses}
        self.copies: dict[str, tuple[CacheUse, str, isl.Map]] = {}
        dyn = list(program.dyn.exprs)
        for use in plan.uses:
            for kind, (iterations, static) in use.copies.items():
                name = f"{use.name}__{kind}"
                ps = [f"p{k}" for k in range(use.m)]
                outs = ps + [str(static)] + ["0"] * (width - use.m - 1)
                sched = isl.Map(f"{{ {name}[{', '.join(ps)}] -> [{', '.join(outs)}] }}")
                dom = project_out_params(iterations, dyn).set_tuple_name(name)
                self.copies[name] = (use, kind, sched.intersect_domain(dom))

    def schedule(self, name: str) -> isl.Map:
        if name in self.full:
            return self.full[name]
        if name in self.copies:
            return self.copies[name][2]
        tensor = name[:-len("__final")]
        return _final_schedule(name, self.program.func.tensor(tensor).ndim, len(self.scheds), self.width)

    def prefix(self, name: str, m: int) -> isl.Map:
        """{ T[x] -> [P] }: the iteration of a depth-``m`` loop in which statement (or copy) T runs."""
        sched = self.schedule(name)
        return sched.project_out(isl.dim_type.out, m, self.width - m)

    def carry(self, kind: str, dep: isl.Map, use: CacheUse, relaxed: frozenset[str]) -> list[isl.Map]:
        """The dependence ``dep`` (one pair of statements) once ``use``'s buffer serves its ends."""
        a, b = dep.get_tuple_name(isl.dim_type.in_), dep.get_tuple_name(isl.dim_type.out)
        a_side, b_side = _SIDES[kind]
        a_in = a_side in use.users.get(a, ())
        b_in = b_side in use.users.get(b, ())
        if not (a_in or b_in):
            return [dep]
        out: list[isl.Map] = []
        across = dep
        if a_in and b_in:  # the buffer carries the values exchanged within one iteration
            same = self.prefix(a, use.m).apply_range(self.prefix(b, use.m).reverse())
            inside = dep.intersect(same.align_params(dep.get_space()))
            across = dep.subtract(inside)
            if not inside.is_empty():
                out.append(inside)
        if across.is_empty():
            return out
        if use.kind == "fold":
            if kind == "flow":
                raise ScheduleError(self._across_fold(use, across))
            return out  # two iterations use two buffers: neither overwrites what the other reads
        if a == b == use.consumer and use.consumer in relaxed:
            # a reassociated reduction accumulates in any order of the iterations, each starting
            # from the tensor's values: the buffer must be loaded
            self._end(use, a, "read", across, kind)
            return out
        if a_in:
            across = across.apply_domain(self._end(use, a, a_side, across, kind))
        if b_in:
            across = across.apply_range(self._end(use, b, b_side, across, kind))
        out.append(across)
        return out

    def _end(self, use: CacheUse, stmt: str, side: str, dep: isl.Map, kind: str) -> isl.Map:
        """{ T[x] -> copy[P] }: the copy that stands for statement T's access (``side``) of the tensor."""
        copy = _COPY_OF_SIDE[side]
        if copy not in use.copies:
            src, dst = _pair(dep)
            raise ScheduleError(f"write cache {use.name} of {use.consumer} {self._at(use)}: {dst} reads the value of "
                                f"{use.tensor} that {src} leaves in another iteration of that loop, but the buffer "
                                "starts every iteration from the initialization (it is not loaded); place the "
                                "cache where each element's whole reduction runs inside one iteration")
        name = f"{use.name}__{copy}"
        return self.prefix(stmt, use.m).set_tuple_name(isl.dim_type.out, name)

    # --- messages ---------------------------------------------------------------------------------
    def _at(self, use: CacheUse) -> str:
        if use.level is None:
            return "(placed at the top)"
        return f"(placed at loop {self.scheds[use.consumer].loops.names[use.level]})"

    def _across_fold(self, use: CacheUse, dep: isl.Map) -> str:
        src, dst = _pair(dep)
        where = "" if use.level is None else f" {self.scheds[use.consumer].loops.names[use.level]}"
        return (f"store_at of {use.tensor} at loop{where} of {use.consumer}: {dst} reads {use.tensor} as {src} left "
                f"it in another iteration of that loop, but the stored buffer holds one iteration's elements "
                "only; store it at an outer loop, or fuse the reader into the iteration that writes what it reads")

    def explain(self, kind: str, tensor: str, source: str, sink: str) -> str:
        """The message for a broken dependence from instance ``source`` to ``sink`` (as printed by
        ``Violation``), in terms of the buffers whose copies it involves."""
        a, b = source.split("[")[0], sink.split("[")[0]
        if b in self.copies and self.copies[b][1] == "copy_in" and self.copies[b][0].kind == "read" \
                and a not in self.copies:
            use = self.copies[b][0]
            return (f"cache {use.name} of {tensor} for {use.consumer} {self._at(use)}: its copy "
                    f"({self._copy(sink)}) runs before {source} writes what it copies"
                    + self._hint(use, a))
        if a in self.copies and self.copies[a][1] == "copy_in" and self.copies[a][0].kind == "read" \
                and b not in self.copies:
            use = self.copies[a][0]
            return (f"cache {use.name} of {tensor} for {use.consumer} {self._at(use)}: {sink} overwrites "
                    f"{tensor} before the copy ({self._copy(source)}) reads the values {use.consumer} needs"
                    + self._hint(use, b))
        if a in self.copies and self.copies[a][1] == "copy_out" and b not in self.copies:
            use = self.copies[a][0]
            what = "reads" if kind == "flow" else "overwrites"
            return (f"write cache {use.name} of {use.consumer} {self._at(use)}: {sink} {what} {tensor} before the "
                    f"cache writes it back ({self._copy(source)})" + self._hint(use, b))
        if b in self.copies and a not in self.copies:
            use = self.copies[b][0]
            first = "reads" if kind == "anti" else "writes"
            return (f"cache {use.name} of {tensor} for {use.consumer} {self._at(use)}: {source} {first} {tensor} "
                    f"and must run before {self._copy(sink)}" + self._hint(use, a))
        return (f"caches of {tensor}: {self._copy(source) if a in self.copies else source} must run before "
                f"{self._copy(sink) if b in self.copies else sink}, but the copies are placed the other way round; "
                "place the caches at the loops where the computations that exchange these values are fused")

    def _copy(self, instance: str) -> str:
        name, _, rest = instance.partition("[")
        use, kind, _ = self.copies[name]
        what = {"copy_in": "the copy into", "copy_out": "the write-back of", "fill": "the fill of"}[kind]
        return f"{what} {use.name} in iteration [{rest}" if use.m else f"{what} {use.name}"

    def _hint(self, use: CacheUse, other: str) -> str:
        """Where the cache would see the other computation's accesses in time: inside the loops it
        shares with the cache's computation."""
        comp = self.program.owner_of.get(other)
        if comp is None or comp not in self.scheds or comp == use.consumer:
            return ""
        if other.endswith(INIT_SUFFIX):
            other = comp
        mine, theirs = self.scheds[use.consumer], self.scheds[other]
        shared = 0
        while (shared < min(len(mine.statics), len(theirs.statics)) - 1
               and mine.statics[shared] == theirs.statics[shared]):
            shared += 1
        if shared == 0:
            return f"; {comp} runs in a separate loop nest: the cache cannot be placed between its writes and reads"
        loop = mine.loops.names[shared - 1]
        if use.level is not None and use.level >= shared - 1:
            return ""
        return f"; {comp} is fused with {use.consumer} inside loop {loop}: place the cache at or inside that loop"


def _pair(dep: isl.Map) -> tuple[str, str]:
    """One pair of instances of a dependence, as text (the first, for a stable message)."""
    pt = dep.wrap().lexmin().sample_point()
    n_in, n_out = dep.dim(isl.dim_type.in_), dep.dim(isl.dim_type.out)
    vals = [pt.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(n_in + n_out)]
    a, b = dep.get_tuple_name(isl.dim_type.in_), dep.get_tuple_name(isl.dim_type.out)
    return (f"{a}[{', '.join(map(str, vals[:n_in]))}]", f"{b}[{', '.join(map(str, vals[n_in:]))}]")
