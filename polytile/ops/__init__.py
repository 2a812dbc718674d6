"""The operator library: each operator is an algorithm with random inputs, a NumPy reference and
default schedules for the CPU and CUDA."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import PolytileError
from .base import Op, random_array, rel_error
from .conv import conv2d, conv2d_nhwc
from .igemm import conv2d_igemm, conv3d_igemm
from .matmul import batch_matmul, batch_matmul_func, dense, matmul, matmul_func
from .norm import layernorm, softmax
from .sparse import segment_sum, spmm

OPS: dict[str, Callable[..., Op]] = {
    "matmul": matmul, "batch_matmul": batch_matmul, "dense": dense, "conv2d": conv2d,
    "conv2d_nhwc": conv2d_nhwc, "softmax": softmax, "layernorm": layernorm, "segment_sum": segment_sum,
    "spmm": spmm, "conv2d_igemm": conv2d_igemm, "conv3d_igemm": conv3d_igemm,
}


def get(name: str, **shape: int) -> Op:
    """The operator ``name`` at the given sizes, e.g. ``get("matmul", M=512, N=512, K=512)``."""
    if name not in OPS:
        raise PolytileError(f"unknown operator {name!r}; known: {', '.join(sorted(OPS))}")
    try:
        return OPS[name](**shape)
    except TypeError as err:
        raise PolytileError(f"operator {name}: {err}") from None


__all__ = ["OPS", "Op", "batch_matmul", "batch_matmul_func", "conv2d", "conv2d_igemm", "conv2d_nhwc", "conv3d_igemm",
           "dense", "get", "layernorm", "matmul", "matmul_func", "random_array", "rel_error", "segment_sum", "softmax",
           "spmm"]
