"""Cross-thread reductions on GPUs: a reduction loop bound to threadIdx becomes per-thread partial
results in registers, combined by a block-wide tree (warp shuffles, then shared memory), and added
to the accumulator once by one thread.
"""

from __future__ import annotations

from dataclasses import replace

from ...errors import LoweringError
from .. import loopir as ir

_OPS = {"+": "sum", "*": "prod", "max": "max", "min": "min"}
BLOCK_REDUCTIONS = frozenset(f"pt_block_allreduce_{name}" for name in _OPS.values())
"""The device functions that combine a value over all threads of a block (every thread calls them)."""


def _reduction_update(st: ir.Store) -> tuple[str, ir.Expr] | None:
    """(op, term) when ``st`` is ``buf[idx] = buf[idx] op term``."""
    v = st.value
    if isinstance(v, ir.BinOp) and v.op in _OPS and isinstance(v.a, ir.Load) and v.a.buffer is st.buffer \
            and all(ir.expr_text(a) == ir.expr_text(b) for a, b in zip(v.a.index, st.index)):
        return v.op, v.b
    return None



class _CrossThread(ir.Mutator):
    def visit_For(self, s: ir.For) -> ir.Stmt:
        if not s.kind.startswith("threadIdx"):
            return self.default_stmt(s)
        stores = [x for x in ir.walk_stmt(s.body) if isinstance(x, ir.Store)]
        shared = [x for x in stores if x.buffer.scope in ("arg", "global", "shared", "heap")]
        # threads share the target (it is not a per-thread buffer) and write the same element
        carried = [x for x in shared if _reduction_update(x) is not None
                   and not any(ir.uses_var(i, s.var.name) for i in x.index)]
        if not carried:
            return self.default_stmt(s)
        if len(carried) != len(shared):
            raise LoweringError(f"loop {s.var.name} is bound to {s.kind} and reduces across threads; it may hold "
                                "only reductions (store other results in a separate loop)")
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
        for key, x in targets.items():  # one tree per reduction, then one thread adds it in
            var, op = parts[key]
            out.append(ir.Assign(var, ir.Call(f"pt_block_allreduce_{_OPS[op]}", (var,), var.dtype)))
            out.append(ir.Store(x.buffer, x.index, ir.BinOp(op, ir.Load(x.buffer, x.index), var)))
        result: ir.Stmt = ir.block(out)
        for key in reversed(list(targets)):
            var, op = parts[key]
            result = ir.Declare(var, _identity(op, var.dtype), result)
        return result


def _identity(op: str, dtype) -> ir.Const:  # noqa: ANN001 - a DType
    from ...lang.expr import reduce_identity
    name = {"+": "sum", "*": "prod", "max": "max", "min": "min"}[op]
    return ir.Const(reduce_identity(name, dtype).value, dtype)


def cross_thread_reductions(s: ir.Stmt) -> ir.Stmt:
    """Rewrite reduction loops bound to GPU threads into tree reductions."""
    return _CrossThread().stmt(s)
