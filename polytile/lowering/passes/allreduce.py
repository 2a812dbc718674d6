"""Cross-thread reductions on GPUs: a reduction loop bound to threadIdx becomes per-thread partial
results in registers, combined by a block-wide tree (warp shuffles, then shared memory), and added
to the accumulator once by one thread.
"""

from __future__ import annotations

from dataclasses import replace

from ...errors import LoweringError
from .. import loopir as ir

_OPS = {"+": "sum", "*": "prod", "max": "max", "min": "min"}


def _reduction_update(st: ir.Store) -> tuple[str, ir.Expr] | None:
    """(op, term) when ``st`` is ``buf[idx] = buf[idx] op term``."""
    v = st.value
    if isinstance(v, ir.BinOp) and v.op in _OPS and isinstance(v.a, ir.Load) and v.a.buffer is st.buffer \
            and all(ir.expr_text(a) == ir.expr_text(b) for a, b in zip(v.a.index, st.index)):
        return v.op, v.b
    return None


def _uses(e: ir.Expr, name: str) -> bool:
    return any(isinstance(n, ir.Var) and n.name == name for n in ir.walk_expr(e))


class _CrossThread(ir.Mutator):
    def visit_For(self, s: ir.For) -> ir.Stmt:
        if not s.kind.startswith("threadIdx"):
            return self.default_stmt(s)
        stores = [x for x in ir.walk_stmt(s.body) if isinstance(x, ir.Store)]
        # threads share the target (it is not a per-thread buffer) and write the same element
        carried = [x for x in stores if _reduction_update(x) is not None
                   and x.buffer.scope in ("arg", "global", "shared", "heap")
                   and not any(_uses(i, s.var.name) for i in x.index)]
        if not carried:
            return self.default_stmt(s)
        first = carried[0]
        key = (first.buffer.name, tuple(ir.expr_text(i) for i in first.index))
        shared_stores = [x for x in stores if x.buffer.scope in ("arg", "global", "shared", "heap")]
        if len(carried) != len(shared_stores) or any((x.buffer.name, tuple(ir.expr_text(i) for i in x.index)) != key
                                              for x in carried):
            raise LoweringError(f"loop {s.var.name} is bound to {s.kind} and reduces into {first.buffer.name}; "
                                "a cross-thread reduction may hold only that one reduction")
        op, _ = _reduction_update(first)  # type: ignore[misc]
        dtype = first.buffer.dtype
        acc = ir.Var(f"{first.buffer.name}_part", dtype)
        identity = _identity(op, dtype)

        def update(x: ir.Stmt) -> ir.Stmt | None:
            if isinstance(x, ir.Store) and x in carried:
                _, term = _reduction_update(x)  # type: ignore[misc]
                return ir.Assign(acc, ir.BinOp(op, acc, term))
            return None

        partial = replace(s, body=ir.map_stmts(s.body, update))
        combine = ir.Assign(acc, ir.Call(f"pt_block_allreduce_{_OPS[op]}", (acc,), dtype))
        total = ir.Store(first.buffer, first.index, ir.BinOp(op, ir.Load(first.buffer, first.index), acc))
        return ir.Declare(acc, identity, ir.block([partial, combine, total]))


def _identity(op: str, dtype) -> ir.Const:  # noqa: ANN001 - a DType
    from ...lang.expr import reduce_identity
    name = {"+": "sum", "*": "prod", "max": "max", "min": "min"}[op]
    return ir.Const(reduce_identity(name, dtype).value, dtype)


def cross_thread_reductions(s: ir.Stmt) -> ir.Stmt:
    """Rewrite reduction loops bound to GPU threads into tree reductions."""
    return _CrossThread().stmt(s)
