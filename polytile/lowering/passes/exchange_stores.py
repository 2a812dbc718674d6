"""Whole-sector stores of 16-bit accumulator tiles: the lanes of a quad exchange their packed pairs so
that each stores 8 or 16 contiguous bytes.

The ``mma.m16n8`` accumulator layout (mma.sync's, and wgmma's per warp) gives the four lanes of a
quad (lane div 4: one row) two adjacent columns each of every 8-column tile: a row of a tile is 16
bytes of a 16-bit output, half a 32-byte sector, and the paired stores (``pair_stores``) leave every
sector half written by each instruction (measured slower than float32 results, whose pairs fill the
sector). Here the write-back loop over a warp's column tiles (``T``, the index 8 columns further per
step) around the loop over a tile's elements (``P``, pairs of adjacent columns: rows r and r + 8)
is regrouped by ``g`` = 4 (or 2) tiles: each lane packs its pairs into 32-bit words, the quad
transposes the g × g words of each row by ``g - 1`` butterfly exchanges (``__shfl_xor_sync``), and
lane r then holds 2g contiguous columns — tile ``r mod g`` of the group, the words of lanes
``r - r mod g`` to ``r - r mod g + g - 1`` — stored at once (16 or 8 bytes: ``st.global.v4/v2``).

Conditions, all proven on the IR: a 16-bit output of a kernel whose warps are whole rows of
threadIdx.x (blockDim.x a multiple of 32); the pair's index ``base + 2·(lane mod 4) + 8·T`` with the
lane only in ``lane div 4`` and ``lane mod 4``; ``base`` a multiple of 2g (the rows' alignment: an
odd row length keeps the pairs, or single elements); the values computed from registers only
(each lane computes its own before the exchange, outside the bounds guards); and nothing around the
loop that depends on the lane (every lane of the warp takes part in each exchange). The bounds
guards of partial tiles stay per element: a chunk wholly inside is one store, otherwise each word
(or half of it) under its own guard.
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import dtypes
from .. import loopir as ir
from .fragments import LANE
from .gpu_vectorize import aligned
from .pair_stores import even_extent, inline_lets
from .simplify import Simplifier, simplify_expr

HALVES = ("float16", "bfloat16")
U32 = dtypes.DType("uint32", "uint", 32)
PACK = {"float16": "pt_pack_f16x2", "bfloat16": "pt_pack_bf16x2"}
_ROW, _COL = ir.Var("pt_quad_row"), ir.Var("pt_quad_col")  # lane div 4, lane mod 4 while analysing


class _LaneAtoms(ir.Mutator):
    """``lane div 4`` and ``lane mod 4`` as the variables _ROW and _COL; ``other`` is set if the lane
    appears in any other form."""

    def __init__(self) -> None:
        self.other = False

    def visit_BinOp(self, e: ir.BinOp) -> ir.Expr:
        if e.op in ("div", "mod") and ir.is_const(e.b, 4) and _is_lane(e.a):
            return _ROW if e.op == "div" else _COL
        return self.default_expr(e)

    def visit_Var(self, e: ir.Var) -> ir.Expr:
        if e.name == "threadIdx.x":
            self.other = True
        return e


def _is_lane(e: ir.Expr) -> bool:
    e = ir.strip_casts(e)
    return isinstance(e, ir.Var) and e.name == "threadIdx.x"


def _quad_form(e: ir.Expr) -> ir.Expr | None:
    """``e`` with the lane as _ROW and _COL (None if the lane appears otherwise)."""
    m = _LaneAtoms()
    out = m.expr(e)
    return None if m.other else out


def _coefficient(e: ir.Expr, name: str) -> int | None:
    """The coefficient of variable ``name`` in integer expression ``e`` (None: not linear in it)."""
    coef = 0
    for c, atom in Simplifier().linear(simplify_expr(e)).terms.values():
        if isinstance(atom, ir.Var) and atom.name == name:
            coef += c
        elif ir.uses_var(atom, name):
            return None
    return coef


@dataclass
class _Pair:
    """One pair of the tile loop's body (T and the lane symbolic): guards and values per element."""

    index: ir.Expr  # of the first element, in quad form
    guards: tuple[ir.Expr | None, ir.Expr | None]  # in quad form
    values: tuple[ir.Expr, ir.Expr]  # as written (the lane as it is)


def _registers_only(e: ir.Expr) -> bool:
    return all(n.buffer.scope in ("local", "register") for n in ir.walk_expr(e) if isinstance(n, ir.Load)) and \
        not any(isinstance(n, ir.Call) for n in ir.walk_expr(e))


def _pairs(tiles: ir.For) -> tuple[ir.Buffer, list[_Pair]] | None:
    """The pairs the element loop inside ``tiles`` stores, if it is a fragment write-back we can regroup."""
    inner = tiles.body
    while isinstance(inner, ir.Block) and len(inner.body) == 1:
        inner = inner.body[0]
    if not isinstance(inner, ir.For) or inner.kind not in ("serial", "unroll"):
        return None
    n = even_extent(inner)
    if n is None:
        return None
    buf: ir.Buffer | None = None
    out: list[_Pair] = []
    for k in range(0, n, 2):
        parts = [inline_lets(ir.substitute(inner.body, {inner.var.name: ir.const(j)})) for j in (k, k + 1)]
        if any(p is None for p in parts):
            return None
        (ca, sa), (cb, sb) = parts  # type: ignore[misc]
        for s in (sa, sb):
            if len(s.index) != 1 or s.index[0].lanes > 1 or s.value.lanes > 1 or not _registers_only(s.value):
                return None
        if sa.buffer is not sb.buffer and sa.buffer.name != sb.buffer.name:
            return None
        buf = sa.buffer
        if buf.scope not in ("arg", "global") or buf.dtype.name not in HALVES:
            return None
        ia, ib = simplify_expr(sa.index[0]), simplify_expr(sb.index[0])
        step = simplify_expr(ir.BinOp("-", ib, ia))
        if not (isinstance(step, ir.Const) and int(step.value) == 1):
            return None
        quad = [_quad_form(x) for x in (ia, ca, cb)]
        if quad[0] is None or (ca is not None and quad[1] is None) or (cb is not None and quad[2] is None):
            return None
        if _coefficient(quad[0], _COL.name) != 2 or _coefficient(quad[0], tiles.var.name) != 8:
            return None
        out.append(_Pair(quad[0], (quad[1], quad[2]), (sa.value, sb.value)))  # type: ignore[arg-type]
    assert buf is not None
    return buf, out


def _group(tiles: ir.For, pairs: list[_Pair]) -> tuple[int, int] | None:
    """Tiles per exchange, 4 (16-byte stores) or 2 (8 bytes), as the alignment allows, and how many
    tiles are exchanged: all of them; rounded up to whole groups where the registers hold the extra
    tiles (they are read and store nothing: ``_regroup`` guards them); else the whole groups, the
    rest left to the loop as it was."""
    ext = simplify_expr(tiles.extent)
    if not (isinstance(ext, ir.Const) and ir.is_const(simplify_expr(tiles.lo), 0)):
        return None
    count = int(ext.value)
    sizes = [g for g in (4, 2) if count >= g and all(aligned(simplify_expr(ir.substitute(
        p.index, {_COL.name: ir.const(0), tiles.var.name: ir.const(0)})), 2 * g) for p in pairs)]
    for g in sizes:
        up = -(-count // g) * g
        if up == count or _registers_hold(tiles, pairs, up):
            return g, up
    return (sizes[0], count // sizes[0] * sizes[0]) if sizes else None


def _registers_hold(tiles: ir.For, pairs: list[_Pair], count: int) -> bool:
    """Whether the values' register loads stay inside their buffers for ``count`` tiles."""
    for pair in pairs:
        for value in pair.values:
            for ld in ir.walk_expr(value):
                if not isinstance(ld, ir.Load):
                    continue
                for i, d in zip(ld.index, ld.buffer.shape, strict=True):
                    try:
                        ends = [ir.eval_int(i, {tiles.var.name: t}) for t in (0, count - 1)]
                    except (KeyError, ValueError):
                        return False
                    if not isinstance(d, ir.Const) or min(ends) < 0 or max(ends) >= int(d.value):
                        return False
    return True


def _lane_bit(m: int) -> ir.Expr:
    """Whether bit ``m`` of the lane is set."""
    return ir.Cmp("!=", simplify_expr(ir.BinOp("mod", ir.BinOp("div", LANE, ir.const(m)), ir.const(2))), ir.const(0))


def _same(a: ir.Expr | None, b: ir.Expr | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and ir.expr_text(a) == ir.expr_text(b))


def _all(conds: list[ir.Expr | None]) -> ir.Expr | None:
    """The conjunction of ``conds`` (None: true), each condition once."""
    seen: dict[str, ir.Expr] = {}
    todo = [c for c in conds if c is not None]
    while todo:
        c = todo.pop(0)
        if isinstance(c, ir.Logic) and c.op == "&&":
            todo[:0] = c.args
        else:
            seen.setdefault(ir.expr_text(c), c)
    if not seen:
        return None
    return next(iter(seen.values())) if len(seen) == 1 else ir.Logic("&&", tuple(seen.values()))


def _regroup(tiles: ir.For, buf: ir.Buffer, pairs: list[_Pair], g: int, whole: int) -> ir.Stmt:
    group = ir.Var(f"{tiles.var.name}_g")
    count = int(simplify_expr(tiles.extent).value)  # type: ignore[attr-defined]
    if whole > count:  # the added tiles store nothing
        inside = ir.Cmp("<", tiles.var, ir.const(count))
        pairs = [_Pair(p.index, tuple(inside if c is None else ir.Logic("&&", (c, inside)) for c in p.guards),
                       p.values) for p in pairs]  # type: ignore[misc]
    first = ir.BinOp("*", group, ir.const(g))
    col = ir.BinOp("mod", LANE, ir.const(4))
    mine = ir.BinOp("mod", LANE, ir.const(g))  # the tile of the group this lane stores
    lanes0 = ir.BinOp("-", col, mine)  # the first lane whose words it stores
    lets: list[tuple[ir.Var, ir.Expr]] = []
    stores: list[ir.Stmt] = []
    back = {_ROW.name: ir.BinOp("div", LANE, ir.const(4))}
    for p, pair in enumerate(pairs):
        words: list[ir.Expr] = []
        for t in range(g):
            at = {tiles.var.name: ir.BinOp("+", first, ir.const(t))}
            a, b = (simplify_expr(_unrounded(ir.substitute(v, at), buf.dtype)) for v in pair.values)  # type: ignore[arg-type]
            w = ir.Var(f"{buf.name}_w{p}_{t}", U32)
            lets.append((w, ir.Call(PACK[buf.dtype.name], (a, b), U32)))
            words.append(w)
        m, stage = g // 2, 0
        while m:  # butterfly: bit m of the lane picks which half of each pair of slots it keeps
            bit = _lane_bit(m)
            nxt = list(words)
            for k0 in range(g):
                if k0 & m:
                    continue
                k1 = k0 | m
                sent = ir.Var(f"{buf.name}_s{p}_{stage}_{k0}", U32)
                got = ir.Var(f"{buf.name}_r{p}_{stage}_{k0}", U32)
                lets.append((sent, ir.Select(bit, words[k0], words[k1])))
                lets.append((got, ir.Call("pt_shfl_xor", (sent, ir.const(m, dtypes.int32)), U32)))
                nxt[k0] = ir.Select(bit, got, words[k0])
                nxt[k1] = ir.Select(bit, words[k1], got)
            for k in range(g):
                v = ir.Var(f"{buf.name}_v{p}_{stage}_{k}", U32)
                lets.append((v, nxt[k]))
                nxt[k] = v
            words, m, stage = nxt, m // 2, stage + 1
        # slot k: the pair of lane (lanes0 + k) in tile (first + mine)
        slot = [{**back, tiles.var.name: ir.BinOp("+", first, mine), _COL.name: ir.BinOp("+", lanes0, ir.const(k))}
                for k in range(g)]
        index = simplify_expr(ir.substitute(pair.index, slot[0]))  # type: ignore[arg-type]
        guards = [tuple(None if c is None else simplify_expr(ir.substitute(c, slot[k]))  # type: ignore[arg-type]
                        for c in pair.guards) for k in range(g)]
        vector = ir.Evaluate(ir.Call("pt_store_packed", (ir.Load(buf, (index,)), *words), dtypes.int32))
        every = _all([c for gk in guards for c in gk])
        if every is None:
            stores.append(vector)
            continue
        edge: list[ir.Stmt] = []
        for k, (ca, cb) in enumerate(guards):
            at = ir.Load(buf, (simplify_expr(ir.BinOp("+", index, ir.const(2 * k))),))
            word = ir.Evaluate(ir.Call("pt_store_packed", (at, words[k]), dtypes.int32))
            halves = [ir.Evaluate(ir.Call("pt_store_packed_half", (
                ir.Load(buf, (simplify_expr(ir.BinOp("+", index, ir.const(2 * k + h))),)), words[k],
                ir.const(h, dtypes.int32)), dtypes.int32)) for h in (0, 1)]
            if _same(ca, cb):
                edge.append(word if ca is None else ir.If(ca, word))
                continue
            both = _all([ca, cb])
            alone = [x if c is None else ir.If(c, x) for c, x in zip((ca, cb), halves, strict=True)]
            edge.append(ir.If(both, word, ir.block(alone)))  # type: ignore[arg-type]
        stores.append(ir.If(every, vector, ir.block(edge)))
    body: ir.Stmt = ir.block(stores)
    for var, value in reversed(lets):  # registers, declared in one scope
        body = ir.Declare(var, value, body)
    exchanged = ir.For(group, ir.const(0), ir.const(whole // g), body, tiles.kind)
    if whole >= count:
        return exchanged
    return ir.block([exchanged, ir.For(tiles.var, ir.const(whole), ir.const(count - whole), tiles.body, tiles.kind)])


def _unrounded(value: ir.Expr, dtype: dtypes.DType) -> ir.Expr:
    """The value without its rounding to the 16-bit output type: packing rounds it (once)."""
    if isinstance(value, ir.Cast) and value.dtype == dtype:
        return value.a
    return value


class _Exchange(ir.Mutator):
    def __init__(self) -> None:
        self.warps = False  # inside a kernel whose warps are 32 consecutive threadIdx.x
        self.divergent = 0  # depth of enclosing statements whose path depends on the lane
        self.lane_vars: set[str] = set()  # lets whose value depends on the lane

    def _lane_dependent(self, *es: ir.Expr) -> bool:
        return any(isinstance(n, ir.Var) and (n.name == "threadIdx.x" or n.name in self.lane_vars)
                   for e in es for n in ir.walk_expr(e))

    def visit_Kernel(self, s: ir.Kernel) -> ir.Stmt:
        saved, self.warps = self.warps, s.block[0] % 32 == 0
        try:
            return self.default_stmt(s)
        finally:
            self.warps = saved

    def visit_If(self, s: ir.If) -> ir.Stmt:
        lane = self._lane_dependent(s.cond)
        self.divergent += lane
        try:
            return self.default_stmt(s)
        finally:
            self.divergent -= lane

    def visit_LetStmt(self, s: ir.LetStmt) -> ir.Stmt:
        if self._lane_dependent(s.value):
            self.lane_vars.add(s.var.name)
        return self.default_stmt(s)

    def visit_For(self, s: ir.For) -> ir.Stmt:
        if self.warps and not self.divergent and s.kind in ("serial", "unroll") and \
                not self._lane_dependent(s.lo, s.extent):
            found = _pairs(s)
            if found is not None:
                grouping = _group(s, found[1])
                if grouping is not None:
                    return _regroup(s, found[0], found[1], *grouping)
        lane = self._lane_dependent(s.lo, s.extent) or s.kind == "threadIdx.x"
        self.divergent += lane
        try:
            return self.default_stmt(s)
        finally:
            self.divergent -= lane


def exchange_stores(s: ir.Stmt) -> ir.Stmt:
    """Regroup the write-backs of 16-bit accumulator tiles into whole-sector stores (see the module)."""
    return _Exchange().stmt(s)
