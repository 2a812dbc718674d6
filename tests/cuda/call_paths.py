"""What the call-path tests share (test_call_path_fake, test_fastcall and their GPU counterparts): a
kernel whose output is cleared before each launch, and the GPU tests' setup — NumPy data on the GPU,
a stream kept busy, a call captured in a CUDA graph. torch is imported where used: the GPU test
modules skip without it."""

from __future__ import annotations

import numpy as np

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


def on_gpu(x: np.ndarray):  # noqa: ANN201 - a torch tensor
    import torch
    return torch.from_numpy(np.ascontiguousarray(x)).cuda()


def keep_busy() -> None:
    """Queue products of 4096² matrices on torch's current stream: a launch that does not wait for them
    (another stream, a missing dependency) would read or write while they run."""
    import torch
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        big = big @ big / 64


def warm_up(kern: CUDAKernel, *static: object) -> None:
    """Two calls on a side stream before a capture, as ``torch.cuda.graph`` wants."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            kern(*static)
    torch.cuda.current_stream().wait_stream(side)


def capture(kern: CUDAKernel, *static: object):  # noqa: ANN201 - (torch.cuda.CUDAGraph, the static output)
    """``kern(*static)`` captured in a CUDA graph (after ``warm_up``): the graph and its output."""
    import torch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kern(*static)
    return graph, out


def replay(graph, static: tuple, new: tuple) -> None:  # noqa: ANN001
    """Copy ``new`` into the captured inputs ``static``, replay ``graph`` and wait for it."""
    import torch
    for s, n in zip(static, new):
        s.copy_(n)
    graph.replay()
    torch.cuda.synchronize()
