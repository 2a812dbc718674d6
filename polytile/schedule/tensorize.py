"""``tensorize``: map the innermost (m, n, k) loops of a computation onto a tensor-core instruction.

Supported, with float16 or bfloat16 operands and float32 accumulation:

- ``mma_m16n8k16`` — ``mma.sync.aligned.m16n8k16`` (sm_80 and newer), operands read with ``ldmatrix``;
- ``wgmma_m64nNk16`` — Hopper's warpgroup MMA, ``wgmma.mma_async.m64nNk16`` (sm_90a): four warps
  (a warpgroup) compute a 64×N product whose operands the instruction reads from shared memory itself,
  through matrix descriptors. The nest is still the one warp's share, 16×8×16; the loop around it over
  the warp's 8-column tiles gives N, and the four warps of a warpgroup are four consecutive 16-row
  tiles of the loop bound to ``threadIdx.z`` (lowering/passes/wgmma.py checks both).

The three loops must be the innermost ones, of extents 16, 8 and 16, running over the row of the result,
its column and the reduction — or, for mma.sync, over its column, its row and the reduction (transposed:
C^T = B^T A^T, the 16 rows of the instruction over the result's columns: a GEMV's few rows as the
instruction's 8 columns, ``gpu_schedules.gemv_mma``); a row or column loop may be shorter than the tile
where the result ends inside it (a product of 3 rows); the operands must come from shared-memory caches
and the accumulator must be a ``cache_write(..., loc="fragment")`` of the warp's tile (kept in
registers, distributed over the warp's lanes as the instruction does: wgmma's accumulator is
mma.m16n8's, repeated over N/8 columns). For wgmma the instruction also sets the operand caches'
layouts, copied in the layout's order (coalesced reads, conflict-free shared-memory writes): A is read
K-major, B N-major or K-major (as stored); an operand whose contiguous extent (A's K tile, B's N or K
tile) is a multiple of 64 is stored in rows of 64 elements (128 bytes) whose 16-byte chunks are
XOR-swizzled by the row number (the layout wgmma reads at full speed: A as [k/64][i][k%64], B as
[j/64][k][j%64] or [k/64][j][k%64]); other tiles in unswizzled 8×8 "core matrices" of 16 contiguous
bytes per row ([r/8][c/8][r%8][c%8]), which wgmma reads at about a third of the speed (measured on an
H100).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..intrinsics import tensor_intrinsic, tensor_intrinsics
from ..lang.expr import BinOp, Cast, Expr, IterVar, Load, Reduce, walk
from .transaction import transactional

if TYPE_CHECKING:
    from .state import CacheSpec, Stage

def core_matrices(*e: object) -> tuple[object, ...]:
    """wgmma's shared layout without swizzling (tiles whose contiguous extent is not a multiple of
    64): the last two indices (r, c) in 8×8 core matrices, each 8 rows of 16 contiguous bytes,
    ``[r // 8][c // 8][r % 8][c % 8]``."""
    *lead, r, c = e
    return (*lead, r // 8, c // 8, r % 8, c % 8)  # type: ignore[operator]


def swizzled_rows(*e: object) -> tuple[object, ...]:
    """wgmma's 128-byte swizzled layout (before the swizzle, which the buffer applies to its 16-byte
    chunks): rows of 64 contiguous elements, ``[c // 64][r][c % 64]``."""
    *lead, r, c = e
    return (*lead, c // 64, r, c % 64)  # type: ignore[operator]


def transpose_last(*e: object) -> tuple[object, ...]:
    """The last two indices swapped: a transposed tensorized nest's accumulator, (row, column) of the
    instruction's tile = (column, row) of the result (``fragment_layout`` composed with it)."""
    return (*e[:-2], e[-1], e[-2])


def _operand(e: Expr) -> Load | None:
    while isinstance(e, Cast):
        e = e.a
    return e if isinstance(e, Load) else None


@transactional
def tensorize(self: Stage, loop: str, intrinsic: str = "mma_m16n8k16") -> Stage:
    """Compute the nest (``loop`` and the two loops inside it) with ``intrinsic`` (a tensor intrinsic
    of ``polytile.intrinsics``; the target's features are checked when it is lowered)."""
    intr = tensor_intrinsic(intrinsic)
    if intr is None:
        raise ScheduleError(f"tensorize of {self.name}: unknown intrinsic {intrinsic!r}; "
                            f"supported: {', '.join(t.name for t in tensor_intrinsics())}")
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
    if a.dtype.name not in intr.operand_dtypes or b.dtype != a.dtype:
        raise ScheduleError(f"tensorize of {self.name}: {intrinsic} needs {' or '.join(intr.operand_dtypes)} "
                            f"operands of one type, got {a.dtype} and {b.dtype}")
    if comp.value_dtype.name != intr.accumulator:  # the result may be stored narrower (store_dtype)
        raise ScheduleError(f"tensorize of {self.name}: {intrinsic} accumulates in float32, the result is "
                            f"summed in {comp.value_dtype}")
    stmt = sched.program.statements[self.name]
    if not sched.program.is_box(self.name) and \
            not sched.program.box_reads_past_ends(self.name, [a.tensor.name, b.tensor.name]):
        # a box but for instances whose operands both lie past their tensors' ends (where the whole
        # tiles read zeros: a split reduction's last, shorter chunk) computes the same sums
        raise ScheduleError(f"tensorize of {self.name}: its iteration domain is not a box (a loop's bounds depend "
                            "on another loop); the instruction computes whole tiles")
    data = [d for d in stmt.dims if d not in stmt.reduce_dims]
    want = intr.nest
    roles = (data[-2], data[-1], None)
    # the instruction's rows over the result's columns and its columns over the result's rows
    # (C^T = B^T A^T): a GEMV's few rows as mma.m16n8's 8 columns, the weight's columns as its 16 rows
    transposed = not intr.warpgroup and loops.depends_on(p, [data[-1]]) and not loops.depends_on(p, [data[-2]])
    if transposed:
        roles = (data[-1], data[-2], None)
    for k, (name, extent, role) in enumerate(zip(loops.names[p:], want, roles)):
        lo, hi = sched.program.loop_range(self.name, loops, p + k)
        # a result axis shorter than the tile (a GEMV's 3 rows in 8): the instruction computes the whole
        # tile on the operands' whole tiles (zeros past the tensors' ends) and the write-back tests the bounds
        whole_axis = comp.shape[data.index(role)] if role is not None else None
        short = hi is not None and hi + 1 < extent and hasattr(whole_axis, "value") and \
            int(whole_axis.value) == hi + 1  # type: ignore[union-attr]
        if lo != 0 or hi is None or (hi + 1 != extent and not short):
            raise ScheduleError(f"tensorize of {self.name}: loop {name} must run over 0..{extent - 1} to match "
                                f"{intrinsic} (m, n, k = {want}); it runs over {lo}..{hi}")
        # the loop runs over its own axis and none of the others further in (the row loop may appear
        # to involve the row axis through the domain's pieces, which is harmless)
        expected = [role] if role is not None else stmt.reduce_dims
        others = ([roles[1], *stmt.reduce_dims], list(stmt.reduce_dims), [roles[1]])[k]
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

    wgmma = intr.warpgroup  # four warps: the operands in the shared layouts the instruction reads
    if wgmma:
        _check_wgmma_operands(self.name, a, b, data, stmt.reduce_dims)
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
            if wgmma:  # whole warpgroups: the A tile holds 64 rows per warpgroup even past the matrix
                grain[data[-2]] = -(-grain[data[-2]] // 64) * 64
            granules = tuple(max([grain.get(v.name, 1) for v in walk(i) if isinstance(v, IterVar)], default=1)
                             for i in op.indices)
            _check_whole_k_tiles(self.name, op, granules, comp.reduce_axes, k_dims)
            sched.caches[k] = replace(sched.caches[k], whole=granules)
            if wgmma:
                sched.caches[k] = _wgmma_cache(self.name, sched.caches[k], granules[-1])
    for k, c in enumerate(sched.caches):
        if c.kind == "write" and c.consumer == self.name and c.loc == "fragment":
            lead = (1,) * (len(comp.shape) - 2)
            # transposed: the accumulator's (row, column) is the result's (column, row)
            sched.caches[k] = replace(c, whole=lead + ((8, 16) if transposed else (16, 8)),
                                      layout=transpose_last if transposed else None)
    new = sched.state_copy(self.name)
    new.tags[loop] = intr.name  # the lowering looks the intrinsic up by the tag
    sched.commit(self.name, new)
    return self


def check_whole_products(sched: object, name: str) -> None:
    """The products of ``name`` into a whole register tile (``cache_write(..., whole=...)``) run over
    whole tiles (``lowering/passes/whole_tiles.py``) where its operands come from whole shared (or
    register) tiles: its domain must be a box, but for instances that read every operand past its
    tensor's end (the last, shorter chunk of a split reduction), and along the reduction each K tile
    (what the loops inside the operand cache's loop span) must stay inside the reduction's range, as
    for the tensor cores."""
    from .state import Schedule
    assert isinstance(sched, Schedule)
    body = sched.bodies[name]
    reads = [n for n in walk(body) if isinstance(n, Load)]
    operands = sorted({r.tensor.name for r in reads} - {name})
    if not sched.program.is_box(name) and not sched.program.box_reads_past_ends(name, operands):
        raise ScheduleError(f"cache_write of {name} with whole=: its iteration domain is not a box (a loop's bounds "
                            "depend on another loop), so whole tiles would compute outside it; leave whole= out")
    comp = sched.computation(name)
    stmt = sched.program.statements[name]
    loops = sched.states[name].loops
    for c in sched.caches:
        if c.kind != "read" or c.consumer != name or not c.whole or c.loc not in ("shared", "local") or c.level is None:
            continue
        inside = loops.index(c.level) + 1
        k_dims = [d for d in stmt.reduce_dims if any(loops.depends_on(q, [d]) for q in range(inside, len(loops.names)))]
        span = {}
        for d in k_dims:
            n = 1
            for q in range(inside, len(loops.names)):
                if loops.depends_on(q, [d]):
                    lo, hi = sched.program.loop_range(name, loops, q)
                    n *= 1 if lo is None or hi is None else hi - lo + 1
            span[d] = n
        for op in (r for r in reads if r.tensor.name == c.tensor):
            granules = tuple(max([span.get(v.name, 1) for v in walk(i) if isinstance(v, IterVar)], default=1)
                             for i in op.indices)
            _check_whole_k_tiles(name, op, granules, comp.reduce_axes, k_dims, "whole register tiles")


def _check_whole_k_tiles(name: str, op: Load, granules: tuple[int, ...], axes: tuple[IterVar, ...],
                         k_dims: list[str], what: str = "tensorize") -> None:
    """The instruction computes whole K tiles: past the reduction's end they must read zeros, which the
    whole-tile copies put only past the tensor's end. A reduction over part of an operand's dimension
    (the chunks of a split reduction, ``A[i, s·Kc + k]``) therefore needs K tiles dividing its length."""
    from ..lang.expr import Const
    extents = {a.name: int(a.hi.value) - int(a.lo.value) for a in axes  # type: ignore[attr-defined]
               if isinstance(a.lo, Const) and isinstance(a.hi, Const)}
    for index, dim, grain in zip(op.indices, op.tensor.shape, granules, strict=True):
        red = [v.name for v in walk(index) if isinstance(v, IterVar) and v.name in k_dims]
        if not red or red[0] not in extents or extents[red[0]] % grain == 0:
            continue
        ends_with_tensor = isinstance(index, IterVar) and isinstance(dim, Const) and int(dim.value) == extents[red[0]]
        if not ends_with_tensor:
            raise ScheduleError(f"{what} of {name}: the reduction over {red[0]} has {extents[red[0]]} iterations, "
                                f"not a multiple of the {grain}-wide K tile, and {op.tensor.name} continues past it "
                                f"({op.tensor.name}[{', '.join(map(str, op.indices))}]): the "
                                f"{'instruction' if what == 'tensorize' else 'products'}'s whole tiles would add the "
                                "next elements; choose a K tile that divides the reduction")


def _wgmma_cache(name: str, c: CacheSpec, contiguous: int) -> CacheSpec:
    """The operand cache ``c`` in wgmma's layout: its contiguous extent (A's K tile, B's N tile) in
    128-byte swizzled rows where it holds whole rows (the fast layout), in unswizzled core matrices
    otherwise, copied in the layout's order. A layout of the user's (the implicit GEMM's projection
    of the taps) is kept and composed with the swizzled rows; its copy runs over the tensor's
    indices (a quarter-warp still writes one whole swizzled row)."""
    if any(c.pad):
        raise ScheduleError(f"tensorize of {name} with wgmma: cache {c.name} is padded; wgmma sets the shared "
                            "layout (swizzled rows or core matrices), so cache it without pad=")
    swizzled = contiguous % 64 == 0
    if c.layout is not None:
        if not swizzled:
            raise ScheduleError(f"tensorize of {name} with wgmma: cache {c.name} has a layout of its own, which wgmma "
                                f"composes with its 128-byte swizzled rows: its contiguous tile ({contiguous}) must "
                                "be a multiple of 64 elements")
        user = c.layout
        return replace(c, layout=lambda *e: swizzled_rows(*user(*e)), swizzle=128,  # type: ignore[operator]
                       copy_order="cache")
    return replace(c, layout=swizzled_rows if swizzled else core_matrices, swizzle=128 if swizzled else 0,
                   copy_order="cache")


def _check_wgmma_operands(name: str, a: Load, b: Load, data: list[str], reduce_dims: list[str]) -> None:
    """wgmma reads A K-major (the row axis i among its indices, a reduction axis last: [..., i, k] or
    an implicit GEMM's [i, taps..., c]) and B N-major ([..., k, j]) or K-major ([..., j, k]: a linear
    layer's weight, transposed in the instruction). The reduction index, and B's column index, may be
    offset by batch axes, which are fixed within a block (the chunks of a split reduction: [i, s·Kc + k];
    attention's heads inside a row: [k, bb·N + j])."""
    def axes(e: Expr) -> set[str]:
        return {v.name for v in walk(e) if isinstance(v, IterVar)}

    row, col = data[-2], data[-1]
    outer = set(reduce_dims) | set(data[:-2])

    def reduces(e: Expr) -> bool:
        return bool(axes(e) & set(reduce_dims)) and axes(e) <= outer

    def is_a(op: Load) -> bool:
        return len(op.indices) >= 2 and reduces(op.indices[-1]) and any(axes(i) == {row} for i in op.indices[:-1])

    def columns(e: Expr) -> bool:  # the column axis, offset by batch axes ([k, bb·N + j]: a batch per block)
        return col in axes(e) and axes(e) <= {col} | set(data[:-2])

    def is_b(op: Load) -> bool:
        n_major = columns(op.indices[-1]) and reduces(op.indices[-2])
        k_major = reduces(op.indices[-1]) and axes(op.indices[-2]) == {col}  # a transposed weight: B[..., j, k]
        return len(op.indices) >= 2 and (n_major or k_major)

    if not ((is_a(a) and is_b(b)) or (is_a(b) and is_b(a))):
        raise ScheduleError(f"tensorize of {name} with wgmma: the operands must be read as A[..., {row}, k] "
                            f"(k contiguous) and B[..., k, {col}] ({col} contiguous) or B[..., {col}, k] "
                            "(k contiguous); got "
                            f"{a.tensor.name}{list(map(str, a.indices))} and "
                            f"{b.tensor.name}{list(map(str, b.indices))}")
