"""Paired global stores: a short loop whose iterations store to adjacent elements two by two becomes
one 8-byte (or 4-byte) store per pair.

The tensor-core accumulators of ``mma.m16n8k16`` hold two adjacent columns per thread, so the
write-back of a fragment, one element per iteration, leaves every 32-byte sector of the output half
written by each store instruction. When, for every pair of iterations (2k, 2k+1), the second index is
the first plus one and the first is even (so the paired address is aligned, as the runtime's buffers
are), the pair becomes ``pt_store_pair(&buf[i], a, b)`` (16-bit buffers: both floats rounded and
stored as one 4-byte pair), under the guard both stores share. Where they are guarded differently
(the last columns of a partial tile), the pair is stored where both guards hold, and each element
under its own guard elsewhere. Anything else is left as it was.
"""

from __future__ import annotations

from dataclasses import replace

from ...intrinsics import instruction
from .. import loopir as ir
from .gpu_vectorize import aligned
from .simplify import simplify_expr

PAIRABLE = ("float32", "int32", "float16", "bfloat16")
MAX_EXTENT = 32


def inline_lets(s: ir.Stmt) -> tuple[ir.Expr | None, ir.Store] | None:
    """(guard or None, store) of a body made of lets, at most one guard without else, and a store;
    the lets substituted into both."""
    env: dict[str, ir.Expr] = {}
    cond: ir.Expr | None = None
    while True:
        if isinstance(s, ir.LetStmt):
            env[s.var.name] = ir.substitute(s.value, env)
            s = s.body
        elif isinstance(s, ir.If) and s.orelse is None and cond is None:
            cond = ir.substitute(s.cond, env)
            s = s.then
        elif isinstance(s, ir.Block) and len(s.body) == 1:
            s = s.body[0]
        else:
            break
    if not isinstance(s, ir.Store):
        return None
    store = ir.Store(s.buffer, tuple(ir.substitute(i, env) for i in s.index), ir.substitute(s.value, env))
    return cond, store


def even_extent(loop: ir.For) -> int | None:
    """The extent of ``loop`` when it runs from 0 over a constant, even number of iterations, at most
    ``MAX_EXTENT`` (an element loop whose stores go in pairs); else None."""
    ext = simplify_expr(loop.extent)
    if not (isinstance(ext, ir.Const) and ir.is_const(simplify_expr(loop.lo), 0)):
        return None
    n = int(ext.value)
    return n if n % 2 == 0 and 2 <= n <= MAX_EXTENT else None


def _pair(loop: ir.For) -> ir.Stmt | None:
    n = even_extent(loop)
    if n is None:
        return None
    parts = inline_lets(loop.body)
    if parts is None:
        return None
    _, store = parts
    if store.buffer.scope not in ("arg", "global") or store.buffer.dtype.name not in PAIRABLE:
        return None
    if len(store.index) != 1 or store.index[0].lanes > 1 or store.value.lanes > 1:
        return None
    out: list[ir.Stmt] = []
    for k in range(0, n, 2):
        (ca, sa), (cb, sb) = (inline_lets(ir.substitute(loop.body, {loop.var.name: ir.const(j)}))
                              for j in (k, k + 1))
        ia, ib = simplify_expr(sa.index[0]), simplify_expr(sb.index[0])
        step = simplify_expr(ir.BinOp("-", ib, ia))
        if not (isinstance(step, ir.Const) and int(step.value) == 1) or not aligned(ia, 2):
            return None
        ca, cb = (None if c is None else simplify_expr(c) for c in (ca, cb))
        call = ir.Call("pt_store_pair", (ir.Load(store.buffer, (ia,)), sa.value, sb.value), store.buffer.dtype)
        st: ir.Stmt = ir.Evaluate(call)
        if str(ca) == str(cb):
            out.append(st if ca is None else ir.If(ca, st))
            continue
        # the edge of a partial tile: the pair where both are inside, else each store under its own guard
        both = ca if cb is None else cb if ca is None else ir.Logic("&&", (ca, cb))
        alone = [x if c is None else ir.If(c, x) for c, x in ((ca, sa), (cb, sb))]
        out.append(ir.If(both, st, ir.block(alone)))
    return ir.block(out)


class _PairStores(ir.Mutator):
    def visit_For(self, s: ir.For) -> ir.Stmt:
        loop = replace(s, body=self.stmt(s.body))
        if loop.kind in ("serial", "unroll"):
            paired = _pair(loop)
            if paired is not None:
                return paired
        return loop


def pair_stores(s: ir.Stmt) -> ir.Stmt:
    """Pair the stores of short loops that write adjacent elements of a global buffer."""
    return _PairStores().stmt(s)


def _stores(name: str) -> bool:
    """Whether a call of ``name`` writes its first argument (a paired or packed store)."""
    ins = instruction(name)
    return name == "pt_store_pair" or (ins is not None and ins.stores)


def memory_accesses(body: ir.Stmt, scopes: tuple[str, ...] = ("arg", "global")) -> tuple[dict[str, ir.Buffer],
                                                                                      dict[str, ir.Buffer]]:
    """The buffers in `scopes` that `body` writes (stores and paired stores) and reads (loads other
    than a paired store's destination), by name."""
    written: dict[str, ir.Buffer] = {}
    destinations: set[int] = set()
    for st in ir.walk_stmt(body):
        if isinstance(st, ir.Evaluate) and _stores(st.call.name):
            destinations.add(id(st.call.args[0]))
            buf = st.call.args[0].buffer
        elif isinstance(st, ir.Store):
            buf = st.buffer
        else:
            continue
        if buf.scope in scopes:
            written.setdefault(buf.name, buf)
    read = {e.buffer.name: e.buffer for e in ir.all_exprs(body)
            if isinstance(e, ir.Load) and e.buffer.scope in scopes and id(e) not in destinations}
    return written, read
