"""The default implicit-GEMM convolution's kernel, tiles and split (``igemm_choice``), as the analytical
model predicts them fastest: what ``gpu_schedules.conv2d_igemm`` and the convolution tuning templates
schedule.

The kernel (``igemm_kernel``): warpgroup MMA where the target has ``wgmma`` and the swizzled tiles
fit, else mma.sync, or the CUDA cores for fewer channels than a tensor-core K step. Among the block
tiles (``igemm_tiles``) and the splits of the reduction over filter rows and channel chunks
(``igemm_splits``), ``igemm_options`` ranks by the model's wave quantization, counting each block's
gathered input tile where the target's gather rate is known; ``igemm_choice`` keeps the usual tiles
and the unsplit kernel unless the model predicts a clear gain (``TILE_MARGIN``, ``SPLIT_MARGIN``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import ScheduleError
from ..intrinsics import MMA_M16N8K16
from ..target import CUDATarget
from ..tune.analytical import LOADED_LATENCY, BlockPlan, Hardware, TileConfig, WgmmaConfig, gemm_seconds, occupancy
from .split_rules import MAX_SPLIT, SPLIT_MARGIN

MMA_K = MMA_M16N8K16.shape[2]  # the K extent of one tensor-core instruction (16, as wgmma.m64nNk16's)
# other implicit-GEMM tiles than ``igemm_kernel``'s are chosen when predicted at least 15% faster
TILE_MARGIN = 0.85


def _gemm_tiles(M: int, N: int) -> dict[str, int]:
    """Block and warp tiles for a tensor-core GEMM of M × N outputs (the implicit-GEMM convolutions'):
    128×128 tiles when the matrix gives every multiprocessor several blocks, 64×64 otherwise."""
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


def igemm_rows_tiles(M: int, K: int, run: int) -> tuple[dict[str, int], int]:
    """``igemm_rows``' block and warp tiles and K tile for M pixels, K filters and filter rows of
    ``run`` padded taps × channels: ``_gemm_tiles``' (128×32 for at most 32 filters), K tiles of 32
    where they divide the run, else of 16."""
    return (_gemm_tiles(M, K) if K > 32 else dict(bm=128, bn=32, wm=32, wn=32)), (32 if run % 32 == 0 else MMA_K)


def igemm_kernel(target: CUDATarget, M: int, C: int, K: int, tap_count: int) -> tuple[str, dict[str, int]]:
    """The implicit GEMM's kernel — "cuda" for fewer channels than a tensor-core K step or one pixel, "wgmma" where
    the target has it and the swizzled tiles fit (64 channels and filters, more than 16 pixels), else
    "mma" — and the
    tensor-core kernels' parameters: 64-row wgmma tiles for at most 64 pixels; a pipeline no deeper
    than the K loop (``tap_count`` taps × channel tiles): deeper stages only take shared memory, and
    with it resident blocks (a 1×1 convolution of 64 channels is one K step: 4 stages held one
    block of 128×128 per SM). ``igemm_choice`` then picks among tiles and splits where the target's
    gather rate is known (``igemm_tiles``)."""
    if C < MMA_K or M == 1:  # one pixel: no rows for the tensor cores' tiles (their loop of one step is gone)
        return "cuda", {}
    # swizzled tiles need 64 channels and filters; a warpgroup's warps more than one 16-row tile of pixels
    # (16 pixels: the warps' loop of one iteration is gone, and wgmma cannot be bound)
    if target.has("wgmma") and min(C, K) >= 64 and M > 16:
        kernel, params = "wgmma", wgmma_igemm_config(M, K, sms=target.sms)
        if M <= 64:
            params["bm"] = 64
    else:
        # K tiles of 16 channels for 16 (MobileNet-v2's expansions: 32 would copy and multiply zeros)
        bk = MMA_K if C <= MMA_K else 32
        kernel, params = "mma", dict(bk=bk, stages=3, reg_stages=2 if bk > MMA_K else 1, **_gemm_tiles(M, K))
    return kernel, no_deeper(params, tap_count * -(-C // params["bk"]))


def igemm_tiles(kernel: str, M: int, C: int, K: int) -> list[dict[str, int]]:
    """The block tiles ``igemm_choice`` weighs for an implicit GEMM of M pixels, C channels and K
    filters on ``kernel``: for warpgroup MMA 128 or 64 rows × 128 or 64 filters (tiles no taller or
    wider than the matrix needs: 96→160 channels in 2 tiles of 128 filters rather than 3 of 64,
    each of which gathers the same input tile again); for mma.sync ``igemm_kernel``'s tiles in K
    tiles of 32 channels, or of 16 where the channels are an odd multiple of 16 (48: 32-channel
    tiles would copy and multiply a third zeros, and no split into channel chunks is whole).
    Measured on an H200 (``benchmarks/conv_choices.py``, 2026-11-28): 48→72 channels, 5×5 stride 2
    on 2×64×64, 64×64 tiles: 25.1 µs unsplit in K tiles of 32, 13.7 µs in tiles of 16 split over
    the filter rows (cuDNN 12.3); 128×128 tiles 16.3 µs; MobileNet-v2's 1×1 144→24 at batch 32:
    38.5 µs in K tiles of 32, 41.8 in tiles of 16, 64×32 tiles no faster."""
    out = []
    if kernel == "wgmma":
        for bm in (128, 64):
            for bn in (128, 64):
                # no wider than the filters (a 128-wide tile over 96 or 112 filters is cut to them, and
                # wgmma's 128-byte swizzled rows need whole 64-element tiles of the filter)
                if (bm > 64 and M <= 64) or (bn > 64 and K < bn):
                    continue
                out.append(dict(bm=bm, bn=bn, bk=64, stages=4, inflight=1))
        return out
    bks = [MMA_K] if C <= MMA_K else [32, MMA_K] if C % 32 == MMA_K else [32]
    return [dict(bk=bk, stages=3, reg_stages=2 if bk > MMA_K else 1, **_gemm_tiles(M, K)) for bk in bks]


def no_deeper(params: dict[str, int], steps: int) -> dict[str, int]:
    """``params`` with a pipeline no deeper than a K loop of ``steps`` steps (and the wgmma groups
    left in flight that its stages allow: inflight + 2 at most)."""
    stages = max(1, min(params["stages"], steps))
    out = dict(params, stages=stages)
    if "inflight" in params:
        out["inflight"] = min(params["inflight"], max(0, stages - 2))
    return out


def channel_chunk(C: int, chunks: int, bk: int) -> int:
    """The channels of each of ``chunks`` channel chunks but the last (which ends at C): all C for one
    chunk, else ⌈T/chunks⌉ of the T = ⌈C/bk⌉ K tiles of ``bk`` channels (whole tiles; C/chunks where
    that divides into whole tiles)."""
    tiles = -(-C // bk)
    return C if chunks == 1 else -(-tiles // chunks) * bk


def chunk_steps(C: int, R: int, S: int, bk: int, rows: bool, chunks: int) -> int:
    """The K loop's steps of a chunk of an implicit GEMM's split reduction: its taps × its channels'
    K tiles (the longest chunk's)."""
    return (S if rows else R * S) * -(-channel_chunk(C, chunks, bk) // bk)


def igemm_splits(C: int, R: int, S: int, bk: int, uneven: bool = False) -> list[tuple[bool, int]]:
    """The splits of an implicit GEMM's reduction (R·S taps × C channels in K tiles of ``bk``
    channels) that ``igemm_choice`` considers, as (one chunk per filter row, channel chunks): (False, 1)
    (none), one chunk per filter row over all the channels (the channel tail a partial K tile, as
    unsplit), and channel chunks of the same number of whole K tiles, the last ending at C within its
    last tile (``channel_chunk``: 2×12×12, 280 → 112 channels, 7×7 at batch 2: 10 tiles and no split
    of whole 64-channel tiles, 0.37× torch on an H200), at least two K steps a chunk, at most
    ``MAX_SPLIT`` chunks. A last chunk of fewer K tiles than the others only where the chunk's K loop
    is its channel tiles alone (one filter row of one tap: the channel-padded rows' runs, ``S`` = 1):
    where the taps and the channel tiles form one K loop it computed wrong numbers (H200, c239e5e:
    280 in 192 + 88 channels, 7×7; 264 in 160 + 104, 7×7; 200 in 64 + 64 + 64 + 8, 3×3: the products
    of a tile wholly past C, never copied, read the previous tile's data). ``tensorize`` now skips
    them (3d037d1; ``tests/cuda/test_split_tails_gpu.py::test_uneven_channel_chunks_in_a_fused_k_loop``
    passed on an H200 at 920a2b8). ``uneven`` offers them: correct, but mostly far slower (H200,
    ``benchmarks/worst_shapes.py`` at 89b8efd, µs uneven / default): 2×12×12, 280 → 112, 7×7 19.2 / 26.0;
    1×8×8, 200 → 24, 3×3 348.8 / 9.9; 1×15×15, 112 → 48 78.2 / 10.5; 16×8×8, 144 → 48, 7×7 538.4 / 25.8;
    16×8×8, 256 → 63, 5×5/2 474.7 / 18.3; 1×8×8, 264 → 461, 7×7/2 325.6 / 39.2 — not understood (the
    guarded K steps of the short chunk?), so they stay out of the defaults."""
    out = [(False, 1)]
    tiles = -(-C // bk)
    for rows in ((False, True) if R > 1 else (False,)):
        for chunks in range(1, tiles + 1):
            split = (R if rows else 1) * chunks
            # no chunk empty; as many K tiles in each as in the others unless the K loop is the tiles alone
            fits = (chunks - 1) * channel_chunk(C, chunks, bk) < C if uneven or (rows and S == 1) \
                else tiles % chunks == 0
            if split > 1 and fits and split <= MAX_SPLIT and chunk_steps(C, R, S, bk, rows, chunks) >= 2:
                out.append((rows, chunks))
    return out


@dataclass(frozen=True)
class IgemmChoice:
    """A default implicit-GEMM schedule: the kernel ("wgmma", "mma" or "cuda"), its parameters, the
    split of the reduction (one chunk per filter row: ``rows``; ``chunks`` channel chunks) and the
    model's predicted seconds."""

    kernel: str
    params: dict[str, int]
    rows: bool = False
    chunks: int = 1
    seconds: float = 0.0


def igemm_choice(target: CUDATarget, M: int, C: int, K: int, R: int, S: int, itemsize: int, pixels: int | None = None,
                 out_bytes: int = 4, split: bool = True, uneven: bool = False) -> IgemmChoice:
    """The implicit GEMM's default schedule: the first of ``igemm_options``, unless it leaves
    ``igemm_kernel``'s tiles for a predicted gain under ``TILE_MARGIN`` (the model's tiles are
    calibrated on few measurements; most layers have been measured with those tiles): then the best
    of those tiles; and where the gather rate is modeled, a split only for a clear gain over the
    best unsplit kernel (its tiles by the same rule among the unsplit kernels: a split not chosen
    leaves the tiles as they were without it; ``SPLIT_MARGIN``, as ``gemm_choice``'s: the second
    kernel's cost is an estimate). ``split`` False: that unsplit kernel; ``uneven``: as
    ``igemm_splits``."""
    sms = Hardware.of(target).sms
    # a split only of tiles that leave SMs idle: 32×34×34, 440 → 140, 3×3/2 (290 tiles of 64×128) split
    # over the filter rows took 107 µs, unsplit 69 (H200, the model 66 against 78)
    options = [o for o in igemm_options(target, M, C, K, R, S, itemsize, pixels, out_bytes, uneven)
               if (not o.rows and o.chunks == 1) or -(-M // o.params["bm"]) * -(-K // o.params["bn"]) < sms]
    tiles = igemm_kernel(target, M, C, K, R * S)[1]

    def usual_unless_clearly_slower(found: list[IgemmChoice]) -> list[IgemmChoice]:
        usual = [o for o in found if tiles and all(o.params[k] == tiles[k] for k in ("bm", "bn", "bk"))]
        return usual if usual and found[0].seconds > TILE_MARGIN * usual[0].seconds else found

    best = usual_unless_clearly_slower(options)[0]
    unsplit = next(iter(usual_unless_clearly_slower([o for o in options if not o.rows and o.chunks == 1])), best)
    if not split or (Hardware.of(target).gather_bytes_per_cycle and best.seconds > SPLIT_MARGIN * unsplit.seconds):
        return unsplit
    return best


def split_option(target: CUDATarget, kernel: str, params: dict[str, int], M: int, K: int, reduction: int,
                 split: int, steps: int, itemsize: int, out_bytes: int, reads: float | None) -> IgemmChoice | None:
    """The model's seconds of an implicit GEMM of M pixels × K filters over ``reduction`` products a
    pixel, on ``kernel`` ("wgmma" or "mma") with ``params``' tiles, its reduction in ``split`` chunks
    of ``steps`` K steps (``igemm_options``, ``igemm_rows_choice``), as an unsplit choice (its
    pipeline no deeper than the K loop where unsplit; the caller sets the split). None where no block
    fits. ``reads``: the DRAM reads of input and filter, where the target's gather rate is modeled
    (None elsewhere: no gather counted, as that target's split rule was calibrated)."""
    hw = Hardware.of(target)
    modeled = reads is not None
    bm, bn, bk = params["bm"], params["bn"], params["bk"]
    chosen = no_deeper(params, steps)
    # the split's pipeline as built (no deeper than its K loop); unmodeled targets keep the
    # unsplit kernel's depth in the model, as their split rule was calibrated
    stages = chosen["stages"] if modeled else params["stages"]
    if kernel == "wgmma":
        cfg: object = WgmmaConfig(bm, bn, bk, stages, chosen["inflight"])
        flops, lookahead = hw.wgmma_flops, max(1, stages - 1 - chosen["inflight"])
    else:
        cfg = TileConfig(bm, bn, bk, params["wm"], params["wn"], stages, params["reg_stages"])
        flops, lookahead = hw.mma_flops, max(1, stages - 1)
    resident = occupancy(cfg, hw, itemsize, gather=True).blocks  # type: ignore[arg-type]
    if resident == 0:
        return None
    tiles = -(-M // bm) * -(-K // bn)
    latency = 0.0
    if reads is not None:
        # a K tile's loads wait for the L2 where input and filter fit in half of it (the gather
        # reads each input pixel once per tap), else for DRAM; the copies run lookahead tiles
        # ahead; a step is no shorter than a thread's gathered copies (gather_copy_cycles)
        wait = hw.l2_latency if reads <= hw.l2_bytes / 2 else hw.dram_latency
        tile_bytes = (bm + bn) * bk * itemsize
        copies = -(-bm * bk * itemsize // (16 * cfg.threads))  # type: ignore[attr-defined]
        latency = max((LOADED_LATENCY * wait + tile_bytes / hw.sm_l2_bytes_per_cycle) / lookahead,
                      copies * hw.gather_copy_cycles)
    plan = BlockPlan(bm, bn, bk, tiles * split, steps, resident, flops, itemsize, stages,
                     step_latency=latency, gathered=bm * bk * itemsize if modeled else 0)
    t = gemm_seconds(plan, target, M, K, reduction, 1, split, out_bytes if modeled else 4, reads)
    return IgemmChoice(kernel, params if split > 1 else chosen, seconds=t)


def igemm_options(target: CUDATarget, M: int, C: int, K: int, R: int, S: int, itemsize: int, pixels: int | None = None,
                  out_bytes: int = 4, uneven: bool = False) -> list[IgemmChoice]:
    """The kernels, block tiles and splits of an implicit GEMM's reduction (R·S taps × C channels,
    ``igemm_splits``) fastest first, as the analytical model's wave quantization predicts them (``gemm_seconds``,
    as ``gemm_choice``'s; no margin for the split). Where the target's gather rate is known
    (``Hardware.gather_bytes_per_cycle``: sm_90) the model weighs the tiles of ``igemm_tiles`` and
    counts each block's gathered input tile, the K tiles its copies run ahead, and DRAM reads of the
    input (``pixels`` × C: N·H·W, M by default) and filter, not of the gathered matrix; elsewhere the
    tiles are ``igemm_kernel``'s and the reduction is split only when they leave half the SMs idle.
    Measured on an H100 (``benchmarks/conv_split_variants.py`` and the lead's probe, 2026-11-28):
    ResNet-50's 3×3 512→512 on 7×7 at batch 1, 8 tiles, 34.7 µs unsplit, 15.2 µs in 12 chunks (3
    filter rows × 4 channel chunks; cuDNN 15.7); 3×3 128→128 on 28×28, 14 tiles, 22.6 µs unsplit,
    12.6 µs in 6 chunks; at batch 32, 128×64 tiles (104 blocks) 45.9 µs unsplit, 50.3 in 2 chunks
    (two blocks an SM), 128×128 tiles in 2 chunks (104 blocks) 32.7 µs (cuDNN 20.4)."""
    hw = Hardware.of(target)
    kernel, default = igemm_kernel(target, M, C, K, R * S)
    if kernel == "cuda":
        return [IgemmChoice(kernel, default)]
    modeled = hw.gather_bytes_per_cycle > 0
    if not modeled and 2 * -(-M // default["bm"]) * -(-K // default["bn"]) >= hw.sms:
        return [IgemmChoice(kernel, default)]
    options: list[IgemmChoice] = []
    weighed = igemm_tiles(kernel, M, C, K) if modeled else [default]
    for params in weighed:
        bk = params["bk"]
        # K tiles that leave a channel tail split only where no other K tile divides the channels (48
        # channels: tiles of 16 split over the filter rows, measured; see igemm_tiles)
        tail = C % bk and any(C % p["bk"] == 0 for p in weighed)
        for rows, chunks in [(False, 1)] if tail else igemm_splits(C, R, S, bk, uneven):
            reads = (C * (pixels or M) + R * S * C * K) * itemsize if modeled else None
            option = split_option(target, kernel, params, M, K, R * S * C, (R if rows else 1) * chunks,
                                  chunk_steps(C, R, S, bk, rows, chunks), itemsize, out_bytes, reads)
            if option is not None:
                options.append(replace(option, rows=rows, chunks=chunks))
    if not options:
        raise ScheduleError(f"no {kernel} implicit-GEMM tile fits one block of {target.name} ({M}×{K}, {C} channels)")
    return sorted(options, key=lambda o: o.seconds)


def igemm_rows_choice(target: CUDATarget, M: int, K: int, R: int, run: int, itemsize: int, reads: int,
                      out_bytes: int = 4) -> IgemmChoice:
    """The default of a channel-padded implicit GEMM (``gpu_schedules.igemm_rows``: M pixels, K
    filters, R filter rows of ``run`` elements each): ``igemm_rows_tiles``' tiles on mma.sync, and
    where the target's gather rate is modeled the split of the R × run reduction (one chunk per filter
    row, and/or the runs in chunks of whole K tiles: ``igemm_splits`` with the run as the channels of
    one tap) the model predicts fastest, for a clear gain (``SPLIT_MARGIN``) over the unsplit kernel.
    ``reads``: the bytes of input and filter. Random shapes (seed 99391, H200): 313 → 22 channels,
    5×5 stride 2 on 1×14×14 — one 128×32 tile over 5 rows of 1600 — 102 µs unsplit (cuDNN 33)."""
    tiles, bk = igemm_rows_tiles(M, K, run)
    params = dict(bk=bk, stages=3, reg_stages=2 if bk > MMA_K else 1, **tiles)
    unsplit = IgemmChoice("mma", params)
    if not Hardware.of(target).gather_bytes_per_cycle:
        return unsplit
    options = []
    for rows, chunks in igemm_splits(run, R, 1, bk):
        option = split_option(target, "mma", params, M, K, R * run, (R if rows else 1) * chunks,
                              chunk_steps(run, R, 1, bk, rows, chunks), itemsize, out_bytes, reads)
        if option is not None:
            options.append(replace(option, rows=rows, chunks=chunks))
    if not options:
        return unsplit
    best = min(options, key=lambda o: o.seconds)
    alone = next(o for o in options if not o.rows and o.chunks == 1)
    return best if best.seconds < SPLIT_MARGIN * alone.seconds else replace(unsplit, seconds=alone.seconds)
