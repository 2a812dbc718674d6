"""CUDA code generation without a GPU: every operator's CUDA source compiles with nvcc for sm_90a and
sm_80, and the generated kernels have the structure we expect (launch bounds, barriers, guards,
vector copies, registers)."""

import block_emulator
import numpy as np
import pytest
from source_text import body

import polytile as pt
from polytile import ops

pytestmark = pytest.mark.needs_nvcc

CASES = [
    ("matmul", dict(M=300, N=200, K=100)),
    ("batch_matmul", dict(batch=3, M=130, N=70, K=50)),
    ("dense", dict(M=100, N=130, K=70)),
    ("softmax", dict(M=37, N=1000)),
    ("layernorm", dict(M=29, N=777)),
    ("segment_sum", dict(rows=50, nnz=400)),
    ("spmm", dict(rows=30, cols=40, n=100, nnz=200)),
    ("conv2d", dict(N=2, C=5, H=13, W=15, K=11, R=3, S=3, padding=1)),
]


@pytest.mark.parametrize("name,shape", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_op_compiles(name, shape, arch):
    op = ops.get(name, **shape)
    kern = op.build(f"cuda:{arch}")
    assert kern.cubin[:4] == b"\x7fELF"
    assert "__launch_bounds__" in kern.source
    assert set(kern.resources) >= {k.name for k in kern.kernels}


def test_demo_gpu_cases_compile():
    """What ``make demo`` runs on a GPU builds for one (tile sizes, shared memory within the limit)."""
    from polytile.demo import gpu_cases
    for op in gpu_cases(4096):
        kern = op.build("cuda:sm_90a")
        assert all(r.spill_stores == 0 for r in kern.resources.values()), op.key


def _gemm(stages):
    from polytile.ops.gpu_schedules import gemm_cuda
    s = pt.create_schedule(ops.matmul(512, 512, 512).func)
    gemm_cuda(s, "C", "A", "B", stages=stages)
    kern = pt.build(s, "cuda:sm_90a")
    return kern, body(kern.source)


def test_matmul_kernel_structure_without_pipeline():
    kern, src = _gemm(1)
    assert src.count("__syncthreads();") == 2  # after the tile copies; before the next overwrite
    assert "__shared__ __align__(16) float A_shared[(8) * (132)];" in src  # rows padded by 16 bytes
    assert "*(uint4*)&B_shared" in src  # 16-byte cooperative copies of B
    assert "cp_async" not in src


def test_matmul_kernel_structure():
    kern, src = _gemm(3)
    assert src.count("__syncthreads();") == 1  # one per iteration, after waiting for its tile
    assert "__shared__ __align__(16) float A_shared[(3) * (8) * (132)];" in src
    assert src.count("pt_cp_async16(&B_shared") == 3  # two prologue stages and the steady state
    assert "pt_cp_async_wait<1>();" in src and "pt_cp_async_wait<0>();" in src
    (k,) = kern.kernels
    assert k.block == (16, 16, 1) and tuple(int(g.value) for g in k.grid) == (4, 4, 1)
    r = kern.resources[k.name]
    assert r.registers <= 128 and r.stack_bytes == 0 and r.spill_stores == 0  # the tiles live in registers


def test_guards_only_where_needed():
    def elementwise(n):
        A = pt.placeholder((n,), "float32", "A")
        B = pt.compute((n,), lambda i: A[i] * 2.0, "B")
        s = pt.create_schedule(pt.Func([A], [B]))
        s[B].split("i", 128, "bx", "tx").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
        return pt.lower(s, "cuda:sm_90a")

    assert "if" not in str(elementwise(1024))  # 128 divides 1024: no guard
    assert "if (tx < " in str(elementwise(1000)).replace("(", "(").replace("int64(threadIdx.x)", "tx") or \
        "if" in str(elementwise(1000))


def test_triangular_launch_is_exact():
    N = 100
    A = pt.placeholder((N, N), "float32", "A")
    L = pt.compute((N, N), lambda i, j: A[i, j] + 1.0, "L", where=lambda i, j: j <= i)
    s = pt.create_schedule(pt.Func([A], [L]))
    s[L].split("j", 32, "jb", "jt").bind("i", "blockIdx.x").bind("jt", "threadIdx.x")
    low = pt.lower(s, "cuda:sm_90a")
    text = str(low)
    assert "grid=(100, 1, 1) block=(32, 1, 1)" in text


def test_cross_thread_reduction_needs_reassociate():
    X = pt.placeholder((8, 100), "float32", "X")
    j = pt.reduce_axis(100, "j")
    s1 = pt.compute((8,), lambda i: pt.sum(X[i, j], axis=j), "s1")
    s = pt.create_schedule(pt.Func([X], [s1]))
    s[s1].split("j", 32, "jo", "jt")
    with pytest.raises(pt.ScheduleError, match="breaks a dependence"):
        s[s1].reorder("i", "jt", "jo")
    s[s1].reassociate().reorder("i", "jt", "jo")
    s[s1].bind("i", "blockIdx.x").bind("jt", "threadIdx.x")
    kern = pt.build(s, "cuda:sm_90a")
    assert "pt_block_allreduce_sum(" in body(kern.source)


def test_cross_thread_reduction_into_elements_of_an_inner_loop_is_refused():
    # a K loop bound to the lanes with the output's columns (jv) inside it: each thread's partial result
    # was one scalar summing every column, then written with jv out of scope (nvcc: "jv is undefined")
    A = pt.placeholder((1, 77), "float16", "A")
    B = pt.placeholder((77, 100), "float16", "B")
    k = pt.reduce_axis(77, "k")
    C = pt.compute((1, 100), lambda i, j: pt.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k),
                   "C")
    s = pt.create_schedule(pt.Func([A, B], [C]))
    st = s[C].reassociate()
    st.split("j", 8, "jo", "jv").split("jo", 8, "bj", "ty").split("k", 32, "ko", "kt")
    st.reorder("bj", "ty", "kt", "ko", "i", "jv")
    st.bind("bj", "blockIdx.x").bind("ty", "threadIdx.y").bind("kt", "threadIdx.x")
    with pytest.raises(pt.LoweringError, match=r"into C, whose elements are chosen by loop\(s\) jv inside it"):
        pt.lower(s, "cuda:sm_90a")
    st.reorder("bj", "ty", "i", "jv", "kt", "ko")  # one element per tree: accepted, and the sum is per column
    low = pt.lower(s, "cuda:sm_90a")
    assert "pt_group_allreduce_sum(C_part, 32)" in str(low)
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((1, 77)).astype(np.float16), rng.standard_normal((77, 100)).astype(np.float16)
    (c,) = block_emulator.run(low, [a, b, np.full((1, 100), np.nan, np.float32)])
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_shared_cache_some_threads_do_not_need_is_filled_whole():
    # polytile fuzz --seed 1 --case 2 --target cuda: a shared cache at a thread loop whose footprint is empty
    # for thread 0 (k runs over [0, i)): its fill, spread over the threads, sat under `if (i_t >= 1)`, so
    # thread 0's share (elements 0 and 1) was never written and the other threads read them uninitialized
    A = pt.placeholder((16,), "float32", "A")

    def prefix_sum(i):
        k = pt.reduce_axis((0, i), "k")
        return pt.sum(A[k], axis=k)
    T = pt.compute((11,), prefix_sum, "T")
    s = pt.create_schedule(pt.Func([A], [T]))
    s["T"].split("i", 16, "i_b", "i_t").bind("i_b", "blockIdx.x").bind("i_t", "threadIdx.x")
    s["T"].cache_identity("A", "i_t", loc="shared")
    low = pt.lower(s, "cuda:sm_90a")
    a = np.random.default_rng(3).standard_normal(16).astype(np.float32)
    (t,) = block_emulator.run(low, [a, np.full(11, np.nan, np.float32)])
    np.testing.assert_allclose(t, [a[:i].astype(np.float64).sum() for i in range(11)], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("body", ["a + b", "a * 2 - b + 1", "m.maximum(a, b) - 3"])
def test_cross_thread_reduction_of_a_sum_of_terms(body):
    # polytile fuzz --seed 2 --case 368 --target cuda: a body that is a sum of terms is folded into the
    # accumulator as `T = (T + a) + b`, `(a + b) + T` or `(T + a) - 3`, which were not taken for reductions:
    # the threads of the reduction loop each added into T at once (a race; 6 of 7 sums wrong)
    A = pt.placeholder((9, 13), "int64", "A")
    B = pt.placeholder((9, 13), "int64", "B")
    k = pt.reduce_axis(13, "k")
    T = pt.compute((9,), lambda i: pt.sum(eval(body, {"a": A[i, k], "b": B[i, k], "m": pt}), axis=k), "T")
    s = pt.create_schedule(pt.Func([A, B], [T]))
    s["T"].reassociate().split("i", 4, "i_b", "i_t").split("k", 4, "k_s", "k_t")
    s["T"].bind("i_b", "blockIdx.x").bind("i_t", "threadIdx.y").bind("k_t", "threadIdx.x")
    s["T"].reorder("i_b", "i_t", "k_t", "k_s")
    low = pt.lower(s, "cuda:sm_90a")
    assert "pt_group_allreduce_sum(T_part, 4)" in str(low)
    rng = np.random.default_rng(11)
    a, b = rng.integers(-50, 50, (9, 13)), rng.integers(-50, 50, (9, 13))
    (t,) = block_emulator.run(low, [a, b, np.zeros(9, np.int64)])
    np.testing.assert_array_equal(t, eval(body, {"a": a, "b": b, "m": np}).sum(1))


def test_a_write_cache_inside_a_thread_bound_reduction_loop_is_refused():
    # each thread summed its part in its own register and wrote it over the others' (fuzz --target cuda,
    # seed 2 cases 9/281/384): the threads' partial sums were never combined
    A = pt.placeholder((4, 64), "float32", "A")
    k = pt.reduce_axis(64, "k")
    T = pt.compute((4,), lambda i: pt.sum(A[i, k], axis=k), "T")
    s = pt.create_schedule(pt.Func([A], [T]))
    s[T].reassociate().split("k", 32, "k_s", "k_t").bind("i", "blockIdx.x").bind("k_t", "threadIdx.x")
    s[T].reorder("i", "k_t", "k_s").cache_write("k_t", loc="local")
    with pytest.raises(pt.ScheduleError, match=r"write cache T_local of T is placed at or inside its reduction "
                                               r"loop\(s\) k_t \(threadIdx.x\) bound to threads"):
        pt.lower(s, "cuda:sm_90a")
    s = pt.create_schedule(pt.Func([A], [T]))  # without the write cache: the tree, and the right sums
    s[T].reassociate().split("k", 32, "k_s", "k_t").bind("i", "blockIdx.x").bind("k_t", "threadIdx.x")
    s[T].reorder("i", "k_t", "k_s")
    low = pt.lower(s, "cuda:sm_90a")
    a = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    (t,) = block_emulator.run(low, [a, np.full(4, np.nan, np.float32)])
    np.testing.assert_allclose(t, a.astype(np.float64).sum(axis=1), rtol=1e-6, atol=1e-6)


def test_host_level_loop_is_refused():
    A = pt.placeholder((64,), "float32", "A")
    B = pt.compute((64,), lambda i: A[i] * 2.0, "B")
    s = pt.create_schedule(pt.Func([A], [B]))
    with pytest.raises(pt.LoweringError, match="bound to blockIdx"):
        pt.lower(s, "cuda:sm_90a")


def _thread_tiled_matmul():
    A = pt.placeholder((64, 32), "float32", "A")
    B = pt.placeholder((32, 64), "float32", "B")
    k = pt.reduce_axis(32, "k")
    C = pt.compute((64, 64), lambda i, j: pt.sum(A[i, k] * B[k, j], axis=k), "C")
    s = pt.create_schedule(pt.Func([A, B], [C]))
    st = s[C].split("i", 16, "bi", "ti").split("j", 16, "bj", "tj").reorder("bi", "bj", "ti", "tj", "k")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("ti", "threadIdx.y").bind("tj", "threadIdx.x")
    return s, st


@pytest.mark.parametrize("cache", [lambda st: st.cache_write("bj", loc="local"),
                                   lambda st: st.cache_write("ti", loc="local"),
                                   lambda st: st.cache_write(None),
                                   lambda st: st.cache_identity("A", "bi", loc="local")],
                         ids=["write-block", "write-between-threads", "write-top-auto", "read-block"])
def test_register_cache_above_thread_loops_is_refused(cache):
    """Registers belong to one thread: a per-thread cache spanning other threads' elements would be
    filled or written back by one thread alone (wrong results), so lowering refuses it."""
    s, st = _thread_tiled_matmul()
    cache(st)
    with pytest.raises(pt.ScheduleError, match=r"of C lives in the registers of one thread .* thread-bound "
                                                r"loop\(s\) .*tj \(threadIdx.x\).* at or inside loop tj"):
        pt.lower(s, "cuda:sm_90a")


def test_register_cache_inside_thread_loops_is_per_thread():
    s, st = _thread_tiled_matmul()
    st.cache_write("tj", loc="local").cache_identity("A", "tj", loc="local")
    text = str(pt.lower(s, "cuda:sm_90a"))
    assert "var C_local_0: float32" in text and "== 0" not in text  # every thread writes its own result
    s, st = _thread_tiled_matmul()
    st.cache_write("bj", loc="shared")  # one buffer per block, written back by all its threads
    assert "for coop" in str(pt.lower(s, "cuda:sm_90a"))


def test_thread_loop_extent_must_be_constant():
    """A loop of parametric extent bound to threads is refused at bind (it used to be accepted, and
    refused only when lowered for a GPU), and the schedule is left as it was; the same loop split by
    a constant binds its inner loop, builds, and computes the result."""
    N = pt.param("N")
    A = pt.placeholder((N,), "float32", "A")
    B = pt.compute((N,), lambda i: A[i] * 2.0, "B")
    s = pt.create_schedule(pt.Func([A], [B]))
    s[B].split("i", 4, "io", "ii").reorder("ii", "io").bind("ii", "blockIdx.x")
    with pytest.raises(pt.ScheduleError, match="loop io of B cannot be bound to threadIdx.x: its extent is not a "
                                               "constant .* split it by a constant and bind the inner loop"):
        s[B].bind("io", "threadIdx.x")
    assert s[B].state.tags == {"ii": "blockIdx.x"}
    s = pt.create_schedule(pt.Func([A], [B]))
    s[B].split("i", 64, "bi", "ti").bind("bi", "blockIdx.x").bind("ti", "threadIdx.x")
    assert "threadIdx.x" in str(pt.lower(s, "cuda:sm_90a"))


def test_ptxas_report_parsed():
    from polytile.runtime.cuda import parse_ptxas
    text = ("ptxas info    : Compiling entry function 'k0' for 'sm_90a'\n"
            "ptxas info    : Function properties for k0\n"
            "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
            "ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem, 400 bytes cmem[0]\n")
    r = parse_ptxas(text)["k0"]
    assert (r.registers, r.shared_bytes, r.stack_bytes, r.spill_stores) == (40, 8192, 8, 4)


@pytest.mark.needs_nvcc
def test_int64_data_is_64_bit_under_32_bit_indexing():
    """Kernels index with 32-bit ints where every buffer has fewer than 2^31 elements, but int64
    values of data stay 64-bit: an int64 register accumulator was declared ``int`` and a cast to
    int64 printed ``(int)`` (found reading the source; both truncated values past 2^31)."""
    A = pt.placeholder((1000,), "int64", "A")
    F = pt.placeholder((1000,), "float64", "F")
    C = pt.compute((1000,), lambda i: pt.cast("int64", F[i]) + A[i] * A[i], "C")
    k = pt.reduce_axis(64, "k")
    S = pt.compute((1000,), lambda i: pt.sum(A[k] * A[i], axis=k), "S")
    s = pt.create_schedule(pt.Func([A, F], [C, S]))
    for st in (s[C], s[S]):
        st.split("i", 128, "bi", "ti").bind("bi", "blockIdx.x").bind("ti", "threadIdx.x")
    s[S].cache_write("ti", loc="local", name="acc")
    kern = pt.build(s, "cuda:sm_90a")
    assert kern.index32
    text = body(kern.source)
    assert "const int ti = " in text  # indices: 32-bit
    assert "long long acc_0;" in text and "((long long)__ldg(&F[" in text
    assert not any(t in text for t in ("int acc", "(int)__ldg", "(int)F["))


@pytest.mark.parametrize("dtype, headers", [("float32", []), ("float16", ["cuda_fp16.h"]),
                                            ("bfloat16", ["cuda_bf16.h"])])
def test_a_source_includes_the_16_bit_headers_it_uses(dtype, headers):
    """Each 16-bit header costs nvcc about 0.1 s per kernel: a source includes those whose types it names
    (the matmul and softmax kernels compile, so nothing they use was left out)."""
    for name, shape in (("matmul", dict(M=37, N=29, K=61)), ("softmax", dict(M=7, N=101))):
        kern = ops.get(name, dtype=dtype, **shape).build("cuda:sm_90a")
        included = [line.split("<")[1].rstrip(">") for line in kern.source.splitlines()
                    if line.startswith("#include <cuda_")]
        assert included == headers, (name, included)
        assert kern.cubin[:4] == b"\x7fELF"


# --- found by `polytile fuzz --target cuda` (seed 2): CUDA source that nvcc rejected ----------------------

def test_a_bool_result_read_by_a_later_kernel_compiles(nvcc):
    # case 36: __ldg has no bool overload
    N = pt.param("N")
    T = pt.compute((N,), lambda i: i != 2, "T")
    U = pt.compute((16, N), lambda i, j: pt.cast("float16", T[j]), "U")
    s = pt.create_schedule(pt.Func([], [T, U], constraints=[N >= 2]))
    s["T"].split("i", 8, "i_b", "i_t").bind("i_b", "blockIdx.x").bind("i_t", "threadIdx.x")
    s["U"].split("j", 8, "j_b", "j_t").bind("j_b", "blockIdx.x").bind("j_t", "threadIdx.x").reorder("j_b", "j_t", "i")
    kern = pt.build(s, "cuda:sm_90a")
    assert "__ldg(&T[" not in kern.source


def test_a_group_reduction_of_8_bit_integers_compiles(nvcc):
    # case 133: __shfl_xor_sync of an int8_t returns an int, and pt_op_sum's (T, T) did not match
    A = pt.placeholder((11, 8), "int8", "A")
    k = pt.reduce_axis(8, "k")
    U = pt.compute((11,), lambda i: pt.sum(A[i, k], axis=k), "U")
    s = pt.create_schedule(pt.Func([A], [U]))
    s["U"].reassociate().split("i", 4, "i_b", "i_t").split("k", 4, "k_s", "k_t")
    s["U"].bind("i_b", "blockIdx.x").bind("i_t", "threadIdx.y").bind("k_t", "threadIdx.x")
    s["U"].reorder("i_b", "i_t", "k_t", "k_s")
    low = pt.lower(s, "cuda:sm_90a")
    a = np.random.default_rng(5).integers(-9, 9, (11, 8)).astype(np.int8)
    (u,) = block_emulator.run(low, [a, np.zeros(11, np.int8)])
    np.testing.assert_array_equal(u, a.astype(np.int64).sum(1).astype(np.int8))
    assert "pt_group_allreduce_sum(" in pt.build(s, "cuda:sm_90a").source


def test_a_half_read_back_after_other_threads_wrote_it_compiles(nvcc):
    # case 41: a float16 result read through a volatile pointer (other threads of the block wrote it):
    # a volatile __half converts to nothing (nvcc: no operator "+" for volatile __half and float)
    N = pt.param("N")
    A = pt.placeholder((N, N + 2, 17), "float16", "A")
    idx0 = pt.placeholder((7,), "int64", "idx0", value_range=(0, N - 1))

    def f_T(i):
        k = pt.reduce_axis((0, i), "k")
        return pt.sum(pt.select(i != k, -2.5, pt.cast("float16", k)) *
                      pt.select((k >= 1) & (k - 1 < N + 2), A[idx0[i], k - 1, k], 1.0), axis=k)
    T = pt.compute((7,), f_T, "T", where=lambda i: i != 4)
    U = pt.compute((31, 7), lambda i, j: pt.maximum(1.5, T[0]), "U")
    s = pt.create_schedule(pt.Func([A, idx0], [U], constraints=[N >= 1]))
    s["T"].reassociate().split("i", 256, "i_b", "i_t").bind("i_b", "blockIdx.x").bind("i_t", "threadIdx.x")
    s["U"].split("j", 2, "j_b", "j_t").bind("j_b", "blockIdx.x").bind("j_t", "threadIdx.x").reorder("j_b", "j_t", "i")
    kern = pt.build(s, "cuda:sm_90a")
    assert "__half2float(__ushort_as_half(((volatile unsigned short*)T)[" in kern.source


def test_a_threads_array_of_parametric_size_is_refused():
    # case 432: `double T_local[(1) * (N)]` (nvcc: expression must have a constant value)
    N = pt.param("N")
    A = pt.placeholder((4,), "float64", "A")
    T = pt.compute((17, N), lambda i, j: A[i % 4] * j, "T")
    s = pt.create_schedule(pt.Func([A], [T], constraints=[N >= 0]))
    s["T"].split("i", 16, "i_b", "i_t").bind("i_b", "blockIdx.x").bind("i_t", "threadIdx.x")
    s["T"].cache_write("i_t", loc="local")
    with pytest.raises(pt.LoweringError, match=r"T_local in local memory .* size that depends on parameters"):
        pt.build(s, "cuda:sm_90a")


def test_an_unrolled_loop_holding_a_shared_buffer_compiles(nvcc):
    # seed 2 cases 122, 300, 457, 486 (seed 3: 81, 166): unroll or vectorize of a loop around a shared
    # allocation copied `__shared__ float T_local[3]` into one scope (nvcc: "already been declared")
    A = pt.placeholder((4, 8), "float32", "A")
    k = pt.reduce_axis(8, "k")
    T = pt.compute((4, 3), lambda i, j: pt.sum(A[i, k] * j, axis=k), "T")
    s = pt.create_schedule(pt.Func([A], [T]))
    s["T"].bind("i", "blockIdx.x").cache_write("j", loc="shared").unroll("j")
    kern = pt.build(s, "cuda:sm_90a")
    assert kern.source.count("__shared__ __align__(16) float T_local[") == 3
    a = np.random.default_rng(4).standard_normal((4, 8)).astype(np.float32)
    (t,) = block_emulator.run(pt.lower(s, "cuda:sm_90a"), [a, np.full((4, 3), np.nan, np.float32)])
    np.testing.assert_allclose(t, a.astype(np.float64).sum(1)[:, None] * np.arange(3), rtol=1e-5, atol=1e-5)
