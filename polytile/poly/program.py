"""The polyhedral model of a function: statements, parameters, dependences and derived schedules.

This is the facade the schedule and lowering layers use; everything here returns plain Python
values or opaque wrappers (``LoopSchedule``), never raw isl objects to callers outside ``poly/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import islpy as isl

from ..errors import LanguageError, ScheduleError
from ..lang.expr import Expr, Load
from ..lang.func import Func
from ..lang.printer import expr_str
from ..lang.tensor import ComputeTensor, Placeholder
from ..toolchain import quick_builds
from .affine import DynParams, NotAffine, affine
from .astgen import Scheduled, binding_depth
from .deps import Dependence, Violation, carried_violation, compute_dependences, first_violation
from .limits import ISL_OPERATIONS, budget_spent
from .model import INIT_SUFFIX, Namer, Statement, computation_statements, constant_bounds, global_context, tensor_bounds
from .schedule import LoopSchedule, full_map

STATIC_SCALE = 16
"""Static positions of computations are spaced by this, leaving room around each for its
initialization (just before), cache copies (before) and write-backs (after)."""


@dataclass
class StageSchedule:
    """What the schedule layer knows of one statement's placement: loops and static positions."""

    loops: LoopSchedule
    statics: list[int]  # materialized static values, len(loops.names) + 1


class PolyProgram:
    """Statements of every computation of ``func`` (bodies after inlining) and their dependences."""

    def __init__(self, func: Func, bodies: Mapping[str, Expr], computations: Sequence[ComputeTensor],
                 virtual: Sequence[ComputeTensor] = ()):
        self.func = func
        self.params = [p.name for p in func.params]
        self.context = global_context(func.params, func.constraints, func.inputs)
        self.dyn = DynParams()
        self.statements: dict[str, Statement] = {}
        self.owner_of: dict[str, str] = {}  # statement -> computation
        for comp in computations:
            for st in computation_statements(comp, bodies[comp.name], self.params, self.dyn):
                if st.name in self.statements:
                    raise LanguageError(f"statement name {st.name} is used twice; rename tensor {comp.name}")
                self.statements[st.name] = st
                self.owner_of[st.name] = comp.name
        # computations inlined into their caches' copies (computed while copying): never scheduled,
        # but what a copy of their cache reads (``poly.cache_check``)
        self.virtual: dict[str, Statement] = {
            comp.name: computation_statements(comp, bodies[comp.name], self.params, DynParams())[-1]
            for comp in virtual}
        self.dyn_constraints = self._dyn_constraints()
        self._add_dyn_constraints()
        self._check_bounds()
        self._deps: list[Dependence] | None = None
        self._deps_refused: str | None = None
        # quick builds: results of the isl work below by the (immutable) loop schedule they came from,
        # which a schedule's checks ask for again after every primitive (``toolchain.quick_builds``)
        self._inits: dict[tuple[str, int], tuple[LoopSchedule, LoopSchedule]] = {}
        self._maps: dict[tuple[str, int, tuple[int, ...], int], tuple[LoopSchedule, isl.Map]] = {}

    # --- dynamic parameters ---------------------------------------------------------------------
    def _dyn_constraints(self) -> dict[str, list[str]]:
        """Declared value ranges and monotonicity of index arrays, as constraints on ``_dN``."""
        out: dict[str, list[str]] = {n: [] for n in self.dyn.exprs}
        loads: dict[str, Load] = {n: e for n, e in self.dyn.exprs.items() if isinstance(e, Load)}
        for n, ld in loads.items():
            t = ld.tensor
            if isinstance(t, Placeholder) and t.value_range is not None:
                namer = Namer(t.name, [])
                try:
                    lo, hi = affine(t.value_range[0], namer), affine(t.value_range[1], namer)
                except NotAffine:
                    raise LanguageError(f"value_range of {t.name} must be affine in the parameters") from None
                out[n] += [f"{lo} <= {n}", f"{n} <= {hi}"]
        for a, la in loads.items():
            for b, lb in loads.items():
                ta = la.tensor
                if a == b or ta is not lb.tensor or not isinstance(ta, Placeholder) or not ta.monotonic:
                    continue
                if self.dyn.owners[a] != self.dyn.owners[b]:
                    continue
                diff = _const_difference(la.indices[0], lb.indices[0])
                if diff is not None and diff > 0:
                    out[a].append(f"{a} <= {b}")
        return out

    def _add_dyn_constraints(self) -> None:
        for st in self.statements.values():
            conds = [c for p in st.dyn_params for c in self.dyn_constraints.get(p, [])]
            if conds:
                params = range(st.domain.dim(isl.dim_type.param))
                names = [st.domain.get_dim_name(isl.dim_type.param, k) for k in params]
                extra = isl.Set(f"[{', '.join(names)}] -> {{ : {' and '.join(conds)} }}")
                st.domain = st.domain.intersect_params(extra)
                for acc in st.reads + st.writes:
                    acc.relation = acc.relation.intersect_params(extra)

    def _check_bounds(self) -> None:
        """Prove that every access stays inside its tensor (for all parameter values and the declared
        ranges of index arrays); an access that may not is a LanguageError, never a crash."""
        for st in self.statements.values():
            for acc in st.reads + st.writes:
                tensor = self.func.tensor(acc.tensor)
                bounds = tensor_bounds(tensor, self.params)
                touched = acc.relation.intersect_params(self.context).range()
                outside = touched.subtract(bounds)
                if outside.is_empty():
                    continue
                comp = self.owner_of[st.name]
                data_dependent = not acc.exact or bool(st.dyn_params)
                hint = ("; declare value_range=(lo, hi) on the index arrays it reads" if data_dependent else
                        "; guard the read with pt.select or shrink the domain")
                pt = outside.sample_point()
                coords = [pt.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(tensor.ndim)]
                params = {outside.get_dim_name(isl.dim_type.param, k):
                          pt.get_coordinate_val(isl.dim_type.param, k).to_python()
                          for k in range(outside.dim(isl.dim_type.param))}
                where = ", ".join(f"{k}={v}" for k, v in params.items() if not k.startswith("_d"))
                raise LanguageError(f"computation {comp} may access {acc.tensor} outside its bounds, e.g. "
                                    f"{acc.tensor}[{', '.join(map(str, coords))}]"
                                    f"{' when ' + where if where else ''}{hint}")

    def dyn_sources(self) -> dict[str, list[str]]:
        """For each dynamic parameter, the iterators (by name) of its owner that it reads."""
        from .model import dyn_sources
        return {n: [v.name for v in dyn_sources(e)] for n, e in self.dyn.exprs.items()}

    # --- schedules ------------------------------------------------------------------------------
    def identity_loops(self, stmt: str) -> LoopSchedule:
        st = self.statements[stmt]
        return LoopSchedule.identity(self.owner_of[stmt], stmt, st.dims, st.over_domain())

    def init_schedule(self, comp: str, update: StageSchedule) -> StageSchedule:
        """The initialization of a reduction, placed just before the first loop that runs over a
        reduction axis, in the update's loops that do not (see the design notes)."""
        upd = self.statements[comp]
        loops = update.loops
        n = len(loops.names)
        dep = [loops.depends_on(k, upd.reduce_dims) for k in range(n)]
        q = dep.index(True) if True in dep else n
        keep = [k for k in range(n) if not dep[k]]
        for k in keep:
            if k > q and loops.depends_on(k, upd.reduce_dims):
                raise ScheduleError(f"computation {comp}: loop {loops.names[k]} mixes reduction and data axes")
        init_loops = self._init_loop_schedule(comp, loops, keep)
        names = init_loops.names
        statics = list(update.statics[:q + 1])
        statics[q] -= 1
        statics += [update.statics[-1]] * (len(names) + 1 - len(statics))
        return StageSchedule(init_loops, statics[:len(names) + 1])

    def _init_loop_schedule(self, comp: str, loops: LoopSchedule, keep: list[int]) -> LoopSchedule:
        """The loops ``keep`` of the update ``loops`` of reduction ``comp`` as its initialization's."""
        found = self._inits.get((comp, id(loops)))
        if found is not None and found[0] is loops:
            return found[1]
        upd = self.statements[comp]
        init = self.statements[comp + INIT_SUFFIX]
        rel = _init_loops(loops.rel, keep, [upd.dims.index(d) for d in upd.reduce_dims], upd.over_domain(),
                          init.name, init.domain)
        if rel is None:
            raise ScheduleError(f"computation {comp}: its initialization cannot follow the loops "
                                f"{', '.join(loops.names)}; keep reduction loops apart from data loops")
        function = _init_function(loops.function, keep, [upd.dims.index(d) for d in upd.reduce_dims], comp,
                                  init.name)
        init_loops = LoopSchedule(comp, init.dims, rel, [loops.names[k] for k in keep], init.over_domain(), function)
        if quick_builds():
            _remember(self._inits, (comp, id(loops)), (loops, init_loops))
        return init_loops

    def width(self, scheds: Mapping[str, StageSchedule]) -> int:
        return max(2 * len(s.loops.names) + 1 for s in scheds.values())

    def full_maps(self, scheds: Mapping[str, StageSchedule], width: int | None = None) -> dict[str, isl.Map]:
        w = width or self.width(scheds)
        return {name: self._full_map(name, s, w) for name, s in scheds.items() if name in self.statements}

    def _full_map(self, name: str, s: StageSchedule, width: int) -> isl.Map:
        key = (name, id(s.loops), tuple(s.statics), width)
        found = self._maps.get(key)
        if found is not None and found[0] is s.loops:
            return found[1]
        m = full_map(s.loops, s.statics, width).intersect_domain(self.statements[name].over_domain())
        if quick_builds():
            _remember(self._maps, key, (s.loops, m))
        return m

    # --- dependences ----------------------------------------------------------------------------
    def dependences(self, original: Mapping[str, StageSchedule]) -> list[Dependence]:
        """The program's dependences, computed once; a program whose dependences isl cannot compute
        within its operation budget is refused at once by every later primitive (each would spend
        the whole budget again: a case of four refused primitives ran past two minutes)."""
        if self._deps_refused is not None:
            raise ScheduleError(self._deps_refused)
        if self._deps is None:
            stmts = list(self.statements.values())
            maps = self.full_maps(original)
            try:
                self._deps = compute_dependences(stmts, maps)
            except isl.Error:
                if not budget_spent():
                    raise
                self._deps_refused = (
                    f"the dependences of {self.func.name} are too complex for the polyhedral analysis (isl gave "
                    f"up after {ISL_OPERATIONS} operations); simplify the program: fewer conditions joined by | "
                    "in where= and select, fewer reads of one tensor")
                raise ScheduleError(self._deps_refused) from None
        return self._deps

    def violation(self, original: Mapping[str, StageSchedule], scheds: Mapping[str, StageSchedule],
                  relaxed: frozenset[str] = frozenset()) -> Violation | None:
        return first_violation(self.dependences(original), self.full_maps(scheds), relaxed)

    def carried(self, original: Mapping[str, StageSchedule], scheds: Mapping[str, StageSchedule],
                dim: int, stmt: str, reduction_of: frozenset[str] = frozenset()) -> Violation | None:
        """A dependence carried by schedule dimension ``dim`` between statements inside the loop of
        ``stmt`` at that dimension (those sharing its static positions up to it)."""
        w = self.width(scheds)
        mine = scheds[stmt].statics[:(dim + 1) // 2]
        inside = {n for n, sc in scheds.items() if sc.statics[:(dim + 1) // 2] == mine}
        return carried_violation(self.dependences(original), self.full_maps(scheds, w), dim, w, reduction_of,
                                 inside)

    def unbounded_loop(self, scheds: Mapping[str, StageSchedule]) -> str | None:
        """Why the AST cannot scan a statement under ``scheds`` (None when it can): a loop placed
        outside the loops that fix the iterators a data-dependent bound reads runs over every value
        of that bound, which needs a declared range (``value_range``) to be finite."""
        maps = self.full_maps(scheds)
        sources = self.dyn_sources()
        for name, st in self.statements.items():
            if not st.dyn_params or name not in maps:
                continue
            loops = scheds[name].loops
            image = st.over_domain().apply(maps[name]).intersect_params(self.context)
            for p in st.dyn_params:
                m = binding_depth(Scheduled(st, maps[name]), sources[p])
                for d in range(1, m, 2):
                    dim = image.project_out(isl.dim_type.set, d + 1, image.dim(isl.dim_type.set) - d - 1) \
                        .project_out(isl.dim_type.set, 0, d)
                    if not dim.is_bounded():
                        fixed = loops.names[(m - 1) // 2]
                        return (f"loop {loops.names[(d - 1) // 2]} of {self.owner_of[name]} runs outside loop {fixed}, "
                                f"which fixes the data-dependent bound {expr_str(self.dyn.exprs[p])}, and has no "
                                "bounded range there: declare value_range on the index array, or keep the loop "
                                f"inside {fixed}")
        return None

    def loop_range(self, stmt: str, loops: LoopSchedule, pos: int) -> tuple[int | None, int | None]:
        return loops.loop_range(pos, self.statements[stmt].over_domain())

    def thread_bounds(self, stmt: str, loops: LoopSchedule, pos: int) -> tuple[int, int] | None:
        """The bounds of loop ``pos`` valid for every parameter value (None where there are none), as
        a loop bound to GPU threads gets them (``astgen.dim_range``)."""
        image = self.statements[stmt].over_domain().apply(loops.rel)
        n = image.dim(isl.dim_type.set)
        image = image.project_out(isl.dim_type.set, pos + 1, n - pos - 1).project_out(isl.dim_type.set, 0, pos)
        return constant_bounds(image.reset_tuple_id().intersect_params(self.context))

    def is_box(self, stmt: str) -> bool:
        """Whether the statement's domain is a box: each dimension's range depends on the parameters
        only (not on the other dimensions), so that cutting it at the edges is all there is."""
        dom = self.statements[stmt].domain.intersect_params(self.context)
        return self._box(dom).is_equal(dom)

    def box_reads_past_ends(self, stmt: str, tensors: Sequence[str]) -> bool:
        """Whether every instance of the box around the statement's domain (each dimension over its
        own range) that lies outside the domain reads each of ``tensors`` past its bounds. Whole-tile
        copies of those tensors read zeros there, so computing the box instead of the domain adds
        only products of zeros: the last, shorter chunk of a split reduction (``s·Kc + k < K``, the
        domain no box) reads A[i, s·Kc + k] and B[s·Kc + k, j] past K."""
        st = self.statements[stmt]
        dom = st.domain.intersect_params(self.context)
        extra = self._box(dom).subtract(dom)
        for name in tensors:
            past = self.func.tensor(name)
            inside = tensor_bounds(past, self.params)
            for acc in st.reads:
                if acc.tensor != name:
                    continue
                if not acc.exact:
                    return False
                # the access as a function on the whole box (its relation is cut to the domain)
                reads = acc.relation.gist_domain(dom).intersect_domain(extra)
                if not reads.domain().is_equal(extra):
                    return False
                if not reads.intersect_range(inside).is_empty():
                    return False
        return True

    @staticmethod
    def _box(dom: isl.Set) -> isl.Set:
        """The smallest box around ``dom``: each dimension over its own range, the others projected out."""
        box = dom.universe(dom.get_space())
        for d in range(dom.dim(isl.dim_type.set)):
            others = dom.project_out(isl.dim_type.set, d + 1, dom.dim(isl.dim_type.set) - d - 1) \
                .project_out(isl.dim_type.set, 0, d)
            box = box.intersect(others.insert_dims(isl.dim_type.set, 0, d)
                                .add_dims(isl.dim_type.set, dom.dim(isl.dim_type.set) - d - 1)
                                .set_tuple_id(dom.get_tuple_id()))
        return box

    def runs(self, stmt: str) -> bool:
        """Whether some instance of ``stmt`` runs, for some parameter values (a where= that never
        holds, a zero-size tensor or an empty reduction range leave a statement that never runs)."""
        return not self.statements[stmt].domain.intersect_params(self.context).is_empty()

    def domain_of(self, stmt: str) -> isl.Set:
        return self.statements[stmt].domain


REMEMBERED = 256  # entries of each of a program's memo tables (a template's schedule makes a few dozen)


def _remember(table: dict, key: object, value: object) -> None:  # type: ignore[type-arg]
    """Keep ``value`` under ``key``; a full table starts again (the schedule has moved on).
    The value holds the loop schedule whose ``id`` is in the key, so that id is not reused."""
    if len(table) >= REMEMBERED:
        table.clear()
    table[key] = value


def _init_loops(rel: isl.Map, keep: list[int], reduce_pos: list[int], domain: isl.Set, init: str,
                init_domain: isl.Set) -> isl.Map | None:
    """The update's loops ``keep`` (those that do not vary with the reduction on its domain) as a
    function of the data dimensions, over every instance of the initialization: projected from the
    loops over every integer point where that is a function; else from the update's instances,
    extended to the elements whose reduction range is empty (isl's gist drops the conditions that
    only say "the range is not empty"). None when neither gives one placement per element."""
    def project(r: isl.Map) -> isl.Map:
        for k in reversed(range(r.dim(isl.dim_type.out))):
            if k not in keep:
                r = r.project_out(isl.dim_type.out, k, 1)
        for k in sorted(reduce_pos, reverse=True):
            r = r.project_out(isl.dim_type.in_, k, 1)
        return r.set_tuple_name(isl.dim_type.in_, init)

    def placement(r: isl.Map) -> isl.Map | None:
        r = r.intersect_domain(init_domain)
        return r if r.is_single_valued() and init_domain.is_subset(r.domain()) else None

    found = placement(project(rel))
    if found is None:
        on_domain = project(rel.intersect_domain(domain))
        found = placement(on_domain.gist_domain(on_domain.domain()))
    return found


def _init_function(function: isl.PwMultiAff | None, keep: list[int], reduce_pos: list[int], update: str,
                   init: str) -> isl.PwMultiAff | None:
    """The update's loops ``keep`` as a function of the initialization's dimensions (the update's
    without ``reduce_pos``), where ``function`` gives them without reading the reduction dimensions."""
    if function is None:
        return None
    n_in, n_out = function.dim(isl.dim_type.in_), function.dim(isl.dim_type.out)
    outs = [f"o{k}" for k in range(n_out)]
    select = isl.PwMultiAff(f"{{ [{', '.join(outs)}] -> [{', '.join(outs[k] for k in keep)}] }}")
    kept = select.pullback_pw_multi_aff(function)
    if any(kept.involves_dims(isl.dim_type.in_, k, 1) for k in reduce_pos):
        return None
    xs = [f"x{k}" for k in range(n_in)]
    data = [x for k, x in enumerate(xs) if k not in reduce_pos]
    at = [("0" if k in reduce_pos else x) for k, x in enumerate(xs)]  # any value: none is read
    return kept.pullback_multi_aff(isl.MultiAff(f"{{ {init}[{', '.join(data)}] -> {update}[{', '.join(at)}] }}"))


def _const_difference(a: Expr, b: Expr) -> int | None:
    """b - a when both are affine and differ by a constant."""
    class _Any:
        def __call__(self, v: object) -> str:
            return getattr(v, "name", "?")
    try:
        fa, fb = affine(a, _Any()), affine(b, _Any())
    except NotAffine:
        return None
    d = fb.plus(fa, -1)
    return d.const if d.is_const else None
