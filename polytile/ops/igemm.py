"""Convolutions as implicit GEMMs (for tensor cores): NHWC / NDHWC inputs, RSCK / TRSCK weights.

The algorithm is written the way the GPU computes it: ``col[m, r, s, c]`` gathers the input pixel
that output pixel ``m`` (n, p, q flattened) sees through filter tap (r, s) — zero in the padding —
and the output is the GEMM ``O[m, k] = sum_{r, s, c} col[m, r, s, c] · Wt[r, s, c, k]``, the NHWC
output's memory viewed as an (N·P·Q) × K matrix. ``col`` is never stored: the schedule caches it
in shared memory and then inlines it into the cache's copies (ALCOP's order), so each copy reads
the input directly, as a zero-filling asynchronous copy.
"""

from __future__ import annotations

import math

import numpy as np

from .. import lang
from ..dtypes import tolerance
from ..errors import PolytileError
from ..intrinsics import MMA_M16N8K16
from ..lang.expr import select
from ..lang.func import Func
from ..lang.tensor import compute, placeholder, reduce_axis
from ..schedule.state import Schedule
from ..target import CPUTarget
from .base import Op, output_dtype, random_array, reference_type
from .conv import conv_bytes, conv_out
from .matmul import _add_cuda, product

MMA_K = MMA_M16N8K16.shape[2]  # the K extent of one tensor-core instruction


def _cpu(sched: Schedule, target: CPUTarget) -> None:
    """On a CPU the gather is inlined into the GEMM (a direct convolution over pixels × channels)."""
    sched["col"].compute_inline()
    st = sched["O"]
    st.split("m", 16, "mo", "mi").reorder("mo", "mi", "k").parallel("mo")


def conv2d_igemm(N: int, H: int, W: int, C: int, K: int, R: int, S: int, stride: int = 1, padding: int = 0,
                 dtype: str = "float16", out_dtype: str | None = None) -> Op:
    """2-D convolution, NHWC input × RSCK weights, as an implicit GEMM; the result, summed in
    ``dtypes.accumulator(dtype)`` (float32 for 16-bit floats) and stored as ``out_dtype`` (by default
    that type; see ``matmul``), has shape (N·P·Q, K): the NHWC output."""
    P, Q = conv_out(H, R, stride, padding, 1), conv_out(W, S, stride, padding, 1)
    M = N * P * Q
    I = placeholder((N, H, W, C), dtype, "I")
    Wt = placeholder((R, S, C, K), dtype, "Wt")
    col = compute((M, R, S, C), _gather(H, W, P, Q, stride, padding, I), "col")
    r, s, c = reduce_axis(R, "r"), reduce_axis(S, "s"), reduce_axis(C, "c")
    O = compute((M, K), lambda m, k: lang.tensor.sum(product(col[m, r, s, c], Wt[r, s, c, k], dtype), axis=[r, s, c]),
                "O", store_dtype=output_dtype("conv2d_igemm", dtype, out_dtype))
    func = Func([I, Wt], [O], name="conv2d_igemm")

    def reference(i: np.ndarray, w: np.ndarray) -> np.ndarray:
        wide = reference_type(i.dtype)
        x = np.pad(i.astype(wide), ((0, 0), (padding, padding), (padding, padding), (0, 0)))
        out = np.zeros((N, P, Q, K), wide)
        for rr in range(R):
            for ss in range(S):
                patch = x[:, rr: rr + stride * (P - 1) + 1: stride, ss: ss + stride * (Q - 1) + 1: stride, :]
                out += patch @ w[rr, ss].astype(wide)
        return out.reshape(M, K)

    op = Op("conv2d_igemm", {"N": N, "H": H, "W": W, "C": C, "K": K, "R": R, "S": S, "stride": stride,
                             "padding": padding}, func,
            lambda rng: [random_array(rng, (N, H, W, C), dtype), random_array(rng, (R, S, C, K), dtype)],
            reference, 2.0 * M * K * C * R * S, conv_bytes(dtype, O, N * H * W * C + R * S * C * K, M * K),
            {"cpu": _cpu}, tolerance=tolerance(O.dtype, C * R * S, dtype))
    if O.narrowed:
        op.shape["out_dtype"] = O.dtype.name  # type: ignore[assignment]
    _add_cuda(op, "conv2d_igemm", (N, H, W, C, K, R, S, stride, padding))
    return op


def conv2d_igemm_split_func(N: int, H: int, W: int, C: int, K: int, R: int, S: int, stride: int = 1,
                            padding: int = 0, dtype: str = "float16", out_dtype: str | None = None,
                            rows: bool = False, channel_chunks: int = 1, channel_chunk: int | None = None) -> Func:
    """``conv2d_igemm``'s algorithm with its reduction split (split-K): partial products
    ``P[sp, m, k]`` over chunk ``sp`` of the taps and channels — one filter row each (``rows``) and/or
    ``channel_chunks`` ranges of ``channel_chunk`` channels (by default C / channel_chunks), the last
    one ending at C (shorter where the chunks overrun C: a kernel of whole K tiles takes chunks of
    whole tiles, ``conv_choice.channel_chunk``) — then ``O[m, k] = sum_sp P[sp, m, k]``. Same inputs
    and output as ``conv2d_igemm``; the partial sums stay in the summation type."""
    Cs = channel_chunk or C // channel_chunks
    if channel_chunks < 1 or (channel_chunk is None and C % channel_chunks) or \
            not (channel_chunks - 1) * Cs < C <= channel_chunks * Cs:
        raise PolytileError(f"conv2d_igemm: channel_chunks={channel_chunks} "
                            + (f"of {channel_chunk} channels must cover" if channel_chunk else "must divide")
                            + f" the {C} input channels" + (", none empty" if channel_chunk else ""))
    P, Q = conv_out(H, R, stride, padding, 1), conv_out(W, S, stride, padding, 1)
    M = N * P * Q
    chunks = (R if rows else 1) * channel_chunks
    I = placeholder((N, H, W, C), dtype, "I")
    Wt = placeholder((R, S, C, K), dtype, "Wt")
    col = compute((M, R, S, C), _gather(H, W, P, Q, stride, padding, I), "col")
    s, c = reduce_axis(S, "s"), reduce_axis(Cs, "c")
    r = None if rows else reduce_axis(R, "r")

    def partial(sp, m, k):  # noqa: ANN001, ANN202 - iterators
        rr = sp // channel_chunks if rows else r
        # one chunk: the channels' index as unsplit (the tensor cores' whole K tiles end with col's)
        cc = sp % channel_chunks * Cs + c if channel_chunks > 1 else c
        where = cc < C if channel_chunks * Cs > C else None  # the last chunk ends at C
        return lang.tensor.sum(product(col[m, rr, s, cc], Wt[rr, s, cc, k], dtype), axis=[s, c] if rows else [r, s, c],
                               where=where)

    return Func([I, Wt], [_chunks_summed(chunks, M, K, partial, dtype, out_dtype)], name="conv2d_igemm")


def _chunks_summed(chunks: int, M: int, K: int, partial: object, dtype: str, out_dtype: str | None) -> object:
    """A split implicit GEMM's output ``O[m, k] = sum_sp P[sp, m, k]`` over the partial products
    ``P[sp, m, k] = partial(sp, m, k)`` of its ``chunks`` chunks."""
    Pt = compute((chunks, M, K), partial, "P")  # type: ignore[arg-type]
    sp = reduce_axis(chunks, "ks")
    return compute((M, K), lambda i, j: lang.tensor.sum(Pt[sp, i, j], axis=sp), "O",
                   store_dtype=output_dtype("conv2d_igemm", dtype, out_dtype))


def _gather(H: int, W: int, P: int, Q: int, stride: int, padding: int, I: object):  # noqa: ANN202
    """``col[m, r, s, c]``: the input element output pixel m (n, p, q flattened) meets through tap (r, s)."""
    def gather(m, r, s, c):  # noqa: ANN001, ANN202 - iterators
        n, p, q = m // (P * Q), (m // Q) % P, m % Q
        h, w = p * stride + r - padding, q * stride + s - padding
        return select((h >= 0) & (h < H) & (w >= 0) & (w < W), I[n, h, w, c], 0)  # type: ignore[index]
    return gather


def padded_channels(C: int, S: int) -> tuple[int, int]:
    """The channels ``cp`` an input is padded to — for fewer than the tensor cores' K step (16) a power
    of two, at least 4 (8-byte pieces), else the next multiple of 16 — and the taps ``Sp`` ≥ S of a
    filter row read as one run of Sp·cp elements, a multiple of the K step; see
    ``conv2d_igemm_rows_func``."""
    cp = max(4, 1 << (C - 1).bit_length()) if C <= MMA_K else -(-C // MMA_K) * MMA_K
    return cp, -(-S * cp // MMA_K) * MMA_K // cp


def pads_channels(C: int, itemsize: int) -> bool:
    """Whether the tensor cores' implicit GEMM reads a channel-padded copy of its input
    (``conv2d_igemm_rows_func``): fewer channels than a K step (16), or a pixel's channels not whole
    16-byte vectors, which every gathered copy would otherwise read element by element (random
    shapes, seed 97052, on an H200: 81 channels → 12 filters, 5×5 stride 2 at batch 32 in 303 µs,
    cuDNN 32 µs)."""
    return C < MMA_K or (C * itemsize) % 16 != 0


def conv2d_igemm_rows_func(N: int, H: int, W: int, C: int, K: int, R: int, S: int, stride: int = 1,
                           padding: int = 0, dtype: str = "float16", out_dtype: str | None = None, rows: bool = False,
                           run_chunks: int = 1, run_chunk: int | None = None, aligned_filter: bool = True) -> Func:
    """``conv2d_igemm``'s algorithm for inputs of few channels (an image's 3 colors), in the form the
    tensor cores take: the input copied once into ``X[n, h, w·cp + c]`` — zero padding around the
    image, channels padded to ``cp`` (``padded_channels``), rows 16-byte aligned — so that a filter
    row at one output pixel reads one contiguous run of Sp·cp elements ``X[n, p·st + r, q·st·cp + u]``
    (the taps and channels of the row jointly: the reduction is R × Sp·cp, whole tensor-core K steps,
    vector copies without bounds tests); the filter likewise as ``Wf[r, u, k]`` (zeros for the padded
    channels and taps, and with ``aligned_filter`` for the filters past K in rows of 16-byte
    multiples: an odd number of 16-bit filters would allow no asynchronous copy of its tiles,
    ``gpu_schedules.aligned_filter``). Same inputs and output as ``conv2d_igemm``."""
    P, Q = conv_out(H, R, stride, padding, 1), conv_out(W, S, stride, padding, 1)
    cp, Sp = padded_channels(C, S)
    Hp = H + 2 * padding
    Wp = max(W + 2 * padding, (Q - 1) * stride + Sp)
    Wp += -Wp % (8 // math.gcd(8, cp))  # rows of a multiple of 16 bytes (of 16-bit elements)
    I = placeholder((N, H, W, C), dtype, "I")
    Wt = placeholder((R, S, C, K), dtype, "Wt")

    def padded(n, h, v):  # noqa: ANN001, ANN202 - iterators
        hh, w, c = h - padding, v // cp - padding, v % cp
        return select((hh >= 0) & (hh < H) & (w >= 0) & (w < W) & (c < C), I[n, hh, w, c], 0)

    X = compute((N, Hp, Wp * cp), padded, "X")
    Kp = -(-K * Wt.dtype.itemsize // 16) * 16 // Wt.dtype.itemsize if aligned_filter else K
    Wf = compute((R, Sp * cp, Kp), lambda r, u, k: select((u < S * cp) & (u % cp < C) & (k < K),
                                                         Wt[r, u // cp, u % cp, k], 0), "Wf")
    col = compute((N * P * Q, R, Sp * cp),
                  lambda m, r, u: X[m // (P * Q), (m // Q) % P * stride + r, m % Q * stride * cp + u], "col")
    run = Sp * cp
    if not rows and run_chunks == 1:
        r, u = reduce_axis(R, "r"), reduce_axis(run, "c")
        O = compute((N * P * Q, K), lambda m, k: lang.tensor.sum(product(col[m, r, u], Wf[r, u, k], dtype),
                                                                 axis=[r, u]),
                    "O", store_dtype=output_dtype("conv2d_igemm", dtype, out_dtype))
        return Func([I, Wt], [O], name="conv2d_igemm")
    length = run_chunk or -(-run // run_chunks)
    if run_chunks < 1 or not (run_chunks - 1) * length < run <= run_chunks * length:
        raise PolytileError(f"conv2d_igemm: run_chunks={run_chunks} of {length} must cover a filter row's run of "
                            f"{run} elements, none empty")
    u = reduce_axis(length, "c")
    r = None if rows else reduce_axis(R, "r")

    def partial(sp, m, k):  # noqa: ANN001, ANN202 - iterators
        rr = sp // run_chunks if rows else r
        uu = sp % run_chunks * length + u if run_chunks > 1 else u
        return lang.tensor.sum(product(col[m, rr, uu], Wf[rr, uu, k], dtype), axis=[u] if rows else [r, u],
                               where=uu < run if run_chunks * length > run else None)

    chunks = (R if rows else 1) * run_chunks
    return Func([I, Wt], [_chunks_summed(chunks, N * P * Q, K, partial, dtype, out_dtype)], name="conv2d_igemm")


def conv3d_igemm(N: int, D: int, H: int, W: int, C: int, K: int, T: int, R: int, S: int, stride: int = 1,
                 padding: int = 0, dtype: str = "float16", out_dtype: str | None = None) -> Op:
    """3-D convolution, NDHWC input × TRSCK weights, as an implicit GEMM; the result (summed in
    ``dtypes.accumulator(dtype)``, stored as ``out_dtype`` as in ``conv2d_igemm``) has shape
    (N·Z·P·Q, K): the NDHWC output."""
    Z = conv_out(D, T, stride, padding, 1)
    P, Q = conv_out(H, R, stride, padding, 1), conv_out(W, S, stride, padding, 1)
    M = N * Z * P * Q
    I = placeholder((N, D, H, W, C), dtype, "I")
    Wt = placeholder((T, R, S, C, K), dtype, "Wt")

    def gather(m, t, r, s, c):  # noqa: ANN001, ANN202 - iterators
        n, z, p, q = m // (Z * P * Q), (m // (P * Q)) % Z, (m // Q) % P, m % Q
        d, h, w = z * stride + t - padding, p * stride + r - padding, q * stride + s - padding
        inside = (d >= 0) & (d < D) & (h >= 0) & (h < H) & (w >= 0) & (w < W)
        return select(inside, I[n, d, h, w, c], 0)

    col = compute((M, T, R, S, C), gather, "col")
    t, r, s, c = reduce_axis(T, "t"), reduce_axis(R, "r"), reduce_axis(S, "s"), reduce_axis(C, "c")
    O = compute((M, K), lambda m, k: lang.tensor.sum(product(col[m, t, r, s, c], Wt[t, r, s, c, k], dtype),
                                                     axis=[t, r, s, c]), "O",
                store_dtype=output_dtype("conv3d_igemm", dtype, out_dtype))
    func = Func([I, Wt], [O], name="conv3d_igemm")

    def reference(i: np.ndarray, w: np.ndarray) -> np.ndarray:
        wide = reference_type(i.dtype)
        x = np.pad(i.astype(wide), ((0, 0), (padding, padding), (padding, padding), (padding, padding),
                                          (0, 0)))
        out = np.zeros((N, Z, P, Q, K), wide)
        for tt in range(T):
            for rr in range(R):
                for ss in range(S):
                    patch = x[:, tt: tt + stride * (Z - 1) + 1: stride, rr: rr + stride * (P - 1) + 1: stride,
                              ss: ss + stride * (Q - 1) + 1: stride, :]
                    out += patch @ w[tt, rr, ss].astype(wide)
        return out.reshape(M, K)

    op = Op("conv3d_igemm", {"N": N, "D": D, "H": H, "W": W, "C": C, "K": K, "T": T, "R": R, "S": S,
                             "stride": stride, "padding": padding}, func,
            lambda rng: [random_array(rng, (N, D, H, W, C), dtype), random_array(rng, (T, R, S, C, K), dtype)],
            reference, 2.0 * M * K * C * T * R * S, conv_bytes(dtype, O, N * D * H * W * C + T * R * S * C * K, M * K),
            {"cpu": _cpu}, tolerance=tolerance(O.dtype, C * T * R * S, dtype))
    if O.narrowed:
        op.shape["out_dtype"] = O.dtype.name  # type: ignore[assignment]
    _add_cuda(op, "conv3d_igemm", (N, D, H, W, C, K, T, R, S, stride, padding))
    return op

