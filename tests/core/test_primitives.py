"""Every schedule primitive, run against NumPy (or the unscheduled program) on random inputs whose
sizes do not divide the tiles."""

import numpy as np
import pytest
from source_text import body

import polytile as pt


def matmul(M, N, K):
    A = pt.placeholder((M, K), "float32", "A")
    B = pt.placeholder((K, N), "float32", "B")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(A[i, k] * B[k, j], axis=k), "C")
    return pt.Func([A, B], [C], name="mm"), A, B, C


def run_mm(sched, M, N, K, rng):
    a = rng.standard_normal((M, K)).astype("float32")
    b = rng.standard_normal((K, N)).astype("float32")
    out = pt.build(sched)(a, b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


SCHEDULES = {
    "split": lambda s, C: s[C].split("i", 32),
    "tile": lambda s, C: s[C].tile("i", "j", 32, 16),
    "reorder": lambda s, C: s[C].reorder("k", "j", "i"),
    "fuse": lambda s, C: s[C].fuse("i", "j"),
    "skew": lambda s, C: s[C].skew("i", "j", 2),
    "shift": lambda s, C: s[C].shift("j", 5),
    "apply_sch": lambda s, C: s[C].apply_sch("{ [i, j, k] -> [j, i + j, k] }", ["a", "b", "c"]),
    "separate_unroll_vectorize": lambda s, C: s[C].split("j", 16).reorder("i", "jo", "k", "ji")
    .separate("jo").vectorize("ji"),
    "parallel": lambda s, C: s[C].split("i", 8).parallel("io"),
    "cache_identity": lambda s, C: s[C].tile("i", "j", 32, 32).split("k", 16).cache_identity("B", "ko")
    .cache_identity("A", "ko"),
    "cache_packed": lambda s, C: s[C].split("j", 16).reorder("jo", "i", "k", "ji")
    .cache("B", "jo", layout=lambda kk, jj: (jj, kk)),
    "cache_write": lambda s, C: s[C].tile("i", "j", 4, 16).reorder("io", "jo", "k", "ii", "ji")
    .cache_write("jo").unroll("ii").vectorize("ji"),
    "multi_level_cache": lambda s, C: s[C].tile("i", "j", 32, 32).split("k", 16).split("ki", 4)
    .cache_identity("B", "ko").cache_identity("B", "kio"),
    "blis": None,
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_primitive_matches_numpy(name, rng):
    M, N, K = 45, 67, 89
    f, A, B, C = matmul(M, N, K)
    s = pt.create_schedule(f)
    if name == "blis":
        from polytile.ops.matmul import cpu_gemm_tiles, schedule_gemm_cpu
        schedule_gemm_cpu(s, "C", "A", "B", cpu_gemm_tiles(M, N, K, pt.cpu_target()))
    else:
        SCHEDULES[name](s, C)
    run_mm(s, M, N, K, rng)


@pytest.mark.slow
def test_large_odd_matmul_blis(rng):
    from polytile.ops.matmul import cpu_gemm_tiles, schedule_gemm_cpu
    M, N, K = 345, 567, 789
    f, *_ = matmul(M, N, K)
    s = pt.create_schedule(f)
    schedule_gemm_cpu(s, "C", "A", "B", cpu_gemm_tiles(M, N, K, pt.cpu_target()))
    run_mm(s, M, N, K, rng)


def producer_consumer(N, M):
    X = pt.placeholder((N, M), "float32", "X")
    T = pt.compute((N, M), lambda i, j: X[i, j] * 2.0 + 1.0, "T")
    Y = pt.compute((N, M - 2), lambda i, j: T[i, j] + T[i, j + 1] + T[i, j + 2], "Y")
    return pt.Func([X], [Y]), T, Y


def pc_reference(x):
    t = x.astype(np.float64) * 2 + 1
    return t[:, :-2] + t[:, 1:-1] + t[:, 2:]


@pytest.mark.parametrize("how", ["default", "inline", "fused_shifted", "before", "store_at", "store_layout",
                                 "fission", "reverse_producer"])
def test_fusion_and_memory(how, rng):
    f, T, Y = producer_consumer(13, 29)
    s = pt.create_schedule(f)
    if how == "inline":
        s[T].compute_inline()
    elif how == "fused_shifted":
        s[T].shift("j", -2)
        s[Y].after(s[T], "j")
    elif how == "before":
        s[T].shift("j", -2).before(s[Y], "j")
    elif how == "store_at":
        s[Y].after(s[T], "i")
        s[T].store_at("i")
    elif how == "store_layout":
        s[T].store(lambda i, j: (j, i))
    elif how == "fission":
        s[Y].after(s[T], None)
    elif how == "reverse_producer":
        s[T].reverse("j")
    x = rng.standard_normal((13, 29)).astype("float32")
    np.testing.assert_allclose(pt.build(s)(x), pc_reference(x), rtol=1e-5, atol=1e-5)


def test_set_loc(rng):
    f, T, Y = producer_consumer(13, 29)
    s = pt.create_schedule(f)
    s[T].set_loc("heap")
    src = body(pt.build(s).source)
    assert "T = (float*)pt_alloc(" in src and "free(T);" in src  # on the heap, freed
    with pytest.raises(pt.LoweringError, match="shared.*does not exist on a cpu target"):
        s2 = pt.create_schedule(f)
        s2[T].set_loc("shared")
        pt.build(s2)


@pytest.mark.parametrize("n, place", [(100, "stack"), (600, "heap")])
def test_a_stack_buffer_too_large_for_a_stack_goes_to_the_heap(n, place):
    """``set_loc("stack")`` put any intermediate on the thread's stack: a 3000² float32 one (36 MB,
    in the independent fuzzer's probes) killed the process with SIGSEGV. Past 1 MB (600² float32
    is 1.4 MB), or of a parametric size, it lives on the heap."""
    f, T, Y = producer_consumer(n, n)
    s = pt.create_schedule(f)
    s[T].set_loc("stack")
    kern = pt.build(s)
    src = body(kern.source)
    assert (f"alignas(64) float T[({n}) * ({n})]" in src) == (place == "stack")
    assert ("T = (float*)pt_alloc(" in src) == (place == "heap")
    x = np.ones((n, n), np.float32)
    np.testing.assert_allclose(kern(x), pc_reference(x), rtol=1e-5, atol=1e-5)


def test_constant_memory_is_not_a_location():
    """GPU constant memory is written only by the host, so a computed buffer cannot live there; the
    location is refused where it is asked for (it used to be accepted and never emitted)."""
    f, T, Y = producer_consumer(13, 29)
    s = pt.create_schedule(f)
    with pytest.raises(pt.ScheduleError, match="unknown memory location 'constant' for T; use one of .*shared"):
        s[T].set_loc("constant")
    assert s[T].state.loc == "auto"


def test_triangular_reduction(rng):
    N = 37
    A = pt.placeholder((N, N), "float32", "A")
    x = pt.placeholder((N,), "float32", "x")

    def body(i):
        k = pt.reduce_axis((0, i + 1), "k")
        return pt.sum(A[i, k] * x[k], axis=k)

    y = pt.compute((N,), body, "y")
    s = pt.create_schedule(pt.Func([A, x], [y]))
    s[y].split("k", 8)
    a = rng.standard_normal((N, N)).astype("float32")
    xv = rng.standard_normal(N).astype("float32")
    np.testing.assert_allclose(pt.build(s)(a, xv), np.tril(a.astype(np.float64)) @ xv, rtol=1e-4, atol=1e-5)


def test_triangular_domain_with_where(rng):
    N = 23
    A = pt.placeholder((N, N), "float32", "A")
    L = pt.compute((N, N), lambda i, j: A[i, j] * 2.0, "L", where=lambda i, j: j <= i)
    s = pt.create_schedule(pt.Func([A], [L]))
    s[L].split("j", 4)
    a = rng.standard_normal((N, N)).astype("float32")
    np.testing.assert_allclose(pt.build(s)(a), np.tril(a) * 2)


def test_conv2d_one_computation_with_select(rng):
    from polytile import ops
    op = ops.conv2d(2, 3, 11, 13, 5, 3, 3, stride=2, padding=1, pad_stage=False)
    s = pt.create_schedule(op.func)
    s["O"].split("q", 4).parallel("k")
    ins = op.make_inputs(rng)
    assert ops.rel_error(pt.build(s)(*ins), op.reference(*ins)) < 1e-5


def test_the_loops_inverse_gives_every_instance_back_and_goes_on_past_them():
    # the AST's statement calls read the instance at the loops' values from the primitives' inverses:
    # on the instances they are exact; past them (a tensor-core nest runs its whole zero-filled
    # tiles) they go on the loops' way, one quasi-affine piece, not a form fitted to the domain
    import islpy as isl

    from polytile.poly.schedule import LoopSchedule

    dom = isl.Set("{ S[i, j, k] : 0 <= i < 10 and 0 <= j < 3 and 0 <= k < 96 }")
    loops = LoopSchedule.identity("S", "S", ["i", "j", "k"], dom)
    loops = loops.split("k", 64).fuse("j", "ko", dom).split("ki", 16).skew("i", "jko", 2).shift("i", 3)
    loops = loops.reverse("kio").reorder(["kii", "kio"])
    assert loops.inverse.n_piece() == 1
    assert loops.inverse.domain().is_equal(isl.Set.universe(loops.inverse.domain().get_space()))
    back = isl.Map.from_pw_multi_aff(loops.inverse.pullback_pw_multi_aff(loops.function)).intersect_domain(dom)
    assert back.is_equal(isl.Map.identity(back.get_space()).intersect_domain(dom))
    user = loops.apply("{ [a, b, c, d] -> [b, a, d - c, c] }", ["b", "a", "e", "c"])
    back = isl.Map.from_pw_multi_aff(user.inverse.pullback_pw_multi_aff(user.function)).intersect_domain(dom)
    assert back.is_equal(isl.Map.identity(back.get_space()).intersect_domain(dom))
