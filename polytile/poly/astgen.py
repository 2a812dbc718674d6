"""AST generation: scheduled statements to an isl AST, returned as plain ``astnodes``.

Data-dependent bounds are handled with schedule-tree *context* nodes (as PPCG does for thread
identifiers): a dynamic parameter is introduced just below the loops that fix the iterators it
reads, so loops outside never see it and nothing reads the bound arrays out of place. A *binding
statement* ``_bindN`` placed first under that node gives the code generator the spot (and the
iterator values) where the parameters are loaded: it runs at every prefix where the computation
may have instances (isl guards it with the condition, which keeps the loads inside the arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial

import islpy as isl

from ..errors import LoweringError
from .astnodes import AExpr, AstBlock, AstFor, AstIf, AstMark, AstNode, AstUser, aid, aint, reads_any
from .limits import isl_budget
from .model import Statement, constant_bounds, header, project_out_params

_OPS = {
    isl.ast_expr_op_type.add: "add", isl.ast_expr_op_type.sub: "sub", isl.ast_expr_op_type.mul: "mul",
    isl.ast_expr_op_type.minus: "neg", isl.ast_expr_op_type.min: "min", isl.ast_expr_op_type.max: "max",
    isl.ast_expr_op_type.fdiv_q: "fdiv_q", isl.ast_expr_op_type.pdiv_q: "pdiv_q",
    isl.ast_expr_op_type.pdiv_r: "pdiv_r", isl.ast_expr_op_type.zdiv_r: "zdiv_r",
    isl.ast_expr_op_type.div: "pdiv_q", isl.ast_expr_op_type.select: "select",
    isl.ast_expr_op_type.cond: "select", isl.ast_expr_op_type.eq: "eq", isl.ast_expr_op_type.le: "le",
    isl.ast_expr_op_type.lt: "lt", isl.ast_expr_op_type.ge: "ge", isl.ast_expr_op_type.gt: "gt",
    isl.ast_expr_op_type.and_: "and", isl.ast_expr_op_type.and_then: "and",
    isl.ast_expr_op_type.or_: "or", isl.ast_expr_op_type.or_else: "or",
}


def convert_expr(e: isl.AstExpr) -> AExpr:
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        return aint(e.get_val().to_python())
    if t == isl.ast_expr_type.id:
        return aid(e.get_id().get_name())
    op = e.get_op_type()
    if op not in _OPS:
        raise LoweringError(f"unexpected isl AST operation {op}")
    args = tuple(convert_expr(e.get_op_arg(k)) for k in range(e.get_op_n_arg()))
    return AExpr(_OPS[op], args)


def convert_node(node: isl.AstNode) -> AstNode:
    t = node.get_type()
    if t == isl.ast_node_type.for_:
        it = node.for_get_iterator().get_id().get_name()
        inc = node.for_get_inc().get_val().to_python()
        degenerate = node.for_is_degenerate()
        cond = aint(1) if degenerate else convert_expr(node.for_get_cond())
        body = convert_node(node.for_get_body())
        if not degenerate:
            cond, body = _bound_free_of_iterator(it, cond, body)
        return AstFor(it, convert_expr(node.for_get_init()), cond, int(inc), body,
                      int(it[1:]) if it[1:].isdigit() else -1, degenerate)
    if t == isl.ast_node_type.if_:
        orelse = convert_node(node.if_get_else_node()) if node.if_has_else_node() else None
        return AstIf(convert_expr(node.if_get_cond()), convert_node(node.if_get_then_node()), orelse)
    if t == isl.ast_node_type.block:
        kids = node.block_get_children()
        return AstBlock(tuple(convert_node(kids.get_at(k)) for k in range(kids.n_ast_node())))
    if t == isl.ast_node_type.user:
        call = node.user_get_expr()
        name = call.get_op_arg(0).get_id().get_name()
        args = tuple(convert_expr(call.get_op_arg(k)) for k in range(1, call.get_op_n_arg()))
        return AstUser(name, args)
    if t == isl.ast_node_type.mark:
        return AstMark(node.mark_get_id().get_name(), convert_node(node.mark_get_node()))
    raise LoweringError(f"unexpected isl AST node {t}")


def _bound_free_of_iterator(it: str, cond: AExpr, body: AstNode) -> tuple[AExpr, AstNode]:
    """The condition and body of loop ``it`` with an upper bound that does not read ``it``. isl may
    bound a loop by a modular constraint of its own iterator (``c3 <= min(2, -c1 + 2 * floord(c1 + c3
    + 1, 2) - 1)`` holds where c1 + c3 is odd): that is a condition on each iteration, not where the
    loop ends, and it may fail before later iterations that hold. The loop runs to the operands of
    the bound free of ``it``, and the whole condition guards its body."""
    bound = cond.args[1] if len(cond.args) == 2 else None
    if bound is None or not reads_any(bound, (it,)):
        return cond, body
    free = [b for b in (bound.args if bound.op == "min" else (bound,)) if not reads_any(b, (it,))]
    if not free:
        raise LoweringError(f"isl bounds loop {it} only by a condition of {it} itself ({cond}); "
                            "the schedule has no loop end to generate")
    end = free[0] if len(free) == 1 else AExpr("min", tuple(free))
    return AExpr(cond.op, (cond.args[0], end)), AstIf(cond, body, None)


def pw_aff_expr(pa: isl.PwAff, in_names: list[str], context: isl.Set | None = None) -> AExpr:
    """An isl piecewise affine function of named inputs (and parameters) as an AExpr."""
    n = pa.dim(isl.dim_type.in_)
    for k, name in enumerate(in_names[:n]):
        pa = pa.set_dim_id(isl.dim_type.in_, k, isl.Id(name))
    moved = pa.move_dims(isl.dim_type.param, pa.dim(isl.dim_type.param), isl.dim_type.in_, 0, n)
    ctx = isl.Set.universe(moved.domain().get_space())
    if context is not None:
        ctx = ctx.intersect_params(context)
    ctx = ctx.intersect(moved.domain())
    build = isl.AstBuild.from_context(ctx)
    return convert_expr(build.expr_from_pw_aff(moved))


@dataclass
class Scheduled:
    """A statement with its full (2d+1, padded) schedule map; ``everywhere``, where known, makes the
    same schedule over every integer point (the loop primitives' functions), to scan beyond the
    domain — called only then (rarely: ``_without_divs``); ``function``, where known, is that
    schedule as the primitives' composed function (see ``LoopSchedule.function``); ``inverse``, where
    known, the statement's instance at the schedule's values (see ``LoopSchedule.inverse``)."""

    stmt: Statement
    schedule: isl.Map
    everywhere: Callable[[], isl.Map] | None = None
    function: isl.PwMultiAff | None = None
    inverse: isl.PwMultiAff | None = None


@dataclass
class Binding:
    """``_bindN`` loads ``params`` of computation ``owner``; its domain is (prefix…, ``sources``…)."""

    name: str
    owner: str
    params: list[str]
    prefix_len: int
    sources: list[str]


def dim_range(context: isl.Set, items: list[Scheduled], d: int, constant: bool = False) -> tuple[AExpr, AExpr]:
    """The smallest and largest value schedule dimension ``d`` takes over every statement, as
    expressions of the parameters (GPU launch bounds: exact even for non-rectangular loops);
    ``constant``: bounds valid for every parameter value (thread blocks need constant sizes)."""
    img: isl.Set | None = None
    for it in items:
        dom = it.stmt.over_domain()
        s = dom.apply(project_out_params(it.schedule, it.stmt.dyn_params).intersect_domain(dom))
        s = s.reset_tuple_id()
        n = s.dim(isl.dim_type.set)
        s = s.project_out(isl.dim_type.set, d + 1, n - d - 1).project_out(isl.dim_type.set, 0, d)
        img = s if img is None else img.union(s)
    assert img is not None
    img = img.intersect_params(context)
    bounds = constant_bounds(img) if constant else None
    if bounds is not None:
        return aint(bounds[0]), aint(bounds[1])
    lo = img.dim_min(0).coalesce()
    hi = img.dim_max(0).coalesce()
    return pw_aff_expr(lo, [], context), pw_aff_expr(hi, [], context)


def full_tiles(it: Scheduled, d: int, width: int, need: list[int]) -> isl.Set:
    """A convex set of values of schedule dimensions 0..d for which the inner dimensions ``need``
    of ``it`` run their whole range (full tiles): { P : P × inner ⊆ image } restricted to a convex
    part (isl isolates only convex sets)."""
    img = it.stmt.over_domain().apply(it.schedule.intersect_domain(it.stmt.over_domain()))
    img = img.reset_tuple_id()
    drop = [q for q in range(d + 1, width) if q not in need]
    for q in reversed(drop):
        img = img.project_out(isl.dim_type.set, q, 1)
    n = img.dim(isl.dim_type.set)
    pref = img.project_out(isl.dim_type.set, d + 1, n - d - 1)
    inner = img.project_out(isl.dim_type.set, 0, d + 1)
    bad = pref.flat_product(inner).subtract(img).project_out(isl.dim_type.set, d + 1, n - d - 1)
    full = pref.subtract(bad).coalesce()
    if full.n_basic_set() <= 1:
        return full
    hull = isl.Set.from_basic_set(full.convex_hull())
    if hull.is_subset(full):
        return hull
    return isl.Set.from_basic_set(full.get_basic_sets()[0])


def generate(context: isl.Set, items: list[Scheduled], dyn_owner: dict[str, str],
             dyn_sources: dict[str, list[str]], dyn_constraints: dict[str, list[str]],
             isolate: list[isl.Set], width: int) -> tuple[AstNode, list[Binding]]:
    """The AST scanning ``items`` in schedule order.

    ``isolate``: sets over a prefix of the schedule dimensions (full tiles) generated apart from the
    rest, so that the loops inside them have constant extents. ``dyn_owner``/``dyn_sources``: for each
    dynamic parameter, the statement it belongs to and that statement's dimensions it reads.
    ``dyn_constraints``: isl constraints over each parameter that hold for every value (declared value
    ranges and monotonicity).
    """
    if not items:
        return AstBlock(()), []
    with isl_budget(LoweringError, "the schedule"):
        ast, bindings = _generate(context, items, dyn_owner, dyn_sources, dyn_constraints, isolate, width)
        missed = missed_instances(ast, items, context)
        if not missed:
            return ast, bindings
        # isl drops instances of statements whose domains have modular constraints under a fused or
        # skewed loop: scan those statements over their domains without the modular constraints and
        # test the constraints in the loop body instead
        relaxed = [_without_divs(it) if it.stmt.name in missed else it for it in items]
        ast, bindings = _generate(context, relaxed, dyn_owner, dyn_sources, dyn_constraints, isolate, width)
        if missed_instances(ast, relaxed, context):
            raise LoweringError(f"isl's code generator produced loops that do not run every instance of "
                                f"{', '.join(sorted(missed))}; keep the loops of its modular conditions (a % in a "
                                "where=) apart: no fuse, skew or apply_sch mixing them")
        guards = {it.stmt.name: set_expr(it.stmt.domain, [f"x{k}" for k in range(len(it.stmt.dims))], context)
                  for it in items if it.stmt.name in missed}
        return _guard_users(ast, guards), bindings


def _generate(context: isl.Set, items: list[Scheduled], dyn_owner: dict[str, str],
              dyn_sources: dict[str, list[str]], dyn_constraints: dict[str, list[str]],
              isolate: list[isl.Set], width: int) -> tuple[AstNode, list[Binding]]:
    by_name = {it.stmt.name: it for it in items}
    bindings: list[Binding] = []
    depth_of: dict[str, int] = {}
    for pname, owner in dyn_owner.items():
        it = by_name.get(owner)
        if it is None:
            continue
        depth_of[pname] = binding_depth(it, dyn_sources[pname])
    groups: dict[tuple[str, int], list[str]] = {}
    for pname, m in depth_of.items():
        groups.setdefault((dyn_owner[pname], m), []).append(pname)
    depths = sorted({m for m in depth_of.values()})
    extra: list[Scheduled] = []
    for (owner, m), pnames in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        it = by_name[owner]
        sources = sorted({s for p in pnames for s in dyn_sources[p]}, key=it.stmt.dims.index)
        bname = f"_bind{len(bindings)}"
        bindings.append(Binding(bname, owner, sorted(pnames), m, sources))
        users = [it] + [u for u in items if set(pnames) & set(u.stmt.dyn_params)]
        extra.append(_binding_statement(bname, it, m, sources, width, _first_position(users, m), depths))
    dyn_all = sorted(depth_of)
    maps = [project_out_params(it.schedule, dyn_all) for it in items]
    functions = [it.function for it in items]
    if depths:
        spread = _spread(width, depths)
        maps = [s.apply_range(spread) for s in maps]
        functions = [None if f is None else isl.PwMultiAff.from_map(spread).pullback_pw_multi_aff(f) for f in functions]
        isolate = [s.apply(_spread(s.dim(isl.dim_type.set), depths)) for s in isolate]
    maps += [b.schedule for b in extra]
    functions += [None] * len(extra)

    # existentially quantified variables made explicit integer divisions (or eliminated): isl's AST
    # generation can take seconds to minutes on a quantified copy domain (e.g. the elements of an
    # A[j % 2] footprint when N >= 2) that it scans at once with the divisions explicit
    domains = {it.stmt.name: project_out_params(it.stmt.domain, dyn_all).compute_divs() for it in items}
    domains.update({b.stmt.name: b.stmt.domain for b in extra})
    domain = _union_set(list(domains.values()))
    sched = None
    for it, smap, function in zip(items + extra, maps, functions):
        u = _schedule_function(smap, function, domains[it.stmt.name])
        sched = u if sched is None else sched.union_add(u)
    assert sched is not None
    schedule = isl.Schedule.from_domain(domain)
    node = schedule.get_root().child(0)
    # the schedule's functions simplified within the domain, which the domain node states once:
    # each function otherwise repeats its statement's domain (a cache's copy domain with divisions
    # and disjunctions) in all its pieces, on which isl's AST generation ran for minutes
    node = node.insert_partial_schedule(isl.MultiUnionPwAff.from_union_pw_multi_aff(sched).gist(domain))
    start = 0
    for m in depths:
        if m > start:
            node = node.band_split(m - start)
            node = _set_isolate(node, 0, start, m, isolate)
            node = node.child(0)
        params_here = [p for p in dyn_all if depth_of[p] == m]
        deeper = [p for p in dyn_all if depth_of[p] > m]
        node = node.insert_context(_context_set(context, params_here, dyn_constraints, m))
        node = node.child(0)
        filt = _union_set([project_out_params(it.stmt.domain, deeper) for it in items]
                          + [b.stmt.domain for b in extra])
        node = node.insert_filter(filt)
        node = node.child(0)
        start = m
    if node.get_type() == isl.schedule_node_type.band:
        node = _set_isolate(node, 0, start, width, isolate)
    known = {it.stmt.name: (it.function, it.inverse) for it in items
             if it.function is not None and it.inverse is not None}
    build = isl.AstBuild.from_context(context).set_at_each_domain(partial(_statement_call, known))
    if isinstance(build, tuple):  # islpy returns the build with a handle keeping the callback alive
        build, _keep = build
    return convert_node(build.node_from_schedule(node.get_schedule())), bindings


def _schedule_function(smap: isl.Map, function: isl.PwMultiAff | None, domain: isl.Set) -> isl.UnionPwMultiAff:
    """A statement's schedule over ``domain`` as a function: the primitives' composed one where
    known, else extracted from the map ``smap`` (cache copies, bindings)."""
    if function is not None:
        return isl.UnionPwMultiAff.from_pw_multi_aff(function.intersect_domain(domain))
    return isl.UnionPwMultiAff.from_union_map(isl.UnionMap.from_map(smap.intersect_domain(domain)))


def _statement_call(known: dict[str, tuple[isl.PwMultiAff, isl.PwMultiAff]], node: isl.AstNode,
                    build: isl.AstBuild) -> isl.AstNode:
    """A statement's call with each argument built from its own simplified piecewise function.

    The arguments come from the primitives' inverses (``known``: each statement's schedule function
    and its inverse) where those give the instances isl scans here. isl's own arguments, derived
    from the instances here, may hold only on them (``80 - 16·((4a + 7b + 5) mod 8)`` where ``b <= 1``
    for odd ``a``, the loops' ``64·(a mod 2) + 16·b`` modulo 128): the tensor-core nests run their
    calls past such guards, over whole zero-filled tiles, and read outside the tiles (the wgmma
    convolution conv0 of tests/cuda/test_wgmma_gpu.py with the loops' functions kept).
    isl derives all arguments from one piecewise multi-function, whose pieces (split by one
    complicated argument, e.g. a loop fusing several dimensions) repeat in every other argument as
    equivalent selects; coalescing each argument apart keeps the simple ones simple."""
    sched = isl.Map.from_union_map(build.get_schedule())
    name = sched.get_tuple_name(isl.dim_type.in_)
    pma = _inverse_here(known.get(name), sched)
    if pma is None:
        pma = isl.PwMultiAff.from_map(sched.reverse())
    args = isl.AstExprList.alloc(pma.get_ctx(), pma.dim(isl.dim_type.out))
    for d in range(pma.dim(isl.dim_type.out)):
        args = args.add(build.expr_from_pw_aff(_one_piece(pma.get_pw_aff(d).coalesce())))
    del node
    return isl.AstNode.user_from_expr(isl.AstExpr.from_id(isl.Id(name)).call(args))


def _inverse_here(known: tuple[isl.PwMultiAff, isl.PwMultiAff] | None, sched: isl.Map) -> isl.PwMultiAff | None:
    """The statement's instances at the values of isl's schedule dimensions here (``sched``: instances
    -> those dimensions, the loops around the call) from ``known``, the statement's schedule function
    and its inverse, where they give exactly the instances of ``sched``; else None."""
    if known is None:
        return None
    function, inverse = known
    to_schedule = isl.PwMultiAff.from_map(sched.reverse().apply_range(isl.Map.from_pw_multi_aff(function)))
    here = inverse.pullback_pw_multi_aff(to_schedule)
    return here if isl.Map.from_pw_multi_aff(here).reverse().is_equal(sched) else None


def _one_piece(pa: isl.PwAff) -> isl.PwAff:
    """``pa`` as one (quasi-)affine function when one agrees with all its pieces (tiled schedules
    come back from isl as disjunctions, e.g. ``64b + i`` where ``w = 0`` and ``64b + 32 + i`` where
    ``w = 1``, which the AST would print as selects): one of the pieces' functions, or the affine
    hull of the function's graph, checked exact."""
    if pa.n_piece() <= 1:
        return pa
    graph = isl.Map.from_pw_aff(pa)
    dom = pa.domain()
    for _, aff in pa.get_pieces():  # one piece's function may hold on the others' domains too
        one = isl.PwAff.from_aff(aff).intersect_domain(dom)
        if isl.Map.from_pw_aff(one).is_equal(graph):
            return one
    hull = isl.Map.from_basic_map(graph.affine_hull())
    if not hull.is_single_valued():
        return pa
    one = isl.PwMultiAff.from_map(hull).get_pw_aff(0).intersect_domain(pa.domain())
    return one if isl.Map.from_pw_aff(one).is_equal(graph) else pa


def _set_isolate(node: isl.ScheduleNode, up: int, start: int, end: int, isolate: list[isl.Set]) -> isl.ScheduleNode:
    """Isolate the full tiles whose separated dimension lies in this band part [start, end)."""
    del up
    if node.get_type() != isl.schedule_node_type.band:
        node = node.parent()
    for k in range(end - start):  # outside isolated full tiles, do not duplicate code per case
        node = node.band_member_set_ast_loop_type(k, isl.ast_loop_type.atomic)
    parts = [s for s in isolate if start <= s.dim(isl.dim_type.set) - 1 < end]
    if not parts:
        return node
    n = end
    sets = []
    for s in parts:
        s = s.add_dims(isl.dim_type.set, n - s.dim(isl.dim_type.set))
        sets.append(s)
    full = sets[0]
    for s in sets[1:]:
        full = full.union(s)
    opt = isl.Map.from_range(full).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, start)
    opt = opt.wrap().set_tuple_name("isolate")
    return node.band_set_ast_build_options(isl.UnionSet.from_set(opt))


def _union_set(sets: list[isl.Set]) -> isl.UnionSet:
    out: isl.UnionSet | None = None
    for s in sets:
        u = isl.UnionSet.from_set(s)
        out = u if out is None else out.union(u)
    assert out is not None
    return out


def _context_set(context: isl.Set, params: list[str], constraints: dict[str, list[str]], m: int) -> isl.Set:
    names = [context.get_dim_name(isl.dim_type.param, k) for k in range(context.dim(isl.dim_type.param))]
    conds = [c for p in params for c in constraints.get(p, [])] or ["1 = 1"]
    dims = ", ".join(f"c{k}" for k in range(m))
    s = isl.Set(f"{header(names + params)}{{ [{dims}] : {' and '.join(conds)} }}")
    return s.intersect_params(context)


def binding_depth(it: Scheduled, sources: list[str]) -> int:
    """The shortest even schedule prefix of ``it`` that fixes the statement dimensions ``sources``."""
    stmt = it.stmt
    dom = stmt.over_domain()
    sched = it.schedule.intersect_domain(dom)
    n_out = sched.dim(isl.dim_type.out)
    keep = [stmt.dims.index(s) for s in sources]
    for m in range(0, n_out + 1, 2):
        prefix = sched.project_out(isl.dim_type.out, m, n_out - m)
        inv = prefix.reverse()  # prefix -> instance
        drop = [k for k in range(len(stmt.dims)) if k not in keep]
        for k in reversed(drop):
            inv = inv.project_out(isl.dim_type.out, k, 1)
        if inv.is_single_valued():
            return m
    raise LoweringError(f"statement {stmt.name}: the schedule does not fix {', '.join(sources)}")


def _first_position(users: list[Scheduled], m: int) -> int:
    """The first position at (static) schedule dimension ``m`` of the statements ``users``: a stage
    placed ``before`` another at a loop sits at a negative position there."""
    return min(int(u.schedule.range().dim_min_val(m).to_python()) for u in users)


def _spread(n: int, depths: list[int]) -> isl.Map:
    """The schedule space of ``n`` dimensions with the static dimensions ``depths`` (those where
    bindings run) doubled: the odd positions there are the bindings' own. At the position before
    its first user, a binding would tie with what sits there (the release of a cache of a stage
    placed before at the same loop), which isl may run after the binding: the loads were then
    inside that cache's scope, and the users after it did not see them."""
    ins = [f"o{k}" for k in range(n)]
    return isl.Map(f"{{ [{', '.join(ins)}] -> [{', '.join(_spread_dims(ins, depths))}] }}")


def _spread_dims(outs: list[str], depths: list[int]) -> list[str]:
    return [f"2 * {o}" if k in depths else o for k, o in enumerate(outs)]


def _binding_statement(name: str, it: Scheduled, m: int, sources: list[str], width: int, first: int,
                       depths: list[int]) -> Scheduled:
    """The loads of the bounds happen at every prefix where ``it`` may have instances (over every
    value of the data-dependent bounds): the instances' image under the prefix and ``sources``;
    they run at schedule dimension ``m`` just before position ``first``, that of the statements
    that use them, in the schedule space with ``depths`` spread out (``_spread``)."""
    stmt = it.stmt
    dom = stmt.over_domain()
    sched = it.schedule.intersect_domain(dom)
    n_out = sched.dim(isl.dim_type.out)
    prefix = sched.project_out(isl.dim_type.out, m, n_out - m)  # instance -> prefix
    # instance -> [prefix, sources]
    src_idx = [stmt.dims.index(s) for s in sources]
    n_dims = len(stmt.dims)
    pick = isl.Map(f"{{ [{', '.join(f'x{k}' for k in range(n_dims))}] -> "
                   f"[{', '.join(f'x{k}' for k in src_idx)}] }}")
    pick = pick.set_tuple_name(isl.dim_type.in_, stmt.name)
    both = prefix.range_product(pick.intersect_domain(dom))
    bdom = both.range().flatten().set_tuple_name(name).coalesce()
    ps = [f"p{k}" for k in range(m)]
    ss = [f"s{k}" for k in range(len(sources))]
    outs = _spread_dims(ps, depths) + [str(2 * first - 1)] + ["0"] * (width - m - 1)
    bs = isl.Map(f"{{ {name}[{', '.join(ps + ss)}] -> [{', '.join(outs)}] }}")
    bstmt = Statement(name, ps + ss, bdom)
    return Scheduled(bstmt, bs.intersect_domain(bdom))


class _Unverifiable(Exception):
    """An AST expression that the check below does not translate back into isl."""


def missed_instances(ast: AstNode, items: list[Scheduled], context: isl.Set) -> set[str]:
    """The statements whose domain has modular constraints (a ``%`` in a where=) and which ``ast``
    does not run exactly: isl's code generator drops instances of such statements under a fused or
    skewed loop (``{ S[i, j, k] -> [10i + j, k] : (i + k) mod 3 = 0 }`` runs one k per outer
    iteration). The loops and conditions of the AST are read back into isl sets."""
    checked = {it.stmt.name: it for it in items
               if not it.stmt.dyn_params and any(b.dim(isl.dim_type.div) for b in it.stmt.domain.get_basic_sets())}
    if not checked:
        return set()
    runs: dict[str, list[tuple[list[str], list[str]]]] = {}
    try:
        _collect_runs(ast, [], [], {name: it.stmt for name, it in checked.items()}, runs)
    except _Unverifiable:
        return set()
    names = [context.get_dim_name(isl.dim_type.param, k) for k in range(context.dim(isl.dim_type.param))]
    missed = set()
    for name, it in checked.items():
        domain = it.stmt.domain.intersect_params(context)
        executed = isl.Set.empty(domain.get_space())
        xs = [f"x{k}" for k in range(len(it.stmt.dims))]
        for iters, conds in runs.get(name, []):
            try:
                executed = executed.union(isl.Set(
                    f"{header(names)}{{ {name}[{', '.join(xs)}] : exists ({', '.join(iters) or 'e'} : "
                    f"{' and '.join(conds) or '1 = 1'}) }}"))
            except isl.Error:  # a name the context does not declare (a data-dependent bound)
                return set()
        executed = executed.intersect_params(context)
        if not executed.is_subset(domain) or not (_runs_on_time(it, domain, runs.get(name, []), names)
                                                  or domain.is_subset(executed)):
            missed.add(name)
    return missed


def _runs_on_time(it: Scheduled, domain: isl.Set, runs: list[tuple[list[str], list[str]]], names: list[str]) -> bool:
    """Whether every instance of ``domain`` runs with the loop iterators at its schedule's values
    (``cK`` at dimension K): the runs' conditions are then a set of the instances with no unknowns.
    A sufficient test, cheap where the exact one (the runs' iterators quantified) can take isl
    minutes to complement (fuzz seed 43 case 2731). The schedule's function: the primitives' where
    known, else the map's affine hull where that is a function (a cache's copy, whose domain, a
    footprint in pieces, took the exact test past isl's budget: fuzz seed 101 case 4025); False
    where neither is."""
    function = it.function
    if function is None:  # no primitives' function (a cache's copy): its map may still be one
        hull = isl.Map.from_basic_map(it.schedule.affine_hull())
        if not hull.is_single_valued():
            return False
        function = isl.PwMultiAff.from_map(hull)
    xs = [f"x{k}" for k in range(len(it.stmt.dims))]
    cs = [f"c{k}" for k in range(function.dim(isl.dim_type.out))]
    at = isl.Map.from_pw_multi_aff(function.flat_range_product(
        isl.PwMultiAff(f"{{ {it.stmt.name}[{', '.join(xs)}] -> [{', '.join(xs)}] }}")))
    if not domain.is_subset(at.domain()):
        return False
    # the instances with their loops' values, cut by the runs' conditions one at a time: a run's
    # conditions made one set (a 'mod' of a 'max' of a 'mod', 230 pieces) or its preimage under the
    # function took isl minutes to compare with the domain (fuzz seed 71 cases 144 and 3489)
    points = domain.apply(at)
    covered = isl.Set.empty(points.get_space())
    for _, conds in runs:
        inside = points
        for cond in conds:
            try:
                where = isl.Set(f"{header(names)}{{ [{', '.join(cs + xs)}] : {cond} }}")
            except isl.Error:  # an iterator beyond the schedule's dimensions, a data-dependent bound
                return False
            if not inside.is_subset(where):
                inside = inside.intersect(where).coalesce()
        if inside is points:
            return True
        covered = covered.union(inside)
    return points.is_subset(covered)


def _without_divs(it: Scheduled) -> Scheduled:
    """``it`` over its domain without the modular constraints (a superset), its schedule's function
    extended to the added points: the loop primitives' functions where known, else the schedule's
    own pieces. An extension must be a one-to-one function of every added point: the pieces of a
    schedule read on a strided domain may be integers on its points only (``i mod 3`` on odd i reads
    as ``((3 - i) mod 6)/2``), and isl refuses a band that drops instances (fuzz seed 41 case 9055);
    a fusion sized on the domain's points may send an added point to an instance's time."""
    relaxed = it.stmt.domain.remove_divs()
    for schedule, function in _extensions(it, relaxed):
        if (schedule.domain().is_equal(relaxed) and schedule.is_single_valued() and schedule.is_injective()
                and schedule.intersect_domain(it.stmt.domain).is_equal(it.schedule)):
            return Scheduled(replace(it.stmt, domain=relaxed), schedule, it.everywhere, function, it.inverse)
    raise LoweringError(f"isl's code generator produced loops that do not run every instance of "
                        f"{it.stmt.name}; keep the loops of its modular conditions (a % in a where=) apart: "
                        "no fuse, skew or apply_sch mixing them")


def _extensions(it: Scheduled, relaxed: isl.Set) -> Iterator[tuple[isl.Map, isl.PwMultiAff | None]]:
    """Candidate schedules of ``it`` over ``relaxed`` (a superset of its domain), the likeliest first,
    each with its function where known."""
    if it.everywhere is not None:
        # as full_map states a schedule over a domain: isl's equalities explicit
        yield it.everywhere().intersect_domain(relaxed).detect_equalities().coalesce(), it.function
    pma = isl.PwMultiAff.from_map(it.schedule)
    schedule: isl.Map | None = None
    for d in range(pma.dim(isl.dim_type.out)):
        pieces = _one_piece(pma.get_pw_aff(d).coalesce()).get_pieces()
        if len(pieces) != 1:
            return
        dim = isl.Map.from_pw_aff(isl.PwAff.from_aff(pieces[0][1]))
        schedule = dim if schedule is None else schedule.flat_range_product(dim)
    if schedule is not None:
        yield schedule.intersect_domain(relaxed), None


def _guard_users(n: AstNode, guards: dict[str, AExpr]) -> AstNode:
    """``n`` with each call of a statement of ``guards`` under its guard (over the statement's
    dimensions, which become the call's arguments)."""
    if isinstance(n, AstUser):
        guard = guards.get(n.stmt)
        return n if guard is None else AstIf(_substitute(guard, {f"x{k}": a for k, a in enumerate(n.args)}), n, None)
    if isinstance(n, AstFor):
        return replace(n, body=_guard_users(n.body, guards))
    if isinstance(n, AstIf):
        return AstIf(n.cond, _guard_users(n.then, guards),
                     _guard_users(n.orelse, guards) if n.orelse is not None else None)
    if isinstance(n, AstBlock):
        return AstBlock(tuple(_guard_users(k, guards) for k in n.body))
    if isinstance(n, AstMark):
        return AstMark(n.name, _guard_users(n.body, guards))
    return n


def _substitute(e: AExpr, values: dict[str, AExpr]) -> AExpr:
    if e.op == "id":
        return values.get(e.name, e)
    return replace(e, args=tuple(_substitute(a, values) for a in e.args)) if e.args else e


def set_expr(s: isl.Set, in_names: list[str], context: isl.Set) -> AExpr:
    """The condition that a point of ``s``'s dimensions, named ``in_names``, lies in ``s``."""
    n = s.dim(isl.dim_type.set)
    s = s.reset_tuple_id()
    for k, name in enumerate(in_names[:n]):
        s = s.set_dim_id(isl.dim_type.set, k, isl.Id(name))
    moved = s.move_dims(isl.dim_type.param, s.dim(isl.dim_type.param), isl.dim_type.set, 0, n)
    build = isl.AstBuild.from_context(isl.Set.universe(moved.get_space()).intersect_params(context))
    return convert_expr(build.expr_from_set(moved))


def _collect_runs(n: AstNode, iters: list[str], conds: list[str], stmts: dict[str, Statement],
                  runs: dict[str, list[tuple[list[str], list[str]]]]) -> None:
    """For every user node of ``stmts``: the loop iterators around it and the conditions under
    which it runs, with ``xK = argument K``, as isl text."""
    if isinstance(n, AstFor):
        init = _isl_text(n.init)
        if n.degenerate:
            here = [f"{n.iterator} = {init}"]
        else:
            here = [f"{n.iterator} >= {init}", _isl_text(n.cond)]
            if n.step != 1:
                here.append(f"({n.iterator} - {init}) mod {n.step} = 0")
        _collect_runs(n.body, iters + [n.iterator], conds + here, stmts, runs)
    elif isinstance(n, AstIf):
        cond = _isl_text(n.cond)
        _collect_runs(n.then, iters, conds + [cond], stmts, runs)
        if n.orelse is not None:
            _collect_runs(n.orelse, iters, conds + [f"not ({cond})"], stmts, runs)
    elif isinstance(n, AstBlock):
        for kid in n.body:
            _collect_runs(kid, iters, conds, stmts, runs)
    elif isinstance(n, AstMark):
        _collect_runs(n.body, iters, conds, stmts, runs)
    elif isinstance(n, AstUser) and n.stmt in stmts:
        args = [f"x{k} = {_isl_text(a)}" for k, a in enumerate(n.args)]
        runs.setdefault(n.stmt, []).append((iters, conds + args))


_ISL_BINARY = {"add": "+", "sub": "-", "mul": "*", "eq": "=", "le": "<=", "lt": "<", "ge": ">=", "gt": ">",
               "and": "and", "or": "or"}


def _isl_text(e: AExpr) -> str:
    if e.op == "int":
        return str(e.value)
    if e.op == "id":
        return e.name
    args = [_isl_text(a) for a in e.args]
    if e.op in _ISL_BINARY:
        return "(" + f" {_ISL_BINARY[e.op]} ".join(args) + ")"
    if e.op == "neg":
        return f"(-{args[0]})"
    if e.op in ("min", "max"):
        out = args[0]
        for a in args[1:]:
            out = f"{e.op}({out}, {a})"
        return out
    if e.op in ("fdiv_q", "pdiv_q", "pdiv_r", "zdiv_r") and e.args[1].op == "int":
        return f"floor({args[0]}/{args[1]})" if e.op.endswith("_q") else f"({args[0]} mod {args[1]})"
    raise _Unverifiable(e.op)
