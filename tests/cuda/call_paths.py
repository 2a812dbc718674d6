"""What the call-path tests share (test_call_path_fake, test_fastcall): a kernel whose output is cleared
before each launch."""

from __future__ import annotations

import polytile as pt
from polytile.runtime.cuda import CUDAKernel


def build_lower_triangle(target: str) -> CUDAKernel:
    """``L = 2 A`` below the diagonal, zero above (``where=``): its output is cleared before the launch."""
    N = pt.param("N")
    A = pt.placeholder((N, N), "float32", "A")
    L = pt.compute((N, N), lambda i, j: A[i, j] * 2.0, "L", where=lambda i, j: j <= i)
    s = pt.create_schedule(pt.Func([A], [L], name="lower"))
    s[L].split("i", 32, "bx", "tx").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    return pt.build(s, target)
