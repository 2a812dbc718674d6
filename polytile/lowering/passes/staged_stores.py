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
"""

from __future__ import annotations

from dataclasses import replace

from ...target import CUDATarget
from .. import loopir as ir
from .pipeline import _linear_thread
from .tma_store import _Stager

ROW_PAD_BYTES = 16  # past each row of the staging tile: the accumulators' rows of a store in distinct banks


def staged_stores(s: ir.Stmt, outputs: frozenset[str], target: CUDATarget) -> ir.Stmt:
    """Stage the write-back of each buffer in ``outputs`` through shared memory, copied out by the threads."""
    if not outputs:
        return s

    def visit(st: ir.Stmt) -> ir.Stmt | None:
        if isinstance(st, ir.Kernel):
            body = st.body
            for name in sorted(outputs):
                if any(isinstance(x, ir.Store) and x.buffer.name == name for x in ir.walk_stmt(body)):
                    body = _ThreadStager(st, name, target).stmt(body)
            return replace(st, body=body)
        return None
    return ir.map_stmts(s, visit)


class _ThreadStager(_Stager):
    """The write-back staged as for a TMA store, copied out by the block's threads."""

    what, primitive = "staged store", "staged_store"

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
