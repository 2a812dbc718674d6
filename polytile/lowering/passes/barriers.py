"""Barrier insertion: ``__syncthreads()`` between block-level phases that communicate through shared
(or block-written global) memory, and at the end of a loop body whose next iteration would
overwrite what this one still reads. Nothing else is synchronized.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ... import dtypes
from .. import loopir as ir

SYNC = ir.Evaluate(ir.Call("__syncthreads", (), dtypes.int32))
SHARED_SCOPES = ("shared", "global")


@dataclass
class _Access:
    reads: set[str] = field(default_factory=set)
    writes: set[str] = field(default_factory=set)
    disjoint: set[str] = field(default_factory=set)  # written buffers whose threads write disjoint elements

    def conflicts(self, later: _Access) -> bool:
        # stores of two phases into a buffer whose threads write disjoint elements (a TMA store's
        # staging tile, ``Buffer.disjoint_writes``) need no barrier between them: only a read does
        rewritten = (self.writes & later.writes) - (self.disjoint & later.disjoint)
        return bool(self.writes & later.reads or rewritten or self.reads & later.writes)

    def add(self, other: _Access) -> None:
        self.reads |= other.reads
        self.writes |= other.writes
        self.disjoint |= other.disjoint

    def empty(self) -> bool:
        return not self.reads and not self.writes


def _accesses(st: ir.Stmt) -> _Access:
    acc = _Access()
    for x in ir.walk_stmt(st):
        if isinstance(x, ir.Store) and x.buffer.scope in SHARED_SCOPES:
            acc.writes.add(x.buffer.name)
            if x.buffer.disjoint_writes:
                acc.disjoint.add(x.buffer.name)
        for e in ir.stmt_exprs(x):
            for n in ir.walk_expr(e):
                if isinstance(n, ir.Load) and n.buffer.scope in SHARED_SCOPES:
                    acc.reads.add(n.buffer.name)
    return acc


def _is_sync(st: ir.Stmt) -> bool:
    return isinstance(st, ir.Evaluate) and st.call.name == "__syncthreads"


def thread_dependent_vars(body: ir.Stmt) -> set[str]:
    """Variables whose value differs between threads (thread indices and what is computed from them)."""
    names: set[str] = set()
    changed = True
    while changed:
        changed = False
        for st in ir.walk_stmt(body):
            if isinstance(st, ir.LetStmt) and st.var.name not in names and _depends(st.value, names):
                names.add(st.var.name)
                changed = True
            if isinstance(st, ir.For) and st.var.name not in names and (
                    _depends(st.lo, names) or _depends(st.extent, names)):
                names.add(st.var.name)
                changed = True
    return names


def _depends(e: ir.Expr, names: set[str]) -> bool:
    return any(isinstance(n, ir.Var) and (n.name.startswith("threadIdx") or n.name in names)
               for n in ir.walk_expr(e))


class _Inserter:
    """Inserts barriers in code that every thread of the block runs in the same way (uniform control
    flow); divergent parts (thread guards, loops whose trip count differs between threads) are
    single phases."""

    def __init__(self, divergent: set[str]):
        self.divergent = divergent

    def sequence(self, stmts: list[ir.Stmt], pending: _Access) -> tuple[list[ir.Stmt], _Access, _Access]:
        """(statements with barriers, accesses pending at the end, accesses before the first barrier)."""
        out: list[ir.Stmt] = []
        head = _Access()
        synced = False
        for st in stmts:
            st = self.stmt(st)
            acc = _accesses(st)
            if pending.conflicts(acc):
                out.append(SYNC)
                pending = _Access()
                synced = True
            out.append(st)
            pending.add(acc)
            if not synced:
                head.add(acc)
        return out, pending, head

    def stmt(self, st: ir.Stmt) -> ir.Stmt:
        if isinstance(st, ir.Block):
            body, _, _ = self.sequence(list(st.body), _Access())
            return ir.block(body)
        if isinstance(st, ir.For) and st.kind != "coop" and not (
                _depends(st.lo, self.divergent) or _depends(st.extent, self.divergent)):
            # (a cooperative copy writes each element once: it needs no barrier inside)
            parts = list(st.body.body) if isinstance(st.body, ir.Block) else [st.body]
            body, pending, head = self.sequence(parts, _Access())
            if pending.conflicts(head) and not (body and _is_sync(body[-1])):
                body.append(SYNC)  # the next iteration rewrites what this one reads (or reads it)
            return replace(st, body=ir.block(body))
        if isinstance(st, (ir.LetStmt, ir.Allocate, ir.Declare)):
            return replace(st, body=self.stmt(st.body))
        if isinstance(st, ir.If) and not _depends(st.cond, self.divergent):
            orelse = self.stmt(st.orelse) if st.orelse is not None else None
            return ir.If(st.cond, self.stmt(st.then), orelse)
        return st


def insert_barriers(s: ir.Stmt) -> ir.Stmt:
    """Add the barriers every kernel of ``s`` needs."""
    def visit(st: ir.Stmt) -> ir.Stmt | None:
        if isinstance(st, ir.Kernel):
            return replace(st, body=_Inserter(thread_dependent_vars(st.body)).stmt(st.body))
        return None
    return ir.map_stmts(s, visit)
