"""16-bit floats through every math function of the language and through infinite constants: on the
CPU each result matches NumPy (computed in float32 from the 16-bit inputs, rounded to the 16-bit
type), and the CUDA source of the same kernels compiles with nvcc. Found by ``polytile fuzz``
(float16 ``pt.sigmoid`` and ``pt.rsqrt`` called ambiguous overloads; a float16 max reduction printed
its identity as ``-INFINITYf``)."""

from __future__ import annotations

import numpy as np
import pytest

import polytile as pt
from polytile import dtypes
from polytile.lang.expr import ANY_FUNCS, FLOAT_FUNCS

HALF = ["float16", "bfloat16"]
SHAPE = (5, 7)


def _sigmoid(x):  # noqa: ANN001, ANN202 - NumPy arrays
    return 1.0 / (1.0 + np.exp(-x))


def _erf(x):  # noqa: ANN001, ANN202 - NumPy arrays
    from math import erf
    return np.vectorize(erf, otypes=[np.float32])(x)


NUMPY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x), "tanh": np.tanh,
    "erf": _erf, "sigmoid": _sigmoid, "sin": np.sin, "cos": np.cos, "floor": np.floor, "ceil": np.ceil,
    "exp2": np.exp2, "log2": np.log2, "pow": np.power, "fma": lambda x, y, z: x * y + z, "abs": np.abs,
    "max": np.maximum, "min": np.minimum,
}
ARITY = {"pow": 2, "max": 2, "min": 2, "fma": 3}


def test_the_table_covers_the_language():
    assert set(NUMPY) == FLOAT_FUNCS | ANY_FUNCS


POSITIVE = {"log", "sqrt", "rsqrt", "log2", "pow"}  # the others take signed arguments


def _func(dtype: str) -> pt.Func:
    """One output per math function: ``f(P)`` or ``f(S)`` (P positive, S signed), ``f(P, S)``,
    ``fma(S, P, S)``."""
    P, S = pt.placeholder(SHAPE, dtype, "P"), pt.placeholder(SHAPE, dtype, "S")
    outs = []
    for name in sorted(NUMPY):
        args = (S, P, S)[:3] if name == "fma" else (P if name in POSITIVE else S, S)[:ARITY.get(name, 1)]
        outs.append(pt.compute(SHAPE, lambda i, j, args=args, name=name: pt.call(name, *(a[i, j] for a in args)),
                               f"T_{name}"))
    return pt.Func([P, S], outs)


@pytest.mark.parametrize("dtype", HALF)
def test_math_of_16_bit_floats_on_the_cpu(rng, dtype):
    npd = dtypes.as_dtype(dtype).numpy
    p, s = rng.uniform(0.25, 2.0, SHAPE).astype(npd), rng.uniform(-2.0, 2.0, SHAPE).astype(npd)
    outs = pt.build(_func(dtype))(p, s)
    p32, s32 = p.astype(np.float32), s.astype(np.float32)
    for name, out in zip(sorted(NUMPY), outs):
        assert out.dtype == npd, name
        args = (s32, p32, s32)[:3] if name == "fma" else (p32 if name in POSITIVE else s32, s32)[:ARITY.get(name, 1)]
        ref = NUMPY[name](*args).astype(np.float64)
        err = np.abs(out.astype(np.float64) - ref) / np.maximum(np.abs(ref), 1.0)
        assert err.max() <= 2 * dtypes.ROUNDING_TOLERANCE[dtype], (name, dtype, err.max())


def _max_and_min(dtype: str) -> pt.Func:
    """Max and min reductions (identities -inf and +inf) and an infinite constant of ``dtype``."""
    A = pt.placeholder(SHAPE, dtype, "A")
    k = pt.reduce_axis(SHAPE[1], "k")
    hi = pt.compute((SHAPE[0],), lambda i: pt.max(A[i, k], axis=k), "hi")
    m = pt.reduce_axis(SHAPE[1], "m")
    lo = pt.compute((SHAPE[0],), lambda i: pt.min(A[i, m], axis=m), "lo")
    inf = pt.compute(SHAPE, lambda i, j: pt.select(A[i, j] > 0.0, float("inf"), -float("inf")), "inf")
    return pt.Func([A], [hi, lo, inf])


@pytest.mark.parametrize("dtype", HALF)
def test_infinities_of_16_bit_floats_on_the_cpu(rng, dtype):
    a = rng.uniform(-3.0, 3.0, SHAPE).astype(dtypes.as_dtype(dtype).numpy)
    hi, lo, inf = pt.build(_max_and_min(dtype))(a)
    np.testing.assert_array_equal(hi, a.max(axis=1))
    np.testing.assert_array_equal(lo, a.min(axis=1))
    np.testing.assert_array_equal(inf.astype(np.float32), np.where(a > 0, np.inf, -np.inf))


def _on_threads(func: pt.Func) -> pt.Schedule:
    s = pt.create_schedule(func)
    for c in func.outputs:
        s[c].bind(s[c].loops[0], "blockIdx.x")
    return s


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("dtype", HALF)
def test_16_bit_math_and_infinities_compile_for_cuda(dtype):
    kern = pt.build(_on_threads(_func(dtype)), "cuda:sm_90a")
    assert kern.cubin[:4] == b"\x7fELF"
    kern = pt.build(_on_threads(_max_and_min(dtype)), "cuda:sm_90a")
    assert kern.cubin[:4] == b"\x7fELF"
