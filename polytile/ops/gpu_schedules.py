"""Default CUDA schedules of the operators, by operator kind.

fp32 GEMM on CUDA cores: a 128×128 block tile with K chunks of 8 staged in shared memory (A
transposed so that each thread reads its rows as 16-byte vectors), 256 threads each computing an
8×8 register tile split in two 4-wide halves 64 apart (conflict-free shared reads, coalesced
stores), operands of each k step held in registers.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ScheduleError
from ..intrinsics import MMA_M16N8K16
from ..schedule.state import Schedule
from ..target import CUDATarget


def gemm_cuda(sched: Schedule, out: str, a: str, b: str, *, bm: int = 128, bn: int = 128, bk: int = 8,
              tm: int = 8, tn: int = 8, batch: str | None = None, b_transposed: bool = False,
              stages: int = 3) -> None:
    """Schedule ``out[i, j] = sum_k a[i, k] * b[k, j]`` (or ``b[j, k]``) for CUDA cores; the shared
    tiles are pipelined over ``stages`` iterations of the K loop (asynchronous copies)."""
    hm, hn = tm // 2, tn // 2
    st = sched[out]
    st.split("i", bm, "bi", "i1").split("j", bn, "bj", "j1")
    st.split("i1", bm // 2, "ih", "i2").split("i2", hm, "ty", "il")
    st.split("j1", bn // 2, "jh", "j2").split("j2", hn, "tx", "jl")
    st.split("k", bk, "ko", "ki")
    lead = [batch] if batch else []
    st.reorder(*lead, "bi", "bj", "ty", "tx", "ko", "ki", "ih", "jh", "il", "jl")
    if batch:
        st.bind(batch, "blockIdx.z")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("ty", "threadIdx.y").bind("tx", "threadIdx.x")
    st.cache(a, "ko", layout=lambda *e: (*e[:-2], e[-1], e[-2]), loc="shared", name=f"{a}_shared")
    if b_transposed:
        st.cache(b, "ko", layout=lambda *e: (*e[:-2], e[-1], e[-2]), loc="shared", name=f"{b}_shared")
    else:
        st.cache_identity(b, "ko", loc="shared", name=f"{b}_shared")
    # registers: the 8 rows and 8 columns a thread uses at one k, packed as (half, lane)
    hb, hn2 = bm // 2, bn // 2
    st.cache_identity(a, "ki", loc="local", layout=lambda *e: (*e[:-2], e[-2] // hb, e[-2] % hb, e[-1]))
    if b_transposed:
        st.cache_identity(b, "ki", loc="local", layout=lambda *e: (*e[:-2], e[-2] // hn2, e[-2] % hn2, e[-1]))
    else:
        st.cache_identity(b, "ki", loc="local", layout=lambda *e: (*e[:-2], e[-2], e[-1] // hn2, e[-1] % hn2))
    st.cache_write("tx", loc="local", layout=lambda *e: (*e[:-2], e[-2] // hb, e[-2] % hb,
                                                        e[-1] // hn2, e[-1] % hn2))
    st.unroll("ki").unroll("ih").unroll("jh").unroll("il").unroll("jl")
    if stages > 1:
        st.pipeline(f"{a}_shared", stages).pipeline(f"{b}_shared", stages)


def gemm_tensorcore(sched: Schedule, out: str, a: str, b: str, *, bm: int = 128, bn: int = 128, bk: int = 32,
                    wm: int = 64, wn: int = 64, stages: int = 3, reg_stages: int = 1,
                    batch: str | None = None) -> None:
    """Schedule ``out[i, j] = sum_k a[i, k] * b[k, j]`` (16-bit operands, float32 result) on tensor
    cores: a ``bm``×``bn`` block tile, (bm/wm)×(bn/wn) warps each owning a ``wm``×``wn`` tile of
    ``mma.m16n8k16`` accumulators in registers, operand tiles of ``bk`` columns in shared memory
    (rows padded by 8 elements: conflict-free ``ldmatrix``), pipelined over ``stages`` K steps; with
    ``reg_stages=2`` the operand fragments are double-buffered across the 16-wide K steps of a tile
    (ALCOP's register level)."""
    for what, v, m in (("bm", bm, wm), ("bn", bn, wn)):
        if v % m:
            raise ScheduleError(f"gemm_tensorcore: {what}={v} must be a multiple of the warp tile ({m})")
    if wm % 16 or wn % 8 or bk % 16:
        raise ScheduleError(f"gemm_tensorcore: warp tiles are multiples of 16×8 and bk of 16 (got {wm}×{wn}, "
                            f"bk={bk})")
    st = sched[out]
    st.split("i", bm, "bi", "i1").split("j", bn, "bj", "j1")
    st.split("i1", wm, "wi", "i2").split("j1", wn, "wj", "j2")
    st.split("i2", 16, "mi", "i3").split("j2", 8, "nj", "j3")
    st.split("k", bk, "ko", "k1").split("k1", 16, "kk", "k3")
    lead = [batch] if batch else []
    st.reorder(*lead, "bi", "bj", "wi", "wj", "ko", "kk", "mi", "nj", "i3", "j3", "k3")
    if batch:
        st.bind(batch, "blockIdx.z")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("wi", "threadIdx.z").bind("wj", "threadIdx.y")
    st.cache(a, "ko", loc="shared", pad=(0,) * (1 + bool(batch)) + (8,), name=f"{a}_shared")
    st.cache(b, "ko", loc="shared", pad=(0,) * (1 + bool(batch)) + (8,), name=f"{b}_shared")
    st.cache_write("wj", loc="fragment")
    st.tensorize("i3", "mma_m16n8k16")
    if stages > 1:
        st.pipeline(f"{a}_shared", stages).pipeline(f"{b}_shared", stages)
    if reg_stages > 1 and bk > 16:
        st.pipeline(f"{a}_shared_frag", reg_stages).pipeline(f"{b}_shared_frag", reg_stages)


def gemm_wgmma(sched: Schedule, out: str, a: str, b: str, *, bm: int = 128, bn: int = 256, bk: int = 64,
               stages: int = 3, inflight: int = 0, batch: str | None = None) -> None:
    """Schedule ``out[i, j] = sum_k a[i, k] * b[k, j]`` (16-bit operands, float32 result) on Hopper's
    warpgroup MMA (sm_90a): a ``bm``×``bn`` block tile computed by bm/64 warpgroups, each issuing
    ``wgmma.m64n{bn}k16`` on operand tiles of ``bk`` columns that the instruction reads from shared
    memory (core-matrix layouts), pipelined over ``stages`` K steps with asynchronous copies. Each
    warp owns 16 rows of the block tile (bm/16 warps along threadIdx.z); the accumulator stays in
    registers (bn/2 per thread); ``inflight`` MMA groups of earlier K tiles may run while the next
    is issued (the copies then run stages − 1 − inflight tiles ahead)."""
    if bm % 64 or bn % 8 or not 8 <= bn <= 256 or bk % 16:
        raise ScheduleError(f"gemm_wgmma: block tiles are multiples of 64 rows, 8..256 columns (a multiple of 8) "
                            f"and bk a multiple of 16 (got {bm}×{bn}, bk={bk})")
    st = sched[out]
    st.split("i", bm, "bi", "i1").split("j", bn, "bj", "j1")
    st.split("i1", 16, "wi", "i3").split("j1", 8, "nj", "j3")
    st.split("k", bk, "ko", "k1").split("k1", 16, "kk", "k3")
    lead = [batch] if batch else []
    st.reorder(*lead, "bi", "bj", "wi", "ko", "kk", "nj", "i3", "j3", "k3")
    if batch:
        st.bind(batch, "blockIdx.z")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("wi", "threadIdx.z")
    st.cache(a, "ko", loc="shared", name=f"{a}_shared")
    st.cache(b, "ko", loc="shared", name=f"{b}_shared")
    st.cache_write("wi", loc="fragment")
    st.tensorize("i3", "wgmma_m64nNk16")
    if stages > 1:
        st.pipeline(f"{a}_shared", stages, inflight=inflight).pipeline(f"{b}_shared", stages, inflight=inflight)


def igemm_tensorcore(sched: Schedule, out: str, col: str, w: str, taps: list[str], *, bm: int = 128,
                     bn: int = 128, bk: int = 32, wm: int = 64, wn: int = 64, stages: int = 3,
                     reg_stages: int = 1) -> None:
    """Schedule an implicit-GEMM convolution ``out[m, k] = sum col[m, *taps, c] * w[*taps, c, k]`` on
    tensor cores like ``gemm_tensorcore``: the filter taps and the channel chunks form one sequential
    K loop (pipelined), the gathered input ``col`` is cached in shared memory as an [m][c] tile and
    then inlined into its copies (zero-filling asynchronous copies straight from the input)."""
    if bm % wm or bn % wn or wm % 16 or wn % 8 or bk % 16:
        raise ScheduleError(f"igemm_tensorcore: tiles {bm}×{bn}×{bk} with warp tiles {wm}×{wn} do not fit "
                            "mma.m16n8k16")
    st = sched[out]
    st.split("m", bm, "bi", "i1").split("k", bn, "bj", "j1")
    st.split("i1", wm, "wi", "i2").split("j1", wn, "wj", "j2")
    st.split("i2", 16, "mi", "i3").split("j2", 8, "nj", "j3")
    st.split("c", bk, "co", "c1").split("c1", 16, "kk", "k3")
    st.reorder("bi", "bj", "wi", "wj", *taps, "co", "kk", "mi", "nj", "i3", "j3", "k3")
    k_loop = taps[0]
    for t in [*taps[1:], "co"]:  # one sequential loop over the taps and channel chunks
        st.fuse(k_loop, t, f"{k_loop}_{t}")
        k_loop = f"{k_loop}_{t}"
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("wi", "threadIdx.z").bind("wj", "threadIdx.y")
    st.cache(col, k_loop, layout=lambda m, *tc: (m, tc[-1]), loc="shared", pad=(0, 8), name=f"{col}_shared")
    st.cache(w, k_loop, layout=lambda *tck: (tck[-2], tck[-1]), loc="shared", pad=(0, 8), name=f"{w}_shared")
    st.cache_write("wj", loc="fragment")
    st.tensorize("i3", "mma_m16n8k16")
    sched[col].compute_inline()  # after caching: the copies gather the input themselves
    if stages > 1:
        st.pipeline(f"{col}_shared", stages).pipeline(f"{w}_shared", stages)
    if reg_stages > 1 and bk > 16:
        st.pipeline(f"{col}_shared_frag", reg_stages).pipeline(f"{w}_shared_frag", reg_stages)


def igemm_wgmma(sched: Schedule, out: str, col: str, w: str, taps: list[str], *, bm: int = 128, bn: int = 128,
                bk: int = 64, stages: int = 4, inflight: int = 1) -> None:
    """Schedule an implicit-GEMM convolution like ``igemm_tensorcore`` on Hopper's warpgroup MMA:
    bm/64 warpgroups issue ``wgmma.m64n{bn}k16`` on the gathered [m][c] tile and the [c][k] filter
    tile (both in 128-byte swizzled rows: ``bk`` and ``bn`` multiples of 64), the taps and channel
    chunks one pipelined K loop with ``inflight`` MMA groups left running."""
    if bm % 64 or bn % 64 or bk % 64:
        raise ScheduleError(f"igemm_wgmma: bm, bn and bk must be multiples of 64 (got {bm}, {bn}, {bk})")
    st = sched[out]
    st.split("m", bm, "bi", "i1").split("k", bn, "bj", "j1")
    st.split("i1", 16, "wi", "i3").split("j1", 8, "nj", "j3")
    st.split("c", bk, "co", "c1").split("c1", 16, "kk", "k3")
    st.reorder("bi", "bj", "wi", *taps, "co", "kk", "nj", "i3", "j3", "k3")
    k_loop = taps[0]
    for t in [*taps[1:], "co"]:  # one sequential loop over the taps and channel chunks
        st.fuse(k_loop, t, f"{k_loop}_{t}")
        k_loop = f"{k_loop}_{t}"
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("wi", "threadIdx.z")
    st.cache(col, k_loop, layout=lambda m, *tc: (m, tc[-1]), loc="shared", name=f"{col}_shared")
    st.cache(w, k_loop, layout=lambda *tck: (tck[-2], tck[-1]), loc="shared", name=f"{w}_shared")
    st.cache_write("wi", loc="fragment")
    st.tensorize("i3", "wgmma_m64nNk16")
    sched[col].compute_inline()  # after caching: the copies gather the input themselves
    if stages > 1:
        st.pipeline(f"{col}_shared", stages, inflight=inflight).pipeline(f"{w}_shared", stages, inflight=inflight)


def _gemm_tiles(M: int, N: int, wide: bool = False) -> dict[str, int]:
    """Block and warp tiles for a tensor-core GEMM of M × N outputs: 128×256 (``wide``) or 128×128
    tiles when the matrix gives every multiprocessor several blocks, 64×64 otherwise."""
    if wide and (M // 128) * (N // 256) >= 256:
        return dict(bm=128, bn=256, wm=64, wn=64)
    if (M // 128) * (N // 128) >= 96:
        return dict(bm=128, bn=128, wm=64, wn=64)
    return dict(bm=64, bn=64, wm=32, wn=32)


def wgmma_igemm_config(M: int, K: int, *, sms: int) -> dict[str, int]:
    """Tiles of an implicit-GEMM convolution on warpgroup MMA (M output pixels, K output channels) for
    a GPU of ``sms`` multiprocessors: 128×128 block tiles (128×64 when K is not a multiple of 128 or
    the 128×128 tiles leave the GPU less than half full), 64-wide channel chunks, 4 stages, one MMA
    group in flight."""
    bn = 128 if K % 128 == 0 and 2 * (M // 128) * (K // 128) >= sms else 64
    return dict(bm=128, bn=bn, bk=64, stages=4, inflight=1)


def conv2d_igemm(sched: Schedule, target: CUDATarget, N: int, H: int, W: int, C: int, K: int, R: int, S: int,
                 stride: int, padding: int) -> None:
    P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
    if _wgmma(target) and min(C, K) >= 64:  # swizzled tiles need 64 channels and filters
        igemm_wgmma(sched, "O", "col", "Wt", ["r", "s"], **wgmma_igemm_config(N * P * Q, K, sms=target.sms))
        return
    igemm_tensorcore(sched, "O", "col", "Wt", ["r", "s"], bk=32, stages=3, reg_stages=2,
                     **_gemm_tiles(N * P * Q, K))


def conv3d_igemm(sched: Schedule, target: CUDATarget, N: int, D: int, H: int, W: int, C: int, K: int, T: int,
                 R: int, S: int, stride: int, padding: int) -> None:
    Z = (D + 2 * padding - T) // stride + 1
    P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
    if _wgmma(target) and min(C, K) >= 64:
        igemm_wgmma(sched, "O", "col", "Wt", ["t", "r", "s"], **wgmma_igemm_config(N * Z * P * Q, K, sms=target.sms))
        return
    igemm_tensorcore(sched, "O", "col", "Wt", ["t", "r", "s"], bk=32, stages=3, reg_stages=2,
                     **_gemm_tiles(N * Z * P * Q, K))


def _tensor_cores(sched: Schedule, a: str, target: CUDATarget) -> bool:
    """16-bit operands on a GPU with mma.sync (sm_80 and newer)."""
    return sched.func.tensor(a).dtype.name in MMA_M16N8K16.operand_dtypes and target.has("mma.sync")


def _tensorcore_gemm_config(M: int, N: int, K: int) -> dict[str, int]:
    """Tiles and pipelining of a tensor-core GEMM (the best of the configurations measured on an H100,
    benchmarks/pipelining.py): ``_gemm_tiles`` with 128×256 tiles allowed, 64-wide K tiles in 3
    shared-memory stages with double-buffered register fragments (ALCOP's multi-level pipeline)."""
    return dict(_gemm_tiles(M, N, wide=True), bk=64 if K >= 128 else 32, stages=3, reg_stages=2)


def wgmma_gemm_config(M: int, N: int, K: int = 0, *, sms: int) -> dict[str, int]:
    """Tiles and pipelining of a warpgroup-MMA GEMM with M × N outputs and a K-long reduction on a GPU
    of ``sms`` multiprocessors (measured on an H100, benchmarks/pipelining.py and `polytile tune`):
    128×256 block tiles when they fill the GPU at least once, 128×128 when those give a block to about
    three quarters of the multiprocessors (8/11: 96 of the H100's 132), 64×64 otherwise; 64-wide K
    tiles (128-byte swizzled rows) in 4 shared-memory stages with one MMA group left in flight — for
    the small tiles of a deep reduction (K ≥ 2048), 128-wide K tiles in 5 stages (tuned: BERT's
    512×768×3072 in 0.014 ms instead of 0.023)."""
    if (M // 128) * (N // 256) >= sms:
        tiles = dict(bm=128, bn=256)
    elif 11 * (M // 128) * (N // 128) >= 8 * sms:
        tiles = dict(bm=128, bn=128)
    else:
        tiles = dict(bm=64, bn=64)
        if K >= 2048:
            return dict(tiles, bk=128, stages=5, inflight=1)
    return dict(tiles, bk=64, stages=4, inflight=1)


def _wgmma(target: CUDATarget) -> bool:
    return target.has("wgmma")


def matmul(sched: Schedule, target: CUDATarget, M: int, N: int, K: int) -> None:
    if _tensor_cores(sched, "A", target) and _wgmma(target):
        gemm_wgmma(sched, "C", "A", "B", **wgmma_gemm_config(M, N, K, sms=target.sms))
    elif _tensor_cores(sched, "A", target):
        gemm_tensorcore(sched, "C", "A", "B", **_tensorcore_gemm_config(M, N, K))
    else:
        gemm_cuda(sched, "C", "A", "B")


def batch_matmul(sched: Schedule, target: CUDATarget, batch: int, M: int, N: int, K: int) -> None:
    if _tensor_cores(sched, "A", target) and _wgmma(target):
        cfg = wgmma_gemm_config(batch * M, N, K, sms=target.sms)
        if cfg["bm"] > M or cfg["bn"] > N:
            cfg.update(bm=64, bn=64)
        gemm_wgmma(sched, "C", "A", "B", batch="bb", **cfg)
    elif _tensor_cores(sched, "A", target):
        # small matrices (attention heads): one warp tile per block when the matrix is small
        cfg = _tensorcore_gemm_config(batch * M, N, K)
        if cfg["bm"] > M or cfg["bn"] > N:
            cfg.update(bm=64, bn=64, wm=32, wn=32)
        gemm_tensorcore(sched, "C", "A", "B", batch="bb", **cfg)
    else:
        gemm_cuda(sched, "C", "A", "B", batch="bb")


def dense(sched: Schedule, target: CUDATarget, M: int, N: int, K: int) -> None:
    gemm_cuda(sched, "XW", "X", "W", b_transposed=True)
    ep = sched["Y"]
    ep.fuse("i", "j").split("ij", 256, "bx", "tx").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")


def _row_threads(n: int) -> int:
    """Threads per row for row-wise kernels (measured on an H100: one warp up to 2K elements,
    four warps beyond)."""
    return 32 if n <= 2048 else 128


def _row_reduction(sched: Schedule, name: str, axis: str, nt: int) -> None:
    st = sched[name]
    st.reassociate().split(axis, nt, f"{axis}o", f"{axis}t").reorder("i", f"{axis}t", f"{axis}o")
    st.bind(f"{axis}t", "threadIdx.x")


def _row_elementwise(sched: Schedule, name: str, nt: int) -> None:
    st = sched[name]
    st.split("j", nt, "jo", "jt").reorder("i", "jt", "jo").bind("jt", "threadIdx.x")


def softmax(sched: Schedule, target: CUDATarget, M: int, N: int, threads: int | None = None) -> None:
    """One block per row: the row is read once into shared memory, then max and sum are reduced
    across the block's threads and the output written (exp recomputed rather than stored)."""
    nt = threads or _row_threads(N)
    sched["ex"].compute_inline()
    _row_reduction(sched, "mx", "j1", nt)
    sched["mx"].bind("i", "blockIdx.x")
    _row_reduction(sched, "sm", "j2", nt)
    sched["sm"].after(sched["mx"], "i")
    _row_elementwise(sched, "Y", nt)
    sched["Y"].after(sched["sm"], "i")
    sched["mx"].cache_identity("X", "i", loc="shared", also=["sm", "Y"])
    for stat in ("mx", "sm"):  # the row's statistics stay in shared memory, next to the row
        sched[stat].store_at("i").set_loc("shared")


def layernorm(sched: Schedule, target: CUDATarget, M: int, N: int, threads: int | None = None) -> None:
    """One block per row, the row read once into shared memory; both moments reduced across the
    block's threads, then the normalized row written."""
    nt = threads or _row_threads(N)
    _row_reduction(sched, "s1", "j1", nt)
    sched["s1"].bind("i", "blockIdx.x")
    _row_reduction(sched, "s2", "j2", nt)
    sched["s2"].after(sched["s1"], "j1o")  # both moments in one pass over the row
    _row_elementwise(sched, "Y", nt)
    sched["Y"].after(sched["s2"], "i")
    sched["s1"].cache_identity("X", "i", loc="shared", also=["s2", "Y"])
    for stat in ("s1", "s2"):
        sched[stat].store_at("i").set_loc("shared")


def segment_sum(sched: Schedule, target: CUDATarget, rows: int, nnz: int) -> None:
    """One warp per segment, partial sums combined across the warp."""
    st = sched["y"]
    st.reassociate().split("k", 32, "ko", "kt").reorder("i", "kt", "ko")
    st.bind("i", "blockIdx.x").bind("kt", "threadIdx.x")


def spmm(sched: Schedule, target: CUDATarget, rows: int, cols: int, n: int, nnz: int) -> None:
    """One block per row of the sparse matrix; threads along the dense columns (coalesced reads of B)."""
    st = sched["C"]
    st.split("j", 64, "jo", "jt").reorder("i", "jo", "jt", "k")
    st.bind("i", "blockIdx.y").bind("jo", "blockIdx.x").bind("jt", "threadIdx.x")


def conv2d(sched: Schedule, target: CUDATarget, N: int, C: int, H: int, W: int, K: int, R: int, S: int,
           stride: int, padding: int, dilation: int) -> None:
    """Direct convolution: 128 output pixels per block, each thread an 8-channel register tile, the
    block's weights staged in shared memory; the padded input is its own small kernel."""
    kt = 8 if K >= 8 else K
    st = sched["O"]
    st.split("k", kt, "ko", "ki").fuse("p", "q", "pq").split("pq", 128, "pqo", "pqt")
    st.reorder("n", "ko", "pqo", "pqt", "c", "r", "s", "ki")
    st.bind("ko", "blockIdx.y").bind("pqo", "blockIdx.x").bind("pqt", "threadIdx.x")
    if N > 1:
        st.bind("n", "blockIdx.z")
    st.cache("Wt", "pqo", layout=lambda kk, cc, rr, ss: (cc, rr, ss, kk), loc="shared")
    st.cache_write("pqt", loc="local")
    st.unroll("ki")
    if "Ipad" in sched.stage_names():
        pad = sched["Ipad"]
        pad.fuse("h", "w", "hw").split("hw", 256, "hwo", "hwt")
        pad.bind("cc", "blockIdx.y").bind("hwo", "blockIdx.x").bind("hwt", "threadIdx.x")
        if N > 1:
            pad.bind("n", "blockIdx.z")


SCHEDULES: dict[str, Callable[..., None]] = {
    "matmul": matmul, "batch_matmul": batch_matmul, "dense": dense, "softmax": softmax,
    "layernorm": layernorm, "segment_sum": segment_sum, "spmm": spmm, "conv2d": conv2d,
    "conv2d_igemm": conv2d_igemm, "conv3d_igemm": conv3d_igemm,
}
