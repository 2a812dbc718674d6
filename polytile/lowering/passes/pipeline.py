"""Load–compute pipelining (ALCOP §III) of the buffers a schedule marked with ``pipeline``.

For a buffer X filled by a copy at the top of a sequential loop L and read by the rest of L's body:

* X is enlarged ×S (one slot per stage) and allocated outside L;
* a prologue issues the copies of the first S−1 iterations;
* iteration ``ko`` first waits for its own copy (``cp.async.wait_group S−2``) and a barrier, then
  issues the copy of iteration ``ko + S − 1`` into the slot iteration ``ko − 1`` just released, and
  computes from slot ``(ko − lo) mod S``.

Copies from global to shared memory become ``cp.async`` (16 bytes where the copy is vectorized);
register-level buffers (copies from shared memory into registers) are double-buffered the same way
without asynchronous copies or barriers. A register pipeline inside a shared-memory pipeline keeps
its prologue inside the outer loop's body, right after the outer wait (inner pipeline fusion).
"""

from __future__ import annotations

from dataclasses import replace

from ... import dtypes
from ...errors import LoweringError
from .. import loopir as ir
from .barriers import SYNC


def _call(name: str, *args: ir.Expr) -> ir.Stmt:
    return ir.Evaluate(ir.Call(name, tuple(args), dtypes.int32))


COMMIT = _call("pt_cp_async_commit")


def _wait(n: int) -> ir.Stmt:
    return _call("pt_cp_async_wait", ir.const(max(0, n), dtypes.int32))


def _peel_allocates(st: ir.Stmt) -> tuple[list[ir.Buffer], ir.Stmt]:
    bufs: list[ir.Buffer] = []
    while isinstance(st, ir.Allocate):
        bufs.append(st.buffer)
        st = st.body
    return bufs, st


def _stores_to(st: ir.Stmt) -> set[str]:
    return {x.buffer.name for x in ir.walk_stmt(st) if isinstance(x, ir.Store)}


def _reads(st: ir.Stmt) -> set[str]:
    return {e.buffer.name for e in ir.all_exprs(st) if isinstance(e, ir.Load)}


class _Reslot(ir.Mutator):
    """Accesses of the pipelined buffers get a leading slot index; copies into shared memory from
    global memory become asynchronous copies."""

    def __init__(self, enlarged: dict[str, ir.Buffer], slot: ir.Expr, async_copy: bool):
        self.enlarged, self.slot, self.async_copy = enlarged, slot, async_copy

    def visit_Load(self, e: ir.Load) -> ir.Expr:
        idx = tuple(self.expr(i) for i in e.index)
        if e.buffer.name in self.enlarged:
            return ir.Load(self.enlarged[e.buffer.name], (self.slot, *idx))
        return ir.Load(e.buffer, idx)

    def visit_Store(self, s: ir.Store) -> ir.Stmt:
        idx = tuple(self.expr(i) for i in s.index)
        value = self.expr(s.value)
        if s.buffer.name not in self.enlarged:
            return ir.Store(s.buffer, idx, value)
        buf = self.enlarged[s.buffer.name]
        dst = ir.Load(buf, (self.slot, *idx))
        if self.async_copy and isinstance(value, ir.Load) and value.buffer.scope in ("arg", "global"):
            return _call("pt_cp_async", dst, value)
        return ir.Store(buf, (self.slot, *idx), value)


def _pipeline_loop(loop: ir.For, body: ir.Stmt, stages: dict[str, int]) -> ir.Stmt | None:
    allocs, inner = _peel_allocates(body)
    piped = [b for b in allocs if b.name in stages]
    if not piped:
        return None
    counts = {stages[b.name] for b in piped}
    if len(counts) != 1:
        raise LoweringError(f"buffers {', '.join(b.name for b in piped)} of loop {loop.var.name} ask for different "
                            "numbers of stages; give them the same")
    S = counts.pop()
    if S == 1:
        return None
    shared = {b.scope for b in piped}
    if len(shared) != 1:
        raise LoweringError(f"loop {loop.var.name}: shared and register buffers cannot be pipelined in one loop")
    async_copy = shared.pop() == "shared"
    names = {b.name for b in piped}
    parts = list(inner.body) if isinstance(inner, ir.Block) else [inner]
    producers: list[ir.Stmt] = []
    k = 0
    while k < len(parts) and _stores_to(parts[k]) and _stores_to(parts[k]) <= names:
        producers.append(parts[k])
        k += 1
    consumers = parts[k:]
    if not producers:
        raise LoweringError(f"pipeline of {', '.join(sorted(names))}: the copy is not at the top of loop "
                            f"{loop.var.name}")
    if any(_stores_to(c) & names for c in consumers):
        raise LoweringError(f"pipeline of {', '.join(sorted(names))}: loop {loop.var.name} writes the buffer "
                            "after its copy; producer and consumers do not match")
    enlarged = {b.name: replace(b, shape=(ir.const(S), *b.shape)) for b in piped}
    var, lo, ext = loop.var, loop.lo, loop.extent
    rel = ir.BinOp("-", var, lo)
    end = ir.BinOp("+", lo, ext)

    def produce(iteration: ir.Expr, slot: ir.Expr) -> ir.Stmt:
        moved = [ir.substitute(p, {var.name: iteration}) for p in producers]
        return _Reslot(enlarged, slot, async_copy).stmt(ir.block(moved))  # type: ignore[arg-type]

    prologue: list[ir.Stmt] = []
    for s in range(S - 1):
        it = ir.BinOp("+", lo, ir.const(s))
        prologue.append(ir.If(ir.Cmp("<", it, end), produce(it, ir.const(s))))
        if async_copy:
            prologue.append(COMMIT)
    ahead = ir.BinOp("+", var, ir.const(S - 1))
    issue = ir.If(ir.Cmp("<", ahead, end), produce(ahead, ir.BinOp("%", ir.BinOp("+", rel, ir.const(S - 1)),
                                                                    ir.const(S))))
    compute = _Reslot(enlarged, ir.BinOp("%", rel, ir.const(S)), False).stmt(ir.block(consumers))
    if async_copy:
        new_body = [_wait(S - 2), SYNC, issue, COMMIT, compute]
        after = [_wait(0)]
    else:
        new_body = [issue, compute]
        after = []
    out: ir.Stmt = ir.block([*prologue, replace(loop, body=ir.block(new_body)), *after])
    for b in reversed(allocs):
        out = ir.Allocate(enlarged.get(b.name, b), out)
    return out


class _Pipeline(ir.Mutator):
    def __init__(self, stages: dict[str, int]):
        self.stages = stages

    def visit_For(self, s: ir.For) -> ir.Stmt:
        body = self.stmt(s.body)
        if s.kind != "serial":
            return replace(s, body=body)
        out = _pipeline_loop(s, body, self.stages)
        return out if out is not None else replace(s, body=body)


def pipeline_buffers(s: ir.Stmt, stages: dict[str, int]) -> ir.Stmt:
    """Multi-buffer the requested buffers across the iterations of their load–use loops."""
    if not stages:
        return s
    return _Pipeline(stages).stmt(s)
