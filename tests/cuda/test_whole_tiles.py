"""The whole-tiles pass (lowering/passes/whole_tiles.py) on loop IR written by hand: a region of
register products over whole tiles runs over full constant loops without tests; anything it cannot
prove harmless is left as isl cut it."""

from polytile import dtypes
from polytile.lowering import loopir as ir
from polytile.lowering.passes.whole_tiles import whole_tiles

F32 = dtypes.as_dtype("float32")
ACC = ir.Buffer("acc", F32, (ir.const(4),), "local")
TILE = ir.Buffer("tile", F32, (ir.const(8), ir.const(4)), "shared")
OTHER = ir.Buffer("other", F32, (ir.const(8), ir.const(4)), "shared")
A = ir.Buffer("A", F32, (ir.const(100), ir.const(4)), "arg")
n, k, tx = ir.Var("n"), ir.Var("k"), ir.Var("tx")


def _products(src: ir.Buffer, guard: ir.Expr) -> ir.Stmt:
    """for tx in [0, 4): for k in [0, min(7, n) + 1): if guard: acc[tx] += src[k, tx]"""
    acc = ir.Load(ACC, (tx,))
    body = ir.If(guard, ir.Store(ACC, (tx,), ir.BinOp("+", acc, ir.Load(src, (k, tx)))))
    inner = ir.For(k, ir.const(0), ir.BinOp("+", ir.BinOp("min", ir.const(7), n), ir.const(1)), body, "unroll")
    return ir.For(tx, ir.const(0), ir.const(4), inner, "threadIdx.x")


def _text(s: ir.Stmt) -> str:
    return ir.stmt_text(s)


def test_products_over_whole_tiles_run_full_without_tests():
    out = whole_tiles(_products(TILE, ir.Cmp("<", tx, n)), {"tile"}, {"acc"})
    text = _text(out)
    assert "for unroll k in [0, 8)" in text and "if" not in text


def test_regions_that_read_other_memory_are_left_alone():
    before = _products(OTHER, ir.Cmp("<", tx, n))  # not a whole (zero-filled) tile
    assert _text(whole_tiles(before, {"tile"}, {"acc"})) == _text(before)
    before = _products(A, ir.Cmp("<", tx, n))  # global memory
    assert _text(whole_tiles(before, {"tile", "A"}, {"acc"})) == _text(before)
    before = _products(TILE, ir.Cmp("<", tx, n))  # no whole accumulator
    assert _text(whole_tiles(before, {"tile"}, set())) == _text(before)


def test_a_statement_cut_in_two_pieces_is_left_alone():
    # isl may emit one statement twice, for two parts of the domain: without their tests both
    # copies would run over the whole range and add every product twice
    acc = ir.Load(ACC, (tx,))
    upd = ir.Store(ACC, (tx,), ir.BinOp("+", acc, ir.Load(TILE, (k, tx))))
    body = ir.block([ir.If(ir.Cmp("<", k, n), upd), ir.If(ir.Cmp(">=", k, n), upd)])
    before = ir.For(tx, ir.const(0), ir.const(4), ir.For(k, ir.const(0), ir.const(8), body, "unroll"),
                    "threadIdx.x")
    assert _text(whole_tiles(before, {"tile"}, {"acc"})) == _text(before)


def test_accesses_outside_the_buffers_keep_the_tests():
    # the full range of k (0..8) would read tile[k + 1, …] past its 8 rows
    acc = ir.Load(ACC, (tx,))
    body = ir.If(ir.Cmp("<", k, n), ir.Store(ACC, (tx,), ir.BinOp("+", acc, ir.Load(
        TILE, (ir.BinOp("+", k, ir.const(1)), tx)))))
    before = ir.For(tx, ir.const(0), ir.const(4), ir.For(k, ir.const(0), ir.BinOp(
        "+", ir.BinOp("min", ir.const(7), n), ir.const(1)), body, "unroll"), "threadIdx.x")
    assert _text(whole_tiles(before, {"tile"}, {"acc"})) == _text(before)
