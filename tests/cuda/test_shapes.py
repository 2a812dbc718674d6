"""The shape suite's default schedules without a GPU: what the defaults choose from the target's facts
(wave quantization), the new kernels' structure (matrix–vector, split reduction, aligned operand
copies, CUDA-core convolution of few channels, wide rows) and their machine code compiled by nvcc
for sm_90a and sm_80 (16-byte asynchronous copies, HGMMA, no local memory)."""

import dataclasses
import re
import subprocess
import tempfile

import numpy as np
import pytest

import polytile as pt
from polytile import ops
from polytile.dtypes import as_dtype
from polytile.errors import ScheduleError
from polytile.ops.gpu_schedules import GEMV_MMA_VARIABLE, GEMV_ROWS, gemm_choice
from polytile.target import CUDATarget

SM90A = CUDATarget(arch="sm_90a")  # the datasheets' H100 and A100
SM80 = CUDATarget(arch="sm_80")
SM75 = CUDATarget(arch="sm_75")  # tensor cores without mma.sync.m16n8k16
needs_nvcc = pytest.mark.needs_nvcc


def _sass(kern, name=None) -> str:
    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kern.cubin)
        f.flush()
        text = subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout
    if name is None:
        return text
    part = text.split(f".text.{name}:")[1]
    return part.split(".section")[0]


def _kernel_names(kern) -> list[str]:
    return [k.name for k in kern.kernels]


# --- the choice ------------------------------------------------------------------------------------

@pytest.fixture
def cuda_core_gemv(monkeypatch):
    """The CUDA cores' GEMV (mma.sync's tile at 16 rows) for 16-bit operands, not gemv_mma (the default)."""
    monkeypatch.setenv(GEMV_MMA_VARIABLE, "0")


def test_few_rows_stream_on_the_cuda_cores(monkeypatch):
    monkeypatch.delenv(GEMV_MMA_VARIABLE, raising=False)
    for M in (1, 2, 4):
        assert gemm_choice(SM90A, M, 4096, 4096, as_dtype("bfloat16")).kernel == "gemv"
    for M in (5, 8, 15):  # the tensor cores' GEMV (tests/cuda/test_gemv_mma.py), the CUDA cores' on request
        assert gemm_choice(SM90A, M, 4096, 4096, as_dtype("bfloat16")).kernel == "gemv_mma"
        assert gemm_choice(SM90A, M, 4096, 4096, as_dtype("bfloat16"), tensor_core_gemv=False).kernel == "gemv"
    monkeypatch.setenv(GEMV_MMA_VARIABLE, "0")
    # 16 rows fill mma.sync's tile (H200: 16×4096×4096 bf16 30.7 µs on the GEMV, 22.7 on mma.sync);
    # float32 operands and batched products keep the GEMV
    assert gemm_choice(SM90A, 16, 4096, 4096, as_dtype("bfloat16")).kernel == "mma"
    assert gemm_choice(SM80, 16, 3002, 1536, as_dtype("float16")).kernel == "mma"
    assert gemm_choice(SM90A, GEMV_ROWS, 4096, 4096, as_dtype("float32")).kernel == "gemv"
    assert gemm_choice(SM90A, GEMV_ROWS, 128, 2048, as_dtype("float16"), batch=32).kernel == "gemv"
    assert gemm_choice(SM90A, GEMV_ROWS + 1, 4096, 4096, as_dtype("bfloat16")).kernel == "wgmma"
    assert gemm_choice(SM80, 512, 512, 512, as_dtype("float16")).kernel == "mma"
    assert gemm_choice(SM90A, 512, 512, 512, as_dtype("float32")).kernel == "cuda"


def test_the_choice_reads_the_number_of_sms():
    # 127×255 outputs are 8 tiles of 64×64: K is split until the SMs are busy; a GPU of 16 SMs is
    # given fewer, larger blocks
    small = dataclasses.replace(SM90A, sms=16)
    few, many = (gemm_choice(t, 127, 255, 4096, as_dtype("bfloat16")) for t in (small, SM90A))

    def blocks(c):
        return c.split * -(-127 // c.params["bm"]) * -(-255 // c.params["bn"])
    assert many.split > 1 and blocks(few) < blocks(many)
    # a large product fills the GPU without a split
    assert gemm_choice(SM90A, 4096, 4096, 4096, as_dtype("float16")).split == 1


def test_split_only_for_a_clear_gain():
    # 300×200×100 in float32: five chunks of K are predicted 10% faster, within the estimate's error
    # of the second kernel: not split (one kernel, as the SASS optimizer's tests expect)
    assert gemm_choice(SM90A, 300, 200, 100, as_dtype("float32")).split == 1
    assert gemm_choice(SM90A, 8, 768, 3072, as_dtype("float16")).split > 1


def test_wave_quantization_prefers_tiles_that_fill_the_last_wave():
    from polytile.tune.analytical import BlockPlan, Hardware, wave_cycles
    hw = Hardware.of(SM90A)
    plan = BlockPlan(128, 128, 64, hw.sms, 16, 1, hw.wgmma_flops, 2, 4)
    one = wave_cycles(plan, hw)
    # one block more than the SMs: a second wave as long as the first
    assert wave_cycles(dataclasses.replace(plan, tiles=hw.sms + 1), hw) > 1.9 * one


def test_split_must_leave_no_chunk_empty():
    # 8 in chunks of ⌈8/7⌉ = 2: the fifth to seventh would be empty
    with pytest.raises(pt.PolytileError, match="split_k=7 must be between 1 .* and K=8, and leave no chunk"):
        ops.matmul(4, 4, 8, split_k=7)
    for bad in (0, -2):  # was: silently unsplit (0), or a negative split recorded in the op's shape
        with pytest.raises(pt.PolytileError, match=f"split_k={bad} must be between 1"):
            ops.batch_matmul(2, 4, 4, 8, split_k=bad)


def test_given_uneven_splits_need_whole_k_tiles_off_the_gemv_kernel():
    # the tensor-core and CUDA-core kernels compute whole K tiles: a given split into chunks of
    # ⌈1000/3⌉ = 334 would cross them (the GEMV kernel then sums partial tiles)
    with pytest.raises(ScheduleError, match="split_k=3 does not divide K=1000.*take a divisor of K"):
        gemm_choice(SM90A, 64, 256, 1000, as_dtype("float16"), split_k=3)
    with pytest.raises(ScheduleError, match="split_k=3 does not divide K=1000.*take a divisor of K"):
        gemm_choice(SM90A, 64, 256, 1000, as_dtype("float32"), split_k=3)
    gemv = gemm_choice(SM90A, 8, 256, 1000, as_dtype("float16"), split_k=3)
    assert gemv.split == 3 and not gemv.params["whole"]  # 334 is no whole number of K tiles
    # chunks of ⌈1000/2⌉ = 500 are not whole 64-wide K tiles; of ⌈1025/2⌉ = 513 neither, of ⌈1023/2⌉ = 512 yes
    assert gemm_choice(SM90A, 64, 256, 1023, as_dtype("float16"), split_k=2).split == 2


def test_tile_chunks_are_whole_k_tiles_but_the_last():
    from polytile.ops.gpu_schedules import tile_chunks
    for K, bk in ((8191, 128), (8191, 64), (5003, 128), (4096, 64), (300, 16)):
        found = tile_chunks(K, bk, 132)
        assert found and len({s for s, _ in found}) == len(found)
        for split, chunk in found:
            assert chunk % bk == 0 and chunk >= 2 * bk and 2 <= split <= 132
            assert (split - 1) * chunk < K <= split * chunk  # none empty, the last one ending at K
    assert (32, 256) in tile_chunks(8191, 128, 132) and (64, 128) in tile_chunks(8191, 64, 132)


def test_chunks_of_whole_k_tiles_are_the_matmul_on_the_cpu(rng):
    # chunks of 32 over K = 100 (the last one 4 long), of 48 over K = 97 (the last one 1 long)
    for M, N, K, split, chunk in ((3, 5, 100, 4, 32), (7, 9, 97, 3, 48), (4, 6, 97, 2, 64)):
        op = ops.matmul(M, N, K)
        x = op.make_inputs(rng)
        kern = pt.build(pt.Schedule(ops.matmul_func(M, N, K, "float32", split, chunk=chunk)), "cpu")
        assert ops.rel_error(kern(*x), op.reference(*x)) < 1e-6
    with pytest.raises(pt.PolytileError, match="3 chunks of 32 do not cover K=100"):
        ops.matmul_func(3, 5, 100, "float32", 3, chunk=32)
    with pytest.raises(pt.PolytileError, match="leave no chunk of 64 empty"):
        ops.matmul_func(3, 5, 100, "float32", 3, chunk=64)


def test_a_tensor_core_gemm_over_a_prime_k_is_split_in_chunks_of_whole_k_tiles():
    # 61×61×8191: one 64×64 output tile and no divisor of K (0.30× torch unsplit, one block on 132 SMs)
    for target, kernel in ((SM90A, "wgmma"), (SM80, "mma")):
        choice = gemm_choice(target, 61, 61, 8191, as_dtype("bfloat16"), out_bytes=2)
        assert choice.kernel == kernel and choice.split >= 16, choice
        assert choice.chunk % choice.params["bk"] == 0 and (choice.split - 1) * choice.chunk < 8191
        assert "producer" not in choice.params  # cp.async: TMA's ring is not given a shorter last chunk
    sched = ops.matmul(61, 61, 8191, "bfloat16").schedule(SM90A)
    P = sched.func.computations[0]
    assert P.name == "P" and int(P.shape[0].value) == gemm_choice(SM90A, 61, 61, 8191, as_dtype("bfloat16")).split


def test_a_gemv_over_a_prime_k_is_split_in_chunks_of_unequal_length():
    # K = 4093 has no divisor: unsplit, 1×4097×4093 ran in 17 blocks, 515 µs (torch: 22 µs)
    few = gemm_choice(SM90A, 1, 4097, 4093, as_dtype("bfloat16"))
    assert few.kernel == "gemv" and few.split > 4 and 4093 % few.split
    # K with a divisor that splits well keeps chunks of one length
    assert 4096 % gemm_choice(SM90A, 1, 4096, 4096, as_dtype("bfloat16")).split == 0


def test_a_gemv_of_unaligned_rows_is_split_past_sixteen_chunks():
    # the direct GEMV (rows 2-byte aligned) waits for each K step's loads: more chunks are more warps
    # streaming B (H100: 1×4097×4093 77 µs in 16 chunks, 30 µs in 64; torch 24)
    from polytile.ops.gpu_schedules import GEMV_MAX_SPLIT
    from polytile.ops.split_rules import MAX_SPLIT
    choice = gemm_choice(SM90A, 1, 4097, 4093, as_dtype("bfloat16"))
    assert choice.params.get("direct") and MAX_SPLIT < choice.split <= GEMV_MAX_SPLIT
    # the tensor-core kernels keep MAX_SPLIT
    assert gemm_choice(SM90A, 127, 255, 4096, as_dtype("bfloat16")).split <= MAX_SPLIT


def test_a_gemv_of_rows_only_4_byte_aligned_reads_b_directly():
    # 4-byte asynchronous copies starved the staged kernel (H100: 8×4098×4096 bf16 152 µs, direct 54)
    for M, N, K, dtype in ((8, 4098, 4096, "bfloat16"), (1, 50258, 768, "float16"), (12, 2222, 3333, "bfloat16")):
        assert gemm_choice(SM90A, M, N, K, as_dtype(dtype)).params.get("direct"), (M, N, K)
    # 8-byte aligned rows keep the staged kernel (8×4100×4096: 43 µs staged, 78 direct)
    assert not gemm_choice(SM90A, 8, 4100, 4096, as_dtype("bfloat16")).params.get("direct")


@pytest.mark.parametrize("dims,dtype", [((15, 3002, 1536), "bfloat16"), ((12, 2222, 3333), "bfloat16"),
                                        ((8, 4096, 4096), "bfloat16"), ((1, 4097, 4093), "bfloat16"),
                                        ((5, 1001, 999), "float16")])
def test_gemv_products_are_whole_register_tiles(dims, dtype, cuda_core_gemv):
    # the accumulators of a partial column tile were loops of variable bounds (isl's exact cut): 16×3002×1536
    # took 5,200 instructions a K step for 1,024 FFMA, 554 of them branches (0.33× torch); whole register
    # tiles run the products over constant loops (zeros past the ends of B's columns and rows)
    M, N, K = dims
    choice = gemm_choice(SM90A, M, N, K, as_dtype(dtype))
    assert choice.kernel == "gemv" and choice.params["whole"]
    assert (choice.chunk or -(-K // choice.split)) % choice.params["bk"] == 0 or choice.split == 1  # whole K tiles
    text = str(pt.lower(ops.matmul(M, N, K, dtype).schedule(SM90A), SM90A))
    last = M * choice.params["vec"] - 1
    assert re.search(rf"(P|C)_local_{last} = \((P|C)_local_{last} \+", text)
    assert not re.search(r"(P|C)_local\[[^\]]*\] = \((P|C)_local\[", text)


def test_gemv_template_offers_uneven_splits_past_sixteen():
    from polytile.tune import make_task
    task = make_task("matmul", SM90A, M=1, N=4097, K=4093, dtype="bfloat16", template="matmul_gemv")
    splits = next(d for d in task.space.decisions if d.name == "split").choices
    assert 1 in splits and 64 in splits and 48 in splits  # 4093 is prime: every split > 1 is uneven
    assert task._check(dict(threads=128, vector=16, bk=16, stages=3, direct=True, split=64)) is None
    # chunks of fewer than two K tiles are refused; a count past the template's splits stays (records)
    assert "two K tiles" in task._check(dict(threads=128, vector=8, bk=64, stages=3, direct=False, split=64))
    task = make_task("matmul", SM90A, M=5, N=1001, K=777, dtype="float16", template="matmul_gemv")
    assert task._check(dict(threads=64, vector=16, bk=16, stages=2, direct=True, split=7)) is None


def test_split_matmul_on_the_cpu(rng):
    # the restructured algorithm is the same function (checked where it can run here)
    for op in [ops.matmul(37, 53, 132, split_k=4), ops.matmul(5, 64, 100, split_k=5),
               ops.batch_matmul(3, 5, 40, 96, split_k=4),
               # chunks of unequal length: 4 × 26 + 27, 3 × 33 + 31
               ops.matmul(3, 53, 131, split_k=5), ops.batch_matmul(2, 5, 40, 130, split_k=4)]:
        x = op.make_inputs(rng)
        assert ops.rel_error(op.build("cpu")(*x), op.reference(*x)) < 1e-6


@pytest.mark.parametrize("dtype,acc", [("int8", "int32"), ("int16", "int32"), ("float64", "float64"),
                                       ("float16", "float32")])
def test_split_partial_products_are_summed_in_the_accumulator_type(rng, dtype, acc):
    # the chunks' partial products and their sum are of dtypes.accumulator(dtype), as the unsplit
    # product: full-range 8/16-bit integers exact in int32, float64 not rounded to float32
    for func in (ops.matmul_func(4, 4, 8, dtype, 2), ops.batch_matmul_func(2, 4, 4, 8, dtype, 2)):
        assert [(c.name, str(c.dtype)) for c in func.computations] == [("P", acc), ("C", acc)]
    for op in (ops.matmul(19, 23, 96, dtype, split_k=3), ops.batch_matmul(2, 7, 9, 64, dtype, split_k=4)):
        assert [str(c.dtype) for c in op.func.computations] == [acc, acc]
        assert str(op.func.outputs[0].dtype) == str(ops.matmul(19, 23, 96, dtype).func.outputs[0].dtype)
        if dtype.startswith("int"):
            info = np.iinfo(dtype)
            x = [rng.integers(info.min, info.max, size=[int(d.value) for d in t.shape], endpoint=True).astype(dtype)
                 for t in op.func.inputs]
        else:
            x = op.make_inputs(rng)
        if dtype == "float16":
            continue  # no float16 arithmetic on every CPU; the GPU tests check it
        out, ref = op.build("cpu")(*x), op.reference(*x)
        assert out.dtype == ref.dtype == np.dtype(acc)
        if dtype.startswith("int"):
            assert np.array_equal(out, ref)
        else:
            assert ops.rel_error(out, ref) <= op.tolerance < 1e-9


def test_decoding_attention_splits_its_batched_gemv():
    # 32 heads × 1 query × 128 columns over K = 2048: 32 blocks unless K is split too (was 0.37×)
    sched = ops.batch_matmul(32, 1, 128, 2048, "bfloat16").schedule(SM90A)
    P = sched.func.computations[0]
    assert P.name == "P" and int(P.shape[0].value) == 32 and int(P.shape[1].value) > 1
    with pytest.raises(ScheduleError, match="split only on the GEMV kernel"):
        ops.batch_matmul(4, 64, 64, 256, "float16", split_k=2).schedule(SM90A)


def test_default_schedule_restructures_into_a_split():
    op = ops.matmul(8, 768, 3072, "float16")
    sched = op.schedule(SM90A)
    assert [c.name for c in sched.computations] == ["P", "C"]
    assert [t.name for t in sched.func.inputs] == ["A", "B"] and sched.func.outputs[0].name == "C"
    # the user's own split is scheduled as given
    op = ops.matmul(8, 768, 3072, "float16", split_k=2)
    assert op.schedule(SM90A).func is op.func


def test_tensor_cores_refuse_k_tiles_across_chunks():
    # 2 chunks of 500: whole 64-wide K tiles would add the next chunk's products (was: wrong results)
    with pytest.raises(ScheduleError, match="not a multiple of the 64-wide K tile, and A continues past it"):
        ops.matmul(64, 200, 1000, "float16", split_k=2).schedule(SM90A)
    # whole chunks of K tiles are fine, and so is a K tile past the end of the tensor itself
    ops.matmul(64, 200, 1024, "float16", split_k=2).schedule(SM90A)
    ops.matmul(64, 200, 1000, "float16").schedule(SM90A)


def test_cache_whole_needs_one_granule_per_dimension():
    s = pt.Schedule(ops.matmul(30, 30, 30, "float16").func)
    with pytest.raises(ScheduleError, match="whole must give a positive granule for each of its 2 dimensions"):
        s["C"].cache("A", None, loc="global", whole=(8,))


def test_aligned_copy_is_one_kernel_of_16_bytes_per_thread():
    s = pt.Schedule(ops.matmul(255, 257, 127, "float16").func)
    from polytile.ops.gpu_schedules import align_operands, gemm_wgmma
    assert align_operands(s, "C") == ["A", "B"]
    gemm_wgmma(s, "C", "A", "B", bm=64, bn=64, bk=64, stages=3, inflight=1)
    low = pt.lower(s, SM90A)
    text = str(low)
    assert "allocate A_aligned[255, 128] float16 in global" in text
    assert "allocate B_aligned[127, 264] float16 in global" in text
    # 255 × 128 elements, 8 per thread (one 16-byte store each: a realigned load of A's 254-byte rows)
    assert "kernel matmul_kernel0 grid=(16, 1, 1) block=(256, 1, 1)" in text
    assert re.search(r"A_aligned\[ramp\(.*, 1, 8\)\] = pt_ldg_realign16\(A\[ramp", text)
    # the GEMM's tiles are read from the aligned copies with 16-byte asynchronous copies
    assert re.search(r"pt_cp_async_zfill\(B_shared\[ramp\(.*\), 1, 8\)\], B_aligned\[ramp", text)


# --- nvcc ------------------------------------------------------------------------------------------

@needs_nvcc
@pytest.mark.parametrize("target", [SM90A, SM80], ids=["sm_90a", "sm_80"])
@pytest.mark.parametrize("dims,dtype", [((1, 4096, 4093), "bfloat16"), ((8, 768, 3072), "float16"),
                                        ((3, 1000, 1000), "float32"), ((1, 4100, 4093), "bfloat16")])
def test_gemv_streams_with_async_copies(target, dims, dtype, cuda_core_gemv):
    kern = ops.matmul(*dims, dtype).build(target)
    gemv = next(k for k in kern.kernels if k.dynamic_shared)
    sass = _sass(kern, gemv.name)
    # B's tiles arrive by asynchronous copies; A's rows of an odd number of 16-bit columns (no 4-byte
    # alignment at all) are first copied aligned, by a kernel of their own
    assert "LDGSTS" in sass
    odd = [t for t, n in (("A", dims[2]),) if n * as_dtype(dtype).itemsize % 4]
    assert [k.name for k in kern.kernels].index(gemv.name) == len(odd)
    assert not re.search(r"\bLDL\b|\bSTL\b", sass)
    assert "HMMA" not in sass and "HGMMA" not in sass
    # one thread per 8 bytes of B's columns, the columns of a block along threadIdx.x only
    assert gemv.block[1:] == (1, 1)


@needs_nvcc
@pytest.mark.parametrize("dims,dtype", [((8, 768, 3072), "float16"), ((1, 4096, 4096), "bfloat16"),
                                        ((5, 1000, 2000), "bfloat16")])
def test_gemv_k_loop_is_not_unrolled_past_the_instruction_cache(dims, dtype, cuda_core_gemv):
    # the pipelined K loop of unrolled products was fully unrolled (`#pragma unroll` on every loop of
    # at most 32 steps): 8×768×3072 became 224 KB of machine code and its warps stalled on
    # instruction fetch (58 µs on an H200, torch 11 µs; 17 µs once the loop stays a loop)
    kern = ops.matmul(*dims, dtype).build(SM90A)
    gemv = next(k for k in kern.kernels if k.dynamic_shared)
    instructions = len(re.findall(r"/\*[0-9a-f]{4}\*/", _sass(kern, gemv.name)))
    assert 0 < instructions < 4096, instructions


@needs_nvcc
def test_register_copies_of_adjacent_elements_are_vector_loads(cuda_core_gemv):
    # the staged GEMV's 4 bf16 columns of B per thread: one LDS.64 (was 4 LDS.U16); the direct GEMV's
    # 8 columns straight from global memory: one LDG.128, zero-filling at a column bound that does not
    # cut a vector (N = 1000, a multiple of 8)
    from polytile.build import build
    from polytile.tune import make_task
    staged = ops.matmul(8, 768, 3072, "float16").build(SM90A)
    sass = _sass(staged, next(k for k in staged.kernels if k.dynamic_shared).name)
    assert "LDS.64" in sass
    task = make_task("matmul", SM90A, M=3, N=1000, K=336, dtype="bfloat16", template="matmul_gemv")
    kern = build(task.schedule(dict(threads=64, vector=16, bk=8, stages=3, direct=True, split=1)), SM90A)
    assert re.search(r"\*\(uint4\*\)&B_local\[\d+\] = \(.*\) \? \*\(const uint4\*\)&B\[", kern.source)
    assert "LDG.E.128" in _sass(kern)


@needs_nvcc
def test_bfloat16_loads_are_combined_like_float16_ones(cuda_core_gemv):
    # __bfloat162float kept nvcc from combining adjacent loads of A's shared tile (128 LDS.U16 per K
    # step against none for float16: BERT's 8×768×3072 in 27 µs in bfloat16, 17.6 µs in float16 on
    # an H200); the conversion is a shift of the bits, and the loads are combined
    counts = {}
    for dtype in ("float16", "bfloat16"):
        kern = ops.matmul(8, 768, 3072, dtype).build(SM90A)
        sass = _sass(kern, next(k for k in kern.kernels if k.dynamic_shared).name)
        counts[dtype] = len(re.findall(r"\bLDS\.U16\b", sass))
    assert counts["bfloat16"] <= 16, counts


def test_vector_copies_only_where_the_guard_holds_for_all_lanes_or_none():
    from polytile.lowering import loopir as ir
    from polytile.lowering.passes.combine_loads import combine_loads
    bf16 = as_dtype("bfloat16")
    src = ir.Buffer("B", bf16, (ir.const(4096),), "arg")
    local = ir.Buffer("L", bf16, (ir.const(8),), "local")
    t = ir.Var("tx")

    def run(n_cols, base_coef=8, count=8):
        stmts = []
        for k in range(count):
            col = ir.BinOp("+", ir.BinOp("*", ir.const(base_coef), t), ir.const(k))
            cond = ir.Cmp("<", col, ir.const(n_cols))
            stmts.append(ir.Store(local, (ir.const(k),), ir.Select(cond, ir.Load(src, (col,)), ir.Const(0.0, bf16))))
        return combine_loads(ir.Block(tuple(stmts)))

    def vector(s):
        return [st.index[0].lanes for st in ir.walk_stmt(s) if isinstance(st, ir.Store) and st.index[0].lanes > 1]
    assert vector(run(1000)) == [8]  # 1000 columns: a vector is inside or past the end
    assert vector(run(1001)) == []  # 1001: the last vector is cut by the bound
    assert vector(run(1000, base_coef=4)) == [4, 4]  # offsets multiples of 4 only: two 8-byte vectors
    assert vector(run(1002, base_coef=4)) == [2, 2, 2, 2]  # 1002 cuts 8-byte vectors, not 4-byte ones


def test_gemv_streams_with_enough_warps_to_reach_the_bandwidth():
    # measured on an H100 (gemv_variants-20261127-2014-h100x2.json): unsplit, LLaMA's 1×28672×4096
    # ran 112 blocks of 2 warps (113 µs; split in 4: 92 µs, torch 94 µs) and BERT's vocabulary row
    # 1×30522×768 120 blocks (113 µs; split in 12: 37 µs, torch 45 µs)
    from polytile.tune.analytical import STREAM_WARPS, Hardware, stream_efficiency
    for N, K in ((28672, 4096), (30522, 768)):
        choice = gemm_choice(SM90A, 1, N, K, as_dtype("bfloat16"))
        assert choice.kernel == "gemv" and choice.split > 1, choice
    hw = Hardware.of(SM90A)
    from polytile.tune.analytical import BlockPlan
    plan = BlockPlan(1, 256, 32, 112, 128, 3, hw.fma_flops, 2, 4, 2, streaming=True)
    assert stream_efficiency(plan, hw) < 0.7
    many = dataclasses.replace(plan, tiles=hw.sms * 3)
    assert stream_efficiency(many, hw) == 1.0 and 3 * 2 >= STREAM_WARPS


def test_short_loops_unroll_only_within_a_code_budget():
    from polytile.codegen.cuda import AUTO_UNROLL_STATEMENTS, _auto_unroll
    from polytile.lowering import loopir as ir
    i, j = ir.Var("i"), ir.Var("j")
    buf = ir.Buffer("X", as_dtype("float32"), (ir.const(64),), "global")

    def loop(extent, stmts, var=i, kind="serial"):
        body = ir.block([ir.Store(buf, (ir.const(k),), ir.const(1.0, as_dtype("float32"))) for k in range(stmts)])
        return ir.For(var, ir.const(0), ir.const(extent), body, kind)
    assert _auto_unroll(loop(8, 4)) and _auto_unroll(loop(32, AUTO_UNROLL_STATEMENTS // 32))
    assert not _auto_unroll(loop(33, 1))  # too many steps
    assert not _auto_unroll(loop(12, 100))  # too much code
    inner = loop(16, 8, j, kind="unroll")  # an unrolled inner loop counts with its steps
    assert not _auto_unroll(ir.For(i, ir.const(0), ir.const(12), inner))
    assert _auto_unroll(ir.For(i, ir.const(0), ir.const(4), inner))


@needs_nvcc
def test_gemv_copies_4_byte_aligned_rows_in_4_byte_pieces():
    # BERT's vocabulary (30522 16-bit columns: rows 4-byte but not 8-byte aligned); before: one
    # element at a time, synchronously
    # The default now reads such rows directly (test_a_gemv_of_rows_only_4_byte_aligned_reads_b_directly);
    # the staged kernel stays in the tuning space
    from polytile.build import build
    from polytile.tune import make_task
    task = make_task("matmul", SM90A, M=1, N=30522, K=768, dtype="bfloat16", template="matmul_gemv")
    kern = build(task.schedule(dict(threads=128, vector=8, bk=32, stages=4, direct=False, split=8)), SM90A)
    assert "pt_cp_async4_zfill(&B_shared" in kern.source
    assert "LDGSTS.E.LTC128B" in _sass(kern) or "LDGSTS.E" in _sass(kern)


@needs_nvcc
def test_split_wgmma_on_aligned_copies_does_not_spill():
    # 127×255×4096: few tiles (split) and B's rows of 255 elements (510 bytes): copied aligned first.
    # Before: element-wise copies, 255 registers and spills
    kern = ops.matmul(127, 255, 4096, "bfloat16").build(SM90A)
    names = _kernel_names(kern)
    assert len(names) == 3  # B's aligned copy, the partial products, their sum
    gemm = names[1]
    sass = _sass(kern, gemm)
    assert "HGMMA.64x64x16.F32.BF16" in sass
    assert "UTMALDG.2D" in sass  # whole 16-byte rows of the copy, read by TMA boxes (before: 16-byte cp.async)
    assert kern.resources[gemm].spill_stores == 0
    assert not re.search(r"\bLDL\b|\bSTL\b", sass)


@needs_nvcc
def test_odd_k_and_n_use_16_byte_copies():
    kern = ops.matmul(4095, 4097, 1023, "float16").build(SM90A)
    gemm = _kernel_names(kern)[-1]
    sass = _sass(kern, gemm)
    # the operands' 16-byte aligned copies are read whole: by TMA boxes (before: 16-byte cp.async)
    assert "UTMALDG.2D" in sass and "HGMMA" in sass and "LDGSTS" not in sass
    assert kern.resources[gemm].spill_stores <= 128  # was 5308 bytes


@needs_nvcc
@pytest.mark.parametrize("target", [SM90A, SM80], ids=["sm_90a", "sm_80"])
def test_three_channel_convolution_builds(target):
    # ResNet-50's first layer: C = 3 is less than a tensor-core K step (was: a ScheduleError); it
    # runs on the tensor cores over the padded copies of the input and the filter
    kern = ops.conv2d_igemm(2, 30, 30, 3, 64, 7, 7, 2, 3).build(target)
    sass = _sass(kern)
    assert "HMMA" in sass and not re.search(r"\bLDL\b|\bSTL\b", sass)
    assert "HMMA" not in _sass(ops.conv2d_igemm(2, 30, 30, 3, 64, 7, 7, 2, 3).build(SM75))  # the CUDA cores


@pytest.mark.parametrize("target", [SM90A, SM80], ids=["sm_90a", "sm_80"])
@pytest.mark.parametrize("pixels", [(4, 4), (2, 2), (1, 1)])
def test_convolutions_of_few_pixels_build(target, pixels):
    # 16 output pixels took warpgroup MMA, whose warps' loop of one 16-row tile was gone ("bind the warps
    # to threadIdx.z"); one pixel took mma.sync, whose row loop was ("loop i3 must run over axis m only")
    from polytile.ops.conv_choice import igemm_kernel
    H, W = pixels
    op = ops.conv2d_igemm(1, H, W, 256, 256, 3, 3, 1, 1, dtype="bfloat16")
    pt.lower(op.schedule(target), target)
    assert igemm_kernel(target, H * W, 256, 256, 9)[0] == ("cuda" if H * W == 1 else "mma")


@pytest.mark.parametrize("dims", [(2, 13, 11, 3, 8, 7, 7, 2, 3), (1, 9, 10, 3, 5, 3, 3, 2, 1),
                                  (2, 8, 7, 5, 6, 3, 3, 1, 1), (1, 7, 9, 1, 4, 5, 5, 1, 2),
                                  (1, 6, 6, 12, 3, 2, 2, 1, 0), (2, 9, 9, 81, 12, 5, 5, 2, 2),
                                  (1, 5, 6, 17, 7, 3, 3, 1, 1), (2, 4, 4, 41, 5, 1, 1, 1, 0)],
                         ids=["7x7s2", "3x3s2", "c5", "c1-5x5", "c12-2x2", "c81-5x5s2", "c17-3x3", "c41-1x1"])
def test_few_channel_convolution_rows_are_the_convolution(dims):
    # the algorithm of the default for few channels (input and filter copied with the channels padded
    # to 4, 8 or 16 and the image padded; a filter row's taps × channels one run), unscheduled on
    # the CPU, against NumPy
    from polytile.ops.igemm import conv2d_igemm_rows_func
    op = ops.conv2d_igemm(*dims, dtype="float32")
    kern = pt.build(pt.Schedule(conv2d_igemm_rows_func(*dims, dtype="float32")), "cpu")
    i, w = op.make_inputs(np.random.default_rng(sum(dims)))
    assert ops.rel_error(kern(i, w), op.reference(i, w)) < 1e-6


@needs_nvcc
@pytest.mark.parametrize("dims,width", [((32, 224, 224, 3, 64, 7, 7, 2, 3), 16), ((8, 96, 96, 3, 32, 5, 5, 1, 2), 8),
                                        ((1, 224, 224, 3, 32, 3, 3, 2, 1), 16)],
                         ids=["resnet-stem-n32", "5x5s1", "mobilenet-stem"])
def test_few_channel_convolution_copies_are_vectors(dims, width):
    # the padded input's rows are 16-byte aligned and a filter row's run starts at q·stride·4
    # elements: 16-byte asynchronous copies at stride 2, 8-byte at stride 1; no scalar gather (the
    # CUDA-core kernel before: one 2-byte load per tap and channel and pixel, 0.13× cuDNN)
    kern = ops.conv2d_igemm(*dims).build(SM90A)
    pad_input, pad_filter, gemm = kern.kernels
    ops_ = _opcodes(_sass(kern, gemm.name))
    copies = [o.rsplit(".", 1)[-1] for o in ops_ if o.startswith("LDGSTS")]
    assert copies and min(int(b) if b.isdigit() else 32 for b in copies) == width * 8
    assert not any(o.startswith(("LDG.E.U16", "LDL", "STL")) for o in ops_)
    assert "HMMA.16816.F32" in ops_


@needs_nvcc
@pytest.mark.parametrize("op", [ops.softmax(4, 128256), ops.layernorm(4, 128256)], ids=["softmax", "layernorm"])
def test_rows_wider_than_shared_memory_build(op):
    # a 128256-wide float32 row (513 KB) does not fit a block's shared memory (was: a BuildError)
    kern = op.build(SM90A)
    assert kern.kernels[0].block == (1024, 1, 1)
    assert kern.kernels[0].dynamic_shared < SM90A.shared_per_block


def test_rows_that_fit_stay_in_shared_memory():
    kern_src = pt.lower(ops.softmax(64, 30522).schedule(SM90A), SM90A)
    assert "in shared" in str(kern_src)



# --- tuning spaces ---------------------------------------------------------------------------------

def test_gemv_template_comes_first_for_few_rows():
    from polytile.tune import make_task
    task = make_task("matmul", SM90A, M=8, N=768, K=3072, dtype="float16")
    assert task.template.name == "matmul_gemv"
    assert {"threads", "bk", "stages", "split"} <= {d.name for d in task.space.decisions}
    assert make_task("matmul", SM90A, M=128, N=768, K=3072, dtype="float16").template.name == "matmul_wgmma"
    assert make_task("batch_matmul", SM90A, batch=12, M=1, N=512, K=64, dtype="float16").template.name == \
        "batch_matmul_gemv"


def _split_config(task, split):
    rng = np.random.default_rng(0)
    for digits in task.space.sample_valid(rng, 200):
        values = task.space.config(digits).values
        if values.get("split") == split:
            return values
    raise AssertionError(f"no valid configuration with split={split}")


@pytest.mark.parametrize("op,shape,split", [
    ("matmul", dict(M=8, N=768, K=3072, dtype="float16"), 4),       # GEMV
    ("matmul", dict(M=127, N=255, K=4096, dtype="bfloat16"), 8),    # wgmma
    ("matmul", dict(M=128, N=1024, K=4096), 4),                     # CUDA cores
])
def test_templates_reach_split_reductions(op, shape, split):
    from polytile.tune import make_task
    task = make_task(op, SM90A, **shape)
    sched = task.schedule(_split_config(task, split))
    assert [c.name for c in sched.computations] == ["P", "C"]
    assert int(sched.func.computations[0].shape[0].value) == split
    # the tensor-core space copies unaligned rows (B: 255 columns) as the default does
    if shape.get("N") == 255:
        assert any(c.name == "B_aligned" for c in sched.caches)


def test_tensor_core_spaces_leave_few_rows_to_gemv():
    from polytile.tune import make_task
    task = make_task("matmul", SM90A, template="matmul_wgmma", M=8, N=768, K=3072, dtype="float16")
    assert not task.space.sample_valid(np.random.default_rng(0), 8)


def test_wgmma_model_predicts_the_split():
    # 127×255 outputs are 8 tiles of 64×64 on 132 SMs: K = 4096 in 8 chunks is 64 blocks of 512-long
    # products plus the partial sums' round trip; the analytical tuners rank by this (before: the
    # model ignored the split, and every split of a tile tied)
    from polytile.tune import make_task
    from polytile.tune.analytical import GemmShape, WgmmaConfig, predict, split_seconds
    task = make_task("matmul", SM90A, M=127, N=255, K=4096, dtype="bfloat16")
    assert task.template.name == "matmul_wgmma"
    base = dict(bm=64, bn=64, bk=64, stages=4, inflight=1)
    one, eight = task.predict([dict(base, split=1), dict(base, split=8)])
    assert eight < 0.7 * one
    tiles = WgmmaConfig(**base)
    assert eight == pytest.approx(predict(GemmShape(127, 255, 512, batch=8), tiles, SM90A)
                                  + split_seconds(SM90A, 127, 255, 1, 8))
    assert one == pytest.approx(predict(GemmShape(127, 255, 4096), tiles, SM90A))


@pytest.mark.parametrize("op,template,shape", [
    ("matmul", "matmul_tensorcore", dict(M=64, N=128, K=512)),
    ("batch_matmul", "batch_matmul_gemv", dict(batch=3, M=1, N=128, K=512)),
])
def test_templates_keep_the_operators_own_split(op, template, shape):
    # an operator made with split_k= is tuned as it is (was: "'P' is not a computation of Func
    # matmul" - the mma.sync space and the batched templates rebuilt an unsplit, unbatched matmul)
    from polytile.tune import make_task
    task = make_task(op, SM80, template=template, dtype="float16", split_k=4, **shape)
    (digits,) = task.space.sample_valid(np.random.default_rng(0), 1)
    sched = task.schedule(task.space.config(digits).values)
    assert sched.func is task.op.func
    assert [c.name for c in sched.computations] == ["P", "C"]
    assert len(re.findall(r"^  kernel ", str(pt.lower(sched, SM80)), re.M)) == 2  # P, then the sum C


@pytest.mark.parametrize("template,dtype", [("batch_matmul_tensorcore", "float16"),
                                            ("batch_matmul_cuda", "float32")])
def test_batched_split_is_refused_where_the_kernel_takes_one_batch_loop(template, dtype):
    from polytile.tune import make_task
    task = make_task("batch_matmul", SM80, template=template, batch=3, M=64, N=128, K=512, dtype=dtype, split_k=4)
    assert not task.space.sample_valid(np.random.default_rng(0), 1)
    reasons = {task.space.reason_invalid(task.space.config_at(i).digits) for i in range(0, task.space.size, 7)}
    assert ("a batched product's reduction is split only on the GEMV kernel (at most 16 rows): this kernel takes "
            "one batch loop; leave split_k unset") in reasons


# --- float32 GEMMs on the CUDA cores: whole tiles -----------------------------------------------------

def _opcodes(sass: str) -> list[str]:
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)


@needs_nvcc
@pytest.mark.parametrize("dims", [(1009, 2003, 509), (129, 131, 37), (1536, 1536, 1536)],
                         ids=["primes", "odd", "aligned"])
def test_fp32_gemm_products_have_no_guards(dims):
    # whole register tiles over whole zero-filled shared tiles: every K step is 8 × 64 products of
    # constant registers with no branch around them, whatever the size. Before: 1009×2003×509 had
    # 64 FFMA in 2328 instructions, 201 branches (tests of up to 9 disjuncts around each product)
    kern = ops.matmul(*dims, "float32").build(SM90A)
    (k,) = kern.kernels
    ops_ = _opcodes(_sass(kern, k.name))
    params = gemm_choice(SM90A, *dims, as_dtype("float32")).params
    step = params["bk"] * params["tm"] * params["tn"]
    assert ops_.count("FFMA") % step == 0  # a K step, or all of them (a short K loop unrolled by nvcc)
    assert sum(o.startswith("BRA") for o in ops_) <= 4
    assert len(ops_) < 3 * ops_.count("FFMA")
    # the operands at one k: two vectors each of A and B (the register tile's halves) from shared memory
    vectors = sum(o.startswith(("LDS.128", "LDS.64")) for o in ops_)
    assert vectors >= ops_.count("FFMA") // step * params["bk"] * 4
    assert not any(o.startswith(("LDL", "STL")) for o in ops_)
    res = kern.resources[k.name]
    assert res.spill_stores == 0 and res.stack_bytes == 0


NCHW_GEMMS = [((3, 40, 7, 9, 12, 1, 1, 1, 0, 1), 4),       # a 1×1 convolution
              ((1, 24, 7, 7, 20, 3, 3, 1, 1, 1), 8),        # 49 pixels, a split reduction
              ((2, 5, 13, 11, 20, 3, 3, 2, 1, 1), 1),       # odd sizes, stride 2, padding
              ((2, 5, 13, 11, 20, 3, 3, 2, 1, 1), 3),
              ((1, 7, 9, 10, 6, 2, 3, 1, 2, 2), 7)]         # dilation 2, a 2×3 filter


@pytest.mark.parametrize("dims,split", NCHW_GEMMS, ids=["1x1", "3x3-7x7", "odd", "odd-split", "dilated"])
def test_nchw_convolution_as_one_gemm_is_the_convolution(dims, split):
    # the algorithm the CUDA default restructures conv2d into (the filter as a K × C·R·S matrix times
    # the gathered input, split in chunks of the taps), unscheduled on the CPU, against NumPy
    from polytile.ops.conv import conv2d_gemm_func, conv2d_reference
    N, C, H, W, K, R, S, stride, pad, dil = dims
    rng = np.random.default_rng(split)
    i = rng.uniform(-1, 1, (N, C, H, W)).astype(np.float32)
    w = rng.uniform(-1, 1, (K, C, R, S)).astype(np.float32)
    kern = pt.build(pt.Schedule(conv2d_gemm_func(*dims, split_k=split)), "cpu")
    np.testing.assert_allclose(kern(i, w), conv2d_reference(i, w, stride, pad, dil), rtol=1e-4, atol=1e-4)
    with pytest.raises(pt.PolytileError, match="split_k=4 must divide the reduction C·R·S = 45"):
        conv2d_gemm_func(1, 5, 9, 9, 4, 3, 3, split_k=4)


@needs_nvcc
@pytest.mark.parametrize("dims", [(1, 1024, 14, 14, 256, 1, 1, 1, 0), (1, 512, 7, 7, 512, 3, 3, 1, 1),
                                  (3, 17, 9, 11, 40, 5, 5, 2, 2)], ids=["1x1", "3x3-7x7", "odd"])
def test_nchw_float32_convolution_is_a_cuda_core_gemm(dims):
    # float32 NCHW convolutions take gemm_cuda's tiles and split (gemm_choice on K × N·P·Q × C·R·S),
    # the filter and input gathered by the shared tiles' copies, the products from shared memory.
    # Before: a direct convolution (ResNet-50's 1×1 C1024→256 at 14×14 in 199 µs, cuDNN 43 µs)
    N, C, H, W, K, R, S, stride, pad = dims
    P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
    choice = gemm_choice(SM90A, K, N * P * Q, C * R * S, as_dtype("float32"), unequal_chunks=False)
    op = ops.conv2d(*dims)
    sched = op.schedule(SM90A)
    assert ("P" in sched.stage_names()) == (choice.split > 1)
    kern = pt.build(sched, SM90A)
    gemm, rest = kern.kernels
    ops_ = _opcodes(_sass(kern, gemm.name))
    step = choice.params["bk"] * choice.params["tm"] * choice.params["tn"]
    assert ops_.count("FFMA") % step == 0
    # the operands of the products come from the shared tiles, which the asynchronous copies gather:
    # no other global load (before the lowering fix, the register copies of the inlined filter
    # re-gathered it from global memory, with 192 bytes of local memory)
    assert "LDGSTS" in " ".join(ops_) and not any(o.startswith("LDG.") for o in ops_)
    assert sum(o.startswith(("LDS.128", "LDS.64")) for o in ops_) >= ops_.count("FFMA") // step * choice.params["bk"]
    res = kern.resources[gemm.name]
    assert res.spill_stores == 0 and res.stack_bytes == 0
    assert rest.block == (256, 1, 1)


def test_small_nchw_convolutions_stay_direct():
    # at most GEMV_ROWS filters (the GEMM's rows) or tensor-core operand types: the direct kernel
    assert "Ipad" in ops.conv2d(2, 5, 9, 7, 11, 3, 3, 1, 1).schedule(SM90A).stage_names()
    assert "O" in ops.conv2d(1, 8, 9, 7, 32, 3, 3, 1, 1, dtype="float16").schedule(SM90A).stage_names()
    assert "B" not in ops.conv2d(1, 8, 9, 7, 32, 3, 3, 1, 1, dtype="float16").schedule(SM90A).stage_names()


@pytest.mark.parametrize("dims,rows,chunks", [((1, 7, 7, 8, 6, 3, 3, 1, 1), True, 2),
                                              ((2, 5, 6, 6, 5, 3, 3, 2, 1), False, 3),
                                              ((1, 4, 5, 4, 3, 1, 1, 1, 0), False, 4),
                                              ((1, 6, 5, 4, 3, 3, 2, 1, 1), True, 1)],
                         ids=["rows-and-channels", "channels-stride2", "1x1", "rows-3x2"])
def test_split_implicit_gemm_is_the_convolution(dims, rows, chunks):
    # the split-K algorithm (a chunk per filter row and/or channel chunks, then their sum),
    # unscheduled on the CPU, against NumPy
    from polytile.ops.igemm import conv2d_igemm_split_func
    op = ops.conv2d_igemm(*dims, dtype="float32")
    kern = pt.build(pt.Schedule(conv2d_igemm_split_func(*dims, dtype="float32", rows=rows, channel_chunks=chunks)),
                    "cpu")
    i, w = op.make_inputs(np.random.default_rng(sum(dims)))
    assert ops.rel_error(kern(i, w), op.reference(i, w)) < 1e-6
    with pytest.raises(pt.PolytileError, match="channel_chunks=4 must divide the 6 input channels"):
        conv2d_igemm_split_func(1, 5, 5, 6, 4, 3, 3, channel_chunks=4)


def test_implicit_gemms_of_few_tiles_split_their_reduction():
    # ResNet-50's 3×3 512→512 on 7×7 at batch 1: 8 output tiles for 132 SMs (35 µs, cuDNN 15.5):
    # split in chunks of the filter rows and channels; a layer of many tiles is not split; a GPU of
    # 16 SMs splits less
    from polytile.ops.conv_choice import igemm_choice

    def split(target, N, H, C, K, R):
        c = igemm_choice(target, N * H * H, C, K, R, R, 2)
        return (R if c.rows else 1) * c.chunks
    assert split(SM90A, 1, 7, 512, 512, 3) >= 8
    assert split(SM90A, 32, 56, 64, 256, 1) == 1
    assert split(dataclasses.replace(SM90A, sms=16), 1, 7, 512, 512, 3) < split(SM90A, 1, 7, 512, 512, 3)
    sched = ops.conv2d_igemm(1, 7, 7, 512, 512, 3, 3, 1, 1).schedule(SM90A)
    assert sched.stage_names() == ["P", "O"]


def test_implicit_gemm_model_counts_the_gathered_tiles():
    # ResNet-50's 3×3 512→512 on 7×7 at batch 32, measured on an H100 (lead's probe, 2026-11-28):
    # 128×64 tiles 45.9 µs unsplit, 50.3 in 2 channel chunks (two blocks an SM: their gathered input
    # tiles do not overlap), 128×128 tiles in 2 chunks 32.7 (cuDNN 20.4). The model without the
    # gather rate ranked 2 chunks of 128×64 first (25 µs against 30 unsplit) and never weighed 128×128
    from polytile.ops.conv_choice import igemm_choice, igemm_options
    seconds = {(o.params["bm"], o.params["bn"], o.rows, o.chunks): o.seconds
               for o in igemm_options(SM90A, 1568, 512, 512, 3, 3, 2)}
    assert seconds[(128, 128, False, 2)] < seconds[(128, 64, False, 1)] < seconds[(128, 64, False, 2)]
    choice = igemm_choice(SM90A, 1568, 512, 512, 3, 3, 2)
    assert (choice.params["bm"], choice.params["bn"], choice.rows, choice.chunks) == (128, 128, False, 2)
    # a target without the gather rate keeps the tiles of igemm_kernel and splits only few tiles
    sm80 = igemm_choice(SM80, 1568, 512, 512, 3, 3, 2)
    assert (sm80.params["bm"], sm80.params["bn"], sm80.rows, sm80.chunks) == (64, 64, False, 1)


def test_implicit_gemm_reads_its_input_not_the_gathered_matrix():
    # ResNet-50's 3×3 64→64 on 56×56 at batch 32 in 128×64 tiles took 31.6 µs on an H100: the
    # model's DRAM floor counted the gathered 100352 × 576 matrix (115 MB, 9 times the input: 45 µs)
    from polytile.ops.conv_choice import igemm_options
    seconds = {(o.params["bm"], o.params["bn"], o.rows, o.chunks): o.seconds
               for o in igemm_options(SM90A, 100352, 64, 64, 3, 3, 2, 100352, 2)}
    assert seconds[(128, 64, False, 1)] < 40e-6


def test_implicit_gemm_tiles_follow_the_channel_and_filter_counts():
    # measured on an H200 (benchmarks/conv_choices.py, 2026-11-28): 96 → 160 channels on 45×45 in 3
    # tiles of 64 filters (the last half empty, each gathering the same input tile) 41.5 µs, in 2
    # tiles of 128 25.8 (cuDNN 15.9); 48 → 72, 5×5 stride 2 on mma.sync: K tiles of 32 (a third
    # zeros, no whole channel chunks) unsplit 25.1 µs, K tiles of 16 split over the filter rows 13.7
    # (cuDNN 12.3); ResNet-50's 3×3 128→128 on 28×28 at batch 1: 6 chunks (3 K steps each) 11.5 µs,
    # 3 chunks 13.4 — the loads of these L2-resident operands wait for the L2, not DRAM
    from polytile.ops.conv_choice import igemm_choice
    choice = igemm_choice(SM90A, 3 * 45 * 45, 96, 160, 3, 3, 2, 3 * 45 * 45, 2)
    assert choice.kernel == "wgmma" and choice.params["bn"] == 128
    choice = igemm_choice(SM90A, 2 * 32 * 32, 48, 72, 5, 5, 2, 2 * 64 * 64, 2)
    assert (choice.kernel, choice.params["bk"], choice.rows, choice.chunks) == ("mma", 16, True, 1)
    choice = igemm_choice(SM90A, 784, 128, 128, 3, 3, 2, 784, 2)
    assert (choice.rows, choice.chunks) == (True, 2)


@needs_nvcc
@pytest.mark.parametrize("C", [8, 16, 24, 32])
def test_one_by_one_convolutions_of_few_channels_build(C):
    # MobileNet-v2's expansion (1×1, 16 → 96 on 112×112) failed to build: fewer channels than a K
    # tile left the split choice no option at all (not even "no split"); fp16 on the GPU (lead's run
    # of 8dc97fc, 2026-11-28)
    from polytile.ops.conv_choice import igemm_choice
    choice = igemm_choice(SM90A, 12544, C, 96, 1, 1, 2)
    assert (choice.rows, choice.chunks) == (False, 1)
    kern = ops.conv2d_igemm(1, 112, 112, C, 96, 1, 1).build(SM90A)
    assert all(kern.resources[k.name].stack_bytes == 0 for k in kern.kernels)


@needs_nvcc
def test_implicit_gemm_pipelines_no_deeper_than_their_k_loop():
    # a 1×1 convolution of 64 channels is one K step: one stage of shared tiles (4 held one
    # 128×128 block per SM); a 3×3 one keeps the default depth
    from polytile.ops.conv_choice import igemm_kernel
    assert igemm_kernel(SM90A, 100352, 64, 256, 1)[1]["stages"] == 1
    assert igemm_kernel(SM90A, 100352, 64, 256, 9)[1]["stages"] == 4
    assert igemm_kernel(SM80, 100352, 144, 24, 1)[1]["stages"] == 3  # 5 K steps of 32 channels
    # 16 channels: K tiles of 16 (not 32, half zeros)
    assert igemm_kernel(SM90A, 401408, 16, 96, 1)[1]["bk"] == 16
    kern = ops.conv2d_igemm(2, 14, 14, 64, 256, 1, 1).build(SM90A)
    (k,) = kern.kernels
    assert k.dynamic_shared <= 2 * 128 * 64 * 2 + 1024


@needs_nvcc
@pytest.mark.parametrize("target", [SM90A, SM80], ids=["sm_90a", "sm_80"])
def test_split_implicit_gemm_builds(target):
    op = ops.conv2d_igemm(1, 7, 7, 512, 512, 3, 3, 1, 1)
    kern = op.build(target)
    partials, total = kern.kernels
    assert int(partials.grid[2].value) > 1  # the chunks along blockIdx.z
    sass = _sass(kern, partials.name)
    assert ("HGMMA" if target is SM90A else "HMMA") in sass and not re.search(r"\bLDL\b|\bSTL\b", sass)


def test_fp32_gemm_ir_products_are_whole():
    from polytile.ops.gpu_schedules import gemm_cuda
    s = pt.Schedule(ops.matmul(129, 131, 37, "float32").func)
    gemm_cuda(s, "C", "A", "B", bm=64, bn=64, tm=8, tn=8)
    text = str(pt.lower(s, SM90A))
    # the K step's products: C_local indexed by constants, no test; the write-back tests the bounds
    assert "C_local_63 = (C_local_63 + (A_C_local[7] * B_C_local[7]))" in text
    body = text.split("pt_cp_async_commit()")[-1].split("pt_cp_async_wait(0)")[0]
    assert " if " not in body.replace("if ((ko", "")
    assert "if ((((" in text.split("pt_cp_async_wait(0)")[-1]


def test_whole_register_tiles_refuse_k_tiles_across_chunks():
    from polytile.ops.gpu_schedules import gemm_cuda, sum_partials
    op = ops.matmul(64, 64, 100, "float32", split_k=2)  # chunks of 50: 8-wide K tiles would cross them
    s = pt.Schedule(op.func)
    gemm_cuda(s, "P", "A", "B", bm=32, bn=64, tm=4, tn=4, batch="s")
    sum_partials(s, "C")
    with pytest.raises(ScheduleError, match="whole register tiles of P: the reduction over k has 50 iterations, not "
                                            "a multiple of the 8-wide K tile"):
        pt.lower(s, SM90A)
    # the default takes K tiles that divide the chunks
    assert gemm_choice(SM90A, 64, 64, 100, as_dtype("float32"), split_k=2).params["bk"] == 2


@needs_nvcc
@pytest.mark.parametrize("dims,per_thread,channels", [((32, 224, 224, 3, 64, 7, 7, 2, 3), 4, 16),
                                                      ((1, 224, 224, 3, 64, 7, 7, 2, 3), 2, 16),
                                                      ((2, 29, 31, 3, 24, 7, 7, 2, 3), 1, 8)],
                         ids=["resnet-stem-n32", "resnet-stem-n1", "odd"])
def test_three_channel_convolution_products_from_registers(dims, per_thread, channels):
    # per tap and channel a thread gathers its pixels' inputs once and reads the filter row once (as
    # vectors) for per_thread × channels products. Before: one pixel and 16 channels per thread, the
    # gather and a 2-byte shared load redone for every product (ResNet-50's stem at batch 32:
    # 16 LDG.U16 + 16 LDS.U16 per 16 FFMA; 1687 µs on the H100, cuDNN 0.05×)
    kern = ops.conv2d_igemm(*dims).build(SM75)  # without mma.sync: the CUDA cores
    (k,) = kern.kernels
    ops_ = _opcodes(_sass(kern, k.name))
    products = ops_.count("FFMA")
    assert products % (per_thread * channels) == 0
    steps = products // (per_thread * channels)
    assert sum(o.startswith("LDG.E.U16") for o in ops_) == steps * per_thread
    assert sum(o.startswith("LDS") for o in ops_) <= steps * channels * 2 // 8  # 8-byte vectors or wider
    # main's combine_loads (610ce82) keeps the filter row a 16-bit array filled by 16-byte stores:
    # ptxas then spills 12 bytes of it at batch 32 (was none, 128 registers); at most that much
    res = kern.resources[k.name]
    assert res.spill_stores <= 16 and res.stack_bytes <= 16


def test_three_channel_convolutions_have_a_cuda_core_space():
    # the tensor-core space has no valid point below 16 channels; with mma.sync the default's
    # channel-padded rows have their own template (conv2d_igemm_rows), without it the CUDA-core one
    # reaches the default's register tiles (pixels per thread × channels per block)
    from polytile.target import CUDATarget
    from polytile.tune import make_task
    shape = dict(N=2, H=30, W=30, C=3, K=24, R=7, S=7, stride=2, padding=3)
    assert make_task("conv2d_igemm", SM90A, **shape).template.name == "conv2d_igemm_rows"
    turing = CUDATarget(arch="sm_75", name="T4")
    task = make_task("conv2d_igemm", turing, **shape)
    assert task.template.name == "conv2d_igemm_cuda"
    assert {"pixels", "per_thread", "channels"} <= {d.name for d in task.space.decisions}
    (digits,) = task.space.sample_valid(np.random.default_rng(0), 1)
    pt.lower(task.schedule(task.space.config(digits).values), turing)
    assert make_task("conv2d_igemm", SM90A, N=1, H=14, W=14, C=64, K=64, R=3, S=3, stride=1,
                     padding=1).template.name == "conv2d_igemm_choices"


def test_a_cuda_core_gemm_of_few_tiles_over_an_awkward_k_is_split_in_chunks_of_whole_k_tiles():
    # 318×24×2936 in float32 (random shapes, seed 97052): 10 tiles of 32×64 and no even split (2936 = 8 · 367):
    # 154 µs on an H200 against torch's 16 unsplit; chunks of whole 8-wide K tiles, the last one shorter
    choice = gemm_choice(SM90A, 318, 24, 2936, as_dtype("float32"))
    assert choice.kernel == "cuda" and choice.split >= 16, choice
    length = choice.chunk or -(-2936 // choice.split)
    assert length % choice.params["bk"] == 0 and (choice.split - 1) * length < 2936 <= choice.split * length
    kern = ops.matmul(318, 24, 2936, "float32").schedule(SM90A)
    P = kern.func.computations[0]
    assert P.name == "P" and int(P.shape[0].value) == choice.split
    # built for the GPU's architecture (nvcc), the whole-tile check of the split kernel passing
    assert "__global__" in pt.build(kern, SM90A).source


def test_channels_of_no_whole_16_byte_vectors_are_padded():
    # 81 channels of float16 (162-byte pixels): every gathered copy was element by element (random shapes,
    # seed 97052: 32×19×19, 81 → 12 filters, 5×5 stride 2 in 303 µs on an H200, cuDNN 32 µs); padded to 96
    # the default reads the channel-padded copy (igemm_rows), as for an image's colors
    from polytile.ops.igemm import padded_channels, pads_channels
    from polytile.tune import make_task
    assert [padded_channels(C, 5)[0] for C in (3, 5, 12, 16, 17, 81, 209)] == [4, 8, 16, 16, 32, 96, 224]
    assert pads_channels(81, 2) and pads_channels(3, 2) and not pads_channels(64, 2) and not pads_channels(84, 4)
    sched = ops.conv2d_igemm(32, 19, 19, 81, 12, 5, 5, 2, 2, dtype="float16").schedule(SM90A)
    assert "X" in sched.stage_names()
    assert "X" not in ops.conv2d_igemm(32, 19, 19, 80, 12, 5, 5, 2, 2, dtype="float16").schedule(SM90A).stage_names()
    # the tuning template of the padded copy applies too (its first configuration: the default)
    task = make_task("conv2d_igemm", SM90A, N=32, H=19, W=19, C=81, K=12, R=5, S=5, stride=2, padding=2)
    assert task.template.name == "conv2d_igemm_rows"


@needs_nvcc
@pytest.mark.parametrize("dims", [(2, 12, 12, 280, 112, 7, 7, 1, 3), (2, 8, 8, 376, 96, 3, 3, 1, 1)],
                         ids=["280-112-7x7", "376-96-3x3"])
def test_warpgroup_convolutions_of_fewer_filters_than_a_wide_tile_build(dims):
    # random shapes (seed 99391, H200): the default took 128-wide wgmma tiles over 112 and 96 filters,
    # which the filter's 128-byte swizzled tile refused (a ScheduleError from the default schedule)
    op = ops.conv2d_igemm(*dims, dtype="float16")
    kern = pt.build(op.schedule(SM90A), SM90A)
    assert "wgmma" in kern.source


def test_torch_result_is_compared_in_polytile_layout():
    # a channels-last convolution's torch result is NCHW to torch: reshaped as it was, its error against
    # the reference of rows of pixels was √2 on every convolution of the random draws (seed 27183)
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    import shapes

    from polytile.runtime.timing import rel_error
    dims = dict(N=2, H=5, W=7, C=3, K=11, R=3, S=1, stride=1, padding=1)
    w = shapes._w("conv.test", "conv2d_igemm", "float32", "conv", **dims)
    inputs, fn, ref_fn = shapes.torch_case(w, w.op(), 7, device="cpu")
    ref = ref_fn()
    assert rel_error(shapes.torch_rows(w, fn(*inputs)).reshape(ref.shape), ref) < 1e-6
    assert rel_error(fn(*inputs).reshape(ref.shape), ref) > 0.5  # the comparison before
