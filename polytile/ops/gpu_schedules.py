"""Default CUDA schedules of the operators, by operator kind, chosen from the target's facts.

GEMMs (``gemm_choice``): at most ``GEMV_ROWS`` rows stream B through the CUDA cores (``gemv_cuda``;
opt-in, or in the tuning space: 2 to 16 rows of 16-bit operands on mma.sync, transposed, ``gemv_mma``:
B's columns as the instruction's 16 rows, A's rows as its 8 columns), but 16 rows of 16-bit operands
fill mma.sync's tile and run on it;
otherwise warpgroup MMA where the target has ``wgmma`` (``gemm_wgmma``; its tiles loaded by TMA
where the rows allow: ``tma_fits``), mma.sync where it has
``mma.sync`` (``gemm_tensorcore``) for 16-bit float operands, the CUDA cores for other types
(``gemm_cuda``: block tiles of 8×8 or 4×4 register tiles, K chunks of 8 in shared memory, A
transposed so that each thread reads its rows as 16-byte vectors). Among each kernel's block tiles,
and splits of K (split-K: partial products over chunks of K, then their sum), the analytical
model's wave quantization (``tune.analytical.gemm_seconds``: SMs, resident blocks from shared
memory and registers, DRAM bandwidth) picks the fastest for the shape. Tensor-core operands whose
rows are not 16-byte aligned are copied aligned first (``align_operands``).

Convolutions: NHWC implicit GEMMs on the tensor cores, their kernel, block tiles and the split of
their reduction over filter rows and channel chunks those the same model predicts fastest
(``conv_choice.igemm_choice``, which also counts each block's gathered input tile); fewer than 16 input
channels (an image's colors) over a channel-padded copy of the input on mma.sync (``igemm_rows``;
the CUDA cores, ``igemm_cuda``, without mma.sync); NCHW ``conv2d`` whose GEMM takes the CUDA cores
(float32) as one implicit GEMM on ``gemm_cuda`` with ``gemm_choice``'s tiles and split. Softmax and
layernorm take one block per row, its width in threads, the row in
shared memory where it fits; narrow rows several a block, each a part of a warp (``row_plan``)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..dtypes import DType, as_dtype, float16
from ..errors import ScheduleError
from ..intrinsics import MMA_M16N8K16, WGMMA_M64NNK16
from ..schedule.state import Schedule
from ..target import CUDATarget
from ..tune.analytical import (
    WARP_FLOPS,
    BlockPlan,
    GemmShape,
    Hardware,
    TileConfig,
    WgmmaConfig,
    block_occupancy,
    gemm_seconds,
    occupancy,
    predict,
    raster_group,
    split_seconds,
    tail_combine_seconds,
)
from .conv_choice import (
    MMA_K,
    IgemmChoice,
    channel_chunk,
    chunk_steps,
    igemm_choice,
    igemm_kernel,
    igemm_rows_choice,
    igemm_splits,
    no_deeper,
)
from .split_rules import MAX_SPLIT, SPLIT_MARGIN

# an implicit GEMM's filter whose rows are not a multiple of this many bytes is copied aligned first
# (``aligned_filter``): 2-byte aligned rows (an odd number of 16-bit filters) allow no asynchronous
# copy; 4- and 8-byte aligned ones are read in place in pieces of that width, as a GEMM's operands.
# Measured on an H200 (benchmarks/worst_shapes.py at 89b8efd, µs copied / in place / cuDNN): 1×102×102,
# 304 → 33, 3×3 52.2 / 494.4 / 30.9; → 17 55.7 / 111.0 / 32.4; → 65 43.0 / 800.9 / 68.1; 1×16×16,
# 64 → 33 11.0 / 112.0 / 19.5; 8×28×28, 128 → 75 16.5 / 28.1 / 24.9; 1×8×8, 264 → 461, 7×7/2 39.2 /
# 94.4 / 63.4; 16×8×8, 256 → 63, 5×5/2 18.3 / 35.7 / 30.6; the channel-padded Wf in rows of 16 bytes:
# 3 → 33 9.9 / 10.8 / 7.6, 14 → 161 1×1 77.9 / 80.4 / 28.3. 100 filters (8-byte rows): 44.5 in place in
# 8-byte pieces, 44.5 copied (granule 16)
FILTER_GRANULE = 4


def gemm_cuda(sched: Schedule, out: str, a: str, b: str, *, bm: int = 128, bn: int = 128, bk: int = 8,
              tm: int = 8, tn: int = 8, batch: str | None = None, b_transposed: bool = False,
              stages: int = 3) -> None:
    """Schedule ``out[i, j] = sum_k a[i, k] * b[k, j]`` (or ``b[j, k]``) for CUDA cores: each of the
    (bm/tm)×(bn/tn) threads of a block accumulates a ``tm``×``tn`` register tile (its rows and columns
    in two halves of the block tile, tm/2 and tn/2 apart: the threads of a warp read adjacent 16-byte
    vectors of the shared tiles), over K chunks of ``bk`` in shared memory (A transposed), pipelined
    over ``stages`` iterations of the K loop (asynchronous copies).

    Every tile is whole: the shared tiles hold zeros past the matrices' ends and the register tile
    is the thread's whole share, so the products run over constant loops without tests at any size
    (``lowering/passes/whole_tiles.py``); only the write-back tests the bounds."""
    if bm % 2 or bn % 2 or (bm // 2) % (tm // 2) or (bn // 2) % (tn // 2) or tm % 2 or tn % 2:
        raise ScheduleError(f"gemm_cuda: the register tile {tm}×{tn} (even sizes) must divide each half of the block "
                            f"tile {bm}×{bn}")
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
    lead_a = (1,) * (len(sched.func.tensor(a).shape) - 2)
    lead_b = (1,) * (len(sched.func.tensor(b).shape) - 2)
    transposed = lambda *e: (*e[:-2], e[-1], e[-2])  # noqa: E731
    # the transposed tiles' rows padded by 16 bytes: the copies write a column of 8 k values per 4
    # rows of A, which would otherwise fall in 4 banks (8-way conflicts)
    pad = (0,) * (len(lead_a) + 1) + (16 // sched.func.tensor(a).dtype.itemsize,)
    st.cache(a, "ko", layout=transposed, loc="shared", name=f"{a}_shared", whole=(*lead_a, bm, bk), pad=pad)
    if b_transposed:
        st.cache(b, "ko", layout=transposed, loc="shared", name=f"{b}_shared", whole=(*lead_b, bn, bk), pad=pad)
    else:
        st.cache(b, "ko", loc="shared", name=f"{b}_shared", whole=(*lead_b, bk, bn))
    # registers: the tm rows and tn columns a thread uses at one k, packed as (half, lane)
    hb, hn2 = bm // 2, bn // 2
    st.cache_identity(a, "ki", loc="local", layout=lambda *e: (*e[:-2], e[-2] // hb, e[-2] % hb, e[-1]))
    if b_transposed:
        st.cache_identity(b, "ki", loc="local", layout=lambda *e: (*e[:-2], e[-2] // hn2, e[-2] % hn2, e[-1]))
    else:
        st.cache_identity(b, "ki", loc="local", layout=lambda *e: (*e[:-2], e[-2], e[-1] // hn2, e[-1] % hn2))
    st.cache_write("tx", loc="local", layout=lambda *e: (*e[:-2], e[-2] // hb, e[-2] % hb, e[-1] // hn2, e[-1] % hn2),
                   whole=(1,) * len(sched.func.tensor(out).shape))
    st.unroll("jl").unroll("il").unroll("jh").unroll("ih").unroll("ki")  # inner first (unrolling.py)
    if stages > 1:
        st.pipeline(f"{a}_shared", stages).pipeline(f"{b}_shared", stages)


def gemv_cuda(sched: Schedule, out: str, a: str, b: str, *, bn: int = 256, vec: int = 2, bk: int = 32,
              stages: int = 4, batch: str | tuple[str, ...] | None = None, direct: bool = False,
              whole: bool = False) -> None:
    """Schedule ``out[i, j] = sum_k a[i, k] * b[k, j]`` for a few rows (M ≤ ``GEMV_ROWS``: decoding, a
    matrix–vector product): memory-bound on B, which is streamed once through shared memory in
    ``bk`` × ``bn`` tiles (16-byte asynchronous copies, ``stages`` deep); each of the bn/vec threads
    of a block keeps all M rows × ``vec`` adjacent columns in registers and reads A's tile (M × bk,
    in shared memory) as broadcasts. With ``batch`` (a batched product, or the chunks of a split
    reduction) the blocks also run along blockIdx.y, with two (the chunks of a batched product)
    along blockIdx.z and blockIdx.y.

    ``direct``: B goes straight from global memory to registers, each thread loading its ``bk`` rows ×
    ``vec`` columns of a K step at once (16-byte loads where ``vec`` 16-bit columns are 16 bytes and
    the rows aligned: ``combine_loads``), no shared tile and no barrier for B — the loads of many
    warps in flight hide the memory latency instead of a pipeline.

    ``whole``: the accumulators are a whole register tile and the products run over constant loops
    (``lowering/passes/whole_tiles.py``; B's tiles hold zeros past its rows and columns); the K tiles
    must not cross into the next chunk of a split reduction (chunks of whole K tiles, or the last one
    ending at K). Without it isl cuts a partial column tile exactly, into loops of variable bounds:
    16×3002×1536 bf16 spent 5,200 instructions a K step on 1,024 FFMA, 554 of them branches (0.33× torch
    on an H100); whole, 2,032 and 13."""
    if bn % vec or (bn // vec) % 32 and bn // vec > 32:
        raise ScheduleError(f"gemv_cuda: bn={bn} must be a multiple of vec={vec}, in whole warps (got "
                            f"{bn // vec} threads)")
    st = sched[out]
    st.split("j", bn, "bj", "j1").split("j1", vec, "tx", "jv")
    st.split("k", bk, "ko", "ki")
    lead = [batch] if isinstance(batch, str) else list(batch or ())
    st.reorder(*lead, "bj", "tx", "ko", "ki", "i", "jv")
    for loop, axis in zip(lead, ("blockIdx.z", "blockIdx.y")[2 - len(lead):], strict=True):
        st.bind(loop, axis)
    st.bind("bj", "blockIdx.x").bind("tx", "threadIdx.x")
    # whole tiles (zeros past the end): constant copy loops of 16-byte vectors at the matrix's edges
    rows = int(sched.func.tensor(a).shape[-2].value)  # type: ignore[attr-defined]
    lead_a = (1,) * (len(sched.func.tensor(a).shape) - 2)
    lead_b = (1,) * (len(sched.func.tensor(b).shape) - 2)
    st.cache(a, "ko", loc="shared", name=f"{a}_shared", whole=(*lead_a, rows, bk))
    if direct:
        st.cache(b, "ko", loc="local", name=f"{b}_local", whole=(*lead_b, bk if whole else 1, vec))
    else:
        st.cache(b, "ko", loc="shared", name=f"{b}_shared", whole=(*lead_b, bk, bn))
        st.cache_identity(b, "ki", loc="local")
    st.cache_write("tx", loc="local", whole=(1,) * len(sched.func.tensor(out).shape) if whole else ())
    st.unroll("jv").unroll("i").unroll("ki")  # inner first (unrolling.py)
    if stages > 1:
        st.pipeline(f"{a}_shared", stages)
        if not direct:
            st.pipeline(f"{b}_shared", stages)


def gemv_mma(sched: Schedule, out: str, a: str, b: str, *, bn: int = 128, warps: int = 4, bk: int = 64,
             stages: int = 4, batch: str | tuple[str, ...] | None = None) -> None:
    """Schedule ``out[i, j] = sum_k a[i, k] * b[k, j]`` for a few rows (M ≤ ``GEMV_ROWS``, 16-bit operands)
    on mma.sync, transposed (C^T = B^T A^T): the instruction's 16 rows run over 16 columns of B (the
    weight, streamed once) and its 8 columns over the rows of A (8 tokens in one tile, 16 in two), so
    that a 16×8×16 product costs one instruction where the CUDA cores spend 64 warp FMAs and their
    operands' loads and conversions (the GEMV's issue slots). B goes through shared memory in ``bk`` ×
    ``bn`` tiles (16-byte asynchronous copies, ``stages`` deep, rows padded by 8 elements: conflict-free
    transposed ``ldmatrix``); ``warps`` warps each own bn/warps columns. Rows of A past M and columns
    past N are zeros in the whole tiles; the write-back tests the bounds. With ``batch`` (the chunks of
    a split reduction, or a batched product) the blocks also run along blockIdx.y (and z)."""
    wn = bn // warps if warps else 0
    if not warps or bn % warps or wn % 16 or bk % 16:
        raise ScheduleError(f"gemv_mma: bn={bn} must be {warps} warps of a multiple of 16 columns each, and bk={bk} "
                            "a multiple of 16")
    st = sched[out]
    st.split("j", bn, "bj", "j1").split("j1", wn, "wj", "j2").split("j2", 16, "mj", "j3")
    st.split("i", 8, "ni", "i3")
    st.split("k", bk, "ko", "k1").split("k1", 16, "kk", "k3")
    lead = [batch] if isinstance(batch, str) else list(batch or ())
    st.reorder(*lead, "bj", "wj", "ko", "kk", "mj", "ni", "j3", "i3", "k3")
    for loop, axis in zip(lead, ("blockIdx.z", "blockIdx.y")[2 - len(lead):], strict=True):
        st.bind(loop, axis)
    st.bind("bj", "blockIdx.x").bind("wj", "threadIdx.y")
    _mma_sync_operands(sched, st, a, b, "j3", stages)


def _mma_sync_operands(sched: Schedule, st: object, a: str, b: str, tile_axis: str, stages: int) -> None:
    """The operands of an ``mma.m16n8k16`` product staged per K tile ``ko``: ``a`` and ``b`` in shared memory
    (rows padded by 8 elements: conflict-free ``ldmatrix``) pipelined over ``stages``, the accumulators of
    each warp (``wj``) in fragments, the instruction at ``tile_axis``."""
    for t in (a, b):
        st.cache(t, "ko", loc="shared", pad=(0,) * (len(sched.func.tensor(t).shape) - 1) + (8,), name=f"{t}_shared")
    st.cache_write("wj", loc="fragment")
    st.tensorize(tile_axis, "mma_m16n8k16")
    if stages > 1:
        st.pipeline(f"{a}_shared", stages).pipeline(f"{b}_shared", stages)


def sum_partials(sched: Schedule, out: str, threads: int = 256, batch: str | None = None) -> None:
    """Schedule the second half of a split reduction, ``out[i, j] = sum_s P[s, i, j]``: one thread per
    output element (coalesced reads of each chunk's partial products), a batch along blockIdx.y."""
    st = sched[out]
    st.fuse("i", "j", "ij").split("ij", threads, "bx", "tx")
    st.bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    if batch:
        st.bind(batch, "blockIdx.y")


# how a tensor-core GEMM's blocks write their results (gemm_wgmma's store): "staged overlaid" stages
# them in the storage of the operand tiles (``Stage.staged_store``'s overlay)
STORES = ("threads", "tma", "staged", "staged overlaid")


def _store(st: object, store: str) -> None:
    if store == "tma":
        st.tma_store()  # type: ignore[attr-defined]
    elif store.startswith("staged"):
        st.staged_store(overlay=store == "staged overlaid")  # type: ignore[attr-defined]


def gemm_tensorcore(sched: Schedule, out: str, a: str, b: str, *, bm: int = 128, bn: int = 128, bk: int = 32,
                    wm: int = 64, wn: int = 64, stages: int = 3, reg_stages: int = 1,
                    batch: str | None = None, store: str = "threads") -> None:
    """Schedule ``out[i, j] = sum_k a[i, k] * b[k, j]`` (16-bit operands, float32 result) on tensor
    cores: a ``bm``×``bn`` block tile, (bm/wm)×(bn/wn) warps each owning a ``wm``×``wn`` tile of
    ``mma.m16n8k16`` accumulators in registers, operand tiles of ``bk`` columns in shared memory
    (rows padded by 8 elements: conflict-free ``ldmatrix``), pipelined over ``stages`` K steps; with
    ``reg_stages=2`` the operand fragments are double-buffered across the 16-wide K steps of a tile
    (ALCOP's register level). ``store``: "threads" (each thread its accumulators) or "staged" (the
    block's tile through shared memory, copied out row by row: ``gemm_wgmma``'s)."""
    if store not in ("threads", "staged", "staged overlaid"):
        raise ScheduleError(f"gemm_tensorcore: store must be 'threads', 'staged' or 'staged overlaid', got {store!r}")
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
    _store(st, store)
    _mma_sync_operands(sched, st, a, b, "i3", stages)
    if reg_stages > 1 and bk > 16:
        st.pipeline(f"{a}_shared_frag", reg_stages).pipeline(f"{b}_shared_frag", reg_stages)


def gemm_wgmma(sched: Schedule, out: str, a: str, b: str, *, bm: int = 128, bn: int = 256, bk: int = 64,
               stages: int = 3, inflight: int = 0, batch: str | None = None, producer: str = "threads",
               specialize: bool = False, raster: str = "rows", group: int = 1, persistent: int = 0,
               store: str = "threads") -> None:
    """Schedule ``out[i, j] = sum_k a[i, k] * b[k, j]`` (16-bit operands, float32 result) on Hopper's
    warpgroup MMA (sm_90a): a ``bm``×``bn`` block tile computed by bm/64 warpgroups, each issuing
    ``wgmma.m64n{bn}k16`` on operand tiles of ``bk`` columns that the instruction reads from shared
    memory (core-matrix layouts), pipelined over ``stages`` K steps with asynchronous copies. Each
    warp owns 16 rows of the block tile (bm/16 warps along threadIdx.z); the accumulator stays in
    registers (bn/2 per thread); ``inflight`` MMA groups of earlier K tiles may run while the next
    is issued (the copies then run stages − 1 − inflight tiles ahead). ``producer="tma"``: the
    operand tiles are loaded by TMA bulk tensor copies on mbarrier rings (``pipeline``; sm_90,
    128-byte swizzled tiles: bk and bn multiples of 64, rows of A and B multiples of 16 bytes), with
    ``specialize``: by a producer warpgroup of their own (warp specialization, ``setmaxnreg``).
    ``raster``: the order of the block tiles, "rows" (consecutive blocks along a row of tiles:
    blockIdx.x over the column tiles) or "columns" (blockIdx.x over the row tiles: a wave of blocks
    shares few column tiles of B, for products much wider than tall); ``group`` > 1: in groups of that
    many rows of tiles (``Stage.raster``: down a group's rows column by column, the next group after;
    ``gemm_choice`` sizes it to the L2: ``raster_group``). ``persistent`` (True or a count): that
    many blocks per multiprocessor of the target, each looping over the block tiles in that order
    (``Stage.persistent``; the TMA rings carry their phases across the tiles; not with
    ``specialize``). ``store="tma"``: the block's
    results are staged in shared memory and written by one TMA store, clipped at the matrix's end
    (``Stage.tma_store``; sm_90, rows of ``out`` whole 16 bytes, the staging tile beside the stages
    within a block's shared memory); "staged": staged in shared memory too and copied out by the
    threads, consecutive threads on consecutive elements of a row (``Stage.staged_store``: rows of
    any length, 16-bit results in rows only 2-byte aligned), "staged overlaid" in the operand tiles'
    shared memory; "threads": each thread stores its accumulators."""
    if store not in STORES:
        raise ScheduleError(f"gemm_wgmma: store must be one of {', '.join(map(repr, STORES))}, got {store!r}")
    if persistent and specialize:
        raise ScheduleError("gemm_wgmma: persistent=True with specialize=True is not supported (the producer "
                            "warpgroup does not loop over the tiles); use one of them")
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
    if raster not in ("rows", "columns"):
        raise ScheduleError(f"gemm_wgmma: raster must be 'rows' or 'columns', got {raster!r}")
    fast, slow = ("bj", "bi") if raster == "rows" else ("bi", "bj")
    st.bind(slow, "blockIdx.y").bind(fast, "blockIdx.x").bind("wi", "threadIdx.z")
    if group > 1:
        st.raster(group)
    if persistent:
        st.persistent(int(persistent))
    _store(st, store)
    # a second product of the same operands in one function (``tail_split``'s) names its tiles after itself
    shared = [_cache_name(sched, f"{t}_shared", out) for t in (a, b)]
    for t, name in zip((a, b), shared, strict=True):
        st.cache(t, "ko", loc="shared", name=name)
    st.cache_write("wi", loc="fragment")
    st.tensorize("i3", "wgmma_m64nNk16")
    if stages > 1:
        for name in shared:
            st.pipeline(name, stages, inflight=inflight, producer=producer, specialize=specialize)
    elif producer != "threads":
        raise ScheduleError(f"gemm_wgmma: producer={producer!r} fills pipelined tiles; it needs stages >= 2")


def _cache_name(sched: Schedule, name: str, out: str) -> str:
    """``name`` for a cache of ``out``'s schedule, or ``out``'s own name for it where another product of
    the same function has taken it (``tail_split_schedule``: two GEMMs reading A and B)."""
    return name if name not in {c.name for c in sched.caches} else f"{out}_{name}"


def igemm_tensorcore(sched: Schedule, out: str, col: str, w: str, taps: list[str], *, bm: int = 128,
                     bn: int = 128, bk: int = 32, wm: int = 64, wn: int = 64, stages: int = 3,
                     reg_stages: int = 1, batch: str | None = None, filter_granule: int | None = FILTER_GRANULE,
                     store: str = "threads") -> None:
    """Schedule an implicit-GEMM convolution ``out[m, k] = sum col[m, *taps, c] * w[*taps, c, k]`` on
    tensor cores like ``gemm_tensorcore``: the filter taps and the channel chunks form one sequential
    K loop (pipelined), the gathered input ``col`` is cached in shared memory as an [m][c] tile and
    then inlined into its copies (zero-filling asynchronous copies straight from the input); the
    filter as ``aligned_filter`` leaves it (``filter_granule``). With ``batch`` (the chunks of a split
    reduction, ``out[batch, m, k]``) the blocks also run along blockIdx.z. ``store``: "threads" or
    "staged" (``gemm_tensorcore``'s)."""
    if store not in ("threads", "staged", "staged overlaid"):
        raise ScheduleError(f"igemm_tensorcore: store must be 'threads', 'staged' or 'staged overlaid', got {store!r}")
    if bm % wm or bn % wn or wm % 16 or wn % 8 or bk % 16:
        raise ScheduleError(f"igemm_tensorcore: tiles {bm}×{bn}×{bk} with warp tiles {wm}×{wn} do not fit "
                            "mma.m16n8k16")
    aligned_filter(sched, out, w, filter_granule)
    st = sched[out]
    st.split("m", bm, "bi", "i1").split("k", bn, "bj", "j1")
    st.split("i1", wm, "wi", "i2").split("j1", wn, "wj", "j2")
    st.split("i2", 16, "mi", "i3").split("j2", 8, "nj", "j3")
    st.split("c", bk, "co", "c1").split("c1", 16, "kk", "k3")
    lead = [batch] if batch else []
    st.reorder(*lead, "bi", "bj", "wi", "wj", *taps, "co", "kk", "mi", "nj", "i3", "j3", "k3")
    k_loop = _k_loop(st, taps)
    if batch:
        st.bind(batch, "blockIdx.z")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("wi", "threadIdx.z").bind("wj", "threadIdx.y")
    _store(st, store)
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
                bk: int = 64, stages: int = 4, inflight: int = 1, batch: str | None = None,
                filter_granule: int | None = FILTER_GRANULE, store: str = "threads") -> None:
    """Schedule an implicit-GEMM convolution like ``igemm_tensorcore`` on Hopper's warpgroup MMA:
    bm/64 warpgroups issue ``wgmma.m64n{bn}k16`` on the gathered [m][c] tile and the [c][k] filter
    tile (both in 128-byte swizzled rows: ``bk`` and ``bn`` multiples of 64), the taps and channel
    chunks one pipelined K loop with ``inflight`` MMA groups left running; ``batch``,
    ``filter_granule`` and ``store`` as in ``igemm_tensorcore``."""
    if store not in ("threads", "staged", "staged overlaid"):
        raise ScheduleError(f"igemm_wgmma: store must be 'threads', 'staged' or 'staged overlaid', got {store!r}")
    if bm % 64 or bn % 64 or bk % 64:
        raise ScheduleError(f"igemm_wgmma: bm, bn and bk must be multiples of 64 (got {bm}, {bn}, {bk})")
    aligned_filter(sched, out, w, filter_granule)
    st = sched[out]
    st.split("m", bm, "bi", "i1").split("k", bn, "bj", "j1")
    st.split("i1", 16, "wi", "i3").split("j1", 8, "nj", "j3")
    st.split("c", bk, "co", "c1").split("c1", 16, "kk", "k3")
    lead = [batch] if batch else []
    st.reorder(*lead, "bi", "bj", "wi", *taps, "co", "kk", "nj", "i3", "j3", "k3")
    k_loop = _k_loop(st, taps)
    if batch:
        st.bind(batch, "blockIdx.z")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("wi", "threadIdx.z")
    _store(st, store)
    st.cache(col, k_loop, layout=lambda m, *tc: (m, tc[-1]), loc="shared", name=f"{col}_shared")
    st.cache(w, k_loop, layout=lambda *tck: (tck[-2], tck[-1]), loc="shared", name=f"{w}_shared")
    st.cache_write("wi", loc="fragment")
    st.tensorize("i3", "wgmma_m64nNk16")
    sched[col].compute_inline()  # after caching: the copies gather the input themselves
    if stages > 1:
        st.pipeline(f"{col}_shared", stages, inflight=inflight).pipeline(f"{w}_shared", stages, inflight=inflight)


def aligned_filter(sched: Schedule, out: str, w: str, granule: int | None = FILTER_GRANULE) -> bool:
    """Give an implicit GEMM's filter ``w`` (its filters the contiguous last dimension: the GEMM's
    columns) an aligned copy — rows rounded up to 16 bytes, zeros past the last filter; one small
    copy kernel — where its rows are not a multiple of ``granule`` bytes (None: never), so that the
    K loop fills its filter tiles with 16-byte asynchronous copies (``align_operands``). Read in
    place, rows of 33 16-bit filters (66 bytes) allow no asynchronous copy: every K step loaded 16
    filter elements a thread synchronously and converted them, and the pipeline waited on them
    (random shapes, seed 52817, H200: 304 → 33 channels, 3×3 on 1×102×102 in 477 µs, cuDNN 28).
    Returns whether it copied."""
    return bool(granule) and bool(align_operands(sched, out, (w,), granule=granule))  # type: ignore[arg-type]


def _k_loop(st: object, taps: list[str]) -> str:
    """Fuse the taps and the channel chunks "co" into one sequential K loop (no taps: "co"); its name."""
    k_loop, *rest = [*taps, "co"]
    for t in rest:
        st.fuse(k_loop, t, f"{k_loop}_{t}")  # type: ignore[attr-defined]
        k_loop = f"{k_loop}_{t}"
    return k_loop


def igemm_cuda(sched: Schedule, out: str, col: str, w: str, taps: list[str], *, pixels: int = 128,
               channels: int = 16, per_thread: int = 1) -> None:
    """Schedule an implicit-GEMM convolution on the CUDA cores, for inputs of too few channels to fill a
    tensor-core K step (C < 16: an image's 3 colors): each of the ``pixels`` threads of a block
    computes ``per_thread`` output pixels (``pixels`` apart) × ``channels`` output channels in
    registers. The block's filters (taps × C × channels) are staged in shared memory; at each tap
    and channel (one loop) a thread gathers its pixels' input values into registers once and reads
    the channels' filter values as one row of shared memory (vectors, the same for every thread: a
    broadcast), then does per_thread × channels products from registers."""
    st = sched[out]
    st.split("m", pixels * per_thread, "bi", "m1").split("m1", pixels, "mp", "mt")
    st.split("k", channels, "ko", "ki")
    st.reorder("bi", "ko", "mt", *taps, "c", "mp", "ki")
    # the taps and channels as one loop: a short body (the products of one input element) run
    # taps × C times, rather than one unrolled body per tap (instruction-cache misses)
    red = taps[0]
    for t in [*taps[1:], "c"]:
        st.fuse(red, t, f"{red}_{t}")
        red = f"{red}_{t}"
    st.bind("bi", "blockIdx.x").bind("ko", "blockIdx.y").bind("mt", "threadIdx.x")
    st.cache(w, "mt", loc="shared", name=f"{w}_shared")
    # registers: the filter row (a tap and channel: the block's output channels) and the pixels' inputs
    st.cache(w, red, loc="local", layout=lambda *tck: (tck[-1],))
    st.cache(col, red, loc="local", layout=lambda m, *tc: (m // pixels, m % pixels))
    sched[col].compute_inline()  # after caching: the register copy gathers the input itself
    st.cache_write("mt", loc="local", layout=lambda m, k: (m // pixels, m % pixels, k))
    st.unroll("ki").unroll("mp")  # inner first (unrolling.py)


def igemm_rows(target: CUDATarget, N: int, H: int, W: int, C: int, K: int, R: int, S: int, stride: int,
               padding: int, dtype: str, out_dtype: str, tiles: dict[str, int] | None = None, bk: int | None = None,
               stages: int = 3, split: tuple[bool, int] | None = None, aligned_filter: bool = True,
               staged_stores: bool | None = None) -> Schedule:
    """A convolution of fewer input channels than a tensor-core K step (``ops.igemm.conv2d_igemm_rows_func``:
    the input and filter copied once with the channels padded to 4 or 8 and the image padded,
    then each filter row's taps and channels one contiguous run of the reduction) on ``mma.sync``
    (``igemm_tensorcore``: the filter rows are the taps, the runs in K tiles of 32 or 16, copied as
    vectors), the two copies elementwise kernels of their own (the input's a thread per pixel, its
    channels unrolled). Before: the CUDA cores
    (``igemm_cuda``), ResNet-50's 7×7/2 stem at batch 32 in 691 µs on an H100 (cuDNN 90 µs).
    The reduction split as ``conv_choice.igemm_rows_choice`` predicts fastest (one chunk per filter
    row and/or run chunks, the chunks along blockIdx.z, then their sum). ``tiles`` (bm, bn, wm, wn),
    ``bk``, ``stages`` and ``split`` (one chunk per filter row, run chunks): other than the default's
    (tuning); ``aligned_filter`` False: the padded filter's rows K filters long (as before).
    ``staged_stores`` (None: ``STAGED_ODD_STORES``): an unsplit product's 16-bit results in rows only
    2-byte aligned (an odd K) through shared memory (``staged_output``)."""
    from .igemm import conv2d_igemm_rows_func, padded_channels
    P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
    cp, Sp = padded_channels(C, S)
    run = Sp * cp
    itemsize = as_dtype(dtype).itemsize
    default = igemm_rows_choice(target, N * P * Q, K, R, run, itemsize, (N * H * W * cp + R * run * K) * itemsize,
                                as_dtype(out_dtype).itemsize)
    tiles, bk = tiles or {k: default.params[k] for k in ("bm", "bn", "wm", "wn")}, bk or default.params["bk"]
    rows, chunks = split or (default.rows, default.chunks)
    if (rows, chunks) not in igemm_splits(run, R, 1, bk):
        rows, chunks = False, 1
    func = conv2d_igemm_rows_func(N, H, W, C, K, R, S, stride, padding, dtype, out_dtype, rows, chunks,
                                  channel_chunk(run, chunks, bk), aligned_filter)
    sched = Schedule(func)
    granule = FILTER_GRANULE if aligned_filter else None  # Wf is a copy already: aligned, or left as before
    if rows or chunks > 1:
        stages = min(stages, chunk_steps(run, R, 1, bk, rows, chunks))
        igemm_tensorcore(sched, "P", "col", "Wf", [] if rows else ["r"], bk=bk, stages=stages,
                         reg_stages=2 if bk > MMA_K else 1, batch="sp", filter_granule=granule, **tiles)
        sum_partials(sched, "O")
    else:
        igemm_tensorcore(sched, "O", "col", "Wf", ["r"], bk=bk, stages=stages, reg_stages=2 if bk > MMA_K else 1,
                         filter_granule=granule, **tiles,
                         store=staged_output(K, as_dtype(out_dtype).itemsize, staged_stores,
                                             None if staged_stores else N * P * Q * K))
    st = sched["X"]
    if cp <= MMA_K:  # the padded input: a thread per pixel, its cp channels unrolled (one gather of its index)
        st.split("v", cp, "w", "c").fuse("n", "h", "nh").fuse("nh", "w", "x").split("x", 256, "bx", "tx")
        st.reorder("bx", "tx", "c").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x").unroll("c")
    else:  # many channels: a thread per element, the reads and writes of a warp adjacent
        st.fuse("n", "h", "nh").fuse("nh", "v", "x").split("x", 256, "bx", "tx")
        st.bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    st = sched["Wf"]
    st.fuse("r", "u", "ru").fuse("ru", "k", "x").split("x", 256, "bx", "tx")
    st.bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    return sched


def staged_output(N: int, out_bytes: int, staged: bool | None = None, results: int | None = None) -> str:
    """The store of a tensor-core product's unsplit results in rows of ``N``: "staged" for 16-bit results
    in rows only 2-byte aligned (an odd N), at least ``STAGED_LEAST_RESULTS`` ``results`` (None: any),
    where ``staged`` (None: ``STAGED_ODD_STORES``; "staged overlaid" where ``STAGED_OVERLAY``: in a tile
    of its own where no operand tile is large enough), else "threads"."""
    on = STAGED_ODD_STORES if staged is None else staged
    if not (on and out_bytes == 2 and N % 2) or (results is not None and results < STAGED_LEAST_RESULTS):
        return "threads"
    return "staged overlaid" if STAGED_OVERLAY else "staged"


def _igemm(sched: Schedule, target: CUDATarget, taps: list[str], M: int, C: int, K: int, tap_count: int,
           chosen: tuple[str, dict[str, int]] | None = None, filter_granule: int | None = FILTER_GRANULE,
           staged_stores: bool | None = None) -> None:
    kernel, params = chosen or igemm_kernel(target, M, C, K, tap_count)
    if kernel == "cuda":
        # pixels per thread and output channels per block: as many as divide the output evenly (no
        # partial register tiles, whose tests would surround the products)
        per_thread = next(p for p in (4, 2, 1) if M % (128 * p) == 0 or p == 1)
        channels = next(c for c in (16, 8, 4, 2, 1) if K % c == 0)
        igemm_cuda(sched, "O", "col", "Wt", taps, channels=channels, per_thread=per_thread)
    else:
        fn = igemm_wgmma if kernel == "wgmma" else igemm_tensorcore
        store = staged_output(K, sched.func.tensor("O").dtype.itemsize, staged_stores,
                              None if staged_stores else M * K)
        fn(sched, "O", "col", "Wt", taps, filter_granule=filter_granule, store=store,  # type: ignore[operator]
           **params)


def conv2d_igemm(sched: Schedule, target: CUDATarget, N: int, H: int, W: int, C: int, K: int, R: int, S: int,
                 stride: int, padding: int) -> Schedule | None:
    """The default 2-D implicit GEMM: few channels, or channels that are no whole 16-byte vectors
    (``igemm.pads_channels``), on ``igemm_rows``; otherwise the kernel, tiles and
    split of the reduction over filter rows and channel chunks that ``igemm_choice`` predicts fastest
    (a split: ``ops.igemm.conv2d_igemm_split_func``, then the chunks summed)."""
    P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
    M = N * P * Q
    dtype, out = sched.func.tensor("I").dtype, sched.func.tensor("O").dtype
    from .igemm import pads_channels
    if pads_channels(C, dtype.itemsize) and target.has("mma.sync") and dtype.name in MMA_M16N8K16.operand_dtypes:
        return igemm_rows(target, N, H, W, C, K, R, S, stride, padding, dtype.name, out.name)
    choice = igemm_choice(target, M, C, K, R, S, dtype.itemsize, N * H * W, out.itemsize)
    return igemm_schedule(sched, target, choice, N, H, W, C, K, R, S, stride, padding)


def igemm_schedule(sched: Schedule, target: CUDATarget, choice: IgemmChoice, N: int, H: int, W: int, C: int, K: int,
                   R: int, S: int, stride: int, padding: int, filter_granule: int | None = FILTER_GRANULE,
                   staged_stores: bool | None = None) -> Schedule | None:
    """Schedule ``ops.conv2d_igemm``'s ``sched`` as ``choice`` (an ``igemm_options`` entry): in place
    when unsplit (None), else the split algorithm's new schedule; the filter as ``aligned_filter``
    leaves it; ``staged_stores`` as in ``igemm_rows``."""
    from .igemm import conv2d_igemm_split_func
    P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
    if not choice.rows and choice.chunks == 1:
        _igemm(sched, target, ["r", "s"], N * P * Q, C, K, R * S, (choice.kernel, choice.params), filter_granule,
               staged_stores)
        return None
    dtype, out = sched.func.tensor("I").dtype, sched.func.tensor("O").dtype
    return igemm_split_schedule(conv2d_igemm_split_func(N, H, W, C, K, R, S, stride, padding, dtype.name, out.name,
                                                        choice.rows, choice.chunks,
                                                        channel_chunk(C, choice.chunks, choice.params["bk"])),
                                choice.kernel, choice.params, choice.rows, filter_granule)


def igemm_split_schedule(func: object, kernel: str, params: dict[str, int], rows: bool,
                         filter_granule: int | None = FILTER_GRANULE) -> Schedule:
    """Schedule a split implicit GEMM (``ops.igemm.conv2d_igemm_split_func``): the partial products on
    ``kernel`` ("wgmma" or "mma") with the chunks along blockIdx.z, then their sum; the filter as
    ``aligned_filter`` leaves it."""
    split = Schedule(func)  # type: ignore[arg-type]
    *taps, channels = (int(a.hi.value) for a in split.computation("P").reduce_axes)  # type: ignore[attr-defined]
    steps = math.prod(taps) * -(-channels // params["bk"])  # a pipeline no deeper than a chunk's K loop
    fn = igemm_wgmma if kernel == "wgmma" else igemm_tensorcore
    fn(split, "P", "col", "Wt", ["s"] if rows else ["r", "s"], batch="sp",  # type: ignore[operator]
       filter_granule=filter_granule, **no_deeper(params, steps))
    sum_partials(split, "O")
    return split


def conv3d_igemm(sched: Schedule, target: CUDATarget, N: int, D: int, H: int, W: int, C: int, K: int, T: int,
                 R: int, S: int, stride: int, padding: int) -> None:
    Z = (D + 2 * padding - T) // stride + 1
    P, Q = (H + 2 * padding - R) // stride + 1, (W + 2 * padding - S) // stride + 1
    _igemm(sched, target, ["t", "r", "s"], N * Z * P * Q, C, K, T * R * S)


def _wgmma(target: CUDATarget) -> bool:
    return target.has("wgmma")


GEMV_ROWS = 16  # products with at most this many rows stream B on the CUDA cores (gemv_cuda)
# "0": the default GEMM of 5 to 16 rows of 16-bit operands keeps the CUDA cores' GEMV (or mma.sync's own
# 16-row tile) instead of gemv_mma (gemm_choice's tensor_core_gemv); "1": gemv_mma from 2 rows
GEMV_MMA_VARIABLE = "POLYTILE_GEMV_MMA"
# the fewest rows the default takes gemv_mma for. Measured on an H200 (2026-11-28,
# benchmarks/results/gemv_rows-20261128-1745-h200.json, µs, CUDA-core GEMV / gemv_mma / torch): 2, 3, 4
# rows × 4096×4096 bf16 19.5/21.1, 19.6/20.6, 19.9/21.3 (torch 18.9); 6 rows 21.5/21.0, 12 27.0/22.6,
# 15 29.7/22.5; 16 rows (mma.sync's tile) 22.9/22.7; 16×28672×4096 87.1/77.9 (torch 70.6); 16×3072×768
# fp16 11.3/9.6 (8.9); 5×5000×3000 bf16 24.0/20.2 (18.1); 2×28672×4096 70.8/72.0 (67.3)
GEMV_MMA_MIN_ROWS = 5
# the most chunks of a GEMV's split: its partial products are M ≤ GEMV_ROWS rows (a 64-way split of
# 1×4097×4093 writes 1 MB of them while streaming 33 MB of B), and more chunks are more warps
# streaming B. Measured on an H100 (benchmarks/results/gemv_split-20261128-0505-h100.json): 1×4097×4093
# bf16 77 µs in 16 chunks, 38 in 32, 30 in 64 (torch 24); 1×3001×2999 fp16 98 µs in 16, 33 in 64
# (torch 16); 4×1000×1999 fp16 27 µs in 16, 16 in 48; staged GEMVs of aligned rows within ±5%
GEMV_MAX_SPLIT = 64
# a K step of the direct GEMV (B's loads straight into registers, not pipelined), in idle DRAM latencies:
# fitted to the H100's direct GEMVs of odd N (2 to 4 µs a step, 8 or 16 rows, 1 to 16 chunks: it picks
# the measured best splits of 1×50257×768 and 1×4097×4096)
DIRECT_STEP_LATENCY = 10.0
# a GEMV whose B has at most this many bytes and whose reduction fits one K step of the direct GEMV's
# registers (``ONE_STEP_ROWS``) takes that step (``one_step_gemv``). Measured on an H200
# (benchmarks/worst_shapes.py at 89b8efd, µs one step / staged default / torch): 2×30×63 float32 6.0 /
# 30.2 / 7.1; 4×100×50 10.0 / 14.7 / 6.6 (4 chunks of steps of 16: 7.4); 1×5044×24 (484 KB of B) 5.9 /
# 10.3 / 5.8; past one step, in steps of 64 (not taken): 3×257×129 9.5 / 9.2, 1×88×72 bf16 7.0 / 7.4
ONE_STEP_GEMV_BYTES = 512 * 1024
ONE_STEP_ROWS = 64  # 8 bytes of B's columns a row: 512 bytes of registers a thread
# past ONE_STEP_GEMV_BYTES, up to this many bytes of B take the one step too where ``WIDE_ONE_STEP``, in
# blocks of as few threads as leave a block on every SM (``one_step_gemv``'s ``sms``), for the float32
# products whose staged GEMV has a partial K tile (``wide_one_step``). Measured on an H200 (2026-11-29,
# benchmarks/worst_shapes.py at a6936f8, µs staged default / wide one step / torch): 1×8424×48 float32
# 16.9 / 6.1 / 6.6 (seed 424242: 0.385×; the default's 132 one-warp blocks copy their 48 of 64 rows
# of B with synchronous loads), 4×8424×48 16.3 / 6.9 / 7.3; not taken (the staged GEMV faster): K a
# multiple of its K tile, 1×12000×32 5.9 / 6.6, 1×20000×64 6.5 / 9.4; 16-bit, 1×8424×48 fp16 5.1 / 6.2,
# bf16 5.4 / 6.3. Why the float32 partial tile is slow where the 16-bit one is not is not understood
WIDE_ONE_STEP_BYTES = 8 * 1024 * 1024
WIDE_ONE_STEP = True
# 16-bit GEMM outputs of 2-byte aligned rows (an odd N) of at least this many results are computed in
# padded rows and copied out (``pads_output``). Measured on an H200 (benchmarks/worst_shapes.py at
# 89b8efd, µs padded / default / torch): 1001×10781×71 fp16 53.1 / 67.5 / 30.5 (mma.sync 64.4, wgmma
# 128×128 63.6: the tiles do not matter); 2085×3175×113 bf16 39.9 / 47.0 / 27.2. The odd N is the cost,
# not the operands' copies: 1001×10784×71 (A copied) 20.8, 1001×10781×72 (B copied) 64.5, 1001×10784×72
# 18.9. The copy-out, a thread per 2-byte element, is most of what is left (not measured apart).
# Off (0) since: GPT-2's vocabulary projection at 128 tokens (128×50257×768 fp16, 6.4M results) took
# 184–188 µs padded at eafb8a8 against 97–103 by default at dc7b3df (torch 110; H200,
# benchmarks/wgmma_defaults.py, both runs): a size bound does not tell the two apart
PADDED_OUTPUT_ELEMENTS = 0
# 16-bit results of a tensor-core GEMM (unsplit) in rows only 2-byte aligned (an odd N), at least
# STAGED_LEAST_RESULTS of them, staged in shared memory and copied out by the threads, a row at a time
# (``gemm_wgmma``'s, ``gemm_tensorcore``'s and the implicit GEMMs' store="staged", ``staged_stores``): the
# accumulators' own stores are single elements, a warp's store instruction over 8 rows (1001×10781×72
# fp16 64.5 µs, 1001×10784×72 18.9 on an H200). True: the default (gemm_choice's ``staged_stores``, for
# unbatched products, and ``staged_output``); False: each thread stores its accumulators, as before. Measured on an H200
# (2026-11-29, benchmarks/worst_shapes.py at a6936f8, µs threads' stores / staged / torch): 1001×10781×71
# fp16 66.2 / 45.6 / 30.5, 1001×10781×72 64.3 / 42.9 / 32.0, 2085×3175×113 bf16 46.4 / 34.0 / 26.6, GPT-2's
# 128×50257×768 97.0 / 81.4 / 109.6 and 2048×50257×768 693.7 / 488.9 / 1234.1, 77×30523×512 43.5 / 40.2 /
# 38.9, 2048×4097×1023 bf16 74.8 / 49.7 / 121.6, the 16×70×70 14→161 1×1 convolution 77.4 / 64.1 / 28.2;
# fewer results within ±2% (1×102×102 304→33 3×3 52.0 / 51.6, 8×28×28 128→75 16.4 / 16.1, 1×8×8
# 264→461 7×7/2 38.2 / 38.4) or slower (16×4097×512 fp16 on mma.sync 12.4 / 13.2, 1×64×64 3→33 3×3
# 10.5 / 12.1); rows 4-byte aligned slower (1001×10782×72 36.3 / 45.9: not staged)
STAGED_ODD_STORES = True
STAGED_LEAST_RESULTS = 1 << 20
# staged as STAGED_ODD_STORES does, the staging tile in the storage of an operand's shared tiles (the
# pipeline's stages kept: ``Stage.staged_store(overlay=True)``) where one is large enough
STAGED_OVERLAY = False


@dataclass(frozen=True)
class GemmChoice:
    """A default GEMM schedule: the kernel ("wgmma", "mma", "cuda", "gemv" or "gemv_mma"), its parameters, the
    number of chunks the reduction is split into (1: none) and the model's predicted seconds; with
    ``tail`` the rows split for the last wave (``tail_split_choice``): this kernel computes the first
    ``tail.head_rows`` rows, ``tail.tail`` the rest."""

    kernel: str
    params: dict[str, int]
    split: int
    seconds: float
    chunk: int = 0  # the length of each chunk of K but the last (0: ⌈K/split⌉)
    tail: TailSplit | None = None


@dataclass(frozen=True)
class TailSplit:
    """The rows of a GEMM past its whole waves of output tiles (``tail_split_choice``): the head's rows
    (``head_rows``, a multiple of its block rows) and the tail's own choice (``tail``: its tiles and its
    split of K, which fill the multiprocessors that the last wave would leave idle)."""

    head_rows: int
    tail: GemmChoice


# "1": the default GEMM splits the rows of a last wave that the model predicts clearly faster split
# (``tail_split_choice``). Off: measured slower on all of 11 GEMMs with a 15–55% full last wave (H200,
# benchmarks/results/tail_wave-20261129-0503-h200-a2613d0.json: 0.77× the default, geometric mean of the
# best split per GEMM; 5096×840×4216 fp16 102.2 µs default, 117.4 split). The split's head alone, one
# wave of 130 tiles, took 63.1 µs and the default's second wave of 70 tiles 39 more: these kernels run in
# proportion to their tiles, not their waves (the model predicted no split past its margin either)
TAIL_SPLIT_VARIABLE = "POLYTILE_TAIL_SPLIT"
TAIL_SPLIT_DEFAULT = False
# the fewest rows a tail takes: fewer rows than a tile of the tail's kernel (warpgroup MMA's 64) leave it
# one row of tiles
TAIL_MIN_ROWS = 64
TAIL_MAX_SPLIT = 8  # the most chunks of K a tail is split into (its partial sums' traffic grows with them)


def _wgmma_candidates(M: int, N: int, K: int, it: int, hw: Hardware, tall: bool = False
                      ) -> list[tuple[dict[str, int], BlockPlan]]:
    """Warpgroup-MMA tiles: bm/64 warpgroups issuing wgmma.m64n{bn}k16 (bn a multiple of 64: B's
    128-byte swizzled rows, 192 included), 64-wide K tiles in 4 stages with one MMA group in flight —
    128-wide in 5 stages for the small tiles of a deep reduction (tuned: BERT's 512×768×3072 in
    0.014 ms instead of 0.023). Operands read in 4- or 8-byte pieces (rows not 16-byte aligned) take
    4 to 2 times the copy instructions: tiles up to 128×128 (128×256 spills its accumulators).
    ``tall``: 256×128 tiles too (four warpgroups of 64 accumulators a thread: 512 threads fill the
    register file; wider ones would spill), fewer blocks for the same rows where 128-row tiles leave
    a wave's tail (H200: 6000×600×3000 fp16 54.9 µs in 256×128 tiles, 74.1 in 128×128, torch 45.3)."""
    pieces = _in_pieces(K * it) or _in_pieces(N * it)
    out = []
    tiles = [(bm, bn) for bm in (128, 64) for bn in (256, 192, 128, 64)]
    for bm, bn in [(256, 128)] * tall + tiles:
        if (bm > 64 and bm // 2 >= M) or (bn > 64 and bn >= N + 64) or (pieces and bm * bn > 128 * 128):
            # a tile twice the matrix's rows only repeats a smaller one's work; one 64 columns wider
            # than the matrix computes them for nothing and leaves TMA out (a box wider than the
            # tensor): 32×2048×128×2048 in 128×192 tiles with cp.async took 134.5 µs, 128×128 with
            # TMA 127.1 (H100)
            continue
        bk, stages = (128, 5) if bm * bn <= 64 * 128 and K >= 2048 else (64, 4)
        # one K tile: nothing to pipeline, two stages' shared memory (more blocks resident; measured
        # on an H100, 12×1024×1024×64: 28.0 µs, with four stages 29.4); two K tiles keep 4 stages (3:
        # 32×2048×2048×128 in 268 µs instead of 240, the second tile no longer loaded ahead)
        stages, inflight = (2, 0) if K <= bk else (stages, 1)
        params = dict(bm=bm, bn=bn, bk=bk, stages=stages, inflight=inflight)
        resident = occupancy(WgmmaConfig(**params), hw, it).blocks
        out.append((params, BlockPlan(bm, bn, bk, 0, 0, resident, hw.wgmma_flops, it, stages)))
    return out


def _mma_candidates(M: int, N: int, K: int, it: int, hw: Hardware) -> list[tuple[dict[str, int], BlockPlan]]:
    """mma.sync tiles (ALCOP's multi-level pipeline): 64×64 warp tiles in 128×256 or 128×128 blocks,
    32×32 in 64×64; 64-wide K tiles (32 for short K) in 3 shared stages, fragments double-buffered."""
    out = []
    for bm, bn, wm, wn in ((128, 256, 64, 64), (128, 128, 64, 64), (64, 64, 32, 32)):
        bk = 64 if K >= 128 else 32
        tiles = TileConfig(bm, bn, bk, wm, wn, 3, 2)
        resident = occupancy(tiles, hw, it).blocks
        out.append((dict(bm=bm, bn=bn, wm=wm, wn=wn, bk=bk, stages=3, reg_stages=2),
                    BlockPlan(bm, bn, bk, 0, 0, resident, hw.mma_flops, it, 3)))
    return out


def _cuda_candidates(M: int, N: int, K: int, it: int, hw: Hardware) -> list[tuple[dict[str, int], BlockPlan]]:
    """CUDA-core tiles of ``gemm_cuda``: 128×128 blocks of 8×8 register tiles down to 32×64 blocks of
    4×4 (more blocks for small outputs), K chunks of 8 in 3 stages."""
    out = []
    for bm, bn, tm, tn in ((128, 128, 8, 8), (128, 64, 8, 8), (64, 128, 8, 8), (64, 64, 8, 4), (64, 64, 4, 4),
                           (32, 64, 4, 4)):
        threads = (bm // tm) * (bn // tn)
        resident = block_occupancy(hw, threads, 3 * 8 * (bm + bn) * it, tm * tn + tm + tn + 40).blocks
        out.append((dict(bm=bm, bn=bn, bk=8, tm=tm, tn=tn, stages=3),
                    BlockPlan(bm, bn, 8, 0, 0, resident, hw.fma_flops, it, 3, threads // 32)))
    return out


def one_step_gemv(M: int, N: int, K: int, it: int, most: int | None = None, sms: int = 0) -> dict[str, int] | None:
    """The direct GEMV of one K step for a small product (B at most ``most`` bytes, by default
    ``ONE_STEP_GEMV_BYTES``; K at most ``ONE_STEP_ROWS``): each thread loads its K rows × 8 bytes of
    B's columns into registers at once — every load in flight together — in blocks of 32 to 128
    threads (with ``sms``: as few as leave a block for each of that many SMs); None where it does not
    apply. The staged GEMV copies B's tile through shared memory by
    its N/vec threads, each looping over many rows (2×30×63 float32: 15 threads, 70 iterations of
    synchronous loads, 29.7 µs on an H200 against torch's 7.4, seed 52817)."""
    if N * K * it > (ONE_STEP_GEMV_BYTES if most is None else most) or K > ONE_STEP_ROWS:
        return None
    vec = 8 // it
    warps = -(-N // (32 * vec * sms)) if sms else -(-N // (32 * vec))
    threads = max(32, min(128, 32 * warps))
    per = 16 // it  # A's shared rows of whole 16-byte vectors
    return dict(bn=threads * vec, vec=vec, bk=-(-K // per) * per, stages=1, direct=True, whole=True)


def _gemv_candidates(M: int, N: int, K: int, it: int, hw: Hardware, one_step: bool = True
                     ) -> list[tuple[dict[str, int], BlockPlan]]:
    """``gemv_cuda`` blocks of 128, 64 or 32 threads, each thread 8 bytes of B's columns (4 16-bit
    or 2 float32 values), K tiles of about 16 KiB of B in 4 stages (48 KiB in flight per block); with
    ``one_step`` (unbatched products: the ones measured) a small product the direct GEMV of one K step
    alone (``one_step_gemv``)."""
    vec = 8 // it
    out = []
    one = one_step_gemv(M, N, K, it) if one_step else None
    if one is not None:
        threads = one["bn"] // vec
        resident = block_occupancy(hw, threads, one["bk"] * M * it, M * vec + one["bk"] * vec * it // 4 + 32).blocks
        return [(one, BlockPlan(M, one["bn"], one["bk"], 0, 0, resident, hw.fma_flops, it, 1, max(1, threads // 32),
                                WARP_FLOPS * M / (M + 2), streaming=True, step_latency=hw.dram_latency))]
    if (N * it) % 8:
        # B's rows 4-byte aligned: 4-byte asynchronous copies, four per 16 bytes, starved the staged
        # kernel (H100, benchmarks/results/gemv_align-20261128-0600-h100.json: 8×4098×4096 bf16 152 µs
        # staged, 54 direct in 63 chunks; 1×50258×768 fp16 79 against 46; an aligned copy of B no
        # better than in place): they are read directly like 2-byte aligned ones.
        # B's rows are only 2-byte aligned: no asynchronous copy can read them, and an aligned copy
        # of B costs a pass over it (GPT-2's vocabulary 1×50257×768: 0.16× torch): B is read in place,
        # straight into registers, 16 bytes of columns per thread (8 with more than 4 rows: registers
        # for M × vec accumulators) in K steps of 8 or 16 rows, each as the aligned chunks around it
        # shifted into place (lowering/passes/realign_loads.py; 2-byte loads before: 1×4097×4093 at
        # 0.14× torch). The staged kernels are not candidates: on an aligned copy of B they measured
        # slower (1×50257×768: 162 µs against 44; 1×4097×4096: 95 against 68). B's loads are not
        # pipelined (only A's shared tile is): each K step waits for its own loads
        # (DIRECT_STEP_LATENCY). Measured on an H100 (gemv_variants, 2026-11-28 02:21,
        # b2-results/align-gemv.json): time ∝ K steps per warp until DRAM-bound — 1×50257×768 in
        # 93 µs split in 3 (32 steps of 8 rows), 44 µs in 12 (torch 45); 1×4097×4096 split in 16:
        # 77 µs in steps of 8 rows, 67 µs in steps of 16
        dvec = (16 if M <= 4 else 8) // it
        for threads, bk in ((128, 8), (64, 8), (128, 16), (64, 16)):
            params = dict(bn=threads * dvec, vec=dvec, bk=bk, stages=3, direct=True)
            resident = block_occupancy(hw, threads, 3 * bk * M * it, M * dvec + bk * dvec * it // 4 + 32).blocks
            out.append((params, BlockPlan(M, threads * dvec, bk, 0, 0, resident, hw.fma_flops, it, 1,
                                          max(1, threads // 32), WARP_FLOPS * M / (M + 2), streaming=True,
                                          step_latency=DIRECT_STEP_LATENCY * hw.dram_latency)))
        return out
    for threads in (128, 64, 32):
        bn = threads * vec
        if bn // 2 >= N and threads > 32:
            continue
        bk = max(8, min(64, 1 << (16384 // (bn * it)).bit_length() - 1))
        resident = block_occupancy(hw, threads, 4 * bk * (bn + M) * it, M * vec + vec + 32).blocks
        # each element of B costs a thread a shared-memory load (and a conversion from 16 bits)
        # besides its M products: few rows leave the warps' issue slots mostly to those
        warp_flops = WARP_FLOPS * M / (M + (2 if it == 2 else 1))
        out.append((dict(bn=bn, vec=vec, bk=bk, stages=4),
                    BlockPlan(M, bn, bk, 0, 0, resident, hw.fma_flops, it, 4, max(1, threads // 32), warp_flops,
                              streaming=True)))
    return out


def _gemv_mma_candidates(M: int, N: int, K: int, it: int, hw: Hardware) -> list[tuple[dict[str, int], BlockPlan]]:
    """``gemv_mma`` blocks of 4 warps owning 64, 32 or 16 columns each (256-, 128- or 64-wide tiles of B),
    K tiles of 64 (128 for 64-wide blocks: 16 KiB of B a stage) in 4 stages; the instruction's 8
    columns hold the rows of A (two tiles for 9 to 16 rows)."""
    rows = 8 * -(-M // 8)
    out = []
    for bn in (256, 128, 64):
        if bn // 2 >= N and bn > 64:
            continue
        bk = 128 if bn == 64 and K >= 1024 else 64
        shared = 4 * bk * (bn + 8 + 16 + 8) * it  # B's and A's padded tiles, 4 stages
        resident = block_occupancy(hw, 128, shared, 4 * (bn // 4 // 16) * (rows // 8) + 40).blocks
        # the products cost nothing beside the copies: the plan's warps (4) stream B, at the tensor rate
        out.append((dict(bn=bn, warps=4, bk=bk, stages=4),
                    BlockPlan(rows, bn, bk, 0, 0, resident, hw.mma_flops, it, 4, 4, hw.mma_flops, streaming=True)))
    return out


def tile_chunks(K: int, bk: int, most: int) -> list[tuple[int, int]]:
    """Splits of a reduction into chunks of whole K tiles of ``bk``, the last chunk shorter, for the
    kernels that compute whole K tiles (the tensor cores; the GEMV's whole register tiles): (chunks,
    chunk length) for at most ``most`` chunks of at least two K tiles. Each chunk but the last is
    ⌈T/S⌉ of the T = ⌈K/bk⌉ tiles; the last one ends at K, where the whole tiles read zeros past the
    tensors' ends (61×61×8191, a prime K: one 64×64 tile and no divisor to split by, 0.30× torch
    unsplit)."""
    tiles = -(-K // bk)
    out: dict[int, int] = {}
    for split in range(2, most + 1):
        per = -(-tiles // split)
        count = -(-tiles // per)
        if per >= 2 and count >= 2:
            out.setdefault(count, per * bk)
    return sorted(out.items())


def _splits(K: int, bk: int, most: int = MAX_SPLIT) -> list[int]:
    """Chunk counts of a split reduction into chunks of one length, at most ``most``: the divisors of
    K that leave every chunk whole K tiles, at least two (every kernel computes whole K tiles)."""
    return [s for s in range(1, most + 1) if K % s == 0 and K // s >= 2 * bk and (s == 1 or (K // s) % bk == 0)]


def gemv_mma_applies(target: CUDATarget, M: int, N: int, K: int, dtype: DType, batch: int = 1) -> bool:
    """Whether ``gemv_mma`` can compute the product: 2 to ``GEMV_ROWS`` rows of 16-bit operands on a target
    with mma.sync, unbatched, B's rows a multiple of 16 bytes (read in place by 16-byte asynchronous
    copies: a copy of B would double the traffic), K at least the instruction's 16."""
    return (2 <= M <= GEMV_ROWS and batch == 1 and dtype.name in MMA_M16N8K16.operand_dtypes
            and target.has("mma.sync") and (N * dtype.itemsize) % 16 == 0 and K >= MMA_M16N8K16.shape[2])


def _kernel_candidates(target: CUDATarget, M: int, N: int, K: int, dtype: DType, batch: int, split_k: int | None,
                       hw: Hardware, gemv_mma_rows: tuple[int, int], batched_tiles: bool = False
                       ) -> tuple[str, list[tuple[dict[str, int], BlockPlan]]]:
    """The kernel the operands call for and its candidate tiles (``gemm_choice``); ``gemv_mma`` for
    ``gemv_mma_rows`` (first, last) rows where it applies; ``batched_tiles``: a batched product of at most
    ``GEMV_ROWS`` rows on mma.sync's tiles rather than the GEMV."""
    it = dtype.itemsize
    mma_rows = MMA_M16N8K16.shape[0]
    # a reduction shorter than the instructions' K step (16) takes the CUDA cores: the tensor-core
    # schedules tensorize whole K steps (K = 8 did not build)
    tensor_cores = dtype.name in MMA_M16N8K16.operand_dtypes and target.has("mma.sync") and K >= MMA_K
    if gemv_mma_rows[0] <= M <= gemv_mma_rows[1] and gemv_mma_applies(target, M, N, K, dtype, batch):
        found = _gemv_mma_candidates(M, N, K, it, hw)
        if split_k:  # the instruction computes whole K tiles: K tiles that divide the given chunks
            chunk = -(-K // split_k)
            found = [({**p, "bk": bk}, replace(plan, bk=bk)) for p, plan in found
                     for bk in [next((b for b in (p["bk"], 64, 32, 16) if chunk % b == 0), 0)] if bk]
        if found:
            return "gemv_mma", found
    # rows that fill mma.sync's 16-row tile run on it (one warp tile: wgmma's warpgroups need more),
    # not on the GEMV, whose CUDA cores spend 16 FMAs on each element of B. Measured on an H200
    # (benchmarks/split_variants.py, 2026-11-28): 16×3002×1536 bf16 21.4 µs on the GEMV, 14.3 on
    # mma.sync (torch 15.9); 16×4096×4096 30.7 against 22.7 (torch 19.2). Batched products keep the
    # GEMV (its split) unless gemm_choice's model picks mma.sync's tiles (``batched_tiles``)
    if tensor_cores and batched_tiles and batch > 1 and M <= GEMV_ROWS:  # at most 16 rows: one 64×64 tile a row
        return "mma", [c for c in _mma_candidates(M, N, K, it, hw) if c[0]["bm"] == 64]
    if M <= GEMV_ROWS and not (tensor_cores and M >= mma_rows and batch == 1):
        return "gemv", _gemv_candidates(M, N, K, it, hw, one_step=batch == 1)
    if dtype.name in WGMMA_M64NNK16.operand_dtypes and _wgmma(target) and M > mma_rows and K >= MMA_K:
        return "wgmma", _wgmma_candidates(M, N, K, it, hw)
    if tensor_cores:
        return "mma", _mma_candidates(M, N, K, it, hw)
    return "cuda", _cuda_candidates(M, N, K, it, hw)


def gemm_choice(target: CUDATarget, M: int, N: int, K: int, dtype: DType, batch: int = 1,
                split_k: int | None = None, out_bytes: int = 4, tensor_core_gemv: bool | None = None,
                unequal_chunks: bool = True, batched_tiles: bool | None = None, calibrated: bool = True,
                tail_split: bool | None = None, staged_stores: bool | None = None,
                wide_gemv: bool | None = None) -> GemmChoice:
    """The default GEMM schedule for ``target`` by the analytical model's wave quantization
    (``tune.analytical.gemm_seconds``): the kernel the operands call for (matrix–vector streaming for
    at most ``GEMV_ROWS`` rows — fewer than mma.sync's 16 for its operand types, unbatched —, warpgroup
    MMA for more than 16 rows where the target has ``wgmma``, mma.sync where it has ``mma.sync``, for
    their operand types; the CUDA cores otherwise), then the block tile and split
    of K predicted fastest on this GPU's SMs, shared memory and bandwidth. ``split_k`` fixes the
    split (1: none); batched products are not split. ``out_bytes``: the size of a result (4: float32;
    2: stored as float16 or bfloat16, ``out_dtype``).
    Splits: chunks of one length (K's divisors leaving whole K tiles), or where clearly faster, chunks
    of whole K tiles but the last, which ends at K (``tile_chunks``: up to ``GEMV_MAX_SPLIT`` for the
    GEMV, one chunk per SM for the tensor cores; not on the CUDA cores). A given ``split_k`` of
    unequal chunks of ⌈K/S⌉ takes K tiles that divide them (the GEMV: partial tiles, not whole).
    ``tensor_core_gemv`` (True: 2 to 16 rows; None: the default, ``GEMV_MMA_MIN_ROWS`` to 16 rows unless the
    environment variable ``POLYTILE_GEMV_MMA`` is "0" (none) or "1" (from 2)): rows of 16-bit operands on
    mma.sync, transposed (``gemv_mma``, where ``gemv_mma_applies``), its tiles and split by the same model.
    ``unequal_chunks``: False keeps to chunks of one length (the NCHW convolutions' implicit GEMM splits C·R·S evenly).
    ``batched_tiles`` (None: the model decides): a batched product of 2 to 16 rows of 16-bit operands
    on mma.sync's tiles (True) or the GEMV (False).
    ``calibrated`` (the default): a warpgroup-MMA product that TMA loads takes the tiles (256×128 among
    them) the analytical tuner's calibrated model ranks first at the wave model's split
    (``_calibrated_tiles``); False: the wave model's tiles, as the default chose before 2026-11-29 (for
    A/B benchmarks: ``benchmarks/wgmma_defaults.py``).
    ``tail_split`` (None: ``tail_split_default()``, off unless ``POLYTILE_TAIL_SPLIT=1``): an unsplit,
    unbatched warpgroup-MMA product whose last wave of tiles leaves SMs idle takes its rows split
    (``tail_split_choice``: the whole waves over all of K, the rest split in K) where the model
    predicts that clearly faster (``SPLIT_MARGIN``).
    ``staged_stores`` (None: ``STAGED_ODD_STORES``): a tensor-core product's 16-bit results in rows only
    2-byte aligned through shared memory (``staged_stores``). ``wide_gemv`` (None: ``WIDE_ONE_STEP``): the
    float32 GEMVs ``wide_one_step`` takes on the direct GEMV of one K step.
    The CUDA cores' GEMV spends M FMAs and its operands' loads on each element of B: issue-bound at 8 rows;
    the tensor cores compute 16×8×16 products in one instruction. Measured on an H200
    (2026-11-28, ``shapes.py --only '*.t8'``, same run): the suite's 11 16-bit linear layers of 8 tokens
    0.69–0.92× torch on the GEMV, 0.82–1.05× on gemv_mma (LLaMA's 8×28672×4096 96.3 → 74.5 µs, torch 69)."""
    if batched_tiles is None and batch > 1 and 1 < M <= GEMV_ROWS and not split_k:
        # the GEMV's blocks stream B for all M rows on the CUDA cores; a small batched product is
        # mostly their K loop, or a split and its sum (H200, random shapes: 3 × 12×104×40 fp16 13.9 µs
        # on the GEMV, torch 6.1, seed 97052; 6 × 3×77×211 0.55× torch, seed 31337): mma.sync's tiles
        # where the model predicts them clearly faster (one row, decoding attention's, keeps the GEMV:
        # mma.sync's 16-row tile has no row loop to bind there)
        args = (target, M, N, K, dtype, batch, split_k, out_bytes, tensor_core_gemv, unequal_chunks)
        streamed = gemm_choice(*args, batched_tiles=False, calibrated=calibrated, staged_stores=staged_stores,
                               wide_gemv=wide_gemv)
        tiled = gemm_choice(*args, batched_tiles=True, calibrated=calibrated, staged_stores=staged_stores,
                            wide_gemv=wide_gemv)
        return tiled if tiled.seconds < SPLIT_MARGIN * streamed.seconds else streamed
    hw = Hardware.of(target)
    it = dtype.itemsize
    if tensor_core_gemv is None:  # the default: from GEMV_MMA_MIN_ROWS rows, unless the environment says
        setting = os.environ.get(GEMV_MMA_VARIABLE, "")
        gemv_mma_rows = (0, 0) if setting == "0" else (2, GEMV_ROWS) if setting == "1" else (GEMV_MMA_MIN_ROWS,
                                                                                           GEMV_ROWS)
    else:
        gemv_mma_rows = (2, GEMV_ROWS) if tensor_core_gemv else (0, 0)
    kernel, found = _kernel_candidates(target, M, N, K, dtype, batch, split_k, hw, gemv_mma_rows, bool(batched_tiles))
    if split_k and K % split_k and kernel not in ("gemv", "gemv_mma"):
        # a given split of unequal chunks of ⌈K/S⌉: the kernels of whole K tiles need K tiles dividing them
        chunk = -(-K // split_k)
        found = [(p, plan) for p, plan in found if kernel != "cuda" and chunk % plan.bk == 0]
        if not found:
            raise ScheduleError(f"split_k={split_k} does not divide K={K}: its chunks of ⌈K/split_k⌉ = {chunk} are "
                                f"not whole K tiles of the {kernel} kernel (chunks of unequal length are summed by "
                                f"the GEMV kernel, at most {GEMV_ROWS} rows, and by the tensor cores in whole K "
                                "tiles); take a divisor of K, or leave split_k unset for the default's chunks")
    best: GemmChoice | None = None
    unsplit: GemmChoice | None = None
    uneven: GemmChoice | None = None
    for params, plan in found:
        if plan.resident == 0:
            continue
        # batched products split only on the GEMV kernel (decoding attention: few, long products)
        gemv = kernel in ("gemv", "gemv_mma")
        most = GEMV_MAX_SPLIT if gemv else MAX_SPLIT
        splits = ([split_k] if split_k else [1] if batch > 1 and kernel != "gemv"
                  else _splits(K, plan.bk, most) or [1])
        more: list[tuple[int, int]] = []
        if not split_k and unequal_chunks and (batch == 1 or kernel == "gemv"):
            # a GEMV's partial products are few rows: up to GEMV_MAX_SPLIT chunks; a tensor-core
            # GEMM's up to a chunk per SM, the model weighing their round trip
            more = [(s, c) for s, c in tile_chunks(K, plan.bk, most if gemv else hw.sms)
                    if s not in splits]
        for split, chunk in [(s, -(-K // s)) for s in splits] + more:
            group = raster_group(M, N, chunk, it, plan.bm, hw.l2_bytes) if kernel == "wgmma" else 1
            sized = replace(plan, tiles=batch * split * -(-M // plan.bm) * -(-N // plan.bn),
                            steps=-(-chunk // plan.bk), group=group)
            chosen = {**params, "group": group} if group > 1 else params
            t = gemm_seconds(sized, target, M, N, K, batch, split, out_bytes)
            if kernel == "gemv":  # whole register tiles where no K tile crosses into the next chunk
                chosen = {**params, "whole": split == 1 or chunk % plan.bk == 0}
            if (split, chunk) in more:
                if uneven is None or t < uneven.seconds:
                    uneven = GemmChoice(kernel, chosen, split, t, chunk if chunk != -(-K // split) else 0)
                continue
            if best is None or t < best.seconds:
                best = GemmChoice(kernel, chosen, split, t)
            if split == 1 and (unsplit is None or t < unsplit.seconds):
                unsplit = GemmChoice(kernel, chosen, 1, t)
    if best is not None and uneven is not None and uneven.seconds < SPLIT_MARGIN * best.seconds:
        # chunks of unequal length (a GEMV over a prime K had no split and 17 blocks: 1×4097×4093 at
        # 0.04× torch; a tensor-core GEMM of one tile, 61×61×8191, 0.30×), only for a clear gain over
        # the chunks of one length
        best = uneven
    if best is None:
        raise ScheduleError(f"no {kernel} GEMM tile fits one block of {target.name} ({M}×{N}×{K})")
    if kernel not in ("gemv", "gemv_mma") and unsplit is not None and best.seconds > SPLIT_MARGIN * unsplit.seconds:
        # the second kernel's cost is an estimate: split only for a clear gain (a GEMV streams B with
        # few warps when unsplit: every measured GEMV was faster split, gemv_variants-20261127-*.json)
        best = unsplit
    else:
        chunk = best.chunk or -(-K // best.split)
        if kernel == "cuda" and chunk % best.params["bk"]:  # a given split: K tiles that divide its chunks
            best = replace(best, params={**best.params, "bk": math.gcd(chunk, best.params["bk"])})
    if kernel == "wgmma" and not best.chunk and tma_fits(best.params, M, N, K, it, batch, best.split):
        best = replace(best, params={**best.params, "producer": "tma"})
        if calibrated:
            best = _calibrated_tiles(target, best, M, N, K, batch, out_bytes, hw)
        lines = line_operands(M, N, K, it) if best.split == 1 and batch == 1 else ""
        if lines:
            best = replace(best, params={**best.params, "lines": lines})
    if (kernel == "wgmma" and batch == 1 and not split_k
            and (tail_split_default() if tail_split is None else tail_split)):
        rows = tail_split_choice(target, best, M, N, K, dtype, out_bytes)
        if rows is not None and rows.seconds < SPLIT_MARGIN * wgmma_seconds(target, best.params, M, N, K, 1, 1, K,
                                                                            out_bytes):
            best = rows
    if (STAGED_ODD_STORES if staged_stores is None else staged_stores) and batch == 1 and best.tail is None:
        best = staged_stores_choice(target, best, N, K, it, out_bytes, results=M * N)  # batched: not yet measured
    if (WIDE_ONE_STEP if wide_gemv is None else wide_gemv) and batch == 1 and not split_k:
        best = wide_one_step(best, M, N, K, it, hw.sms)
    return best


def wide_one_step(choice: GemmChoice, M: int, N: int, K: int, itemsize: int, sms: int) -> GemmChoice:
    """The direct GEMV of one K step in blocks that leave one on each of ``sms`` SMs (``one_step_gemv``, B
    up to ``WIDE_ONE_STEP_BYTES``) for an unsplit staged float32 GEMV whose K tile does not divide K
    (``WIDE_ONE_STEP``'s measurements); ``choice`` otherwise."""
    p = choice.params
    if choice.kernel != "gemv" or choice.split != 1 or itemsize != 4 or p.get("direct") or K % p["bk"] == 0:
        return choice
    one = one_step_gemv(M, N, K, itemsize, WIDE_ONE_STEP_BYTES, sms)
    return choice if one is None else replace(choice, params=one)


def staged_stores_choice(target: CUDATarget, choice: GemmChoice, N: int, K: int, itemsize: int, out_bytes: int,
                         granule: int = 4, overlay: bool | None = None, results: int | None = None) -> GemmChoice:
    """``choice`` with its results staged in shared memory and copied out by the threads (store="staged")
    where it is an unsplit tensor-core product of 16-bit results in rows not a multiple of ``granule``
    bytes (4: only 2-byte aligned, an odd N): overlaid on an operand's shared tiles where ``overlay``
    (None: ``STAGED_OVERLAY``) and one is at least the staging tile's size (rows padded by 16 bytes),
    else in a tile of its own, the pipeline's stages fewer if they would not fit beside it; at least
    ``STAGED_LEAST_RESULTS`` ``results`` (None: any); ``choice`` otherwise."""
    if choice.kernel not in ("wgmma", "mma") or choice.split != 1 or out_bytes != 2 or N * out_bytes % granule == 0:
        return choice
    if results is not None and results < STAGED_LEAST_RESULTS:
        return choice
    p = choice.params
    stage = p["bm"] * (p["bn"] + 16 // out_bytes) * out_bytes
    pad = 8 if choice.kernel == "mma" else 0  # mma.sync's operand rows padded by 8 elements
    stages = p["stages"]
    operands = stages * max(p["bm"] * (p["bk"] + pad), p["bk"] * (p["bn"] + pad)) * itemsize  # A's or B's tiles
    if (STAGED_OVERLAY if overlay is None else overlay) and operands >= stage:
        return replace(choice, params={**p, "store": "staged overlaid"})
    while stages > 2 and stages * ((p["bm"] + p["bn"]) * (p["bk"] + pad)) * itemsize + stage > target.shared_per_block:
        stages -= 1
    inflight = min(p.get("inflight", 0), max(0, stages - 2))
    params = {**p, "stages": stages, **({"inflight": inflight} if "inflight" in p else {}), "store": "staged"}
    return replace(choice, params=params)


def _calibrated_tiles(target: CUDATarget, choice: GemmChoice, M: int, N: int, K: int, batch: int, out_bytes: int,
                      hw: Hardware) -> GemmChoice:
    """The warpgroup-MMA tiles TMA loads (``tma_fits``, 256×128 among them) ranked by the calibrated
    model (``wgmma_seconds``) at ``choice``'s split: its fastest, or ``choice`` (the wave model's).
    Measured on an H200 (2026-11-29, ``benchmarks/wgmma_defaults.py``, 71 suite, off-suite and random
    GEMMs whose default the model changed, µs against the wave model's pick, torch in the same run):
    the TMA-loaded tiles it re-ranked 1.05× faster (geometric mean of 25; 4416×1256×1636 59.8 against
    91.9, 1560×4896×1382 89.3 against 140.3, 2168×960×1032 14.4 against 18.8; slowest 0.89×). Its
    splits (fewer chunks than the wave model's: 0.94×, 1368×128×4400 0.84×) and the tiles of
    operands read in pieces by the threads' copies (0.49× at 8×177×1492×52, a model calibrated on TMA
    loads) are not taken: the wave model keeps those."""
    split = choice.split
    chunk = -(-K // split)
    best, best_t = choice, wgmma_seconds(target, choice.params, M, N, K, batch, split, chunk, out_bytes)
    for params, plan in _wgmma_candidates(M, N, K, 2, hw, tall=True):
        if plan.resident == 0 or not tma_fits(params, M, N, K, 2, batch, split):
            continue
        group = raster_group(M, N, chunk, 2, params["bm"], hw.l2_bytes)
        chosen = {**params, **({"group": group} if group > 1 else {}), "producer": "tma"}
        t = wgmma_seconds(target, chosen, M, N, K, batch, split, chunk, out_bytes)
        if t < best_t:
            best, best_t = replace(choice, params=chosen, seconds=t), t
    return best


# "A", "B" or "AB": the default's unsplit warpgroup-MMA products loaded by TMA copy these operands, where
# their rows are not whole lines of ``LINE_BYTES``, into rows that are (``line_operands``); "" (the
# default): none. Measured on an H200 (benchmarks/results/row_strides-20261129-0535-h200-700bffc.json,
# fp16, the same 200 tiles of 128×192): 5096×840×4216 (rows of 8432 and 1680 bytes) 103.3 µs, ×896×4224
# (whole lines) 78.4; B copied (``/rows128B``, the copy in the time) 85.5, ×840×4224 86.1 → 83.3; A copied
# too 106.6 (43 MB). Off until measured on more shapes, small products among them (the copy's share)
LINE_ROWS_VARIABLE = "POLYTILE_LINE_ROWS"
LINE_ROWS_DEFAULT = ""
LINE_BYTES = 128


def line_operands(M: int, N: int, K: int, itemsize: int, which: str | None = None) -> str:
    """The operands (of ``which``, by default ``POLYTILE_LINE_ROWS`` or ``LINE_ROWS_DEFAULT``) whose rows
    are not whole ``LINE_BYTES`` lines: A's rows are K long, B's N."""
    which = os.environ.get(LINE_ROWS_VARIABLE, LINE_ROWS_DEFAULT) if which is None else which
    rows = {"A": K, "B": N}
    return "".join(x for x in "AB" if x in which.upper() and rows[x] * itemsize % LINE_BYTES)


def tail_split_default() -> bool:
    """Whether the default GEMM considers splitting the rows of its last wave: ``TAIL_SPLIT_DEFAULT`` unless
    the environment variable ``POLYTILE_TAIL_SPLIT`` is "0" or "1" (the A/B switch)."""
    setting = os.environ.get(TAIL_SPLIT_VARIABLE, "")
    return setting == "1" if setting in ("0", "1") else TAIL_SPLIT_DEFAULT


def tail_split_choice(target: CUDATarget, whole: GemmChoice, M: int, N: int, K: int, dtype: DType,
                      out_bytes: int = 4, head_rows: int | None = None, tail_split_k: int | None = None
                      ) -> GemmChoice | None:
    """An unsplit warpgroup-MMA product ``whole`` (``gemm_choice``'s) whose block tiles fill some whole
    waves of the GPU and then a last one that leaves multiprocessors idle, with its rows split in two
    (``ops.matmul.matmul_tail_split_func``): the rows of the whole waves' tiles (``head_rows``; by
    default as many rows of ``whole``'s tiles as the whole waves hold) as ``whole``'s kernel over all
    of K, the rest as a product of their own whose tiles and split of K (chunks of whole K tiles,
    ``gemm_chunks``; ``tail_split_k`` chunks, or by default the fastest of 1 to ``TAIL_MAX_SPLIT``) fill
    the SMs, then a kernel that writes the head's rows and sums the tail's chunks into the output.
    Each product predicted by the calibrated model (``wgmma_seconds``), plus the combination's traffic
    (``tail_combine_seconds``); None where there is no partial last wave, or a tail shorter than
    ``TAIL_MIN_ROWS`` rows."""
    if whole.kernel != "wgmma" or whole.split != 1 or whole.tail is not None:
        return None
    hw = Hardware.of(target)
    it = dtype.itemsize
    if head_rows is None:
        bm, bn = whole.params["bm"], whole.params["bn"]
        wave = hw.sms * max(1, occupancy(WgmmaConfig.of(whole.params, out_bytes), hw, it).blocks)
        columns, tiles = -(-N // bn), -(-M // bm) * -(-N // bn)
        if tiles <= wave or tiles % wave == 0:
            return None
        head_rows = tiles // wave * wave // columns * bm
    tail_rows = M - head_rows
    if head_rows <= 0 or tail_rows < TAIL_MIN_ROWS:
        return None
    head_t = wgmma_seconds(target, whole.params, head_rows, N, K, 1, 1, K, out_bytes)
    key = (hw, head_rows, tail_rows, N, K, it, out_bytes, tail_split_k)
    if key not in _TAILS:  # the tuning template asks for each configuration of the head's tiles
        _TAILS[key] = _tail_choice(target, hw, head_rows, tail_rows, N, K, it, out_bytes, tail_split_k)
    tail = _TAILS[key]
    if tail is None:
        return None
    return replace(whole, seconds=head_t + tail.seconds, tail=TailSplit(head_rows, tail))


_TAILS: dict[tuple[object, ...], GemmChoice | None] = {}


def _tail_choice(target: CUDATarget, hw: Hardware, head_rows: int, tail_rows: int, N: int, K: int, it: int,
                 out_bytes: int, tail_split_k: int | None) -> GemmChoice | None:
    """The tail's tiles and split of ``tail_split_choice``, its seconds those of the tail's product and the
    combination."""
    tail: GemmChoice | None = None
    for params, plan in _wgmma_candidates(tail_rows, N, K, it, hw, tall=True):
        if plan.resident == 0:
            continue
        for want in [tail_split_k] if tail_split_k else range(1, TAIL_MAX_SPLIT + 1):
            split, chunk = gemm_chunks(K, params["bk"], want)
            if tail_split_k and split != tail_split_k:
                continue
            length = chunk or -(-K // split)
            group = raster_group(tail_rows, N, length, it, params["bm"], hw.l2_bytes)
            chosen = {**params, **({"group": group} if group > 1 else {}),
                      **({"producer": "tma"} if tma_fits(params, tail_rows, N, K, it, 1, split) else {})}
            # the tail's partial sums are combined with the head's rows, not summed by a kernel of their own
            t = (wgmma_seconds(target, chosen, tail_rows, N, K, 1, split, length, 4)
                 - split_seconds(target, tail_rows, N, 1, split, 4)
                 + tail_combine_seconds(target, head_rows, tail_rows, N, split, out_bytes))
            if tail is None or t < tail.seconds:
                tail = GemmChoice("wgmma", chosen, split, t, chunk)
    return tail


def tail_split_schedule(choice: GemmChoice, M: int, N: int, K: int, dtype: str, out_dtype: str) -> Schedule:
    """The schedule of ``choice``'s row split (``tail_split_choice``): the head's rows ``H`` as ``choice``'s
    kernel, the tail's chunks ``P`` as its own choice (one chunk a blockIdx.z), the output ``C`` a thread
    per element (``sum_partials``). Operands whose rows allow no asynchronous copy are copied aligned
    by each product (its own footprint: A's rows once, B twice)."""
    from .matmul import matmul_tail_split_func
    split = choice.tail
    if split is None:
        raise ScheduleError("tail_split_schedule: the choice has no row split (tail_split_choice makes one)")
    tail = split.tail
    sched = Schedule(matmul_tail_split_func(M, N, K, dtype, split.head_rows, tail.split, out_dtype,
                                            tail.chunk or None))
    _gemm_schedule(replace(choice, tail=None), sched, "H", None)
    _gemm_schedule(tail, sched, "P", "s")
    sum_partials(sched, "C")
    return sched


def wgmma_seconds(target: CUDATarget, params: dict[str, int], M: int, N: int, K: int, batch: int, split: int,
                  chunk: int, out_bytes: int) -> float:
    """The warpgroup-MMA default's prediction of ``params`` by the calibrated model
    (``tune.analytical.predict``, the analytical tuner's: threads' copy issue, unswizzled tiles,
    prologue, tail wave; the chunks of a split as a batch of shorter products plus their sum) with
    the loads it will build: TMA where ``tma_fits`` (chunks of one length), the threads' copies
    otherwise. The wave model alone (``gemm_seconds``) ranked tiles by their waves and missed their
    costs: measured on an H200 (2026-11-29, benchmarks/gemm_configs.py, fp16, µs, torch in the same
    run), 6000×600×3000 in 128×128 tiles 74.1 (predicted 40 by the wave model, 68 by this one),
    in 256×128 54.9 (this model: 54; torch 45.3)."""
    tma = tma_fits(params, M, N, K, 2, batch, split)
    cfg = WgmmaConfig.of({**params, **({"producer": "tma"} if tma else {})}, out_bytes)
    shape = GemmShape(M, N, chunk, batch * split)
    return predict(shape, cfg, target) + split_seconds(target, M, N, batch, split, out_bytes)


def tma_fits(params: dict[str, int], M: int, N: int, K: int, itemsize: int, batch: int = 1, split: int = 1) -> bool:
    """Whether the default warpgroup-MMA GEMM loads its tiles with TMA (``producer="tma"``): a
    product (batched ones through 3-D tensor maps, one batch per box; a split one in chunks of whole
    K tiles, which no box crosses) whose rows of A and B are multiples of 16 bytes as the kernel
    reads them
    (TMA needs 16-byte row strides: in place, or the aligned copy of rows that are only 2-byte
    aligned, GPT-2's vocabulary of 50257) and at least one tile long each way (whole 128-byte
    swizzled tiles).
    Measured on an H200 against the same tiles with cp.async (bf16, benchmarks/tma_gemm.py): 4096³
    0.191 ms instead of 0.235 (0.91× torch instead of 0.74×), 2048×6144×4096 0.145 instead of 0.183,
    2048×28672×4096 0.965 instead of 0.941 (both 0.62×: bound by the order of the blocks, not the
    copies); a producer warpgroup (``specialize=True``) measured the same as one issuing thread."""
    return (not _in_pieces(K * itemsize) and not _in_pieces(N * itemsize)
            and M >= params["bm"] and N >= params["bn"] and K >= params["bk"])


def _in_pieces(row_bytes: int) -> bool:
    """Whether the default GEMM reads rows of ``row_bytes`` in place in 4- or 8-byte pieces (rows of
    16-byte multiples are read whole; 2-byte aligned ones are copied 16-byte aligned first:
    ``align_operands`` with granule 4), which TMA cannot do and which take more copy instructions."""
    return row_bytes % 16 != 0 and row_bytes % 4 == 0


def wgmma_gemm_config(M: int, N: int, K: int, *, target: CUDATarget) -> dict[str, int]:
    """The warpgroup-MMA tiles ``gemm_choice`` picks for an unsplit M × N × K 16-bit product on
    ``target`` (its SMs, shared memory and bandwidth), for at least ``GEMV_ROWS`` + 1 rows (fewer
    stream on the CUDA cores)."""
    if not _wgmma(target):
        raise ScheduleError(f"{target.name} ({target.arch}) has no warpgroup MMA (wgmma): its GEMMs take "
                            "mma.sync or the CUDA cores (gemm_choice)")
    params = gemm_choice(target, max(M, GEMV_ROWS + 1, MMA_M16N8K16.shape[0] + 1), N, K, float16, split_k=1).params
    return {k: v for k, v in params.items() if k != "lines"}  # the tiles (the copies are the schedule's)


def align_operands(sched: Schedule, out: str, operands: tuple[str, ...] = ("A", "B"), granule: int = 16) -> list[str]:
    """Give each operand whose rows are not a multiple of ``granule`` bytes an aligned copy in global
    memory (rows rounded up to 16 bytes, zeros past the end; one copy kernel each): the kernels then
    load every tile with 16-byte asynchronous copies. Without it, rows of an odd number of 16-bit
    columns are copied element by element, synchronously, and the unrolled copies spill the
    accumulators (measured: 4095×4097×1023 fp16 in 3.8 ms, cuBLAS 0.24 ms). With ``granule`` = 4,
    rows that allow 4- or 8-byte asynchronous copies are read in place. A ``granule`` above 16 bytes
    (128: whole cache lines, an experiment of ``benchmarks/gemm_configs.py``'s ``/rows128``) rounds the
    copies' rows up to it. Returns the operands copied."""
    done = []
    for name in operands:
        t = sched.func.tensor(name)
        row = t.shape[-1]
        vec = max(16, granule) // t.dtype.itemsize
        if not hasattr(row, "value") or int(row.value) * t.dtype.itemsize % granule == 0:  # type: ignore[attr-defined]
            continue
        sched[out].cache(name, None, loc="global", name=_cache_name(sched, f"{name}_aligned", out),
                         whole=(1,) * (len(t.shape) - 1) + (vec,))
        done.append(name)
    return done


def _gemm_schedule(choice: GemmChoice, sched: Schedule, out: str, batch: str | tuple[str, ...] | None,
                   a: str = "A", b: str = "B") -> None:
    fn = {"wgmma": gemm_wgmma, "mma": gemm_tensorcore, "cuda": gemm_cuda, "gemv": gemv_cuda,
          "gemv_mma": gemv_mma}[choice.kernel]
    params = dict(choice.params)
    lines = str(params.pop("lines", ""))
    if lines:  # operands copied into rows of whole 128-byte lines first (``line_operands``)
        align_operands(sched, out, tuple({"A": a, "B": b}[x] for x in lines), granule=LINE_BYTES)
    if choice.kernel in ("wgmma", "mma", "gemv", "gemv_mma"):
        # rows that allow no asynchronous copy at all (2-byte aligned) are copied aligned first; 4- and
        # 8-byte aligned rows are read in place in pieces of that width; a direct GEMV reads B in place,
        # and A too where its K loop is one step (its few rows are loaded once: no pipeline to feed)
        direct = bool(choice.params.get("direct"))
        one_step = direct and choice.params["bk"] >= int(sched.func.tensor(a).shape[-1].value)  # type: ignore[attr-defined]
        align_operands(sched, out, () if one_step else (a,) if direct else (a, b), granule=4)
    fn(sched, out, a, b, batch=batch, **params)  # type: ignore[operator]


def matmul(sched: Schedule, target: CUDATarget, M: int, N: int, K: int, split_k: int | None = None
           ) -> Schedule | None:
    """The default GEMM (``gemm_choice``); a split reduction restructures the algorithm into partial
    products over the chunks of K and their sum (``ops.matmul_func``)."""
    choice = gemm_choice(target, M, N, K, sched.func.tensor("A").dtype, split_k=split_k,
                         out_bytes=sched.func.tensor("C").dtype.itemsize)
    return gemm_as(sched, choice, M, N, K, split_k)


def pads_output(choice: GemmChoice, M: int, N: int, out_bytes: int, least: int | None = None) -> bool:
    """Whether the default GEMM computes its output in padded rows and copies it out
    (``padded_output``): an unsplit tensor-core product of 16-bit results whose rows are only 2-byte
    aligned (an odd N), at least ``least`` results (by default ``PADDED_OUTPUT_ELEMENTS``; 0: never)."""
    least = PADDED_OUTPUT_ELEMENTS if least is None else least
    return (bool(least) and M * N >= least and out_bytes == 2 and N % 2 == 1 and choice.split == 1
            and choice.kernel in ("wgmma", "mma"))


def padded_output(choice: GemmChoice, M: int, N: int, K: int, dtype: str, out_dtype: str) -> Schedule:
    """An M × N × K product on the tensor cores as ``choice`` in rows of whole 16-byte vectors
    (``ops.matmul.matmul_padded_func``): B copied with N rounded up (zeros), the product into the
    padded rows (16-byte stores of exchanged accumulators), then the output copied out, a thread per
    element (a warp's stores contiguous). Two kernels more, and the output's bytes twice more,
    against stores of one element spread over 8 rows an instruction."""
    from .matmul import matmul_padded_func
    sched = Schedule(matmul_padded_func(M, N, K, dtype, out_dtype))
    padded = {k: v for k, v in choice.params.items() if k != "store"}  # rows of 16-byte vectors: not staged
    _gemm_schedule(replace(choice, params=padded), sched, "Cp", None, b="Bp")
    for name, (i, j) in (("Bp", ("k", "j")), ("C", ("i", "j"))):
        st = sched[name]
        st.fuse(i, j, "x").split("x", 256, "bx", "tx").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    return sched


def batch_matmul(sched: Schedule, target: CUDATarget, batch: int, M: int, N: int, K: int,
                 split_k: int | None = None) -> Schedule | None:
    choice = gemm_choice(target, M, N, K, sched.func.tensor("A").dtype, batch=batch, split_k=split_k,
                         out_bytes=sched.func.tensor("C").dtype.itemsize)
    return gemm_as(sched, choice, M, N, K, split_k, batch)


def gemm_as(sched: Schedule, choice: GemmChoice, M: int, N: int, K: int, split_k: int | None = None,
            batch: int | None = None) -> Schedule | None:
    """Schedule an M × N × K product's ``sched`` (a matmul's, or with ``batch`` a batch_matmul's, its
    batch loop "bb"; the operands' layouts as the caller's algorithm has them) as ``choice``
    (``gemm_choice``'s, or one the tuning templates make of a configuration: the same code for the
    same choice); a split the algorithm does not have (``split_k``: its own) returns the split
    algorithm's schedule, and so does an unbatched product whose output ``pads_output`` (the padded
    product's: ``padded_output``)."""
    from .matmul import batch_matmul_func, matmul_func
    dt, out = sched.func.tensor("A").dtype.name, sched.func.tensor("C").dtype.name
    if choice.tail is not None:
        if batch is not None or split_k is not None:
            raise ScheduleError("a GEMM's row split for its last wave (tail_split) is of unbatched products "
                                "whose split_k is unset")
        return tail_split_schedule(choice, M, N, K, dt, out)
    if batch is None and split_k is None and pads_output(choice, M, N, sched.func.tensor("C").dtype.itemsize):
        return padded_output(choice, M, N, K, dt, out)
    if batch is not None:
        return _scheduled(choice, sched, split_k, "bb", lambda s, ch: batch_matmul_func(batch, M, N, K, dt, s, out, ch))
    return _scheduled(choice, sched, split_k, None, lambda s, ch: matmul_func(M, N, K, dt, s, out, ch))


def gemm_chunks(K: int, bk: int, split: int) -> tuple[int, int]:
    """A split of K into about ``split`` chunks of whole K tiles of ``bk`` (``tile_chunks``' rule:
    ⌈T/split⌉ of the T = ⌈K/bk⌉ tiles each, the last chunk ending at K) as (chunks, length of each
    but the last, 0 when it is ⌈K/chunks⌉: ``GemmChoice.chunk``); (1, 0) where it leaves one chunk."""
    if split <= 1:
        return 1, 0
    tiles = -(-K // bk)
    length = -(-tiles // split) * bk
    count = -(-K // length)
    return (1, 0) if count < 2 else (count, length if length != -(-K // count) else 0)


def _scheduled(choice: GemmChoice, sched: Schedule, split_k: int | None, batch: str | None,
               split_func: Callable[[int, int | None], object]) -> Schedule | None:
    """Apply ``choice`` to ``sched``, or to a schedule of the split algorithm ``split_func(chunks, length)``
    when the choice splits an algorithm that is not split (returned: it replaces ``sched``)."""
    if choice.split == 1:
        _gemm_schedule(choice, sched, "C", batch)
        return None
    if batch and choice.kernel != "gemv":
        raise ScheduleError(f"a batched product's reduction is split only on the GEMV kernel (at most {GEMV_ROWS} "
                            f"rows); its {choice.kernel} kernel takes one batch loop: leave split_k unset")
    split = sched if split_k else Schedule(split_func(choice.split, choice.chunk or None))  # type: ignore[arg-type]
    _gemm_schedule(choice, split, "P", (batch, "s") if batch else "s")  # type: ignore[arg-type]
    sum_partials(split, "C", batch=batch)
    return split if split is not sched else None


def dense(sched: Schedule, target: CUDATarget, M: int, N: int, K: int) -> None:
    gemm_cuda(sched, "XW", "X", "W", b_transposed=True)
    ep = sched["Y"]
    ep.fuse("i", "j").split("ij", 256, "bx", "tx").bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")


ROW_THREADS = (32, 64, 128, 256, 512, 1024)
"""The blocks of whole warps a row operator's row may take (one row a block)."""

ROW_LANES = (1, 2, 4, 8, 16, 32)
"""The threads a narrow row may take, several rows a block (``RowPlan.rows``): an aligned part of a
warp, whose lanes reduce the row by shuffles among themselves."""

SEVERAL_ROWS = 256
"""Rows of at most this many elements take several rows a block by default (``row_plan``). Measured on
an H200 (2026-11-28, ``benchmarks/narrow_rows.py --variants``,
``benchmarks/results/narrow_rows-20261128-1720-h200.json``): softmax of 65536×32 0.27× torch one row a
block, 1.12× 8 rows of 16 lanes; 8192×64 0.67× → 1.05×; 4096×128 0.90× → 1.07×; 16384×256 0.88× →
0.95×; at 512 one row a block stays ahead (1.07× against 0.92–1.06×)."""

NARROW_ROW = 512
"""Rows of at most this many elements are offered parts of a warp and several rows a block by the
tuning templates (``tune/templates/cuda_rows.py``)."""

ROW_BLOCK = 128
"""The threads of a block of narrow rows (``_narrow_rows``): on the H200, blocks of 128 threads were
within 3% of the best of 64–512 at every narrow width measured (the same record)."""


def _row_threads(n: int) -> int:
    """Threads per row for row-wise kernels: one warp up to 2K elements and four warps up to 8K
    (measured on an H100); wider rows (vocabulary rows, 30K–128K) take a whole block of 1024 threads,
    so that a row's loads are in flight together."""
    return 32 if n <= 2048 else 128 if n <= 8192 else 1024


def _row_lanes(n: int) -> int:
    """Threads of a narrow row (several a block): the most lanes of ``ROW_LANES`` with two elements of
    the row each, at least (rows of 7 elements: 4 lanes; 20: 8; 32: 16; 64 and wider: a warp). Measured
    on the H200 against a lane an element: 100000×20 1.05× against 0.82× torch, 65536×32 1.12× against
    0.92× (``SEVERAL_ROWS``'s record)."""
    return max(t for t in ROW_LANES if t <= max(-(-n // 2), 1))


def _narrow_rows(target: CUDATarget, M: int, lanes: int) -> int:
    """Rows of ``lanes`` threads a block: ``ROW_BLOCK`` threads, fewer rows where the blocks would
    not give each of the target's SMs one (few rows)."""
    rows = max(1, ROW_BLOCK // lanes)
    while rows > 1 and -(-M // rows) < target.sms:
        rows //= 2
    return rows


ROW_CLUSTERS_VARIABLE = "POLYTILE_ROW_CLUSTERS"
"""The environment's switch of the default row split over a cluster (``row_cluster``): "1" on, "0"
off (one block a row, as before); unset, ``ROW_CLUSTERS_DEFAULT``."""

ROW_CLUSTERS_DEFAULT = True
"""Whether the default schedules split few wide rows over the blocks of a cluster (``row_cluster``).
Measured on an H200 (2026-11-28, ``benchmarks/row_clusters.py``, ``row_clusters-20261128-2017-h200.json``;
µs, one block a row → the rule's split, torch): softmax 32×128256 65.3 → 34.0 (4 blocks; 2: 42.2, 8: 37.7;
torch 49.1), 1×128256 58.6 → 17.8 (44.6), 8×50257 23.4 → 14.3 (21.6), 4×128257 60.2 → 19.9, bf16 16×128256
57.8 → 22.1 (38.9); layernorm 16×128256 72.5 → 22.2, 1×50257 24.1 → 13.9, 3×12345 11.8 → 11.6; all correct.
Where it lost, softmax 64×32000 (16.5 with the row in shared memory → 18.1 over 2 blocks):
``SHARED_ROW_SPLIT``."""

SHARED_ROW_SPLIT = 4
"""The fewest blocks a row is split over where one block holds the row in shared memory (``row_fits``):
the split reads it from global memory in each pass (the later ones from L2), which more SMs than
twice as many repay (the same record: 64×32000 over 2 blocks 0.91× of one block a row; 8×50257 over 8
1.64×, 3×12345 over 8 as fast)."""

CLUSTER_ROW = 8192
"""Rows wider than this (those of a block of 1024 threads: ``_row_threads``) may be split over a
cluster; narrower rows' blocks are short, and few rows of them take little time."""

CLUSTER_SLICE = 16
"""A block of a cluster takes a slice of its row that is a multiple of this many elements, so that
the slices start as aligned as the row does (16-byte reads: ``vec``)."""


def cluster_slice(N: int, blocks: int) -> int:
    """The elements of a row of ``N`` each of a cluster's ``blocks`` blocks takes (the last one the
    rest): ⌈N/blocks⌉ rounded up to ``CLUSTER_SLICE``."""
    return -(-N // (blocks * CLUSTER_SLICE)) * CLUSTER_SLICE


def row_cluster(target: CUDATarget, M: int | None, N: int, itemsize: int = 4) -> int:
    """The blocks that split each of ``M`` rows (None: many) of ``N`` elements of ``itemsize`` bytes, a
    cluster a row: one block a row (1) on targets without clusters, for rows of at most ``CLUSTER_ROW``
    elements, and where the rows give half the target's SMs a block already; else the most blocks, a
    power of two up to the target's cluster, that keep the row's blocks within the SMs (one wave of
    blocks, each in its own SM, all the SMs' memory pipes busy: 32 rows on an H100's 132 SMs, 4 blocks
    a row; 1 to 16 rows, 8) — at least ``SHARED_ROW_SPLIT`` where one block holds the row in shared
    memory, else one block a row."""
    if not target.has("clusters") or M is None or N <= CLUSTER_ROW:
        return 1
    blocks = 1
    while 2 * blocks <= target.max_cluster_blocks and 2 * blocks * M <= target.sms:
        blocks *= 2
    return 1 if blocks < SHARED_ROW_SPLIT and row_fits(target, N, itemsize) else blocks


def row_clusters_default() -> bool:
    """Whether the default schedules take ``row_cluster``'s split (``ROW_CLUSTERS_VARIABLE``)."""
    setting = os.environ.get(ROW_CLUSTERS_VARIABLE, "")
    return ROW_CLUSTERS_DEFAULT if setting not in ("0", "1") else setting == "1"


def row_fits(target: CUDATarget, n: int, itemsize: int, rows: int = 1) -> bool:
    """Whether a block's ``rows`` rows (and the reductions' scratch) fit in its shared memory."""
    return rows * n * itemsize + 4096 <= target.shared_per_block


@dataclass(frozen=True)
class RowPlan:
    """How a row operator's blocks compute their rows: ``threads`` along a row, ``rows`` rows a block
    (each its own ``threads`` lanes, a part of a warp: ``ROW_LANES``; the rows along threadIdx.y, their
    statistics in registers); whether the block's rows are read once into shared memory
    (``shared_row``; else each pass reads them from global memory, the later passes mostly from the
    L1 or L2 cache); ``vec``: the adjacent elements of a row each thread reads together, into registers
    (one 16-byte load each where the rows are 16-byte aligned: ``combine_loads``; rows read from
    global memory); ``cluster``: the blocks of a thread-block cluster that split a row, each its
    ``slice`` of it (``cluster_slice``; the rows along blockIdx.y, the slices along threadIdx.z run as
    the cluster's blocks: ``Stage.cluster``), their partial statistics combined through distributed
    shared memory (one pass over the row in device memory, the later passes mostly from L2)."""

    threads: int
    shared_row: bool
    rows: int = 1
    vec: int = 1
    cluster: int = 1
    slice: int = 0


def row_plan(target: CUDATarget, op: str, N: int, itemsize: int, threads: int | None = None,
             shared_row: bool | None = None, M: int | None = None, rows: int | None = None,
             vec: int = 1, cluster: int | None = None) -> RowPlan:
    """The plan of a row operator ``op`` over ``M`` rows (None: many) of ``N`` elements of ``itemsize``
    bytes: the given choices, the defaults for those left None — rows of at most ``SEVERAL_ROWS``
    ``_row_lanes`` threads each, ``_narrow_rows`` a block, read from global memory; wider ones one a
    block of ``_row_threads`` (at most the target's block), the row in shared memory where it fits
    (``row_fits``), one element a read (``vec``); few wide rows split over a cluster's blocks where
    ``row_clusters_default`` (``row_cluster``), else one block a row. ScheduleError for a choice the
    block cannot take."""
    if cluster is None:
        cluster = row_cluster(target, M, N, itemsize) if row_clusters_default() and rows in (None, 1) else 1
    if cluster != 1:
        return _cluster_plan(target, op, N, itemsize, threads, shared_row, rows, vec, cluster)
    narrow = N <= SEVERAL_ROWS
    if threads is None:
        threads = _row_lanes(N) if narrow else min(_row_threads(N), target.max_threads_per_block)
    if rows is None:
        rows = _narrow_rows(target, M if M is not None else target.sms * ROW_BLOCK, threads) \
            if narrow and threads in ROW_LANES else 1
    if shared_row is None:
        shared_row = rows == 1 and vec == 1 and row_fits(target, N, itemsize)
    plan = RowPlan(threads, shared_row, rows, vec)
    if vec not in (1, 2, 4, 8, 16) or vec * itemsize > 16 or vec > 1 and shared_row:
        raise ScheduleError(f"{op}: {vec} elements a read of {itemsize} bytes each: a power of two, at most 16 bytes, "
                            "from rows read from global memory (shared_row=False)")
    if rows < 1 or rows > 1 and threads not in ROW_LANES:
        raise ScheduleError(f"{op}: {rows} rows a block of {threads} threads each; several rows a block take "
                            f"{', '.join(map(str, ROW_LANES))} threads each (a part of a warp)")
    if rows > 1 and threads > -(-N // vec):
        raise ScheduleError(f"{op}: {threads} threads a row of {N} elements, {vec} a read, several rows a block: a "
                            "row's lanes would shrink to its reads; take at most as many threads as it has")
    if threads not in ROW_LANES + ROW_THREADS or threads * rows > target.max_threads_per_block:
        raise ScheduleError(f"{op}: {threads} threads per row; a row takes a part of a warp "
                            f"({', '.join(map(str, ROW_LANES))} threads) or a block of whole warps, at most "
                            f"{target.max_threads_per_block} threads a block (here {rows} rows)")
    if plan.shared_row and not row_fits(target, N, itemsize, rows):
        what = "a row of" if rows == 1 else f"{rows} rows of"
        raise ScheduleError(f"{op}: {what} {N} × {itemsize} bytes {'does' if rows == 1 else 'do'} not fit in shared "
                            f"memory on {target.name} ({target.shared_per_block} bytes a block, 4096 kept for the "
                            "reductions); use shared_row=False (the row read from global memory by each pass)")
    return plan


def _cluster_plan(target: CUDATarget, op: str, N: int, itemsize: int, threads: int | None, shared_row: bool | None,
                  rows: int | None, vec: int, cluster: int) -> RowPlan:
    """``row_plan``'s plan of rows split over ``cluster`` blocks each: blocks of whole warps
    (``_row_threads`` of the row by default), one row a block, read from global memory."""
    if not target.has("clusters"):
        raise ScheduleError(f"{op}: a row split over {cluster} blocks of a cluster; the target ({target.key}) has no "
                            "clusters (sm_90 and newer): leave cluster at 1")
    if not 1 < cluster <= target.max_cluster_blocks:
        raise ScheduleError(f"{op}: a row split over {cluster} blocks; a cluster holds 2 to "
                            f"{target.max_cluster_blocks} blocks on {target.key}")
    if threads is None:
        threads = min(_row_threads(N), target.max_threads_per_block)
    part = cluster_slice(N, cluster)
    if -(-N // part) != cluster:
        raise ScheduleError(f"{op}: a row of {N} elements split over {cluster} blocks leaves one without its slice "
                            f"({part} elements each, multiples of {CLUSTER_SLICE}); split a wider row or over fewer")
    if threads not in ROW_THREADS or threads > target.max_threads_per_block:
        raise ScheduleError(f"{op}: {threads} threads a block of a cluster; take a block of whole warps "
                            f"({', '.join(map(str, ROW_THREADS))}), at most {target.max_threads_per_block}")
    if rows not in (None, 1) or shared_row:
        raise ScheduleError(f"{op}: a row split over a cluster takes one row a block, read from global memory "
                            "(rows=1, shared_row=False)")
    if vec not in (1, 2, 4, 8, 16) or vec * itemsize > 16:
        raise ScheduleError(f"{op}: {vec} elements a read of {itemsize} bytes each: a power of two, at most 16 bytes")
    if threads * vec > part:
        raise ScheduleError(f"{op}: {threads} threads of {vec} elements a read for a slice of {part} elements: the "
                            "block would shrink to its slice's reads; take fewer threads or fewer blocks")
    return RowPlan(threads, False, 1, vec, cluster, part)


def _row_loops(sched: Schedule, name: str, plan: RowPlan) -> tuple[str, ...]:
    """Split computation ``name``'s row loop into blocks of ``plan.rows`` (bound to blockIdx.x and
    threadIdx.y); its row loops, outermost first."""
    if plan.rows == 1:
        return ("i",)
    sched[name].split("i", plan.rows, "io", "ii")
    return ("io", "ii")


def _row_threads_split(sched: Schedule, name: str, axis: str, plan: RowPlan) -> None:
    """Split computation ``name``'s loop ``axis`` along a row over the threads (``{axis}t``, bound to
    threadIdx.x), each thread's steps along the row (``{axis}o``) and, with ``plan.vec``, the adjacent
    elements a thread reads together (``{axis}v``, innermost)."""
    loops = _row_loops(sched, name, plan)
    st = sched[name]
    steps, slices = axis, []
    if plan.cluster > 1:  # the row's slices (``{axis}c``, the cluster's blocks), each split as a row
        steps, slices = f"{axis}s", [f"{axis}c"]
        st.split(axis, plan.slice, f"{axis}c", steps)
    if plan.vec > 1:
        st.split(steps, plan.vec, f"{axis}a", f"{axis}v")
        steps = f"{axis}a"
    st.split(steps, plan.threads, f"{axis}o", f"{axis}t")
    st.reorder(*loops, *slices, f"{axis}t", f"{axis}o", *([f"{axis}v"] if plan.vec > 1 else []))
    st.bind(f"{axis}t", "threadIdx.x")
    if slices:
        st.bind(slices[0], "threadIdx.z").cluster()


def _row_reduction(sched: Schedule, name: str, axis: str, plan: RowPlan) -> None:
    sched[name].reassociate()
    _row_threads_split(sched, name, axis, plan)


def _row_elementwise(sched: Schedule, name: str, plan: RowPlan) -> None:
    _row_threads_split(sched, name, "j", plan)


def _row_vectors(sched: Schedule, plan: RowPlan, reads: list[tuple[str, str, list[str]]]) -> None:
    """With ``plan.vec``: each thread's ``vec`` adjacent elements of X in registers, copied together,
    for each (computation, its loop along the row's steps, the computations fused with it that read
    them too) of ``reads``."""
    if plan.vec > 1:
        for name, loop, also in reads:
            sched[name].cache_identity("X", loop, loc="local", also=also)


def _row_blocks(sched: Schedule, name: str, plan: RowPlan) -> str:
    """Bind the first computation's row loops to the blocks (and the rows of a block to threadIdx.y;
    rows split over a cluster: to blockIdx.y, the cluster's blocks along x); the loop the others
    share with it (a row)."""
    if plan.cluster > 1:
        sched[name].bind("i", "blockIdx.y").cluster()
        return "i"
    if plan.rows == 1:
        sched[name].bind("i", "blockIdx.x")
        return "i"
    sched[name].bind("io", "blockIdx.x").bind("ii", "threadIdx.y")
    return "ii"


def _row_shared(sched: Schedule, plan: RowPlan, first: str, also: list[str], stats: tuple[str, str]) -> None:
    """The block's rows in shared memory (``plan.shared_row``), read by ``first`` and ``also``; the rows'
    statistics ``stats`` in shared memory next to the row (one row a block: its threads are the
    block's), in registers with several rows a block (each thread keeps its row's)."""
    if plan.shared_row:
        sched[first].cache_identity("X", "i" if plan.rows == 1 else "io", loc="shared", also=also)
    for stat in stats:
        if plan.rows == 1:
            sched[stat].store_at("i").set_loc("shared")
        else:
            sched[stat].store_at("ii").set_loc("local")


def softmax(sched: Schedule, target: CUDATarget, M: int, N: int, threads: int | None = None,
            shared_row: bool | None = None, rows: int | None = None, vec: int = 1, cluster: int | None = None) -> None:
    """One block per row, or several narrow rows a block (``row_plan``): a wide row is read once into
    shared memory (when it fits; a wider row is read from global memory by each pass, the later
    passes mostly from L2), then max and sum are reduced across the row's threads and the output
    written (exp recomputed rather than stored); few wide rows each split over a cluster's blocks,
    their maxima and sums combined across the cluster. ``threads``, ``shared_row``, ``rows``, ``vec``
    and ``cluster``: the tuning template's choices (``row_plan``)."""
    plan = row_plan(target, "softmax", N, sched.func.tensor("X").dtype.itemsize, threads, shared_row, M, rows, vec,
                    cluster)
    sched["ex"].compute_inline()
    _row_reduction(sched, "mx", "j1", plan)
    row = _row_blocks(sched, "mx", plan)
    _row_reduction(sched, "sm", "j2", plan)
    sched["sm"].after(sched["mx"], row)
    _row_elementwise(sched, "Y", plan)
    sched["Y"].after(sched["sm"], row)
    _row_shared(sched, plan, "mx", ["sm", "Y"], ("mx", "sm"))
    _row_vectors(sched, plan, [("mx", "j1o", []), ("sm", "j2o", []), ("Y", "jo", [])])


def layernorm(sched: Schedule, target: CUDATarget, M: int, N: int, threads: int | None = None,
              shared_row: bool | None = None, rows: int | None = None, vec: int = 1,
              cluster: int | None = None) -> None:
    """One block per row, or several narrow rows a block, as for softmax (``row_plan``): the row's first
    element (its shift, ``x0``) read by every thread, both moments of the shifted row reduced across the
    row's threads in one pass over the row (few wide rows: over a cluster's blocks, each block's
    moments of the same shift combined across the cluster), then the normalized row written.
    ``threads``, ``shared_row``, ``rows``, ``vec`` and ``cluster``: the tuning template's choices
    (``row_plan``)."""
    plan = row_plan(target, "layernorm", N, sched.func.tensor("X").dtype.itemsize, threads, shared_row, M, rows,
                    vec, cluster)
    _row_loops(sched, "x0", plan)
    row = _row_blocks(sched, "x0", plan)
    _row_reduction(sched, "s1", "j1", plan)
    sched["s1"].after(sched["x0"], row)
    _row_reduction(sched, "s2", "j2", plan)
    sched["s2"].after(sched["s1"], "j1o")  # both moments in one pass over the row
    _row_elementwise(sched, "Y", plan)
    sched["Y"].after(sched["s2"], row)
    _row_shared(sched, plan, "s1", ["s2", "Y"], ("x0", "s1", "s2"))
    _row_vectors(sched, plan, [("s1", "j1o", ["s2"]), ("Y", "jo", [])])


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
           stride: int, padding: int, dilation: int) -> Schedule | None:
    """NCHW convolutions whose GEMM takes the CUDA cores (float32 operands: ``gemm_choice``) run as one
    implicit GEMM (``ops.conv.conv2d_gemm_func``: the K × C·R·S filter times the gathered C·R·S × N·P·Q
    input) on ``gemm_cuda``'s tiles and split of the reduction, chosen for the product's shape as a
    matmul's (``gemm_choice``): the filter and input tiles are gathered by the shared tiles' copies,
    then one small kernel writes O (summing the split's chunks). Before, every convolution was
    direct — 128 pixels a block, 8 channels a thread, the reduction in one thread: ResNet-50's
    1×1 C1024→256 on 14×14 in 199 µs and 3×3 512→512 on 7×7 in 584 µs on an H100 (0.22× and
    0.28× cuDNN), few blocks and long serial sums. Other operand types (tensor-core GEMMs) and
    convolutions of at most ``GEMV_ROWS`` filters stay direct (``conv2d_direct``)."""
    from .conv import conv_out
    P, Q = conv_out(H, R, stride, padding, dilation), conv_out(W, S, stride, padding, dilation)
    choice = gemm_choice(target, K, N * P * Q, C * R * S, sched.func.tensor("I").dtype, unequal_chunks=False)
    if choice.kernel != "cuda":
        conv2d_direct(sched, N, K)
        return None
    return conv2d_gemm(sched, choice, N, C, H, W, K, R, S, stride, padding, dilation)


def conv2d_gemm(sched: Schedule, choice: GemmChoice, N: int, C: int, H: int, W: int, K: int, R: int, S: int,
                stride: int, padding: int, dilation: int) -> Schedule:
    """The implicit GEMM of an NCHW convolution (``sched``'s) on ``gemm_cuda`` as ``choice`` (tiles and
    an even split of the reduction: ``conv2d``'s, or a tuning template's)."""
    from .conv import conv2d_gemm_func
    dtype, out = sched.func.tensor("I").dtype, sched.func.tensor("O").dtype
    gemm = Schedule(conv2d_gemm_func(N, C, H, W, K, R, S, stride, padding, dilation, dtype.name, out.name,
                                     choice.split))
    if choice.split > 1:
        gemm_cuda(gemm, "P", "A", "B", batch="s", **choice.params)
    else:
        gemm_cuda(gemm, "G", "A", "B", **choice.params)
    gemm["A"].compute_inline()  # after caching: the tiles' copies gather the filter and the input
    gemm["B"].compute_inline()
    st = gemm["O"]
    st.fuse("n", "k", "nk").fuse("p", "q", "pq").fuse("nk", "pq", "x").split("x", 256, "bx", "tx")
    st.bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    return gemm


def conv2d_direct(sched: Schedule, N: int, K: int) -> None:
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
