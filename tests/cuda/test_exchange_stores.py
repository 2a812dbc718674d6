"""Whole-sector stores of 16-bit accumulator tiles (lowering/passes/exchange_stores.py).

The pass is checked against the write-back it replaces by running both on a simulated warp (32 lanes
in lock step, the shuffles exchanging between them): every element is written once, by the same
value, at every row length, partial tile and tile count — and only where the exchange is legal
(rows aligned, no lane-dependent control around it, whole warps). Then on the kernels of the
operators: the IR regrouped, and with nvcc, the SASS's 16-byte stores without local memory."""

import re

import numpy as np
import pytest

import polytile as pt
from polytile import dtypes, ops
from polytile.lowering import loopir as ir
from polytile.lowering.passes.exchange_stores import exchange_stores
from polytile.lowering.passes.kernels import thread_var
from polytile.target import CUDATarget

LANE = ir.Cast(dtypes.INDEX, thread_var("threadIdx.x"))
ID = 1 << 21  # a packed word of two element ids: first * ID + second


def _write_back(N, rows, cols, tiles, block=(32, 1, 1), around=None, dtype=dtypes.bfloat16):
    """The fragment write-back of one warp's 16 × 8·tiles accumulators into rows of N elements (the
    form the fragments pass leaves): row lane/4 (+8), columns 8·t + 2·(lane%4) (+1) + 8·tiles·bj,
    guarded by the matrix's ``rows`` × ``cols``."""
    t, p, q4, q5, bj = ir.Var("t"), ir.Var("p"), ir.Var("q4"), ir.Var("q5"), ir.Var("bj")
    C = ir.Buffer("C", dtype, (ir.const(rows * N),), "arg")
    acc = ir.Buffer("acc", dtypes.float32, (ir.const(4 * tiles),), "local")
    row = ir.BinOp("+", q4, ir.BinOp("*", ir.const(8), ir.BinOp("div", p, ir.const(2))))
    col = ir.BinOp("+", ir.BinOp("+", ir.BinOp("*", ir.const(8), t), ir.BinOp("*", ir.const(2), q5)),
                   ir.BinOp("+", ir.BinOp("mod", p, ir.const(2)), ir.BinOp("*", ir.const(8 * tiles), bj)))
    guard = ir.Logic("&&", (ir.Cmp("<", row, ir.const(rows)), ir.Cmp("<", col, ir.const(cols))))
    value = ir.Cast(dtype, ir.Load(acc, (ir.BinOp("+", ir.BinOp("*", ir.const(4), t), p),)))
    store = ir.Store(C, (ir.BinOp("+", ir.BinOp("*", row, ir.const(N)), col),), value)
    elem = ir.LetStmt(q4, ir.BinOp("div", LANE, ir.const(4)),
                      ir.LetStmt(q5, ir.BinOp("mod", LANE, ir.const(4)), ir.If(guard, store)))
    body: ir.Stmt = ir.For(t, ir.const(0), ir.const(tiles), ir.For(p, ir.const(0), ir.const(4), elem, "unroll"),
                           "unroll")
    if around is not None:
        body = ir.If(around, body)
    return ir.Kernel("k", (ir.const(1), ir.const(1), ir.const(1)), block, body)


class _Warp:
    """32 lanes running a kernel body in lock step; stores are recorded as {element: value id}."""

    def __init__(self, env):
        self.lane = np.arange(32)
        self.env = {"threadIdx.x": self.lane, **env}
        self.active = np.ones(32, bool)
        self.out: dict[int, int] = {}
        self.widths: set[int] = set()

    def ev(self, e):
        if isinstance(e, ir.Const):
            return np.full(32, int(e.value), np.int64)
        if isinstance(e, ir.Var):
            return np.broadcast_to(np.asarray(self.env[e.name], np.int64), (32,))
        if isinstance(e, ir.Cast):
            return self.ev(e.a)
        if isinstance(e, ir.BinOp):
            a, b = self.ev(e.a), self.ev(e.b)
            return {"+": a + b, "-": a - b, "*": a * b, "div": a // np.maximum(b, 1), "mod": a % np.maximum(b, 1),
                    "//": a // np.maximum(b, 1), "%": a % np.maximum(b, 1)}[e.op]
        if isinstance(e, ir.Cmp):
            a, b = self.ev(e.a), self.ev(e.b)
            return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[e.op].astype(
                np.int64)
        if isinstance(e, ir.Logic):
            vals = [self.ev(x) != 0 for x in e.args]
            return (np.logical_and.reduce(vals) if e.op == "&&" else np.logical_or.reduce(vals)).astype(np.int64)
        if isinstance(e, ir.Select):
            return np.where(self.ev(e.cond) != 0, self.ev(e.a), self.ev(e.b))
        if isinstance(e, ir.Load):
            assert e.buffer.scope == "local"
            return self.lane * 1000 + self.ev(e.index[0])
        if isinstance(e, ir.Call) and e.name.startswith("pt_pack_"):
            return self.ev(e.args[0]) * ID + self.ev(e.args[1])
        if isinstance(e, ir.Call) and e.name == "pt_shfl_xor":
            assert self.active.all(), "a shuffle with lanes inactive"
            return self.ev(e.args[0])[self.lane ^ int(e.args[1].value)]
        raise AssertionError(f"unexpected {e}")

    def _record(self, index, values):
        for lane in np.flatnonzero(self.active):
            for k, v in enumerate(values):
                at = int(index[lane]) + k
                assert at not in self.out, f"element {at} written twice"
                self.out[at] = int(v[lane])

    def run(self, s):
        if isinstance(s, ir.Block):
            for x in s.body:
                self.run(x)
        elif isinstance(s, ir.For):
            for i in range(int(s.lo.value), int(s.lo.value) + int(s.extent.value)):
                self.env[s.var.name] = i
                self.run(s.body)
        elif isinstance(s, ir.If):
            cond, saved = self.ev(s.cond) != 0, self.active
            self.active = saved & cond
            self.run(s.then)
            if s.orelse is not None:
                self.active = saved & ~cond
                self.run(s.orelse)
            self.active = saved
        elif isinstance(s, (ir.LetStmt, ir.Declare)):
            self.env[s.var.name] = self.ev(s.value)
            self.run(s.body)
        elif isinstance(s, ir.Store):
            self._record(self.ev(s.index[0]), [self.ev(s.value)])
        elif isinstance(s, ir.Evaluate) and s.call.name == "pt_store_packed":
            index, words = self.ev(s.call.args[0].index[0]), [self.ev(w) for w in s.call.args[1:]]
            assert (index[self.active] % (2 * len(words)) == 0).all(), "a misaligned vector store"
            self.widths.add(4 * len(words))
            self._record(index, [x for w in words for x in (w // ID, w % ID)])
        elif isinstance(s, ir.Evaluate) and s.call.name == "pt_store_packed_half":
            w, high = self.ev(s.call.args[1]), int(s.call.args[2].value)
            self._record(self.ev(s.call.args[0].index[0]), [w // ID if high == 0 else w % ID])
        else:
            raise AssertionError(f"unexpected {s}")


def _stores(kernel, blocks):
    out, widths = {}, set()
    for bj in range(blocks):
        warp = _Warp({"bj": bj})
        warp.run(kernel.body)
        assert not set(out) & set(warp.out)
        out.update(warp.out)
        widths |= warp.widths
    return out, widths


@pytest.mark.parametrize("N,rows,cols,tiles,width", [
    (64, 16, 64, 8, 16),  # whole tiles, 16-byte rows: 16-byte stores
    (72, 13, 72, 8, 16),  # rows and columns past the matrix's end (a partial block)
    (264, 9, 250, 4, 16),  # the last chunk of a row partly inside: words and halves under their own guards
    (100, 16, 100, 16, 8),  # rows of 200 bytes: aligned to 8 bytes only, pairs of tiles and 8-byte stores
    (96, 5, 90, 6, 8),  # 6 tiles: groups of 2
    (64, 16, 24, 3, 8),  # 3 tiles: one group of 2, the last tile as it was
    (40, 1, 40, 8, 16),  # a single row (M = 1)
])
def test_exchange_writes_what_the_write_back_writes(N, rows, cols, tiles, width):
    kernel = _write_back(N, rows, cols, tiles)
    out = exchange_stores(kernel)
    assert "pt_shfl_xor" in str(out)
    blocks = -(-cols // (8 * tiles))
    expected, _ = _stores(kernel, blocks)
    got, widths = _stores(out, blocks)
    assert got == expected
    assert width in widths and max(widths) == width
    assert len(expected) == rows * cols


@pytest.mark.parametrize("N,tiles", [(101, 8), (66, 8), (64, 1)])
def test_no_exchange_where_rows_or_tiles_do_not_allow(N, tiles):
    """Rows of an odd length (every other row starts at an odd element), or only 4-byte aligned ones,
    and a single tile keep the write-back as it was."""
    kernel = _write_back(N, 16, N, tiles)
    assert exchange_stores(kernel) is kernel


def test_no_exchange_under_lane_dependent_control_or_partial_warps():
    """Every lane of a warp takes part in each shuffle: nothing around the write-back may depend on the
    lane, and threadIdx.x must span whole warps."""
    inside = _write_back(64, 16, 64, 8, around=ir.Cmp("<", LANE, ir.const(16)))
    assert exchange_stores(inside) is inside
    narrow = _write_back(64, 16, 64, 8, block=(16, 2, 1))
    assert exchange_stores(narrow) is narrow
    uniform = _write_back(64, 16, 64, 8, block=(32, 4, 1), around=ir.Cmp("<", thread_var("threadIdx.y"), ir.const(3)))
    assert "pt_shfl_xor" in str(exchange_stores(uniform))


def test_float32_results_keep_their_pairs():
    """Float32 pairs already fill a sector per quad row (and int32 alike): only 16-bit outputs change."""
    kernel = _write_back(64, 16, 64, 8, dtype=dtypes.float32)
    assert exchange_stores(kernel) is kernel


SM90A, SM90 = CUDATarget(arch="sm_90a"), CUDATarget(arch="sm_90")
OPS = {
    "wgmma-batch": (lambda o: ops.batch_matmul(4, 300, 264, 128, "bfloat16", out_dtype=o), SM90A),
    "mma": (lambda o: ops.matmul(300, 264, 200, "float16", out_dtype=o), SM90),
    "igemm-wgmma": (lambda o: ops.conv2d_igemm(2, 13, 11, 64, 72, 3, 3, 1, 1, "float16", out_dtype=o), SM90A),
}


@pytest.mark.parametrize("name", list(OPS))
def test_operators_write_16bit_results_whole(name):
    make, target = OPS[name]
    op = make("float16" if name != "wgmma-batch" else "bfloat16")
    text = str(pt.lower(op.schedule(target), target))
    assert "pt_shfl_xor" in text and "pt_store_pair" not in text
    out = op.func.outputs[0].name
    assert re.search(rf"pt_store_packed\({out}\[[^\]]*\], \w+, \w+, \w+, \w+\)", text)  # 16 bytes a lane
    wide = str(pt.lower(make(None).schedule(target), target))
    assert "pt_shfl_xor" not in wide and "pt_store_pair" in wide


def test_odd_rows_keep_the_narrow_path():
    op = ops.matmul(345, 567, 789, "bfloat16", out_dtype="bfloat16")
    text = str(pt.lower(op.schedule(SM90), SM90))
    assert "pt_shfl_xor" not in text and "pt_store_packed" not in text


def test_a_tile_count_cut_short_is_rounded_up_to_whole_groups():
    """isl cuts the tile loop at the matrix's end (13 of a warp's 16 tiles for 100 columns in one
    block): the exchange runs over 16, the tiles past the loop reading registers that exist, and
    storing nothing."""
    kernel = _write_back(104, 16, 100, 16)
    loop = kernel.body
    cut = ir.Kernel(kernel.name, kernel.grid, kernel.block,
                    ir.For(loop.var, loop.lo, ir.const(13), loop.body, loop.kind))
    out = exchange_stores(cut)
    assert "pt_shfl_xor" in str(out)
    expected, _ = _stores(cut, 1)
    got, widths = _stores(out, 1)
    assert got == expected and widths >= {16}


def _shrink_registers(body, tiles):
    class Shrink(ir.Mutator):
        def visit_Load(self, e):
            return ir.Load(ir.Buffer(e.buffer.name, e.buffer.dtype, (ir.const(4 * tiles),), e.buffer.scope), e.index)
    return Shrink().stmt(body)


def test_tiles_past_the_whole_groups_keep_their_loop():
    """13 tiles whose registers hold no more: 12 exchanged (groups of 4), the last one as it was (the
    pair stores take it)."""
    kernel = _write_back(104, 16, 100, 16)
    loop = kernel.body
    cut = ir.Kernel(kernel.name, kernel.grid, kernel.block,
                    ir.For(loop.var, loop.lo, ir.const(13), _shrink_registers(loop.body, 13), loop.kind))
    out = exchange_stores(cut)
    assert "pt_shfl_xor" in str(out) and "for unroll t in [12, 12 + 1)" in str(out)
    expected, _ = _stores(cut, 1)
    got, widths = _stores(out, 1)
    assert got == expected and 16 in widths


def test_golden_exchange_ir():
    """The write-back of 4 tiles into rows of 72 elements before and after the pass (16-byte stores, a
    partial column chunk: 70 columns). Regenerate after a reviewed change with POLYTILE_REGEN_GOLDEN=1."""
    import os
    from pathlib import Path
    kernel = _write_back(72, 13, 70, 4)
    got = f"{kernel}\n--- exchange-stores ---\n{exchange_stores(kernel)}\n"
    path = Path(__file__).parent / "golden" / "exchange_stores.txt"
    if os.environ.get("POLYTILE_REGEN_GOLDEN"):
        path.write_text(got)
    assert got == path.read_text()


def _sass(cubin):
    import subprocess
    import tempfile

    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("name", ["wgmma-whole", "mma"])
def test_sass_has_16_byte_stores_and_no_local_memory(name):
    """Whole tiles (wgmma, 256 × 256 per product) and partial ones (mma.sync, 300 × 264): the 16-bit
    write-back stores 16 bytes a lane, exchanges by butterfly shuffles, keeps everything in registers and
    needs no more registers than the float32 one (a few more at most where partial chunks add edge code)."""
    make, target = {"wgmma-whole": (lambda o: ops.batch_matmul(2, 256, 256, 64, "bfloat16", out_dtype=o), SM90A),
                    "mma": OPS["mma"]}[name]
    half = make("float16" if name == "mma" else "bfloat16").build(target)
    wide = make(None).build(target)
    text = _sass(half.cubin)
    assert re.search(r"\bSTG\.E\.128\b", text) and re.search(r"\bSHFL\.BFLY\b", text)
    assert not re.search(r"\bLDL\b|\bSTL\b", text)
    if name == "wgmma-whole":  # nothing narrower than 16 bytes
        assert not re.search(r"\bSTG\.E(\.U16)?\s", text)
    regs = [max(r.registers for r in k.resources.values()) for k in (half, wide)]
    assert regs[0] <= regs[1] + 8, regs
