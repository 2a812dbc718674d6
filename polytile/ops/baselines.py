"""What a user would call instead of polytile, for comparison in the same run: NumPy (OpenBLAS),
SciPy's sparse matrices and PyTorch's CPU convolution where installed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def torch_cuda_inputs(arrays: list[np.ndarray]) -> list[object] | None:
    """The arrays as torch tensors on the GPU (bfloat16 moved bit for bit), or None without torch/CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    out = []
    for x in arrays:
        if x.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: torch reads the bits
            out.append(torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16).cuda())
        else:
            out.append(torch.from_numpy(np.ascontiguousarray(x)).cuda())
    return out


def torch_cuda_baseline(op: object) -> tuple[Callable[..., object], str] | None:
    """The torch call (cuBLAS / cuDNN / torch's own kernels) computing operator ``op`` on the GPU
    tensors of ``torch_cuda_inputs``, or None when torch has no counterpart. Its result keeps torch's
    dtype (16-bit GEMMs: 16-bit results) and shape (NHWC for the implicit-GEMM convolutions, whose
    results are (N·P·Q) × K); callers check it against the reference before trusting it (dense
    assumes ReLU, layernorm eps=1e-5)."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    name, s = op.name, op.shape  # type: ignore[attr-defined]
    if name in ("matmul", "batch_matmul"):
        return torch.matmul, "cuBLAS"
    if name == "dense":
        return (lambda x, w, b: torch.relu(F.linear(x, w, b))), "cuBLAS"
    if name == "conv2d":
        def conv(i: Any, w: Any) -> Any:
            return F.conv2d(i, w, stride=s["stride"], padding=s["padding"], dilation=s["dilation"])
        return conv, "cuDNN"
    if name in ("conv2d_nhwc", "conv2d_igemm"):
        def conv_nhwc(i: Any, w: Any) -> Any:  # channels-last views: cuDNN runs NHWC natively
            return F.conv2d(i.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), stride=s["stride"],
                            padding=s["padding"]).permute(0, 2, 3, 1)
        return conv_nhwc, "cuDNN"
    if name == "conv3d_igemm":
        def conv_ndhwc(i: Any, w: Any) -> Any:
            return F.conv3d(i.permute(0, 4, 1, 2, 3), w.permute(4, 3, 0, 1, 2), stride=s["stride"],
                            padding=s["padding"]).permute(0, 2, 3, 4, 1)
        return conv_ndhwc, "cuDNN"
    if name == "softmax":
        return (lambda x: torch.softmax(x, dim=1)), "torch"
    if name == "layernorm":
        return (lambda x, g, b: F.layer_norm(x, (x.shape[1],), g, b, 1e-5)), "torch"
    return None
