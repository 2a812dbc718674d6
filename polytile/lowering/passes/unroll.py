"""Unrolling: loops tagged ``unroll`` with a constant extent become copies of their body."""

from __future__ import annotations

from dataclasses import replace

from ...schedule.unrolling import MAX_UNROLL
from .. import loopir as ir
from .simplify import simplify_expr


class _Unroll(ir.Mutator):
    def __init__(self, kinds: tuple[str, ...]):
        self.kinds = kinds

    def visit_For(self, s: ir.For) -> ir.Stmt:
        body = self.stmt(s.body)
        if s.kind not in self.kinds:
            return replace(s, body=body)
        ext = simplify_expr(s.extent)
        if not isinstance(ext, ir.Const) or int(ext.value) > MAX_UNROLL:
            # a partial tile: its extent is not constant, so it stays a loop; one that indexes a
            # thread's register array by its variable stays marked for unrolling (the backend's
            # compiler unrolls it up to its bound: indexed by a variable, the array would live in local
            # memory — a GEMV's partial K tile of realigned loads of B, 13×1001×999)
            return replace(s, body=body, kind="unroll" if _indexes_registers(body, s.var) else "serial")
        copies = [ir.substitute(body, {s.var.name: ir.BinOp("+", s.lo, ir.const(k))})
                  for k in range(int(ext.value))]
        return ir.block(copies)  # type: ignore[arg-type]


def _indexes_registers(body: ir.Stmt, var: ir.Var) -> bool:
    """Whether ``body`` loads or stores a thread's local array at an index that depends on ``var``."""
    def uses(idx: ir.Expr) -> bool:
        return any(isinstance(n, ir.Var) and n.name == var.name for n in ir.walk_expr(idx))
    for st in ir.walk_stmt(body):
        if isinstance(st, ir.Store) and st.buffer.scope == "local" and any(uses(i) for i in st.index):
            return True
        for e in ir.stmt_exprs(st):
            for n in ir.walk_expr(e):
                if isinstance(n, ir.Load) and n.buffer.scope == "local" and any(uses(i) for i in n.index):
                    return True
    return False


def unroll_loops(s: ir.Stmt, kinds: tuple[str, ...] = ("unroll",)) -> ir.Stmt:
    """Replace every constant-extent loop of the given kinds by copies of its body (on GPUs,
    vectorized loops are unrolled too: each thread keeps its elements in registers)."""
    return _Unroll(kinds).stmt(s)
