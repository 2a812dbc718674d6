"""Differential testing of a kernel variant: fresh random inputs, poisoned outputs, exact comparison.

A reordered schedule does the same arithmetic in the same order, so its outputs must match the
original kernel's bit for bit; `CubinLaunch.rtol` relaxes that for kernels that are not
deterministic themselves (float atomics). Inputs are never zeros: floats are drawn from a
normal distribution, integers from a small range, and outputs start as 0xFF bytes so an element
the variant fails to write shows up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polytile.sass.launch import Buffer, CubinLaunch, storage_dtype

POISON = 0xFF


@dataclass(frozen=True)
class Mismatch:
    buffer: str
    elements: int
    first_index: int
    max_abs_error: float

    def __str__(self) -> str:
        return (
            f"output {self.buffer!r} differs in {self.elements} elements (first at flat index "
            f"{self.first_index}, max |error| {self.max_abs_error:.3g})"
        )


def fill(buffer: Buffer, rng: np.random.Generator) -> np.ndarray:
    """Host contents of `buffer` before a run: random inputs, or poison for outputs."""
    dtype = storage_dtype(buffer.dtype)
    count = int(np.prod(buffer.shape, dtype=np.int64))
    if buffer.role == "out":
        return np.full(count * dtype.itemsize, POISON, dtype=np.uint8).view(dtype).reshape(buffer.shape)
    if buffer.init == "data":
        return np.ascontiguousarray(buffer.data).view(dtype).reshape(buffer.shape)
    if buffer.init.startswith("randint:"):
        _, lo, hi = buffer.init.split(":")
        return rng.integers(int(lo), int(hi), size=buffer.shape).astype(dtype)
    if buffer.init not in ("normal", "uniform"):
        raise ValueError(f"buffer {buffer.name!r}: unknown init {buffer.init!r}")
    if buffer.dtype == "bfloat16":
        values = (
            rng.standard_normal(buffer.shape, dtype=np.float32)
            if buffer.init == "normal"
            else rng.uniform(-1, 1, buffer.shape).astype(np.float32)
        )
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    if dtype.kind == "f":
        values = (
            rng.standard_normal(buffer.shape) if buffer.init == "normal" else rng.uniform(-1, 1, buffer.shape)
        )
        return values.astype(dtype)
    lo, hi = (-64, 64) if buffer.init == "normal" else (0, 64)
    if dtype.kind == "u":
        lo = 0
    return rng.integers(lo, hi, size=buffer.shape).astype(dtype)


def host_inputs(launch: CubinLaunch, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {b.name: fill(b, rng) for b in launch.buffers()}


def compare(
    launch: CubinLaunch, expected: dict[str, np.ndarray], actual: dict[str, np.ndarray]
) -> Mismatch | None:
    """The first output that differs, or None when all outputs agree."""
    for buffer in launch.outputs():
        want, got = expected[buffer.name].reshape(-1), actual[buffer.name].reshape(-1)
        if np.array_equal(want.view(np.uint8), got.view(np.uint8)):
            continue
        bits_differ = want.view(np.uint8).reshape(len(want), -1) != got.view(np.uint8).reshape(len(got), -1)
        differ = bits_differ.any(axis=1)
        if launch.rtol and storage_dtype(buffer.dtype).kind == "f":
            w, g = want.astype(np.float64), got.astype(np.float64)
            close = (np.abs(w - g) <= launch.rtol * np.abs(w) + 1e-30) | (np.isnan(w) & np.isnan(g))
            differ = ~close
        if differ.any():
            index = np.nonzero(differ)[0]
            error = float("nan")
            if storage_dtype(buffer.dtype).kind in "fiu" and buffer.dtype != "bfloat16":
                error = max_abs_error(want[index], got[index])
            return Mismatch(buffer.name, int(len(index)), int(index[0]), error)
    return None


def max_abs_error(want: np.ndarray, got: np.ndarray) -> float:
    """Largest |want - got| over elements known to differ; a NaN on one side only counts as inf.

    An output the variant never wrote still holds the poison (0xFF bytes: a NaN for floats), and a
    NaN where the original has a number is as wrong as an answer can be; two NaNs with different
    bits count as 0.
    """
    w, g = want.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.abs(w - g)
    error[np.isnan(w) & np.isnan(g)] = 0.0
    error[np.isnan(error)] = np.inf  # one NaN, or inf - inf of one sign (then the bits agree)
    return float(error.max(initial=0.0))
