"""Polyhedral statements of a computation: iteration domains and access relations as isl objects.

A computation without a reduction is one statement ``C[i, j]``. A reduction is two: ``C__init[i, j]``
(the identity) and the update ``C[i, j, k]``. Domains are exact; bounds read from tensors appear as
dynamic parameters (``_d0``…) that the AST generator binds inside the loops they depend on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from ..errors import LanguageError
from ..lang.expr import Call, Cmp, Expr, IterVar, Load, Logic, Not, Param, Reduce, Select, Var, walk
from ..lang.printer import expr_str
from ..lang.tensor import ComputeTensor, Placeholder, Tensor
from .affine import Affine, DynParams, NotAffine, affine, condition, minmax_bounds

INIT_SUFFIX = "__init"


def header(params: list[str]) -> str:
    return f"[{', '.join(params)}] -> " if params else ""


@dataclass
class Access:
    """A read or write of ``tensor`` by a statement: ``relation`` maps instances to elements."""

    tensor: str
    relation: isl.Map
    exact: bool  # every index affine and no non-affine guard


@dataclass
class Statement:
    """One polyhedral statement: ``domain`` (exact, may use dynamic parameters) and its accesses."""

    name: str
    dims: list[str]
    domain: isl.Set
    reads: list[Access] = field(default_factory=list)
    writes: list[Access] = field(default_factory=list)
    dyn_params: list[str] = field(default_factory=list)
    reduce_dims: list[str] = field(default_factory=list)
    guarded: bool = False  # its body tests a data-dependent condition: it may not write every instance's element

    def over_domain(self) -> isl.Set:
        """The domain with dynamic parameters projected out: what loops outside their binding see."""
        return project_out_params(self.domain, self.dyn_params)


def constant_bounds(s: isl.Set) -> tuple[int, int] | None:
    """The smallest and largest value of the one-dimensional set ``s`` over every value of its
    parameters (None where one is unbounded): the fixed sizes a thread block needs."""
    flat = s.project_out(isl.dim_type.param, 0, s.dim(isl.dim_type.param))
    lo, hi = flat.dim_min_val(0), flat.dim_max_val(0)
    if lo.is_infty() or lo.is_neginfty() or hi.is_infty() or hi.is_neginfty() or lo.is_nan() or hi.is_nan():
        return None
    return int(lo.to_python()), int(hi.to_python())


def project_out_params(s: isl.Set | isl.Map, names: list[str]) -> isl.Set | isl.Map:
    for n in names:
        pos = s.find_dim_by_name(isl.dim_type.param, n)
        if pos >= 0:
            s = s.project_out(isl.dim_type.param, pos, 1)
    return s


class Namer:
    """Names isl dimensions after iterators and parameters of one statement."""

    def __init__(self, stmt: str, axes: list[IterVar]):
        self.stmt = stmt
        self.by_id = {id(a): a.name for a in axes}

    def __call__(self, v: Var) -> str:
        if isinstance(v, Param):
            return v.name
        if id(v) in self.by_id:
            return self.by_id[id(v)]
        raise NotAffine(f"{v.name} is not an iterator of {self.stmt}")


def global_context(params: list[Param], constraints: list[Expr], placeholders: list[Placeholder]) -> isl.Set:
    """Parameter constraints: sizes are non-negative, plus the user's constraints."""
    names = [p.name for p in params]
    namer = Namer("the function", [])
    conds = [f"{n} >= 0" for n in names]
    for c in constraints:
        try:
            conds.append(condition(c, namer))
        except NotAffine as err:
            raise LanguageError(f"constraint {expr_str(c)} is not affine in the parameters: {err}") from None
    del placeholders
    return isl.Set(f"{header(names)}{{ : {' and '.join(conds) if conds else '1 = 1'} }}")


def _shape_bounds(t: Tensor, names: list[str], namer: Namer) -> list[str]:
    out = []
    for n, ext in zip(names, t.shape):
        try:
            out.append(f"0 <= {n} < {affine(ext, namer)}")
        except NotAffine:
            raise LanguageError(f"dimension {expr_str(ext)} of {t.name} is not affine in the parameters; "
                                "introduce a pt.param for it") from None
    return out


def _guards(e: Expr, namer: Namer) -> list[tuple[Expr, str]]:
    """Affine conditions guarding each load in ``e`` (from enclosing selects): (load, isl condition)."""
    out: list[tuple[Expr, str]] = []

    def go(node: Expr, conds: tuple[str, ...]) -> None:
        if isinstance(node, Select):
            go(node.cond, conds)
            try:
                c = condition(node.cond, namer)
                nc = condition(node.cond, namer, negate=True)
            except NotAffine:
                c = nc = None
            go(node.a, conds + ((c,) if c else ()))
            go(node.b, conds + ((nc,) if nc else ()))
            return
        if isinstance(node, Load):
            out.append((node, " and ".join(conds) if conds else ""))
            for i in node.indices:
                go(i, conds)
            return
        from ..lang.expr import children
        for k in children(node):
            go(k, conds)

    go(e, ())
    return out


def access(stmt: str, dims: list[str], domain: isl.Set, load_tensor: Tensor, indices: tuple[Expr, ...],
           guard: str, namer: Namer, params: list[str]) -> Access:
    """The access relation ``stmt[dims] -> tensor[indices]``, not clipped to the tensor's bounds.

    A non-affine index is unconstrained, except a read of an index array with a declared
    ``value_range``, which ranges over those values.
    """
    outs = [f"o{d}" for d in range(len(indices))]
    conds = [guard] if guard else []
    exact = True
    for o, idx in zip(outs, indices):
        try:
            conds.append(f"{o} = {affine(idx, namer)}")
        except NotAffine:
            exact = False
            vr = _value_range(idx)
            if vr is not None:
                conds.append(f"{vr[0]} <= {o} <= {vr[1]}")
    text = (f"{header(params)}{{ {stmt}[{', '.join(dims)}] -> {load_tensor.name}[{', '.join(outs)}] : "
            f"{' and '.join(conds) or '1 = 1'} }}")
    rel = isl.Map(text).intersect_domain(domain)
    return Access(load_tensor.name, rel, exact)


def _value_range(idx: Expr) -> tuple[Affine, Affine] | None:
    from ..lang.expr import Cast
    while isinstance(idx, Cast):
        idx = idx.a
    if isinstance(idx, Load) and isinstance(idx.tensor, Placeholder) and idx.tensor.value_range is not None:
        namer = Namer(idx.tensor.name, [])
        try:
            return affine(idx.tensor.value_range[0], namer), affine(idx.tensor.value_range[1], namer)
        except NotAffine:
            return None
    return None


def tensor_bounds(t: Tensor, params: list[str]) -> isl.Set:
    outs = [f"o{d}" for d in range(t.ndim)]
    conds = _shape_bounds(t, outs, Namer("shape", []))
    return isl.Set(f"{header(params)}{{ {t.name}[{', '.join(outs)}] : {' and '.join(conds) or '1 = 1'} }}")


def computation_statements(comp: ComputeTensor, body: Expr, params: list[str],
                           dyn: DynParams) -> list[Statement]:
    """Statements of a computation whose (inlined) expression is ``body``."""
    red = body if isinstance(body, Reduce) else None  # its where= has the inlined producers too
    data = list(comp.axes)
    raxes = list(comp.reduce_axes)
    names = [a.name for a in data + raxes]
    if len(set(names)) != len(names):
        raise LanguageError(f"computation {comp.name}: two axes share a name ({', '.join(names)}); "
                            "name reduce axes differently from the data axes")
    namer = Namer(comp.name, data + raxes)
    data_names = [a.name for a in data]
    conds = _shape_bounds(comp, data_names, namer)
    used_dyn: list[str] = []
    data_guard = False  # comp.where tests data: it stays a guard in the bodies of the statements
    if comp.where is not None:
        try:
            conds.append(condition(comp.where, namer))
        except NotAffine:
            data_guard = True
    rconds: list[str] = []
    for ax in raxes:
        for bound, rel in ((ax.lo, ">="), (ax.hi, "<")):
            kind, parts = minmax_bounds(bound)
            for part in parts:
                before = set(dyn.exprs)
                try:
                    form = affine(part, namer)
                except NotAffine:
                    form = affine(part, namer, dyn, comp.name)
                    if kind != "one" and (kind == "max") != (rel == ">="):
                        raise LanguageError(f"computation {comp.name}: bound {expr_str(bound)} of {ax.name} "
                                            "mixes min/max with data-dependent values; simplify it") from None
                used_dyn += [n for n in form.atoms() if n in dyn.exprs]
                _check_dyn_sources(comp, ax, dyn, set(dyn.exprs) - before)
                rconds.append(f"{ax.name} {rel} {form}")
    if red is not None and red.where is not None:
        try:
            rconds.append(condition(red.where, namer))
        except NotAffine:
            pass
    all_params = params + sorted(set(used_dyn))
    hdr = header(all_params)
    init_or_update = comp.name + (INIT_SUFFIX if red is not None else "")
    data_dom = _few_pieces(isl.Set(f"{hdr}{{ {init_or_update}[{', '.join(data_names)}] : "
                                   f"{' and '.join(conds) or '1 = 1'} }}"))
    out_rel_dims = ", ".join(data_names)
    stmts: list[Statement] = []
    if red is not None:
        init_name = comp.name + INIT_SUFFIX
        init = Statement(init_name, data_names, data_dom, guarded=data_guard)
        init.writes.append(Access(comp.name, isl.Map(f"{hdr}{{ {init_name}[{out_rel_dims}] -> "
                                                     f"{comp.name}[{out_rel_dims}] }}").intersect_domain(data_dom),
                                  True))
        if comp.where is not None:  # the initialization reads what the where= condition reads
            for load, guard in _guards(comp.where, namer):
                init.reads.append(access(init_name, data_names, data_dom, load.tensor, load.indices, guard, namer,
                                         all_params))
        stmts.append(init)
    dom = _few_pieces(isl.Set(f"{hdr}{{ {comp.name}[{', '.join(names)}] : "
                              f"{' and '.join(conds + rconds) or '1 = 1'} }}"))
    upd = Statement(comp.name, names, dom, dyn_params=sorted(set(used_dyn)),
                    reduce_dims=[a.name for a in raxes], guarded=data_guard)
    write = isl.Map(f"{hdr}{{ {comp.name}[{', '.join(names)}] -> {comp.name}[{out_rel_dims}] }}")
    upd.writes.append(Access(comp.name, write.intersect_domain(dom), True))
    if red is not None:
        upd.reads.append(Access(comp.name, write.intersect_domain(dom), True))
    roots = [body.body if red is not None else body]
    if red is not None and red.where is not None:
        roots.append(red.where)
    if comp.where is not None:
        roots.append(comp.where)
    for root in roots:
        for load, guard in _guards(root, namer):
            upd.reads.append(access(comp.name, names, dom, load.tensor, load.indices, guard, namer,
                                    all_params))
    for ax in raxes:  # the tensors read by data-dependent bounds
        for b in (ax.lo, ax.hi):
            for load, guard in _guards(b, namer):
                upd.reads.append(access(comp.name, names, dom, load.tensor, load.indices, guard, namer,
                                        all_params))
    stmts.append(upd)
    return stmts


def _few_pieces(dom: isl.Set) -> isl.Set:
    """``dom`` in few, preferably disjoint, pieces. A where= joining conditions with | gives a
    disjunction per term (``(j % 2 == 0) | (l % 2 == 1)`` under ``(i + j >= 5) | (i >= 0)``: four
    overlapping pieces, one of them redundant), on which isl's dataflow analysis ran past its
    operation budget (minutes for each primitive; fuzz seed 59 case 1072); coalesced, then made
    disjoint when that does not add pieces, it takes a fraction of a second."""
    dom = dom.coalesce()
    if dom.n_basic_set() <= 1:
        return dom
    disjoint = dom.make_disjoint().coalesce()
    return disjoint if disjoint.n_basic_set() <= dom.n_basic_set() else dom


def _check_dyn_sources(comp: ComputeTensor, ax: IterVar, dyn: DynParams, new: set[str]) -> None:
    for n in new:
        e = dyn.exprs[n]
        for node in walk(e):
            if isinstance(node, IterVar) and node.is_reduce and node is not ax:
                if not any(node is r for r in comp.reduce_axes):
                    raise LanguageError(f"computation {comp.name}: bound {expr_str(e)} uses {node.name}")
            if isinstance(node, (Cmp, Logic, Not, Call)) and not node.dtype.is_int:
                raise LanguageError(f"computation {comp.name}: bound {expr_str(e)} of {ax.name} is not an integer")


def dyn_sources(e: Expr) -> list[IterVar]:
    """The iterators a dynamic parameter's expression depends on."""
    seen: dict[int, IterVar] = {}
    for n in walk(e):
        if isinstance(n, IterVar):
            seen.setdefault(id(n), n)
    return list(seen.values())


def maps_of(umap: isl.UnionMap) -> list[isl.Map]:
    ml = umap.get_map_list()
    return [ml.get_at(k) for k in range(ml.n_map())]


def sets_of(uset: isl.UnionSet) -> list[isl.Set]:
    sl = uset.get_set_list()
    return [sl.get_at(k) for k in range(sl.n_set())]
