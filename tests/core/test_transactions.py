"""Every loop primitive applies fully or raises ScheduleError and leaves the whole schedule exactly
as it was: stages, tags, anchors, caches, pipelines, inlined computations, the polyhedral program.
Each test brings a schedule into a rich state, makes one primitive refuse, and compares the state
before and after (deeply), then checks that the schedule still builds and computes the right thing."""

import dataclasses

import numpy as np
import pytest

import polytile as pt
from polytile.poly.schedule import LoopSchedule


def frozen(value):
    """A deep, comparable picture of a schedule attribute (objects that primitives only replace, such
    as the polyhedral program or expressions, by identity)."""
    if isinstance(value, dict):
        return tuple((k, frozen(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, *((f.name, frozen(getattr(value, f.name))) for f in dataclasses.fields(value)))
    if isinstance(value, LoopSchedule):
        return ("loops", value.owner, str(value.rel), tuple(value.names), str(value.domain))
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return ("object", id(value))


def schedule_state(s):
    return tuple((k, frozen(v)) for k, v in vars(s).items())


def refused(s, primitive, match):
    """Run ``primitive``, which must raise ScheduleError matching ``match``, and check that nothing
    of the schedule changed."""
    before = schedule_state(s)
    with pytest.raises(pt.ScheduleError, match=match):
        primitive()
    assert schedule_state(s) == before


def chain():
    X = pt.placeholder((10, 12), "float32", "X")
    P = pt.compute((10, 12), lambda i, j: X[i, j] * 2.0, "P")
    T = pt.compute((10, 12), lambda i, j: P[i, j] + 1.0, "T")
    Y = pt.compute((8, 12), lambda i, j: T[i, j] + T[i + 2, j], "Y")
    k = pt.reduce_axis(12, "k")
    R = pt.compute((8,), lambda i: pt.sum(Y[i, k], axis=k), "R")
    return pt.Func([X], [R]), P, T, Y, R


def rich_chain():
    """Inlined P, T shifted and fused with Y at i, Y split and unrolled with a cache of T, R a
    reassociated reduction with a write cache."""
    func, P, T, Y, R = chain()
    s = pt.create_schedule(func)
    s[P].compute_inline()
    s[T].shift("i", -2)
    s[Y].after(s[T], "i")
    s[Y].split("j", 4).unroll("ji")
    s[Y].cache_identity(T, "jo")
    s[R].reassociate().cache_write("i")
    s[R].parallel("i")
    return s, T, Y, R


def check_chain(s, rng):
    x = rng.standard_normal((10, 12)).astype("float32")
    t = x * 2 + 1
    np.testing.assert_allclose(pt.build(s)(x), (t[:8] + t[2:]).sum(1), rtol=1e-5)


CHAIN_REFUSALS = {
    "split": (lambda s, T, Y, R: s[Y].split("ji", 2), "tagged unroll"),
    "tile": (lambda s, T, Y, R: s[T].tile("i", "j", 4, 4), "Y is placed after T at loop i, which no longer exists"),
    "reorder": (lambda s, T, Y, R: s[T].reorder("j", "j"), "named twice"),
    "fuse": (lambda s, T, Y, R: s[Y].fuse("jo", "ji"), "tagged unroll"),
    "skew": (lambda s, T, Y, R: s[T].skew("j", "i", 1), "must be outside"),
    "shift": (lambda s, T, Y, R: s[T].shift("i", 3), "breaks a dependence"),
    "reverse": (lambda s, T, Y, R: s[T].reverse("i"), "breaks a dependence"),
    "apply_sch": (lambda s, T, Y, R: s[T].apply_sch("{ [i, j] -> [-i, j] }", ["i", "j"]), "breaks a dependence"),
    "after": (lambda s, T, Y, R: s[R].before(s[Y], None), "breaks a dependence"),
    "before": (lambda s, T, Y, R: s[T].after(s[Y], None), "relative to itself|breaks a dependence"),
    "separate": (lambda s, T, Y, R: s[Y].separate("q"), "no loop named 'q'"),
    "tag": (lambda s, T, Y, R: s[R].tag("k", "parallel"), "runs its reduction"),
    "vectorize": (lambda s, T, Y, R: s[T].vectorize("i"), "cannot be vectorize"),
    "unroll": (lambda s, T, Y, R: s[R].unroll("q"), "no loop named 'q'"),
    "bind": (lambda s, T, Y, R: s[R].bind("i", "warp.x"), "is not blockIdx"),
    "compute_inline": (lambda s, T, Y, R: s[R].compute_inline(), "reduction and cannot be inlined"),
    "compute_inline_anchored": (lambda s, T, Y, R: s[T].compute_inline(), "placed relative to T"),
    "reassociate": (lambda s, T, Y, R: s[T].reassociate(), "not a reduction"),
}


@pytest.mark.parametrize("primitive", sorted(CHAIN_REFUSALS))
def test_refused_primitive_leaves_the_schedule_unchanged(primitive, rng):
    s, T, Y, R = rich_chain()
    apply, match = CHAIN_REFUSALS[primitive]
    refused(s, lambda: apply(s, T, Y, R), match)
    check_chain(s, rng)


def test_compute_inline_that_fails_while_rebuilding_restores_everything(monkeypatch, rng):
    # the rebuild after inlining re-checks the schedule; a failure there must not leave T inlined
    func, P, T, Y, R = chain()
    s2 = pt.create_schedule(func)
    s2[Y].split("j", 4).unroll("ji")
    s2[R].reassociate().cache_write("i")
    before = schedule_state(s2)

    def failing_check():
        raise pt.ScheduleError("the rebuilt schedule breaks a dependence")

    monkeypatch.setattr(s2, "check", failing_check)
    with pytest.raises(pt.ScheduleError, match="rebuilt schedule"):
        s2[T].compute_inline()
    monkeypatch.undo()
    assert schedule_state(s2) == before
    assert "T" in s2.stage_names() and "T" not in s2.inlined
    check_chain(s2, rng)


def tensor_core_gemm(pad):
    A = pt.placeholder((128, 64), "float16", "A")
    B = pt.placeholder((64, 128), "float16", "B")
    k = pt.reduce_axis(64, "k")
    C = pt.compute((128, 128), lambda i, j: pt.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k),
                   "C")
    s = pt.create_schedule(pt.Func([A, B], [C]))
    st = s[C]
    st.split("i", 64, "bi", "i1").split("j", 64, "bj", "j1")
    st.split("i1", 16, "mi", "i3").split("j1", 8, "nj", "j3")
    st.split("k", 32, "ko", "k1").split("k1", 16, "kk", "k3")
    st.reorder("bi", "bj", "ko", "kk", "mi", "nj", "i3", "j3", "k3")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x")
    st.cache("A", "ko", loc="shared", pad=pad, name="A_shared").cache("B", "ko", loc="shared", pad=pad,
                                                                       name="B_shared")
    st.cache_write("bj", loc="fragment")
    return s, C


def test_refused_tensorize_leaves_the_caches_unchanged():
    # wgmma refuses padded operand caches after it has set the first one's whole tiles
    s, C = tensor_core_gemm(pad=(0, 8))
    s[C].pipeline("A_shared", 2)
    refused(s, lambda: s[C].tensorize("i3", "wgmma_m64nNk16"), "is padded")
    s[C].tensorize("i3")  # mma.sync accepts the padded caches
    assert s.states["C"].tags["i3"] == "mma_m16n8k16"


def test_refused_pipeline_leaves_the_schedule_unchanged():
    s, C = tensor_core_gemm(pad=(0, 8))
    s[C].tensorize("i3")
    s[C].pipeline("A_shared", 3)
    refused(s, lambda: s[C].pipeline("B_shared", 9), "stages must be an integer from 1 to 8")
    refused(s, lambda: s[C].pipeline("C_local", 2), "write cache")
    refused(s, lambda: s[C].pipeline("B_shared", 3, inflight=1), "inflight applies to asynchronous MMA")
    assert s.pipelines == {"A_shared": 3}


def test_a_loop_named_by_a_cache_or_a_fusion_cannot_be_transformed_away(rng):
    func, P, T, Y, R = chain()
    s = pt.create_schedule(func)
    s[T].after(s[P], "j")
    refused(s, lambda: s[P].tile("i", "j", 2, 2), "T is placed after P at loop j, which no longer exists")
    refused(s, lambda: s[P].apply_sch("{ [i, j] -> [j, i] }"), "T is placed after P at loop j")
    check_chain(s, rng)
    s = pt.create_schedule(func)
    s[Y].cache_identity(T, "i")
    refused(s, lambda: s[Y].split("i", 2), "cache T_Y_local of T is placed at loop i of Y, which no longer exists")
    refused(s, lambda: s[Y].fuse("i", "j"), "cache T_Y_local of T is placed at loop i of Y")
    s[T].separate("i")
    s[T].tile("i", "j", 4, 4)  # the separation of a tiled loop goes with it
    assert s.states["T"].separate == set()
    check_chain(s, rng)


def test_one_vectorized_loop_per_computation_and_alike_tags_in_fused_loops(rng):
    X = pt.placeholder((9, 7), "float32", "X")
    T = pt.compute((9, 7), lambda i, j: X[i, j] * 2.0, "T")
    Y = pt.compute((9, 7), lambda i, j: T[i, j] + 1.0, "Y")
    s = pt.create_schedule(pt.Func([X], [Y]))
    s[T].vectorize("j")
    refused(s, lambda: s[T].vectorize("i"), "loop j of T is already vectorize")
    s[Y].after(s[T], "i")
    s[Y].parallel("i")
    refused(s, lambda: s[T].unroll("i"), "loop i of T is unroll and loop i of Y, fused with it, is parallel")
    s[T].parallel("i")
    x = rng.standard_normal((9, 7)).astype("float32")
    np.testing.assert_allclose(pt.build(s)(x), x * 2 + 1, rtol=1e-6)


def test_an_explicit_serial_tag_conflicts_with_another_in_a_fused_loop(rng):
    """A loop tagged "serial" fused with one tagged otherwise is refused by the primitive that fuses
    them, as lowering would refuse it (fuzz seed 41 cases 1743, 1911: refused only at the build);
    an untagged loop takes the other's tag."""
    X = pt.placeholder((9, 7), "float32", "X")
    T = pt.compute((9, 7), lambda i, j: X[i, j] * 2.0, "T")
    Y = pt.compute((9, 7), lambda i, j: T[i, j] + 1.0, "Y")
    s = pt.create_schedule(pt.Func([X], [Y]))
    s[T].tag("i", "serial")
    s[Y].parallel("i")
    refused(s, lambda: s[Y].after(s[T], "i"), "loop i of T is serial and loop i of Y, fused with it, is parallel")
    s[T].tag("i", "parallel")
    s[Y].after(s[T], "i")
    refused(s, lambda: s[T].tag("i", "serial"), "loop i of T is serial and loop i of Y, fused with it, is parallel")
    s2 = pt.create_schedule(pt.Func([X], [Y]))
    s2[Y].parallel("i")
    s2[Y].after(s2[T], "i")  # T's loop i untagged: the fused loop is parallel
    x = rng.standard_normal((9, 7)).astype("float32")
    for sched in (s, s2):
        np.testing.assert_allclose(pt.build(sched)(x), x * 2 + 1, rtol=1e-6)
