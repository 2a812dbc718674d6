"""Convolutions: conv2d in NCHW (one computation with zero padding written as a select, or with an
explicit padding stage) and in NHWC, with default schedules."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import lang
from ..dtypes import as_dtype, tolerance
from ..errors import PolytileError
from ..lang.expr import select
from ..lang.func import Func
from ..lang.tensor import compute, placeholder, reduce_axis
from ..schedule.state import Schedule
from ..target import CPUTarget
from .base import Op, output_dtype, random_array, reference_type
from .baselines import torch_conv2d
from .matmul import _add_cuda, product


def conv_bytes(dtype: str, out: object, inputs: int, outputs: int) -> float:
    """Bytes a convolution moves at least: its ``dtype`` inputs and its ``out`` tensor's results."""
    return float(as_dtype(dtype).itemsize * inputs + out.dtype.itemsize * outputs)  # type: ignore[attr-defined]


def conv_out(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def conv2d_func(N: int, C: int, H: int, W: int, K: int, R: int, S: int, stride: int = 1, padding: int = 0,
                dilation: int = 1, dtype: str = "float32", pad_stage: bool = True, out_dtype: str | None = None,
                weight_block: int | None = None) -> Func:
    """The Func of ``conv2d``: inputs I and Wt, output O. ``weight_block``: Wt comes packed as the CPU
    schedule would pack it per block of filters (``schedule_conv2d_tiles_cpu``), ``[K / b][C][R][S][b]``
    with zeros past K (``polytile.torch.packing``: a model's constant weights, packed once)."""
    P, Q = conv_out(H, R, stride, padding, dilation), conv_out(W, S, stride, padding, dilation)
    I = placeholder((N, C, H, W), dtype, "I")
    if weight_block:
        b = weight_block
        Wt = placeholder(((K + b - 1) // b, C, R, S, b), dtype, "Wt")

        def weight(k, c, r, s):  # noqa: ANN001, ANN202 - iterators
            return Wt[k // b, c, r, s, k % b]
    else:
        Wt = placeholder((K, C, R, S), dtype, "Wt")

        def weight(k, c, r, s):  # noqa: ANN001, ANN202 - iterators
            return Wt[k, c, r, s]
    c, r, s = reduce_axis(C, "c"), reduce_axis(R, "r"), reduce_axis(S, "s")
    if pad_stage and padding > 0:
        Ip = compute((N, C, H + 2 * padding, W + 2 * padding),
                     lambda n, cc, h, w: select((h >= padding) & (h < H + padding) & (w >= padding)
                                                & (w < W + padding), I[n, cc, h - padding, w - padding], 0),
                     "Ipad")

        def body(n, k, p, q):  # noqa: ANN001, ANN202 - iterators
            return lang.tensor.sum(product(Ip[n, c, p * stride + r * dilation, q * stride + s * dilation],
                                           weight(k, c, r, s), dtype), axis=[c, r, s])
    else:
        def body(n, k, p, q):  # noqa: ANN001, ANN202 - iterators
            h = p * stride + r * dilation - padding
            w = q * stride + s * dilation - padding
            inside = (h >= 0) & (h < H) & (w >= 0) & (w < W)
            return lang.tensor.sum(product(select(inside, I[n, c, h, w], 0), weight(k, c, r, s), dtype),
                                   axis=[c, r, s])
    O = compute((N, K, P, Q), body, "O", store_dtype=output_dtype("conv2d", dtype, out_dtype))
    return Func([I, Wt], [O], name="conv2d")


def conv2d(N: int, C: int, H: int, W: int, K: int, R: int, S: int, stride: int = 1, padding: int = 0,
           dilation: int = 1, dtype: str = "float32", pad_stage: bool = True, out_dtype: str | None = None) -> Op:
    """O[n, k, p, q] = sum_{c, r, s} I[n, c, p*st + r*dil - pad, q*st + s*dil - pad] * Wt[k, c, r, s]
    (NCHW), summed in ``dtypes.accumulator(dtype)`` and returned as ``out_dtype`` (as ``matmul``).
    ``pad_stage=False`` writes the padding as a select inside the one computation."""
    P, Q = conv_out(H, R, stride, padding, dilation), conv_out(W, S, stride, padding, dilation)
    func = conv2d_func(N, C, H, W, K, R, S, stride, padding, dilation, dtype, pad_stage, out_dtype)
    O = func.outputs[0]

    def cpu(sched: Schedule, target: CPUTarget) -> None:
        schedule_conv2d_default_cpu(sched, target, K, Q, R * S, stride, has_pad=pad_stage and padding > 0)

    def reference(i: np.ndarray, w: np.ndarray) -> np.ndarray:
        return conv2d_reference(i, w, stride, padding, dilation)

    op = Op("conv2d", {"N": N, "C": C, "H": H, "W": W, "K": K, "R": R, "S": S, "stride": stride,
                       "padding": padding, "dilation": dilation}, func,
            lambda rng: [random_array(rng, (N, C, H, W), dtype), random_array(rng, (K, C, R, S), dtype)],
            reference, 2.0 * N * K * P * Q * C * R * S,
            conv_bytes(dtype, O, N * C * H * W + K * C * R * S, N * K * P * Q), {"cpu": cpu},
            tolerance=tolerance(O.dtype, C * R * S, dtype))
    if O.narrowed:
        op.shape["out_dtype"] = O.dtype.name  # type: ignore[assignment]
    base = torch_conv2d(stride, padding, dilation)
    if base is not None:
        op.baseline, op.baseline_name = base
    _add_cuda(op, "conv2d", (N, C, H, W, K, R, S, stride, padding, dilation))
    return op


def conv2d_gemm_func(N: int, C: int, H: int, W: int, K: int, R: int, S: int, stride: int = 1, padding: int = 0,
                     dilation: int = 1, dtype: str = "float32", out_dtype: str | None = None, split_k: int = 1
                     ) -> Func:
    """``conv2d``'s algorithm as one GEMM (an implicit GEMM in NCHW): ``G[k, j] = sum_t A[k, t] · B[t, j]``
    over the filter's C·R·S taps t, where ``A`` is the filter viewed as a K × C·R·S matrix (its own
    memory order), ``B[t, j]`` the input element that tap t meets at output pixel j (n, p, q
    flattened; zero in the padding), then ``O[n, k, p, q] = G[k, n·P·Q + p·Q + q]``. A schedule
    caches A and B in the GEMM's tiles and inlines them into the copies. With ``split_k`` > 1 the
    taps are summed in that many chunks first (``P[s, k, j]``, C·R·S a multiple of split_k), and O
    sums the chunks. Same inputs and output as ``conv2d``."""
    P, Q = conv_out(H, R, stride, padding, dilation), conv_out(W, S, stride, padding, dilation)
    taps, pixels, RS = C * R * S, N * P * Q, R * S
    if split_k < 1 or taps % split_k:
        raise PolytileError(f"conv2d: split_k={split_k} must divide the reduction C·R·S = {taps}")
    I = placeholder((N, C, H, W), dtype, "I")
    Wt = placeholder((K, C, R, S), dtype, "Wt")
    A = compute((K, taps), lambda k, t: Wt[k, t // RS, (t // S) % R, t % S], "A")

    def gather(t, j):  # noqa: ANN001, ANN202 - iterators
        n, p, q = j // (P * Q), (j // Q) % P, j % Q
        h = p * stride + (t // S) % R * dilation - padding
        w = q * stride + t % S * dilation - padding
        if padding == 0:
            return I[n, t // RS, h, w]
        return select((h >= 0) & (h < H) & (w >= 0) & (w < W), I[n, t // RS, h, w], 0)

    B = compute((taps, pixels), gather, "B")
    out = output_dtype("conv2d", dtype, out_dtype)
    chunk = taps // split_k
    t = reduce_axis(chunk, "k")
    if split_k == 1:
        G = compute((K, pixels), lambda i, j: lang.tensor.sum(product(A[i, t], B[t, j], dtype), axis=t), "G")
        O = compute((N, K, P, Q), lambda n, k, p, q: G[k, n * P * Q + p * Q + q], "O", store_dtype=out)
    else:
        Pt = compute((split_k, K, pixels), lambda s, i, j: lang.tensor.sum(
            product(A[i, s * chunk + t], B[s * chunk + t, j], dtype), axis=t), "P")
        ks = reduce_axis(split_k, "ks")
        O = compute((N, K, P, Q), lambda n, k, p, q: lang.tensor.sum(Pt[ks, k, n * P * Q + p * Q + q], axis=ks),
                    "O", store_dtype=out)
    return Func([I, Wt], [O], name="conv2d")


def schedule_conv2d_default_cpu(sched: Schedule, target: CPUTarget, K: int, Q: int, taps: int, stride: int,
                                has_pad: bool, pack_w: bool = True) -> None:
    """The default NCHW schedule (``conv2d_cpu_default``); ``pack_w`` False: the weights come packed
    (``conv2d_func(weight_block=...)``)."""
    schedule_conv2d_tiles_cpu(sched, dict(conv2d_cpu_default(K, Q, taps, stride, target), pack_w=pack_w), has_pad)


def conv2d_cpu_default(K: int, Q: int, taps: int, stride: int, target: CPUTarget, itemsize: int = 4
                       ) -> dict[str, Any]:
    """The tiles and form of the default NCHW schedule (``schedule_conv2d_tiles_cpu``): vectors along
    the output columns where rows of whole vectors are read contiguously (stride 1, Q a multiple of
    the vector: 56- and 112-wide maps, 1.1–1.7× the channel vectors there), with 8 output channels a
    tile; else vectors over output channels (``conv2d_cpu_tiles``)."""
    lanes = target.vector_lanes(itemsize)
    # 1×1 filters are packed filter by filter (each a contiguous row of C): read k_tile at once, C
    # apart, they ran 0.64× torch against 0.93× (2048 → 512 channels at 7×7) and 0.93× against 1.08×
    # (1024 → 256 at 14×14); 3×3 filters packed in the packed order ran 0.96× against 0.80× (256
    # channels at 14×14; one thread, CPU time, on the 2-core EPYC)
    w_copy = "source" if taps == 1 else "cache"
    if stride == 1 and Q % lanes == 0:
        return {**CONV_FORM, "vectors": "columns", "lanes": lanes, "k_tile": 8, "q_tile": lanes, "w_copy": w_copy}
    t = conv2d_cpu_tiles(K, Q, taps, target, itemsize)
    return {**CONV_FORM, "vectors": "channels", "lanes": lanes, "k_tile": t["k_vecs"] * lanes, "q_tile": t["q_tile"],
            "w_copy": w_copy}


CONV_FORM: dict[str, Any] = {"p_tile": 1, "order": ("c", "r", "s"), "pack_w": True, "parallel": "ko",
                             "unroll_p": "unroll", "separate": True}
"""The values of ``schedule_conv2d_tiles_cpu``'s tiles that the defaults share."""


def conv2d_cpu_tiles(K: int, Q: int, taps: int, target: CPUTarget, itemsize: int = 4) -> dict[str, int]:
    """The register tile of the default NCHW convolution with channel vectors: ``k_vecs``
    vectors of output channels (two, or one when K fills only one) × ``q_tile`` output columns, as
    many columns as the vector registers left after the weights and a broadcast hold — one fewer for
    a filter with several ``taps`` (R × S): 3×3 on a 7×7 map ran 0.6× torch with 6 columns, 1.1×
    with 5 (spilled registers, presumably; the assembly was not read). The widest tile, although a
    row then ends in a narrower edge tile: on 7- and 14-wide maps 6 + 1 and 6 + 6 + 2 columns beat
    4 + 3 and 5 + 5 + 4 (0.83 against 0.65 and 0.77×, 0.80 against 0.61 and 0.76×)."""
    lanes = target.vector_lanes(itemsize)
    regs = 32 if target.vector_bits >= 512 else 16
    k_vecs = 2 if K > lanes else 1
    spare = 2 if taps == 1 else 3
    q_tile = max(1, min(Q, (regs - k_vecs - spare) // k_vecs))
    return {"lanes": lanes, "k_vecs": k_vecs, "q_tile": q_tile}


def schedule_conv2d_tiles_cpu(sched: Schedule, tiles: dict[str, Any], has_pad: bool) -> None:
    """An output tile of ``k_tile`` channels × ``p_tile`` rows × ``q_tile`` columns accumulated in
    registers over the channels and filter taps (in ``order``; another order than the algorithm's
    reassociates the sum), weights packed per channel block (``pack_w``; ``w_copy``: copied in the
    packed order, "cache", k_tile filters C·R·S apart read at once, or filter by filter, "source",
    as ``conv2d_cpu_default`` takes for 1×1 filters), the tile's rows
    ``unroll_p``, full tiles separated from the edges (``separate``), the ``parallel`` loop "ko"
    (channel blocks) or "po" (row blocks). ``vectors``:

    - "columns": the columns are the vector (contiguous along a row), the channels unrolled;
    - "channels": vectors over output channels (``k_tile`` a multiple of the vector), weights packed
      channel-innermost (one vector load serves a column's FMAs), each input element broadcast, the
      columns unrolled and the accumulators kept channel-innermost, written back to NCHW once per
      tile. Any output width vectorizes fully (7×7 maps included), where column vectors leave most
      lanes idle.

    A row tile of one row is no split: the default schedules tile channels × columns only."""
    t = {**CONV_FORM, **tiles}
    lanes, k_tile, p_tile, q_tile, order = (t[k] for k in ("lanes", "k_tile", "p_tile", "q_tile", "order"))
    rows = ("po", "pi") if p_tile > 1 else ("p",)
    st = sched["O"]
    if t["vectors"] == "channels":
        st.split("k", k_tile, "ko", "k1").split("k1", lanes, "kv", "kl")
        inner = ("qi", "kv", "kl")
    else:
        st.split("k", k_tile, "ko", "ki")
        inner = ("ki", "qi")
    if p_tile > 1:
        st.split("p", p_tile, "po", "pi")
    st.split("q", q_tile, "qo", "qi")
    if tuple(order) != ("c", "r", "s"):
        st.reassociate()
    st.reorder("n", "ko", rows[0], "qo", *order, *rows[1:], *inner)
    if t["pack_w"]:
        st.cache("Wt", "ko", layout=lambda kk, cc, rr, ss: (cc, rr, ss, kk), copy_order=t.get("w_copy", "cache"))
    channels = t["vectors"] == "channels"
    st.cache_write("qo", layout=(lambda n, k, p, q: (n, p, q, k)) if channels else None)
    if t["separate"]:
        st.separate("qo")
    if channels:
        st.unroll("qi").unroll("kv").vectorize("kl")
    else:
        st.unroll("ki").vectorize("qi")
    if p_tile > 1:
        st.tag("pi", t["unroll_p"])
    st.parallel(t["parallel"] if p_tile > 1 or t["parallel"] != "po" else "p")
    if has_pad:
        sched["Ipad"].parallel("cc")


def schedule_conv2d_cpu(sched: Schedule, target: CPUTarget, K: int, Q: int, has_pad: bool,
                        k_tile: int = 8, q_tile: int | None = None, pack_w: bool = True) -> None:
    """Register tile of k_tile output channels × one vector of output columns (or ``q_tile``
    columns), weights packed per channel block (unless they come packed: ``pack_w`` False), the
    channel-block loop in parallel."""
    lanes = target.vector_lanes(4)
    schedule_conv2d_tiles_cpu(sched, {"vectors": "columns", "lanes": lanes, "k_tile": k_tile,
                                      "q_tile": q_tile or lanes, "pack_w": pack_w}, has_pad)


def conv2d_reference(i: np.ndarray, w: np.ndarray, stride: int, padding: int, dilation: int) -> np.ndarray:
    """Direct convolution with NumPy (NCHW × KCRS) in ``reference_type`` (float64 for floats)."""
    n, c, h, wd = i.shape
    k, _, r, s = w.shape
    p, q = conv_out(h, r, stride, padding, dilation), conv_out(wd, s, stride, padding, dilation)
    wide = reference_type(i.dtype)
    x = np.pad(i.astype(wide), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    out = np.zeros((n, k, p, q), wide)
    w64 = w.astype(wide)
    for rr in range(r):
        for ss in range(s):
            patch = x[:, :, rr * dilation: rr * dilation + stride * (p - 1) + 1: stride,
                      ss * dilation: ss * dilation + stride * (q - 1) + 1: stride]
            out += np.einsum("nchw,kc->nkhw", patch, w64[:, :, rr, ss])
    return out


def conv2d_nhwc(N: int, H: int, W: int, C: int, K: int, R: int, S: int, stride: int = 1, padding: int = 0,
                dtype: str = "float32") -> Op:
    """O[n, p, q, k] = sum_{r, s, c} I[n, p*st + r - pad, q*st + s - pad, c] * Wt[r, s, c, k] (NHWC/RSCK),
    summed in and returned as ``dtypes.accumulator(dtype)``."""
    P, Q = conv_out(H, R, stride, padding, 1), conv_out(W, S, stride, padding, 1)
    I = placeholder((N, H, W, C), dtype, "I")
    Wt = placeholder((R, S, C, K), dtype, "Wt")
    r, s, c = reduce_axis(R, "r"), reduce_axis(S, "s"), reduce_axis(C, "c")

    def body(n, p, q, k):  # noqa: ANN001, ANN202 - iterators
        h = p * stride + r - padding
        w = q * stride + s - padding
        inside = (h >= 0) & (h < H) & (w >= 0) & (w < W)
        return lang.tensor.sum(product(select(inside, I[n, h, w, c], 0), Wt[r, s, c, k], dtype), axis=[r, s, c])
    O = compute((N, P, Q, K), body, "O")
    func = Func([I, Wt], [O], name="conv2d_nhwc")

    def reference(i: np.ndarray, w: np.ndarray) -> np.ndarray:
        out = conv2d_reference(i.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), stride, padding, 1)
        return out.transpose(0, 2, 3, 1)

    def cpu(sched: Schedule, target: CPUTarget) -> None:
        lanes = target.vector_lanes(4)
        st = sched["O"]
        st.split("k", lanes, "ko", "kl").reorder("n", "p", "q", "ko", "r", "s", "c", "kl")
        st.cache_write("ko").vectorize("kl").parallel("p")

    op = Op("conv2d_nhwc", {"N": N, "H": H, "W": W, "C": C, "K": K, "R": R, "S": S, "stride": stride,
                            "padding": padding}, func,
            lambda rng: [random_array(rng, (N, H, W, C), dtype), random_array(rng, (R, S, C, K), dtype)],
            reference, 2.0 * N * K * P * Q * C * R * S,
            conv_bytes(dtype, O, N * C * H * W + K * C * R * S, N * K * P * Q), {"cpu": cpu},
            tolerance=tolerance(O.dtype, C * R * S, dtype))
    base = torch_conv2d(stride, padding, 1, "NHWC")
    if base is not None:
        op.baseline, op.baseline_name = base
    _add_cuda(op, "conv2d_nhwc", (N, H, W, C, K, R, S, stride, padding))
    return op
