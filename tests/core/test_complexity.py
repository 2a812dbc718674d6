"""Schedules that once drove isl into minutes of work answer at once, and a schedule too complex
for isl's operation budget is a clear ScheduleError or LoweringError, never a hang."""

import subprocess
import sys
import time

import numpy as np
import pytest

import polytile as pt
import polytile.poly.limits as limits


def triangle():
    A = pt.placeholder((5, 5), "float32", "A")

    def f_T(i, j):
        k = pt.reduce_axis((0, j), "k")
        return pt.sum(A[k + 1, -j + 4], axis=k)

    T = pt.compute((7, 4), f_T, "T")
    return pt.create_schedule(pt.Func([A], [T])), A, T


def test_legality_of_a_user_map_over_nested_splits_is_cheap(monkeypatch, rng):
    # the loops' dependence on the reduction was extracted over every integer point: isl ran > 300 s
    monkeypatch.setattr(limits, "ISL_OPERATIONS", 300_000)
    s, A, T = triangle()
    s[T].split("k", 64).split("ko", 16).skew("koi", "ki", 1)
    with pytest.raises(pt.ScheduleError, match="breaks a dependence"):
        s[T].apply_sch("{ [x0, x1, x2, x3, x4] -> [x0, x1, x2 + 2*x3 - x4, x3, x4] }", list("abcde"))
    s[T].apply_sch("{ [x0, x1, x2, x3, x4] -> [x1, x0, x2, x3, x4] }", list("abcde"))
    a = rng.standard_normal((5, 5)).astype("float32")
    ref = np.array([[a[1:j + 1, 4 - j].sum() for j in range(4)] for _ in range(7)])
    np.testing.assert_allclose(pt.build(s)(a), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("last", ["split", "tile"])
def test_splits_of_a_fused_split_build_at_once(last, rng):
    # isl's AST generator took 66 s (split) and over 300 s (tile) on the floors of the composed splits
    A = pt.placeholder((8, 8), "float32", "A")
    T = pt.compute((8,), lambda i: -A[i, i], "T")
    s = pt.create_schedule(pt.Func([A], [T]))
    s[T].split("i", 37).split("ii", 7).fuse("io", "iio")
    if last == "split":
        s[T].split("ioiio", 64).cache(A, "ioiioo")
    else:
        s[T].tile("ioiio", "iii", 64, 64).cache(A, "ioiioo")
    start = time.perf_counter()
    kern = pt.build(s)
    assert time.perf_counter() - start < 30
    a = rng.standard_normal((8, 8)).astype("float32")
    np.testing.assert_allclose(kern(a), -np.diag(a))


def test_too_complex_for_the_budget_is_a_schedule_error_and_changes_nothing(monkeypatch):
    s, A, T = triangle()
    s[T].split("k", 3)
    monkeypatch.setattr(limits, "ISL_OPERATIONS", 50)
    with pytest.raises(pt.ScheduleError, match="the schedule is too complex for the polyhedral analysis"):
        s[T].split("j", 2)
    assert s[T].loops == ["i", "j", "ko", "ki"]
    with pytest.raises(pt.LoweringError, match="the schedule is too complex for the polyhedral analysis"):
        pt.lower(s)
    monkeypatch.setattr(limits, "ISL_OPERATIONS", 20_000_000)
    s[T].split("j", 2)  # the budget is restored after a refusal
    assert "for jo in" in str(pt.lower(s))


def test_a_cache_of_a_periodic_footprint_under_a_parametric_extent_builds_at_once(rng):
    # fuzz finding N7: the copy of A[j % 2] (A[1] only when N >= 2) is an existentially quantified
    # domain; isl's AST generation spent 34 s on it (uncounted by its operation budget), the
    # divisions made explicit take it 1 s
    N = pt.param("N")
    A = pt.placeholder((3,), "float32", "A")
    T = pt.compute((3, N), lambda i, j: A[j % 2], "T")
    U = pt.compute((N,), lambda i: T[i % 3, i], "U")
    s = pt.create_schedule(pt.Func([A], [U], constraints=[N >= 1]))
    s[T].cache("A", "i")
    start = time.perf_counter()
    kern = pt.build(s)
    assert time.perf_counter() - start < 10
    a = rng.standard_normal(3).astype("float32")
    for n in (1, 2, 7):
        out = np.empty(n, np.float32)
        kern(a, out)
        np.testing.assert_array_equal(out, a[np.arange(n) % 2])


@pytest.mark.timeout(120)
def test_nested_caches_under_a_skewed_split_and_a_parametric_extent_build_at_once(rng):
    # fuzz seed 7 case 1754: the schedule's functions carried each cache statement's domain (its
    # divisions and disjunctions) in every piece; isl's AST generation ran for minutes on them
    N = pt.param("N")
    C = pt.placeholder((N, 13), "float32", "C")
    T = pt.compute((13, 13), lambda i, j: pt.select((j >= 1) & (j - 1 < N), C[j - 1, i], 1.0), "T")
    s = pt.create_schedule(pt.Func([C], [T], constraints=[N >= 0]))
    s[T].skew("i", "j", 1).split("i", 7).reorder("j", "io")
    s[T].cache_identity(C, "ii")
    s[T].split("j", 3)
    s[T].cache_identity(C, "jo")
    start = time.perf_counter()
    kern = pt.build(s)
    assert time.perf_counter() - start < 30
    c = rng.standard_normal((11, 13)).astype("float32")
    ref = np.array([[c[j - 1, i] if 1 <= j <= 11 else 1.0 for j in range(13)] for i in range(13)], np.float32)
    np.testing.assert_array_equal(kern(c, N=11), ref)


@pytest.mark.timeout(120)
def test_a_write_cache_of_a_tiled_skew_under_a_parametric_extent_builds_at_once(rng):
    # fuzz seed 7 case 9236: as above, a write cache whose footprint is a lattice (a tile of a
    # skewed apply_sch map) over an extent N
    N = pt.param("N")
    A = pt.placeholder((5, N), "float32", "A")
    U = pt.compute((5, N), lambda i, j: A[i, j] * 2.0, "U")
    s = pt.create_schedule(pt.Func([A], [U], constraints=[N >= 1]))
    s[U].apply_sch("{ [x0, x1] -> [x1, x0 + 2*x1] }", ["t1_0", "t1_1"])
    s[U].tile("t1_0", "t1_1", 3, 8)
    s[U].cache_write("t1_0i")
    s[U].split("t1_1i", 1)
    s[U].reorder("t1_1ii", "t1_1io", "t1_1o", "t1_0o")
    start = time.perf_counter()
    kern = pt.build(s)
    assert time.perf_counter() - start < 60
    for n in (1, 2, 9):
        a = rng.standard_normal((5, n)).astype("float32")
        np.testing.assert_array_equal(kern(a, N=n), a * 2)


@pytest.mark.timeout(120)
def test_a_write_cache_over_a_where_with_an_or_is_cheap_to_check(rng):
    # fuzz seed 7 cases 906, 1696, 3069, 5052: the legality check of each primitive after a cache
    # over such a domain ran for minutes (cache_write here > 60 s) before the footprints were
    # coalesced (44fa2c1) and made disjoint (bec2071)
    N = pt.param("N")
    A = pt.placeholder((3, 3, N), "int16", "A")

    def f_T(i, j):
        k = pt.reduce_axis((0, N), "k")
        return pt.max(A[i, j, k], axis=k, where=(i <= k) | (i + k >= 3))

    T = pt.compute((3, 3), f_T, "T")
    func = pt.Func([A], [T], constraints=[N >= 1])
    s = pt.create_schedule(func)
    start = time.perf_counter()
    s[T].cache_write("k", layout=lambda a, b: (a, b))
    s[T].tile("i", "j", 64, 3).split("io", 4)
    kern = pt.build(s)
    assert time.perf_counter() - start < 60
    ref = pt.build(pt.create_schedule(func))
    for n in (1, 2, 5):
        a = rng.integers(-100, 100, (3, 3, n)).astype("int16")
        np.testing.assert_array_equal(kern(a, N=n), ref(a, N=n))


def where_of_ors():
    """A reduction whose where= and whose computation's where= both join conditions with |."""
    A = pt.placeholder((6, 6), "float32", "A")

    def f_V(i, j):
        k = pt.reduce_axis((0, j), "k")
        l = pt.reduce_axis((0, 5), "l")
        return pt.sum(A[i, k] + A[k, l], axis=[k, l], where=((j % 2) == 0) | ((l % 2) == 1))

    V = pt.compute((5, 5), f_V, "V", where=lambda i, j: ((j + i) >= 5) | (i >= 0))
    W = pt.compute((5, 5), lambda i, j: V[j, i] * 2.0, "W")
    return pt.create_schedule(pt.Func([A], [W])), A, W


def test_dependences_over_a_where_of_ors_are_cheap(monkeypatch, rng):
    # the domains kept a piece per term of the |s (four overlapping pieces, one redundant): isl's
    # dataflow analysis ran past its budget, 20 s for each primitive (fuzz seed 59 case 1072)
    monkeypatch.setattr(limits, "ISL_OPERATIONS", 2_000_000)
    s, A, W = where_of_ors()
    s[W].reorder("j", "i")
    a = rng.standard_normal((6, 6)).astype("float32")
    want = np.zeros((5, 5))
    for i in range(5):
        for j in range(5):
            want[i, j] = sum(a[i, k] + a[k, l] for k in range(j) for l in range(5) if j % 2 == 0 or l % 2 == 1)
    np.testing.assert_allclose(pt.build(s)(a), 2 * want.T, rtol=1e-5, atol=1e-5)


def test_dependences_past_the_budget_refuse_every_later_primitive_at_once(monkeypatch):
    # each refused primitive spent the whole budget again on the program's dependences: four
    # refusals ran past two minutes (fuzz seed 59 case 1072)
    import polytile.poly.program as program

    calls = []
    real = program.compute_dependences
    monkeypatch.setattr(program, "compute_dependences", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(limits, "ISL_OPERATIONS", 30_000)  # enough for the schedule's maps, not the dependences
    s, A, W = where_of_ors()
    for _ in range(3):
        with pytest.raises(pt.ScheduleError, match="the dependences of func are too complex"):
            s[W].reorder("j", "i")
    assert len(calls) == 1
    assert s[W].loops == ["i", "j"]


def run_within(script: str, seconds: float) -> None:
    """Run ``script`` in a process of its own, which must exit 0 within ``seconds``: isl does not
    give a hung test back to Python, where pytest's timeout would stop it."""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=seconds)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_cache_whose_parametric_extent_has_too_many_pieces_is_refused_at_once():
    # the footprint of A[i] and A[N - 1 - i] in a split, tiled loop: its extent over N came in 43
    # pieces, and isl's lexmax of it ran for minutes, outside the operation budget (fuzz seed 71
    # case 2282); the primitive refuses it and leaves the schedule as it was
    run_within("""
import polytile as pt
N = pt.param("N")
A = pt.placeholder((N,), "int8", "A")
T = pt.compute((N,), lambda i: -((A[i] - A[i]) + (A[(N - 1) - i] + 1)), "T")
s = pt.create_schedule(pt.Func([A], [T], constraints=[N >= 0]))
s[T].split("i", 16).tile("io", "ii", 8, 5)
loops = list(s[T].loops)
try:
    s[T].cache(A, "iio", layout=lambda a: (a // 2, a % 2))
    raise SystemExit("accepted")
except pt.ScheduleError as err:
    assert "extent along dimension 0 is too complex" in str(err), err
assert s[T].loops == loops and not s.caches
""", 60)


def test_a_user_map_over_nested_splits_of_a_reduction_builds_at_once():
    # fuzz seed 53 case 1483: the schedule map states the loops only through equalities like
    # 9·o7 = i - 8·o1 - 512·o3 - 128·o5 (isl eliminated the floors of the splits); extracting the
    # initialization's schedule function from it for the AST took isl minutes, in pieces per residue
    run_within("""
import numpy as np
import polytile as pt
N = pt.param("N")
A = pt.placeholder((8, 8), "float32", "A")
k = pt.reduce_axis((0, N), "k")
T = pt.compute((N,), lambda i: pt.sum(A[i % 8, k % 8], axis=k), "T")
s = pt.create_schedule(pt.Func([A], [T], constraints=[N >= 1]))
s[T].split("i", 8).split("io", 16)
s[T].apply_sch("{ [x0, x1, x2, x3] -> [x3, x1 - x2, x0, x2] }", ["a", "b", "c", "d"])
kern = pt.build(s)
a = np.random.default_rng(0).standard_normal((8, 8)).astype("float32")
for n in (1, 9, 300):
    ref = a[np.arange(n) % 8][:, np.arange(n) % 8].sum(axis=1)
    np.testing.assert_allclose(kern(a, N=n), ref, rtol=1e-4, atol=1e-4)
""", 60)


def test_a_write_cache_of_skewed_tiles_of_a_split_builds_at_once():
    # fuzz seed 47 case 1378: the cache's footprint, from a schedule map without the floors of the
    # splits, took isl 24 s to bound (its lowest index) at the cache_write, over 300 s at the build
    run_within("""
import numpy as np
import polytile as pt
N = pt.param("N")
A = pt.placeholder((3, 2), "int32", "A")
T = pt.compute((N,), lambda i: pt.select(i + 1 < 3, A[i + 1, i % 2], 1), "T")
s = pt.create_schedule(pt.Func([A], [T], constraints=[N >= 2]))
s[T].split("i", 4).skew("io", "ii", 1).tile("io", "ii", 4, 7)
s[T].reorder("iii", "ioi", "iio").tile("ioo", "iii", 2, 2).skew("iiii", "iio", 2)
s[T].cache_write("iiio")
kern = pt.build(s)
a = np.arange(6, dtype=np.int32).reshape(3, 2)
for n in (2, 3, 70):
    ref = np.array([a[i + 1, i % 2] if i + 1 < 3 else 1 for i in range(n)], np.int32)
    np.testing.assert_array_equal(kern(a, N=n), ref)
""", 90)


def test_every_instance_of_a_modular_where_under_tiles_is_checked_cheaply():
    # fuzz seed 43 case 2731: whether the AST runs every instance of a where= with a % was decided by
    # complementing its runs with their six loop iterators quantified, past isl's operation budget (a
    # refusal at the build after 30 s); with the iterators at the schedule's values, in a second
    N = pt.param("N")
    A = pt.placeholder((5, N), "float32", "A")

    def f_T(i):
        k = pt.reduce_axis((0, i + 1), "k")
        return pt.sum(pt.select(2 * i < 5, A[2 * i, k], 0.0), axis=k)

    T = pt.compute((N,), f_T, "T", where=lambda i: i % 2 == 0)
    s = pt.create_schedule(pt.Func([A], [T], constraints=[N >= 0]))
    s[T].reorder("k", "i").tile("k", "i", 4, 3).split("ko", 16).split("ki", 16)
    kern = pt.build(s)
    for n in (1, 4, 9):
        a = np.arange(5 * n, dtype=np.float32).reshape(5, n)
        out = np.full(n, 99, np.float32)
        kern(a, out, N=n)
        ref = [99 if i % 2 else a[2 * i, :i + 1].sum() if 2 * i < 5 else 0 for i in range(n)]
        np.testing.assert_array_equal(out, np.array(ref, np.float32))


def test_a_footprint_box_is_computed_once_across_later_primitives(monkeypatch, rng):
    # the memory check after every primitive computed every cache's box again: a box that took 30 s
    # was computed once per later primitive and the case ran past the fuzzer's timeout (fuzz seed
    # 107 case 3357); the boxes are remembered by the footprint's text
    import polytile.poly.cache as cache
    computed: list[tuple[str, int]] = []
    inner = cache._computed_box_dim

    def counted(f, d, what, origin=None):
        computed.append((str(f), d))
        return inner(f, d, what, origin)

    monkeypatch.setattr(cache, "_computed_box_dim", counted)
    monkeypatch.setattr(cache, "_BOXES", {})
    A = pt.placeholder((37, 29), "float32", "A")
    T = pt.compute((37, 29), lambda i, j: A[i, j] * 2.0 + 1.0, "T")
    s = pt.create_schedule(pt.Func([A], [T]))
    s[T].split("i", 8)
    s[T].cache(A, "ii")
    s[T].split("j", 4)
    s[T].unroll("ji")
    assert computed and len(computed) == len(set(computed)), computed
    a = rng.standard_normal((37, 29)).astype("float32")
    np.testing.assert_allclose(pt.build(s)(a), a * 2 + 1, rtol=1e-6)


def test_a_footprint_of_many_lowest_pieces_is_boxed_without_trying_each():
    # each piece of the lowest index was tried as the box's offset, a piecewise subtraction and
    # two optimizations each: 16 pieces took a minute (fuzz seed 107 case 3357); past
    # MAX_OFFSET_PIECES the lowest index over every iteration is the offset, still a box of the
    # whole footprint
    import islpy as isl

    import polytile.poly.cache as cache
    n = cache.MAX_OFFSET_PIECES + 4
    low = [(7 * k) % 11 * 3 for k in range(n)]  # not affine in p: a piece per iteration
    f = isl.Map(" ; ".join(f"[p] -> X[o] : p = {k} and {lo} <= o <= {lo + 5}" for k, lo in enumerate(low))
                .join("{}"))
    calls = [0]
    extreme = cache._extreme

    def counted(pa, maximize):
        calls[0] += 1
        return extreme(pa, maximize)

    cache._extreme, before = counted, cache._extreme
    try:
        box = cache._computed_box_dim(f, 0, "a test footprint")
    finally:
        cache._extreme = before
    assert calls[0] <= 4, calls
    assert box.size is not None and box.size >= 6
    for k in range(n):  # every accessed element lies in [offset, offset + size)
        off = box.offset.eval(isl.Point.zero(box.offset.get_domain_space()).set_coordinate_val(
            isl.dim_type.set, 0, k)).to_python()
        assert off <= low[k] and low[k] + 5 < off + box.size, (k, off, box.size)


def test_a_cache_of_a_footprint_of_many_lowest_pieces_computes_the_right_result(rng):
    # fuzz seed 107 case 3357, reduced: a cache at the inner loop of a split reduction over a
    # reordered, unrolled nest whose footprint has 16 lowest and 31 highest pieces
    N = pt.param("N")
    vals = pt.placeholder((7, N), "float32", "vals")
    B = pt.placeholder((13,), "float32", "B")

    def f_V(i, j):
        k = pt.reduce_axis((0, 13), "k")
        return pt.max(pt.select((j >= 1) & (j - 1 < 7) & (2 * j < N), vals[j - 1, 2 * j], 0.0)
                      + pt.select((j < 7) & (k < N), vals[j, k], -0.5)
                      + pt.select((j + 1 < 7) & (i < N), vals[j + 1, i], 0.0), axis=k) + B[j]

    V = pt.compute((13, 13), f_V, "V")
    s = pt.create_schedule(pt.Func([vals, B], [V], constraints=[N >= 2]))
    s["V"].reorder("j", "i")
    s["V"].unroll("i")
    s["V_red"].split("k", 16)
    s["V_red"].cache_identity("vals", "ki")
    kern = pt.build(s)
    n = 5
    v = rng.standard_normal((7, n)).astype("float32")
    b = rng.standard_normal(13).astype("float32")
    ref = np.empty((13, 13), "float32")
    for i in range(13):
        for j in range(13):
            first = v[j - 1, 2 * j] if j >= 1 and j - 1 < 7 and 2 * j < n else 0.0
            last = v[j + 1, i] if j + 1 < 7 and i < n else 0.0
            ref[i, j] = max(first + (v[j, k] if j < 7 and k < n else -0.5) + last for k in range(13)) + b[j]
    np.testing.assert_allclose(kern(v, b, N=n), ref, rtol=1e-5, atol=1e-6)


def test_the_runs_of_a_modular_where_under_shifted_tiles_are_checked_condition_by_condition(rng):
    # fuzz seed 71 case 144 (and 3489): the runs' conditions hold a 'mod' of a 'max' of a 'mod'; made
    # one set (230 pieces) and compared with the instances, they took isl past its operation budget
    # (a refusal at the build); the instances cut by one condition at a time take a second
    N = pt.param("N")
    A = pt.placeholder((N,), "float32", "A")

    def f_T(i):
        k = pt.reduce_axis((i, i + 3), "k")
        return pt.sum(pt.select(k < N, A[k], 1.0), axis=k, where=(k % 2) == 0)

    T = pt.compute((N,), f_T, "T")
    s = pt.create_schedule(pt.Func([A], [T], constraints=[N >= 1]))
    s[T].separate("k").split("i", 16).tile("io", "ii", 7, 4).reorder("k", "iio", "iii")
    s[T].tile("ioo", "k", 3, 3).cache_identity(A, "iooi").shift("iooi", -2).parallel("iooi")
    s[T].split("iio", 4).cache(A, "iooo", layout=lambda a: (a,))
    kern = pt.build(s)
    for n in (1, 7, 130):
        a = rng.standard_normal(n).astype(np.float32)
        ref = [sum(a[k] if k < n else 1.0 for k in range(i, i + 3) if k % 2 == 0) for i in range(n)]
        np.testing.assert_allclose(kern(a, N=n), np.array(ref, np.float32), rtol=1e-5, atol=1e-6)


def test_the_runs_of_a_cache_copy_over_a_footprint_in_pieces_are_checked_on_time(rng):
    # fuzz seed 101 case 4025: the copy of A's cache (its domain a footprint in pieces, modulo 3 and
    # 6, under the skew and the split) has no primitives' function; whether the AST runs all of it
    # was decided with the loops' iterators quantified, past isl's operation budget (a refusal at
    # the build). Its schedule map is one affine function: checked on time, in a second
    N = pt.param("N")
    A = pt.placeholder((8, 8), "float32", "A")

    def f_T(i, j):
        k = pt.reduce_axis((0, N), "k")
        return pt.sum(pt.maximum(pt.select(2 * i < 8, A[j, 2 * i], 0.0),
                                 pt.select((k >= 1) & (k - 1 < 8), A[k - 1, i], -0.5)), axis=k)

    T = pt.compute((8, 8), f_T, "T")
    s = pt.create_schedule(pt.Func([A], [T], constraints=[N >= 2]))
    s[T].apply_sch("{ [x0, x1, x2] -> [x0 + 2*x1, x1 + x2, x2] }", ["t1_0", "t1_1", "t1_2"])
    s[T].cache(A, "t1_1", layout=lambda a, b: (b, a)).split("t1_0", 3)
    kern = pt.build(s)
    a = rng.standard_normal((8, 8)).astype(np.float32)
    for n in (2, 9):
        ref = [[sum(max(a[j, 2 * i] if 2 * i < 8 else 0.0, a[k - 1, i] if 1 <= k < 9 else -0.5) for k in range(n))
                for j in range(8)] for i in range(8)]
        np.testing.assert_allclose(kern(a, N=n), np.array(ref, np.float32), rtol=1e-5, atol=1e-6)


def test_a_cache_of_a_footprint_of_many_divisions_is_refused_at_once():
    # fuzz seed 109 case 1366: skewed, tiled and separated loops give A's footprint 28 pieces with 51
    # integer divisions; bounding it ran past two minutes (the fuzzer's hang); the primitive refuses
    # it at once and leaves the schedule as it was
    run_within("""
import polytile as pt
N = pt.param("N")
A = pt.placeholder((N + 2, N), "float32", "A")
T = pt.compute((N, 7), lambda i, j: ((pt.cast("float32", pt.cast("int32", i)) > 2.0) & (j < 5)), "T")
def f_U(i, j, h):
    a = pt.select((i >= 2) & (i - 2 < N + 2), A[i - 2, h % 1], 1.0)
    b = pt.select(i < N + 2, A[i, N - 1 - h], 1.0)
    c = pt.select(i + 2 < N + 2, A[i + 2, h], -0.5)
    s = pt.cast("int16", a) + pt.cast("int16", b) + pt.cast("int16", c)
    return pt.maximum(A[j, N - 1 - j] / (pt.abs(pt.cast("float32", s)) + 1.0),
                      pt.cast("float32", pt.select(i + 1 < 7, T[j, i + 1], False)))
U = pt.compute((7, N, N), f_U, "U", where=lambda i, j, h: h >= j - 1)
s = pt.create_schedule(pt.Func([A], [U], constraints=[N >= 1]))
s["T"].skew("i", "j", 1)
s["U"].tile("i", "j", 7, 3)
s["U"].separate("ji")
s["U"].split("io", 3)
caches = list(s.caches)
try:
    s["U"].cache("A", "h", layout=lambda a, b: (b, a))
    raise SystemExit("accepted")
except pt.ScheduleError as err:
    assert "integer divisions" in str(err), err
assert list(s.caches) == caches
pt.build(s)
""", 60)


def test_a_separated_loop_with_nothing_to_unroll_inside_isolates_nothing(rng):
    # fuzz seed 97 case 8543: ki separated with no unrolled or vectorized loop inside it, so every
    # tile is full: isolating the whole image split every statement of the band, and with A's
    # cache under the skewed, reversed and fused loops isl's AST ran past its operation budget
    # (a refusal at the build; 30 s without the fusion)
    A = pt.placeholder((9,), "float32", "A")

    def f_T(i, j):
        k = pt.reduce_axis((pt.maximum(i - 2, 0), pt.minimum(i + 2, 7)), "k")
        return pt.sum(pt.select(j >= 1, A[j - 1], -0.5) - pt.maximum(A[k], A[i]), axis=k)

    T = pt.compute((7, 7), f_T, "T")
    s = pt.create_schedule(pt.Func([A], [T]))
    s[T].tile("i", "j", 2, 5).split("k", 16).separate("ki").skew("jo", "ji", 1).reverse("ji")
    s[T].reorder("ii", "jo", "io").fuse("ii", "jo").cache_identity(A, "ki")
    a = rng.standard_normal(9).astype(np.float32)
    ref = [[sum((a[j - 1] if j >= 1 else -0.5) - max(a[k], a[i]) for k in range(max(i - 2, 0), min(i + 2, 7)))
            for j in range(7)] for i in range(7)]
    np.testing.assert_allclose(pt.build(s)(a), np.array(ref, np.float32), rtol=1e-5, atol=1e-5)


def test_the_copies_of_a_cache_keep_the_pieces_of_its_footprint(rng):
    # fuzz seed 31 case 244: the copies' domain, the footprint (2 pieces under a where= with an
    # "or") intersected again with the iterations of the skewed tiles (8 pieces), came in 15
    # pieces, and isl's AST took 2.3 times as long (a build of ~50 s on a loaded machine)
    from polytile.lowering.pipeline import build_plan
    N = pt.param("N")
    B = pt.placeholder((N, 4), "float32", "B")

    def f_T(i, j):
        k = pt.reduce_axis((i, i + 2), "k")
        return pt.sum(B[j, i] + pt.cast("float32", k), axis=k, where=(j != k + 1))

    T = pt.compute((4, N), f_T, "T")
    s = pt.create_schedule(pt.Func([B], [T], constraints=[N >= 2]))
    s[T].apply_sch("{ [x0, x1, x2] -> [x0 + x1 + x2, x1, -x1 + x2] }", ["t1_0", "t1_1", "t1_2"])
    s[T].tile("t1_0", "t1_1", 4, 16).cache_write("t1_1o")
    copies = [it.stmt for it in build_plan(s).items if "__copy" in it.stmt.name]
    assert copies and all(st.domain.n_basic_set() <= 2 for st in copies), [str(st.domain) for st in copies]
    kern = pt.build(s)
    for n in (2, 5, 19):
        b = rng.standard_normal((n, 4)).astype(np.float32)
        ref = [[sum(b[j, i] + k for k in range(i, i + 2) if j != k + 1) for j in range(n)] for i in range(4)]
        np.testing.assert_allclose(kern(b, N=n), np.array(ref, np.float32), rtol=1e-5, atol=1e-5)


def test_a_cache_of_reads_that_isl_would_wrap_into_one_piece_builds_at_once():
    # fuzz seed 131 case 140, reduced: the footprint of A[k - 2, k - 1, k] and A[i, j, j] in a tile
    # of the split loops is two pieces of 21 constraints; isl's coalesce made them one piece of 33
    # (new wrapping constraints), whose lowest index took isl 145 pieces and minutes at the split,
    # and the AST of its copy minutes more. The footprint keeps its two pieces.
    run_within("""
import numpy as np
import polytile as pt
from polytile.lowering.pipeline import build_plan
A = pt.placeholder((11, 11, 11), "float32", "A")
def f_T(i, j):
    k = pt.reduce_axis((j, 11), "k")
    return pt.sum(pt.select(k >= 2, A[k - 2, k - 1, k], 1.0) * A[i, j, j], axis=k)
func = pt.Func([A], [pt.compute((11, 11), f_T, "T")], name="wrap")
s = pt.create_schedule(func)
s["T"].split("k", 3).cache("A", "ki")
s["T"].split("j", 3).split("ko", 8)
copies = [it.stmt for it in build_plan(s).items if "__copy" in it.stmt.name]
assert copies and all(st.domain.n_basic_set() == 2 for st in copies), [str(st.domain) for st in copies]
a = np.random.default_rng(0).uniform(0.5, 1.5, (11, 11, 11)).astype(np.float32)
np.testing.assert_allclose(pt.build(s)(a), pt.build(pt.create_schedule(func))(a), rtol=1e-5)
""", 60)


def test_a_footprint_is_coalesced_where_that_keeps_its_pieces_simple():
    # a stencil's reads of neighbouring elements are one box; two reads along different lines
    # (seed 131 case 140 above) stay two pieces rather than one wrapped in new constraints
    import islpy as isl

    import polytile.poly.cache as cache
    stencil = isl.Map("[n] -> { [p] -> X[o] : 0 <= p < n and o = p - 1; [p] -> X[o] : 0 <= p < n and o = p; "
                      "[p] -> X[o] : 0 <= p < n and o = p + 1 }").make_disjoint()
    assert cache._coalesced(stencil).n_basic_map() == 1
    lines = isl.Map(
        "[N] -> { [8, i1, 8, i3, 8, i5, 8, i7, 8, i9, 8, i11] -> A[o0 = i1, o1, o2 = o1] : (-i5 + o1) mod 3 = 0 and "
        "0 <= i1 <= 10 and 0 <= i5 <= 2 and 0 <= i9 <= 7 and 0 <= i11 <= 10 - 24i7 - 3i9 and i11 <= 2 and "
        "o1 >= 3i3 and o1 >= 0 and 11 - i1 <= o1 <= 10 and o1 <= 24i7 + 3i9 + i11 and o1 <= 2 + 3i3; "
        "[8, i1, 8, i3, 8, i5, 8, 0, 8, i9, 8, i11] -> A[o0, o1 = 1 + o0, o2 = 2 + o0] : "
        "(-1 - i11 + o0) mod 3 = 0 and 0 <= i1 <= 10 and i3 >= 0 and i5 >= 0 and 11 - i1 - 3i3 <= i5 <= 10 - 3i3 "
        "and i5 <= 2 and 0 <= i11 <= 2 and o0 >= -2 + 3i3 + i5 and o0 >= -2 + 3i9 and 0 <= o0 <= 8 and o0 <= 3i9 }")
    assert lines.coalesce().n_basic_map() == 1  # what isl would make of it
    kept = cache._coalesced(lines)
    assert kept.n_basic_map() == 2 and kept.is_equal(lines)
