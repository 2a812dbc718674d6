"""Register promotion: a local buffer accessed only at constant indices becomes plain variables.

After unrolling and vectorization an accumulator tile ``acc[ii][jj]`` is read and written at
fixed offsets; giving each (offset, lanes) its own variable lets the C compiler keep the tile in
registers. A buffer whose accesses overlap in other ways stays in memory.
"""

from __future__ import annotations

from .. import loopir as ir


def _const_access(idx: ir.Expr) -> tuple[int, int] | None:
    if isinstance(idx, ir.Const) and idx.lanes == 1:
        return int(idx.value), 1
    if isinstance(idx, ir.Ramp) and isinstance(idx.base, ir.Const) and ir.is_const(idx.stride, 1):
        return int(idx.base.value), idx.lanes
    return None


def _accesses(body: ir.Stmt, buf: ir.Buffer) -> list[tuple[int, int]] | None:
    found: set[tuple[int, int]] = set()
    for e in ir.all_exprs(body):  # an address passed to an intrinsic keeps the buffer in memory
        if isinstance(e, ir.Call) and any(isinstance(a, ir.Load) and a.buffer is buf for a in e.args):
            return None
    for st in ir.walk_stmt(body):
        if isinstance(st, ir.Store) and st.buffer is buf:
            acc = _const_access(st.index[0])
            if acc is None:
                return None
            found.add(acc)
        for e in ir.stmt_exprs(st):
            for n in ir.walk_expr(e):
                if isinstance(n, ir.Load) and n.buffer is buf:
                    acc = _const_access(n.index[0])
                    if acc is None:
                        return None
                    found.add(acc)
    spans = sorted(found)
    for (a, la), (b, _) in zip(spans, spans[1:]):
        if a + la > b:
            return None  # overlapping accesses of different widths
    return spans


class _Replace(ir.Mutator):
    def __init__(self, buf: ir.Buffer, names: dict[tuple[int, int], ir.Var]):
        self.buf, self.names = buf, names

    def visit_Load(self, e: ir.Load) -> ir.Expr:
        if e.buffer is self.buf:
            return self.names[_const_access(e.index[0])]  # type: ignore[index]
        return self.default_expr(e)

    def visit_Store(self, s: ir.Store) -> ir.Stmt:
        if s.buffer is self.buf:
            var = self.names[_const_access(s.index[0])]  # type: ignore[index]
            value = self.expr(s.value)
            if value.lanes < var.lanes:
                value = ir.Broadcast(value, var.lanes)
            return ir.Assign(var, value)
        return self.default_stmt(s)


class _Promote(ir.Mutator):
    def visit_Allocate(self, s: ir.Allocate) -> ir.Stmt:
        body = self.stmt(s.body)
        buf = s.buffer
        if buf.scope not in ("auto", "stack", "local", "register") or not all(
                isinstance(d, ir.Const) for d in buf.shape):
            return ir.Allocate(buf, body)
        spans = _accesses(body, buf)
        if spans is None or len(spans) > 256:
            return ir.Allocate(buf, body)
        names = {sp: ir.Var(_register_name(buf, sp[0]), buf.dtype, sp[1]) for sp in spans}
        out = _Replace(buf, names).stmt(body)
        for sp in reversed(spans):
            out = ir.Declare(names[sp], None, out)
        return out


def _register_name(buf: ir.Buffer, offset: int) -> str:
    """The variable of ``buf``'s element ``offset``; a negative offset (a load a select discards, of
    a lane whose guard fails) is spelled with ``m``, as ``-`` cannot be part of a C name."""
    return f"{buf.name}_{offset}" if offset >= 0 else f"{buf.name}_m{-offset}"


def promote_registers(s: ir.Stmt) -> ir.Stmt:
    """Replace constant-index local buffers by variables."""
    return _Promote().stmt(s)
