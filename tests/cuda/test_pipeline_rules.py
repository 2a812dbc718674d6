"""ALCOP's pipelining without a GPU: the three rules' rejections (each with its reason), the lowering's
own refusals, and the golden loop IR of ALCOP's Fig. 7 example — a tensor-core GEMM with a 3-stage
shared-memory pipeline and a 2-stage register pipeline fused into it (the inner prologue inside the
outer loop, fragments of the next tile loaded in the last K step of the current one).

Regenerate the golden file after a reviewed change with POLYTILE_REGEN_GOLDEN=1.
"""

import os
from pathlib import Path

import pytest

import polytile as pt
from polytile.errors import LoweringError, ScheduleError
from polytile.ops.gpu_schedules import gemm_tensorcore

GOLDEN = Path(__file__).parent / "golden"


def _hgemm(M, N, K, dtype="float16"):
    A = pt.placeholder((M, K), dtype, "A")
    B = pt.placeholder((K, N), dtype, "B")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), "C")
    return pt.Func([A, B], [C], name="hgemm")


def _tiled(M=128, N=128, K=256, loc="shared"):
    s = pt.Schedule(_hgemm(M, N, K))
    st = s["C"]
    st.split("i", 64, "bi", "i1").split("j", 64, "bj", "j1")
    st.split("i1", 16, "mi", "i3").split("j1", 8, "nj", "j3")
    st.split("k", 32, "ko", "k1").split("k1", 16, "kk", "k3")
    st.reorder("bi", "bj", "ko", "kk", "mi", "nj", "i3", "j3", "k3")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x")
    st.cache("A", "ko", loc=loc, pad=(0, 8), name="A_shared").cache("B", "ko", loc=loc, pad=(0, 8), name="B_shared")
    return s


# --- rule 1: the buffer is filled by a copy that can be asynchronous ----------------------------------

def test_a_write_cache_is_not_pipelined():
    s = _tiled()
    s["C"].cache_write("bj", loc="local", name="C_acc")
    with pytest.raises(ScheduleError, match="C_acc: it is a write cache"):
        s["C"].pipeline("C_acc", 2)


def test_a_buffer_in_global_memory_is_not_pipelined():
    s = _tiled(loc="global")
    with pytest.raises(ScheduleError, match="A_shared: it lives in global memory"):
        s["C"].pipeline("A_shared", 3)


# --- rule 2: inside a sequential load-use loop ------------------------------------------------------------

def test_a_cache_outside_every_loop_is_not_pipelined():
    s = pt.Schedule(_hgemm(64, 64, 64))
    s["C"].cache("A", None, loc="shared", name="A_all")
    with pytest.raises(ScheduleError, match="A_all: it is not inside a loop"):
        s["C"].pipeline("A_all", 2)


def test_a_load_use_loop_bound_to_threads_is_refused():
    s = pt.Schedule(_hgemm(128, 128, 64))
    st = s["C"]
    st.split("i", 64, "bi", "i1").bind("bi", "blockIdx.x")
    st.cache("A", "bi", loc="shared", name="A_blk")
    with pytest.raises(ScheduleError, match="its loop bi is bound to blockIdx.x; the load-use loop must be sequential"):
        st.pipeline("A_blk", 2)


def test_an_unrolled_load_use_loop_is_refused():
    s = _tiled()
    s["C"].unroll("ko")
    with pytest.raises(ScheduleError, match="its loop ko is marked unroll"):
        s["C"].pipeline("A_shared", 2)


def test_stage_counts_are_checked():
    s = _tiled()
    with pytest.raises(ScheduleError, match="stages must be an integer from 1 to 8"):
        s["C"].pipeline("A_shared", 9)
    with pytest.raises(ScheduleError, match="has no cache named 'X_shared'"):
        s["C"].pipeline("X_shared", 2)


# --- the register level -------------------------------------------------------------------------------------

def test_fragments_need_a_tensorized_nest_and_two_stages_at_most():
    s = _tiled()
    with pytest.raises(ScheduleError, match="A_shared_frag names no operand fragments of C"):
        s["C"].pipeline("A_shared_frag", 2)
    s["C"].cache_write("bj", loc="fragment").tensorize("i3")
    with pytest.raises(ScheduleError, match="register fragments take 1 or 2 stages"):
        s["C"].pipeline("A_shared_frag", 3)


# --- rule 3: producer and consumers synchronize in one scope (checked at lowering) ---------------------

def test_buffers_of_one_loop_must_agree_on_their_stages():
    s = _tiled()
    s["C"].cache_write("bj", loc="fragment").tensorize("i3")
    s["C"].pipeline("A_shared", 2).pipeline("B_shared", 3)
    with pytest.raises(LoweringError, match="ask for different"):
        pt.lower(s, "cuda:sm_90a")


# --- ALCOP Fig. 7: 3-stage shared + 2-stage register, fused --------------------------------------------------

def test_alcop_fig7_golden_ir():
    s = pt.Schedule(_hgemm(64, 64, 128))
    gemm_tensorcore(s, "C", "A", "B", bm=64, bn=64, wm=32, wn=32, bk=32, stages=3, reg_stages=2)
    got = str(pt.lower(s, "cuda:sm_90a")) + "\n"
    path = GOLDEN / "alcop_fig7.txt"
    if os.environ.get("POLYTILE_REGEN_GOLDEN"):
        path.write_text(got)
    expected = path.read_text()
    assert got == expected, "the pipelined IR changed; review it and regenerate with POLYTILE_REGEN_GOLDEN=1"
    # the structure the golden text shows, spelled out
    assert got.count("pt_cp_async_commit") >= 3  # two prologue stages and the steady state
    assert "pt_cp_async_wait(1)" in got  # stages - 2 groups may stay in flight
    assert "A_shared_frag" in got and "B_shared_frag" in got
