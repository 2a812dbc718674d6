"""Caches, write caches and stored buffers (cache, cache_identity, cache_write, store, store_at)
against NumPy on random data: a schedule they accept computes the algorithm's result, and one they
cannot build right is refused at the primitive, naming the buffer, the computations and the loop."""

import re
import textwrap

import numpy as np
import pytest

import polytile as pt


def producer_consumer(n=7, m=5):
    """T = 2X, Y = T + 1 over n × m (sizes that divide no tile)."""
    X = pt.placeholder((n, m), "float32", "X")
    T = pt.compute((n, m), lambda i, j: X[i, j] * 2.0, "T")
    Y = pt.compute((n, m), lambda i, j: T[i, j] + 1.0, "Y")
    return pt.Func([X], [Y]), T, Y


def run_pc(s, rng, n=7, m=5):
    x = rng.standard_normal((n, m)).astype(np.float32)
    np.testing.assert_allclose(pt.build(s)(x), x * 2 + 1, rtol=1e-6)


# --- read caches and fusion (FINDINGS B2) ---------------------------------------------------------

def test_read_cache_above_the_fusion_is_refused_at_the_primitive():
    f, T, Y = producer_consumer()
    s = pt.create_schedule(f)
    s[Y].after(s[T], "i")
    with pytest.raises(pt.ScheduleError, match=r"cache T_Y_local of T for Y.*before T\[0, 0\] writes.*loop i"):
        s[Y].cache_identity(T, None)
    assert s.caches == []


def test_read_cache_at_the_fusion_level_computes_right(rng):
    f, T, Y = producer_consumer()
    s = pt.create_schedule(f)
    s[Y].after(s[T], "i")
    s[Y].cache_identity(T, "i")
    run_pc(s, rng)


def test_whole_tile_cache_is_checked_at_the_primitive(rng):
    """cache(..., whole=) copies a box rounded up to the granules (zeros past the tensor's end): its
    copy is checked against the dependences like any cache, at the primitive."""
    f, T, Y = producer_consumer()
    s = pt.create_schedule(f)
    s[Y].after(s[T], "i")
    with pytest.raises(pt.ScheduleError, match=r"cache T_Y_local of T for Y.*before T\[0, 0\] writes.*loop i"):
        s[Y].cache(T, None, whole=(4, 8))
    assert s.caches == []
    s[Y].cache(T, "i", whole=(1, 4))  # one row of 5, copied as 8 (3 zeros)
    assert "T_Y_local[(1) * (8)]" in pt.build(s).source
    run_pc(s, rng)


def test_fusion_under_a_cache_is_refused_at_the_loop_primitive(rng):
    """The other order: the cache first, then a fusion that would put the producer under it."""
    f, T, Y = producer_consumer()
    s = pt.create_schedule(f)
    s[Y].cache_identity(T, None)
    with pytest.raises(pt.ScheduleError, match="cache T_Y_local of T for Y"):
        s[Y].after(s[T], "i")
    assert s.states["Y"].anchor is None
    run_pc(s, rng)


def test_shifted_fusion_with_a_cache_of_the_window(rng):
    """Y reads T[i, j..j+2] and is fused after T's loop j, shifted by 2: a cache of T per row (loop i)
    would be copied before the row is written, one per iteration of j is right."""
    X = pt.placeholder((6, 11), "float32", "X")
    T = pt.compute((6, 11), lambda i, j: X[i, j] * 2.0 + 1.0, "T")
    Y = pt.compute((6, 9), lambda i, j: T[i, j] + T[i, j + 1] + T[i, j + 2], "Y")
    s = pt.create_schedule(pt.Func([X], [Y]))
    s[T].shift("j", -2)
    s[Y].after(s[T], "j")
    with pytest.raises(pt.ScheduleError, match="T_Y_local"):
        s[Y].cache_identity(T, "i")
    s[Y].cache_identity(T, "j")
    x = rng.standard_normal((6, 11)).astype(np.float32)
    t = x.astype(np.float64) * 2 + 1
    np.testing.assert_allclose(pt.build(s)(x), t[:, :-2] + t[:, 1:-1] + t[:, 2:], rtol=1e-5)


# --- write caches (B3, B4, B5) ----------------------------------------------------------------------

def test_write_cache_above_the_fusion_is_refused_at_the_primitive():
    f, T, Y = producer_consumer()
    s = pt.create_schedule(f)
    s[Y].after(s[T], "i")
    with pytest.raises(pt.ScheduleError, match=r"write cache T_local of T.*Y\[0, 0\] reads T before.*loop i"):
        s[T].cache_write(None)
    assert s.caches == []
    s[T].cache_write("i")
    run_pc(s, pytest.importorskip("numpy").random.default_rng(1))


def row_sum(n=5, m=6):
    A = pt.placeholder((n, m), "float32", "A")
    k = pt.reduce_axis(m, "k")
    T = pt.compute((n,), lambda i: pt.sum(A[i, k], axis=k), "T")
    return pt.Func([A], [T]), T


@pytest.mark.parametrize("levels", [(None, "i"), (None, "ko"), ("i", "ko"), (None, "i", "ko")])
def test_nested_write_caches_chain(levels, rng):
    """Each write cache writes back into the next one out (B4: the outer one was never written)."""
    f, T = row_sum(5, 7)
    s = pt.create_schedule(f)
    s[T].split("k", 3)
    for level in levels:
        s[T].cache_write(level)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_allclose(pt.build(s)(a), a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["whole first", "whole last"])
def test_whole_write_cache_around_an_inner_write_cache_starts_the_inner_one(order, rng):
    """A whole write cache starts filled with the identity, in place of the initialization; an inner
    write cache of the same computation still needs it: the initialization runs into the inner
    buffer (fuzz_independent seed 7 case 2614: it was dropped, the sums started from garbage)."""
    f, T = row_sum(5, 7)
    s = pt.create_schedule(f)
    if order == "whole first":
        s[T].cache_write(None, whole=(4,))
        s[T].cache_write("i")
    else:
        s[T].cache_write("i")
        s[T].cache_write(None, whole=(4,))
    inner = s.caches[0 if order == "whole last" else 1].name
    assert re.search(rf"^ *{inner}\w* = 0\.0$", str(pt.lower(s, pt.cpu_target())), re.M), "inner buffer never set"
    a = rng.standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_allclose(pt.build(s)(a), a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


def empty_range_sum():
    """T[i, h] = sum of A[k] for k in [h, 3): empty for h = 3, where only the initialization writes."""
    A = pt.placeholder((3,), "int32", "A")
    k = pt.reduce_axis(3, "k")
    T = pt.compute((2, 4), lambda i, h: pt.sum(A[k], axis=k, where=k >= h), "T")
    return pt.Func([A], [T]), T


@pytest.mark.parametrize("level", [None, "i", "h"])
def test_write_cache_holds_the_elements_only_the_initialization_writes(level, rng):
    f, T = empty_range_sum()
    s = pt.create_schedule(f)
    s[T].cache_write(level)
    if level == "i":  # the buffer holds the row, the empty element included (B5: it held three)
        assert "allocate T_local[1, 4]" in str(pt.lower(s, pt.cpu_target()))
    a = rng.integers(-50, 50, 3).astype(np.int32)
    np.testing.assert_array_equal(pt.build(s)(a), [[a[h:].sum() for h in range(4)]] * 2)


STORE_EMPTY_MAX = textwrap.dedent("""
    import numpy as np, sys
    import polytile as pt
    B = pt.placeholder((2,), "float32", "B")
    def body(i, j):
        k = pt.reduce_axis((0, j), "k")
        return pt.max(B[k], axis=k)
    U = pt.compute((1, 2), body, "U")   # U[0, 0] is an empty max: only its initialization writes it
    V = pt.compute((1,), lambda i: pt.maximum(U[i, 0], U[i, 1]) + 1.0, "V")
    s = pt.create_schedule(pt.Func([B], [V]))
    s[V].after(s[U], "i")
    s[U].{primitive}
    kern = pt.build(s, extra_flags=["-fsanitize=address", "-fno-omit-frame-pointer"])
    b = np.random.default_rng(0).standard_normal(2).astype("float32")
    out = kern(b)
    sys.exit(0 if np.allclose(out, b[0] + 1) else 3)
""")


@pytest.mark.parametrize("primitive", ["store(lambda i, j: (j, i))", "store_at('i')"])
def test_stored_reduction_with_an_empty_range_stays_in_its_buffer(primitive, asan_run):
    """B5 with store/store_at: the stored buffer holds what the initialization writes too (the
    initialization wrote one element before it, caught by AddressSanitizer)."""
    proc = asan_run(STORE_EMPTY_MAX.format(primitive=primitive))
    assert proc.returncode == 0, proc.stderr[-3000:]


# --- stored tensors with caches (B9) ----------------------------------------------------------------

@pytest.mark.parametrize("cache", ["read", "write", "both"])
def test_stored_tensor_with_caches_goes_through_the_stored_buffer(cache, rng):
    f, T, Y = producer_consumer(6, 9)
    s = pt.create_schedule(f)
    s[T].store(lambda i, j: (j, i))
    if cache in ("read", "both"):
        s[Y].cache(T, None)
    if cache in ("write", "both"):
        s[T].cache_write(None)
    run_pc(s, rng, 6, 9)


def test_cache_outside_the_loop_a_tensor_is_stored_at_is_refused():
    f, T, Y = producer_consumer(6, 9)
    s = pt.create_schedule(f)
    s[Y].after(s[T], "i")
    s[T].store_at("i")
    with pytest.raises(pt.ScheduleError, match="cache T_Y_local of T for Y is placed at the top, outside the "
                                               "loop where T is stored"):
        s[Y].cache(T, None)
    with pytest.raises(pt.ScheduleError, match="write cache T_local of T for T is placed at the top"):
        s[T].cache_write(None)
    assert s.caches == []


def test_store_at_with_a_reader_across_iterations_is_refused():
    X = pt.placeholder((6, 5), "float32", "X")
    T = pt.compute((6, 5), lambda i, j: X[i, j] * 2.0, "T")
    Y = pt.compute((5, 5), lambda i, j: T[i, j] + T[i + 1, j], "Y")
    s = pt.create_schedule(pt.Func([X], [Y]))
    s[T].shift("i", -1)
    s[Y].after(s[T], "i")
    with pytest.raises(pt.ScheduleError, match=r"store_at of T \(placed at loop i\): Y\[0, 0\] reads T as T\[0, 0\] "
                                               "left it in another iteration"):
        s[T].store_at("i")
    assert s.states["T"].store_level is None


def test_store_at_inside_a_reduction_loop_is_refused():
    f, T = row_sum(4, 5)
    Y = pt.compute((4,), lambda i: T[i] * 2.0, "Y")
    s = pt.create_schedule(pt.Func([f.inputs[0]], [Y]))
    with pytest.raises(pt.ScheduleError, match="store_at of T at loop k: the initialization of T runs outside"):
        s[T].store_at("k")
    assert s.states["T"].store_level is None


# --- the scope of a buffer split by the AST generator (B12) ------------------------------------------

@pytest.mark.parametrize("separate_k", [False, True])
def test_write_cache_with_shifted_fusion_and_separate(separate_k, rng):
    B = pt.placeholder((3, 4), "float32", "B")
    k = pt.reduce_axis(3, "k")
    U = pt.compute((3, 4), lambda i, j: pt.sum(B[k, j], axis=k), "U")
    V = pt.compute((3, 3), lambda i, j: U[i, j] + U[i, j + 1], "V")
    s = pt.create_schedule(pt.Func([B], [V]))
    s[U].shift("i", -1)
    s[V].after(s[U], "i")
    s[U].cache_write("i")
    s[V].separate("i")
    if separate_k:  # isl then allocates the buffer of the peeled first iteration in an else branch
        s[U].separate("k")
    b = rng.standard_normal((3, 4)).astype(np.float32)
    u = np.broadcast_to(b.astype(np.float64).sum(0), (3, 4))
    np.testing.assert_allclose(pt.build(s)(b), u[:, :3] + u[:, 1:], rtol=1e-5, atol=1e-5)


def test_cache_used_in_one_iteration_of_an_inner_loop(rng):
    """Only T[:, 0] has a reduction term: isl allocates the cache of loop j before the loop over j
    (the only iteration that uses it) and releases it inside; the scope spans that loop."""
    X = pt.placeholder((4, 6), "float32", "X")
    W = pt.placeholder((6, 1), "float32", "W")

    def body(i, j):
        k = pt.reduce_axis(1, "k")
        return pt.sum(X[i, j] * W[j, k], axis=k, where=k >= j)
    T = pt.compute((4, 6), body, "T")
    s = pt.create_schedule(pt.Func([X, W], [T]))
    s[T].cache_identity(X, "j")
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.standard_normal((6, 1)).astype(np.float32)
    ref = np.zeros((4, 6))
    ref[:, 0] = x[:, 0] * w[0, 0]
    np.testing.assert_allclose(pt.build(s)(x, w), ref, rtol=1e-6)


def test_cache_in_a_loop_of_one_iteration(rng):
    """The skew leaves one t1_1 per t1_0 (t1_1 = max(0, -t1_0)), which isl scans in a loop of one
    iteration around the cache's allocation and its release apart ("the scope of cache B_T_local
    is split", fuzz seed 101 case 8070; with the parameter N in the context the cache's prefix,
    taken from the loops' functions, gave isl bounds it did not merge into one expression). Such a
    loop binds a value, no loop: the scope holds."""
    N = pt.param("N")
    B = pt.placeholder((5, 5), "float64", "B")
    T = pt.compute((5,), lambda i: pt.select(i + 1 < 5, B[i, i + 1], 1.0), "T")
    s = pt.create_schedule(pt.Func([B], [T], constraints=[N >= 0]))
    s["T"].split("i", 4)
    s["T"].apply_sch("{ [x0, x1] -> [x0 - x1, x1] }", ["t1_0", "t1_1"])
    s["T"].cache_identity("B", "t1_1", loc="heap")
    b = rng.standard_normal((5, 5))
    t = np.zeros(5)
    pt.build(s)(b, t, N=3)
    np.testing.assert_array_equal(t, np.append(np.diagonal(b, 1), 1.0))


def test_write_cache_of_a_loop_that_isl_scans_per_statement(rng):
    """The where= leaves i = 0 for k <= 1 and i = 2 for k >= 2: one i per k, a value isl cannot
    write as one expression, so with atomic loops it scans every statement in an i loop of its
    own, the cache's allocation, copies, T and release in sibling loops ("the scope of cache
    T_local is split", fuzz seed 101 case 2449). The siblings are one loop again."""
    A = pt.placeholder((4, 5), "float32", "A")

    def f(i, j):
        k = pt.reduce_axis((i, i + 2), "k")
        return pt.sum(A[k, j], axis=k)
    T = pt.compute((3, 5), f, "T", where=lambda i, j: i != 1)
    s = pt.create_schedule(pt.Func([A], [T]))
    s["T"].cache_write("i")
    s["T"].reorder("j", "k", "i")
    a = rng.standard_normal((4, 5)).astype(np.float32)
    t = np.full((3, 5), 7.0, np.float32)
    pt.build(s)(a, t)
    np.testing.assert_allclose(t, [a[0] + a[1], np.full(5, 7.0), a[2] + a[3]], rtol=1e-6)


# --- the C++ compiler: code that GCC 12 -O3 miscompiled ------------------------------------------------

def test_cache_of_guarded_reads(rng):
    """U reads T only where a select's condition holds, through a cache of the whole T: GCC 12's
    loop if-conversion computed U[2] from the wrong elements (FINDINGS E1)."""
    A = pt.placeholder((4,), "int32", "A")
    T = pt.compute((2, 2, 13), lambda i, j, h: 1 + A[i + 2] * (h + 1), "T")
    inside = lambda i: (i - 1 >= 0) & (i - 1 < 2)  # noqa: E731
    U = pt.compute((12, 2, 1), lambda i, j, h: pt.select(inside(i), T[i - 1, j, h + 1], 0)
                   + pt.select(inside(i), T[i - 1, j, h], 0), "U")
    s = pt.create_schedule(pt.Func([A], [U]))
    s[U].cache_identity(T, None)
    a = rng.integers(-9, 9, 4).astype(np.int32)
    t = 1 + a[2:4, None, None] * (np.arange(13) + 1)[None, None, :] + np.zeros((2, 2, 13), np.int64)
    ref = np.zeros((12, 2, 1), np.int64)
    ref[1:3, :, 0] = t[:, :, 1] + t[:, :, 0]
    np.testing.assert_array_equal(pt.build(s)(a), ref)


def test_parallel_loop_inside_a_write_cache_tile_computes_right_every_call():
    """BLIS-style matmul, write cache at jr, jr parallel on 2 threads: GCC's predictive commoning
    turned the stores of each thread's loop into loads before and stores after it of the other
    thread's rows (a data race the compiler introduced; wrong in most calls)."""
    import ctypes
    M = N = K = 96
    A = pt.placeholder((M, K), "float32", "A")
    B = pt.placeholder((K, N), "float32", "B")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(A[i, k] * B[k, j], axis=k), "C")
    s = pt.create_schedule(pt.Func([A, B], [C], name="matmul"))
    st = s[C]
    st.split("j", 96, "jc", "j1").split("k", 32, "kc", "k1").split("i", 16, "ic", "i1")
    st.split("j1", 48, "jr", "jn").split("i1", 2, "ir", "im").split("jn", 16, "jv", "jl")
    st.reorder("ic", "kc", "jc", "ir", "jr", "k1", "im", "jv", "jl")
    st.cache_write("jr").vectorize("jl").parallel("jr")
    kern = pt.build(s)
    gomp = ctypes.CDLL("libgomp.so.1")
    threads = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(2)
    try:
        rng = np.random.default_rng(11)
        for _ in range(20):
            a = rng.standard_normal((M, K)).astype(np.float32)
            b = rng.standard_normal((K, N)).astype(np.float32)
            np.testing.assert_allclose(kern(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    finally:
        gomp.omp_set_num_threads(threads)


# --- every memory primitive is transactional -----------------------------------------------------------

def snapshot(s):
    """Everything a primitive may change, in comparable form (isl maps as text)."""
    states = {n: (str(st.loops.rel), tuple(st.loops.names), sorted(st.tags.items()), sorted(st.separate),
                  st.anchor, st.store_layout, st.store_level, st.loc, st.reassociate)
              for n, st in s.states.items()}
    return states, list(s.caches), list(s.inlined), list(s.virtual), dict(s.pipelines)


def fused_pc():
    f, T, Y = producer_consumer(6, 9)
    s = pt.create_schedule(f)
    s[T].split("j", 4)
    s[Y].after(s[T], "i")
    s[Y].cache_identity(T, "j")  # state to keep: a cache and a fusion
    return s, T, Y


REFUSALS = {
    "cache_identity": lambda s, T, Y: s[Y].cache_identity(T, None),
    "cache": lambda s, T, Y: s[Y].cache(T, None, layout=lambda i, j: (j, i)),
    "cache_layout_not_one_to_one": lambda s, T, Y: s[Y].cache(T, "i", layout=lambda i, j: (i,)),
    "cache_layout_wrong_arity": lambda s, T, Y: s[Y].cache(T, "i", layout=lambda i: (i,)),
    "cache_write": lambda s, T, Y: s[T].cache_write(None),
    "store_not_one_to_one": lambda s, T, Y: s[T].store(lambda i, j: (i * 0, j)),
    "store_of_output": lambda s, T, Y: s[Y].store(lambda i, j: (j, i)),
    "store_at": lambda s, T, Y: s[T].store_at("jo"),
    "set_loc": lambda s, T, Y: s[T].set_loc("registers"),
}


@pytest.mark.parametrize("primitive", sorted(REFUSALS))
def test_a_refused_memory_primitive_leaves_the_schedule_as_it_was(primitive, rng):
    s, T, Y = fused_pc()
    before = snapshot(s)
    with pytest.raises(pt.ScheduleError):
        REFUSALS[primitive](s, T, Y)
    assert snapshot(s) == before
    run_pc(s, rng, 6, 9)  # and it still builds and computes right


def test_a_loop_primitive_that_removes_a_cache_loop_is_refused(rng):
    f, T = row_sum(5, 7)
    s = pt.create_schedule(f)
    s[T].split("k", 3).cache_write("ko")
    with pytest.raises(pt.ScheduleError, match="cache T_local of T is placed at loop ko of T, which no longer exists"):
        s[T].split("ko", 2)
    assert s[T].loops == ["i", "ko", "ki"]
    a = rng.standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_allclose(pt.build(s)(a), a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


def test_cache_read_a_discarded_select_lane_outside_it(rng):
    """A cache whose footprint covers the guarded loads only: the load a failing ``select`` discards
    sits at a negative constant offset of the promoted cache (fuzz seed 7, cases 5173 and 8312); its
    register variable must have a C name (no ``-``)."""
    A = pt.placeholder((9, 9), "int64", "A")

    def f_T(i):
        k = pt.reduce_axis((pt.maximum(i - 2, 0), pt.minimum(i + 2, 3)), "k")
        return pt.sum(pt.select(i >= 2, A[i - 2, i + 2], 1) - A[k, k], axis=k, where=(i < k))

    T = pt.compute((3,), f_T, "T")
    s = pt.create_schedule(pt.Func([A], [T]))
    s["T"].cache("A", "k")
    kern = pt.build(s)
    a = rng.integers(-50, 50, (9, 9)).astype("int64")
    ref = [sum((a[i - 2, i + 2] if i >= 2 else 1) - a[k, k] for k in range(max(i - 2, 0), min(i + 2, 3)) if i < k)
           for i in range(3)]
    np.testing.assert_array_equal(kern(a), ref)


def test_cache_copy_loop_bounded_by_a_condition_of_its_own_iterator(rng):
    """isl bounds the copy loop of this cache by ``c3 <= min(2, -c1 + 2 * floord(c1 + c3 + 1, 2) - 1)``
    (where c1 + c3 is odd; fuzz seed 7 case 5340: 'c3' was not declared): a condition of each
    iteration, false at c3 = 0 where c3 = 1 must still be copied."""
    A = pt.placeholder((7, 3), "float64", "A")

    def body(i):
        odd = (pt.select(i >= 1, A[i + 2, i - 1], -0.5).astype("int32")
               + pt.select(i < 3, A[i, i], -0.5).astype("int32")) * A[i, 0].astype("int32")
        return pt.select(i % 2 == 1, odd, A[i, i % 2].astype("int32"))

    T = pt.compute((4,), body, "T")
    s = pt.create_schedule(pt.Func([A], [T]))
    s[T].cache_identity("A", "i", loc="heap")
    a = rng.uniform(-9, 9, (7, 3))
    t = np.trunc(a).astype(np.int64)
    ref = [(((t[i + 2, i - 1] if i >= 1 else 0) + (t[i, i] if i < 3 else 0)) * t[i, 0]) if i % 2 else t[i, i % 2]
           for i in range(4)]
    np.testing.assert_array_equal(pt.build(s)(a), ref)


def test_write_cache_of_a_computation_with_a_disjunctive_domain_builds(rng):
    """W's where= is an "or" of overlapping pieces; the cache's footprint per iteration of j
    came out as one disjunct per pair of pieces (31) and the AST generator gave up on the copy
    statements (fuzz seed 7 case 3960, with an identity layout)."""
    A = pt.placeholder((7, 7), "int32", "A")

    def f_w(i, j):
        k = pt.reduce_axis((0, j), "k")
        return pt.sum(A[k % 7, i], axis=k)

    W = pt.compute((7, 31), f_w, "W", where=lambda i, j: ((i + j) < 7) | (j != (i + 1)))
    s = pt.create_schedule(pt.Func([A], [W], name="disjunctive"))
    s["W"].cache_write("j", layout=lambda a, b: (a, b))
    kern = pt.build(s)
    a = rng.integers(-9, 9, (7, 7)).astype(np.int32)
    out = np.full((7, 31), 12345, np.int32)
    kern(a, out)
    want = np.array([[sum(int(a[k % 7, i]) for k in range(j)) for j in range(31)] for i in range(7)], np.int32)
    keep = np.array([[(i + j) < 7 or j != i + 1 for j in range(31)] for i in range(7)])
    np.testing.assert_array_equal(out[keep], want[keep])


def test_cache_of_strided_reads_under_a_skewed_split_loop_builds(rng):
    """The footprint of A[j % 3], A[2j], A[i // 2]... per iteration of a skewed loop is a union of
    overlapping pieces with divisions; the AST generator gave up on its copy (fuzz seed 7 case
    8671; case 9588 ran for minutes once the footprint was only coalesced)."""
    A = pt.placeholder((33,), "int32", "A")
    T = pt.compute((7, 7), lambda i, j: pt.abs(A[j % 3]) + pt.select(2 * j < 33, A[2 * j], 0)
                   - pt.select(i >= 1, A[i - 1], 0) + A[i // 2] * A[i + 1], "T")
    func = pt.Func([A], [T], name="strided")
    s = pt.create_schedule(func)
    s["T"].apply_sch("{ [x0, x1] -> [x0 + x1, 2*x0 + x1] }", ["t1_0", "t1_1"])
    s["T"].shift("t1_1", 1)
    s["T"].cache("A", "t1_0", layout=lambda a: (a,))
    s["T"].split("t1_1", 8)
    a = rng.integers(-9, 9, 33).astype(np.int32)
    out = np.full((7, 7), 12345, np.int32)
    pt.build(s)(a, out)
    want = np.full((7, 7), -1, np.int32)
    pt.build(pt.create_schedule(func))(a, want)
    np.testing.assert_array_equal(out, want)


def test_cache_whose_lowest_index_is_a_minimum_of_several_reads_builds(rng):
    """No one read of A is the lowest in every iteration of h: the box's origin was the piecewise
    minimum of the reads, and the copy came out as 126 disjuncts, one per combination of its
    pieces, on which the AST generator gave up (fuzz seed 7 case 3179). The origin is now the
    lowest index over all iterations."""
    N = pt.param("N")
    A = pt.placeholder((5, N + 2, 5), "float32", "A")

    def f_t(i, j, h):
        return (pt.select((j + 1 < 5) & (j + 1 < N + 2) & (h >= 1) & (h - 1 < 5), A[j + 1, j + 1, h - 1], 0.0)
                + pt.select(2 * h < N + 2, A[j, 2 * h, i], 0.0)
                + pt.select((j >= 2) & (i >= 2), A[j, j - 2, i - 2], 0.0) + A[j, h, j])

    T = pt.compute((5, 5, N), f_t, "T")
    func = pt.Func([A], [T], constraints=[N >= 2], name="lowest")
    s = pt.create_schedule(func)
    s["T"].cache_identity("A", "h")
    a = rng.standard_normal((5, 7, 5)).astype(np.float32)
    out, want = np.zeros((5, 5, 5), np.float32), np.zeros((5, 5, 5), np.float32)
    pt.build(s)(a, out, N=5)
    pt.build(pt.create_schedule(func))(a, want, N=5)
    np.testing.assert_array_equal(out, want)


def test_write_cache_at_a_fused_loop_whose_iterations_have_divisions_builds(rng):
    """The iterations of the fused loop jh in which T or its initialization runs are a union with
    an existential variable; the buffer's allocation ran over that set and the AST generator gave
    up on it alone (fuzz seed 7 case 10747). Its divisions are now made explicit."""
    A = pt.placeholder((4, 4), "float32", "A")

    def f_t(i, j, h):
        k = pt.reduce_axis((0, 4), "k")
        return pt.prod(A[h, k] + pt.select((h + 1 < 4) & (j + 2 < 4), A[h + 1, j + 2], 0.0), axis=k,
                       where=pt.cast("int32", h) <= 1)

    T = pt.compute((16, 16, 4), f_t, "T", where=lambda i, j, h: ((i + j) >= 16) | (h <= j))
    func = pt.Func([A], [T], name="fused_init")
    s = pt.create_schedule(func)
    s["T"].vectorize("i")
    s["T"].shift("i", 2)
    s["T"].fuse("j", "h")
    s["T"].reorder("jh", "k")
    s["T"].shift("jh", 3)
    s["T"].cache_write("jh", layout=lambda a, b, c: (a, c, b))
    a = rng.uniform(0.5, 2, (4, 4)).astype(np.float32)
    out, want = np.full((16, 16, 4), 7.0, np.float32), np.full((16, 16, 4), 7.0, np.float32)
    pt.build(s)(a, out)
    pt.build(pt.create_schedule(func))(a, want)
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_cache_serving_the_last_iteration_of_a_shared_loop_builds(rng):
    """T runs in the last iteration of i only, U (fused into its loops) in every one: the cache's
    release, placed in T's iterations, came after the loop in isl's AST, apart from its allocation
    ("the scope of cache A_T_local is split", fuzz seed 7 case 4929). The scope now spans every
    iteration of the loop."""
    A = pt.placeholder((5, 5), "float32", "A")
    k = pt.reduce_axis((0, 5), "k")
    T = pt.compute((2, 2), lambda i, j: pt.sum(A[k, k], axis=k), "T", where=lambda i, j: i >= 1)
    U = pt.compute((2, 7), lambda i, j: A[i, j % 5] * 2.0, "U")
    func = pt.Func([A], [T, U], name="last_iteration")
    s = pt.create_schedule(func)
    s["U"].after(s["T"], "j")
    s["T"].cache("A", "i")
    a = rng.standard_normal((5, 5)).astype(np.float32)
    outs = [np.full((2, 2), 7.0, np.float32), np.zeros((2, 7), np.float32)]
    wants = [np.full((2, 2), 7.0, np.float32), np.zeros((2, 7), np.float32)]
    pt.build(s)(a, *outs)
    pt.build(pt.create_schedule(func))(a, *wants)
    for out, want in zip(outs, wants):
        np.testing.assert_allclose(out, want, rtol=1e-6)


def test_cache_whose_first_inner_read_is_guarded_off_copies_every_tile(rng):
    """At i = 0 the first iteration of the tile of k (k = 0) reads nothing (the select's k >= 1):
    the box's origin, the element read at the first inner iteration, was undefined there, so the
    copy skipped that tile and its reads went to uninitialized elements of the cache, one past
    its end for k = 7 (fuzz seed 31 case 4276, a SIGSEGV through an index array). Where the
    origin reads nothing, the offset is now the lowest element read."""
    N = pt.param("N")
    A = pt.placeholder((N,), "float32", "A")

    def f_T(i):
        k = pt.reduce_axis((i, N), "k")
        return pt.sum(pt.select((k >= 1) & (k < 10), A[k], 0.5), axis=k)

    T = pt.compute((N,), f_T, "T")
    s = pt.create_schedule(pt.Func([A], [T], constraints=[N >= 1]))
    s["T"].tile("i", "k", 4, 8)
    s["T"].cache("A", "ii")
    kern = pt.build(s)
    for n in (1, 5, 12):
        a = rng.standard_normal(n).astype(np.float32)
        out = np.zeros(n, np.float32)
        kern(a, out, N=n)
        ref = [sum(a[k] if 1 <= k < 10 else 0.5 for k in range(i, n)) for i in range(n)]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


# --- a producer inlined into its cache's copies (compute_inline after cache) -------------------------

def _virtual_program():
    """Fuzz seed 43 case 621's program: U = T[i - 1, i // 2] (guarded), read by V through two
    windows, U[k % 3, k] and U[l - 1, j]."""
    A = pt.placeholder((8, 16), "bfloat16", "A")
    idx0 = pt.placeholder((8,), "int32", "idx0", value_range=(0, 7))
    T = pt.compute((16, 8), lambda i, j: (pt.cast("bfloat16", pt.cast("float32", A[j, j]) + (-1.0))
                                          + pt.select((i + j) < 16, pt.call("cos", A[idx0[j], i]),
                                                      pt.select((i // 2) < 8, A[i // 2, i], 0.0))), "T")
    U = pt.compute((16, 17), lambda i, j: pt.select((i >= 1) & ((i // 2) < 8), T[i - 1, i // 2], -0.5), "U",
                   dtype="float64")

    def f_V(i, j):
        k = pt.reduce_axis((0, 17), "k")
        l = pt.reduce_axis((0, 16), "l")
        return pt.sum(pt.select(j <= l, pt.cast("bfloat16", pt.cast("float32", U[k % 3, k])),
                                pt.cast("bfloat16", pt.cast("float32", pt.select(l >= 1, U[l - 1, j], -0.5)))),
                      axis=[k, l])

    V = pt.compute((17, 17), f_V, "V")
    return pt.Func([A, idx0], [V], name="fuzz")


_VIRTUAL_STEPS = {
    "skew": lambda s: s["V"].skew("j", "k", 1),
    "cache_j": lambda s: s["V"].cache("U", "j", layout=lambda a, b: (a, b)),
    "cache_i": lambda s: s["V"].cache("U", "i"),
    "cache_top": lambda s: s["V"].cache("U", None),
    "cache_write": lambda s: s["T"].cache_write("j"),
    "inline": lambda s: s["U"].compute_inline(),
    "reorder": lambda s: s["T"].reorder("j", "i"),
    "after_j": lambda s: s["V"].after(s["T"], "j"),
    "after_i": lambda s: s["V"].after(s["T"], "i"),
    "store": lambda s: s["T"].store(lambda a, b: (b, a)),
}


def _run_virtual(steps, refused=None):
    from polytile.fuzz import inputs, reference
    func = _virtual_program()
    s = pt.create_schedule(func)
    *first, last = [_VIRTUAL_STEPS[k] for k in steps]
    for step in first:
        step(s)
    if refused is not None:
        with pytest.raises(pt.ScheduleError, match=refused):
            last(s)
        return
    last(s)
    rng = np.random.default_rng(1728831705)
    args = [inputs.uniform(rng, (8, 16), "bfloat16", -2.0, 2.0), inputs.indices(rng, (8,), "int32", 0, 7)]
    outs = inputs.output_arrays(func, {})
    pt.build(s)(*args, *outs)
    reference.check(func, args, outs, {})


# the copies of U's cache compute U from T: they must come after T's writes (and after the write-back
# of T's write cache), as V's reads of U would if U were a computation
_COPY_BEFORE_T = (r"cache U_V_local of U for V \(placed at loop {}\): the copy into U_V_local at i = 0(, j = 0)? "
                  r"runs before {}")


@pytest.mark.parametrize("steps, refused", [
    # fuzz seed 43 case 621: 38 of 289 elements of V read from T before T wrote them
    (("skew", "cache_j", "cache_write", "inline", "reorder", "after_j"),
     _COPY_BEFORE_T.format("j", r"the write-back of T_local at j = 1 \(write cache of T\) writes what it copies")),
    (("cache_j", "inline", "after_j"), _COPY_BEFORE_T.format("j", r"T\[1, 1\] writes what it copies")),
    (("cache_i", "inline", "after_i"), _COPY_BEFORE_T.format("i", r"T\[1, 1\] writes what it copies")),
    (("cache_top", "inline", "after_j"), r"copy into U_V_local runs before T\[0, 0\].*fused with V inside loop j"),
    # U not inlined: V after T at j breaks V's dependence on U, which the schedule's own check sees
    (("skew", "cache_j", "cache_write", "reorder", "after_j"), r"breaks a dependence: U\[0, 0\] must run before V"),
    # the stored buffer is not what the copies read (this was a C++ error: T not declared)
    (("store", "cache_top", "inline"), r"store of T: U is computed inside the copies of its caches.*drop the store"),
])
def test_copy_of_a_cache_computing_an_inlined_producer_waits_for_what_it_reads(steps, refused):
    _run_virtual(steps, refused)


@pytest.mark.parametrize("steps", [
    ("skew", "cache_j", "cache_write", "inline", "reorder"),  # no fusion: T runs first
    ("skew", "cache_j", "cache_write", "inline"),
    ("cache_top", "inline"),
    ("cache_i", "inline", "cache_write"),
])
def test_cache_computing_an_inlined_producer_computes_right(steps):
    _run_virtual(steps)


def test_store_layout_of_a_parametric_footprint_names_the_parameter():
    # the footprint's size depends on pt.param N, not on data (the message said "the data")
    N = pt.param("N")
    A = pt.placeholder((N, 8), "float32", "A")
    T = pt.compute((N, 8), lambda i, j: A[i, j] * 2.0, "T")
    Y = pt.compute((N, 8), lambda i, j: T[i, j] + 1.0, "Y")
    s = pt.create_schedule(pt.Func([A], [Y]))
    with pytest.raises(pt.ScheduleError, match="store of T: a layout needs a footprint of constant size; "
                                               "it depends on the parameter N here"):
        s[T].store(lambda i, j: (j, i))


def test_write_cache_inside_a_thread_loop_of_parametric_extent(rng):
    """Independent fuzzer seed 7 case 2189: a write cache at loop x bound to threadIdx.x, whose extent
    is the parameter L, raised islpy's 'can only convert integer Val to python' at bind (a thread
    loop's range over all threads was taken without the parameters: unbounded). The bind is now
    refused by name (a block has a fixed number of threads), leaving the schedule as it was: its
    CPU build computes the sum."""
    L = pt.param("L")
    B = pt.placeholder((5, 31), "float32", "B")

    def body(w, x):
        k = pt.reduce_axis(2, "k")
        return pt.sum(B[w % 5, k] * B[x % 5, k], axis=[k])

    out = pt.compute((9, L), body, "out")
    s = pt.create_schedule(pt.Func([B], [out], constraints=[L >= 1]))
    s[out].cache_write("x")
    with pytest.raises(pt.ScheduleError, match="loop x of out cannot be bound to threadIdx.x: its extent is not "
                                               "a constant"):
        s[out].bind("x", "threadIdx.x")
    assert s[out].state.tags == {}
    b = rng.standard_normal((5, 31)).astype(np.float32)
    got = pt.build(s)(b, L=7)
    w, x = np.arange(9)[:, None] % 5, np.arange(7)[None, :] % 5
    np.testing.assert_allclose(got, (b[w, :2] * b[x, :2]).sum(-1), rtol=1e-5)
