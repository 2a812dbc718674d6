"""The C++ compiler's defects that polytile works around, detected once per compiler and flags
(``polytile.toolchain.cxx_workarounds``). Found by ``polytile fuzz`` (E2 of the fuzz findings):
GCC 12.2 with ``-march=native`` on an AVX512-FP16 CPU stores a float16 maximum with a zero-masked
``vmovsh`` to memory, an instruction that does not exist (EVEX zero-masking is register-only), and
the assembler refuses it."""

from __future__ import annotations

import numpy as np

import polytile as pt
from polytile import toolchain
from polytile.runtime import cpu


def _float16_max_of_gathered_float64():
    A = pt.placeholder((5, 5), "float64", "A")
    idx = pt.placeholder((2,), "int32", "idx", value_range=(0, 4))

    def f_V(i, j, h):
        k = pt.reduce_axis((0, 1), "k")
        return pt.sum(A[i // 2, h % 2], axis=k, where=pt.select(h != 4, pt.cast("float64", i), 1.5) != 3.0)

    V = pt.compute((5, 5, 5), f_V, "V")
    W = pt.compute((2, 2), lambda i, j: pt.maximum(pt.cast("float16", 0.0),
                   pt.cast("float16", pt.select(i >= 1, V[idx[j], i - 1, i], 1.0))), "W")
    return pt.Func([A, idx], [W])


def _numpy(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    i = np.arange(5)[:, None, None]
    h = np.arange(5)[None, None, :]
    keep = np.where(h != 4, i.astype(np.float64), 1.5) != 3.0
    V = np.where(keep, a[i // 2, h % 2], 0.0) * np.ones((5, 5, 5))
    W = np.empty((2, 2), np.float16)
    for r in range(2):
        for c in range(2):
            W[r, c] = max(np.float16(0), np.float16(V[idx[c], r - 1, r] if r >= 1 else 1.0))
    return W


def test_float16_maximum_builds_and_computes(rng):
    a = rng.normal(size=(5, 5))
    idx = rng.integers(0, 5, 2).astype(np.int32)
    out = pt.build(_float16_max_of_gathered_float64())(a, idx)
    np.testing.assert_array_equal(out, _numpy(a, idx))


def test_workarounds_are_those_the_probe_needs():
    cxx = cpu.compiler()
    base = (*cpu.CXX_FLAGS, *(cpu.GCC_FLAGS if cpu.is_gcc(cxx) else []))
    extra = toolchain.cxx_workarounds(cxx, base)
    assert extra in ([], ["-mno-avx512fp16"])
    assert toolchain.cxx_workarounds(cxx, base) is extra  # probed once
    assert cpu.compile_flags(cxx) == [*base, *extra]
    assert toolchain.compiles(cxx, [*base, *extra], toolchain.AVX512FP16_PROBE)
    if extra:  # only where the compiler fails without it
        assert not toolchain.compiles(cxx, list(base), toolchain.AVX512FP16_PROBE)


def test_a_disjunction_of_comparisons_keeps_every_value():
    """GCC 12.2's reassociation merged ``s <= 0 && (s >= -2 || s == -4 || s == -6)`` (s in
    [-18, 12]) into a bit test without s = 0 (fuzz seed 43 case 10327): built with the kernels'
    flags, the probe holds exactly where the condition does."""
    import ctypes
    lib = ctypes.CDLL(str(cpu.compile_shared(toolchain.REASSOC_PROBE)))
    lib.probe.argtypes = [ctypes.c_long]
    got = [lib.probe(s) for s in range(-18, 13)]
    assert got == [int(s <= 0 and (s >= -2 or s in (-4, -6))) for s in range(-18, 13)]
