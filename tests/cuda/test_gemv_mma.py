"""GEMVs of 2 to 16 rows on mma.sync without a GPU (``gpu_schedules.gemv_mma``): the transposed
tensorize (the instruction's 16 rows over B's columns, its 8 columns over A's rows), what the default's
(``tensor_core_gemv``; ``POLYTILE_GEMV_MMA=0`` opts out) chooses from the operands and the target, the
tuning space (the default first, the mma kernel among its choices), and the machine code
nvcc makes for sm_90a and sm_80 (HMMA, transposed ldmatrix, 16-byte asynchronous copies, no FFMA, no
local memory) at sizes off the tiles. The numbers are checked on a GPU (test_gemv_mma_gpu.py)."""

import re
import subprocess
import tempfile

import pytest

import polytile as pt
from polytile import ops
from polytile.dtypes import as_dtype
from polytile.errors import ScheduleError
from polytile.ops.gpu_schedules import GEMV_MMA_VARIABLE, GEMV_ROWS, gemm_as, gemm_choice, gemv_mma
from polytile.target import CUDATarget

SM90A = CUDATarget(arch="sm_90a")
SM80 = CUDATarget(arch="sm_80")
needs_nvcc = pytest.mark.needs_nvcc


def _sass(kern, name: str) -> str:
    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kern.cubin)
        f.flush()
        text = subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout
    return text.split(f".text.{name}:")[1].split(".section")[0]


# --- the choice ------------------------------------------------------------------------------------

def _choice(target, M, N, K, dtype, **kw):
    return gemm_choice(target, M, N, K, as_dtype(dtype), tensor_core_gemv=True, **kw)


def _mma_build(M, N, K, dtype, target, out=None):
    """The kernel gemm_choice's opt-in picks (tensor_core_gemv=True), as the default's own code builds it."""
    op = ops.matmul(M, N, K, dtype, out_dtype=out)
    choice = _choice(target, M, N, K, dtype, out_bytes=op.func.tensor("C").dtype.itemsize)
    assert choice.kernel == "gemv_mma", choice
    sched = pt.Schedule(op.func)
    return pt.build(gemm_as(sched, choice, M, N, K) or sched, target), choice


def test_the_default_takes_the_tensor_cores_from_5_to_16_rows(monkeypatch):
    # measured on an H200 (2026-11-28, benchmarks/results/shapes-gpu-20261128-1720-h200-t8-*.json and
    # gemv_rows-20261128-1745-h200.json): the suite's 16-bit linear layers of 8 tokens 0.69-0.92x torch on
    # the CUDA cores' GEMV, 0.82-1.05x on gemv_mma; 2-4 rows 3-8% slower on it, 16 rows as fast or faster
    # than mma.sync's tile; POLYTILE_GEMV_MMA=0 keeps the others, =1 takes gemv_mma from 2 rows
    monkeypatch.delenv(GEMV_MMA_VARIABLE, raising=False)
    bf16 = as_dtype("bfloat16")
    assert gemm_choice(SM90A, 8, 6144, 4096, bf16).kernel == "gemv_mma"
    assert gemm_choice(SM90A, 5, 6144, 4096, bf16).kernel == "gemv_mma"
    assert gemm_choice(SM90A, 16, 6144, 4096, bf16).kernel == "gemv_mma"
    for M in (1, 2, 4):  # the CUDA cores' GEMV keeps up with up to 4 rows
        assert gemm_choice(SM90A, M, 6144, 4096, bf16).kernel == "gemv"
    assert gemm_choice(SM90A, 2, 6144, 4096, bf16, tensor_core_gemv=True).kernel == "gemv_mma"
    assert gemm_choice(SM90A, 8, 6144, 4096, as_dtype("float32")).kernel == "gemv"
    assert gemm_choice(SM90A, 8, 6144, 4096, bf16, tensor_core_gemv=False).kernel == "gemv"
    assert gemm_choice(SM90A, 16, 6144, 4096, bf16, tensor_core_gemv=True).kernel == "gemv_mma"
    assert "pt_mma_m16n8k16" in str(pt.lower(ops.matmul(8, 6144, 4096, "bfloat16").schedule(SM90A), SM90A))
    monkeypatch.setenv(GEMV_MMA_VARIABLE, "0")
    assert gemm_choice(SM90A, 8, 6144, 4096, bf16).kernel == "gemv"
    assert gemm_choice(SM90A, 16, 6144, 4096, bf16).kernel == "mma"
    monkeypatch.setenv(GEMV_MMA_VARIABLE, "1")
    assert gemm_choice(SM90A, 2, 6144, 4096, bf16).kernel == "gemv_mma"


@pytest.mark.parametrize("M", [2, 3, 5, 7, 8, 9, 13, GEMV_ROWS])
@pytest.mark.parametrize("target", [SM90A, SM80], ids=["sm_90a", "sm_80"])
def test_few_rows_of_16_bit_operands_take_the_tensor_cores(M, target):
    for dtype in ("bfloat16", "float16"):
        choice = _choice(target, M, 6144, 4096, dtype)
        assert choice.kernel == "gemv_mma", (M, dtype, choice)
        assert choice.params["bn"] % (16 * choice.params["warps"]) == 0


def test_the_cuda_core_gemv_keeps_what_mma_sync_cannot_read():
    # one row (the GEMV is at torch's speed there, 2026-11-28 tuned suite), float32, batched products,
    # B's rows not a multiple of 16 bytes (in place they take no 16-byte copies; a copy of B is a pass
    # over it), K shorter than the instruction's 16
    assert _choice(SM90A, 1, 6144, 4096, "bfloat16").kernel == "gemv"
    assert _choice(SM90A, 8, 6144, 4096, "float32").kernel == "gemv"
    assert _choice(SM90A, 8, 128, 2048, "float16", batch=32).kernel == "gemv"
    for N in (4097, 4098, 4100):
        assert _choice(SM90A, 8, N, 4096, "bfloat16").kernel == "gemv", N
    assert _choice(SM90A, 3, 8, 5, "bfloat16").kernel == "gemv"
    assert _choice(SM90A, GEMV_ROWS + 1, 4096, 4096, "bfloat16").kernel == "wgmma"


def test_a_given_split_takes_k_tiles_that_divide_its_chunks():
    # chunks of ⌈1000/3⌉ = 334 are no whole number of 16-wide K tiles: the CUDA cores' GEMV sums them;
    # chunks of 768 / 3 = 256 take the mma kernel in whole 64- or 128-wide tiles
    assert _choice(SM90A, 8, 256, 1000, "float16", split_k=3).kernel == "gemv"
    choice = _choice(SM90A, 8, 2048, 768, "float16", split_k=3)
    assert choice.kernel == "gemv_mma" and choice.split == 3 and 256 % choice.params["bk"] == 0


@pytest.mark.parametrize("dims", [(2, 8, 16), (16, 16, 16), (4, 24, 40), (8, 64, 17), (16, 1032, 33), (3, 8, 5)])
def test_tiny_products_build(dims, monkeypatch):
    # a block wider than the matrix, K of one instruction or less than one K tile (the CUDA cores' GEMV)
    monkeypatch.setenv(GEMV_MMA_VARIABLE, "1")
    text = str(pt.lower(ops.matmul(*dims, "bfloat16").schedule(SM90A), SM90A))
    assert ("pt_mma_m16n8k16" in text) == (dims[2] >= 16)


def test_the_split_fills_a_smaller_gpu_with_fewer_chunks():
    # the chunks of K are chosen from the target's SMs: a GPU of 16 SMs needs fewer to be busy
    small = CUDATarget(arch="sm_90a", sms=16)
    assert _choice(small, 8, 4096, 14336, "bfloat16").split <= _choice(SM90A, 8, 4096, 14336, "bfloat16").split


# --- the schedule ----------------------------------------------------------------------------------

def test_tensorize_takes_the_nest_transposed():
    s = pt.Schedule(ops.matmul_func(8, 512, 256, "bfloat16"))
    gemv_mma(s, "C", "A", "B", bn=128, warps=4, bk=64, stages=2)
    assert s["C"].state.tags["j3"] == "mma_m16n8k16"
    frag = next(c for c in s.caches if c.loc == "fragment")
    assert frag.whole == (8, 16)  # the instruction's 16 × 8 tile is 8 rows × 16 columns of C
    text = str(pt.lower(s, SM90A))
    # B's [k][j] tile is the instruction's A operand, loaded transposed; A's [i][k] rows its B operand
    assert "pt_ldmatrix_a_trans(" in text and "pt_ldmatrix_b(" in text and "pt_mma_m16n8k16_bf16(" in text
    # the accumulator's lane (g, t) = (lane / 4, lane % 4) holds rows 2t, 2t + 1 of C (the instruction's
    # columns) at columns g and g + 8 (its rows): C_local[1] one row (512 elements) further, [2] 8 columns
    from polytile.codegen.cuda import cuda_source
    from polytile.lowering.pipeline import lower
    from polytile.runtime.cuda import index32_ok
    low = lower(s, SM90A)
    source = cuda_source(low, index32_ok(low))[0]
    stores = [line.strip() for line in source.splitlines() if "= C_local[" in line]
    base = "(((C_local_q3 + (1024 * C_local_q4)) + (128 * bj)) + (32 * wj))"
    assert stores[:4] == [f"C[{base}] = C_local[0];", f"C[({base} + 512)] = C_local[1];",
                          f"C[({base} + 8)] = C_local[2];", f"C[({base} + 520)] = C_local[3];"]
    assert "const int C_local_q3 = (((int)((int)threadIdx.x)) / 4);" in source
    assert "const int C_local_q4 = (((int)((int)threadIdx.x)) % 4);" in source


def test_tensorize_refuses_a_nest_that_is_neither_way():
    s = pt.Schedule(ops.matmul_func(64, 64, 64, "float16"))
    st = s["C"]
    st.split("i", 16, "io", "i3").split("j", 8, "jo", "j3").split("k", 16, "ko", "k3")
    st.reorder("io", "jo", "ko", "j3", "i3", "k3").cache_write("jo", loc="fragment")
    with pytest.raises(ScheduleError, match="must run over 0..15"):
        st.tensorize("j3")  # transposed, the instruction's 16 rows would be 8 columns


def test_gemv_mma_needs_whole_warp_tiles():
    s = pt.Schedule(ops.matmul_func(8, 512, 256, "bfloat16"))
    with pytest.raises(ScheduleError, match="multiple of 16 columns"):
        gemv_mma(s, "C", "A", "B", bn=96, warps=4)


# --- machine code ----------------------------------------------------------------------------------

@needs_nvcc
@pytest.mark.parametrize("target", [SM90A, SM80], ids=["sm_90a", "sm_80"])
@pytest.mark.parametrize("dims,dtype", [((8, 6144, 4096), "bfloat16"), ((3, 1000, 1999), "float16"),
                                        ((5, 4096, 1003), "bfloat16"), ((7, 776, 769), "float16"),
                                        ((13, 3072, 768), "bfloat16"), ((16, 4096, 4096), "bfloat16")])
def test_gemv_mma_machine_code(target, dims, dtype):
    M, N, K = dims
    kern, _ = _mma_build(M, N, K, dtype, target, out=dtype)
    main = next(k for k in kern.kernels if "pt_mma_m16n8k16" in kern.source.split(f"{k.name}(")[1].split("\n}\n")[0])
    sass = _sass(kern, main.name)
    assert "HMMA.16816" in sass and "LDSM.16.MT88.4" in sass  # the weight's tile, transposed
    assert "LDGSTS.E.BYPASS.128" in sass  # B in 16-byte asynchronous copies
    assert "FFMA" not in sass and not re.search(r"\bLDL\b|\bSTL\b", sass)
    assert main.block == (32, main.block[1], 1)
    instructions = len(re.findall(r"/\*[0-9a-f]{4}\*/", sass))
    assert instructions < 4096, instructions
    assert kern.resources[main.name].spill_stores == 0


def test_the_template_starts_at_the_default_and_offers_the_mma_kernel(monkeypatch):
    from polytile.lowering.pipeline import lower
    from polytile.tune import make_task
    monkeypatch.setenv(GEMV_MMA_VARIABLE, "0")
    op = ops.matmul(8, 6144, 4096, "bfloat16", out_dtype="bfloat16")
    task = make_task(op, SM90A)
    assert task.template.name == "matmul_gemv"
    default = task.space.default
    assert default.values["kernel"] == "cuda" and task.space.reason_invalid(default.digits) is None
    kernels = next(d for d in task.space.decisions if d.name == "kernel").choices
    assert set(kernels) == {"cuda", "mma", "tiles"}
    # "tiles" (batched products on mma.sync's 64×64 tiles) is refused for an unbatched product
    tiles = dict(default.values, kernel="tiles", threads=128, columns=32, vector=8, direct=False, bk=32)
    assert "batched product" in (task._check(tiles) or "")
    # the default's gemv_mma choice is a configuration of the space, built by the same code
    choice = _choice(SM90A, 8, 6144, 4096, "bfloat16", out_bytes=2)
    p = choice.params
    mma = dict(default.values, kernel="mma", threads=32 * p["warps"], columns=p["bn"] // p["warps"], bk=p["bk"],
               stages=p["stages"], vector=8, direct=False, split=choice.split)
    assert task._check(mma) is None
    sched = pt.Schedule(op.func)
    assert str(lower(task.schedule(mma), SM90A)) == str(lower(gemm_as(sched, choice, 8, 6144, 4096) or sched, SM90A))
    # by default, the space starts at the mma kernel
    monkeypatch.delenv(GEMV_MMA_VARIABLE)
    opted = make_task(op, SM90A)
    assert opted.space.default.values["kernel"] == "mma"
    assert str(lower(opted.schedule(opted.space.default.values), SM90A)) == str(lower(op.schedule(SM90A), SM90A))
    # configurations recorded before the kernel and columns knobs take the CUDA-core GEMV
    old = {k: v for k, v in default.values.items() if k not in ("kernel", "columns")}
    assert "pt_mma" not in str(lower(task.schedule(old), SM90A))


def _mma_configs(task, n, seed=0):
    """``n`` valid configurations of the space on the mma kernel (deterministic)."""
    import numpy as np
    found = []
    for digits in task.space.sample_valid(np.random.default_rng(seed), 400):
        values = task.space.config(digits).values
        if values["kernel"] == "mma":
            found.append(values)
        if len(found) == n:
            return found
    raise AssertionError(f"fewer than {n} valid mma configurations among 400")


@pytest.mark.parametrize("dims,dtype", [((5, 1000, 1003), "bfloat16"), ((13, 776, 3001), "float16")])
def test_the_space_s_mma_configurations_are_gemv_mma(dims, dtype):
    # what the tuner draws on the mma kernel lowers to the transposed tensor-core GEMV, at sizes off the tiles
    from polytile.tune import make_task
    task = make_task("matmul", SM90A, M=dims[0], N=dims[1], K=dims[2], dtype=dtype)
    for values in _mma_configs(task, 3):
        text = str(pt.lower(task.schedule(values), SM90A))
        assert "pt_ldmatrix_a_trans(" in text and "pt_mma_m16n8k16_" in text, values
