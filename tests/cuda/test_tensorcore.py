"""Tensor cores without a GPU: the tensorize primitive's checks, and the generated kernels for sm_80
and sm_90a (compiled by nvcc) use ldmatrix, mma.sync (HMMA), cp.async (LDGSTS) with the registers
indexed by constants only."""

import re
import subprocess
import tempfile

import pytest
from source_text import body, header

import polytile as pt
from polytile import ops
from polytile.errors import ScheduleError
from polytile.ops.gpu_schedules import gemm_tensorcore


def _hgemm(M, N, K, dtype="float16", acc="float32", b_transposed=False):
    A = pt.placeholder((M, K), dtype, "A")
    B = pt.placeholder((N, K) if b_transposed else (K, N), dtype, "B")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(
        A[i, k].astype(acc) * (B[j, k] if b_transposed else B[k, j]).astype(acc), axis=k), "C")
    return pt.Func([A, B], [C], name="hgemm")


def _sass_ops(cubin: bytes) -> dict[str, int]:
    text = _sass_text(cubin)
    counts: dict[str, int] = {}
    for op in re.findall(r"\b(HGMMA|HMMA|LDGSTS|LDSM|LDL|STL)\b", text):
        counts[op] = counts.get(op, 0) + 1
    return counts


# --- the primitive's checks ------------------------------------------------------------------------

def _tiled(func, *, fragment=True, shared=True):
    s = pt.Schedule(func)
    st = s["C"]
    st.split("i", 64, "bi", "i1").split("j", 64, "bj", "j1")
    st.split("i1", 16, "mi", "i3").split("j1", 8, "nj", "j3")
    st.split("k", 32, "ko", "k1").split("k1", 16, "kk", "k3")
    st.reorder("bi", "bj", "ko", "kk", "mi", "nj", "i3", "j3", "k3")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x")
    if shared:
        st.cache("A", "ko", loc="shared", pad=(0, 8)).cache("B", "ko", loc="shared", pad=(0, 8))
    if fragment:
        st.cache_write("bj", loc="fragment")
    return s


def test_tensorize_accepts_the_matching_nest():
    s = _tiled(_hgemm(100, 100, 100))
    s["C"].tensorize("i3")
    assert s["C"].state.tags["i3"] == "mma_m16n8k16"  # the intrinsic's name: the lowering looks it up


def test_tensorize_needs_16_bit_operands():
    with pytest.raises(ScheduleError, match="float16 or bfloat16"):
        _tiled(_hgemm(64, 64, 64, dtype="float32"))["C"].tensorize("i3")


def test_tensorize_needs_float32_accumulation():
    with pytest.raises(ScheduleError, match="accumulates in float32"):
        _tiled(_hgemm(64, 64, 64, acc="float16"))["C"].tensorize("i3")


def test_tensorize_needs_the_intrinsic_extents():
    s = pt.Schedule(_hgemm(64, 64, 64))
    st = s["C"]
    st.split("i", 32, "io", "i3").split("j", 8, "jo", "j3").split("k", 16, "ko", "k3")
    st.reorder("io", "jo", "ko", "i3", "j3", "k3").cache_write("jo", loc="fragment")
    with pytest.raises(ScheduleError, match="must run over 0..15"):
        st.tensorize("i3")


def test_tensorize_needs_the_innermost_loops_in_mnk_order():
    s = pt.Schedule(_hgemm(64, 64, 64))
    st = s["C"]
    st.split("i", 16, "io", "i3").split("j", 8, "jo", "j3").split("k", 16, "ko", "k3")
    st.reorder("io", "jo", "ko", "j3", "i3", "k3").cache_write("jo", loc="fragment")
    with pytest.raises(ScheduleError):
        st.tensorize("j3")
    with pytest.raises(ScheduleError, match="third innermost"):
        st.tensorize("i3")


def test_tensorize_needs_a_fragment_accumulator_and_shared_operands():
    with pytest.raises(ScheduleError, match="fragment cache"):
        _tiled(_hgemm(64, 64, 64), fragment=False)["C"].tensorize("i3")
    with pytest.raises(ScheduleError, match="in shared memory first"):
        _tiled(_hgemm(64, 64, 64), shared=False)["C"].tensorize("i3")


def test_tensorize_rejects_a_domain_that_is_not_a_box():
    A = pt.placeholder((64, 64), "float16", "A")
    B = pt.placeholder((64, 64), "float16", "B")
    k = pt.reduce_axis(64, "k")
    C = pt.compute((64, 64), lambda i, j: pt.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k,
                                                   where=k <= i), "C")
    s = _tiled(pt.Func([A, B], [C], name="tri"))
    with pytest.raises(ScheduleError, match="not a box"):
        s["C"].tensorize("i3")


def test_tensorize_accepts_a_last_chunk_that_ends_with_the_tensors():
    # chunks of 64 over K = 100: the last chunk's k < 36 cuts the domain (not a box), but the box's
    # extra instances read A and B past K, where the whole tiles hold zeros
    A = pt.placeholder((64, 100), "float16", "A")
    B = pt.placeholder((100, 64), "float16", "B")
    k = pt.reduce_axis(64, "k")
    P = pt.compute((2, 64, 64), lambda s, i, j: pt.sum(A[i, 64 * s + k].astype("float32")
                                                       * B[64 * s + k, j].astype("float32"), axis=k,
                                                       where=64 * s + k < 100), "C")
    sched = _tiled(pt.Func([A, B], [P], name="chunks"))
    sched["C"].tensorize("i3")
    # a cut that ends inside the tensors is refused: the whole tiles would add A[i, 90..99] · B[90..99, j]
    P = pt.compute((2, 64, 64), lambda s, i, j: pt.sum(A[i, 64 * s + k].astype("float32")
                                                       * B[64 * s + k, j].astype("float32"), axis=k,
                                                       where=64 * s + k < 90), "C")
    with pytest.raises(ScheduleError, match="not a box"):
        _tiled(pt.Func([A, B], [P], name="cut"))["C"].tensorize("i3")


def test_fragment_caches_are_write_caches():
    s = pt.Schedule(_hgemm(64, 64, 64))
    with pytest.raises(ScheduleError, match="accumulator of a tensorized computation"):
        s["C"].cache("A", "i", loc="fragment")


def test_unknown_intrinsic():
    with pytest.raises(ScheduleError, match="unknown intrinsic"):
        _tiled(_hgemm(64, 64, 64))["C"].tensorize("i3", "wmma_m16n16k16")


# --- generated code -----------------------------------------------------------------------------------

@pytest.mark.needs_nvcc
@pytest.mark.parametrize("arch,dtype", [("sm_90a", "float16"), ("sm_80", "bfloat16")])
def test_tensor_core_gemm_sass(arch, dtype):
    s = pt.Schedule(_hgemm(512, 512, 512, dtype))
    gemm_tensorcore(s, "C", "A", "B", stages=3)
    kern = pt.build(s, f"cuda:{arch}")
    src = body(kern.source)
    assert "pt_ldmatrix_a(" in src and "pt_ldmatrix_b_trans_x4(" in src
    assert f"pt_mma_m16n8k16_{'f16' if dtype == 'float16' else 'bf16'}(" in src
    assert "pt_cp_async16(" in src and "pt_cp_async_wait<1>()" in src
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in header(kern.source)  # defined because called
    (res,) = kern.resources.values()
    assert res.spill_stores == 0 and res.stack_bytes == 0  # fragments live in registers
    sass = _sass_ops(kern.cubin)
    assert sass.get("HMMA", 0) >= 64 and sass.get("LDGSTS", 0) > 0 and sass.get("LDSM", 0) > 0
    assert not sass.get("LDL") and not sass.get("STL")


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_tensor_core_gemm_of_a_transposed_b(arch):
    # B stored [n][k] (a linear layer's weight): its tiles are copied as stored and its fragments
    # loaded by ldmatrix without .trans, as A's (LDSM, never LDSM.T)
    s = pt.Schedule(_hgemm(128, 768, 768, b_transposed=True))
    gemm_tensorcore(s, "C", "A", "B", bk=64, stages=3, reg_stages=2)
    kern = pt.build(s, f"cuda:{arch}")
    src = body(kern.source)
    assert "pt_ldmatrix_b_x4(" in src and "pt_ldmatrix_b_trans" not in src
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in header(kern.source)
    (res,) = kern.resources.values()
    assert res.spill_stores == 0 and res.stack_bytes == 0
    sass = _sass_ops(kern.cubin)
    assert sass.get("HMMA", 0) >= 64 and sass.get("LDGSTS", 0) > 0 and sass.get("LDSM", 0) > 0
    assert not sass.get("LDL") and not sass.get("STL")
    assert "LDSM.16.MT88" not in _sass_text(kern.cubin)


def _sass_text(cubin: bytes) -> str:
    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout


@pytest.mark.needs_nvcc
def test_tensor_core_edges_zero_fill():
    # K = 200: the last K tile is cut; rows are whole 16-byte vectors, so the copies stay
    # asynchronous and zero-fill what lies past the end
    s = pt.Schedule(_hgemm(300, 264, 200))
    gemm_tensorcore(s, "C", "A", "B", stages=4)
    src = body(pt.build(s, "cuda:sm_90a").source)
    assert "pt_cp_async16_zfill(" in src
    assert "pt_cp_async_wait<2>()" in src
    assert "< 300) && (" in src or "< 300)" in src  # the write-back tests the rows


@pytest.mark.needs_nvcc
def test_operator_library_uses_tensor_cores_for_16_bit_inputs():
    src = body(ops.matmul(256, 256, 256, "float16").build("cuda:sm_90a").source)
    assert "pt_wgmma_m64n64k16_f16(&" in src and "pt_mma_" not in src  # Hopper: warpgroup MMA
    src = body(ops.batch_matmul(4, 128, 128, 64, "bfloat16").build("cuda:sm_80").source)
    assert "pt_mma_m16n8k16_bf16(&" in src and "pt_wgmma" not in src


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_implicit_gemm_convolutions_gather_with_zero_filling_copies(arch):
    """ResNet-50's 3×3 layer and a 3-D convolution: the gathered input is never stored, the shared
    copies read the input (zero-filled in the padding), tensor cores and pipelining as for GEMMs; the
    fused tap/channel loop leaves every operand index affine (no selects in the mma nest)."""
    for op in (ops.conv2d_igemm(32, 14, 14, 256, 256, 3, 3, 1, 1),
               ops.conv3d_igemm(2, 8, 14, 14, 64, 64, 3, 3, 3, 1, 1)):
        kern = op.build(f"cuda:{arch}")
        src = body(kern.source)
        assert "col[" not in src and "pt_cp_async16_zfill(" in src
        assert "pt_cp_async_wait<1>()" in src  # mma.sync: three stages; wgmma: four, one group in flight
        sass = _sass_ops(kern.cubin)
        if arch == "sm_90a":  # the default on Hopper: warpgroup MMA
            assert "pt_wgmma_m64n" in src and sass.get("HGMMA", 0) >= 4 and sass.get("LDGSTS", 0) > 0
        else:
            assert "pt_mma_m16n8k16_f16(&" in src
            assert sass.get("HMMA", 0) >= 16 and sass.get("LDGSTS", 0) > 0 and sass.get("LDSM", 0) > 0
        assert not sass.get("LDL") and not sass.get("STL")
