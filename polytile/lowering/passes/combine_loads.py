"""Combined register loads (GPUs): a run of scalar copies into a thread's local buffer from adjacent
elements of a tensor or a shared tile becomes one 4-, 8- or 16-byte vector copy.

After unrolling, a thread's cache of ``vec`` adjacent columns (``cache_identity(B, ..., loc="local")``)
is a run of statements ``L[c + k] = B[base + k]``, k = 0 … n − 1, each a load instruction of 2 or 4
bytes. When ``c`` and ``base`` are provably multiples of n (buffers start 16-byte aligned:
``runtime.cuda.ALIGNMENT``, local arrays are declared 16-byte aligned), the run becomes
``L[ramp(c, 1, n)] = B[ramp(base, 1, n)]``: one ``LDG.128``/``LDS.64`` where there were n loads (a
GEMV of 16-bit weights read four times fewer load instructions per element of B). The local buffer
then stays an array (its elements are read one by one at constant offsets, which nvcc keeps in
registers). A zero-filling copy (``L[c + k] = cond_k ? B[base + k] : 0``, a whole tile's edge) is
combined when its guard holds for all n elements or for none: every term of ``cond_k`` is the same
for all k, or is ``e + k < R`` with ``e`` a multiple of n and R a constant multiple of n (a column
bound that does not cut a vector). Anything else — other guards, gaps, unproven alignment — is left
as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import loopir as ir
from .gpu_vectorize import aligned
from .simplify import simplify_expr

VECTOR_BYTES = (16, 8, 4)
SOURCES = ("arg", "global", "shared")


@dataclass(frozen=True)
class LocalCopy:
    local: ir.Buffer
    offset: int
    src: ir.Buffer
    index: ir.Expr
    cond: ir.Expr | None  # a zero-filling copy's guard


def local_copy(s: ir.Stmt) -> LocalCopy | None:
    """The scalar copy into a local buffer that ``s`` is (plain or zero-filling), or None."""
    if not (isinstance(s, ir.Store) and s.buffer.scope == "local"):
        return None
    value, cond = s.value, None
    if isinstance(value, ir.Select) and ir.is_const(value.b, 0):
        value, cond = value.a, value.cond
    if not isinstance(value, ir.Load):
        return None
    (idx,) = s.index
    if not (isinstance(idx, ir.Const) and idx.lanes == 1 and value.lanes == 1 and len(value.index) == 1):
        return None
    if value.buffer.scope not in SOURCES or value.buffer.dtype != s.buffer.dtype:
        return None
    return LocalCopy(s.buffer, int(idx.value), value.buffer, value.index[0], cond)


def guard_terms(cond: ir.Expr) -> list[ir.Expr]:
    if isinstance(cond, ir.Logic) and cond.op == "&&":
        return [t for a in cond.args for t in guard_terms(a)]
    return [cond]


def _same_for_the_vector(first: ir.Expr | None, other: ir.Expr | None, k: int, n: int) -> bool:
    """Whether guard ``other`` of lane k holds exactly where guard ``first`` of lane 0 does, for
    vectors of n lanes starting at multiples of n."""
    if first is None or other is None:
        return first is None and other is None
    a, b = guard_terms(first), guard_terms(other)
    if len(a) != len(b):
        return False
    for t0, tk in zip(a, b, strict=True):
        if ir.expr_text(t0) == ir.expr_text(tk):
            continue
        if not (isinstance(t0, ir.Cmp) and isinstance(tk, ir.Cmp) and t0.op == tk.op == "<"
                and isinstance(t0.b, ir.Const) and ir.expr_text(t0.b) == ir.expr_text(tk.b)
                and int(t0.b.value) % n == 0 and aligned(t0.a, n)):
            return False
        step = simplify_expr(ir.BinOp("-", tk.a, t0.a))
        if not (isinstance(step, ir.Const) and int(step.value) == k):
            return False
    return True


def _run(stmts: tuple[ir.Stmt, ...], start: int) -> int:
    """The most copies from ``start`` on that form one aligned vector copy (1: none)."""
    first = local_copy(stmts[start])
    if first is None:
        return 1
    for nbytes in VECTOR_BYTES:
        n = nbytes // first.local.dtype.itemsize
        if n < 2 or start + n > len(stmts) or first.offset % n or not aligned(first.index, n):
            continue
        ok = True
        for k in range(1, n):
            c = local_copy(stmts[start + k])
            if (c is None or c.local is not first.local or c.offset != first.offset + k or c.src is not first.src
                    or not _same_for_the_vector(first.cond, c.cond, k, n)):
                ok = False
                break
            step = simplify_expr(ir.BinOp("-", c.index, first.index))
            if not (isinstance(step, ir.Const) and int(step.value) == k):
                ok = False
                break
        if ok:
            return n
    return 1


class _Combine(ir.Mutator):
    def visit_Block(self, s: ir.Block) -> ir.Stmt:
        stmts = tuple(self.stmt(b) for b in s.body)
        out: list[ir.Stmt] = []
        i = 0
        while i < len(stmts):
            n = _run(stmts, i)
            if n == 1:
                out.append(stmts[i])
                i += 1
                continue
            c = local_copy(stmts[i])
            assert c is not None
            value: ir.Expr = ir.Load(c.src, (ir.Ramp(c.index, ir.const(1), n),))
            if c.cond is not None:  # all lanes or none: the codegen tests lane 0
                zero = ir.Const(0.0 if c.src.dtype.is_float else 0, c.src.dtype)
                value = ir.Select(ir.Broadcast(c.cond, n), value, ir.Broadcast(zero, n))
            out.append(ir.Store(c.local, (ir.Ramp(ir.const(c.offset), ir.const(1), n),), value))
            i += n
        return ir.block(out)


def combine_loads(s: ir.Stmt) -> ir.Stmt:
    """Combine runs of adjacent scalar copies into local buffers into aligned vector copies."""
    return _Combine().stmt(s)
