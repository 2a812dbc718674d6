"""Cross-thread reductions on GPUs: a reduction loop bound to threadIdx becomes per-thread partial
results in registers, combined across the threads that share the reduced value, and added to the
accumulator.

The threads that combine (a reduction's group) are the block's threads along the reduced loops:

- the whole block, where no other thread dimension is wider than one thread: a block-wide tree
  (warp shuffles, then shared memory: ``pt_block_allreduce_*``; a block that is not whole warps, its
  last warp partial, combines that warp's lanes by a tree that reads no lane past them:
  ``pt_ragged_block_allreduce_*``);
- inside loops bound to other thread dimensions (several reductions a block, e.g. a block of rows,
  one row's threads along ``threadIdx.x`` and the rows along ``threadIdx.y``): the ``threadIdx.x``
  lanes of one iteration of them, a power of two up to a warp's 32 lanes — an aligned part of a warp,
  combined by butterfly shuffles among its own lanes (``pt_group_allreduce_*``), so that each group
  finishes on its own (a row past the tensor's end skips its reduction). Other groups (more than a
  warp, or not a power of two, across warps) are refused.

In a kernel whose threadIdx.z runs as the blocks of a thread-block cluster (``Stage.cluster``), a
reduction across threadIdx.z takes the whole block's tree, then combines the blocks' totals through
distributed shared memory (``pt_cluster_allreduce_*``); the groups of other reductions are taken in
the block of threads along x and y.

Each thread of the group ends with the combined value. An accumulator in registers allocated outside
the loop (each thread's own copy) is updated by every thread; one in shared or global memory by one
thread of the group (at block level, ``kernels`` runs it in thread 0; inside other thread loops a
loop of one iteration along each reduced dimension stands for that thread), between two
synchronizations of the group's lanes where the group is part of a warp.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ... import dtypes
from ...errors import LoweringError
from .. import loopir as ir
from .kernels import block_shape, is_cluster, map_kernels

_OPS = {"+": "sum", "*": "prod", "max": "max", "min": "min"}
SHARED_SCOPES = ("arg", "global", "shared", "heap")  # one copy for all threads of the block (or grid)
PER_THREAD_SCOPES = ("local", "register")  # one copy per thread
WARP = 32


def _reduction_update(st: ir.Store) -> tuple[str, ir.Expr] | None:
    """(op, term) when ``st`` is ``buf[idx] = buf[idx] op term``, or any tree of ``op`` (for a sum, of
    ``+`` and ``-``) with the accumulator ``buf[idx]`` as one operand (a body that is itself a sum of
    terms is folded in as ``(buf[idx] + a) - b`` or ``(a + b) + buf[idx]``): the term is the other
    operands combined. (The loop is a reassociated reduction's: its operations may be regrouped.)"""
    v = st.value
    if not (isinstance(v, ir.BinOp) and (v.op in _OPS or v.op == "-")):
        return None
    op = "+" if v.op == "-" else v.op
    operands = _operands(v, op, False)
    at = [k for k, (negated, x) in enumerate(operands) if _is_accumulator(x, st)]
    if len(at) != 1 or operands[at[0]][0]:
        return None
    rest = operands[:at[0]] + operands[at[0] + 1:]
    negated, term = rest[0]
    if negated:
        term = ir.BinOp("-", ir.const(0, term.dtype), term)
    for negated, x in rest[1:]:
        term = ir.BinOp("-" if negated else op, term, x)
    return op, term


def _operands(e: ir.Expr, op: str, negated: bool) -> list[tuple[bool, ir.Expr]]:
    """The operands of the tree of ``op`` (for "+", also "-") at the top of ``e``, left to right, each
    with whether it is subtracted."""
    if isinstance(e, ir.BinOp) and (e.op == op or op == "+" and e.op == "-"):
        return _operands(e.a, op, negated) + _operands(e.b, op, negated != (e.op == "-"))
    return [(negated, e)]


def _is_accumulator(e: ir.Expr, st: ir.Store) -> bool:
    """Whether ``e`` loads the element ``st`` stores."""
    return isinstance(e, ir.Load) and e.buffer is st.buffer and \
        all(ir.expr_text(a) == ir.expr_text(b) for a, b in zip(e.index, st.index))


def _axis(loop: ir.For) -> str:
    return loop.kind[-1]


class _CrossThread(ir.Mutator):
    def __init__(self, block: dict[str, int], cluster: bool = False):
        self.cluster = cluster  # threadIdx.z runs as the blocks of a cluster: the block is the other threads
        self.block = {a: n for a, n in block.items() if a != "z"} if cluster else block
        self.enclosing: list[ir.For] = []  # thread loops around the statement being visited

    def visit_For(self, s: ir.For) -> ir.Stmt:
        if not s.kind.startswith("threadIdx"):
            return self.default_stmt(s)
        stores = [x for x in ir.walk_stmt(s.body) if isinstance(x, ir.Store)]
        shared = [x for x in stores if x.buffer.scope in SHARED_SCOPES]
        inside = {x.buffer.name for x in ir.walk_stmt(s.body) if isinstance(x, ir.Allocate)}
        # threads share the target (it is not a per-thread buffer) and write the same element, or each
        # thread keeps its own copy of it, outside the loop: the loop's iterations all add into it
        carried = [x for x in stores if _reduction_update(x) is not None
                   and not any(ir.uses_var(i, s.var.name) for i in x.index)
                   and (x.buffer.scope in SHARED_SCOPES or
                        x.buffer.scope in PER_THREAD_SCOPES and x.buffer.name not in inside)]
        if not carried:
            self.enclosing.append(s)
            try:
                return self.default_stmt(s)
            finally:
                self.enclosing.pop()
        if len([x for x in carried if x.buffer.scope in SHARED_SCOPES]) != len(shared):
            raise LoweringError(f"loop {s.var.name} is bound to {s.kind} and reduces across threads; it may hold "
                                "only reductions (store other results in a separate loop)")
        inner = _bound_inside(s.body)
        for x in carried:  # its total is added in after the tree, outside the loops that index it
            late = sorted(n for n in inner if any(ir.uses_var(i, n) for i in x.index))
            if late:
                raise LoweringError(
                    f"loop {s.var.name} is bound to {s.kind} and reduces across threads into {x.buffer.name}, whose "
                    f"elements are chosen by loop(s) {', '.join(late)} inside it: each thread's partial result "
                    f"is one value, combined once after the loop. Reorder {', '.join(late)} outside "
                    f"{s.var.name} (or cache the result inside them)")
        reduced = [s, *(x for x in ir.walk_stmt(s.body) if isinstance(x, ir.For) and x.kind.startswith("threadIdx"))]
        across = self.cluster and any(_axis(x) == "z" for x in reduced)  # across the cluster's blocks
        lanes = self._group(s, {_axis(x) for x in reduced} - ({"z"} if self.cluster else set()))
        if across and lanes is not None:
            raise LoweringError(f"loop {s.var.name} reduces across the blocks of a cluster (threadIdx.z) and across "
                                "part of a block; bind the block's other threads to loops around it, or reduce over "
                                "all of them")
        targets: dict[tuple[str, tuple[str, ...]], ir.Store] = {}
        for x in carried:
            targets.setdefault((x.buffer.name, tuple(ir.expr_text(i) for i in x.index)), x)
        parts: dict[tuple[str, tuple[str, ...]], tuple[ir.Var, str]] = {}
        for key, x in targets.items():
            op, _ = _reduction_update(x)  # type: ignore[misc]
            parts[key] = (ir.Var(f"{x.buffer.name}_part", x.buffer.dtype), op)

        def update(x: ir.Stmt) -> ir.Stmt | None:
            if isinstance(x, ir.Store) and x in carried:
                key = (x.buffer.name, tuple(ir.expr_text(i) for i in x.index))
                var, op = parts[key]
                _, term = _reduction_update(x)  # type: ignore[misc]
                return ir.Assign(var, ir.BinOp(op, var, term))
            return None

        out: list[ir.Stmt] = [replace(s, body=ir.map_stmts(s.body, update))]
        for key, x in targets.items():  # one tree per reduction, then the total added in
            var, op = parts[key]
            if across:
                if math.prod(self.block.values()) % WARP:
                    raise LoweringError(f"loop {s.var.name} reduces across the blocks of a cluster, whose blocks "
                                        f"of {math.prod(self.block.values())} threads are not whole warps")
                out.append(ir.Assign(var, ir.Call(f"pt_cluster_allreduce_{_OPS[op]}", (var,), var.dtype)))
            elif lanes is None:
                family = "block" if math.prod(self.block.values()) % WARP == 0 else "ragged_block"
                out.append(ir.Assign(var, ir.Call(f"pt_{family}_allreduce_{_OPS[op]}", (var,), var.dtype)))
            elif lanes > 1:
                out.append(ir.Assign(var, ir.Call(f"pt_group_allreduce_{_OPS[op]}",
                                                  (var, ir.const(lanes, dtypes.int32)), var.dtype)))
            total = ir.Store(x.buffer, x.index, ir.BinOp(op, ir.Load(x.buffer, x.index), var))
            out.extend(self._add_in(total, reduced, lanes))
        result: ir.Stmt = ir.block(out)
        for key in reversed(list(targets)):
            var, op = parts[key]
            result = ir.Declare(var, _identity(op, var.dtype), result)
        return result

    def _group(self, loop: ir.For, reduced: set[str]) -> int | None:
        """The lanes of ``loop``'s reduction group (None: the whole block); LoweringError where the
        block's other threads are not those of the loops around it, or its group is no aligned part
        of a warp."""
        others = {a for a, n in self.block.items() if n > 1 and a not in reduced}
        if not others:
            return None
        around = {_axis(x) for x in self.enclosing}
        lanes = self.block.get("x", 1)
        if reduced == {"x"} and others <= around and lanes <= WARP and lanes & (lanes - 1) == 0:
            return lanes
        shape = " × ".join(f"{self.block.get(a, 1)}" for a in "xyz")
        along = ", ".join(sorted(others))
        why = f"{lanes} threadIdx.x lanes" if others <= around else f"its threads along {along} are no loop around it"
        raise LoweringError(
            f"loop {loop.var.name} is bound to {loop.kind} and reduces across threads in a block of {shape} threads, "
            f"but {why}: one reduction's threads must be the whole block, or (inside loops bound to threadIdx.y "
            "or threadIdx.z) the threadIdx.x lanes, a power of two up to 32 (part of a warp)")

    def _add_in(self, total: ir.Store, reduced: list[ir.For], lanes: int | None) -> list[ir.Stmt]:
        """The statements adding a reduction's total (``total``) into its accumulator."""
        if total.buffer.scope in PER_THREAD_SCOPES or not self.enclosing:
            # each thread its own copy; or block level, which kernels runs in thread 0
            return [total]
        one: ir.Stmt = total
        for x in reversed(reduced):  # one thread of the group: the first along each reduced loop
            assert x.bounds is not None
            one = ir.For(ir.Var(f"{x.var.name}_first"), x.bounds[0], ir.const(1), one, x.kind, bounds=x.bounds)
        if lanes is None:
            return [one]
        # the group's lanes wrote and read the accumulator before; they read it after
        sync = ir.call_stmt("pt_group_sync", ir.const(lanes, dtypes.int32))
        return [sync, one, sync]


def _bound_inside(s: ir.Stmt) -> set[str]:
    """The names of the variables that loops, lets and declarations inside ``s`` bind."""
    return {x.var.name for x in ir.walk_stmt(s) if isinstance(x, (ir.For, ir.LetStmt, ir.Declare))}


def _identity(op: str, dtype) -> ir.Const:  # noqa: ANN001 - a DType
    from ...lang.expr import reduce_identity
    return ir.Const(reduce_identity(_OPS[op], dtype).value, dtype)


def cross_thread_reductions(s: ir.Stmt, clustered: frozenset[str] = frozenset()) -> ir.Stmt:
    """Rewrite reduction loops bound to GPU threads into tree reductions over their groups of threads;
    ``clustered``: the loops bound to blockIdx or threadIdx.z of the kernels whose threadIdx.z runs as
    a cluster's blocks (``Stage.cluster``)."""
    return map_kernels(s, lambda kernel: _CrossThread(block_shape(kernel), is_cluster(kernel, clustered))
                       .stmt(kernel))
