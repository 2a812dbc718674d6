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

A computation inlined into its caches' copies (compute_inline after cache) has no statement: the
copies compute its elements from what it reads. Its readers' dependences on those tensors' writers
are made up through its body (its reads, composed with theirs) and carried to the copies the same
way: the copies must wait for every write of what they compute from.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import islpy as isl

from ..errors import ScheduleError
from .cache import CachePlan, CacheRequest, CacheUse
from .deps import Dependence, first_pair, first_violation
from .materialize import plan_statements
from .model import header, maps_of, project_out_params, tensor_bounds
from .program import STATIC_SCALE, PolyProgram, StageSchedule

_SIDES = {"flow": ("write", "read"), "anti": ("read", "write"), "output": ("write", "write")}
"""For each kind of dependence, the access of its source and of its sink."""

_COPY_OF_SIDE = {"read": "copy_in", "write": "copy_out"}


def check_buffers(program: PolyProgram, original: Mapping[str, StageSchedule], scheds: Mapping[str, StageSchedule],
                  requests: list[CacheRequest], relaxed: frozenset[str] = frozenset()) -> None:
    """Build the buffers of ``requests`` for the loops ``scheds`` and check them: ScheduleError if one
    cannot be built or breaks a dependence (``original``: the program order)."""
    try:
        _, _, plan, width = plan_statements(program, scheds, requests, codegen=False)
        check_caches(program, original, scheds, plan, width, relaxed)
    except isl.Error as err:  # a footprint isl cannot bound or split: a limitation, said as such
        names = ", ".join(r.name for r in requests)
        raise ScheduleError(f"the buffers {names} cannot be built for this schedule (isl: {err})") from None


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
    order = sorted(plan.uses, key=lambda u: (-u.m, u.kind == "fold"))
    for virtual in program.virtual:
        for source, dep in _through_virtual(program, virtual):
            fold = next((u for u in order if u.tensor == source and u.kind == "fold"), None)
            if fold is not None:
                raise ScheduleError(f"{'store' if fold.level is None else 'store_at'} of {source}: {virtual} is "
                                    f"computed inside the copies of its caches (inlined after caching it), which "
                                    f"read {source} itself, not its stored buffer; drop the store of {source} or "
                                    f"keep {virtual} a computation")
            deps = [dep]  # the reader's end goes to the copy of its cache, then the writer's to its buffer's
            for tensor in (virtual, source):
                for use in (u for u in order if u.tensor == tensor):
                    deps = [carried for m in deps for carried in view.carry("flow", m, use, relaxed)]
            for m in deps:
                a, b = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
                v = first_violation([Dependence("flow", source, isl.UnionMap.from_map(m))],
                                    {a: view.schedule(a), b: view.schedule(b)})
                if v is not None:
                    raise ScheduleError(view.explain("flow", source, v.source, v.sink))


_THROUGH: weakref.WeakKeyDictionary[PolyProgram, dict[str, list[tuple[str, isl.Map]]]] = weakref.WeakKeyDictionary()


def _through_virtual(program: PolyProgram, virtual: str) -> list[tuple[str, isl.Map]]:
    """(Y, { W[w] -> R[r] }) for each tensor Y that ``virtual`` (a computation inlined into its caches'
    copies) reads: W writes an element of Y that the copy computing the element of ``virtual`` read
    by R reads. The program has no statement of ``virtual``, so no dependence of R on Y; every write
    of Y comes before every read of ``virtual`` in the program order (its producer runs first)."""
    known = _THROUGH.setdefault(program, {})
    if virtual not in known:
        readers = [project_out_params(a.relation, st.dyn_params) for st in program.statements.values()
                   for a in st.reads if a.tensor == virtual]
        out = []
        for acc in program.virtual[virtual].reads:
            writes = [project_out_params(a.relation, st.dyn_params) for st in program.statements.values()
                      for a in st.writes if a.tensor == acc.tensor]
            for read in readers:
                through = read.apply_range(acc.relation)  # { R[r] -> Y[y] }
                for write in writes:
                    dep = write.apply_range(through.reverse())
                    if not dep.is_empty():
                        out.append((acc.tensor, dep))
        known[virtual] = out
    return known[virtual]


def _final(tensor: str) -> str:
    return f"{tensor}__final"


_FINAL_WRITERS: weakref.WeakKeyDictionary[PolyProgram, dict[str, isl.UnionMap]] = weakref.WeakKeyDictionary()


def _final_writers(program: PolyProgram, original: Mapping[str, StageSchedule], tensor: str) -> isl.UnionMap:
    """{ W[x] -> X__final[e] }: the writes of output X that leave its final values (computed once per
    program: ``original`` is its program order)."""
    known = _FINAL_WRITERS.setdefault(program, {})
    if tensor not in known:
        known[tensor] = _last_writes(program, original, tensor)
    return known[tensor]


def _last_writes(program: PolyProgram, original: Mapping[str, StageSchedule], tensor: str) -> isl.UnionMap:
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
            self._end(use, a, "read", across)
            return out
        if a_in:
            across = across.apply_domain(self._end(use, a, a_side, across))
        if b_in:
            across = across.apply_range(self._end(use, b, b_side, across))
        out.append(across)
        return out

    def _end(self, use: CacheUse, stmt: str, side: str, dep: isl.Map) -> isl.Map:
        """{ T[x] -> copy[P] }: the copy that stands for statement T's access (``side``) of the tensor;
        ``dep`` (a dependence across iterations) is the example of a message if there is none."""
        copy = _COPY_OF_SIDE[side]
        if copy not in use.copies:
            src, dst = _pair(dep)
            if copy == "copy_out":  # only a write cache's computation writes through a buffer
                raise ScheduleError(f"cache {use.name} of {use.tensor}: {stmt} writes {use.tensor} through it, "
                                    f"but it has no write-back ({src} -> {dst})")
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
        return (f"store_at of {use.tensor} {self._at(use)}: {dst} reads {use.tensor} as {src} left "
                f"it in another iteration of that loop, but the stored buffer holds one iteration's elements "
                "only; store it at an outer loop, or fuse the reader into the iteration that writes what it reads")

    def explain(self, kind: str, tensor: str, source: str, sink: str) -> str:
        """The message for a broken dependence from instance ``source`` to ``sink`` (as printed by
        ``Violation``): a copy runs too early (the sink) or too late (the source)."""
        a, b = source.split("[")[0], sink.split("[")[0]
        if b in self.copies:
            use, copy_kind, _ = self.copies[b]
            other, text = a, self._describe(source)
            verb = "reads" if kind == "anti" else "writes"
            what = "what it copies" if copy_kind == "copy_in" else tensor
            msg = f"{self._copy(sink)} runs before {text} {verb} {what}"
        else:
            use, copy_kind, _ = self.copies[a]
            other, text = b, self._describe(sink)
            if copy_kind == "copy_out":
                msg = f"{text} {'reads' if kind == 'flow' else 'overwrites'} {tensor} before {self._copy(source)}"
            else:
                msg = f"{text} overwrites {tensor} before {self._copy(source)} reads it"
        return f"{self._head(use)}: {msg}" + self._hint(use, other)

    def _head(self, use: CacheUse) -> str:
        if use.kind == "write":
            return f"write cache {use.name} of {use.consumer} {self._at(use)}"
        return f"cache {use.name} of {use.tensor} for {use.consumer} {self._at(use)}"

    def _describe(self, instance: str) -> str:
        """An end of a dependence: a computation's instance, or a copy of another buffer."""
        name = instance.split("[")[0]
        if name not in self.copies:
            return instance
        use = self.copies[name][0]
        owner = f"write cache of {use.consumer}" if use.kind == "write" else f"cache for {use.consumer}"
        return f"{self._copy(instance)} ({owner})"

    def _copy(self, instance: str) -> str:
        name, _, rest = instance.partition("[")
        use, kind, _ = self.copies[name]
        what = {"copy_in": "the copy into", "copy_out": "the write-back of", "fill": "the fill of"}[kind]
        if not use.m:
            return f"{what} {use.name}"
        values = rest.rstrip("]").split(", ")[1::2]  # the loops' values (the static positions between)
        loops = self.scheds[use.consumer].loops.names
        return f"{what} {use.name} at {', '.join(f'{n} = {v}' for n, v in zip(loops, values))}"

    def _hint(self, use: CacheUse, other: str) -> str:
        """Where the caches would see the other end in time: at or inside the loops the two
        computations share (the other end is a computation, or a copy of another buffer)."""
        placed = [use]
        if other in self.copies:
            placed.append(self.copies[other][0])
            other = self.copies[other][0].consumer
        comp = self.program.owner_of.get(other)
        if comp is None or comp not in self.scheds or comp == use.consumer:
            return ""
        mine, theirs = self.scheds[use.consumer], self.scheds[comp]
        shared = 0
        while (shared < min(len(mine.statics), len(theirs.statics)) - 1
               and mine.statics[shared] == theirs.statics[shared]):
            shared += 1
        if shared == 0:
            return f"; {comp} runs in a separate loop nest: the cache cannot be placed between its writes and reads"
        loop = mine.loops.names[shared - 1]
        above = [u.name for u in placed if u.level is None or u.level < shared - 1]
        if not above:
            return ""
        return (f"; {comp} is fused with {use.consumer} inside loop {loop}: place {' and '.join(above)} "
                "at or inside that loop")


def _pair(dep: isl.Map) -> tuple[str, str]:
    """One pair of instances of a dependence, as text (the first, for a stable message)."""
    pt = first_pair(dep)
    n_in, n_out = dep.dim(isl.dim_type.in_), dep.dim(isl.dim_type.out)
    vals = [pt.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(n_in + n_out)]
    a, b = dep.get_tuple_name(isl.dim_type.in_), dep.get_tuple_name(isl.dim_type.out)
    return (f"{a}[{', '.join(map(str, vals[:n_in]))}]", f"{b}[{', '.join(map(str, vals[n_in:]))}]")
