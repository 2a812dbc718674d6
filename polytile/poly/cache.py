"""Caches: footprints, box hulls, copy statements and the rewriting of accesses, all computed by isl.

For a consumer statement S scheduled by θ and a loop at schedule depth m, the footprint of tensor X
in one iteration P of the first m schedule dimensions is F(P) = { e : ∃x. θ_m(x) = P ∧ S[x] reads
X[e] }. The cache buffer holds a box [off(P), off(P) + size) around F(P) (sizes constant when
possible, else parametric, e.g. a CSR row); the copy statement fills it over the rectangular hull of
F(P) (never outside the array) just before S's part of the iteration, and S reads
cache[layout(e - off(θ_m(x)))] instead of X[e]. A write cache accumulates in the buffer and copies
the exact written footprint back after the iteration (the initialization's writes included: where
a reduction range is empty it is the only writer). A stored buffer (store / store_at) replaces the
tensor for its computation and every reader. Buffers of one tensor chain: a cache's copies read
from (or write back to) the next buffer out, the previous cache of the chain or the stored buffer.
``poly.cache_check`` checks the result against the dependences.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import islpy as isl

from ..errors import ScheduleError
from ..lang import expr as lx
from ..toolchain import quick_builds
from .affine import NotAffine, affine
from .astgen import Scheduled, binding_depth, pw_aff_expr
from .astnodes import AExpr
from .lexopt import lexmax, lexmin
from .model import INIT_SUFFIX, Namer, Statement, project_out_params, tensor_bounds
from .program import STATIC_SCALE, PolyProgram, StageSchedule


@dataclass
class CacheRequest:
    kind: str  # "read" or "write"
    tensor: str
    consumer: str  # computation
    level: int | None  # loop index of the consumer (None: the whole function)
    name: str
    layout: Callable[..., object] | None = None
    loc: str = "auto"
    block_dims: frozenset[int] = frozenset()  # prefix dims bound to GPU threads (shared caches span them)
    order: str = "cache"  # copy loops over the cache's layout ("cache") or the tensor's ("source")
    also: tuple[str, ...] = ()  # more consumers (fused with the first at the level) sharing the cache
    thread_dims: frozenset[int] = frozenset()  # prefix dims bound to GPU threads (any cache)
    pad: tuple[int, ...] = ()  # extra elements per buffer dimension (bank-conflict padding)
    fill: object = None  # write caches: start from this identity instead of running the initialization
    whole: tuple[int, ...] = ()  # whole tiles: the box rounded up to these granules per tensor dimension,
    # copied whole (zeros past the tensor's end) or, for write caches, filled whole


@dataclass
class CacheBuffer:
    """A cache buffer: ``shape`` over parameters (constants where possible)."""

    name: str
    tensor: str
    consumer: str
    kind: str
    shape: list[AExpr]
    level: int | None
    loc: str
    copy_stmts: list[str] = field(default_factory=list)


@dataclass
class CacheRewrite:
    """In statement ``stmt``, accesses of ``tensor`` go to ``cache`` at ``layout(index - offset)``.

    ``offset`` is over the schedule prefix ``p0, p1, …`` (the iteration of the cache's loop);
    ``prefix`` gives those prefix values as functions of the statement's dimensions, for where the
    generated code has no loop variable for them (the code generator prefers the loop variables,
    which keeps the indices simple: ``2 * ko`` rather than ``k - k % 2``).
    """

    stmt: str
    tensor: str
    cache: str
    offset: list[AExpr]
    prefix: list[AExpr]
    layout_vars: list[lx.IterVar]
    layout_exprs: list[lx.Expr]


def _buffer_what(req: CacheRequest) -> str:
    """The buffer as the user asked for it, for messages."""
    if req.kind == "fold":
        return f"store of {req.tensor}" if req.level is None else f"store_at of {req.tensor}"
    return f"cache {req.name} of {req.tensor}" if req.kind == "read" else f"write cache {req.name} of {req.tensor}"


def _layout_exprs(req: CacheRequest, ndim: int) -> tuple[list[lx.IterVar], list[lx.Expr]]:
    """The layout applied to the indices r0, r1, … of an element relative to the box's origin."""
    rs = [lx.IterVar(f"r{k}", lx.Const(0, lx.dtypes.INDEX), lx.Const(0, lx.dtypes.INDEX), "data")
          for k in range(ndim)]
    if req.layout is None:
        return rs, list(rs)
    try:
        res = req.layout(*rs)
        outs = [lx.as_expr(x) for x in (res if isinstance(res, (tuple, list)) else (res,))]  # type: ignore[arg-type]
    except Exception as err:  # the user's function: any failure is theirs to fix
        raise ScheduleError(f"{_buffer_what(req)}: its layout cannot be applied to the {ndim} indices of "
                            f"{req.tensor} ({type(err).__name__}: {err})") from None
    return rs, outs


def copy_width(req: CacheRequest, ndim: int) -> int:
    """The schedule width that the copies of ``req`` need: its prefix, a static position, then two
    dimensions per loop of the copy (over the buffer's layout or the tensor's indices)."""
    m = 0 if req.level is None else 2 * (req.level + 1)
    loops = ndim if req.order == "source" else len(_layout_exprs(req, ndim)[1])
    return m + 1 + 2 * max(ndim + 2, loops)


def _layout(req: CacheRequest, ndim: int, sizes: list[int | None] | None = None
            ) -> tuple[isl.Map, list[lx.IterVar], list[lx.Expr]]:
    """The layout as a map from the element's offset in the footprint's box to the buffer index; it
    must be one-to-one over the box (dimensions of extent one may be dropped)."""
    rs, outs = _layout_exprs(req, ndim)
    namer = Namer(f"the layout of {_buffer_what(req)}", rs)
    try:
        forms = [affine(o, namer) for o in outs]
    except NotAffine as err:
        raise ScheduleError(f"{_buffer_what(req)}: its layout is not affine ({err})") from None
    text = (f"{{ [{', '.join(r.name for r in rs)}] -> [{', '.join(str(f) for f in forms)}] }}")
    lmap = isl.Map(text)
    box = " and ".join(f"0 <= r{k} < {n}" for k, n in enumerate(sizes or []) if n is not None)
    over = lmap.intersect_domain(isl.Set(f"{{ [{', '.join(r.name for r in rs)}] : {box} }}")) if box else lmap
    if not over.is_injective():
        raise ScheduleError(f"{_buffer_what(req)}: its layout maps two elements to the same place")
    # over the box only: a layout that drops dimensions of extent one (a projection) is then
    # invertible, so that a copy can run over the buffer's layout
    return over, rs, outs


def _extreme(pa: isl.PwAff, maximize: bool) -> int | None:
    """The maximum (or minimum) of ``pa`` over its domain and every parameter value, if bounded."""
    s = isl.Map.from_pw_aff(pa).range()
    s = s.project_out(isl.dim_type.param, 0, s.dim(isl.dim_type.param))
    if s.is_empty():
        return 0
    v = s.dim_max_val(0) if maximize else s.dim_min_val(0)
    if v.is_infty() or v.is_neginfty() or v.is_nan():
        return None
    return int(v.to_python())


MAX_EXTENT_PIECES = 16
"""The most pieces of a parametric footprint extent whose maximum the cache primitives compute."""

MAX_OFFSET_PIECES = 8
"""The most pieces of a footprint's lowest index that the cache primitives try one by one as its
offset."""

MAX_FOOTPRINT_DIVISIONS = 24
"""The most integer divisions (over all pieces) of a footprint that the cache primitives bound (the
test suite's footprints have at most 7)."""


@dataclass
class _Box:
    offset: isl.PwAff  # over P (and parameters)
    size: int | None  # constant extent, or None when parametric
    size_pa: isl.PwAff | None  # parametric extent (over parameters only)
    lo: isl.PwAff
    hi: isl.PwAff


_BOXES: dict[tuple[str, int], tuple[str | None, _Box]] = {}
REMEMBERED_BOXES = 512
"""The most footprint boxes kept (a full table starts again)."""


def _box_dim(f: isl.Map, d: int, what: str, origin: Callable[[], isl.Map | None] | None = None) -> _Box:
    """``_computed_box_dim``, remembered by the footprint's text (and the first inner iteration's
    access where that was consulted): the memory check after every primitive asks again about every
    cache checked before (a box that took 30 s was computed once per later primitive, fuzz seed 107
    case 3357). With quick builds only (``toolchain.quick_builds``)."""
    if not quick_builds():
        return _computed_box_dim(f, d, what, origin)
    key = (str(f), d)
    hit = _BOXES.get(key)
    if hit is not None and (hit[0] is None or (origin is not None and hit[0] == str(origin()))):
        return hit[1]
    consulted: list[bool] = []

    def watched() -> isl.Map | None:
        consulted.append(True)
        return origin()

    box = _computed_box_dim(f, d, what, None if origin is None else watched)
    if len(_BOXES) >= REMEMBERED_BOXES:
        _BOXES.clear()
    _BOXES[key] = (str(origin()) if consulted and origin is not None else None, box)
    return box


def _computed_box_dim(f: isl.Map, d: int, what: str,
                      origin: Callable[[], isl.Map | None] | None = None) -> _Box:
    """The box of dimension ``d`` of the footprint ``f`` ([P] -> X[e]): an offset over P and a size.

    The offset is one of the pieces of the lowest index accessed; where none of them gives a box as
    tight as the footprint (the lowest index is periodic in a fused loop, e.g. 64·(x mod 4), and isl
    returns it as one piece per residue), the index accessed at the first inner iteration
    (``origin``) is tried as well. Every candidate is checked exactly."""
    divisions = sum(bm.dim(isl.dim_type.div) for bm in f.get_basic_maps())
    if divisions > MAX_FOOTPRINT_DIVISIONS:
        # modular constraints of skewed, separated tiles (28 pieces with 51 divisions, fuzz seed 109
        # case 1366): every bound of such a footprint is a parametric optimization of minutes
        raise ScheduleError(f"{what}: the footprint is too complex for the polyhedral analysis ({f.n_basic_map()} "
                            f"pieces with {divisions} integer divisions); cache at another loop, or without the "
                            "skew or separation of the loops it spans")
    n_out = f.dim(isl.dim_type.out)
    proj = f.project_out(isl.dim_type.out, d + 1, n_out - d - 1).project_out(isl.dim_type.out, 0, d)
    lo = proj.dim_min(0)
    hi = proj.dim_max(0)
    best: tuple[int, isl.PwAff] | None = None

    def consider(cand: isl.PwAff) -> None:
        nonlocal best
        # the offset must be defined wherever something is accessed: the element at the first inner
        # iteration is not where that iteration's read is guarded off (k >= 1 at k = 0; fuzz seed 31
        # case 4276), and there the copies would skip the footprint and the uses index it at 0
        missing = lo.domain().subtract(cand.domain())
        if not missing.is_empty():
            cand = cand.union_min(lo.intersect_domain(missing))
        below = _extreme(lo.sub(cand), maximize=False)
        if below is None or below < 0:
            return
        size = _extreme(hi.sub(cand), maximize=True)
        if size is not None and (best is None or size + 1 < best[0]):
            best = (size + 1, cand)

    # each piece of the lowest index is a candidate offset whose check subtracts and compares
    # piecewise functions: past MAX_OFFSET_PIECES the checks ran for minutes (a footprint of 16
    # lowest and 31 highest pieces, fuzz seed 107 case 3357), and such a footprint gets the lowest
    # index over all iterations or a parametric extent below
    few = lo.n_piece() <= MAX_OFFSET_PIECES
    for _, aff in lo.get_pieces() if few else []:
        consider(isl.PwAff.from_aff(aff))
    if origin is not None and 1 < lo.n_piece() and few:
        tight = _extreme(hi.sub(lo), maximize=True)
        if best is None or tight is None or best[0] > tight + 1:
            at = origin()
            if at is not None:
                pa = isl.PwMultiAff.from_map(at).get_pw_aff(d).coalesce()
                if pa.n_piece() > 1:
                    consider(pa.intersect_domain(lo.domain()))
                elif pa.n_piece() == 1:  # (none: the first inner iteration accesses nothing of this kind)
                    consider(isl.PwAff.from_aff(pa.get_pieces()[0][1]))
    # where no piece bounds the rest (the lowest index is a minimum of several accesses), the lowest
    # index over all iterations: as the offset, a piecewise minimum would split the copies into a
    # disjunct per piece and combination of pieces, more than isl's AST generator can scan
    lowest = _lowest(lo) if best is None and lo.n_piece() > 1 else None
    if lowest is not None:
        consider(lowest)
    if best is not None:
        return _Box(best[1], best[0], None, lo, hi)
    offset = lo if lowest is None else lowest
    ext = hi.sub(offset).add(isl.PwAff.from_aff(isl.Aff.zero_on_domain(isl.LocalSpace.from_space(
        lo.get_domain_space())).set_constant_val(1)))
    # the extents over the parameters, their existential variables made explicit divisions: isl's
    # parametric lexmax took 8 s on those of a write cache of a tiled skew (fuzz seed 7 case 9236)
    s = isl.Map.from_pw_aff(ext).range().compute_divs().coalesce()
    if s.n_basic_set() > MAX_EXTENT_PIECES:
        # isl's parametric lexmax runs for minutes on such a union, outside its operation budget
        # (43 pieces with nested floors of a skewed, fused loop: fuzz seed 71 case 2282)
        raise ScheduleError(f"{what}: the footprint's extent along dimension {d} is too complex for the "
                            f"polyhedral analysis ({s.n_basic_set()} pieces over the parameters); cache at "
                            "another loop, or without the skew or fusion of the loops it spans")
    mx = lexmax(s)
    if not mx.is_bounded() if hasattr(mx, "is_bounded") else False:
        raise ScheduleError(f"{what}: the footprint is unbounded; declare value_range on the index arrays")
    size_pa = isl.PwMultiAff.from_map(isl.Map.from_range(mx)).get_pw_aff(0)
    return _Box(offset, None, size_pa, lo, hi)


def _lowest(lo: isl.PwAff) -> isl.PwAff | None:
    """The minimum of ``lo`` over every iteration P (a function of the parameters), as a function
    over P, when it is one affine function."""
    low = lexmin(isl.Map.from_pw_aff(lo).range())
    over_p = isl.Map.from_domain_and_range(isl.Set.universe(lo.get_domain_space()), low)
    pa = isl.PwMultiAff.from_map(over_p).get_pw_aff(0).coalesce()
    if pa.n_piece() != 1:
        return None
    return isl.PwAff.from_aff(pa.get_pieces()[0][1])


def _names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{k}" for k in range(n)]


def _expr(pa: isl.PwAff, names: list[str], context: isl.Set) -> AExpr:
    return pw_aff_expr(pa, names, context)


def _offset_exprs(off_map: isl.Map, m: int, ctx: isl.Set) -> list[AExpr]:
    pma = isl.PwMultiAff.from_map(off_map)
    return [_expr(pma.get_pw_aff(d), _names("p", m), ctx) for d in range(pma.dim(isl.dim_type.out))]


def _prefix_exprs(prefix: isl.Map, dims: list[str], ctx: isl.Set) -> list[AExpr]:
    pma = isl.PwMultiAff.from_map(prefix)
    return [_expr(pma.get_pw_aff(d), dims, ctx) for d in range(pma.dim(isl.dim_type.out))]


def _prefix_map(it: Scheduled, m: int, dom: isl.Set) -> isl.Map:
    # from the loops' function, its floors explicit: bounding a footprint made from the map, whose
    # floors isl has eliminated, took it minutes (fuzz seed 47 case 1378)
    if it.function is not None:
        n_out = it.function.dim(isl.dim_type.out)
        return isl.Map.from_pw_multi_aff(it.function.drop_dims(isl.dim_type.out, m, n_out - m)).intersect_domain(dom)
    sched = it.schedule.intersect_domain(dom)
    n_out = sched.dim(isl.dim_type.out)
    return sched.project_out(isl.dim_type.out, m, n_out - m)


def _once(fn: Callable[[], isl.Map | None]) -> Callable[[], isl.Map | None]:
    memo: list[isl.Map | None] = []

    def get() -> isl.Map | None:
        if not memo:
            memo.append(fn())
        return memo[0]
    return get


def _origin(it: Scheduled, m: int, dom: isl.Set, acc: isl.Map, req: CacheRequest) -> isl.Map | None:
    """{ [P] -> X[e] }: the element accessed at the first iteration of the loops inside the cache's
    loop, when the access is a function (None otherwise, or for caches shared with other
    computations, whose first iterations differ)."""
    if req.also or not acc.is_single_valued():
        return None
    sched = it.schedule.intersect_domain(dom)
    n_out = sched.dim(isl.dim_type.out)
    image = dom.apply(sched)
    inner = isl.Map.from_domain(image).move_dims(isl.dim_type.out, 0, isl.dim_type.in_, m, n_out - m)
    first = lexmin(inner)  # [P] -> [first inner iteration]
    full = isl.Map.identity(first.get_space().domain().map_from_set()).flat_range_product(first)
    return full.apply_range(sched.reverse()).apply_range(acc)


def _graph(pas: list[isl.PwAff]) -> isl.Map:
    """{ [P] -> [v0, v1, …] } from one piecewise function per output."""
    pma = isl.PwMultiAff.from_pw_aff(pas[0])
    for pa in pas[1:]:
        pma = pma.flat_range_product(isl.PwMultiAff.from_pw_aff(pa))
    return isl.Map.from_pw_multi_aff(pma)


def _bound_params(program: PolyProgram, it: Scheduled, m: int, dyn_sources: dict[str, list[str]]) -> list[str]:
    """Dynamic parameters of ``it`` whose binding is at most ``m`` deep (usable in a cache at ``m``)."""
    out = []
    for p in it.stmt.dyn_params:
        if binding_depth(it, dyn_sources[p]) <= m:
            out.append(p)
    del program
    return out


@dataclass
class _Site:
    """One cache request while it is built: the statement, the loop depth ``m`` (schedule dimensions
    of the prefix P), the footprint ``fp`` ([P] -> X[e]) and the buffer's box and layout around it."""

    req: CacheRequest
    it: Scheduled
    m: int
    keep: list[str]  # dynamic parameters bound at most m deep (usable inside the cache's loop)
    prefix: isl.Map  # S[x] -> [P]
    iterations: isl.Set  # the iterations P in which a statement it serves runs
    fp: isl.Map
    what: str
    boxes: list[_Box]
    off_map: isl.Map  # [P] -> [o]: the box's origin
    lmap: isl.Map
    lvars: list[lx.IterVar]
    lexprs: list[lx.Expr]
    offsets: list[AExpr]
    codegen: bool  # whether the plans need their index expressions (not for a legality check)

    @property
    def p_names(self) -> list[str]:
        return _names("p", self.m)


@dataclass
class CacheUse:
    """A buffer as the legality check sees it (``poly.cache_check``): the statements whose accesses
    of ``tensor`` it serves, with the side ("read", "write"), and its copies, each taken as one
    instance per iteration P of the buffer's loop (the first ``m`` schedule dimensions)."""

    name: str
    kind: str  # "read", "write" or "fold" (store / store_at)
    tensor: str
    consumer: str
    level: int | None
    m: int
    copies: dict[str, tuple[isl.Set, int]] = field(default_factory=dict)  # kind -> (iterations P, static)
    users: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class CachePlan:
    """What ``build_caches`` adds to a schedule: copy and scope statements with their plans, the
    buffers, the accesses redirected to them, the statements they replace and the legality view."""

    statements: list[tuple[Scheduled, object]]
    buffers: list[CacheBuffer]
    rewrites: dict[str, list[CacheRewrite]]
    dropped: set[str]
    uses: list[CacheUse]


def build_caches(program: PolyProgram, items: list[Scheduled], scheds: Mapping[str, StageSchedule],
                 requests: list[CacheRequest], width: int, dyn_sources: dict[str, list[str]],
                 codegen: bool = True) -> CachePlan:
    """The buffers of ``requests`` and everything that makes them work (without the index
    expressions of the rewrites and copies unless ``codegen``: a legality check needs none).

    Folded buffers (store / store_at) come first at each depth, and caches of one computation and
    tensor chain outward-in: a cache's copies read (or write back to) the next buffer further out —
    the previous cache of the chain or the folded buffer — and only the outermost touches the tensor."""
    _check_fold_depths(requests)
    builder = _Builder(program, {it.stmt.name: it for it in items}, scheds, width, dyn_sources, codegen)
    for req in sorted(requests, key=lambda r: (-1 if r.level is None else r.level, r.kind != "fold")):
        builder.add(req)
    return builder.finish()


class _Builder:
    """Builds the buffers one request at a time, innermost last (see ``build_caches``)."""

    def __init__(self, program: PolyProgram, by_name: dict[str, Scheduled], scheds: Mapping[str, StageSchedule],
                 width: int, dyn_sources: dict[str, list[str]], codegen: bool):
        self.program, self.by_name, self.scheds, self.width = program, by_name, scheds, width
        self.dyn_sources, self.codegen = dyn_sources, codegen
        self.plan = CachePlan([], [], {}, set(), [])
        self.slot_used: dict[tuple[str, int], int] = {}  # caches at one static position of a computation
        self.outer: dict[tuple[str, str, str], _Site] = {}  # (kind, consumer, tensor) -> the innermost buffer
        self.folds: list[tuple[_Site, CacheUse]] = []

    def add(self, req: CacheRequest) -> None:
        program, ctx = self.program, self.program.context
        redirected, fill = _redirected(program, req, self.by_name, self.scheds)
        site = _site(program, req, redirected, self.by_name, self.scheds, self.dyn_sources, self.codegen)
        buf = CacheBuffer(req.name, req.tensor, req.consumer, req.kind, _buffer_shape(program, site, ctx), req.level,
                          req.loc)
        self.plan.buffers.append(buf)
        use = CacheUse(req.name, req.kind, req.tensor, req.consumer, req.level, site.m)
        self.plan.uses.append(use)
        init_name = req.consumer + INIT_SUFFIX
        if fill:
            self.plan.dropped.add(init_name)
        elif req.kind == "write" and init_name in redirected:
            # a buffer further out was filled in place of the initialization; this one holds the
            # values from the initialization on, so the initialization runs again, into it (2614)
            self.plan.dropped.discard(init_name)
        _redirect(site, redirected, self.by_name, self.plan.rewrites, ctx)
        if req.kind == "fold":  # its scope spans the copies chained to it: made in finish
            self.folds.append((site, use))
            self.outer[("read", "", req.tensor)] = self.outer[("write", "", req.tensor)] = site
            return
        self._copies(site, buf, use, fill, redirected)
        self.outer[(req.kind, req.consumer, req.tensor)] = site

    def _copies(self, site: _Site, buf: CacheBuffer, use: CacheUse, fill: bool, redirected: list[str]) -> None:
        """The scope and copy statements of a cache, at static positions around its computations'."""
        req, scheds = site.req, self.scheds
        prev = self.outer.get((req.kind, req.consumer, req.tensor)) or self.outer.get((req.kind, "", req.tensor))
        pos = site.m // 2  # the static position of the consumer just inside the level
        statics = scheds[req.consumer].statics
        own = statics[pos] if pos < len(statics) else statics[-1]
        base_static = min([own] + [scheds[o].statics[pos] for o in req.also])
        last_static = max([own] + [scheds[o].statics[pos] for o in req.also])
        # where the copies and the buffer's scope run: every iteration of the cache's loop and, for a
        # shared cache, every thread of the block (threads without work of their own still copy
        # their share, and the barriers around the copies must be reached by all)
        scope_range = _all_threads(site.iterations, req.thread_dims) if req.thread_dims else site.iterations
        key = (req.consumer, pos)
        slot = self.slot_used[key] = self.slot_used.get(key, 0) + 1
        if slot > STATIC_SCALE // 2 - 2:
            raise ScheduleError(f"{site.what}: too many caches at one loop of {req.consumer}")
        loop = self._loop_iterations(site)
        loop = _all_threads(loop, req.thread_dims) if req.thread_dims else loop
        self.plan.statements += _scope_statements(site, loop, base_static - STATIC_SCALE // 2,
                                                  last_static + STATIC_SCALE // 2 - 1, self.width)
        for kind, region, direction in _copy_regions(self.program, site, fill, redirected):
            static = base_static - STATIC_SCALE // 2 + slot if direction < 0 else last_static + slot
            scheduled, splan = _copy_statement(self.program, site, kind, region, static, scope_range, self.width)
            if prev is not None and kind in ("copy_in", "copy_out"):
                # the copy reads (writes back to) the next buffer out: rewritten like a consumer's access
                splan.rewrites.append(CacheRewrite(splan.name, req.tensor, prev.req.name, prev.offsets,
                                                   [AExpr("id", name=n) for n in splan.dims[:prev.m]],
                                                   prev.lvars, prev.lexprs))
            buf.copy_stmts.append(splan.name)
            self.plan.statements.append((scheduled, splan))
            use.copies[kind] = (_iterations(scheduled, site.m), static)

    def _loop_iterations(self, site: _Site) -> isl.Set:
        """Every iteration of the cache's loop: those of all statements inside it. The buffer's scope
        spans them: over only those the cache serves (the last ones of the loop, say), isl's AST
        generator may scan the release after the loop, apart from the allocation."""
        m = site.m
        here = self.scheds[site.req.consumer].statics[:m // 2]
        out = site.iterations
        for name, it in self.by_name.items():
            if name in self.scheds and self.scheds[name].statics[:m // 2] == here:
                out = out.union(_prefix_map(it, m, it.stmt.over_domain()).range())
        return out.compute_divs().coalesce()

    def finish(self) -> CachePlan:
        _find_users(self.program, self.plan)
        for site, use in self.folds:
            self.plan.statements += _fold_scope(site, use, self.plan.uses, self.scheds, self.width)
        return self.plan


def _check_fold_depths(requests: list[CacheRequest]) -> None:
    """A cache of a stored tensor copies from (or back to) the stored buffer, which exists only inside
    the loop the tensor is stored at: the cache must be at that loop or inside it."""
    for fold in requests:
        if fold.kind != "fold" or fold.level is None:
            continue
        for req in requests:
            if req.kind != "fold" and req.tensor == fold.tensor and (req.level is None or req.level < fold.level):
                where = "at the top" if req.level is None else "at an outer loop"
                raise ScheduleError(f"{_buffer_what(req)} for {req.consumer} is placed {where}, outside the loop "
                                    f"where {req.tensor} is stored (store_at): its copies would reach a buffer "
                                    "that exists only inside that loop; place the cache at or inside it")


def _redirected(program: PolyProgram, req: CacheRequest, by_name: dict[str, Scheduled],
                scheds: Mapping[str, StageSchedule]) -> tuple[list[str], bool]:
    """The statements whose accesses of the tensor go to the buffer, and whether a write cache starts
    filled with the reduction's identity (the initialization is then dropped).

    A write cache serves the initialization too when it runs inside the cache's loop; a folded
    buffer serves the computation's statements and every reader, which must all run inside the loop."""
    if req.kind == "read":
        return [req.consumer, *req.also], False
    init_name = req.consumer + INIT_SUFFIX
    if req.kind == "fold":
        writers = [n for n in (init_name, req.consumer) if n in by_name]
        readers = [n for n, it in by_name.items() if n not in writers and n in scheds
                   and any(a.tensor == req.tensor for a in it.stmt.reads)]
        m = 0 if req.level is None else 2 * (req.level + 1)
        loop = "" if req.level is None else scheds[req.consumer].loops.names[req.level]
        for name in writers + readers:
            if scheds[name].statics[:m // 2] == scheds[req.consumer].statics[:m // 2]:
                continue
            if name == init_name:
                raise ScheduleError(f"store_at of {req.tensor} at loop {loop}: the initialization of {req.tensor} "
                                    f"runs outside that loop (before its reduction loops); store it at a loop "
                                    "that holds whole reductions")
            raise ScheduleError(f"store_at of {req.tensor} at loop {loop}: {program.owner_of.get(name, name)} reads "
                                f"{req.tensor} outside that loop; fuse it inside the loop first (after/before)")
        return writers + readers, False
    if init_name in scheds and _init_inside(scheds[req.consumer], scheds[init_name], req.level):
        return [req.consumer, init_name], req.fill is not None
    return [req.consumer], False


def _site(program: PolyProgram, req: CacheRequest, redirected: list[str], by_name: dict[str, Scheduled],
          scheds: Mapping[str, StageSchedule], dyn_sources: dict[str, list[str]], codegen: bool) -> _Site:
    """The footprint of ``req`` in one iteration of its loop, and the box and layout of its buffer."""
    it = by_name[req.consumer]
    m = 0 if req.level is None else 2 * (req.level + 1)
    keep = _bound_params(program, it, m, dyn_sources)
    dom = project_out_params(it.stmt.domain, [p for p in it.stmt.dyn_params if p not in keep])
    prefix = _prefix_map(it, m, dom)  # S[x] -> [P]
    what = _buffer_what(req) + ("" if req.kind == "fold" else f" for {req.consumer}")
    # a write cache and a folded buffer hold what their computation's statements write (the
    # initialization too: where the reduction range is empty it is the only writer)
    accessing = redirected if req.kind == "read" else [n for n in redirected if program.owner_of[n] == req.consumer]
    acc, fp = _footprint(req, accessing, by_name, scheds, m, keep, what)
    iterations = prefix.range()
    for name in redirected:
        if name != req.consumer:
            iterations = iterations.union(_prefix_map(by_name[name], m, by_name[name].stmt.over_domain()).range())
    iterations = iterations.compute_divs().coalesce()
    if req.block_dims:
        fp = _whole_block(fp, m, req.block_dims).intersect_domain(prefix.range())
    ndim = program.func.tensor(req.tensor).ndim
    origin = _once(lambda: _origin(it, m, dom, acc, req))
    boxes = [_box_dim(fp, d, what, origin) for d in range(ndim)]
    if req.whole:  # whole tiles (tensor cores): boxes rounded up to the instruction's tile
        boxes = [_rounded(b, g, what) for b, g in zip(boxes, req.whole)]
    lmap, lvars, lexprs = _layout(req, ndim, [b.size for b in boxes])
    off_map = _graph([b.offset for b in boxes])  # [P] -> [o]
    return _Site(req, it, m, keep, prefix, iterations, fp, what, boxes, off_map, lmap, lvars, lexprs,
                 _offset_exprs(off_map, m, program.context) if codegen else [], codegen)


def _footprint(req: CacheRequest, names: list[str], by_name: dict[str, Scheduled],
               scheds: Mapping[str, StageSchedule], m: int, keep: list[str], what: str) -> tuple[isl.Map, isl.Map]:
    """The consumer's accesses of the tensor (S[x] -> X[e]) and the footprint [P] -> X[e] of one
    iteration P of the cache's loop: what the statements ``names`` read (read caches) or write."""
    fp: isl.Map | None = None
    acc: isl.Map | None = None
    for name in names:
        stmt = by_name[name].stmt
        if name in req.also and scheds[name].statics[:m // 2] != scheds[req.consumer].statics[:m // 2]:
            raise ScheduleError(f"{what}: {name} shares the cache but is not fused with {req.consumer} "
                                "down to the cache's loop; fuse it there first (after/before)")
        accesses = [a.relation for a in (stmt.reads if req.kind == "read" else stmt.writes) if a.tensor == req.tensor]
        if not accesses:
            raise ScheduleError(f"{what}: {name} does not access {req.tensor}")
        drop = [p for p in stmt.dyn_params if p not in keep]
        dom = project_out_params(stmt.domain, drop)
        s_acc = project_out_params(_union_all(accesses), drop).intersect_domain(dom)
        s_fp = _prefix_map(by_name[name], m, dom).reverse().apply_range(s_acc)
        acc = s_acc if acc is None else acc
        fp = s_fp if fp is None else fp.union(s_fp)
    assert acc is not None and fp is not None
    # made disjoint and coalesced: composing the prefix with a non-convex domain (a where= with an
    # "or", a skewed or split loop) yields overlapping disjuncts, one per pair of pieces, which every
    # copy statement carries and which make isl's AST generator give up (or, coalesced only, run
    # for minutes where its operation budget does not reach)
    return acc, _coalesced(fp.make_disjoint())


def _coalesced(fp: isl.Map) -> isl.Map:
    """``fp`` coalesced where that does not make a piece more complex. Merging neighbouring pieces (a
    stencil's reads, a box and the triangle beside it) keeps about the constraints of the largest
    piece; where isl can make two pieces one only by wrapping them in new constraints, the merged
    piece is much harder for everything after it: two pieces of 21 constraints (reads of A[k-2, k-1,
    k] and A[i, j, j] under split loops) became one of 33, whose lowest index came out in 145 pieces
    after 17 s or more of isl's work, and whose copy's AST took minutes more (fuzz seed 131 case
    140). Both forms are the same set: the footprint stays exact.

    A merged piece may have one constraint per tensor dimension more than the largest piece (the
    test suite's merges add at most one; the wrapped piece above 12 to a 3-d footprint)."""
    merged = fp.coalesce()
    if merged.n_basic_map() == fp.n_basic_map():
        return merged
    most = max(_n_constraints(bm) for bm in fp.get_basic_maps())
    if all(_n_constraints(bm) <= most + fp.dim(isl.dim_type.out) for bm in merged.get_basic_maps()):
        return merged
    return fp


def _n_constraints(bm: isl.BasicMap) -> int:
    return len(bm.get_constraints())


def _union_all(maps: list[isl.Map]) -> isl.Map:
    out = maps[0]
    for a in maps[1:]:
        out = out.union(a)
    return out


def _size_dependence(boxes: list[_Box], data: list[str]) -> str:
    """What the parametric extents of ``boxes`` depend on, for a message: the data (a dynamic
    parameter of ``data``, values read from a tensor) or the size parameters they name."""
    names: set[str] = set()
    for b in boxes:
        pa = b.size_pa
        if b.size is None and pa is not None:
            names |= {pa.get_dim_name(isl.dim_type.param, k) for k in range(pa.dim(isl.dim_type.param))
                      if pa.involves_dims(isl.dim_type.param, k, 1)}
    if names & set(data) or not names:
        return "the data"
    return ("the parameter " if len(names) == 1 else "the parameters ") + ", ".join(sorted(names))


def _buffer_shape(program: PolyProgram, site: _Site, ctx: isl.Set) -> list[AExpr]:
    """The buffer's extents: the layout's image of the footprint (or of the whole box, where the
    copies run over it) when the box has a constant size, else the box's parametric extents."""
    req, boxes = site.req, site.boxes
    if any(b.size is None for b in boxes):
        if req.layout is not None:
            raise ScheduleError(f"{site.what}: a layout needs a footprint of constant size; it depends on "
                                f"{_size_dependence(boxes, site.keep)} here")
        return [AExpr("int", value=b.size) if b.size is not None else _expr(b.size_pa, [], ctx) for b in boxes]
    # the buffer spans the layout's image of what is accessed (relative to the origin)
    region = site.fp
    if req.whole and _holds_box(program, site):
        region = _box_region(site.off_map, [b.size for b in boxes], site.m)  # type: ignore[arg-type]
    img = _sum(region, site.off_map.neg()).range().apply(site.lmap)
    img = img.project_out(isl.dim_type.param, 0, img.dim(isl.dim_type.param))
    shape = []
    for c in range(img.dim(isl.dim_type.set)):
        lo_v = img.dim_min_val(c).to_python()
        hi_v = img.dim_max_val(c).to_python()
        if lo_v != 0:
            raise ScheduleError(f"{site.what}: the layout must map the footprint's origin to index 0 "
                                f"(dimension {c} starts at {lo_v})")
        extra_pad = req.pad[c] if c < len(req.pad) else 0
        shape.append(AExpr("int", value=int(hi_v) + 1 + extra_pad))
    return shape


def _holds_box(program: PolyProgram, site: _Site) -> bool:
    """Whether a whole cache's buffer holds its footprint's whole box: whole read tiles and the tensor
    cores' fragments (the instruction writes them whole) do; a register tile does when it is written
    back over the box (not when its layout packs a scattered footprint)."""
    req = site.req
    return req.kind == "read" or req.loc == "fragment" or (_whole_written(program, site) or (None, False))[1]


def _redirect(site: _Site, redirected: list[str], by_name: dict[str, Scheduled],
              rewrites: dict[str, list[CacheRewrite]], ctx: isl.Set) -> None:
    """Point the accesses of the tensor by ``redirected`` at the buffer (replacing a buffer further
    out, which the copies reach instead)."""
    req = site.req
    for sname in redirected:
        s_it = by_name[sname]
        s_prefix = site.prefix if sname == req.consumer else _prefix_map(s_it, site.m, s_it.stmt.over_domain())
        pvals = _prefix_exprs(s_prefix, s_it.stmt.dims, ctx) if site.codegen else []
        rewrites[sname] = [r for r in rewrites.get(sname, []) if r.tensor != req.tensor]
        rewrites[sname].append(CacheRewrite(sname, req.tensor, req.name, site.offsets, pvals, site.lvars,
                                            site.lexprs))


def _copy_regions(program: PolyProgram, site: _Site, fill: bool, redirected: list[str]
                  ) -> list[tuple[str, isl.Map, int]]:
    """The copies of a cache: (kind, the region [P] -> X[e] copied, -1 before the consumer or +1 after)."""
    req, boxes = site.req, site.boxes
    if req.kind == "read" and req.whole:
        if not all(b.size is not None for b in boxes):
            raise ScheduleError(f"{site.what}: copying whole tiles needs a footprint of constant size")
        # the box is rounded to whole instruction tiles; what lies past the tensor reads as zero
        return [("copy_in", _box_region(site.off_map, [b.size for b in boxes], site.m), -1)]  # type: ignore[misc]
    if req.kind == "read":
        return [("copy_in", site.fp, -1)]
    written = site.fp  # the exact written footprint
    whole = _whole_written(program, site) if req.whole else None
    box = whole[0] if whole is not None else None
    out = []
    if fill:
        # a fill touches only the buffer: the whole box (constant loops, registers)
        out.append(("fill", box if box is not None else written, -1))
    elif req.consumer + INIT_SUFFIX not in redirected or program.statements[req.consumer + INIT_SUFFIX].guarded:
        # the buffer starts from the tensor's values (those a guarded initialization leaves)
        out.append(("copy_in", written, -1))
    out.append(("copy_out", box if box is not None else written, +1))
    return out


def _scope_statements(site: _Site, scope_range: isl.Set, first: int, last: int, width: int
                      ) -> list[tuple[Scheduled, object]]:
    """The allocation (static position ``first``) and release (``last``) of the buffer in every
    iteration of its loop."""
    from .materialize import StmtPlan
    name, p_names = site.req.name, site.p_names
    out: list[tuple[Scheduled, object]] = []
    for kind, static in (("alloc", first), ("free", last)):
        sname = f"{name}__{kind}"
        sdom = scope_range.set_tuple_name(sname)
        for k, nm in enumerate(p_names):
            sdom = sdom.set_dim_name(isl.dim_type.set, k, nm)
        outs = p_names + [str(static)] + ["0"] * (width - site.m - 1)
        smap = isl.Map(f"{{ {sname}[{', '.join(p_names)}] -> [{', '.join(outs)}] }}").intersect_domain(sdom)
        out.append((Scheduled(Statement(sname, list(p_names), sdom, dyn_params=site.keep), smap),
                    StmtPlan(sname, kind, name, list(p_names), {})))
    return out


def _copy_statement(program: PolyProgram, site: _Site, kind: str, region: isl.Map, static: int,
                    scope_range: isl.Set, width: int) -> tuple[Scheduled, object]:
    """One copy (copy_in, copy_out or fill) of ``region`` at static position ``static`` of the
    cache's loop: a statement [P, q] looping over the buffer's layout (or the tensor's indices)."""
    from .materialize import StmtPlan
    req, m, p_names, ctx = site.req, site.m, site.p_names, program.context
    if req.order == "source":
        rel = region.reset_tuple_id(isl.dim_type.out)  # [P] -> [e]: loops over the tensor's indices
    else:
        rel = _sum(region, site.off_map.neg()).apply_range(site.lmap)  # [P] -> [c]: over the cache's
    if req.block_dims:  # a shared cache: all threads of the block take part in the copy
        rel = _whole_block(rel, m, req.block_dims).intersect_domain(scope_range)
    elif region is not site.fp:
        # a box or packed region: over the cache's iterations P only. The footprint's P lie among
        # them already, and intersecting them again split a copy's domain by the iterations' pieces
        # (2 x 8 into 15 for a write cache of skewed tiles: 2.3 times the AST's time, fuzz seed 31
        # case 244)
        rel = rel.intersect_domain(site.iterations)
    n_c = rel.dim(isl.dim_type.out)
    c_names = _names("q", n_c)
    cname = f"{req.name}__{kind}"
    cdom = rel.wrap().flatten().set_tuple_name(cname)
    for k, nm in enumerate(p_names + c_names):
        cdom = cdom.set_dim_name(isl.dim_type.set, k, nm)
    outs = p_names + [str(static)]
    for c in c_names:
        outs += [c, "0"]
    outs += ["0"] * (width - len(outs))
    if len(outs) > width:
        raise ScheduleError(f"{site.what}: internal width {len(outs)} exceeds {width}")
    cmap = isl.Map(f"{{ {cname}[{', '.join(p_names + c_names)}] -> [{', '.join(outs)}] }}")
    cmap = cmap.intersect_domain(cdom)
    cstmt = Statement(cname, p_names + c_names, cdom, dyn_params=site.keep)
    names = p_names + c_names
    plan = StmtPlan(cname, kind, req.name, names, {2 * k + 1: f"{req.name}.{c}" for k, c in
                                                  enumerate(c_names, start=m // 2)})
    plan.fill_value = req.fill if kind == "fill" else None
    plan.zfill = bool(req.whole) and kind == "copy_in"
    plan.guard_inside = kind == "copy_out" and region is not site.fp
    if req.order == "source":
        # the element is a loop index; the cache side goes through the offset and layout
        plan.elem_index = [AExpr("id", name=c) for c in c_names]
        plan.cache_rewrite = CacheRewrite(cname, req.tensor, req.name, site.offsets,
                                          [AExpr("id", name=n) for n in p_names], site.lvars, site.lexprs)
    elif site.codegen:
        src = _src_index(site.off_map, site.lmap.reverse(), m, n_c)
        src_pma = isl.PwMultiAff.from_map(src)
        plan.elem_index = [_expr(src_pma.get_pw_aff(d), names, ctx) for d in range(len(site.boxes))]
        plan.cache_index = [AExpr("id", name=c) for c in c_names]
    return Scheduled(cstmt, cmap), plan


def _iterations(copy: Scheduled, m: int) -> isl.Set:
    """The iterations P of the cache's loop in which a copy statement [P, q] runs."""
    dom = copy.stmt.domain
    return dom.project_out(isl.dim_type.set, m, dom.dim(isl.dim_type.set) - m)


def _find_users(program: PolyProgram, plan: CachePlan) -> None:
    """Which statements' accesses of each buffer's tensor end in it: computations (whose accesses the
    last rewrite of the tensor redirects) and copies of other buffers chained to it."""
    uses = {u.name: u for u in plan.uses}
    for stmt, rws in plan.rewrites.items():
        st = program.statements[stmt]
        for tensor, cache in {r.tensor: r.cache for r in rws}.items():
            sides = {side for side, accs in (("read", st.reads), ("write", st.writes))
                     if any(a.tensor == tensor for a in accs)}
            uses[cache].users[stmt] = sides
    for _, splan in plan.statements:
        if splan.kind in ("copy_in", "copy_out"):  # type: ignore[attr-defined]
            for r in splan.rewrites:  # type: ignore[attr-defined]
                uses[r.cache].users[splan.name] = {"read" if splan.kind == "copy_in" else "write"}  # type: ignore[attr-defined]


def _fold_scope(site: _Site, use: CacheUse, uses: list[CacheUse], scheds: Mapping[str, StageSchedule],
                width: int) -> list[tuple[Scheduled, object]]:
    """The scope of a folded buffer in each iteration of its loop: around every statement using it,
    the copies of caches chained to it included."""
    pos = site.m // 2
    statics = []
    for name in use.users:
        if name in scheds:
            statics.append(scheds[name].statics[pos])
            continue
        cache = next(u for u in uses if name.startswith(u.name + "__"))
        kind = name[len(cache.name) + 2:]
        statics.append(cache.copies[kind][1] if cache.m == site.m else scheds[cache.consumer].statics[pos])
    return _scope_statements(site, site.iterations, min(statics) - STATIC_SCALE // 2,
                             max(statics) + STATIC_SCALE // 2 - 1, width)


def _all_threads(prefixes: isl.Set, block_dims: frozenset[int]) -> isl.Set:
    """``prefixes`` with each thread-bound dimension ranging over all its values in the kernel."""
    out = prefixes
    n = prefixes.dim(isl.dim_type.set)
    for d in sorted(block_dims):
        if d >= n:
            continue
        flat = prefixes.project_out(isl.dim_type.param, 0, prefixes.dim(isl.dim_type.param))
        lo, hi = flat.dim_min_val(d), flat.dim_max_val(d)
        out = out.project_out(isl.dim_type.set, d, 1).insert_dims(isl.dim_type.set, d, 1)
        if lo.is_int() and hi.is_int():
            names = [f"x{k}" for k in range(n)]
            box = isl.Set(f"{{ [{', '.join(names)}] : {lo.to_python()} <= x{d} <= {hi.to_python()} }}")
        else:  # a thread loop whose extent is a parameter's (seed 7 case 2189): its range at each value
            values = prefixes.project_out(isl.dim_type.set, d + 1, n - d - 1).project_out(isl.dim_type.set, 0, d)
            box = isl.Set.from_basic_set(values.simple_hull()).insert_dims(isl.dim_type.set, 0, d) \
                .add_dims(isl.dim_type.set, n - d - 1).reset_tuple_id()
            box = box.align_params(out.get_space())
        out = out.intersect(box.set_tuple_id(out.get_tuple_id()) if out.has_tuple_id() else box)
    return out


def _rounded(b: _Box, granule: int, what: str) -> _Box:
    if b.size is None:
        raise ScheduleError(f"{what}: whole tiles need a footprint of constant size")
    return _Box(b.offset, -(-b.size // granule) * granule, None, b.lo, b.hi)


def _whole_written(program: PolyProgram, site: _Site) -> tuple[isl.Map, bool] | None:
    """The region a whole write cache is filled and written back over, when what is written is
    exactly its part inside the tensor (the write-back then runs over constant loops with a bounds
    test): the footprint's whole box, or, where the layout packs a scattered footprint (a thread's
    share of a block tile in pieces), the elements of all the buffer's places. The flag says which
    (True: the box)."""
    req, boxes = site.req, site.boxes
    if not all(b.size is not None for b in boxes):
        return None
    try:
        bounds = tensor_bounds(program.func.tensor(req.tensor), program.params)  # type: ignore[arg-type]
    except (isl.Error, NotAffine):
        return None
    exact = site.fp.reset_tuple_id(isl.dim_type.out).intersect_params(program.context)

    def exactly(region: isl.Map) -> bool:
        inside = region.intersect_range(bounds.reset_tuple_id()).intersect_params(program.context)
        inside = inside.intersect_domain(exact.domain())
        return inside.is_equal(exact.align_params(inside.get_space()))

    box = _box_region(site.off_map, [b.size for b in boxes], site.m)  # type: ignore[misc]
    if exactly(box):
        return box, True
    if req.loc == "fragment":  # the tensor cores' tiles are boxes
        return None
    packed = _packed_region(site)
    return (packed, False) if exactly(packed) else None


def _packed_region(site: _Site) -> isl.Map:
    """{ [P] -> [e] : e = off(P) + layout⁻¹(c), c in the buffer }: the elements of every place of the
    buffer (the hull of the footprint's image under the layout)."""
    img = _sum(site.fp, site.off_map.neg()).range().apply(site.lmap)
    img = img.project_out(isl.dim_type.param, 0, img.dim(isl.dim_type.param))
    cs = [f"c{k}" for k in range(img.dim(isl.dim_type.set))]
    cons = " and ".join(f"0 <= {c} <= {img.dim_max_val(k).to_python()}" for k, c in enumerate(cs)) or "true"
    rels = isl.Set(f"{{ [{', '.join(cs)}] : {cons} }}").apply(site.lmap.reverse())
    ps = isl.Set(f"{{ [{', '.join(f'p{k}' for k in range(site.m))}] }}")
    return _sum(site.off_map, isl.Map.from_domain_and_range(ps, rels.reset_tuple_id()))


def _box_region(off_map: isl.Map, sizes: list[int], m: int) -> isl.Map:
    """{ [P] -> [e] : off(P) <= e < off(P) + size }: the whole box of a footprint."""
    ps = [f"p{k}" for k in range(m)]
    rs = [f"r{d}" for d in range(len(sizes))]
    cons = " and ".join(f"0 <= {r} < {s}" for r, s in zip(rs, sizes)) or "true"
    rel = isl.Map(f"{{ [{', '.join(ps)}] -> [{', '.join(rs)}] : {cons} }}")
    return _sum(off_map, rel)


def _whole_block(fp: isl.Map, m: int, block_dims: frozenset[int]) -> isl.Map:
    """A shared cache serves every thread of the block: the footprint at P is the union over all
    values of the thread-bound dimensions of P."""
    ps = [f"p{k}" for k in range(m)]
    qs = [f"q{k}" if k in block_dims else f"p{k}" for k in range(m)]
    same = isl.Map(f"{{ [{', '.join(ps)}] -> [{', '.join(qs)}] }}")
    return same.apply_range(fp.reset_tuple_id(isl.dim_type.in_))


def _src_index(off_map: isl.Map, linv: isl.Map, m: int, n_c: int) -> isl.Map:
    """{ [P, c] -> [e] : e = off(P) + layout^-1(c) }."""
    off_ext = off_map.insert_dims(isl.dim_type.in_, m, n_c)
    linv_ext = linv.insert_dims(isl.dim_type.in_, 0, m)
    off_ext = off_ext.reset_tuple_id(isl.dim_type.in_).reset_tuple_id(isl.dim_type.out)
    linv_ext = linv_ext.reset_tuple_id(isl.dim_type.in_).reset_tuple_id(isl.dim_type.out)
    return _sum(off_ext, linv_ext)


def _sum(a: isl.Map, b: isl.Map) -> isl.Map:
    """{ x -> u + v : x -> u in a, x -> v in b }, parameters aligned first."""
    a = a.reset_tuple_id(isl.dim_type.out).reset_tuple_id(isl.dim_type.in_)
    b = b.reset_tuple_id(isl.dim_type.out).reset_tuple_id(isl.dim_type.in_)
    a = a.align_params(b.get_space())
    b = b.align_params(a.get_space())
    return a.sum(b)


def _init_inside(update: StageSchedule, init: StageSchedule, level: int | None) -> bool:
    """Whether the initialization of every element runs inside the cache's loop iteration."""
    if level is None:
        return True
    n_shared = 0
    for a, b in zip(update.loops.names, init.loops.names):
        if a != b:
            break
        n_shared += 1
    return n_shared > level and init.statics[:level + 1] == update.statics[:level + 1]

