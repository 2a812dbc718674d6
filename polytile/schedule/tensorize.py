"""``tensorize``: map the innermost (m, n, k) loops of a computation onto a tensor-core instruction.

Supported: ``mma_m16n8k16`` — ``mma.sync.aligned.m16n8k16`` with float16 or bfloat16 operands and
float32 accumulation. The three loops must be the innermost ones, of extents 16, 8 and 16, running
over the row of the result, its column and the reduction; the operands must come from shared-memory
caches (read with ``ldmatrix``) and the accumulator must be a ``cache_write(..., loc="fragment")``
of the warp's tile (kept in registers, distributed over the warp's lanes as the instruction does).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..lang.expr import BinOp, Cast, Expr, IterVar, Load, Reduce, walk

if TYPE_CHECKING:
    from .state import Stage

INTRINSICS = {"mma_m16n8k16": (16, 8, 16)}


def _operand(e: Expr) -> Load | None:
    while isinstance(e, Cast):
        e = e.a
    return e if isinstance(e, Load) else None


def tensorize(self: Stage, loop: str, intrinsic: str = "mma_m16n8k16") -> Stage:
    """Compute the nest (``loop`` and the two loops inside it) with ``intrinsic``."""
    if intrinsic not in INTRINSICS:
        raise ScheduleError(f"tensorize of {self.name}: unknown intrinsic {intrinsic!r}; "
                            f"supported: {', '.join(INTRINSICS)}")
    sched = self.schedule
    comp = sched.computation(self.name)
    st = self.state
    loops = st.loops
    p = loops.index(loop)
    if p != len(loops.names) - 3:
        raise ScheduleError(f"tensorize of {self.name}: loop {loop} must be the third innermost loop "
                            f"(the nest is {', '.join(loops.names[p:])})")
    red = comp.reduction
    body = sched.bodies[self.name]
    if red is None or red.op != "sum" or not isinstance(body, Reduce) or not isinstance(body.body, BinOp) \
            or body.body.op != "*":
        raise ScheduleError(f"tensorize of {self.name}: the computation must be a sum of products")
    a, b = _operand(body.body.a), _operand(body.body.b)
    if a is None or b is None:
        raise ScheduleError(f"tensorize of {self.name}: both factors must be tensor reads")
    if a.dtype.name not in ("float16", "bfloat16") or b.dtype != a.dtype:
        raise ScheduleError(f"tensorize of {self.name}: {intrinsic} needs float16 or bfloat16 operands of one "
                            f"type, got {a.dtype} and {b.dtype}")
    if comp.dtype.name != "float32":
        raise ScheduleError(f"tensorize of {self.name}: {intrinsic} accumulates in float32, the result is "
                            f"{comp.dtype}")
    stmt = sched.program.statements[self.name]
    if not sched.program.is_box(self.name):
        raise ScheduleError(f"tensorize of {self.name}: its iteration domain is not a box (a loop's bounds depend "
                            "on another loop); the instruction computes whole tiles")
    data = [d for d in stmt.dims if d not in stmt.reduce_dims]
    want = INTRINSICS[intrinsic]
    roles = (data[-2], data[-1], None)
    for k, (name, extent, role) in enumerate(zip(loops.names[p:], want, roles)):
        lo, hi = sched.program.loop_range(self.name, loops, p + k)
        if lo != 0 or hi is None or hi + 1 != extent:
            raise ScheduleError(f"tensorize of {self.name}: loop {name} must run over 0..{extent - 1} to match "
                                f"{intrinsic} (m, n, k = {want}); it runs over {lo}..{hi}")
        # the loop runs over its own axis and none of the others further in (the row loop may appear
        # to involve the row axis through the domain's pieces, which is harmless)
        expected = [role] if role is not None else stmt.reduce_dims
        others = ([data[-1], *stmt.reduce_dims], list(stmt.reduce_dims), [data[-1]])[k]
        if not loops.depends_on(p + k, expected) or loops.depends_on(p + k, others):
            what = f"axis {role}" if role else "the reduction"
            raise ScheduleError(f"tensorize of {self.name}: loop {name} must run over {what} only")
    if not any(c.kind == "write" and c.consumer == self.name and c.loc == "fragment" for c in sched.caches):
        raise ScheduleError(f"tensorize of {self.name}: give the accumulator a fragment cache first: "
                            f"s[{self.name}].cache_write(warp_loop, loc='fragment')")
    # the operands come from shared-memory caches holding whole tiles: the instruction computes full
    # 16×8×16 products, so the caches hold whole instruction tiles (rounded up) and what lies past
    # the tensors' ends reads as zero; the accumulator holds whole 16×8 tiles
    # The tiles are whole *block* tiles along m and n and whole K tiles along k (what the loops inside
    # the block's loops, and inside the cache's loop, span): the ldmatrix loads of every warp and K
    # step then stay inside the buffers even where the tensors end within a tile.
    k_dims = [d for d in stmt.reduce_dims if loops.depends_on(p + 2, [d])]
    tags = sched.states[self.name].tags
    bound = [q for q, n in enumerate(loops.names) if tags.get(n, "").startswith("blockIdx")]
    first = bound[-1] + 1 if bound else 0

    def span(axis: str, start: int) -> int:
        n = 1
        for q in range(start, len(loops.names)):
            if loops.depends_on(q, [axis]):
                lo, hi = sched.program.loop_range(self.name, loops, q)
                if lo is None or hi is None:
                    return 16
                n *= hi - lo + 1
        return max(16, n)

    for op in (a, b):
        found = [k for k, c in enumerate(sched.caches) if c.kind == "read" and c.consumer == self.name
                 and c.tensor == op.tensor.name and c.loc == "shared"]
        if not found:
            raise ScheduleError(f"tensorize of {self.name}: cache {op.tensor.name} in shared memory first "
                                f"(s[{self.name}].cache({op.tensor.name}, loop, loc='shared')); the "
                                "instruction's operands are loaded from shared memory with ldmatrix")
        for k in found:
            level = sched.caches[k].level
            inside = loops.index(level) + 1 if level is not None else 0
            grain = {data[-2]: span(data[-2], first), data[-1]: span(data[-1], first),
                     **{d: span(d, inside) for d in k_dims}}
            granules = tuple(max([grain.get(v.name, 1) for v in walk(i) if isinstance(v, IterVar)], default=1)
                             for i in op.indices)
            sched.caches[k] = replace(sched.caches[k], whole=granules)
    for k, c in enumerate(sched.caches):
        if c.kind == "write" and c.consumer == self.name and c.loc == "fragment":
            sched.caches[k] = replace(c, whole=(1,) * (len(comp.shape) - 2) + (16, 8))
    new = sched.state_copy(self.name)
    new.tags[loop] = "tensorize"
    sched.commit(self.name, new)
    return self
