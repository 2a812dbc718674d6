"""Realigned register loads (GPUs): a run of scalar copies into a thread's local buffer from adjacent
elements of a kernel argument whose alignment is not proven becomes one realigned load
(``realigned_load``: the aligned 16- or 8-byte chunks holding the run's first and last bytes, read
whole and shifted into place in registers by the run's misalignment, known only at run time).

A row of an odd number of 16-bit elements is only 2-byte aligned, so ``combine_loads`` leaves its
runs ``L[c + k] = B[base + k]`` (k = 0 … n − 1) as n loads of 2 bytes (the direct GEMV of GPT-2's
vocabulary, 50257 columns: eight ``LDG.U16`` per 16 bytes of B). Here such a run — n elements of 2
or 4 bytes making 16 or 8 bytes, ``c`` a multiple of n (local arrays are 16-byte aligned) — becomes
``L[ramp(c, 1, n)] = realign(B, base, size, count)``: two aligned vector loads (the second mostly
hits the first's cache lines: the neighbouring thread's chunk) and a few funnel shifts.

Chunks are read whole, so bytes outside the run are read too. That stays inside the allocation: the
launch checks that a tensor starts 16-byte aligned (``runtime.cuda.ALIGNMENT``) and allocations are
whole 16-byte granules, so the chunk holding any byte of a tensor lies inside its allocation; a
chunk past the tensor's last one is read as its last one (``size``: the tensor's elements). Only
arguments that the kernel does not write are read this way (the extra bytes are another thread's).

Zero-filling copies (``L[c + k] = cond_k ? B[base + k] : 0``, a whole tile's edge) are realigned
when each term of ``cond_k`` is the same for every k or is ``e + k < R``: lanes from
``count = min(R − e)`` on are zeros (0 lanes where a common term fails), which the chunks' clamping
needs — a lane past the tensor's end reads the wrong bytes and must be zeroed. Anything else is left
as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import loopir as ir
from .combine_loads import guard_terms, local_copy
from .gpu_vectorize import aligned
from .simplify import simplify_expr

REALIGN = {16: "pt_ldg_realign16", 8: "pt_ldg_realign8"}  # bytes of the run: the realigned load


def _written(s: ir.Stmt) -> set[str]:
    return {st.buffer.name for st in ir.walk_stmt(s) if isinstance(st, ir.Store)}


def _step(a: ir.Expr, b: ir.Expr) -> int | None:
    d = simplify_expr(ir.BinOp("-", b, a))
    return int(d.value) if isinstance(d, ir.Const) else None


def _count(guards: list[ir.Expr | None], n: int) -> ir.Expr | None:
    """The lanes a zero-filling run keeps (lanes from it on are zeros), from the guards of its n
    lanes; None where they are not of that form. A term the same in every lane must hold for any lane
    to be kept; the others are ``e + k < R`` in lane k. The first lanes may lack those (the
    simplifier dropped a bound it proved: lane 0 of a row that starts inside it) and are kept."""
    lanes = [guard_terms(g) if g is not None else [] for g in guards]
    texts = [[ir.expr_text(t) for t in terms] for terms in lanes]
    common = [t for t, x in zip(lanes[0], texts[0], strict=True) if all(x in other for other in texts)]
    shared = {ir.expr_text(t) for t in common}
    varying = [[t for t, x in zip(terms, xs, strict=True) if x not in shared] for terms, xs in zip(lanes, texts)]
    if any(len(v) != len(set(map(ir.expr_text, v))) for v in varying):
        return None
    first = next((k for k, v in enumerate(varying) if v), n)
    if any(not v for v in varying[first:]) or any(len(t) != len(shared) for t in texts[:first]):
        return None
    counts: list[ir.Expr] = []
    for j, t0 in enumerate(varying[first] if first < n else []):
        if not (isinstance(t0, ir.Cmp) and t0.op == "<"):
            return None
        for k in range(first + 1, n):
            if len(varying[k]) != len(varying[first]):
                return None
            tk = varying[k][j]
            if not (isinstance(tk, ir.Cmp) and tk.op == "<" and ir.expr_text(tk.b) == ir.expr_text(t0.b)
                    and _step(t0.a, tk.a) == k - first):
                return None
        counts.append(simplify_expr(ir.BinOp("+", ir.BinOp("-", t0.b, t0.a), ir.const(first))))
    count: ir.Expr = counts[0] if counts else ir.const(n)
    for c in counts[1:]:
        count = ir.BinOp("min", count, c)
    if 0 < first < n:
        count = ir.BinOp("max", count, ir.const(first))
    if common:
        cond = common[0] if len(common) == 1 else ir.Logic("&&", tuple(common))
        count = ir.Select(cond, count, ir.const(0))
    return count


@dataclass(frozen=True)
class _Copy:
    """A scalar copy ``dst[at] = [cond ?] src[index] [: 0]`` into a thread's local array (``at`` a
    constant) or into global memory."""

    dst: ir.Buffer
    at: ir.Expr
    src: ir.Buffer
    index: ir.Expr
    cond: ir.Expr | None


def _copy(s: ir.Stmt) -> _Copy | None:
    local = local_copy(s)
    if local is not None:
        return _Copy(local.local, ir.const(local.offset), local.src, local.index, local.cond)
    if not (isinstance(s, ir.Store) and s.buffer.scope == "global" and len(s.index) == 1 and s.index[0].lanes == 1):
        return None
    value, cond = s.value, None
    if isinstance(value, ir.Select) and ir.is_const(value.b, 0):
        value, cond = value.a, value.cond
    if not (isinstance(value, ir.Load) and value.lanes == 1 and len(value.index) == 1
            and value.buffer.dtype == s.buffer.dtype):
        return None
    return _Copy(s.buffer, s.index[0], value.buffer, value.index[0], cond)


def _run(stmts: tuple[ir.Stmt, ...], start: int, written: set[str]) -> tuple[int, ir.Stmt] | None:
    """The realigned load that replaces the copies from ``start`` on, and how many it replaces."""
    first = _copy(stmts[start])
    if first is None or first.src.scope != "arg" or first.src.name in written:
        return None
    itemsize = first.dst.dtype.itemsize
    if itemsize not in (2, 4):
        return None
    for nbytes, name in REALIGN.items():
        n = nbytes // itemsize
        if start + n > len(stmts) or not aligned(first.at, n):
            continue
        copies: list[_Copy] = [first]
        for k in range(1, n):
            c = _copy(stmts[start + k])
            if (c is None or c.dst is not first.dst or _step(first.at, c.at) != k or c.src is not first.src
                    or _step(first.index, c.index) != k):
                break
            copies.append(c)
        if len(copies) < n:
            continue
        count = _count([c.cond for c in copies], n)
        if count is None:
            continue
        size: ir.Expr = ir.const(1)
        for d in first.src.shape:
            size = ir.BinOp("*", size, d)
        value = ir.Call(name, (ir.Load(first.src, (ir.Ramp(first.index, ir.const(1), n),)), simplify_expr(size),
                               count), first.src.dtype)
        return n, ir.Store(first.dst, (ir.Ramp(first.at, ir.const(1), n),), value)
    return None


class _Realign(ir.Mutator):
    def __init__(self, written: set[str]):
        self.written = written

    def visit_Block(self, s: ir.Block) -> ir.Stmt:
        stmts = tuple(self.stmt(b) for b in s.body)
        out: list[ir.Stmt] = []
        i = 0
        while i < len(stmts):
            found = _run(stmts, i, self.written)
            if found is None:
                out.append(stmts[i])
                i += 1
                continue
            n, load = found
            out.append(load)
            i += n
        return ir.block(out)


def realign_loads(s: ir.Stmt) -> ir.Stmt:
    """Replace runs of adjacent scalar copies from arguments of unproven alignment by realigned loads."""
    return _Realign(_written(s)).stmt(s)
