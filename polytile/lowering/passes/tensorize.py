"""Tensor cores: the loop nests tagged with a tensor intrinsic (``polytile.intrinsics``) become its
instructions. ``mma_m16n8k16`` nests become ``mma.sync.m16n8k16`` instructions whose operands are
loaded from shared memory with ``ldmatrix`` (B transposed when stored [k][n], as it is when stored
[n][k]: a linear layer's weight; A as it is when stored [m][k], transposed when stored [k][m]: a GEMV's
weight as the instruction's 16 rows, ``gpu_schedules.gemv_mma``).

Within the two loops around a nest (the warp's tiles along m and n), the operand fragments are
loaded once per tile row and per tile column into registers and reused by every product:
``for mi: ldmatrix A; for nj: ldmatrix B; for mi, nj: mma``. The fragments are named after their
shared tiles (``A_shared_frag``) so that the pipeline pass can double-buffer them across the loop
around (the register level of ALCOP's multi-level pipeline).

Loops at the edges of the tensors are run over their full range: the operand tiles are whole tiles
with zeros past the tensors' ends, so the extra products add zeros, and the write-back of the
accumulator tests the bounds.

Nests tagged for Hopper's warpgroup MMA (``wgmma_m64nNk16``, a warpgroup intrinsic) go through the same walk — full
ranges, the loops around the nest — and become ``wgmma`` instructions (passes/wgmma.py); the walk
also keeps whole warpgroups together (no guard on a warp's rows around such a nest, warp loops
rounded up to four warps).
"""

from __future__ import annotations

from dataclasses import replace

from ... import dtypes
from ...errors import LoweringError
from ...intrinsics import tensor_intrinsic
from .. import loopir as ir
from .nest import parse_nest
from .simplify import Simplifier, simplify_expr
from .wgmma import WgmmaNest, warpgroup_mma, wgmma_group

U32 = dtypes.DType("uint32", "uint", 32)


def _coefficient(e: ir.Expr, var: str) -> int | None:
    """The coefficient of ``var`` in the linear integer expression ``e`` (None if not linear)."""
    lin = Simplifier().linear(simplify_expr(e))
    coef = 0
    for _, (c, atom) in lin.terms.items():
        if isinstance(atom, ir.Var) and atom.name == var:
            coef += c
        elif any(isinstance(n, ir.Var) and n.name == var for n in ir.walk_expr(atom)):
            return None
    return coef


def _at_origin(e: ir.Expr, names: list[str]) -> ir.Expr:
    return simplify_expr(ir.substitute(e, {n: ir.const(0) for n in names}))  # type: ignore[arg-type]



class _Nest:
    """One (16, 8, 16) nest: the accumulator tile, the operand tiles and their row strides."""

    def __init__(self, loop: ir.For):
        parts = parse_nest(loop)
        names, st, a, b = parts.names, parts.store, parts.a, parts.b
        for op in (a, b):
            if op.buffer.scope != "shared":
                raise LoweringError(f"tensor-core operand {op.buffer.name} must be in shared memory (ldmatrix reads "
                                    "shared memory); cache it with loc='shared'")
        iv, jv, kv = names
        # A is the operand read along the nest's rows (m): stored [m][k] (k contiguous), or [k][m] (m
        # contiguous: a GEMV's weight [k][j] streamed as the 16-row operand, its columns the rows of the
        # instruction; loaded transposed); B along (k, n)
        if not any(ir.uses_var(x, iv) for x in a.index):
            a, b = b, a
        self.a_m_major = _coefficient(a.index[-1], iv) == 1 and _coefficient(a.index[-2], kv) == 1
        if not self.a_m_major and (_coefficient(a.index[-1], kv) != 1 or _coefficient(a.index[-2], iv) != 1):
            raise LoweringError(f"operand {a.buffer.name} must be stored with k or m contiguous (layout [m][k] or "
                                "[k][m])")
        # B stored [k][n] (n contiguous) is loaded transposed; [n][k] (k contiguous: a transposed
        # weight) as it is, like A
        self.b_k_major = _coefficient(b.index[-1], kv) == 1 and _coefficient(b.index[-2], jv) == 1
        if not self.b_k_major and (_coefficient(b.index[-1], jv) != 1 or _coefficient(b.index[-2], kv) != 1):
            raise LoweringError(f"operand {b.buffer.name} must be stored with n or k contiguous (layout [k][n] or "
                                "[n][k])")
        self.dtype = a.buffer.dtype
        self.names = names
        self.accesses = [ir.Load(st.buffer, st.index), a, b]  # over the whole nest
        self.acc = ir.Load(st.buffer, tuple(_at_origin(x, names) for x in st.index))
        self.a = ir.Load(a.buffer, tuple(_at_origin(x, names) for x in a.index))
        self.b = ir.Load(b.buffer, tuple(_at_origin(x, names) for x in b.index))
        self.lda = a.buffer.shape[-1]
        self.ldb = b.buffer.shape[-1]
        intrinsic = tensor_intrinsic(loop.kind)
        assert intrinsic is not None
        self.instruction = intrinsic.product(self.dtype.name).name


def full_range(loop: ir.For, bounds: dict[str, tuple[float, float]]) -> ir.For | None:
    """``loop`` over its full constant range (None if it has none): at the edges of the tensors the
    extra iterations compute on the zeros that whole-tile copies put past the tensors' ends."""
    simp = Simplifier()
    simp.bounds = dict(bounds)
    lo = simplify_expr(loop.lo)
    hi = simp.interval(simplify_expr(loop.extent))[1]
    if not isinstance(lo, ir.Const) or hi == float("inf"):
        return None
    return replace(loop, lo=lo, extent=ir.const(int(hi)))


def loop_span(loop: ir.For, bounds: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """The range of ``loop``'s variable, within the enclosing loops' ranges ``bounds``."""
    simp = Simplifier()
    simp.bounds = dict(bounds)
    lo, ext = simp.interval(simplify_expr(loop.lo)), simp.interval(simplify_expr(loop.extent))
    return lo[0], lo[1] + ext[1] - 1


def _fits(nests: list[_Nest], bounds: dict[str, tuple[float, float]]) -> bool:
    """Whether every access of the nests stays inside its buffer for the loop ranges in ``bounds``
    (the nests' own loops over their whole 16 × 8 × 16 tile)."""
    simp = Simplifier()
    for nest in nests:
        simp.bounds = {**bounds, **dict(zip(nest.names, [(0, 15), (0, 7), (0, 15)]))}
        for ld in nest.accesses:
            for i, d in zip(ld.index, ld.buffer.shape):
                hi = simp.interval(simplify_expr(i))[1]
                if not isinstance(d, ir.Const) or hi > int(d.value) - 1:
                    return False
    return True



def _nests(s: ir.Stmt) -> list[ir.For]:
    return [x for x in ir.walk_stmt(s) if isinstance(x, ir.For) and tensor_intrinsic(x.kind) is not None]


def _warpgroup(s: ir.Stmt) -> bool:
    """Whether ``s`` is a nest tensorized with an intrinsic that four warps issue together (wgmma)."""
    return isinstance(s, ir.For) and getattr(tensor_intrinsic(s.kind), "warpgroup", False)


def _per_warp(s: ir.Stmt) -> bool:
    """Whether ``s`` is a nest tensorized with an intrinsic each warp issues on its fragments (mma.sync)."""
    return isinstance(s, ir.For) and tensor_intrinsic(s.kind) is not None and not _warpgroup(s)


def _inside_nest(st: ir.Stmt, root: ir.Stmt) -> bool:
    """Whether statement ``st`` lies inside a tensorized nest of ``root``."""
    return any(st is x for n in _nests(root) for x in ir.walk_stmt(n))


def _make_nest(loop: ir.For) -> _Nest | WgmmaNest:
    return WgmmaNest(loop) if _warpgroup(loop) else _Nest(loop)


class _Tensorize(ir.Mutator):
    def __init__(self) -> None:
        self.shared: list[str] = []  # buffers whose scope we are in (the operands' whole tiles)
        self.bounds: dict[str, tuple[float, float]] = {}  # ranges of the enclosing loops
        self.threads: dict[str, ir.For] = {}  # the enclosing thread-bound loops, by tag
        self.grouped = False  # inside the loop whose wgmma instructions form one asynchronous group

    def visit_Allocate(self, s: ir.Allocate) -> ir.Stmt:
        self.shared.append(s.buffer.name)
        try:
            return ir.Allocate(s.buffer, self.stmt(s.body))
        finally:
            self.shared.pop()

    def visit_If(self, s: ir.If) -> ir.Stmt:
        # a guard around wgmma nests only (the rows or columns of a partial tile: isl cuts the
        # domain per warp) would leave part of a warpgroup out of its collective instruction; the
        # instruction computes whole zero-filled tiles and the write-back has its own guard
        if s.orelse is None and any(_warpgroup(n) for n in _nests(s.then)) and all(
                _inside_nest(st, s.then) for st in ir.walk_stmt(s.then) if isinstance(st, ir.Store)):
            return self.stmt(s.then)
        return self.default_stmt(s)

    def visit_For(self, s: ir.For) -> ir.Stmt:
        nests = [_make_nest(n) for n in _nests(s)] if tensor_intrinsic(s.kind) is None else []
        inside = bool(nests) and all(
            n.accesses[1].buffer.name in self.shared and n.accesses[2].buffer.name in self.shared for n in nests)
        # the outermost loop inside the operands' tiles holding wgmma nests: its instructions are
        # one asynchronous group, waited for at its end
        group = inside and not self.grouped and s.kind in ("serial", "unroll") and any(
            isinstance(n, WgmmaNest) for n in nests)
        if group:
            self.grouped = True
        try:
            out = self._visit_for(s, nests, inside)
        finally:
            if group:
                self.grouped = False
        return wgmma_group(out) if group else out

    def _visit_for(self, s: ir.For, nests: list[_Nest | WgmmaNest], inside: bool) -> ir.Stmt:
        if nests and s.kind in ("serial", "unroll") and inside:
            # a loop between the operands' whole tiles and the nest (the K steps inside a tile): its
            # full range keeps its trip count constant, where the buffers hold it
            full = full_range(s, self.bounds)
            if full is not None and full is not s and _fits(nests, {**self.bounds, full.var.name: loop_span(
                    full, self.bounds), **self._inner_spans(full)}):
                return self._nonempty(s, self._visit_loop(full, nests))
        return self._visit_loop(s, nests)

    def _visit_loop(self, s: ir.For, nests: list[_Nest | WgmmaNest]) -> ir.Stmt:
        if s.kind == "threadIdx.z" and isinstance(s.extent, ir.Const) and int(s.extent.value) % 4 and \
                ir.is_const(simplify_expr(s.lo), 0) and any(isinstance(n, WgmmaNest) for n in nests):
            # a block tile taller than the matrix has fewer warps than whole warpgroups: the missing
            # warps join (their rows are past the end: zeros in, nothing written back)
            ext = -(-int(s.extent.value) // 4) * 4
            bounds = s.bounds
            if bounds is not None:
                hi = simplify_expr(bounds[1])
                if not (ir.is_const(simplify_expr(bounds[0]), 0) and isinstance(hi, ir.Const)):
                    raise LoweringError(f"loop {s.var.name} over the warps (threadIdx.z) has {s.extent} iterations "
                                        "in some blocks; wgmma needs whole warpgroups: make the block tile a "
                                        "multiple of 64 rows that the matrix fills")
                bounds = (bounds[0], ir.const(max(int(hi.value), ext - 1)))
            s = replace(s, extent=ir.const(ext), bounds=bounds)
        self.bounds[s.var.name] = loop_span(s, self.bounds)
        if s.kind.startswith("threadIdx"):
            self.threads[s.kind] = s
        try:
            inner = ir.unguard(s.body)
            if _warpgroup(inner):  # the warp's column tiles and the nest
                return self.wgmma(WgmmaNest(inner), s)  # type: ignore[arg-type]
            if _warpgroup(s):
                return self.wgmma(WgmmaNest(s), None)
            # two loops (tile rows, tile columns) around a tensorized nest: share the fragments
            if isinstance(inner, ir.For) and _per_warp(ir.unguard(inner.body)):
                nest = _Nest(ir.unguard(inner.body))  # type: ignore[arg-type]
                mi, nj = s.var.name, inner.var.name
                if not any(ir.uses_var(x, mi) for x in nest.b.index) and \
                        not any(ir.uses_var(x, nj) for x in nest.a.index):
                    return self.shared_fragments(s, inner, nest)
            if _per_warp(s):
                return self.single(_Nest(s))
            return self.default_stmt(s)
        finally:
            del self.bounds[s.var.name]
            if s.kind.startswith("threadIdx"):
                del self.threads[s.kind]

    def wgmma(self, nest: WgmmaNest, tiles: ir.For | None) -> ir.Stmt:
        original = tiles
        if tiles is not None:
            full = full_range(tiles, self.bounds)
            if full is None:
                raise LoweringError(f"loop {tiles.var.name} around a wgmma nest needs a bounded range")
            tiles = full
        others = [t for k, t in self.threads.items() if k != "threadIdx.z"]
        call = warpgroup_mma(nest, tiles, self.threads.get("threadIdx.z"), others, self.bounds)
        call = call if self.grouped else wgmma_group(call)
        return self._nonempty(original, call) if original is not None else call

    def _nonempty(self, loop: ir.For, full: ir.Stmt) -> ir.Stmt:
        """``full`` (``loop`` run over its full range) where ``loop`` has iterations at all. The extra
        iterations of a partial tile compute on the zeros its whole-tile copy put past the tensors'
        ends; a tile with none in range (the last channel chunk of a split reduction, shorter than the
        others, in a K loop fused with the taps) was never copied — its buffers hold the previous
        tile's data —, so its products are skipped, as its empty loop skipped them."""
        simp = Simplifier()
        simp.bounds = dict(self.bounds)
        extent = simplify_expr(loop.extent)
        if simp.interval(extent)[0] >= 1 or any(ir.uses_var(extent, t.var.name) for t in self.threads.values()):
            return full  # (a guard on a thread's loop would split a warp's collective instruction)
        return ir.If(ir.Cmp(">", extent, ir.const(0)), full)

    def _inner_spans(self, loop: ir.For) -> dict[str, tuple[float, float]]:
        """Ranges of the loops inside ``loop`` down to the nests, at their largest."""
        out: dict[str, tuple[float, float]] = {}
        for x in ir.walk_stmt(loop.body):
            if isinstance(x, ir.For) and tensor_intrinsic(x.kind) is None:
                full = full_range(x, self.bounds)
                out[x.var.name] = loop_span(full if full is not None else x, {**self.bounds, **out})
        return out

    @staticmethod
    def _buffers(nest: _Nest, rows: ir.Expr, cols: ir.Expr) -> tuple[ir.Buffer, ir.Buffer]:
        """Operand fragments, named after the shared tiles they are loaded from (``A_shared_frag``):
        ``pipeline`` may double-buffer them (the register level)."""
        afrag = ir.Buffer(f"{nest.a.buffer.name}_frag", U32, (rows, ir.const(4)), "local")
        bfrag = ir.Buffer(f"{nest.b.buffer.name}_frag", U32, (cols, ir.const(2)), "local")
        return afrag, bfrag

    def single(self, nest: _Nest) -> ir.Stmt:
        afrag, bfrag = self._buffers(nest, ir.const(1), ir.const(1))
        zero = (ir.const(0), ir.const(0))
        body = ir.block([
            ir.call_stmt(_load_a(nest), ir.Load(afrag, zero), nest.a, nest.lda),
            ir.call_stmt(_load_b(nest, 1), ir.Load(bfrag, zero), nest.b, nest.ldb),
            ir.call_stmt(nest.instruction, nest.acc, ir.Load(afrag, zero), ir.Load(bfrag, zero)),
        ])
        return ir.Allocate(afrag, ir.Allocate(bfrag, body))

    def shared_fragments(self, outer: ir.For, inner: ir.For, nest: _Nest) -> ir.Stmt:
        # the tile loops over their full constant range where the buffers hold it (registers indexed
        # by constants); otherwise they keep their bounds and the fragments are sized for the most
        full_o, full_i = full_range(outer, self.bounds), full_range(inner, self.bounds)
        if full_o is None or full_i is None:
            raise LoweringError(f"loops {outer.var.name}, {inner.var.name} around a tensorized nest need a bounded "
                                "range")
        spans = {**self.bounds, outer.var.name: loop_span(full_o, self.bounds),
                 inner.var.name: loop_span(full_i, self.bounds)}
        if _fits([nest], spans) and isinstance(simplify_expr(outer.lo), ir.Const) and \
                isinstance(simplify_expr(inner.lo), ir.Const):
            outer, inner = full_o, full_i
        sizes = (full_o.extent, full_i.extent)
        mi, nj = outer.var, inner.var
        afrag, bfrag = self._buffers(nest, *sizes)
        a_rel = ir.BinOp("-", mi, outer.lo)
        b_rel = ir.BinOp("-", nj, inner.lo)
        load_a = replace(outer, kind="unroll", body=ir.call_stmt(
            _load_a(nest), ir.Load(afrag, (a_rel, ir.const(0))), nest.a, nest.lda))
        ext = int(inner.extent.value) if isinstance(inner.extent, ir.Const) else 1
        if ext % 2 == 0:  # two column tiles per ldmatrix (x4): half the shared-memory instructions
            pair = ir.Var(f"{nj.name}_pair")
            col = ir.BinOp("+", inner.lo, ir.BinOp("*", pair, ir.const(2)))
            load_b = ir.For(pair, ir.const(0), ir.const(ext // 2), ir.call_stmt(
                _load_b(nest, 2), ir.Load(bfrag, (ir.BinOp("*", pair, ir.const(2)), ir.const(0))),
                ir.substitute(nest.b, {nj.name: col}), nest.ldb), "unroll")  # type: ignore[arg-type]
        else:
            load_b = replace(inner, kind="unroll", body=ir.call_stmt(
                _load_b(nest, 1), ir.Load(bfrag, (b_rel, ir.const(0))), nest.b, nest.ldb))
        mma = ir.call_stmt(nest.instruction, nest.acc, ir.Load(afrag, (a_rel, ir.const(0))),
                           ir.Load(bfrag, (b_rel, ir.const(0))))
        products = replace(outer, body=replace(inner, body=mma, kind="unroll"), kind="unroll")
        return ir.Allocate(afrag, ir.Allocate(bfrag, ir.block([load_a, load_b, products])))


def _load_a(nest: _Nest) -> str:
    """The ldmatrix that loads a 16×16 tile of A's fragments: as stored from [m][k], transposed from [k][m]."""
    return "pt_ldmatrix_a_trans" if nest.a_m_major else "pt_ldmatrix_a"


def _load_b(nest: _Nest, tiles: int) -> str:
    """The ldmatrix that loads ``tiles`` (1 or 2) adjacent 16×8 tiles of B's fragments: transposed
    from [k][n], as stored from [n][k]."""
    name = "pt_ldmatrix_b" if nest.b_k_major else "pt_ldmatrix_b_trans"
    return name + ("_x4" if tiles == 2 else "")


def tensorize_nests(s: ir.Stmt) -> ir.Stmt:
    """Replace every tensorized nest by ldmatrix loads and mma instructions."""
    return _Tensorize().stmt(s)
