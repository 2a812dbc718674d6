"""What a user would call instead of polytile, for comparison in the same run: NumPy (OpenBLAS),
SciPy's sparse matrices and PyTorch's CPU convolution where installed."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def torch_conv2d(stride: int, padding: int, dilation: int, layout: str = "NCHW"
                 ) -> tuple[Callable[..., np.ndarray], str] | None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None

    def run(i: np.ndarray, w: np.ndarray) -> np.ndarray:
        x, k = torch.from_numpy(i), torch.from_numpy(w)
        if layout == "NHWC":
            x, k = x.permute(0, 3, 1, 2), k.permute(3, 2, 0, 1)
        with torch.no_grad():
            y = F.conv2d(x, k, stride=stride, padding=padding, dilation=dilation)
        return (y.permute(0, 2, 3, 1) if layout == "NHWC" else y).numpy()

    return run, "torch"


def numpy_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def numpy_layernorm(eps: float) -> Callable[..., np.ndarray]:
    def run(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        mean = x.mean(axis=1, keepdims=True)
        return (x - mean) / np.sqrt(x.var(axis=1, keepdims=True) + eps) * g + b
    return run


def numpy_segment_sum(o: np.ndarray, x: np.ndarray) -> np.ndarray:
    sums = np.add.reduceat(np.append(x, 0), np.minimum(o[:-1], len(x)))
    return np.where(o[1:] > o[:-1], sums, 0)


def scipy_spmm() -> tuple[Callable[..., np.ndarray], str] | None:
    try:
        import scipy.sparse as sp
    except ImportError:
        return None

    def run(p: np.ndarray, c: np.ndarray, v: np.ndarray, b: np.ndarray) -> np.ndarray:
        return sp.csr_matrix((v, c, p), shape=(len(p) - 1, b.shape[0])) @ b

    return run, "scipy"
