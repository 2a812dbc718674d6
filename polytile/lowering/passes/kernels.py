"""Kernel outlining for GPUs: loops bound to blockIdx become kernels, loops bound to threadIdx become
thread indices, and block-level cache copies are spread over all threads of the block.

Launch dimensions come from the polyhedral range of each bound dimension (exact for non-rectangular
loops); a guard is added only where a loop's own bounds are narrower than that range. Statements
left at block level (not inside thread loops, not copies) run in thread 0 only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ... import dtypes
from ...errors import LoweringError
from ...intrinsics import instruction
from ...target import CUDATarget
from .. import loopir as ir
from .simplify import simplify_expr

AXES = ("x", "y", "z")


def thread_var(kind: str) -> ir.Var:
    """The index variable of a binding (printed as an int cast of the CUDA builtin)."""
    return ir.Var(kind, dtypes.int32)


@dataclass
class _KernelInfo:
    block: dict[str, int] = field(default_factory=dict)


def _same(a: ir.Expr, b: ir.Expr) -> bool:
    return ir.expr_text(simplify_expr(a)) == ir.expr_text(simplify_expr(b))


def _bound_index(loop: ir.For, index: ir.Expr | None = None) -> tuple[ir.Expr, ir.Expr | None]:
    """The loop variable's value from the hardware index (or ``index``, its position in the grid or
    block), and the guard keeping it in the loop."""
    assert loop.bounds is not None
    lo_g, hi_g = loop.bounds
    value = ir.BinOp("+", lo_g, index if index is not None else ir.Cast(dtypes.INDEX, thread_var(loop.kind)))
    end = ir.BinOp("+", loop.lo, loop.extent)
    exact = _same(loop.lo, lo_g) and _same(ir.BinOp("-", end, ir.const(1)), hi_g)
    if exact:
        return value, None
    var = loop.var
    cond = ir.Logic("&&", (ir.Cmp(">=", var, loop.lo), ir.Cmp("<", var, end)))
    return value, cond


def _extent_of(loop: ir.For) -> ir.Expr:
    assert loop.bounds is not None
    lo_g, hi_g = loop.bounds
    return simplify_expr(ir.BinOp("+", ir.BinOp("-", hi_g, lo_g), ir.const(1)))


def outline_kernels(s: ir.Stmt, target: CUDATarget, func_name: str, rasters: dict[str, int] | None = None,
                    persistent: dict[str, int] | None = None, clustered: frozenset[str] = frozenset()) -> ir.Stmt:
    """Replace every nest of blockIdx-bound loops by a Kernel; everything else must be host-level
    allocation of temporaries. ``rasters``: loops bound to blockIdx.y whose blocks run in groups of
    that many rows (``Stage.raster``: one grid dimension, ``grouped_blocks``); ``persistent``: loops
    bound to blockIdx whose nest runs as persistent blocks, that many per SM (``Stage.persistent``:
    ``tile_loop``); ``clustered``: loops bound to blockIdx or threadIdx.z of kernels whose threadIdx.z
    runs as the blocks of a cluster (``Stage.cluster``: ``cluster_blocks``)."""
    counter = [0]

    def kernel(st: ir.Stmt) -> ir.Stmt:
        counter[0] += 1
        name = f"{func_name}_kernel{counter[0] - 1}"
        if _is_global_copy(st):
            return copy_kernel(st, name)
        if is_cluster(st, clustered):
            return cluster_blocks(st, name, target, rasters or {}, persistent or {})
        return make_kernel(st, name, target, rasters or {}, persistent or {})

    return map_kernels(s, kernel)


def is_cluster(kernel: ir.Stmt, clustered: frozenset[str]) -> bool:
    """Whether ``kernel``'s threadIdx.z runs as the blocks of a cluster: one of its loops bound to
    blockIdx or threadIdx.z is among ``clustered`` (a loop of one block is no loop: the slices')."""
    return bool(clustered) and any(isinstance(x, ir.For) and (x.kind.startswith("blockIdx") or x.kind == "threadIdx.z")
                                   and x.var.name in clustered for x in ir.walk_stmt(kernel))


def cluster_blocks(root: ir.Stmt, name: str, target: CUDATarget, rasters: dict[str, int],
                   persistent: dict[str, int]) -> ir.Kernel:
    """The kernel of ``root`` whose threads along threadIdx.z run as the blocks of a thread-block
    cluster along the grid's x (``Stage.cluster``): a loop bound to threadIdx.z takes the block's
    rank in its cluster (blockIdx.x, the grid's x being one cluster), the block its threads along x
    and y. The blocks of a cluster share no buffer: a buffer in shared or global memory written
    inside a loop bound to threadIdx.z (another block's) must not be read in the kernel, and the
    statements outside such loops run in each block on its own copies (LoweringError otherwise)."""
    blocks = block_shape(root).get("z", 1)
    if not target.has("clusters"):
        raise LoweringError(f"kernel {name} runs its threadIdx.z as the blocks of a cluster (cluster), which the "
                            f"target ({target.key}) lacks; build for sm_90 or leave cluster off")
    if blocks > target.max_cluster_blocks:
        raise LoweringError(f"kernel {name}: {blocks} threads along threadIdx.z as the blocks of a cluster; a cluster "
                            f"holds at most {target.max_cluster_blocks} blocks on {target.key}")
    if _block_loop(root, "blockIdx.x") is not None or persistent.keys() & _loop_names(root):
        raise LoweringError(f"kernel {name}: the blocks of its cluster take the grid's x dimension; bind no loop to "
                            "blockIdx.x and leave persistent off")
    read = {n.buffer.name for e in ir.all_exprs(root) for n in ir.walk_expr(e) if isinstance(n, ir.Load)}
    for loop in (x for x in ir.walk_stmt(root) if isinstance(x, ir.For) and x.kind == "threadIdx.z"):
        for st in ir.walk_stmt(loop.body):
            # each thread's own buffers (registers) stay in its block; the others are the block's or all
            if isinstance(st, ir.Store) and (st.buffer.scope in ("shared", "global")
                                             or st.buffer.scope == "arg" and st.buffer.name in read):
                raise LoweringError(f"kernel {name}: {st.buffer.name} is written inside loop {loop.var.name}, whose "
                                    "iterations (threadIdx.z) run in the blocks of a cluster, and read in the kernel, "
                                    "where the other blocks do not see it; keep the cluster's blocks to reductions "
                                    "and to results the kernel does not read")
    rank = ir.Cast(dtypes.INDEX, thread_var("blockIdx.x"))

    def ranks(x: ir.Stmt) -> ir.Stmt | None:
        if isinstance(x, ir.For) and x.kind == "threadIdx.z":
            value, guard = _bound_index(x, rank)
            body = ir.map_stmts(x.body, ranks)
            return ir.LetStmt(x.var, value, body if guard is None else ir.If(guard, body))
        return None

    kernel = make_kernel(ir.map_stmts(root, ranks), name, target, rasters, persistent)
    return replace(kernel, grid=(ir.const(blocks), *kernel.grid[1:]), cluster=blocks)


def _loop_names(root: ir.Stmt) -> set[str]:
    return {x.var.name for x in ir.walk_stmt(root) if isinstance(x, ir.For)}


def map_kernels(s: ir.Stmt, fn: Callable[[ir.Stmt], ir.Stmt]) -> ir.Stmt:
    """``s`` with the code of each kernel replaced by ``fn(code)``, in order; what is around the
    kernels (blocks of statements, buffers in global memory) is kept. A kernel's code: a nest of
    block loops, or code whose block loops had one iteration and vanished (isl does not generate
    loops of one value), with its shared or register buffers (every computation is bound to
    blockIdx: lower() checks it); the copy of a cache in global memory at the top (an aligned,
    zero-padded operand) is a kernel of its own."""
    if isinstance(s, ir.Block):
        return ir.block([map_kernels(x, fn) for x in s.body])
    if isinstance(s, ir.Allocate) and s.buffer.scope == "global":
        return ir.Allocate(s.buffer, map_kernels(s.body, fn))
    return fn(s)


def block_shape(kernel: ir.Stmt) -> dict[str, int]:
    """The threads of a kernel's block along each axis that its thread loops use (``x``, ``y``, ``z``):
    the widest range of a loop bound to it (LoweringError: a bound loop of a range not constant)."""
    info = _KernelInfo()
    _collect_threads(kernel, info, inside_thread=False)
    return info.block


COPY_THREADS = 256


def _is_global_copy(st: ir.Stmt) -> bool:
    """A loop nest that only copies elements into a buffer in global memory (no thread bindings)."""
    sequential = ("serial", "vectorize", "unroll")
    if not isinstance(st, ir.For) or st.kind not in sequential:
        return False
    stores = [x for x in ir.walk_stmt(st) if isinstance(x, ir.Store)]
    return bool(stores) and all(x.buffer.scope == "global" and _copy_source(x.value) is not None for x in stores) \
        and all(isinstance(x, (ir.For, ir.Store, ir.Block, ir.If, ir.LetStmt)) for x in ir.walk_stmt(st)) \
        and not any(isinstance(x, ir.For) and x.kind not in sequential for x in ir.walk_stmt(st))


def copy_kernel(st: ir.For, name: str) -> ir.Kernel:
    """A top-level copy nest as a kernel: one thread per element of its (rectangular) iteration
    space, or per 16 bytes of elements where the innermost loop's extent is a constant multiple of
    that (an aligned operand's rows, rounded up to 16 bytes: one vector store each, its elements
    read by a realigned load, ``realign_loads``); consecutive threads along the innermost loop
    (coalesced)."""
    loops: list[ir.For] = []
    inner: ir.Stmt = st
    while isinstance(inner, ir.For):
        loops.append(inner)
        inner = inner.body
    if any(_uses_any(lp.lo, loops) or _uses_any(lp.extent, loops) for lp in loops):
        raise LoweringError(f"kernel {name}: the copy of a global cache must run over a box (its loops' bounds "
                            "depend on each other); cache a rectangular region")
    itemsize = max(x.buffer.dtype.itemsize for x in ir.walk_stmt(st) if isinstance(x, ir.Store))
    group = 16 // itemsize if 16 % itemsize == 0 else 1
    last = simplify_expr(loops[-1].extent)
    if not (isinstance(last, ir.Const) and int(last.value) % group == 0):
        group = 1
    # each thread: one step of the outer loops and `group` consecutive steps of the innermost
    steps = [lp.extent for lp in loops[:-1]] + [ir.BinOp("//", loops[-1].extent, ir.const(group))]
    total: ir.Expr = ir.const(1)
    for extent in steps:
        total = ir.BinOp("*", total, extent)
    flat = ir.Var(f"{loops[-1].var.name}_flat")
    mapping: dict[str, ir.Expr] = {}
    rest: ir.Expr = flat
    for lp, extent in reversed(list(zip(loops, steps, strict=True))):
        mapping[lp.var.name] = ir.BinOp("%", rest, extent)
        rest = ir.BinOp("//", rest, extent)
    for lp in loops[:-1]:
        mapping[lp.var.name] = ir.BinOp("+", lp.lo, mapping[lp.var.name])
    innermost = loops[-1].var.name
    start = ir.BinOp("+", loops[-1].lo, ir.BinOp("*", ir.const(group), mapping[innermost]))
    elements = [ir.substitute(inner, {**mapping, innermost: ir.BinOp("+", start, ir.const(k))}) for k in range(group)]
    tid = ir.BinOp("+", ir.BinOp("*", ir.Cast(dtypes.INDEX, thread_var("blockIdx.x")), ir.const(COPY_THREADS)),
                   ir.Cast(dtypes.INDEX, thread_var("threadIdx.x")))
    body = ir.LetStmt(flat, tid, ir.If(ir.Cmp("<", flat, total), ir.block(elements)))  # type: ignore[arg-type]
    grid = simplify_expr(ir.BinOp("//", ir.BinOp("+", total, ir.const(COPY_THREADS - 1)), ir.const(COPY_THREADS)))
    return ir.Kernel(name, (grid, ir.const(1), ir.const(1)), (COPY_THREADS, 1, 1), body)


def grouped_blocks(rows: ir.Expr, cols: ir.Expr, group: int, pid: ir.Expr) -> tuple[ir.Expr, ir.Expr]:
    """(row, column) of block ``pid`` of a rows × cols grid launched in groups of ``group`` rows:
    down the rows of a group column by column, then the next group; the last group holds the rows
    left (Triton's grouped ordering). A bijection of [0, rows · cols) onto the grid."""
    width = ir.BinOp("*", ir.const(group), cols)
    first = ir.BinOp("*", ir.BinOp("div", pid, width), ir.const(group))
    size = simplify_expr(ir.BinOp("min", ir.BinOp("-", rows, first), ir.const(group)))
    if isinstance(rows, ir.Const) and int(rows.value) % group == 0:
        size = ir.const(group)
    within = ir.BinOp("mod", pid, width)
    return (simplify_expr(ir.BinOp("+", first, ir.BinOp("mod", within, size))),
            simplify_expr(ir.BinOp("div", within, size)))


def _block_loop(st: ir.Stmt, kind: str) -> ir.For | None:
    """The loop bound to ``kind`` in ``st`` (outside any thread loop), if any."""
    for x in ir.walk_stmt(st):
        if isinstance(x, ir.For) and x.kind == kind:
            return x
    return None


TILE_LOOP = "persistent"  # the kind of a persistent block's loop over its tiles


@dataclass
class _Tiles:
    """A persistent nest of block loops: the tile index of each loop (over ``tile``, the block's
    current tile), the number of blocks and the loop over the block's tiles."""

    index: dict[str, ir.Expr]
    blocks: ir.Expr
    count: ir.Expr
    tile: ir.Var = field(default_factory=lambda: ir.Var("pt_tile"))
    step: ir.Var = field(default_factory=lambda: ir.Var("pt_tile_k"))

    def loop(self, body: ir.Stmt) -> ir.For:
        """``for pt_tile_k in [0, ⌈(tiles − blockIdx.x) / blocks⌉): let pt_tile = blockIdx.x +
        pt_tile_k · blocks`` around ``body``."""
        bx = ir.Cast(dtypes.INDEX, thread_var("blockIdx.x"))
        trips = ir.BinOp("div", ir.BinOp("+", ir.BinOp("-", self.count, bx), ir.BinOp("-", self.blocks, ir.const(1))),
                         self.blocks)
        at = ir.BinOp("+", bx, ir.BinOp("*", self.step, self.blocks))
        return ir.For(self.step, ir.const(0), simplify_expr(trips), ir.LetStmt(self.tile, at, body), TILE_LOOP)


def tile_loop(outer: ir.For, group: int, sms: int) -> _Tiles:
    """The tiles of the nest of block loops starting at ``outer`` run by at most ``sms`` persistent
    blocks: tile t is, from the slowest, the index along blockIdx.z, then the row and column of
    blocks (grouped as ``grouped_blocks`` when ``group`` > 1, else row by row)."""
    loops = {axis: _block_loop(outer, f"blockIdx.{axis}") for axis in AXES}
    extents = {axis: _extent_of(lp) for axis, lp in loops.items() if lp is not None}
    tile = ir.Var("pt_tile")
    plane: ir.Expr = ir.const(1)
    for axis in ("x", "y"):
        if axis in extents:
            plane = ir.BinOp("*", plane, extents[axis])
    count = simplify_expr(ir.BinOp("*", plane, extents.get("z", ir.const(1))))
    index: dict[str, ir.Expr] = {}
    within = simplify_expr(ir.BinOp("mod", tile, plane)) if loops["z"] is not None else tile
    if loops["y"] is not None and loops["x"] is not None and group > 1:
        index[loops["y"].var.name], index[loops["x"].var.name] = grouped_blocks(extents["y"], extents["x"], group,
                                                                                within)
    else:
        rest = within
        for axis in ("x", "y"):
            lp = loops[axis]
            if lp is not None:
                index[lp.var.name] = simplify_expr(ir.BinOp("mod", rest, extents[axis]))
                rest = ir.BinOp("div", rest, extents[axis])
    if loops["z"] is not None:
        index[loops["z"].var.name] = simplify_expr(ir.BinOp("div", tile, plane))
    return _Tiles(index, simplify_expr(ir.BinOp("min", count, ir.const(sms))), count, tile)


def make_kernel(root: ir.Stmt, name: str, target: CUDATarget, rasters: dict[str, int] | None = None,
                persistent: dict[str, int] | None = None) -> ir.Kernel:
    persistent = persistent or {}
    grid: dict[str, ir.Expr] = {}
    grouped: dict[str, ir.Expr] = {}  # loop bound to blockIdx.x -> its index in a grouped grid
    tiles: list[_Tiles] = []  # the persistent nest, once its outermost loop is met
    info = _KernelInfo(block_shape(root))
    if any(_warp_call(e) for e in ir.all_exprs(root)) or any(
            isinstance(e, ir.Var) and e.name == "threadIdx.x" for e in ir.all_exprs(root)):
        # warp-wide instructions (tensor cores, and fragments) use the 32 lanes of a warp along threadIdx.x
        if info.block.get("x", 32) != 32:
            raise LoweringError(f"kernel {name} uses tensor cores: threadIdx.x is the warp's lane; bind the "
                                "warps to threadIdx.y and threadIdx.z")
        info.block["x"] = 32
    nthreads = info.block.get("x", 1) * info.block.get("y", 1) * info.block.get("z", 1)
    if nthreads > target.max_threads_per_block:
        raise LoweringError(f"kernel {name} needs {nthreads} threads per block; the GPU allows "
                            f"{target.max_threads_per_block}")

    def blocks(st: ir.Stmt) -> ir.Stmt:
        if isinstance(st, ir.For) and st.kind.startswith("blockIdx") and st.var.name in persistent and not tiles:
            group = max([(rasters or {}).get(x.var.name, 0) for x in ir.walk_stmt(st)
                         if isinstance(x, ir.For) and x.kind == "blockIdx.y"] or [0])
            tiles.append(tile_loop(st, group, target.sms * persistent[st.var.name]))
            grid["x"] = tiles[0].blocks
            return tiles[0].loop(blocks(st))
        if isinstance(st, ir.For) and st.kind.startswith("blockIdx"):
            axis = st.kind[-1]
            if tiles and st.var.name in tiles[0].index:
                value, guard = _bound_index(st, tiles[0].index[st.var.name])
                body = blocks(st.body)
                return ir.LetStmt(st.var, value, body if guard is None else ir.If(guard, body))
            if axis in grid and st.var.name not in grouped:
                raise LoweringError(f"kernel {name}: two loops are bound to {st.kind}")
            index = None
            group = (rasters or {}).get(st.var.name, 0) if axis == "y" else 0
            if group and _block_loop(root, "blockIdx.x") is None:
                group = 0  # one column of blocks (its loop of one iteration gone): nothing to regroup
            if group:
                inner = _block_loop(st.body, "blockIdx.x")
                if inner is None:
                    raise LoweringError(f"kernel {name}: the blocks of loop {st.var.name} run in groups of rows "
                                        "(raster), which needs a loop inside it bound to blockIdx.x")
                rows, cols = _extent_of(st), _extent_of(inner)
                pid = ir.Cast(dtypes.INDEX, thread_var("blockIdx.x"))
                index, grouped[inner.var.name] = grouped_blocks(rows, cols, group, pid)
                grid["x"] = simplify_expr(ir.BinOp("*", rows, cols))
            elif axis == "x" and st.var.name in grouped:
                index = grouped[st.var.name]
            else:
                grid[axis] = _extent_of(st)
            value, guard = _bound_index(st, index)
            body = blocks(st.body)
            if guard is not None:
                body = ir.If(guard, body)
            return ir.LetStmt(st.var, value, body)
        if isinstance(st, ir.LetStmt):  # a bound loaded between block loops (data-dependent bounds)
            return ir.LetStmt(st.var, st.value, blocks(st.body))
        if isinstance(st, ir.If) and st.orelse is None and _has_block_loop(st.then):
            # a condition isl hoisted out of block loops (e.g. where a computation has instances at
            # all): every block tests it
            return ir.If(st.cond, blocks(st.then))
        return threads(st, info, nthreads)

    body = _spread_shared_copies(blocks(root), info.block, nthreads)
    for axis, ext in grid.items():
        if any(isinstance(n, ir.Var) and not n.name.startswith(("blockIdx", "threadIdx")) and
               n.name != "" and _is_loop_var(n.name, root) for n in ir.walk_expr(ext)):
            raise LoweringError(f"kernel {name}: the grid extent along {axis} depends on a loop variable")
    g = tuple(grid.get(a, ir.const(1)) for a in AXES)
    b = tuple(info.block.get(a, 1) for a in AXES)
    return ir.Kernel(name, g, b, body)  # type: ignore[arg-type]


def _has_block_loop(st: ir.Stmt) -> bool:
    return any(isinstance(x, ir.For) and x.kind.startswith("blockIdx") for x in ir.walk_stmt(st))


def _is_loop_var(name: str, root: ir.Stmt) -> bool:
    return any(isinstance(st, ir.For) and st.var.name == name for st in ir.walk_stmt(root))


def _collect_threads(st: ir.Stmt, info: _KernelInfo, inside_thread: bool) -> None:
    if isinstance(st, ir.For) and st.kind.startswith("threadIdx"):
        axis = st.kind[-1]
        ext = _extent_of(st)
        if not isinstance(ext, ir.Const):
            raise LoweringError(f"loop {st.var.name} is bound to {st.kind} but its extent {ir.expr_text(ext)} is "
                                "not a constant; split it by a constant first")
        info.block[axis] = max(info.block.get(axis, 1), int(ext.value))
        _collect_threads(st.body, info, True)
        return
    for child in ir.stmt_children(st):
        _collect_threads(child, info, inside_thread)


def _thread_id(block: dict[str, int]) -> ir.Expr:
    """The linear thread index within the block."""
    bx, by = block.get("x", 1), block.get("y", 1)
    tid: ir.Expr = ir.Cast(dtypes.INDEX, thread_var("threadIdx.x"))
    if block.get("y", 1) > 1:
        tid = ir.BinOp("+", tid, ir.BinOp("*", ir.Cast(dtypes.INDEX, thread_var("threadIdx.y")), ir.const(bx)))
    if block.get("z", 1) > 1:
        tid = ir.BinOp("+", tid, ir.BinOp("*", ir.Cast(dtypes.INDEX, thread_var("threadIdx.z")),
                                          ir.const(bx * by)))
    return tid


def threads(st: ir.Stmt, info: _KernelInfo, nthreads: int) -> ir.Stmt:
    """Map thread loops; spread block-level copy nests over the threads; run other block-level
    statements in thread 0."""
    if isinstance(st, ir.For) and st.kind.startswith("threadIdx"):
        value, guard = _bound_index(st)
        body = _inside_threads(st.body)
        if guard is not None:
            body = ir.If(guard, body)
        return ir.LetStmt(st.var, value, body)
    if isinstance(st, ir.For) and st.kind.startswith("blockIdx"):
        raise LoweringError(f"loop {st.var.name} is bound to {st.kind} inside a kernel's block level; bind "
                            "only the outermost loops to blockIdx")
    if isinstance(st, ir.For):
        if not any(isinstance(x, ir.For) and x.kind.startswith("threadIdx") for x in ir.walk_stmt(st.body)):
            if _is_copy_nest(st):
                return cooperative(st, info.block, nthreads)
            return _single_thread(st, info.block)
        return replace(st, body=threads(st.body, info, nthreads))
    if isinstance(st, ir.Block):
        return ir.block([threads(x, info, nthreads) for x in st.body])
    if isinstance(st, (ir.LetStmt, ir.Allocate, ir.Declare)):
        return replace(st, body=threads(st.body, info, nthreads))
    if isinstance(st, ir.If):
        then = threads(st.then, info, nthreads)
        orelse = threads(st.orelse, info, nthreads) if st.orelse is not None else None
        return ir.If(st.cond, then, orelse)
    if isinstance(st, ir.Store):
        if st.buffer.scope in ("shared",) and _is_copy_store(st):
            return cooperative(st, info.block, nthreads)
        return _single_thread(st, info.block)
    return st


def _spread_shared_copies(st: ir.Stmt, block: dict[str, int], nthreads: int) -> ir.Stmt:
    """Copies into shared memory inside thread loops: every thread would run the same loops (their
    bounds do not depend on the thread), so each thread takes its share instead. Not under a condition
    that differs between threads (e.g. a cache's footprint empty for some threads): the threads that
    skip the copy would leave their share of it unwritten; there each thread copies it all."""
    from .barriers import _depends, thread_dependent_vars
    divergent = thread_dependent_vars(st)

    def visit(x: ir.Stmt) -> ir.Stmt | None:
        if isinstance(x, ir.If) and _depends(x.cond, divergent):
            return x
        if isinstance(x, ir.For) and x.kind != "coop" and _is_copy_nest(x) and \
                any(isinstance(y, ir.Store) and y.buffer.scope == "shared" for y in ir.walk_stmt(x)) and \
                not _varies(x, divergent):
            return cooperative(x, block, nthreads)
        if isinstance(x, ir.For) and x.kind == "coop":
            return x
        return None
    return ir.map_stmts(st, visit)


def _varies(st: ir.For, divergent: set[str]) -> bool:
    """Whether the loop nest's bounds vary between threads."""
    for x in ir.walk_stmt(st):
        if isinstance(x, ir.For):
            for e in (x.lo, x.extent):
                if any(isinstance(n, ir.Var) and (n.name.startswith("threadIdx") or n.name in divergent)
                       for n in ir.walk_expr(e)):
                    return True
    return False


def _inside_threads(st: ir.Stmt) -> ir.Stmt:
    for x in ir.walk_stmt(st):
        if isinstance(x, ir.For) and x.kind.startswith("blockIdx"):
            raise LoweringError(f"loop {x.var.name} is bound to {x.kind} inside a thread loop")
    return ir.map_stmts(st, lambda x: _map_inner_thread(x))


def _map_inner_thread(x: ir.Stmt) -> ir.Stmt | None:
    if isinstance(x, ir.For) and x.kind.startswith("threadIdx"):
        value, guard = _bound_index(x)
        body = _inside_threads(x.body)
        if guard is not None:
            body = ir.If(guard, body)
        return ir.LetStmt(x.var, value, body)
    return None


def _single_thread(st: ir.Stmt, block: dict[str, int]) -> ir.Stmt:
    if _per_lane(st):
        return st
    return ir.If(ir.Cmp("==", _thread_id(block), ir.const(0)), st)


def _per_lane(st: ir.Stmt) -> bool:
    """Warp-level code (fragments, tensor-core instructions) that every lane runs: its thread loops
    had one iteration and vanished, but it is written for the 32 lanes of a warp."""
    return any((isinstance(e, ir.Var) and e.name == "threadIdx.x") or _warp_call(e) for e in ir.all_exprs(st))


def _warp_call(e: ir.Expr) -> bool:
    """A call of an instruction that all lanes of a warp execute together (``polytile.intrinsics``)."""
    return isinstance(e, ir.Call) and getattr(instruction(e.name), "warp", False)


def _is_copy_store(st: ir.Store) -> bool:
    return _copy_source(st.value) is not None or st.buffer.scope == "shared"


def _is_copy_nest(st: ir.For) -> bool:
    """A loop nest whose statements only copy elements to or from shared memory."""
    stores = [x for x in ir.walk_stmt(st) if isinstance(x, ir.Store)]
    if not stores:
        return False
    for x in ir.walk_stmt(st):
        if not isinstance(x, (ir.For, ir.Store, ir.Block, ir.If, ir.LetStmt)):
            return False
    return all((src := _copy_source(x.value)) is not None and "shared" in (x.buffer.scope, src.buffer.scope)
               for x in stores)


def cooperative(st: ir.Stmt, block: dict[str, int], nthreads: int) -> ir.Stmt:
    """A copy nest run by all threads: the iteration space is flattened and strided by the block size.

    Loops become index arithmetic over one flat counter; guards inside the nest stay guards.
    """
    loops: list[ir.For] = []
    inner = st
    while isinstance(inner, ir.For):
        loops.append(inner)
        inner = inner.body
    if not loops:
        return ir.If(ir.Cmp("<", _thread_id(block), ir.const(1)), st)
    if any(_uses_any(lp.lo, loops) or _uses_any(lp.extent, loops[:k]) for k, lp in enumerate(loops)
           if k > 0) or any(_uses_any(lp.lo, loops) for lp in loops[:1]):
        return _strided_outer(loops, inner, block, nthreads)
    loops, inner = _vector_groups(loops, inner)
    total: ir.Expr = ir.const(1)
    for lp in loops:
        total = ir.BinOp("*", total, lp.extent)
    flat = ir.Var(f"{loops[-1].var.name}_flat")
    mapping: dict[str, ir.Expr] = {}
    rest: ir.Expr = flat
    for lp in reversed(loops):
        mapping[lp.var.name] = ir.BinOp("+", lp.lo, ir.BinOp("%", rest, lp.extent))
        rest = ir.BinOp("//", rest, lp.extent)
    body = ir.substitute(inner, mapping)
    tid = ir.Var(f"{flat.name}_t")
    trips = ir.BinOp("//", ir.BinOp("+", ir.BinOp("-", total, tid), ir.const(nthreads - 1)), ir.const(nthreads))
    loop = ir.For(ir.Var(f"{flat.name}_k"), ir.const(0), trips,
                  ir.LetStmt(flat, ir.BinOp("+", tid, ir.BinOp("*", ir.Var(f"{flat.name}_k"), ir.const(nthreads))),
                             body),  # type: ignore[arg-type]
                  "coop")
    return ir.LetStmt(tid, _thread_id(block), loop)


VECTOR_BYTES = 16
MIN_ASYNC_BYTES = 4  # the narrowest asynchronous copy (cp.async of 4, 8 or 16 bytes)


def _vector_groups(loops: list[ir.For], inner: ir.Stmt) -> tuple[list[ir.For], ir.Stmt]:
    """Copy 16 bytes per thread where the innermost loop runs along the last dimension of both
    buffers with a constant extent divisible by the vector width (alignment is checked later, and
    a vector split into the widest aligned pieces). A zero-filling copy (``select(inside, load, 0)``)
    is grouped when the source's rows are a whole number of the narrowest asynchronous copies (4
    bytes): its aligned pieces are then entirely inside the tensor or entirely past it."""
    lp = loops[-1]
    if not isinstance(inner, ir.Store):
        return loops, inner
    src = _copy_source(inner.value)
    if src is None:
        return loops, inner
    ext = simplify_expr(lp.extent)
    size = inner.buffer.dtype.itemsize
    width = VECTOR_BYTES // size
    if not isinstance(ext, ir.Const) or size not in (2, 4, 8) or src.buffer.dtype != inner.buffer.dtype \
            or int(ext.value) % width or width < 2:
        return loops, inner
    if isinstance(inner.value, ir.Select):
        row = src.buffer.shape[-1]
        if not isinstance(row, ir.Const) or int(row.value) * size % MIN_ASYNC_BYTES:
            return loops, inner
    for idx in (inner.index, src.index):
        if not _unit_stride_last(idx, lp.var.name):
            return loops, inner
    group = ir.Var(f"{lp.var.name}_v")
    lane = ir.BinOp("+", ir.BinOp("+", lp.lo, ir.BinOp("*", group, ir.const(width))),
                    ir.Ramp(ir.const(0), ir.const(1), width))
    body = ir.substitute(inner, {lp.var.name: lane})
    new = ir.For(group, ir.const(0), ir.const(int(ext.value) // width), body, lp.kind)
    return loops[:-1] + [new], body  # type: ignore[list-item]


def _copy_source(value: ir.Expr) -> ir.Load | None:
    """The buffer read of a copy: ``load`` or ``select(inside, load, 0)``."""
    if isinstance(value, ir.Load):
        return value
    if isinstance(value, ir.Select) and isinstance(value.a, ir.Load) and isinstance(value.b, ir.Const) \
            and value.b.value == 0:
        return value.a
    return None


def _unit_stride_last(idx: tuple[ir.Expr, ...], var: str) -> bool:
    from .simplify import Simplifier
    if any(any(isinstance(n, ir.Var) and n.name == var for n in ir.walk_expr(i)) for i in idx[:-1]):
        return False
    lin = Simplifier().linear(simplify_expr(idx[-1]))
    coef = [c for k, (c, a) in lin.terms.items() if isinstance(a, ir.Var) and a.name == var]
    others = [a for k, (c, a) in lin.terms.items() if not (isinstance(a, ir.Var) and a.name == var)]
    return coef == [1] and not any(isinstance(n, ir.Var) and n.name == var for a in others
                                   for n in ir.walk_expr(a))


def _strided_outer(loops: list[ir.For], inner: ir.Stmt, block: dict[str, int], nthreads: int) -> ir.Stmt:
    """Loops whose bounds depend on outer ones: only the outermost loop is spread over threads."""
    outer = loops[0]
    tid = ir.Var(f"{outer.var.name}_t")
    rest = inner
    for lp in reversed(loops[1:]):
        rest = replace(lp, body=rest)
    k = ir.Var(f"{outer.var.name}_k")
    trips = ir.BinOp("//", ir.BinOp("+", ir.BinOp("-", outer.extent, tid), ir.const(nthreads - 1)),
                     ir.const(nthreads))
    body = ir.substitute(rest, {outer.var.name: ir.BinOp("+", outer.lo, ir.BinOp("+", tid, ir.BinOp(
        "*", k, ir.const(nthreads))))})
    return ir.LetStmt(tid, _thread_id(block), ir.For(k, ir.const(0), trips, body, "coop"))  # type: ignore[arg-type]


def _uses_any(e: ir.Expr, loops: list[ir.For]) -> bool:
    names = {lp.var.name for lp in loops}
    return any(isinstance(n, ir.Var) and n.name in names for n in ir.walk_expr(e))
