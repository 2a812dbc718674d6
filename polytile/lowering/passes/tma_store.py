"""TMA stores of a block's results (``Stage.tma_store``, sm_90): the threads' write-back of a tile of
an output (the register accumulators' stores into the tensor, each under a test of the tensor's
bounds) stores into a shared staging tile instead, without the bounds tests; after a barrier (and
``fence.proxy.async``: the later passes add both) one thread copies the tile to the tensor with
``cp.async.bulk.tensor`` (one box; the tensor map clips what lies past the tensor's end), commits
the bulk group and waits until it has read the tile, so that the barrier before the threads'
next stores into the tile (a persistent block's next tile) finds it read.

What the write-back does is proven as ``tma.tma_tile`` proves a copy: at a few values of the loops
outside it, every thread's stores are enumerated; they must fill a box of the tensor's last two
dimensions (one index of each other) of at most 256 × 256 elements, rows of whole 16 bytes, each
element inside the tensor written exactly once, its origin a function of the outer loops alone.
Anything else is refused with the reason.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ... import dtypes
from ...errors import LoweringError
from ...target import CUDATarget
from .. import loopir as ir
from .barriers import thread_dependent_vars
from .kernels import TILE_LOOP
from .simplify import simplify_expr
from .tma import LANE, MAX_BOX, _guarded, _inline_lets, _outer_vars, _points, _scalar, _Store, _thread_env

BULK_ROW_BYTES = 16  # a box's rows are whole 16-byte units (no swizzle)


def tma_stores(s: ir.Stmt, outputs: frozenset[str], target: CUDATarget) -> ir.Stmt:
    """Stage the write-back of each buffer in ``outputs`` through shared memory and store it with TMA."""
    if not outputs:
        return s

    def visit(st: ir.Stmt) -> ir.Stmt | None:
        if isinstance(st, ir.Kernel):
            body = st.body
            for name in sorted(outputs):
                if any(isinstance(x, ir.Store) and x.buffer.name == name for x in ir.walk_stmt(body)):
                    body = _Stager(st, name, target).stmt(body)
            return replace(st, body=body)
        return None
    return ir.map_stmts(s, visit)


class _Stager:
    """Finds the write-back of ``name`` in a kernel (below blocks, lets, allocations and a
    persistent block's loop over its tiles) and stages it."""

    what, primitive = "TMA store", "tma_store"

    def __init__(self, kernel: ir.Kernel, name: str, target: CUDATarget):
        self.kernel, self.name, self.target = kernel, name, target
        self.where = f"{self.what} of {name} in kernel {kernel.name}"
        self.divergent = thread_dependent_vars(kernel.body)
        self.lets: list[ir.LetStmt] = []  # the lets of values that differ between threads, above the write-back

    def writes(self, st: ir.Stmt) -> bool:
        return any(isinstance(x, ir.Store) and x.buffer.name == self.name for x in ir.walk_stmt(st))

    def stmt(self, st: ir.Stmt) -> ir.Stmt:
        if isinstance(st, ir.Block):
            writing = [x for x in st.body if self.writes(x)]
            if len(writing) != 1:
                raise LoweringError(f"{self.where}: {len(writing)} statements write it; TMA stores one tile per block")
            return ir.block([self.stmt(x) if x is writing[0] else x for x in st.body])
        if isinstance(st, ir.LetStmt) and st.var.name in self.divergent:
            self.lets.append(st)
        if isinstance(st, (ir.LetStmt, ir.Allocate)) or (isinstance(st, ir.For) and st.kind == TILE_LOOP):
            return replace(st, body=self.stmt(st.body))
        return self.stage(st)

    def stage(self, root: ir.Stmt) -> ir.Stmt:
        where = self.where
        threads: ir.Stmt = root  # with the per-thread values it uses defined (a warp's index)
        for let in reversed(self.lets):
            threads = ir.LetStmt(let.var, let.value, threads)
        found = _the_write(threads, self.name, where)
        store = found.store
        tensor = store.buffer
        if store.buffer.scope != "arg" or not 2 <= len(tensor.shape) <= 3:
            raise LoweringError(f"{where}: {tensor.name} is not an argument of 2 or 3 dimensions")
        if any(isinstance(e, ir.Load) and e.buffer.name == tensor.name for e in ir.walk_expr(store.value)):
            raise LoweringError(f"{where}: the write-back reads {tensor.name} too")
        itemsize = tensor.dtype.itemsize
        self.check_rows(tensor)
        # the guard of the stores (the tensor's bounds) goes: the tensor map clips the box instead
        inner = found.scopes[-1] if found.scopes else None
        guard = inner.cond if isinstance(inner, ir.If) and inner.then is store else None
        dims = _guarded(guard, store.index, tensor.shape) if guard is not None else None
        scopes = found.scopes[:-1] if dims is not None else found.scopes
        box, origin = self.prove(_Store(store, scopes), threads)
        rows, cols = box
        # each element written by one thread (``prove``): its stores need no barriers between them
        pitch = cols + self.pad(cols, itemsize)
        stage = ir.Buffer(f"{tensor.name}_stage", tensor.dtype, (ir.const(rows), ir.const(pitch)), "shared",
                          disjoint_writes=True)
        local = (ir.BinOp("-", store.index[-2], origin[-2]), ir.BinOp("-", store.index[-1], origin[-1]))

        def restage(st: ir.Stmt) -> ir.Stmt | None:
            if dims is not None and st is inner:
                return ir.Store(stage, tuple(simplify_expr(i) for i in local), store.value)
            if st is store:
                return ir.Store(stage, tuple(simplify_expr(i) for i in local), store.value)
            return None
        staged = ir.map_stmts(root, restage)
        self.check_shared(rows * pitch * itemsize)
        return ir.Allocate(stage, ir.block([staged, self.copy_out(stage, tensor, origin, box)]))

    def check_rows(self, tensor: ir.Buffer) -> None:
        """Refuse a tensor whose rows the copy-out cannot write."""
        row = simplify_expr(tensor.shape[-1])
        if isinstance(row, ir.Const) and int(row.value) * tensor.dtype.itemsize % BULK_ROW_BYTES:
            raise LoweringError(f"{self.where}: the rows of {tensor.name} are {int(row.value) * tensor.dtype.itemsize} "
                                f"bytes long; TMA stores rows of whole {BULK_ROW_BYTES} bytes: leave tma_store off")

    def check_box(self, rows: int, cols: int, tensor: ir.Buffer) -> None:
        """Refuse a box the copy-out cannot write."""
        if rows > MAX_BOX or cols > MAX_BOX or cols * tensor.dtype.itemsize % BULK_ROW_BYTES:
            raise LoweringError(f"{self.where}: the block stores a box of {rows} × {cols} elements; a TMA box has at "
                                f"most {MAX_BOX} along each dimension and rows of whole {BULK_ROW_BYTES} bytes")

    def pad(self, cols: int, itemsize: int) -> int:
        """Elements past each row of the staging tile (TMA reads it dense: none)."""
        return 0

    def copy_out(self, stage: ir.Buffer, tensor: ir.Buffer, origin: tuple[ir.Expr, ...], box: tuple[int, int]
                 ) -> ir.Stmt:
        """The block's copy of the filled staging tile to the tensor: one thread's bulk tensor store."""
        rows, cols = box
        rank = len(tensor.shape)
        at = [ir.Cast(dtypes.int32, simplify_expr(o)) for o in reversed(origin)]  # contiguous dimension first
        copy = ir.call_stmt(f"pt_tma_store_{rank}d", ir.Load(tensor, (ir.const(0),) * rank),
                            ir.Load(stage, (ir.const(0), ir.const(0))), *at,
                            ir.const(cols, dtypes.int32), ir.const(rows, dtypes.int32))
        leader = ir.Cmp("==", _linear_thread(self.kernel.block), ir.const(0))
        # the barrier between the threads' stores and the copy (and, in a persistent block, before the
        # next tile's stores) comes from ``insert_barriers``, the fence before it from ``async_proxy_fences``
        return ir.If(leader, ir.block([copy, ir.call_stmt("pt_bulk_commit"), ir.call_stmt("pt_bulk_wait_read")]))

    def prove(self, found: _Store, root: ir.Stmt) -> tuple[tuple[int, int], tuple[ir.Expr, ...]]:
        """The box (rows, columns) the write-back fills and its origin (an expression per dimension of
        the tensor over the loops outside it), checked at a few values of those loops."""
        where = self.where
        tensor = found.store.buffer
        block = self.kernel.block
        threads = _thread_env(block)
        outer = _outer_vars(root)
        lanes = max([found.store.value.lanes, *(i.lanes for i in found.store.index)])
        index = [_scalar(i) for i in found.store.index]
        lane = np.arange(lanes, dtype=np.int64).reshape(1, lanes)
        box: tuple[int, int] | None = None
        origin: tuple[ir.Expr, ...] | None = None
        sizes_used = {n.name for d in tensor.shape for n in ir.walk_expr(d) if isinstance(n, ir.Var)}
        if sizes_used:
            raise LoweringError(f"{where}: {tensor.name}'s shape depends on {', '.join(sorted(sizes_used))}; the "
                                f"proof of the staged box needs constant sizes: leave {self.primitive} off")
        for sample in range(3):
            env: dict[str, object] = {**threads, LANE: lane,
                                      **{n: np.asarray(0 if sample == 0 else sample * (k + 1) + 1, dtype=np.int64)
                                         for k, n in enumerate(outer)}}
            points = []
            for pts in _points(found, env, lanes):
                mask = pts.pop("pt_mask")
                at = [np.broadcast_to(ir.eval_int_array(i, pts), mask.shape) for i in index]
                sizes = [int(ir.eval_int_array(d, pts)) for d in tensor.shape]
                points.append((mask, at, sizes, pts))
            if not points:  # outer values past the loops' real ranges: every store skipped
                continue
            sizes = points[0][2]
            at_all = [np.concatenate([p[1][d].reshape(-1) for p in points]) for d in range(len(index))]
            live = np.concatenate([p[0].reshape(-1) for p in points])
            inside = np.ones_like(live)
            for d, size in enumerate(sizes):
                inside &= (at_all[d] >= 0) & (at_all[d] < size)
            for d in range(len(index) - 2):
                if len(np.unique(at_all[d][live])) > 1:
                    raise LoweringError(f"{where}: the block stores several indices of {tensor.name}'s dimension "
                                        f"{d}; a TMA box spans the last two dimensions, one index of each other")
            r, c = at_all[-2], at_all[-1]
            r0, c0 = int(r.min()), int(c.min())  # the box over every store (the guards' masks left out)
            rows, cols = int(r.max()) - r0 + 1, int(c.max()) - c0 + 1
            self.check_box(rows, cols, tensor)
            if box is not None and box != (rows, cols):
                raise LoweringError(f"{where}: the box changes between tiles")
            box = (rows, cols)
            flat = (r - r0) * cols + (c - c0)
            written = np.bincount(flat[live], minlength=rows * cols)
            wanted = np.zeros(rows * cols, dtype=bool)
            wanted[flat[inside]] = True
            if (written[wanted] != 1).any() or (written > 1).any():
                k = int(np.argmax((written != 1) & wanted | (written > 1)))
                raise LoweringError(f"{where}: element ({r0 + k // cols}, {c0 + k % cols}) of {tensor.name} is "
                                    f"written {int(written[k])} times by the block's threads; a TMA store needs each "
                                    "element of the box inside the tensor written once")
            if origin is None:
                k = int(np.argmax((r == r0) & (c == c0)))
                if r[k] != r0 or c[k] != c0:
                    raise LoweringError(f"{where}: no thread stores the box's first element")
                # the point's local values (threads, loops, lets, lane) fix the origin's expressions
                for mask, at, _, pts in points:
                    hit = np.argwhere((at[-2] == r0) & (at[-1] == c0))
                    if len(hit):
                        t, ln = (int(x) for x in hit[0])
                        fixed = {n: ir.const(int(np.broadcast_to(v, mask.shape)[t, ln])) for n, v in pts.items()
                                 if n not in outer}
                        origin = tuple(simplify_expr(_inline_lets(i, found, fixed)) for i in found.store.index)
                        break
            assert origin is not None
            got = [int(ir.eval_int_array(o, {n: env[n] for n in outer})) for o in origin]
            lead = [int(at_all[d][0]) for d in range(len(index) - 2)]
            if got != [*lead, r0, c0]:
                raise LoweringError(f"{where}: the box's origin is not a function of the loops outside the write-back")
        if box is None or origin is None:
            raise LoweringError(f"{where}: the write-back stores nothing")
        return box, origin

    def check_shared(self, staged: int) -> None:
        used = sum(_const_bytes(x.buffer) for x in ir.walk_stmt(self.kernel.body)
                   if isinstance(x, ir.Allocate) and x.buffer.scope == "shared")
        if used + staged > self.target.shared_per_block:
            raise LoweringError(f"{self.where}: its staging tile ({staged} bytes) and the kernel's other shared "
                                f"buffers ({used} bytes) exceed the {self.target.shared_per_block} bytes of shared "
                                "memory a block may have; use fewer pipeline stages, smaller tiles or 16-bit results, "
                                f"or leave {self.primitive} off")


def _const_bytes(b: ir.Buffer) -> int:
    n = b.dtype.itemsize
    for d in b.shape:
        d = simplify_expr(d)
        n *= int(d.value) if isinstance(d, ir.Const) else 0
    return n


def _the_write(root: ir.Stmt, name: str, where: str) -> _Store:
    """The one store into ``name`` in ``root`` with the loops, lets and conditions around it."""
    found: list[_Store] = []

    def visit(s: ir.Stmt, scopes: list[ir.Stmt]) -> None:
        if isinstance(s, ir.Store):
            if s.buffer.name == name:
                found.append(_Store(s, scopes))
            return
        if isinstance(s, ir.Block):
            for c in s.body:
                visit(c, scopes)
        elif isinstance(s, (ir.For, ir.LetStmt)):
            visit(s.body, [*scopes, s])
        elif isinstance(s, ir.If):
            if s.orelse is not None:
                raise LoweringError(f"{where}: the write-back has a branch with an else part")
            visit(s.then, [*scopes, s])
        elif isinstance(s, ir.Allocate):
            visit(s.body, scopes)
    visit(root, [])
    if len(found) != 1:
        raise LoweringError(f"{where}: the write-back has {len(found)} stores into {name}; TMA stages one")
    return found[0]


def _linear_thread(block: tuple[int, int, int]) -> ir.Expr:
    from .pipeline import _linear_thread as linear
    return linear(block)
