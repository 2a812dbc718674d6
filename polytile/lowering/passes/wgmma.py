"""Hopper's warpgroup MMA: the nests tagged ``tensorize_wgmma`` become ``wgmma.mma_async`` instructions.

A nest is one warp's 16×8×16 share of the product; the loop around it runs over the warp's 8-column
tiles (N = 8 × its extent), and the four warps of a warpgroup are four consecutive 16-row tiles of
the loop bound to ``threadIdx.z``. The loop and the nest become one ``wgmma.m64nNk16`` that the
warpgroup issues together: A and B are read from shared memory through matrix descriptors (start
address, and the byte strides between 8×8 core matrices along the leading and the strided
dimension: LBO, SBO), the accumulator is the warp's fragment — mma.m16n8's register layout repeated
over N/8 tiles, which is wgmma's.

Operand tiles are stored in one of wgmma's two layouts, chosen by ``tensorize``: rows of 128 bytes
whose 16-byte chunks are XOR-swizzled by the row number within groups of 8 rows (the buffer's
``swizzle``; ``swizzle_shared`` applies the XOR to every access but the instruction's own, which
the hardware swizzles), or unswizzled 8×8 core matrices.

The instruction is asynchronous: the K steps of a tile are issued between ``wgmma.fence`` and
``wgmma.commit_group`` and waited for (``wgmma.wait_group 0``) before the tile's buffers can be
refilled. Shared memory written by ordinary or ``cp.async`` stores is read by wgmma through the
*async proxy*: every barrier of a kernel that uses wgmma is preceded by ``fence.proxy.async``
(``async_proxy_fences``).

Every layout fact is checked on the index expressions themselves, by evaluating them at every
element of the instruction's tiles (for sample values of the other loops): the descriptors describe
exactly what the nest reads, or lowering stops with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ... import dtypes
from ...errors import LoweringError
from .. import loopir as ir
from .simplify import simplify_expr

WGMMA_KIND = "tensorize_wgmma"
SHAPES_N = tuple(range(8, 257, 8))  # wgmma.m64nNk16: N = 8, 16, ..., 256


def _call(name: str, *args: ir.Expr) -> ir.Stmt:
    return ir.Evaluate(ir.Call(name, tuple(args), dtypes.int32))


def _strip_cast(e: ir.Expr) -> ir.Expr:
    while isinstance(e, ir.Cast):
        e = e.a
    return e


def _unguard(s: ir.Stmt) -> ir.Stmt:
    while isinstance(s, ir.If) and s.orelse is None:
        s = s.then
    return s


def _uses(e: ir.Expr, name: str) -> bool:
    return any(isinstance(n, ir.Var) and n.name == name for n in ir.walk_expr(e))


def _eval(e: ir.Expr, env: dict[str, int]) -> int:
    if isinstance(e, ir.Const):
        return int(e.value)
    if isinstance(e, ir.Var):
        if e.name not in env:
            raise KeyError(e.name)
        return env[e.name]
    if isinstance(e, ir.Cast):
        return _eval(e.a, env)
    if isinstance(e, ir.BinOp) and e.op in ("+", "-", "*", "//", "%", "div", "mod", "min", "max"):
        a, b = _eval(e.a, env), _eval(e.b, env)
        if e.op in ("//", "%", "div", "mod") and b == 0:
            raise ZeroDivisionError(ir.expr_text(e))
        ops: dict[str, Callable[[int, int], int]] = {
            "+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y, "//": lambda x, y: x // y,
            "%": lambda x, y: x % y, "div": lambda x, y: x // y, "mod": lambda x, y: x % y, "min": min, "max": max}
        return ops[e.op](a, b)
    raise KeyError(ir.expr_text(e))


def _flat(ld: ir.Load, env: dict[str, int]) -> int:
    """The element offset of ``ld`` in its (row-major, constant-shape) buffer."""
    off = 0
    for i, d in zip(ld.index, ld.buffer.shape):
        if not isinstance(d, ir.Const):
            raise LoweringError(f"wgmma operand {ld.buffer.name} needs a constant shape")
        off = off * int(d.value) + _eval(i, env)
    return off


class WgmmaNest:
    """One warp's (16, 8, 16) share of a wgmma: the accumulator, the operands (A read along (i, k),
    B along (k, j)) and the nest's loop variables."""

    def __init__(self, loop: ir.For):
        i_loop = loop
        j_loop = _unguard(loop.body)
        if not isinstance(j_loop, ir.For) or not isinstance(_unguard(j_loop.body), ir.For):
            raise LoweringError(f"tensorized loop {loop.var.name} must hold exactly two loops")
        k_loop = _unguard(j_loop.body)
        assert isinstance(k_loop, ir.For)
        st = _unguard(k_loop.body)
        if not isinstance(st, ir.Store):
            raise LoweringError(f"tensorized nest {loop.var.name} must hold one update")
        self.names = [i_loop.var.name, j_loop.var.name, k_loop.var.name]
        iv, jv, kv = self.names
        v = st.value
        if not (isinstance(v, ir.BinOp) and v.op == "+" and isinstance(v.a, ir.Load) and v.a.buffer is st.buffer
                and isinstance(v.b, ir.BinOp) and v.b.op == "*"):
            raise LoweringError(f"tensorized nest {loop.var.name} is not an accumulation of products")
        a, b = _strip_cast(v.b.a), _strip_cast(v.b.b)
        if not (isinstance(a, ir.Load) and isinstance(b, ir.Load)):
            raise LoweringError(f"tensorized nest {loop.var.name}: the factors must be buffer reads")
        if st.buffer.scope != "fragment":
            raise LoweringError(f"tensorized nest {loop.var.name} accumulates into {st.buffer.name}, which is not a "
                                "fragment cache; use cache_write(..., loc='fragment')")
        if any(_uses(x, jv) for x in a.index) or any(_uses(x, iv) for x in b.index):
            a, b = b, a
        if any(_uses(x, jv) for x in a.index) or any(_uses(x, iv) for x in b.index):
            raise LoweringError(f"tensorized nest {loop.var.name}: one factor must not depend on the column, the "
                                "other not on the row")
        for op in (a, b):
            if op.buffer.scope != "shared":
                raise LoweringError(f"wgmma operand {op.buffer.name} must be in shared memory (the instruction reads "
                                    "it there); cache it with loc='shared'")
        self.dtype = a.buffer.dtype
        self.store = st
        self.a, self.b = a, b
        self.accesses = [ir.Load(st.buffer, st.index), a, b]
        self.suffix = "f16" if self.dtype.name == "float16" else "bf16"


def _samples(names: set[str], bounds: dict[str, tuple[float, float]]) -> list[dict[str, int]]:
    """A few assignments of the loops in ``names`` over their ranges: first, last, and in between."""
    out = []
    for pick in (0.0, 1.0, 0.5):
        env = {}
        for n in names:
            lo, hi = bounds.get(n, (0, 0))
            lo = 0 if lo == float("-inf") else int(lo)
            hi = lo if hi == float("inf") else int(hi)
            env[n] = lo + int(round((hi - lo) * pick))
        out.append(env)
    return out


def _free(loads: list[ir.Load], skip: set[str]) -> set[str]:
    return {n.name for ld in loads for i in ld.index for n in ir.walk_expr(i)
            if isinstance(n, ir.Var) and n.name not in skip}


Placement = Callable[[int, int], dict[str, int]]


def _check_layout(op: ir.Load, place: Placement, rows: int, cols: int, envs: list[dict[str, int]],
                  what: str) -> tuple[int, int]:
    """The byte strides (between 8-row groups, between column groups) of the tile that ``op`` reads:
    element (r, c) of the ``rows``×``cols`` tile (c the contiguous dimension) is at ``place(r, c)``
    (loop values). Unswizzled core matrices: (r % 8) * 8 + c % 8 + (r // 8) * S_r + (c // 8) * S_c
    elements from element (0, 0); 128-byte swizzled rows (before the swizzle): (r % 8) * 64 + c % 64
    + (r // 8) * S_r + (c // 64) * S_c, the tile starting on the first row of a group of 8."""
    itemsize = op.buffer.dtype.itemsize
    swizzled = op.buffer.swizzle == 128
    if op.buffer.swizzle not in (0, 128) or itemsize != 2:
        raise LoweringError(f"{what}: {op.buffer.name} has an unsupported layout for wgmma")
    row, group = (64, 64) if swizzled else (8, 8)  # elements per row of a group of 8, per column group
    found: tuple[int, int] | None = None
    for env in envs:
        base = _flat(op, {**env, **place(0, 0)})
        s_r = _flat(op, {**env, **place(8, 0)}) - base if rows > 8 else 0
        s_c = _flat(op, {**env, **place(0, group)}) - base if cols > group else 0
        if base * itemsize % 16:
            raise LoweringError(f"{what}: the tile of {op.buffer.name} starts at element {base}, not on 16 bytes")
        if swizzled and ((base // 64) % 8 or base % 64 + min(cols, 64) > 64):
            raise LoweringError(f"{what}: the tile of {op.buffer.name} (element {base}) does not start on the first "
                                "row of a group of 8 swizzled rows, or crosses a row")
        for r in range(rows):
            for c in range(cols):
                want = base + (r % 8) * row + c % group + (r // 8) * s_r + (c // group) * s_c
                got = _flat(op, {**env, **place(r, c)})
                if got != want:
                    raise LoweringError(
                        f"{what}: {op.buffer.name} is not in the layout wgmma reads (element ({r}, {c}) of the tile "
                        f"is at offset {got - base}, the layout puts it at {want - base}); cache the operand "
                        "without a layout of its own (tensorize sets it)")
        if found is not None and found != (s_r, s_c):
            raise LoweringError(f"{what}: the strides of {op.buffer.name}'s layout change between iterations")
        found = (s_r, s_c)
    assert found is not None
    strides = (found[0] * itemsize, found[1] * itemsize)
    for s in strides:
        if s < 0 or s % 16 or s >= 16 << 14:
            raise LoweringError(f"{what}: a stride of {s} bytes in {op.buffer.name} cannot be encoded in a wgmma "
                                "descriptor (a multiple of 16 below 256 KiB)")
    return strides


def warpgroup_mma(nest: WgmmaNest, nj: ir.For | None, warp: ir.For | None, others: list[ir.For],
                  bounds: dict[str, tuple[float, float]]) -> ir.Stmt:
    """The wgmma instruction that replaces ``nj`` (the loop over the warp's column tiles, None when
    the warp owns one) and the nest. ``warp``: the loop bound to threadIdx.z; ``others``: further
    thread-bound loops around (they must be of one iteration: warps are numbered along z)."""
    where = f"wgmma nest {nest.names[0]}"
    if warp is None:
        raise LoweringError(f"{where}: bind the warps (16-row tiles) to threadIdx.z; four consecutive warps form a "
                            "warpgroup")
    for t in others:
        if not (isinstance(t.extent, ir.Const) and int(t.extent.value) == 1):
            raise LoweringError(f"{where}: loop {t.var.name} is bound to {t.kind}; with wgmma the warps are numbered "
                                "along threadIdx.z only")
    if not isinstance(warp.extent, ir.Const) or int(warp.extent.value) % 4:
        raise LoweringError(f"{where}: the loop {warp.var.name} over the warps (threadIdx.z) must have a multiple of "
                            "4 iterations: a warpgroup is four warps")
    tiles = 1
    if nj is not None:
        if not isinstance(nj.extent, ir.Const) or not ir.is_const(simplify_expr(nj.lo), 0):
            raise LoweringError(f"{where}: the loop {nj.var.name} over the warp's column tiles needs a constant range "
                                "from 0")
        tiles = int(nj.extent.value)
    n = 8 * tiles
    if n not in SHAPES_N:
        raise LoweringError(f"{where}: a warp owns {n} columns; wgmma.m64nNk16 takes N = 8..256")
    iv, jv, kv = nest.names
    w = warp.var.name
    col = nj.var.name if nj is not None else None
    acc = ir.Load(nest.store.buffer, nest.store.index)
    fixed = {iv, jv, kv, w} | ({col} if col else set())
    envs = _samples(_free([acc, nest.a, nest.b], fixed), bounds)
    nwarps = int(warp.extent.value)
    groups = sorted({0, nwarps - 4, (nwarps // 8) * 4})

    # the accumulator: the warp's whole fragment, its column tiles one after the other (128 values
    # each before the lanes take their slices: 4 per lane)
    for env in envs:
        for g in groups:
            for tile in range(tiles):
                place = {**env, w: g, iv: 0, jv: 0, kv: 0, **({col: tile} if col else {})}
                if _flat(acc, place) != 128 * tile:
                    raise LoweringError(f"{where}: the accumulator {acc.buffer.name} must hold exactly the warp's "
                                        f"16×{n} tile (each warp owns 16 rows: split the rows by 16 for the warps)")
    size = 1
    for d in acc.buffer.shape:
        size *= int(d.value) if isinstance(d, ir.Const) else 0
    if size != 128 * tiles:
        raise LoweringError(f"{where}: the accumulator {acc.buffer.name} holds {size} values, the warp's 16×{n} "
                            f"tile is {128 * tiles}; each warp must own 16 rows")

    # A: 64 rows (four warps of 16) × 16 k; B: 16 k × N columns, the same for the four warps
    def a_at(g: int):  # noqa: ANN202 - a placement function
        return lambda r, c: {w: g + r // 16, iv: r % 16, kv: c}

    def b_at(g: int):  # noqa: ANN202
        return lambda r, c: {w: g, kv: r, jv: c % 8, **({col: c // 8} if col else {})}

    a_strides, b_strides = set(), set()
    for g in groups:
        a_strides.add(_check_layout(nest.a, a_at(g), 64, 16, envs, where))
        b_strides.add(_check_layout(nest.b, b_at(g), 16, n, envs, where))
        for env in envs:
            base = _flat(nest.b, {**env, **b_at(g)(0, 0)})
            if any(_flat(nest.b, {**env, **b_at(g + d)(0, 0)}) != base for d in range(1, 4)):
                raise LoweringError(f"{where}: the four warps of a warpgroup must read the same tile of "
                                    f"{nest.b.buffer.name}")
    (sbo_a, lbo_a), (sbo_b, lbo_b) = a_strides.pop(), b_strides.pop()
    # K-major A: SBO between 8-row groups, LBO between the two 8-column (k) groups (unused when
    # swizzled: 16); N-major B: unswizzled, LBO between the two 8-row (k) groups and SBO between
    # 8-column (n) groups; swizzled, SBO between 8-row (k) groups and LBO between 64-column groups
    if not nest.b.buffer.swizzle:
        sbo_b, lbo_b = lbo_b, sbo_b
    if nest.a.buffer.swizzle:
        lbo_a = 16
    if nest.b.buffer.swizzle and n <= 64:
        lbo_b = 16

    group_base = ir.BinOp("*", ir.const(4), ir.BinOp("div", warp.var, ir.const(4)))
    origin = {iv: ir.const(0), jv: ir.const(0), kv: ir.const(0), **({col: ir.const(0)} if col else {})}
    a0 = ir.Load(nest.a.buffer, tuple(simplify_expr(ir.substitute(x, {**origin, w: group_base}))  # type: ignore[misc]
                                      for x in nest.a.index))
    b0 = ir.Load(nest.b.buffer, tuple(simplify_expr(ir.substitute(x, origin)) for x in nest.b.index))  # type: ignore[misc]
    acc0 = ir.Load(acc.buffer, tuple(simplify_expr(ir.substitute(x, origin)) for x in acc.index))  # type: ignore[misc]
    mode = {0: 0, 128: 1}  # the descriptor's layout type: interleaved (none), 128-byte swizzle
    return _call(f"pt_wgmma_m64n{n}k16_{nest.suffix}", acc0, a0, b0, ir.const(lbo_a), ir.const(sbo_a),
                 ir.const(mode[nest.a.buffer.swizzle]), ir.const(lbo_b), ir.const(sbo_b),
                 ir.const(mode[nest.b.buffer.swizzle]))


def wgmma_group(body: ir.Stmt) -> ir.Stmt:
    """``body`` (the K steps of one tile) issued as one asynchronous group and waited for."""
    return ir.block([_call("pt_wgmma_fence"), body, _call("pt_wgmma_commit"),
                     _call("pt_wgmma_wait", ir.const(0))])


def uses_wgmma(s: ir.Stmt) -> bool:
    return any(isinstance(e, ir.Call) and e.name.startswith("pt_wgmma_m64") for e in ir.all_exprs(s))


def async_proxy_fences(s: ir.Stmt) -> ir.Stmt:
    """In kernels that use wgmma, ``fence.proxy.async`` before every barrier: what the threads wrote
    to shared memory (``cp.async`` or stores) becomes visible to the instruction's async-proxy reads."""
    fence = _call("pt_fence_proxy_async")

    def barriers(st: ir.Stmt) -> ir.Stmt | None:
        if isinstance(st, ir.Evaluate) and st.call.name == "__syncthreads":
            return ir.block([fence, st])
        return None

    def visit(st: ir.Stmt) -> ir.Stmt | None:
        if isinstance(st, ir.Kernel) and uses_wgmma(st.body):
            return replace(st, body=ir.map_stmts(st.body, barriers))
        return None
    return ir.map_stmts(s, visit)


def _swizzled(e: ir.Expr, buf: ir.Buffer) -> ir.Expr:
    """Element offset ``e`` of ``buf`` with its 16-byte chunk XOR-ed by its row's number modulo 8."""
    unit = 16 // buf.dtype.itemsize
    row = buf.swizzle // buf.dtype.itemsize
    if isinstance(e, ir.Ramp):
        if not ir.is_const(e.stride, 1) or e.lanes > unit:
            raise LoweringError(f"a vector access of {e.lanes} elements of swizzled buffer {buf.name} crosses a "
                                "16-byte chunk")
        return ir.Ramp(_swizzled(e.base, buf), e.stride, e.lanes)
    chunk = ir.BinOp("*", ir.BinOp("mod", ir.BinOp("div", e, ir.const(row)), ir.const(8)), ir.const(unit))
    return ir.BinOp("^", e, chunk)


class _Swizzle(ir.Mutator):
    def visit_Load(self, e: ir.Load) -> ir.Expr:
        idx = tuple(self.expr(i) for i in e.index)
        if e.buffer.swizzle:
            (i,) = idx
            idx = (_swizzled(i, e.buffer),)
        return ir.Load(e.buffer, idx)

    def visit_Store(self, s: ir.Store) -> ir.Stmt:
        idx = tuple(self.expr(i) for i in s.index)
        if s.buffer.swizzle:
            (i,) = idx
            idx = (_swizzled(i, s.buffer),)
        return ir.Store(s.buffer, idx, self.expr(s.value))

    def visit_Evaluate(self, s: ir.Evaluate) -> ir.Stmt:
        if s.call.name.startswith("pt_wgmma_m64"):
            return s  # the descriptors hold the unswizzled address: the hardware applies the swizzle
        return self.default_stmt(s)


def swizzle_shared(s: ir.Stmt) -> ir.Stmt:
    """Apply the swizzle of every swizzled buffer to its (flat) accesses: the last pass that touches
    indices, so that the passes before it see the layout's affine offsets."""
    return _Swizzle().stmt(s)


def wgmma_header(source: str) -> str:
    """Definitions of the wgmma instructions ``source`` calls (one per N and operand type)."""
    import re
    out = []
    for n, t in sorted({(int(m.group(1)), m.group(2)) for m in re.finditer(r"pt_wgmma_m64n(\d+)k16_(f16|bf16)\(",
                                                                         source)}):
        regs = n // 2
        d = ", ".join(f"%{i}" for i in range(regs))
        outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
        out.append(
            f"__device__ __forceinline__ void pt_wgmma_m64n{n}k16_{t}(float* d, const void* a, const void* b, "
            "int lbo_a, int sbo_a, int mode_a, int lbo_b, int sbo_b, int mode_b) {\n"
            "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
            "  const unsigned long long da = pt_wgmma_desc(a, lbo_a, sbo_a, mode_a);\n"
            "  const unsigned long long db = pt_wgmma_desc(b, lbo_b, sbo_b, mode_b);\n"
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"\n'
            f'               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{d}}}, %{regs}, %{regs + 1}, p, '
            '1, 1, 0, 1;\\n}\\n"\n'
            f'               : {outs}\n'
            '               : "l"(da), "l"(db), "r"(1));\n'
            "#else\n"
            "  __trap();  // wgmma needs sm_90a\n"
            "#endif\n"
            "}")
    return "\n".join(out) + ("\n" if out else "")
