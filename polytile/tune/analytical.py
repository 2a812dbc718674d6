"""ALCOP's pipeline-aware analytical model: the time of a tensor-core GEMM-like kernel from its tiles.

The model follows Table I of ALCOP (Huang et al., MLSys 2023, §V "static analysis guided tuning")
as issue 5 summarizes it: thread-block batches from the occupancy limits, the latency of the
load–use loop with N_pipe stages and N_mplx co-resident thread blocks, inner (register-level)
pipeline fusion, LLC and DRAM load times, and the epilogue. The public ALCOP artifact
(github.com/hgyhungry/alcop-artifact) does not contain the model's code: its
``python/tvm/topi/exp_cuda/dense_tensorcore.py`` gives the space the model ranks (block warps, warp
tiles, chunk, ``smem_pipestage`` 2–6, ``regf_pipestage``) and its
``python/tvm/autotvm/tuner/fake_xgboost_tuner.py`` replays exhaustive logs to compare search
models. The formulas below are therefore written from the paper's description; every constant is a
hardware fact of the target (``CUDATarget``) or of the architecture table ``ARCH_FACTS``
(overridable through ``CUDATarget.extra``).

All times are in cycles of the SM clock until ``Estimate.seconds``.

**Occupancy** (N_mplx, blocks resident on one SM) = min over the limits

    shared:    shared_per_sm // (stages · (bm·(bk+8) + bk·(bn+8)) · itemsize + reserved_per_block)
    registers: (registers_per_sm // (regs_per_thread · 32)) // warps   (allocation per warp; an
               estimate: accumulators, fragments per register stage, copy addresses, 24 more)
    threads:   max_threads_per_sm // threads
    blocks:    max_blocks_per_sm

**Thread-block batches**: B = batch · ⌈m/bm⌉ · ⌈n/bn⌉ blocks run in ⌈B / (SMs · N_mplx)⌉ batches;
the last batch may hold fewer blocks per SM (and a small grid never fills the first).

**Inner load–use loop** (registers ← shared, one k16 step of one warp, on its SM sub-partition):

    t_mma = 2·wm·wn·16 / (tensor-core FLOP per cycle per SM / 4)
    L_s   = shared latency + (wm + wn)·16·itemsize / shared bytes per cycle
    step  = max(w · t_mma, L_s / (R − 1))      with R ≥ 2 register stages (and bk > 16)
    step  = max(w · t_mma, L_s + t_mma)        with R = 1 (each warp waits for its own loads)

where w is the number of warps per sub-partition (N_mplx · warps / 4, rounded up): the other warps
of a sub-partition fill a warp's wait. One outer iteration runs bk/16 steps: I = (bk/16) · step.
With inner pipeline fusion (ALCOP Fig. 3d) the register prologue is paid once per block, not once
per outer iteration.

**Outer load–use loop** (shared ← global, one bk chunk of every resident block; S = N_pipe stages):

    round = max(I(N_mplx), L_g / (S − 1), T_l2, T_dram, T_smem) + sync     with S ≥ 2
    round = max(I(N_mplx), L_g + I(1), T_l2, T_dram, T_smem) + sync        with S = 1

L_g is the load latency of a block's tile: the L2 latency, raised toward the DRAM latency by the miss
share, plus the tile's transfer through the SM's L2 port; T_l2 and T_dram the L2 and DRAM transfer
times of the round's bytes ((bm + bn)·bk·itemsize per block; DRAM sees the compulsory bytes when the
operands fit in half the L2, else every batch's distinct rows and columns); T_smem the
shared-memory bandwidth time of the round's ldmatrix reads and cp.async writes.

Every "max" above is ``overlap``: the largest term plus ``OVERLAP_LOSS`` (10%) of the others, since
overlap is never perfect (this also orders configurations whose largest terms tie).

**Batch** = prologue (L_g, plus L_s with register pipelining) + (K steps) · round + epilogue (the
float32 tile written back through DRAM). **Kernel** = sum over batches + launch overhead.

**Warpgroup MMA** (Hopper, ``WgmmaConfig``: ``gemm_wgmma``'s block tile bm × bn × bk, S shared
stages, f MMA groups left in flight) goes through the same batches and outer loop, with three
differences: a block's K tile is bm/64 warpgroups each issuing ``wgmma.m64n{bn}k16``, which read
their operands from shared memory, so

    compute  = resident blocks · 2·bm·bn·bk / (wgmma FLOP per cycle per SM)
    mma_wait = (one block's compute + wgmma latency) / (f + 1)    (a block waits for all but f groups)
    shared   = resident blocks · ((bm + (bm/64)·bn)·bk reads + (bm + bn)·bk copies) · itemsize / bandwidth

and the copies run S − 1 − f tiles ahead (L_g / (S − 1 − f); with none ahead, L_g plus a block's
compute). Tiles live unpadded (swizzled) in shared memory: S · (bm + bn) · bk · itemsize bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..target import CUDATarget
from .space import TuneError

# Per-architecture facts the target does not carry (approximate, from datasheets and published
# microbenchmarks). mma_flops: dense fp16/bf16 mma.sync FLOP per cycle per SM with float32
# accumulation (sm_90: the mma.sync path reaches about 63% of the wgmma peak of 4096); fma_flops:
# float32 FLOP per cycle per SM on the CUDA cores (two per fused multiply-add); wgmma_flops: dense
# fp16/bf16 warpgroup-MMA FLOP per cycle per SM (989 TFLOP/s on 132 SMs at 1.83 GHz); wgmma_latency:
# cycles from issuing a K tile's group to its completion (microbenchmarks of wgmma.m64nNk16 report
# on the order of a hundred cycles; 256 fits the waits of blocks that leave no group in flight in the
# H200 calibration of ``COPY_ISSUE_INSTRUCTIONS`` best: 128 left them 1.08× slower than predicted).
# Archs without the wgmma facts have no warpgroup MMA (``Hardware.wgmma_flops`` is 0).
# gather_bytes_per_cycle: the operand bytes one SM gathers per cycle for an implicit GEMM
# (``wave_cycles``); archs without it are not modeled so.
# sm_90: each zero-filling 16-byte copy of a gathered pixel's channels costs its thread the pixel's
# and tap's address arithmetic and bounds tests — 250 to 290 instructions per warp per K step of
# 128×64, 128×128 and 64×64 wgmma tiles in their SASS, at about 2 instructions per cycle per SM —
# so a 128-row tile of 64 channels (16 KiB) takes ~1,200 cycles of an SM whatever the filter tile.
# Measured on an H100 (ResNet-50's 3×3 512→512 on 7×7 at batch 32, lead's probe 2026-11-28): 0.62
# µs a K step for 128×64 and for 128×128 tiles, one block per SM; two 128×64 blocks on an SM (2
# channel chunks) took as long as one after the other (50.3 µs against 45.9 unsplit); its 3×3 64→64
# on 56×56 (784 blocks of 128×64, 2 per SM, 9 K steps) 31.6 µs, as 16 KiB / 14 B a cycle gives for
# its 53.5 block-steps per SM (the whole model, with its overlap and DRAM terms: 35.8 µs).
# gather_copy_cycles: one thread's gathered 16-byte copy in a K step (its dependent address
# arithmetic): a K step of a block is no shorter than its threads' copies (each copies 4 in the wgmma
# tiles: 954 cycles a step measured for 64×64 tiles of ResNet-50's 3×3 512→512 at batch 1, unsplit).
ARCH_FACTS: dict[str, dict[str, float]] = {
    "sm_80": dict(mma_flops=2048, l2_bytes_per_cycle=3400, sm_l2_bytes_per_cycle=64, l2_latency=260,
                  dram_latency=560, shared_latency=30, shared_bytes_per_cycle=128, fma_flops=128),
    "sm_86": dict(mma_flops=512, l2_bytes_per_cycle=2048, sm_l2_bytes_per_cycle=64, l2_latency=240,
                  dram_latency=520, shared_latency=30, shared_bytes_per_cycle=128, fma_flops=256),
    "sm_89": dict(mma_flops=512, l2_bytes_per_cycle=2560, sm_l2_bytes_per_cycle=64, l2_latency=240,
                  dram_latency=520, shared_latency=30, shared_bytes_per_cycle=128, fma_flops=256),
    "sm_90": dict(mma_flops=2560, l2_bytes_per_cycle=4000, sm_l2_bytes_per_cycle=64, l2_latency=270,
                  dram_latency=600, shared_latency=30, shared_bytes_per_cycle=128, fma_flops=256,
                  wgmma_flops=4096, wgmma_latency=256, gather_bytes_per_cycle=14,
                  gather_copy_cycles=240),
}
RESERVED_SHARED_PER_BLOCK = 1024  # the driver keeps 1 KiB of shared memory per resident block (sm_80+)
SYNC_CYCLES = 24                  # wait_group + __syncthreads per outer iteration
OVERLAP_LOSS = 0.1                # the share of the overlapped (non-maximal) terms that still shows
LAUNCH_SECONDS = 3e-6
# Warpgroup MMA's costs the terms above do not show, calibrated on an H200 (2026-11-28: 250 measured
# configurations of matmul_wgmma, random and model-ordered, over 4096³ fp16, 512×768×3072 fp16 and
# 1536×2304×1024 bf16 — without them the log-residuals regressed on each choice showed 32-wide K
# tiles 1.23× slower than predicted, the threads' copies 1.10× slower than TMA's, a TMA store 1.16×;
# with these values 1.09×, 0.99× and 0.96×, and Spearman's rho 0.985 / 0.939 / 0.956 per GEMM).
COPY_ISSUE_INSTRUCTIONS = 16       # warp instructions a 16-byte cp.async costs its warp (addresses, bounds)
UNSWIZZLED_BYTES_PER_CYCLE = 16    # wgmma's reads of an unswizzled operand (core matrices), per SM
TMA_STORE_BYTES_PER_CYCLE = 16     # a staged tile's TMA store, as its issuing thread waits for it
LOADED_LATENCY = 3.0              # a load's latency with the memory system busy, in idle latencies
WARP_FLOPS = 32.0                 # float32 FLOP per cycle one warp sustains (an FMA every other cycle)
STREAM_WARPS = 4.0                # resident warps per SM a streaming kernel (GEMV) needs to reach DRAM bandwidth


@dataclass(frozen=True)
class Hardware:
    """The facts of one GPU the model reads (cycles, bytes, bytes per cycle)."""

    sms: int
    clock_hz: float
    shared_per_sm: int
    shared_per_block: int
    registers_per_sm: int
    max_threads_per_sm: int
    max_threads_per_block: int
    max_blocks_per_sm: int
    mma_flops: float
    fma_flops: float
    shared_bytes_per_cycle: float
    l2_bytes_per_cycle: float
    sm_l2_bytes_per_cycle: float
    dram_bytes_per_cycle: float
    l2_bytes: int
    l2_latency: float
    dram_latency: float
    shared_latency: float
    wgmma_flops: float = 0.0
    wgmma_latency: float = 0.0
    gather_bytes_per_cycle: float = 0.0  # an implicit GEMM's gathered operand per SM (0: not modeled)
    gather_copy_cycles: float = 0.0  # one thread's gathered 16-byte copy, in its K step's critical path

    @staticmethod
    def of(target: CUDATarget) -> Hardware:
        """The facts of ``target``: its own fields, then the table of its architecture, then
        ``target.extra`` (which overrides the table, e.g. ``extra={"mma_flops": 1024}``)."""
        key = (target.arch, target.sms, target.clock_hz, target.shared_per_sm, target.shared_per_block,
               target.registers_per_sm, target.max_threads_per_sm, target.max_threads_per_block,
               target.max_blocks_per_sm, target.dram_bandwidth, target.l2_bytes, tuple(sorted(target.extra.items())))
        hw = _HARDWARE.get(key)
        if hw is None:
            arch = target.arch.rstrip("af")
            if arch not in ARCH_FACTS:
                arch = "sm_90" if target.capability >= 90 else "sm_80"
            facts = {**ARCH_FACTS[arch], **target.extra}
            hw = _HARDWARE[key] = Hardware(
                sms=target.sms, clock_hz=target.clock_hz, shared_per_sm=target.shared_per_sm,
                shared_per_block=target.shared_per_block, registers_per_sm=target.registers_per_sm,
                max_threads_per_sm=target.max_threads_per_sm,
                max_threads_per_block=target.max_threads_per_block,
                max_blocks_per_sm=target.max_blocks_per_sm, mma_flops=facts["mma_flops"],
                fma_flops=facts["fma_flops"],
                shared_bytes_per_cycle=facts["shared_bytes_per_cycle"],
                l2_bytes_per_cycle=facts["l2_bytes_per_cycle"],
                sm_l2_bytes_per_cycle=facts["sm_l2_bytes_per_cycle"],
                dram_bytes_per_cycle=target.dram_bandwidth / target.clock_hz, l2_bytes=target.l2_bytes,
                l2_latency=facts["l2_latency"], dram_latency=facts["dram_latency"],
                shared_latency=facts["shared_latency"], wgmma_flops=facts.get("wgmma_flops", 0.0),
                wgmma_latency=facts.get("wgmma_latency", 0.0),
                gather_bytes_per_cycle=facts.get("gather_bytes_per_cycle", 0.0),
                gather_copy_cycles=facts.get("gather_copy_cycles", 0.0))
        return hw


_HARDWARE: dict[tuple[object, ...], Hardware] = {}


@dataclass(frozen=True)
class GemmShape:
    """A tensor-core GEMM-like workload: ``batch`` products of (m × k_total) by (k_total × n) with 16-bit
    operands and float32 results. An implicit-GEMM convolution has ``taps`` filter taps of ``k``
    channels each (its K loop runs taps · ⌈k/bk⌉ steps) and reads only ``input_bytes`` of distinct
    operand data from DRAM (the gathered im2col matrix is never stored)."""

    m: int
    n: int
    k: int
    batch: int = 1
    taps: int = 1
    itemsize: int = 2
    input_bytes: float | None = None
    gather: bool = False  # the A tile's copies gather (implicit GEMM): more address registers

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k * self.taps

    def k_steps(self, bk: int) -> int:
        return self.taps * -(-self.k // bk)

    @property
    def operand_bytes(self) -> float:
        """Distinct operand bytes (DRAM's compulsory traffic)."""
        if self.input_bytes is not None:
            return float(self.input_bytes)
        return float(self.batch * self.itemsize * (self.m + self.n) * self.k * self.taps)


@dataclass(frozen=True)
class TileConfig:
    """A tensor-core schedule: block tile bm × bn × bk, warp tile wm × wn, shared-memory and register
    pipeline stages (``gemm_tensorcore``'s parameters)."""

    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int = 1
    reg_stages: int = 1

    @staticmethod
    def of(values: dict[str, object]) -> TileConfig:
        """The tiles of a configuration's values (by decision name)."""
        names = ("bm", "bn", "bk", "wm", "wn", "stages", "reg_stages")
        return TileConfig(**{k: int(values[k]) for k in names})  # type: ignore[call-overload]

    @property
    def warps(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def shared_bytes(self, itemsize: int = 2) -> int:
        """Operand tiles in shared memory, rows padded by 8 elements, one copy per stage."""
        return self.stages * (self.bm * (self.bk + 8) + self.bk * (self.bn + 8)) * itemsize

    def registers_per_thread(self, itemsize: int = 2, gather: bool = False) -> int:
        """An estimate: float32 accumulators, operand fragments of a k16 step per register stage
        (A: 4 registers per 16 rows, B: 2 per 8 columns), an address per 16-byte copy of a K tile
        (two for a gather) and 24 more; rounded to the allocation unit of 8. nvcc's counts on
        sm_90a are within about ±25% for GEMMs; convolutions can need more."""
        accumulators = self.wm * self.wn // 32
        fragments = (self.wm // 16) * 4 + (self.wn // 8) * 2
        copies = -(-(self.bm + self.bn) * self.bk * itemsize // (16 * self.threads))
        regs = accumulators + fragments * self.reg_stages + copies * (2 if gather else 1) + 24
        return -(-regs // 8) * 8

    # --- what ``estimate`` asks of a kind of schedule ---

    @property
    def lookahead(self) -> int:
        """K tiles the copies run ahead of the compute."""
        return self.stages - 1

    def check(self, hw: Hardware) -> None:
        check_tiles(self)

    def compute_cycles(self, hw: Hardware, resident: int, itemsize: int) -> float:
        """One K tile of ``resident`` blocks: the register-level load–use loop of all their warps."""
        return _inner_cycles(self, hw, resident * self.warps, itemsize)

    def shared_reads(self, itemsize: int) -> float:
        """Bytes one block reads from shared memory per K tile (ldmatrix of its warps' fragments)."""
        return self.warps * (self.bk // 16) * (self.wm + self.wn) * 16 * itemsize

    def wait_terms(self, hw: Hardware, itemsize: int) -> dict[str, float]:
        return {}

    def prologue_cycles(self, hw: Hardware) -> float:
        """Beyond the first tile's load: the first fragments' load with register pipelining."""
        return hw.shared_latency if self.reg_stages >= 2 and self.bk > 16 else 0.0

    def serial_cycles(self, resident: int, itemsize: int) -> float:
        return 0.0  # the copies' issue is in the mma.sync model's inner cycles

    def epilogue_cycles(self) -> float:
        return 0.0


@dataclass(frozen=True)
class WgmmaConfig:
    """A warpgroup-MMA schedule (Hopper): block tile bm × bn × bk, shared stages, MMA groups left in
    flight, rows of blocks launched together and persistent blocks (``gemm_wgmma``'s parameters)."""

    bm: int
    bn: int
    bk: int
    stages: int = 1
    inflight: int = 0
    group: int = 1
    persistent: int = 0  # blocks per SM looping over the tiles (0: a block a tile): at most that many resident
    staged: int = 0  # bytes of each result element staged in shared memory for a TMA store (0: none)
    tma: bool = False  # the tiles loaded by TMA (else by the MMA warps' own cp.async copies)

    @staticmethod
    def of(values: dict[str, object], out_bytes: int = 4) -> WgmmaConfig:
        """The configuration of a template's ``values`` (results of ``out_bytes`` bytes)."""
        names = ("bm", "bn", "bk", "stages", "inflight")
        return WgmmaConfig(**{k: int(values[k]) for k in names},  # type: ignore[call-overload]
                           group=int(values.get("group", 1) or 1),  # type: ignore[call-overload]
                           persistent=int(values.get("persistent", 0)),  # type: ignore[call-overload]
                           staged=out_bytes if values.get("store") == "tma" else 0,
                           tma=values.get("producer") == "tma")

    @property
    def warps(self) -> int:
        return self.bm // 16  # bm/64 warpgroups of 4 warps

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def shared_bytes(self, itemsize: int = 2) -> int:
        """Operand tiles in shared memory (unpadded: swizzled core-matrix layouts), one per stage, and
        a TMA store's staging tile."""
        return self.stages * (self.bm + self.bn) * self.bk * itemsize + self.bm * self.bn * self.staged

    def registers_per_thread(self, itemsize: int = 2, gather: bool = False) -> int:
        """An estimate: the float32 accumulator (bn/2 per thread) and 64 for addresses and counters."""
        return -(-(self.bn // 2 + 64) // 8) * 8

    @property
    def lookahead(self) -> int:
        return self.stages - 1 - self.inflight

    def check(self, hw: Hardware) -> None:
        if self.bm % 64 or self.bn % 8 or not 8 <= self.bn <= 256 or self.bk % 16:
            raise TuneError(f"tiles {self.bm}×{self.bn}×{self.bk} do not fit wgmma.m64nNk16 warpgroups")
        if not hw.wgmma_flops:
            raise TuneError("warpgroup MMA needs a Hopper GPU (sm_90a); this target has none")

    def compute_cycles(self, hw: Hardware, resident: int, itemsize: int) -> float:
        """The K tile's MMAs, the operand reads wgmma makes from unswizzled core matrices (a K or
        column tile that is no whole 128-byte row: ``tensorize`` lays those out unswizzled, read at
        ``UNSWIZZLED_BYTES_PER_CYCLE``), and the issue of the MMA warps' own copies (without TMA):
        the same warps, so not overlapped (``serial_cycles``)."""
        mma = 2.0 * self.bm * self.bn * self.bk / hw.wgmma_flops
        row = 128 // itemsize
        unswizzled = ((self.bm * self.bk if self.bk % row else 0)
                      + (self.bm // 64 * self.bn * self.bk if self.bn % row else 0)) * itemsize
        return resident * (mma + unswizzled / UNSWIZZLED_BYTES_PER_CYCLE)

    def serial_cycles(self, resident: int, itemsize: int) -> float:
        """Work of a K tile that the block's warps do between their waits, overlapped with nothing of
        their own: without TMA, the issue of their copies (16 bytes each, ``COPY_ISSUE_INSTRUCTIONS``
        warp instructions, four schedulers an SM)."""
        if self.tma:
            return 0.0
        return resident * (self.bm + self.bn) * self.bk * itemsize / 16 / 32 * COPY_ISSUE_INSTRUCTIONS / 4

    def shared_reads(self, itemsize: int) -> float:
        """Each warpgroup's wgmma reads its 64 rows of A and all of B's tile from shared memory."""
        return (self.bm + self.bm // 64 * self.bn) * self.bk * itemsize

    def epilogue_cycles(self) -> float:
        """A TMA store's wait: the thread that issues it waits until the staged tile is read
        (``TMA_STORE_BYTES_PER_CYCLE``), and the block only then retires or takes its next tile."""
        return self.bm * self.bn * self.staged / TMA_STORE_BYTES_PER_CYCLE

    def wait_terms(self, hw: Hardware, itemsize: int) -> dict[str, float]:
        """A block waits until at most ``inflight`` of its MMA groups run: per K tile, its own compute
        and the group latency, shared with the groups left in flight."""
        return {"mma_wait": (self.compute_cycles(hw, 1, itemsize) + hw.wgmma_latency) / (self.inflight + 1)}

    def prologue_cycles(self, hw: Hardware) -> float:
        """The first K tile shares the SM's L2 port with the other tiles the prologue loads ahead
        (16-bit operands: warpgroup MMA's)."""
        return max(0, self.stages - 2) * (self.bm + self.bn) * self.bk * 2 / hw.sm_l2_bytes_per_cycle


GemmSchedule = TileConfig | WgmmaConfig


@dataclass(frozen=True)
class Occupancy:
    """Thread blocks resident on one SM (N_mplx) and each limit that bounds it."""

    limits: dict[str, int]

    @property
    def blocks(self) -> int:
        return min(self.limits.values())

    @property
    def limiter(self) -> str:
        return min(self.limits, key=lambda k: self.limits[k])


def occupancy(cfg: GemmSchedule, hw: Hardware, itemsize: int = 2, gather: bool = False) -> Occupancy:
    """N_mplx of a tensor-core schedule (``block_occupancy`` of its threads, shared memory and registers;
    persistent blocks: as many per SM as launched, whose tiles run one after the other — their
    prologues and epilogues are overlapped only by the other persistent blocks)."""
    occ = block_occupancy(hw, cfg.threads, cfg.shared_bytes(itemsize), cfg.registers_per_thread(itemsize, gather))
    if getattr(cfg, "persistent", 0):
        occ.limits["persistent"] = cfg.persistent  # type: ignore[union-attr]
    return occ


def block_occupancy(hw: Hardware, threads: int, shared_bytes: int, registers_per_thread: int) -> Occupancy:
    """Blocks of one kernel resident on an SM, from shared memory (each block also holds the driver's
    reserve), registers (allocated in units of 8 per thread), threads and the block limit (0: one
    block does not fit)."""
    regs = -(-registers_per_thread // 8) * 8
    fits = shared_bytes <= hw.shared_per_block and threads <= hw.max_threads_per_block and regs <= 256
    limits = {
        "shared": hw.shared_per_sm // (shared_bytes + RESERVED_SHARED_PER_BLOCK) if fits else 0,
        "registers": hw.registers_per_sm // (regs * threads) if fits else 0,
        "threads": hw.max_threads_per_sm // threads,
        "blocks": hw.max_blocks_per_sm,
    }
    return Occupancy(limits)


@dataclass(frozen=True)
class Estimate:
    """The model's prediction and the terms it came from (cycles unless named otherwise)."""

    seconds: float
    occupancy: Occupancy
    blocks: int
    batches: int
    k_steps: int
    round_cycles: float = 0.0      # one outer iteration of every resident block (a full batch)
    terms: dict[str, float] = field(default_factory=dict)  # the candidates of the round's max
    batch_cycles: float = 0.0

    @property
    def bound(self) -> str:
        """Which term limits a full batch's round: compute, latency, l2, dram or shared."""
        return max(self.terms, key=lambda k: self.terms[k]) if self.terms else "none"


def _inner_cycles(cfg: TileConfig, hw: Hardware, resident_warps: int, itemsize: int) -> float:
    """One outer iteration (bk/16 steps) of the register-level load–use loop of every resident warp."""
    per_sub = -(-resident_warps // 4)
    t_mma = 2.0 * cfg.wm * cfg.wn * 16 / (hw.mma_flops / 4)
    latency = hw.shared_latency + (cfg.wm + cfg.wn) * 16 * itemsize / hw.shared_bytes_per_cycle
    if cfg.reg_stages >= 2 and cfg.bk > 16:
        step = overlap(per_sub * t_mma, latency / (cfg.reg_stages - 1))
    else:
        step = overlap(per_sub * t_mma, latency + t_mma)
    return (cfg.bk // 16) * step


def overlap(*terms: float) -> float:
    """Terms that run concurrently: the largest, plus ``OVERLAP_LOSS`` of the others (overlap is never
    perfect; this also orders configurations whose largest terms tie)."""
    top = max(terms)
    return top + OVERLAP_LOSS * (sum(terms) - top)


def estimate(shape: GemmShape, cfg: GemmSchedule, target: CUDATarget) -> Estimate:
    """The predicted time of ``shape`` scheduled with ``cfg`` (mma.sync tiles or warpgroup MMA) on
    ``target`` (``seconds`` is inf when a block does not fit on an SM)."""
    hw = Hardware.of(target)
    cfg.check(hw)
    it = shape.itemsize
    occ = occupancy(cfg, hw, it, shape.gather)
    blocks = shape.batch * -(-shape.m // cfg.bm) * -(-shape.n // cfg.bn)
    steps = shape.k_steps(cfg.bk)
    if occ.blocks == 0:
        return Estimate(math.inf, occ, blocks, 0, steps)
    per_batch = hw.sms * occ.blocks
    batches = -(-blocks // per_batch)

    tile_bytes = (cfg.bm + cfg.bn) * cfg.bk * it  # one block's cp.async bytes per outer iteration
    miss = min(1.0, _dram_bytes(shape, cfg, hw, min(blocks, per_batch), batches, steps)
               / (float(blocks) * steps * tile_bytes))
    # a tile arrives after the L2 (or DRAM, for the missing share) latency and its own transfer
    load_latency = (hw.l2_latency + miss * (hw.dram_latency - hw.l2_latency)
                    + tile_bytes / hw.sm_l2_bytes_per_cycle)
    shared_traffic = cfg.shared_reads(it) + tile_bytes
    pipelined = cfg.lookahead >= 1

    def batch(resident: int, active_sms: int) -> tuple[float, float, dict[str, float]]:
        """(cycles, round cycles, round terms) of a batch with ``resident`` blocks on each active SM."""
        if pipelined:
            latency = load_latency / cfg.lookahead
        else:  # each block waits for its own loads; the other resident blocks fill the wait
            latency = load_latency + cfg.compute_cycles(hw, 1, it)
        moving = resident * active_sms * tile_bytes
        terms = {"compute": cfg.compute_cycles(hw, resident, it), "latency": latency,
                 "l2": moving / hw.l2_bytes_per_cycle, "dram": moving * miss / hw.dram_bytes_per_cycle,
                 "shared": resident * shared_traffic / hw.shared_bytes_per_cycle, **cfg.wait_terms(hw, it)}
        round_cycles = overlap(*terms.values()) + SYNC_CYCLES + cfg.serial_cycles(resident, it)
        prologue = (load_latency if pipelined else 0.0) + cfg.prologue_cycles(hw)
        epilogue = (hw.dram_latency + moving / tile_bytes * cfg.bm * cfg.bn * 4 / hw.dram_bytes_per_cycle
                    + cfg.epilogue_cycles())
        return prologue + steps * round_cycles + epilogue, round_cycles, terms

    full, last = divmod(blocks, per_batch)
    cycles = 0.0
    shown = None
    if full:
        shown = batch(occ.blocks, hw.sms)
        cycles += full * shown[0]
    if last:
        resident = -(-last // hw.sms)
        tail = batch(resident, -(-last // resident))
        cycles += tail[0]
        shown = shown or tail
    assert shown is not None
    return Estimate(cycles / hw.clock_hz + LAUNCH_SECONDS, occ, blocks, batches, steps, shown[1], shown[2],
                    shown[0])


def _dram_bytes(shape: GemmShape, cfg: GemmSchedule, hw: Hardware, concurrent: int, batches: int,
                steps: int) -> float:
    """DRAM reads of the whole kernel: the compulsory bytes when the operands fit in half the L2 (the
    rest holds other data); for warpgroup MMA in groups of rows of blocks (``raster_group``) as
    ``operand_traffic`` counts them; else each batch's distinct rows of A and columns of B (blocks
    are launched row by row, blockIdx.x along n)."""
    compulsory = shape.operand_bytes
    if compulsory <= hw.l2_bytes / 2:
        return compulsory
    if isinstance(cfg, WgmmaConfig) and cfg.group > 1 and shape.input_bytes is None:
        return max(compulsory, operand_traffic(shape.m, shape.n, shape.k * shape.taps, shape.itemsize, cfg.bm,
                                               cfg.bn, cfg.group, hw.l2_bytes, shape.batch))
    grid_n = -(-shape.n // cfg.bn)
    rows = min(-(-concurrent // grid_n), -(-shape.m // cfg.bm) * shape.batch)
    cols = min(concurrent, grid_n)
    per_batch = (rows * cfg.bm + cols * cfg.bn) * cfg.bk * steps * shape.itemsize
    return max(compulsory, batches * per_batch)


def predict(shape: GemmShape, cfg: GemmSchedule, target: CUDATarget) -> float:
    """Predicted seconds of ``shape`` with ``cfg`` on ``target`` (inf: the block does not fit)."""
    return estimate(shape, cfg, target).seconds


def check_tiles(cfg: TileConfig) -> None:
    """Raise ``TuneError`` when the tiles cannot map onto mma.m16n8k16 warps."""
    if cfg.bm % cfg.wm or cfg.bn % cfg.wn or cfg.wm % 16 or cfg.wn % 8 or cfg.bk % 16:
        raise TuneError(f"tiles {cfg.bm}×{cfg.bn}×{cfg.bk} with warp tiles {cfg.wm}×{cfg.wn} do not fit "
                        "mma.m16n8k16 warps")


# --- wave quantization: the default schedules' choice of block tile and split ------------------------------


@dataclass(frozen=True)
class BlockPlan:
    """A GEMM-like kernel as the default schedules see it: ``tiles`` output tiles of bm × bn, each a
    loop of ``steps`` K steps of bk loaded ``stages`` deep; ``resident`` blocks fit on one SM
    (``block_occupancy``); the unit computes ``flops_per_cycle`` per SM (tensor cores, CUDA
    cores)."""

    bm: int
    bn: int
    bk: int
    tiles: int
    steps: int
    resident: int
    flops_per_cycle: float
    itemsize: int
    stages: int = 2
    warps: int = 0  # CUDA cores: the warps of a block, whose issue rate bounds its products (0: tensor cores)
    warp_flops: float = 0.0  # the FLOP per cycle one warp sustains (default WARP_FLOPS)
    streaming: bool = False  # B streamed once by every warp's own copies (GEMV): bandwidth needs warps
    step_latency: float = 0.0  # cycles a K step waits for its loads, when not the pipeline's (0: from stages)
    group: int = 1  # rows of blocks launched together (``raster_group``; 1: row by row)
    gathered: int = 0  # bytes of its K tile a block gathers (an implicit GEMM's input tile; 0: none)


def wave_cycles(plan: BlockPlan, hw: Hardware) -> float:
    """Cycles of the kernel by wave quantization: the tiles run in waves of SMs × resident blocks. A
    K step takes the longest of the products of the blocks resident on an SM (on the CUDA cores
    bounded by their warps' issue rate too), their operand loads through the SM's L2 port, and one
    tile's loaded memory latency and transfer spread over the stages in flight (which the resident
    blocks overlap; or the plan's ``step_latency``), and where the target's rate is known the
    gathered operand tiles of an implicit GEMM (``Hardware.gather_bytes_per_cycle``: its copies'
    address arithmetic, which the resident blocks do not overlap); a last, partial wave holds fewer
    blocks per SM.
    Memory-bound kernels are floored by DRAM separately (``gemm_seconds``)."""
    tile_bytes = (plan.bm + plan.bn) * plan.bk * plan.itemsize
    flops = 2.0 * plan.bm * plan.bn * plan.bk
    latency = plan.step_latency or \
        (LOADED_LATENCY * hw.dram_latency + tile_bytes / hw.sm_l2_bytes_per_cycle) / max(1, plan.stages - 1)
    gather = plan.gathered / hw.gather_bytes_per_cycle if plan.gathered and hw.gather_bytes_per_cycle else 0.0

    def step(blocks: int) -> float:
        """One K step of ``blocks`` blocks resident on one SM."""
        rate = plan.flops_per_cycle
        if plan.warps:  # CUDA cores: each warp issues at most one FMA per cycle, half of them in practice
            rate = min(rate, (plan.warp_flops or WARP_FLOPS) * plan.warps * blocks)
        return max(blocks * flops / rate, blocks * tile_bytes / hw.sm_l2_bytes_per_cycle, blocks * gather, latency)

    per_wave = hw.sms * plan.resident
    full, rest = divmod(plan.tiles, per_wave)
    cycles = full * plan.steps * step(plan.resident)
    if rest:
        cycles += plan.steps * step(-(-rest // hw.sms))
    return cycles + hw.dram_latency * (full + (1 if rest else 0))


def gemm_seconds(plan: BlockPlan, target: CUDATarget, m: int, n: int, k: int, batch: int = 1,
                 split: int = 1, out_bytes: int = 4, operand_bytes: float | None = None) -> float:
    """Predicted seconds of a GEMM (``batch`` products of m × k by k × n, 16-bit or float32 operands,
    results of ``out_bytes`` bytes: float32, or 16-bit with ``out_dtype``) built as ``plan``: the waves,
    at least the compulsory DRAM traffic, and with ``split`` > 1 the partial products' round trip
    (float32) and the second kernel that sums them. ``operand_bytes``: the operands' DRAM reads when
    not those of the two matrices (an implicit GEMM reads its input and filter once, not the m × k
    matrix it gathers: 9 times the input for a 3×3 filter)."""
    hw = Hardware.of(target)
    written = 4 if split > 1 else out_bytes
    reads = operand_bytes if operand_bytes is not None else \
        operand_traffic(m, n, -(-k // split), plan.itemsize, plan.bm, plan.bn, plan.group, hw.l2_bytes, batch * split)
    dram = (reads + batch * m * n * written) / hw.dram_bytes_per_cycle
    if plan.streaming:
        dram /= stream_efficiency(plan, hw)
    return (max(wave_cycles(plan, hw), dram) / hw.clock_hz + LAUNCH_SECONDS
            + split_seconds(target, m, n, batch, split, out_bytes))


def raster_group(m: int, n: int, k: int, itemsize: int, bm: int, l2_bytes: int) -> int:
    """Rows of bm × bn blocks to launch together (``Stage.raster``) in an m × k by k × n product: 1
    (row by row) while B fits in half the L2, where it stays as the rows go by; otherwise as many
    rows as half the L2 holds of A's row panels (bm × k each), which then stay in L2 while the
    group's blocks go through the columns: A is read once and B once per group of rows. Row by
    row, 2048×28672×4096 bf16 read its 235 MB B once per row of 128×256 blocks (3.8 GB, 1.37 ms on
    an H100: 0.47× cuBLAS)."""
    share = l2_bytes // 2
    if n * k * itemsize <= share:
        return 1
    return max(1, min(-(-m // bm), share // (bm * k * itemsize)))


def operand_traffic(m: int, n: int, k: int, itemsize: int, bm: int, bn: int, group: int, l2_bytes: int,
                    batch: int = 1) -> float:
    """DRAM bytes the operands of ``batch`` m × k by k × n products cost in bm × bn blocks launched
    in groups of ``group`` rows (``raster_group``; a batch after the other): each once when both
    fit in half the L2; else A once while a group's row panels fit there (its panels again for
    every column otherwise), and B once while it fits there, else once per group of rows."""
    share = l2_bytes / 2
    a, b = m * k * itemsize, n * k * itemsize
    if a + b <= share:
        return float(batch * (a + b))
    rows = -(-m // bm)
    a_reads = 1 if group * bm * k * itemsize <= share else -(-n // bn)
    b_reads = 1 if b <= share else -(-rows // group)
    return float(batch * (a * a_reads + b * b_reads))


def stream_efficiency(plan: BlockPlan, hw: Hardware) -> float:
    """The share of DRAM bandwidth a streaming kernel reaches with the warps it keeps resident per SM:
    sqrt(warps / STREAM_WARPS), at most 1. Measured on an H100 (GEMV 1×28672×4096 bf16, 2026-11-27,
    ``benchmarks/results/gemv_variants-20261127-2014-h100x2.json``): 1.7 warps per SM (112 blocks of 64
    threads) reach 0.67 of the bandwidth that 3.4 or more reach; a vocabulary row (1×30522×768) in 120
    blocks took 113 µs where 12 chunks of K (1440 blocks) took 37 µs."""
    blocks = min(plan.tiles, hw.sms * max(1, plan.resident))
    warps = blocks * max(1, plan.warps) / hw.sms
    return min(1.0, (warps / STREAM_WARPS) ** 0.5)


def split_seconds(target: CUDATarget, m: int, n: int, batch: int = 1, split: int = 1, out_bytes: int = 4) -> float:
    """What a reduction split in ``split`` chunks adds to ``batch`` m × n results of ``out_bytes``
    bytes: the float32 partial products' round trip through DRAM (written, read back), the sum
    written, and the launch of the second kernel that sums them (0 when not split)."""
    if split <= 1:
        return 0.0
    return (2 * split * 4 + out_bytes) * batch * m * n / target.dram_bandwidth + LAUNCH_SECONDS


def tail_combine_seconds(target: CUDATarget, head_rows: int, tail_rows: int, n: int, split: int,
                         out_bytes: int = 4) -> float:
    """What the row split of a GEMM's last wave (``ops.matmul.matmul_tail_split_func``) adds to its two
    products: the tail's ``split`` float32 partial products written and read back, the head's
    results (``out_bytes``) read back, the whole output written once more, and the launch of the
    kernel that combines them."""
    moved = 2 * split * 4 * tail_rows * n + out_bytes * head_rows * n + out_bytes * (head_rows + tail_rows) * n
    return moved / target.dram_bandwidth + LAUNCH_SECONDS
