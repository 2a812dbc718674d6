"""Paired global stores (lowering/passes/pair_stores.py): the tensor-core write-back stores two
adjacent accumulators at once where the pair is provably adjacent, aligned and equally guarded."""

import polytile as pt
from polytile.lowering.passes.pair_stores import memory_accesses
from polytile.ops.gpu_schedules import gemm_tensorcore


def _hgemm(M, N, K):
    A = pt.placeholder((M, K), "float16", "A")
    B = pt.placeholder((K, N), "float16", "B")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), "C")
    s = pt.Schedule(pt.Func([A, B], [C], name="hgemm"))
    gemm_tensorcore(s, "C", "A", "B", bm=64, bn=64, wm=32, wn=32, bk=32, stages=2)
    return pt.lower(s, "cuda")


def _hgemm_ir(M, N, K):
    return str(_hgemm(M, N, K))


def test_fragment_write_back_is_paired():
    ir = _hgemm_ir(128, 128, 64)
    assert ir.count("pt_store_pair(C[") == 2  # rows r and r + 8 of each m16n8 accumulator
    assert "C[" not in ir.replace("pt_store_pair(C[", "")  # no scalar store of C is left


def test_a_paired_store_writes_its_buffer_and_does_not_read_it():
    """Kernel parameters (const or not) and the SASS optimizer's data flow rest on this."""
    written, read = memory_accesses(_hgemm(128, 128, 64).body)
    assert "C" in written and "C" not in read
    assert {"A", "B"} <= set(read) and not {"A", "B"} & set(written)


def test_odd_row_length_is_not_paired():
    """With 129 columns every other row starts at an odd element: a pair would be misaligned."""
    ir = _hgemm_ir(128, 129, 64)
    assert "pt_store_pair" not in ir
    assert "C[" in ir


def test_pairs_under_different_guards_are_paired_where_both_hold():
    """A partial column tile guards each column separately: the pair is stored where both columns are
    inside, each column under its own guard elsewhere (the tile's last columns)."""
    ir = _hgemm_ir(128, 100, 64)
    assert "pt_store_pair(C[" in ir
    assert "C[" in ir.replace("pt_store_pair(C[", "")
