"""Scalar types of polytile: names, sizes, C spellings and NumPy equivalents."""

from __future__ import annotations

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
