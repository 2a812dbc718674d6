"""Arguments of the wrong kind given to schedule primitives, ``s[...]`` and ``pt.build`` are refused
at once with a ScheduleError/BuildError naming them (found by the independent fuzzer,
``tools/fuzz_independent.py``, and its hostile-user probes): before, ``split("j", True)`` let an isl
syntax error escape, ``shift("j", 0.5)`` ran as a shift by 0, ``s[5]``, ``after(None)`` and
``cache_identity(None)`` raised AttributeError, ``apply_sch(5)`` a TypeError of islpy; and a map
defined on some iterations only (``[a, b] -> [a/2, b]``, even ``a`` alone) was accepted and failed
inside isl's AST generation at the build. NumPy integers are integers."""

import numpy as np
import pytest

import polytile as pt


def two_stages():
    A = pt.placeholder((12, 7), "float32", "A")
    B = pt.compute((12, 7), lambda i, j: A[i, j] + 1, "B")
    C = pt.compute((12, 7), lambda i, j: B[i, j] * 2, "C")
    return A, B, C, pt.create_schedule(pt.Func([A], [C]))


BAD = {
    "split by True": lambda s, B, C: s[C].split("j", True),
    "split by 2.0": lambda s, B, C: s[C].split("j", 2.0),
    "tile by True": lambda s, B, C: s[C].tile("i", "j", True, 2),
    "shift by 0.5": lambda s, B, C: s[C].shift("j", 0.5),
    "shift by True": lambda s, B, C: s[C].shift("j", True),
    "skew by 1.5": lambda s, B, C: s[C].skew("i", "j", 1.5),
    "split named 5": lambda s, B, C: s[C].split("j", 2, 5, 6),
    "apply_sch of 5": lambda s, B, C: s[C].apply_sch(5),
    "apply_sch of None": lambda s, B, C: s[C].apply_sch(None),
    "apply_sch named 1, 2": lambda s, B, C: s[C].apply_sch("{ [a, b] -> [b, a] }", names=[1, 2]),
    "apply_sch named 'x y'": lambda s, B, C: s[C].apply_sch("{ [a, b] -> [b, a] }", names=["x y", "z"]),
    "apply_sch a/2": lambda s, B, C: s[C].apply_sch("{ [a, b] -> [a/2, b] }"),
    "apply_sch on a < 2 only": lambda s, B, C: s[C].apply_sch("{ [a, b] -> [a, b] : a < 2 }"),
    "cache of None": lambda s, B, C: s[C].cache_identity(None, "j"),
    "cache of 5": lambda s, B, C: s[C].cache(5, "j"),
    "cache_write named 5": lambda s, B, C: s[C].cache_write("j", name=5),
    "after None": lambda s, B, C: s[C].after(None, "i"),
    "before 5": lambda s, B, C: s[C].before(5, "i"),
    "s[5]": lambda s, B, C: s[5],
    "s[None]": lambda s, B, C: s[None],
}


@pytest.mark.parametrize("what", list(BAD))
def test_a_bad_argument_is_a_schedule_error_at_the_primitive(what):
    A, B, C, s = two_stages()
    before = {t: s[t].loops for t in ("B", "C")}
    with pytest.raises(pt.ScheduleError):
        BAD[what](s, B, C)
    assert {t: s[t].loops for t in ("B", "C")} == before
    np.testing.assert_allclose(pt.build(s)(np.ones((12, 7), np.float32)), 4.0)


def test_numpy_integers_are_integers():
    A = pt.placeholder((np.int64(12), 7), "float32", "A")
    k = pt.reduce_axis(np.int32(7), "k")
    C = pt.compute((np.int64(12),), lambda i: pt.sum(A[i, k], axis=k) * np.float32(0.5), "C")
    s = pt.create_schedule(pt.Func([A], [C]))
    s[C].split("i", np.int64(4)).shift("io", np.int32(1)).skew("io", "ii", np.int64(2))
    a = np.ones((12, 7), np.float32)
    np.testing.assert_allclose(pt.build(s)(a), 3.5)


def test_a_map_defined_on_every_iteration_is_accepted():
    A, B, C, s = two_stages()
    s[C].apply_sch("{ [a, b] -> [floor(a/2), b, a % 2] }").apply_sch("{ [a, b, c] -> [a, b, c] : a >= -5 }")
    np.testing.assert_allclose(pt.build(s)(np.ones((12, 7), np.float32)), 4.0)


@pytest.mark.parametrize("flags", ["-O3", 5, [3]])
def test_extra_flags_that_are_not_a_list_of_strings(flags):
    A, B, C, s = two_stages()
    with pytest.raises(pt.BuildError, match="extra_flags"):
        pt.build(s, extra_flags=flags)
