"""Scalar types of polytile: names, sizes, C spellings and NumPy equivalents; the type an operator
accumulates each type in, and the tolerance a result of each type is checked with (the one place
``polytile run``, the operator library's references and the tuner's checks take it from)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import LanguageError

try:  # bfloat16 arrays in NumPy come from ml_dtypes (the package JAX uses).
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    _ml_dtypes = None


@dataclass(frozen=True)
class DType:
    """A scalar type: ``kind`` is one of float, int, uint, bool."""

    name: str
    kind: str
    bits: int

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def numpy(self) -> np.dtype:
        if self.name == "bfloat16":
            if _ml_dtypes is None:
                raise LanguageError("bfloat16 arrays need the ml_dtypes package: pip install ml_dtypes")
            return np.dtype(_ml_dtypes.bfloat16)
        return np.dtype(self.name if self.name != "bool" else np.bool_)

    def __repr__(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name


float16 = DType("float16", "float", 16)
bfloat16 = DType("bfloat16", "float", 16)
float32 = DType("float32", "float", 32)
float64 = DType("float64", "float", 64)
int8 = DType("int8", "int", 8)
int16 = DType("int16", "int", 16)
int32 = DType("int32", "int", 32)
int64 = DType("int64", "int", 64)
uint8 = DType("uint8", "uint", 8)
bool_ = DType("bool", "bool", 8)

ALL = (float16, bfloat16, float32, float64, int8, int16, int32, int64, uint8, bool_)
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME.update({"half": float16, "float": float32, "double": float64, "bf16": bfloat16, "fp16": float16,
                 "fp32": float32, "fp64": float64, "bool_": bool_})

INDEX = int64
"""The type of loop iterators, sizes and parameters."""


def as_dtype(value: object) -> DType:
    """Turn a name, a NumPy dtype or a DType into a DType, or raise a clear error."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    try:
        npd = np.dtype(value)  # type: ignore[arg-type]
    except TypeError:
        npd = None
    if npd is not None:
        if _ml_dtypes is not None and npd == np.dtype(_ml_dtypes.bfloat16):
            return bfloat16
        if npd.name in _BY_NAME:
            return _BY_NAME[npd.name]
    names = ", ".join(d.name for d in ALL)
    raise LanguageError(f"unknown dtype {value!r}; use one of {names}")


def wrap_int(value: int, dtype: DType) -> int:
    """``value`` wrapped into the integer type ``dtype`` (two's complement), as NumPy's integer
    arithmetic and polytile's generated code wrap."""
    value &= (1 << dtype.bits) - 1
    return value - (1 << dtype.bits) if dtype.kind == "int" and value >> (dtype.bits - 1) else value


def promote(a: DType, b: DType) -> DType:
    """The common type of a binary operation: floats over ints, wider over narrower."""
    if a == b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    if a.is_float:
        if a.bits != b.bits:
            return a if a.bits > b.bits else b
        return float32  # float16 with bfloat16
    bits = max(a.bits, b.bits)
    if a.kind == b.kind:
        return a if a.bits >= b.bits else b
    return _BY_NAME[f"int{max(bits * 2 if bits < 64 else 64, 16)}"] if bits < 64 else int64


def accumulator(dtype: object) -> DType:
    """The type products of ``dtype`` operands are summed in, and the result type of the operator
    library's products and convolutions: float32 for 16-bit floats (as tensor cores and torch do),
    int32 for 8- and 16-bit integers (as cuBLAS's and torch's int8 GEMMs; NumPy's ``np.matmul``
    would keep int8 and wrap around), the type itself otherwise."""
    d = as_dtype(dtype)
    if d.is_float and d.bits == 16:
        return float32
    if d.is_int and d.bits <= 16:
        return int32
    return d


def epsilon(dtype: object) -> float:
    """The machine epsilon of a floating-point type (the gap between 1 and the next value)."""
    d = as_dtype(dtype)
    if not d.is_float:
        raise LanguageError(f"{d} is not a floating-point type; it has no epsilon")
    return 2.0 ** -_FRACTION_BITS[d.name]


_FRACTION_BITS = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}


# The error a result of each floating-point type may show against a float64 reference, without
# reductions: a few roundings to the type (16-bit: storing the float32 result rounds by up to half
# an epsilon, 4.9e-4 for float16 and 3.9e-3 for bfloat16) and the math functions' last bits.
ROUNDING_TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
TENSOR_CORE_TOLERANCE = 1e-4  # 16-bit operands: the hardware sums in float32 in an order of its own


def tolerance(result: object, reduction: int = 1, operands: object = None) -> float:
    """The relative error (‖out − ref‖ / ‖ref‖) a correct result of type ``result`` may show against a
    float64 reference: 0 for integer and boolean results (exact); for floats the rounding of the type
    plus float32 (float64 for float64 results) summation error growing as the square root of the
    ``reduction`` length (terms summed per result element), and at least 1e-4 when the
    ``operands`` are 16-bit floats."""
    d = as_dtype(result)
    if not d.is_float:
        return 0.0
    summed_in = float64 if d == float64 else float32
    tol = ROUNDING_TOLERANCE[d.name] + 4 * epsilon(summed_in) * math.sqrt(max(1, reduction))
    if operands is not None and as_dtype(operands).is_float and as_dtype(operands).bits == 16:
        tol = max(tol, TENSOR_CORE_TOLERANCE)
    return tol
