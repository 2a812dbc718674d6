"""Fresh random inputs for fuzzed programs, and fenced arrays: a kernel that reads or writes past
an array's end (or before its start) touches an inaccessible page and dies with SIGSEGV instead
of silently reading a neighbour's bytes."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

from ..dtypes import as_dtype

SENTINEL = 99
"""What output arrays hold before a kernel runs: elements it should not write must keep it."""

_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _np_dtype(dtype: str) -> np.dtype:
    return as_dtype(dtype).numpy


def uniform(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, lo: float, hi: float) -> np.ndarray:
    """Floats drawn uniformly from [lo, hi], rounded to ``dtype``."""
    return rng.uniform(lo, hi, size=shape).astype(_np_dtype(dtype))


def uniform_nan(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, lo: float, hi: float) -> np.ndarray:
    """``uniform``, with about one element in six NaN."""
    a = uniform(rng, shape, dtype, lo, hi)
    a[rng.random(shape) < 1 / 6] = np.nan
    return a


def integers(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, lo: int, hi: int) -> np.ndarray:
    """Integers drawn uniformly from [lo, hi]."""
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(_np_dtype(dtype))


def indices(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, lo: int, hi: int) -> np.ndarray:
    """An index array: integers in [lo, hi] in no particular order (gathers)."""
    return integers(rng, shape, dtype, lo, hi)


def offsets(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, lo: int, hi: int) -> np.ndarray:
    """Non-decreasing integers in [lo, hi]: CSR row offsets, with empty rows now and then."""
    return np.sort(integers(rng, shape, dtype, lo, hi))


def fenced(a: np.ndarray, at_start: bool = False) -> np.ndarray:
    """A copy of ``a`` in fresh pages, flush against an inaccessible page: after its last byte, or
    before its first one when ``at_start``."""
    nbytes = a.nbytes
    pages = (nbytes + _PAGE - 1) // _PAGE + 1
    buf = mmap.mmap(-1, pages * _PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    guard, offset = (base, _PAGE) if at_start else (base + (pages - 1) * _PAGE, (pages - 1) * _PAGE - nbytes)
    if _libc.mprotect(ctypes.c_void_p(guard), _PAGE, 0) != 0:  # PROT_NONE
        raise OSError(ctypes.get_errno(), "mprotect failed")
    out = np.frombuffer(buf, dtype=a.dtype, count=a.size, offset=offset).reshape(a.shape)
    out[...] = a
    return out


def output_array(shape: tuple[int, ...], dtype: str, at_start: bool = False) -> np.ndarray:
    """A fenced output array filled with ``SENTINEL``."""
    return fenced(np.full(shape, SENTINEL, dtype=_np_dtype(dtype)), at_start)


def output_arrays(func, params: dict[str, int], at_start: bool = False) -> list[np.ndarray]:  # noqa: ANN001
    """Fenced output arrays of ``func`` (a ``pt.Func``) for ``params``, filled with ``SENTINEL``."""
    from ..runtime.args import expected_shape
    return [output_array(expected_shape(t, params), t.dtype.name, at_start) for t in func.outputs]
