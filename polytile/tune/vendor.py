"""Vendor baselines the tuned kernels are compared with: NumPy (OpenBLAS) and torch where installed."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Baseline = tuple[str, Callable[..., Any]]


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def vendor_baseline(op: Any) -> Baseline | None:
    """(library name, function of the operator's inputs) for a CPU operator, or None."""
    name, s = op.name, op.shape
    torch = _torch()
    if name in ("matmul", "batch_matmul"):
        return "numpy", np.matmul
    if name == "dense":
        return "numpy", lambda x, w, b: np.maximum(x @ w.T + b, 0.0)
    if name == "conv2d":
        if torch is not None:
            def conv(i: np.ndarray, w: np.ndarray) -> Any:
                f = torch.nn.functional
                return f.conv2d(torch.from_numpy(i), torch.from_numpy(w), stride=s["stride"],
                                padding=s["padding"], dilation=s["dilation"])
            return f"torch {torch.__version__}", conv
        return "numpy im2col", lambda i, w: _conv_im2col(i, w, s["stride"], s["padding"], s["dilation"])
    if name == "softmax":
        def softmax(x: np.ndarray) -> np.ndarray:
            e = np.exp(x - x.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)
        return "numpy", softmax
    if name == "layernorm":
        def layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
            m = x.mean(axis=1, keepdims=True)
            return (x - m) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5) * g + b
        return "numpy", layernorm
    return None


def gpu_vendor_baseline(op: Any, inputs: Sequence[np.ndarray], device: str = "cuda"
                        ) -> tuple[str, Callable[[], Any]] | None:
    """(library, zero-argument call on ``device`` tensors made from ``inputs``) for a GPU operator: the
    torch call a user would make (cuBLAS, cuDNN, torch's kernels), or None without torch or a
    counterpart. Its output is in the operator's layout (the implicit GEMMs' NHWC rows)."""
    torch = _torch()
    if torch is None:
        return None
    f = torch.nn.functional
    name, s = op.name, op.shape
    t = [torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in inputs]
    if name in ("matmul", "batch_matmul"):
        a, b = t
        return "cuBLAS (torch)", lambda: a @ b
    if name == "conv2d":
        x, w = t
        return "cuDNN (torch)", lambda: f.conv2d(x, w, stride=s["stride"], padding=s["padding"],
                                                  dilation=s["dilation"])
    if name in ("conv2d_igemm", "conv3d_igemm"):
        d3 = name == "conv3d_igemm"
        fmt = torch.channels_last_3d if d3 else torch.channels_last
        x = t[0].permute(0, 4, 1, 2, 3) if d3 else t[0].permute(0, 3, 1, 2)  # channels-last memory
        w = (t[1].permute(4, 3, 0, 1, 2) if d3 else t[1].permute(3, 2, 0, 1)).contiguous(memory_format=fmt)
        conv = f.conv3d if d3 else f.conv2d
        rows = (0, 2, 3, 4, 1) if d3 else (0, 2, 3, 1)
        return "cuDNN (torch)", lambda: conv(x, w, stride=s["stride"], padding=s["padding"]).permute(
            *rows).reshape(-1, s["K"])
    if name == "softmax":
        return "torch", lambda: torch.softmax(t[0], dim=1)
    if name == "layernorm":
        x, g, b = t
        return "torch", lambda: f.layer_norm(x, (s["N"],), g, b, eps=1e-5)
    return None


def _conv_im2col(i: np.ndarray, w: np.ndarray, stride: int, pad: int, dil: int) -> np.ndarray:
    from numpy.lib.stride_tricks import sliding_window_view
    n, c, _, _ = i.shape
    k, _, r, s = w.shape
    x = np.pad(i, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(x, ((r - 1) * dil + 1, (s - 1) * dil + 1), axis=(2, 3))
    win = win[:, :, ::stride, ::stride, ::dil, ::dil]  # n, c, p, q, r, s
    p, q = win.shape[2], win.shape[3]
    cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * p * q, c * r * s)
    out = cols @ w.reshape(k, c * r * s).T
    return out.reshape(n, p, q, k).transpose(0, 3, 1, 2)


def time_call(fn: Callable[..., Any], inputs: Sequence[Any], repeat: int = 20, warmup: int = 3,
              min_time: float = 0.2) -> float:
    """Median wall time of ``fn(*inputs)`` in seconds."""
    for _ in range(warmup):
        fn(*inputs)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeat or (time.perf_counter() - start < min_time and len(times) < 1000):
        t0 = time.perf_counter()
        fn(*inputs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
