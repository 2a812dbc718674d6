"""Tensor-memory-accelerator copies (sm_90): the cooperative copy of a pipelined shared tile
becomes bulk tensor copies (``cp.async.bulk.tensor.2d``, ``.3d`` …) that one thread issues.

``tma_tile`` reads what the copy does — it is left as the threads' copy loop by the earlier passes
— and proves that one tensor map with 128-byte swizzling fills the buffer exactly as the copy
would: the copy reads a box of ``rows`` × ``boxes`` · W elements of the last two dimensions of a
tensor (W: 128 bytes of
elements, the widest box inner dimension the 128-byte swizzle takes) starting at an origin that
depends only on the loops outside it, stores element (r, c) of the box at (c // W) · rows · W +
r · W + c % W (the boxes of W columns one after the other, each row-major: TMA's layout before
its swizzle, which is the buffer's own: ``passes/swizzle.py``), one index along each leading
dimension (a batch: a box of extent 1 there, up to 5 dimensions in all), and reads zeros exactly
where the element lies outside the tensor (TMA's out-of-bounds fill: past the rows of one batch
it reads zeros, not the next batch's rows). The proof evaluates every element of
the copy (all threads, all lanes) at a few values of the outer loops; anything it cannot prove is
refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import dtypes
from ...errors import LoweringError
from .. import loopir as ir
from .simplify import simplify_expr

SWIZZLE_BYTES = 128  # the swizzle mode the tensor maps use (CU_TENSOR_MAP_SWIZZLE_128B)
MAX_BOX = 256  # the most elements of a box along one dimension
MAX_RANK = 5  # the most dimensions of a tensor map


@dataclass(frozen=True)
class TmaTile:
    """What one copy of a pipelined tile reads: a box of ``rows`` × ``boxes`` · ``width`` elements of
    the last two dimensions of ``tensor`` at (``row``, ``col``), at index ``lead`` of its leading
    dimensions (expressions over the loops outside the copy), copied as ``boxes`` TMA boxes of
    ``rows`` × ``width`` into ``cache``."""

    cache: ir.Buffer
    tensor: ir.Buffer
    row: ir.Expr
    col: ir.Expr
    rows: int
    width: int
    boxes: int
    lead: tuple[ir.Expr, ...] = ()

    @property
    def box_elems(self) -> int:
        return self.rows * self.width

    @property
    def nbytes(self) -> int:
        return self.box_elems * self.boxes * self.cache.dtype.itemsize


LANE = "pt_tma_lane"


class _Lanes(ir.Mutator):
    """Vector indices as scalar ones over an extra variable, the lane."""

    def visit_Ramp(self, e: ir.Ramp) -> ir.Expr:
        return ir.BinOp("+", self.expr(e.base), ir.BinOp("*", self.expr(e.stride), ir.Var(LANE)))

    def visit_Broadcast(self, e: ir.Expr) -> ir.Expr:
        return self.expr(e.value)  # type: ignore[attr-defined]


def _scalar(e: ir.Expr) -> ir.Expr:
    return _Lanes().expr(e)


@dataclass
class _Store:
    """The copy's store into the cache, with the loops and lets around it (outermost first)."""

    store: ir.Store
    scopes: list[ir.Stmt]


def _the_store(st: ir.Stmt, cache: str, where: str) -> _Store:
    found: list[_Store] = []

    def visit(s: ir.Stmt, scopes: list[ir.Stmt]) -> None:
        if isinstance(s, ir.Store):
            if s.buffer.name != cache:
                raise LoweringError(f"{where}: the copy also writes {s.buffer.name}")
            found.append(_Store(s, scopes))
            return
        if isinstance(s, ir.Block):
            for c in s.body:
                visit(c, scopes)
            return
        if isinstance(s, (ir.For, ir.LetStmt, ir.If)):
            if isinstance(s, ir.If) and s.orelse is not None:
                raise LoweringError(f"{where}: the copy has a branch with an else part")
            visit(s.then if isinstance(s, ir.If) else s.body, [*scopes, s])
            return
        raise LoweringError(f"{where}: the copy holds a {type(s).__name__} statement; TMA replaces plain copies")
    visit(st, [])
    if len(found) != 1:
        raise LoweringError(f"{where}: the copy has {len(found)} stores; TMA replaces a copy of one store")
    return found[0]


def _thread_env(block: tuple[int, int, int]) -> dict[str, np.ndarray]:
    n = block[0] * block[1] * block[2]
    tid = np.arange(n, dtype=np.int64).reshape(n, 1)  # threads along the first axis, lanes along the second
    return {"threadIdx.x": tid % block[0], "threadIdx.y": (tid // block[0]) % block[1],
            "threadIdx.z": tid // (block[0] * block[1])}


def _points(found: _Store, env: dict[str, object], lanes: int) -> list[dict[str, np.ndarray]]:
    """Every element the store writes at the outer values in ``env``: per enumerated loop iteration,
    the values of the loop variables, lets and indices (arrays over threads × lanes) and a mask."""
    shape = (next(iter(v for v in env.values() if isinstance(v, np.ndarray))).shape[0], lanes)
    out: list[dict[str, np.ndarray]] = []

    def walk(k: int, env: dict[str, object], mask: np.ndarray) -> None:
        if k == len(found.scopes):
            out.append({**{n: np.broadcast_to(v, shape) for n, v in env.items()},
                        "pt_mask": np.broadcast_to(mask, shape)})
            return
        s = found.scopes[k]
        if isinstance(s, ir.LetStmt):
            walk(k + 1, {**env, s.var.name: ir.eval_int_array(_scalar(s.value), env)}, mask)
        elif isinstance(s, ir.If):
            walk(k + 1, env, mask & (ir.eval_int_array(_scalar(s.cond), env) != 0))
        else:
            assert isinstance(s, ir.For)
            lo = np.broadcast_to(ir.eval_int_array(s.lo, env), shape)
            hi = lo + np.broadcast_to(ir.eval_int_array(s.extent, env), shape)
            live = hi[mask] if mask.any() else hi[:0]
            first = int(lo[mask].min()) if mask.any() else 0
            last = int(live.max()) if live.size else 0
            if last - first > 4096:
                raise LoweringError("the copy loops over more than 4096 iterations per thread")
            for v in range(first, last):
                walk(k + 1, {**env, s.var.name: np.asarray(v, dtype=np.int64)}, mask & (lo <= v) & (v < hi))
    walk(0, env, np.ones(shape, dtype=bool))
    return out


def _outer_vars(st: ir.Stmt) -> list[str]:
    bound = {s.var.name for s in ir.walk_stmt(st) if isinstance(s, (ir.For, ir.LetStmt))}
    names = {n.name for n in ir.all_exprs(st) if isinstance(n, ir.Var)}
    return sorted(n for n in names - bound if not n.startswith("threadIdx") and n != LANE)


def _guarded(cond: ir.Expr, index: tuple[ir.Expr, ...], shape: tuple[ir.Expr, ...]) -> set[int] | None:
    """The dimensions that ``cond`` tests ``index`` inside a tensor of ``shape`` along, when it is
    exactly such a test (``index[d] < shape[d]`` for some dimensions, ``0 <= index[d]`` perhaps;
    the indices never fall below zero for the rest), else None."""
    terms = list(cond.args) if isinstance(cond, ir.Logic) and cond.op == "&&" else [cond]
    texts = [ir.expr_text(i) for i in index]
    dims: set[int] = set()
    for t in terms:
        if not isinstance(t, ir.Cmp):
            return None
        a, b = ir.expr_text(t.a), ir.expr_text(t.b)
        if t.op == "<" and a in texts and ir.expr_text(simplify_expr(t.b)) == \
                ir.expr_text(simplify_expr(shape[texts.index(a)])):
            dims.add(texts.index(a))
            continue
        if t.op == "<=" and b in texts and ir.is_const(simplify_expr(t.a), 0):
            dims.add(texts.index(b))
            continue
        return None
    return dims


def tma_tile(copy: ir.Stmt, cache: ir.Buffer, block: tuple[int, int, int],
             thread_vars: frozenset[str] = frozenset()) -> TmaTile:
    """The TMA boxes that fill ``cache`` as the threads' copy ``copy`` does (``block``: the kernel's
    threads; ``thread_vars``: variables outside the copy whose values differ between threads);
    raises LoweringError saying why when the copy is not one TMA can do."""
    where = f"TMA copy of {cache.name}"
    found = _the_store(copy, cache.name, where)
    value = found.store.value
    cond = None
    if isinstance(value, ir.Select) and isinstance(value.b, ir.Const) and value.b.value == 0:
        cond, value = value.cond, value.a
    if not isinstance(value, ir.Load) or value.buffer.scope not in ("arg", "global"):
        raise LoweringError(f"{where}: the copy does not read a tensor in global memory element for element")
    tensor = value.buffer
    rank = len(tensor.shape)
    if not 2 <= rank <= MAX_RANK:
        raise LoweringError(f"{where}: {tensor.name} has {rank} dimensions; TMA pipelines copy tiles of tensors of "
                            f"2 to {MAX_RANK} dimensions")
    row = simplify_expr(tensor.shape[-1])
    if isinstance(row, ir.Const) and int(row.value) * tensor.dtype.itemsize % 16:
        raise LoweringError(f"{where}: the rows of {tensor.name} are {int(row.value)} elements "
                            f"({int(row.value) * tensor.dtype.itemsize} bytes) long; TMA reads tensors whose rows are "
                            "multiples of 16 bytes: copy it aligned first (align_operands) or use producer='threads'")
    if tensor.dtype != cache.dtype:
        raise LoweringError(f"{where}: the copy converts {tensor.dtype} to {cache.dtype}")
    guarded = _guarded(cond, value.index, tensor.shape) if cond is not None else set()
    if guarded is None:
        raise LoweringError(f"{where}: the copy reads zeros where {tensor.name} has elements (a guard of its own, "
                            f"{ir.expr_text(cond)}); TMA fills zeros only past the tensor's end")
    if cache.swizzle != SWIZZLE_BYTES:
        raise LoweringError(f"{where}: {cache.name} is not in 128-byte swizzled rows")
    dims = []
    for d in cache.shape:
        d = simplify_expr(d)
        if not isinstance(d, ir.Const):
            raise LoweringError(f"{where}: {cache.name} needs a constant shape")
        dims.append(int(d.value))
    total = int(np.prod(dims))
    width = SWIZZLE_BYTES // cache.dtype.itemsize
    lanes = max([found.store.value.lanes, *(i.lanes for i in found.store.index)])
    index = [_scalar(i) for i in found.store.index]
    source = [_scalar(i) for i in value.index]
    outer = _outer_vars(copy)
    if set(outer) & thread_vars:
        raise LoweringError(f"{where}: the copy depends on {', '.join(sorted(set(outer) & thread_vars))}, which differ "
                            "between threads; one thread issues the whole tile")
    threads = _thread_env(block)
    lane = np.arange(lanes, dtype=np.int64).reshape(1, lanes)
    geometry: tuple[int, int] | None = None
    origin: tuple[ir.Expr, ir.Expr] | None = None
    for sample in range(3):
        env: dict[str, object] = {**threads, LANE: lane,
                                  **{n: np.asarray(0 if sample == 0 else sample * (k + 1) + 1, dtype=np.int64)
                                     for k, n in enumerate(outer)}}
        flat_parts, r_parts, c_parts, lead_parts, at0 = [], [], [], [], None
        for pts in _points(found, env, lanes):
            mask = pts.pop("pt_mask")
            flat = np.zeros(mask.shape, dtype=np.int64)
            for i, d in zip(index, dims):
                flat = flat * d + ir.eval_int_array(i, pts)
            at_dims = [np.broadcast_to(ir.eval_int_array(i, pts), mask.shape) for i in source]
            *lead, r, c = at_dims
            for d, at in enumerate(lead):
                if len(np.unique(at[mask])) > 1:
                    raise LoweringError(f"{where}: the copy reads several indices of {tensor.name}'s dimension {d}; "
                                        "TMA boxes span the last two dimensions, one index of each other")
            # the guard tests the tensor's bounds along its dimensions; along the others the tile lies
            # inside the tensor over the loops' real ranges, which the sample values of the outer
            # loops may leave (a 1000×1024×128 GEMM's second K tile sampled at ko = 5)
            sizes = [int(ir.eval_int_array(d, pts)) for d in tensor.shape]
            inside = np.ones(mask.shape, dtype=bool)
            for d in guarded:
                inside &= (at_dims[d] >= 0) & (at_dims[d] < sizes[d])
            if cond is not None and ((ir.eval_int_array(_scalar(cond), pts) != 0) != inside)[mask].any():
                raise LoweringError(f"{where}: the copy's guard does not match {tensor.name}'s bounds")
            hit = np.argwhere(mask & (flat == 0))
            if len(hit) and at0 is None:
                t, ln = (int(x) for x in hit[0])
                at0 = {n: int(np.broadcast_to(v, mask.shape)[t, ln]) for n, v in pts.items() if n not in outer}
            flat_parts.append(flat[mask])
            r_parts.append(r[mask])
            c_parts.append(c[mask])
            lead_parts.append([int(at[mask][0]) if mask.any() else None for at in lead])
        flat = np.concatenate(flat_parts) if flat_parts else np.zeros(0, dtype=np.int64)
        if at0 is None or len(flat) != total or len(np.unique(flat)) != total:
            raise LoweringError(f"{where}: the copy does not write each of the {total} elements of {cache.name} once")
        rows_at, cols_at = np.concatenate(r_parts), np.concatenate(c_parts)
        r0, c0 = int(rows_at[flat == 0][0]), int(cols_at[flat == 0][0])
        leads = {tuple(p) for p in lead_parts if None not in p}
        if len(leads) > 1:
            raise LoweringError(f"{where}: the copy reads several indices of {tensor.name}'s leading dimensions; TMA "
                                "boxes span the last two dimensions, one index of each other")
        lead0 = list(leads.pop()) if leads else []
        r, c = rows_at - r0, cols_at - c0
        rows, cols = int(r.max()) + 1, int(c.max()) + 1
        if r.min() < 0 or c.min() < 0 or cols % width or rows * cols != total or rows > MAX_BOX or rows % 8:
            raise LoweringError(f"{where}: the copy does not read one box of {tensor.name} with whole 128-byte rows, "
                                f"a multiple of 8 and at most {MAX_BOX} of them "
                                f"(rows {int(r.min())}..{rows - 1}, columns {int(c.min())}..{cols - 1} from the "
                                f"first element; {total} elements)")
        want = (c // width) * rows * width + r * width + c % width
        if (want != flat).any():
            k = int(np.argmax(want != flat))
            raise LoweringError(f"{where}: element ({int(r[k])}, {int(c[k])}) of the box is stored at {int(flat[k])}, "
                                f"TMA's layout puts it at {int(want[k])}")
        if geometry is not None and geometry != (rows, cols):
            raise LoweringError(f"{where}: the box changes between iterations")
        geometry = (rows, cols)
        if origin is None:
            fixed = {n: ir.const(v) for n, v in at0.items() if n != LANE}
            fixed[LANE] = ir.const(at0[LANE])
            origin = tuple(simplify_expr(_inline_lets(i, found, fixed)) for i in source)  # type: ignore[assignment]
        assert origin is not None
        got = [int(ir.eval_int_array(o, {n: env[n] for n in outer})) for o in origin]
        if got != [*lead0, r0, c0]:
            raise LoweringError(f"{where}: the box's origin is not a function of the loops outside the copy")
    assert geometry is not None and origin is not None
    rows, cols = geometry
    return TmaTile(cache, tensor, origin[-2], origin[-1], rows, width, cols // width, tuple(origin[:-2]))


def _inline_lets(e: ir.Expr, found: _Store, fixed: dict[str, ir.Expr]) -> ir.Expr:
    """``e`` with the copy's lets expanded and its local variables (threads, loops, lane) fixed."""
    for s in reversed(found.scopes):
        if isinstance(s, ir.LetStmt):
            e = ir.substitute(e, {s.var.name: s.value})  # type: ignore[assignment]
    e = _scalar(e)
    threads = {n: ir.const(v) for n, v in fixed.items() if n.startswith("threadIdx")}
    return ir.substitute(ir.substitute(e, fixed), threads)  # type: ignore[return-value]


def tile_loads(tile: TmaTile, slot_buffer: ir.Buffer, slot: ir.Expr, barrier: ir.Expr,
               at: dict[str, ir.Expr]) -> list[ir.Stmt]:
    """The bulk tensor copies of ``tile`` into slot ``slot`` of ``slot_buffer`` (the cache enlarged by
    the pipeline's stages) completing on mbarrier ``barrier``; ``at``: the outer loops' values."""
    dims = [int(simplify_expr(d).value) for d in tile.cache.shape]  # type: ignore[attr-defined]
    row = simplify_expr(ir.substitute(tile.row, at))  # type: ignore[arg-type]
    col = simplify_expr(ir.substitute(tile.col, at))  # type: ignore[arg-type]
    # the leading dimensions' indices, innermost first (TMA's coordinates run from the contiguous one)
    lead = [ir.Cast(dtypes.int32, simplify_expr(ir.substitute(e, at))) for e in reversed(tile.lead)]  # type: ignore[arg-type]
    rank = 2 + len(lead)
    out = []
    for b in range(tile.boxes):
        offset, index = b * tile.box_elems, []
        for d in reversed(dims):
            index.append(ir.const(offset % d))
            offset //= d
        dst = ir.Load(slot_buffer, (slot, *reversed(index)))
        x = simplify_expr(ir.BinOp("+", col, ir.const(b * tile.width)))
        out.append(ir.call_stmt(f"pt_tma_load_{rank}d", dst, ir.Load(tile.tensor, (ir.const(0),) * rank), barrier,
                                ir.Cast(dtypes.int32, x), ir.Cast(dtypes.int32, row), *lead,
                                ir.const(tile.width, dtypes.int32), ir.const(tile.rows, dtypes.int32)))
    return out
