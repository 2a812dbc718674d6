"""Staged stores of a block's results (``Stage.staged_store``): the threads' write-back of a tile of an
output (the register accumulators' stores, each under a test of the tensor's bounds) stores into a
shared staging tile instead, without the bounds tests; after a barrier (``insert_barriers``) the
block's threads copy the tile to the tensor row by row, consecutive threads on consecutive columns,
each element under the bounds test.

For 16-bit outputs whose rows are only 2-byte aligned (an odd N) the accumulators' own stores are
single elements, a warp's store instruction spread over 8 rows (the ``mma.m16n8`` layout: 4 lanes a
row), 8 partial sectors each; the copy-out's warp instructions write 64 contiguous bytes. The tile's
rows are padded by 16 bytes: the accumulators' 8 rows of a store instruction fall in different banks.

The write-back is proven to fill one box per block as for a TMA store (``tma_store.py``'s proof),
without TMA's limits on the box and the rows.

Overlaid (``Stage.staged_store(overlay=True)``): the staging tile takes the storage of the largest
shared buffer of the kernel that is large enough and that no statement uses once the write-back
begins (a product's operand tiles, whose K loop is over: the pipeline's stages need not shrink to
leave room for the tile), behind a barrier (every warp done with the operands); not where the block
loops over tiles (a persistent block's next tile loads into them), nor where no buffer qualifies.
"""

from __future__ import annotations

from dataclasses import replace

from ...target import CUDATarget
from .. import loopir as ir
from .barriers import SYNC
from .kernels import TILE_LOOP
from .pipeline import _linear_thread
from .tma_store import _const_bytes, _Stager

ROW_PAD_BYTES = 16  # past each row of the staging tile: the accumulators' rows of a store in distinct banks


def staged_stores(s: ir.Stmt, outputs: dict[str, bool], target: CUDATarget) -> ir.Stmt:
    """Stage the write-back of each buffer in ``outputs`` through shared memory, copied out by the threads;
    the staging tile overlaid on a buffer used before it where ``outputs[name]``."""
    if not outputs:
        return s

    def visit(st: ir.Stmt) -> ir.Stmt | None:
        if isinstance(st, ir.Kernel):
            body = st.body
            for name, overlay in sorted(outputs.items()):
                if any(isinstance(x, ir.Store) and x.buffer.name == name for x in ir.walk_stmt(body)):
                    stager = _ThreadStager(st, name, target)
                    stager.overlay = overlay
                    body = stager.stmt(body)
                    if overlay:
                        body = stager.overlaid(body)
            return replace(st, body=body)
        return None
    return ir.map_stmts(s, visit)


def _overlaid(body: ir.Stmt, alloc: ir.Allocate) -> ir.Stmt | None:
    """``body`` with the staging tile ``alloc`` in the storage of the largest shared buffer at least its
    size that no statement uses from its allocation on, behind a barrier; None where none is."""
    if any(isinstance(x, ir.For) and x.kind == TILE_LOOP for x in ir.walk_stmt(body)):
        return None
    size = _const_bytes(alloc.buffer)
    spent = [x.buffer for x in ir.walk_stmt(body) if isinstance(x, ir.Allocate) and x is not alloc
             and x.buffer.scope == "shared" and not x.buffer.overlays and _const_bytes(x.buffer) >= size
             and _used_after(body, alloc, x.buffer.name) is False]
    if not spent:
        return None
    under = max(spent, key=_const_bytes)
    tile = replace(alloc.buffer, overlays=under.name)

    def swap(st: ir.Stmt) -> ir.Stmt | None:
        if st is alloc:  # every warp done with the buffer before its storage is written
            return ir.Allocate(tile, ir.block([SYNC, _renamed(alloc.body, alloc.buffer, tile)]))
        return None
    return ir.map_stmts(body, swap)


def _renamed(s: ir.Stmt, old: ir.Buffer, new: ir.Buffer) -> ir.Stmt:
    class Swap(ir.Mutator):
        def visit_Load(self, e: ir.Load) -> ir.Expr:
            e = self.default_expr(e)  # type: ignore[assignment]
            return ir.Load(new, e.index) if e.buffer is old else e  # type: ignore[attr-defined]

        def visit_Store(self, st: ir.Store) -> ir.Stmt:
            st = self.default_stmt(st)  # type: ignore[assignment]
            return ir.Store(new, st.index, st.value) if st.buffer is old else st
    return Swap().stmt(s)


def _used_after(s: ir.Stmt, alloc: ir.Allocate, name: str) -> bool | None:
    """Whether buffer ``name`` is used in ``s`` once ``alloc`` begins (inside it, after it, or anywhere
    in a loop around it); None where ``s`` does not contain ``alloc``."""
    if s is alloc:
        return _uses(s, name)
    if isinstance(s, ir.Block):
        for k, x in enumerate(s.body):
            found = _used_after(x, alloc, name)
            if found is not None:
                return found or any(_uses(y, name) for y in s.body[k + 1:])
        return None
    children = [c for c in (getattr(s, "body", None), getattr(s, "then", None), getattr(s, "orelse", None))
                if isinstance(c, ir.Stmt)]
    for c in children:
        found = _used_after(c, alloc, name)
        if found is not None:
            return found or (isinstance(s, ir.For) and _uses(c, name))
    return None


def _uses(s: ir.Stmt, name: str) -> bool:
    return any(isinstance(e, ir.Load) and e.buffer.name == name for e in ir.all_exprs(s)) or any(
        isinstance(x, ir.Store) and x.buffer.name == name for x in ir.walk_stmt(s))


class _ThreadStager(_Stager):
    """The write-back staged as for a TMA store, copied out by the block's threads."""

    what, primitive = "staged store", "staged_store"
    overlay = False  # the staging tile overlaid on a buffer used before it, where one is (``overlaid``)

    def check_shared(self, staged: int) -> None:
        self.staged = staged
        if not self.overlay:
            super().check_shared(staged)

    def overlaid(self, body: ir.Stmt) -> ir.Stmt:
        """``body`` (staged) with its staging tile overlaid (``_overlaid``), or in its own shared memory where
        no buffer qualifies (checked to fit)."""
        (alloc,) = [x for x in ir.walk_stmt(body) if isinstance(x, ir.Allocate)
                    and x.buffer.name == f"{self.name}_stage"]
        out = _overlaid(body, alloc)
        if out is None:
            super().check_shared(self.staged)
            return body
        return out

    def check_rows(self, tensor: ir.Buffer) -> None:
        return None  # any row: the copy-out writes elements

    def check_box(self, rows: int, cols: int, tensor: ir.Buffer) -> None:
        return None  # any box that fits the shared memory (``check_shared``)

    def pad(self, cols: int, itemsize: int) -> int:
        return ROW_PAD_BYTES // itemsize

    def copy_out(self, stage: ir.Buffer, tensor: ir.Buffer, origin: tuple[ir.Expr, ...], box: tuple[int, int]
                 ) -> ir.Stmt:
        """Each thread copies elements ``tid``, ``tid + threads``, … of the tile in row-major order, those
        inside the tensor."""
        rows, cols = box
        bx, by, bz = self.kernel.block
        threads = bx * by * bz
        count = rows * cols
        step = ir.Var(f"{stage.name}_q")
        flat = ir.Var(f"{stage.name}_e")
        r, c = ir.BinOp("div", flat, ir.const(cols)), ir.BinOp("mod", flat, ir.const(cols))
        at = (*origin[:-2], ir.BinOp("+", origin[-2], r), ir.BinOp("+", origin[-1], c))
        inside = [ir.Cmp("<", at[-2], tensor.shape[-2]), ir.Cmp("<", at[-1], tensor.shape[-1])]
        if count % threads:
            inside.insert(0, ir.Cmp("<", flat, ir.const(count)))
        copy = ir.If(ir.Logic("&&", tuple(inside)), ir.Store(tensor, at, ir.Load(stage, (r, c))))
        first = ir.BinOp("*", step, ir.const(threads))
        body = ir.LetStmt(flat, ir.BinOp("+", first, _linear_thread(self.kernel.block)), copy)
        return ir.For(step, ir.const(0), ir.const(-(-count // threads)), body)
