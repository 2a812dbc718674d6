"""CUDA schedule templates: the operator library's GPU schedules with their tile sizes as decisions.

Matrix products (matmul, batch_matmul, dense) in float32 tune the block tile BM × BN, the reduction
step BK staged in shared memory, the TM × TN register tile of a thread and the number of pipeline
stages of the shared tiles (an integer decision) of ``gpu_schedules.gemm_cuda``.
With 16-bit operands (float16, bfloat16) on sm_80 and newer, matmul, batch_matmul and the
implicit-GEMM convolutions (conv2d_igemm, conv3d_igemm) use tensor cores (``gemm_tensorcore``,
``igemm_tensorcore``): block tile bm × bn × bk, warp tile wm × wn, shared-memory stages 1–6 and
register stages 1–2 (ALCOP's space); these templates carry ALCOP's analytical model
(``tune.analytical``) for the analytical tuners. On sm_90a, matmul and batch_matmul come first
with the warpgroup-MMA templates (``matmul_wgmma``, ``batch_matmul_wgmma``: block tile, K tile,
stages, MMA groups in flight, block order), which carry the same model's warpgroup-MMA form (``WgmmaConfig``);
name ``matmul_tensorcore`` to tune the mma.sync space there.
Products of at most ``GEMV_ROWS`` rows (decoding: matrix–vector-like) come first with the GEMV
templates (``matmul_gemv``, ``batch_matmul_gemv``: threads per block, K tile, stages). An unbatched
matmul's GEMV, CUDA-core and warpgroup-MMA templates also choose the split of K (``split``: 1 or a
divisor of K, split-K through ``ops.matmul_func``; the warpgroup-MMA model predicts the chunks as a
batch of shorter products plus the partial sums' round trip; ALCOP's mma.sync space is kept as
published); the tensor-core templates copy operands whose rows are not 16-byte aligned into aligned
buffers first, as the default schedules do.
Implicit-GEMM convolutions of fewer input channels than a tensor-core K step (``conv2d_igemm_cuda``,
``conv3d_igemm_cuda``) tune ``igemm_cuda``'s threads per block, output pixels per thread and output
channels per block.
Conv2d tunes the structure of the library's direct convolution: output channels per thread (a
register tile), output pixels per block, whether the block's weights are staged in shared memory
and whether the channel loop is unrolled. Each template declares threads per block, shared memory
and registers, so configurations over the target's limits are discarded before anything is built.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...errors import ScheduleError
from ...intrinsics import MMA_M16N8K16
from ...ops.conv_choice import (
    IgemmChoice,
    chunk_steps,
    igemm_choice,
    igemm_kernel,
    igemm_options,
    igemm_rows_choice,
    igemm_splits,
    no_deeper,
)
from ...ops.gpu_schedules import (
    GEMV_MAX_SPLIT,
    GEMV_ROWS,
    ONE_STEP_ROWS,
    GemmChoice,
    conv2d_gemm,
    gemm_as,
    gemm_choice,
    gemm_chunks,
    gemm_cuda,
    igemm_cuda,
    igemm_rows,
    igemm_schedule,
    igemm_tensorcore,
    tail_split_choice,
    tma_fits,
)
from ...ops.igemm import padded_channels, pads_channels
from ...ops.split_rules import MAX_SPLIT
from ...target import Target
from ..analytical import (
    GemmShape,
    Hardware,
    TileConfig,
    WgmmaConfig,
    occupancy,
    predict,
    raster_group,
    split_seconds,
)
from ..space import TemplateConfig
from ..task import template


def _block_resources(cfg: TemplateConfig, threads: int, shared_floats: int, accumulators: int) -> None:
    regs = accumulators + 40  # accumulators, operands held in registers, addressing and counters
    cfg.require(threads >= 32, "fewer than a warp of threads per block")
    cfg.resources(threads_per_block=threads, shared_bytes=4 * shared_floats, registers_per_thread=regs,
                  registers_per_block=regs * threads)


def _first(default: object, choices: list[object]) -> list[object]:
    """``choices`` with ``default`` first (added when missing; None: none), each once (a repeated
    choice is the same configuration again: the implicit-GEMM tiles came once per split, 24 tile
    choices of 6 tiles for ResNet-50's 3×3 512→512 at batch 32)."""
    out: list[object] = []
    seen: set[tuple[type, object]] = set()  # (type, value): 1 and True are two choices
    for c in ([] if default is None else [default]) + list(choices):
        try:
            known = (type(c), c) in seen
        except TypeError:  # an unhashable value: compared with the others one by one
            known = any(type(c) is type(o) and c == o for o in out)
        else:
            seen.add((type(c), c))
        if not known:
            out.append(c)
    return out


def _choices(cfg: TemplateConfig, default: object, choices: list[object]) -> list[object]:
    """``_first(default, choices)`` when the space is defined; none otherwise: checks and builds read the
    configuration's value (``TemplateConfig.knob``), and the tuner checks every configuration annealing
    meets."""
    return _first(default, choices) if cfg.mode == "define" else []


def default_gemm(cfg: TemplateConfig, op: Any, kernel: str) -> GemmChoice | None:
    """The operator's default schedule (``gemm_choice``, as ``op.build`` makes it) when it is on
    ``kernel`` and the template is defining its space (its first choices); else None."""
    if cfg.mode != "define" or cfg.target.kind != "cuda":
        return None
    s = op.shape
    try:
        choice = gemm_choice(cfg.target, s["M"], s["N"], s["K"], op.func.tensor("A").dtype, batch=s.get("batch", 1),
                             split_k=s.get("split_k"), out_bytes=op.func.tensor("C").dtype.itemsize)
    except ScheduleError:
        return None
    return choice if choice.kernel == kernel else None


def _gemm_space(cfg: TemplateConfig, M: int, N: int, default: dict[str, int] | None = None) -> dict[str, int]:
    d = default or {}
    bm = cfg.knob("bm", _first(d.get("bm"), [128, 32, 64, 256]))
    bn = cfg.knob("bn", _first(d.get("bn"), [128, 32, 64, 256]))
    bk = cfg.knob("bk", _first(d.get("bk"), [8, 4, 16, 32]))
    tm = cfg.knob("tm", _first(d.get("tm"), [8, 2, 4]))
    tn = cfg.knob("tn", _first(d.get("tn"), [8, 2, 4]))
    stages = cfg.integer("stages", 1, 4, default=d.get("stages", 3))
    cfg.require((bm // 2) % (tm // 2) == 0 and (bn // 2) % (tn // 2) == 0,
                "the register tile must divide the block tile")
    # a tile twice the matrix or more only repeats a smaller tile's work
    cfg.require((bm // 2 < M or bm == 32) and (bn // 2 < N or bn == 32), "the block tile is twice the matrix")
    threads = (bm // tm) * (bn // tn)  # type: ignore[operator]
    _block_resources(cfg, threads, stages * bk * (bm + bn) + 2, tm * tn + tm + tn)  # type: ignore[operator]
    return {"bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn, "stages": stages}  # type: ignore[dict-item]


SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""The splits of K the templates offer besides the default's: about S chunks of whole K tiles, the
last one ending at K (``gpu_schedules.gemm_chunks``, the default's rule)."""


def _gemm_split(cfg: TemplateConfig, op: Any, bk: int, counts: list[int], default: GemmChoice | None,
                decide: bool, batched: bool = False) -> tuple[int, int]:
    """The split of K as (chunks, ``GemmChoice.chunk``): the operator's own ``split_k`` (of a batched
    product only where the kernel splits one: ``batched``, the GEMV); else with ``decide`` about S
    chunks of whole K tiles (``gemm_chunks``), S among ``counts``, the default's first; else none.
    Applied at other sizes (the tuner's check at prime sizes) the same S is cut by the same rule,
    which may give other chunks there."""
    own = op.shape.get("split_k")
    if own is not None:
        cfg.require(batched or op.name != "batch_matmul" or own == 1, f"a batched product's reduction is split "
                    f"only on the GEMV kernel (at most {GEMV_ROWS} rows): this kernel takes one batch loop; "
                    "leave split_k unset")
        return int(own), 0
    if not decide:
        return 1, 0
    K = op.shape["K"]
    split = int(cfg.knob("split", _choices(cfg, default.split if default else None, counts)))  # type: ignore[call-overload]
    count, chunk = gemm_chunks(K, bk, split)
    if cfg.mode != "apply":  # at the workload's own sizes: each kernel once, chunks of two K tiles or more
        cfg.require(count == split, "these chunks of whole K tiles are fewer: another split's kernel")
        cfg.require(count == 1 or (chunk or -(-K // count)) >= 2 * bk, "chunks of fewer than two K tiles")
    return count, chunk


def _gemm_as(cfg: TemplateConfig, op: Any, choice: GemmChoice) -> Any:
    """The schedule of ``choice`` (made of a configuration) by the default's own code (``gemm_as``)."""
    sched = cfg.schedule(op.func)
    s = op.shape
    return gemm_as(sched, choice, s["M"], s["N"], s["K"], s.get("split_k"), s.get("batch")) or sched


def _gemv_op(op: Any, target: Target) -> bool:
    """A matrix–vector-like product (at most GEMV_ROWS rows) on a GPU: the GEMV template applies first."""
    return target.has("gpu") and op.shape.get("M", GEMV_ROWS + 1) <= GEMV_ROWS


def _added_knob(cfg: TemplateConfig, name: str, choices: list[object], before: object) -> object:
    """A knob added to a template after configurations of it were recorded: a configuration without
    it (an older record) takes ``before``, the template's one choice then."""
    if cfg.mode != "define" and name not in cfg.values:
        return before
    return cfg.knob(name, choices)  # type: ignore[arg-type]


def _gemv(cfg: TemplateConfig, op: Any) -> Any:
    """``gemv_cuda``: threads per block, bytes of B's columns per thread (``vector``: 8 through shared
    tiles; 8 or 16 loaded straight into registers: ``direct``), the K tile, stages and the split of
    K (also of a batched product's, as the default splits them); or with ``kernel="mma"`` (16-bit
    operands on mma.sync, an unbatched product whose B rows are 16-byte multiples) ``gemv_mma``: warps
    (threads / 32) of ``columns`` columns of B each, the K tile, stages and split. The first choices
    are the default's (``gemm_choice``). ``kernel="tiles"``: a batched product of 16-bit operands on
    mma.sync's 64×64 tiles (``gemm_choice``'s ``batched_tiles``), the K tile and stages its knobs."""
    itemsize = op.func.inputs[0].dtype.itemsize
    d = default_gemm(cfg, op, "gemv") or default_gemm(cfg, op, "gemv_mma")
    tiled = default_gemm(cfg, op, "mma") if op.name == "batch_matmul" else None
    p = d.params if d else tiled.params if tiled else {}
    on_mma = d is not None and d.kernel == "gemv_mma"
    kernel = str(_added_knob(cfg, "kernel", _first("tiles" if tiled else "mma" if on_mma else "cuda" if d else None,
                                                   ["cuda", "mma", "tiles"]), "cuda"))
    threads = int(cfg.knob("threads", _first(  # type: ignore[call-overload]
        128 if tiled else (p["warps"] * 32 if on_mma else p["bn"] // p["vec"]) if d else None,
        [128, 64, 32, 256])))
    columns = int(_added_knob(cfg, "columns", _first(p["bn"] // p["warps"] if on_mma else None,  # type: ignore[call-overload]
                                                     [32, 16, 64]), 32))
    vector = int(cfg.knob("vector", _first(None if on_mma or not d else p["vec"] * itemsize, [8, 16])))  # type: ignore[call-overload]
    bk = int(cfg.knob("bk", _first(p.get("bk"), [32, 16, 64, 8, 128])))  # type: ignore[call-overload]
    stages = cfg.integer("stages", 1, 6, default=p.get("stages", 4))
    direct = bool(cfg.knob("direct", _first(bool(p.get("direct")) if d else None, [False, True])))
    split, chunk = _gemm_split(cfg, op, bk, [s for s in SPLITS if s <= GEMV_MAX_SPLIT], d or tiled, decide=True,
                               batched=True)
    M = op.shape["M"]
    if kernel == "tiles":
        cfg.require(itemsize == 2 and cfg.target.has("mma.sync") and op.name == "batch_matmul" and M > 1,
                    "the tiles kernel: a batched product of 2 to 16 rows of 16-bit operands on mma.sync")
        cfg.require(threads == 128 and columns == 32 and vector == 8 and not direct and split == 1,
                    "the tiles kernel: 4 warps of 32×32 in 64×64 tiles, unsplit (threads, columns, vector, direct, "
                    "split: the GEMVs' knobs)")
        cfg.require(bk in (16, 32, 64), "the tiles kernel's K tile: 16, 32 or 64")
        tile = TileConfig(64, 64, bk, 32, 32, stages, 2 if bk > 16 else 1)
        regs = tile.registers_per_thread(itemsize, False)
        cfg.resources(threads_per_block=tile.threads, shared_bytes=tile.shared_bytes(itemsize),
                      registers_per_thread=regs, registers_per_block=regs * tile.threads)
        params = dict(bm=64, bn=64, wm=32, wn=32, bk=bk, stages=stages, reg_stages=2 if bk > 16 else 1)
        return _gemm_as(cfg, op, GemmChoice("mma", params, 1, 0.0))
    if kernel == "mma":
        cfg.require(itemsize == 2 and cfg.target.has("mma.sync"), "the mma kernel takes 16-bit operands on mma.sync")
        cfg.require(op.name == "matmul", "the mma kernel computes unbatched products")
        cfg.require((op.shape["N"] * itemsize) % 16 == 0, "the mma kernel reads B's rows as 16-byte copies")
        cfg.require(not direct and vector == 8, "the mma kernel stages B in shared memory (vector, direct: unused)")
        cfg.require(bk % 16 == 0, "the mma kernel's K tile is a multiple of mma.sync's 16")
        cfg.require(split == 1 or (chunk or -(-op.shape["K"] // split)) % bk == 0,
                    "the mma kernel computes whole K tiles: chunks of whole K tiles")
        warps = threads // 32
        bn = warps * columns
        cfg.require(warps >= 1 and (bn // 2 < op.shape["N"] or bn == 64), "the block is twice the matrix's columns")
        rows = 8 * -(-M // 8)
        cfg.resources(threads_per_block=threads, shared_bytes=stages * bk * (bn + 8 + rows + 8) * itemsize,
                      registers_per_thread=columns // 16 * rows // 2 + 48,
                      registers_per_block=(columns // 16 * rows // 2 + 48) * threads)
        params = dict(bn=bn, warps=warps, bk=bk, stages=stages)
        return _gemm_as(cfg, op, GemmChoice("gemv_mma", params, split, 0.0, chunk))
    cfg.require(columns == 32, "columns: the mma kernel's knob")
    vec = vector // itemsize
    cfg.require(direct or vector == 8, "staged tiles of B take 8 bytes of columns per thread")
    cfg.require(direct or threads == 32 or threads * vec // 2 < op.shape["N"],
                "the block is twice the matrix's columns")
    b_tile = 0 if direct else threads * vec  # B in registers (direct) or in shared tiles
    b_regs = bk * vec * itemsize // 4 if direct else vec
    # at most the default's one K step (``one_step_gemv``: ONE_STEP_ROWS rows of 8 bytes)
    cfg.require(not direct or b_regs <= ONE_STEP_ROWS * 2,
                f"a direct K step of more than {ONE_STEP_ROWS * 2} registers of B per thread")
    cfg.resources(threads_per_block=threads, shared_bytes=stages * bk * (b_tile + M) * itemsize,
                  registers_per_thread=M * vec + b_regs + 32, registers_per_block=(M * vec + b_regs + 32) * threads)
    # whole register tiles: the chunks are whole K tiles (the last ending at K)
    params = dict(bn=threads * vec, vec=vec, bk=bk, stages=stages, whole=True, **({"direct": True} if direct else {}))
    return _gemm_as(cfg, op, GemmChoice("gemv", params, split, 0.0, chunk))


@template("matmul", "cuda", name="matmul_gemv", applies=_gemv_op)
def matmul_gemv(cfg: TemplateConfig, op: Any) -> Any:
    return _gemv(cfg, op)


@template("batch_matmul", "cuda", name="batch_matmul_gemv", applies=_gemv_op)
def batch_matmul_gemv(cfg: TemplateConfig, op: Any) -> Any:
    return _gemv(cfg, op)


def tensor_core_op(op: Any, target: Target) -> bool:
    """16-bit operands on a GPU with mma.sync (sm_80 and newer): the tensor-core templates apply."""
    return target.has("mma.sync") and op.func.inputs[0].dtype.name in MMA_M16N8K16.operand_dtypes


def _cuda_core_op(op: Any, target: Target) -> bool:
    return not tensor_core_op(op, target)


def _cuda_core_gemm(cfg: TemplateConfig, op: Any) -> Any:
    """``gemm_cuda``'s tiles and K's split: about S chunks of whole K tiles, the last one ending at K
    (``gemm_chunks``, as the tensor cores': the kernel computes whole K tiles), the default's
    (``gemm_choice``) first."""
    d = default_gemm(cfg, op, "cuda")
    tiles = _gemm_space(cfg, op.shape["M"], op.shape["N"], d.params if d else None)
    split, chunk = _gemm_split(cfg, op, tiles["bk"], list(SPLITS), d, decide=op.name == "matmul")
    return _gemm_as(cfg, op, GemmChoice("cuda", tiles, split, 0.0, chunk))


@template("matmul", "cuda", applies=_cuda_core_op)
def matmul_cuda(cfg: TemplateConfig, op: Any) -> Any:
    return _cuda_core_gemm(cfg, op)


@template("batch_matmul", "cuda", applies=_cuda_core_op)
def batch_matmul_cuda(cfg: TemplateConfig, op: Any) -> Any:
    return _cuda_core_gemm(cfg, op)


@template("dense", "cuda")
def dense_cuda(cfg: TemplateConfig, op: Any) -> Any:
    tiles = _gemm_space(cfg, op.shape["M"], op.shape["N"])
    epilogue_threads = cfg.knob("epilogue_threads", [256, 128, 512])
    sched = cfg.schedule(op.func)
    gemm_cuda(sched, "XW", "X", "W", b_transposed=True, **tiles)
    ep = sched["Y"]
    ep.fuse("i", "j").split("ij", epilogue_threads, "bx", "tx")
    ep.bind("bx", "blockIdx.x").bind("tx", "threadIdx.x")
    return sched


def _conv_gemm(op: Any, target: Target) -> GemmChoice | None:
    """The default GEMM of an NCHW convolution's implicit GEMM (K filters × N·P·Q pixels × C·R·S)."""
    from ...ops.conv import conv_out
    s = op.shape
    P = conv_out(s["H"], s["R"], s["stride"], s["padding"], s.get("dilation", 1))
    Q = conv_out(s["W"], s["S"], s["stride"], s["padding"], s.get("dilation", 1))
    return gemm_choice(target, s["K"], s["N"] * P * Q, s["C"] * s["R"] * s["S"], op.func.tensor("I").dtype,
                       unequal_chunks=False)


def _conv_on_cuda_cores(op: Any, target: Target) -> bool:
    """An NCHW convolution the default computes as an implicit GEMM on the CUDA cores (float32)."""
    try:
        return target.kind == "cuda" and _conv_gemm(op, target).kernel == "cuda"  # type: ignore[union-attr]
    except ScheduleError:  # no GEMM tile fits the target's block: the default is direct
        return False


@template("conv2d", "cuda", name="conv2d_gemm_cuda", applies=_conv_on_cuda_cores)
def conv2d_gemm_cuda(cfg: TemplateConfig, op: Any) -> Any:
    """An NCHW convolution as the default builds it (``conv2d_gemm``: the filter times the gathered
    input on ``gemm_cuda``): its tiles and the split of the C·R·S reduction in chunks of one length,
    the default's (``gemm_choice``) first."""
    d = _conv_gemm(op, cfg.target) if cfg.mode == "define" and _conv_on_cuda_cores(op, cfg.target) else None
    s = op.shape
    from ...ops.conv import conv_out
    pixels = s["N"] * conv_out(s["H"], s["R"], s["stride"], s["padding"], s.get("dilation", 1)) * conv_out(
        s["W"], s["S"], s["stride"], s["padding"], s.get("dilation", 1))
    reduction = s["C"] * s["R"] * s["S"]
    tiles = _gemm_space(cfg, s["K"], pixels, d.params if d and d.kernel == "cuda" else None)
    split = int(cfg.knob("split", _first(d.split if d else None,  # type: ignore[call-overload]
                                         [k for k in range(1, MAX_SPLIT + 1) if reduction % k == 0])))
    chunk = reduction // split
    if cfg.mode != "apply":
        cfg.require(split == 1 or (chunk >= 2 * tiles["bk"] and chunk % tiles["bk"] == 0),
                    "chunks of fewer than two K tiles, or of no whole K tiles")
    elif reduction % split or chunk % tiles["bk"]:  # applied at sizes the split does not fit: unsplit
        split = 1
    sched = cfg.schedule(op.func)
    return conv2d_gemm(sched, GemmChoice("cuda", tiles, split, 0.0), s["N"], s["C"], s["H"], s["W"], s["K"],
                       s["R"], s["S"], s["stride"], s["padding"], s.get("dilation", 1))


@template("conv2d", "cuda")
def conv2d_cuda(cfg: TemplateConfig, op: Any) -> Any:
    """Direct convolution: ``kt`` output channels per thread in registers, ``pixels`` output pixels
    per block (one per thread), weights of the block's channels optionally staged in shared memory;
    the first choices are the default's (``conv2d_direct``)."""
    s = op.shape
    kt = cfg.knob("kt", _first(min(8, s["K"]), [k for k in (8, 1, 2, 4, 16) if k <= s["K"]]))
    pixels = cfg.knob("pixels", [128, 32, 64, 256])
    stage_w = cfg.knob("stage_weights", [True, False])
    unroll_k = cfg.tag("unroll_k", "ki", ["unroll", "serial"])
    shared = s["C"] * s["R"] * s["S"] * kt if stage_w else 0  # type: ignore[operator]
    _block_resources(cfg, pixels, shared, kt)  # type: ignore[arg-type]
    sched = cfg.schedule(op.func)
    st = sched["O"]
    st.split("k", kt, "ko", "ki").fuse("p", "q", "pq").split("pq", pixels, "pqo", "pqt")
    st.reorder("n", "ko", "pqo", "pqt", "c", "r", "s", "ki")
    st.bind("ko", "blockIdx.y").bind("pqo", "blockIdx.x").bind("pqt", "threadIdx.x")
    if s["N"] > 1:
        st.bind("n", "blockIdx.z")
    if stage_w:
        st.cache("Wt", "pqo", layout=lambda kk, cc, rr, ss: (cc, rr, ss, kk), loc="shared")
    st.cache_write("pqt", loc="local")
    st.tag("ki", unroll_k)
    if "Ipad" in sched.stage_names():
        pad = sched["Ipad"]
        pad.fuse("h", "w", "hw").split("hw", 256, "hwo", "hwt")
        pad.bind("cc", "blockIdx.y").bind("hwo", "blockIdx.x").bind("hwt", "threadIdx.x")
        if s["N"] > 1:
            pad.bind("n", "blockIdx.z")
    return sched


# --- warpgroup MMA (Hopper) ---------------------------------------------------------------------------

def wgmma_op(op: Any, target: Target) -> bool:
    """16-bit operands on an sm_90a GPU: the warpgroup-MMA templates apply (and come first)."""
    return tensor_core_op(op, target) and target.has("wgmma")


def _wgmma_gemm(cfg: TemplateConfig, op: Any) -> Any:
    """Block tile bm × bn (bm/64 warpgroups issuing wgmma.m64n{bn}k16), K tile bk, shared stages,
    the MMA groups left in flight, the block order (``group`` rows of blocks launched together: 0
    sizes it to the target's L2 as the default does, ``raster_group``; 1 is row by row), persistent
    blocks (one per SM looping over the tiles in that order; not the default, not yet measured),
    the tiles' loads (``producer``: the threads' asynchronous copies or TMA), the results' stores
    (``store``: each thread's, a TMA store of the tile staged in shared memory, not the default, not yet
    measured, or the staged tile copied out by the threads row by row, in its own shared memory or
    overlaid on the operand tiles', ``STAGED_ODD_STORES``) and an
    unbatched product's split of K; the first choices are the default's (``gemm_choice``)."""
    shape = gemm_shape(op)
    d = default_gemm(cfg, op, "wgmma")
    p = d.params if d else {}
    t = {"bm": int(cfg.knob("bm", _choices(cfg, p.get("bm"), [128, 64, 256]))),  # type: ignore[call-overload]
         "bn": int(cfg.knob("bn", _choices(cfg, p.get("bn"), [256, 128, 64, 192]))),  # type: ignore[call-overload]
         "bk": int(cfg.knob("bk", _choices(cfg, p.get("bk"), [64, 128, 32])))}  # type: ignore[call-overload]
    t["stages"] = cfg.integer("stages", 1, 6, default=p.get("stages", 4))
    t["inflight"] = cfg.integer("inflight", 0, 2, default=p.get("inflight", 1))
    group = int(cfg.knob("group", [0, 1, 8, 16]))  # type: ignore[call-overload]
    producer = str(cfg.knob("producer", _choices(cfg, p.get("producer", "threads") if d else None,
                                                 ["threads", "tma"])))
    persistent = bool(_added_knob(cfg, "persistent", [False, True], False))
    store = str(_added_knob(cfg, "store", _first(p.get("store", "threads"),
                                                 ["threads", "tma", "staged", "staged overlaid"]), "threads"))
    # an unbatched product's rows split for its last wave (tail_split_choice: the tail's tiles and split the model's)
    tail = op.name == "matmul" and bool(_added_knob(cfg, "tail", _first(d.tail is not None if d else None,
                                                                         [False, True]), False))
    split, chunk = _gemm_split(cfg, op, t["bk"], list(SPLITS), d, decide=op.name == "matmul")
    t["group"] = group or raster_group(shape.m, shape.n, chunk or -(-shape.k // split), shape.itemsize, t["bm"],
                                       cfg.target.l2_bytes)
    cfg.require(t["inflight"] == 0 or t["stages"] >= t["inflight"] + 2,
                "groups in flight need stages ≥ inflight + 2 (a slot to load ahead)")
    cfg.require(t["bm"] // 2 < shape.m or t["bm"] == 64, "the block tile is twice the matrix's rows")
    cfg.require(t["bn"] // 2 < shape.n or t["bn"] == 64, "the block tile is twice the matrix's columns")
    cfg.require(t["bk"] // 2 < shape.k or t["bk"] == 32, "the K tile is twice the reduction")
    cfg.require(shape.m >= 16, "fewer than 16 rows: the GEMV template (matmul_gemv) computes such products")
    # TMA's 128-byte swizzled tiles: K and column tiles of 64 16-bit values
    fits = t["stages"] >= 2 and not chunk and t["bk"] % 64 == 0 and t["bn"] % 64 == 0 and tma_fits(
        t, shape.m, shape.n, shape.k, shape.itemsize, shape.batch, split)
    cfg.require(producer != "tma" or fits or cfg.mode == "apply",
                "TMA loads pipelined whole tiles of rows 16-byte aligned (tma_fits), in chunks of one length")
    tma = producer == "tma" and fits  # applied at sizes TMA cannot load: the threads' copies there
    out_bytes = op.func.tensor("C").dtype.itemsize
    stores_fit = split == 1 and shape.n * out_bytes % 16 == 0
    cfg.require(store != "tma" or stores_fit or cfg.mode == "apply",
                "TMA stores write an unsplit product's results in rows of whole 16 bytes")
    tma_store = store == "tma" and stores_fit  # applied at sizes TMA cannot store: the threads' stores there
    odd_rows = split == 1 and shape.n * out_bytes % 4 != 0
    cfg.require(not store.startswith("staged") or odd_rows or cfg.mode == "apply",
                "staged stores copy out an unsplit product's results in rows only 2-byte aligned (the "
                "accumulators' own stores there are single elements over 8 rows; a split's are its partial sums)")
    staged = store.startswith("staged") and odd_rows
    # the staging tile's shared memory (not overlaid: in the operand tiles' storage)
    tiles = WgmmaConfig(**t, staged=out_bytes if tma_store or (staged and store == "staged") else 0)
    regs = tiles.registers_per_thread(shape.itemsize)
    cfg.resources(threads_per_block=tiles.threads, shared_bytes=tiles.shared_bytes(shape.itemsize),
                  registers_per_thread=regs, registers_per_block=regs * tiles.threads)
    cfg.require(not persistent or split == 1, "persistent blocks loop over the tiles of one product: not split")
    params = {k: v for k, v in t.items() if k != "group" or v > 1}
    # persistent: as many blocks per SM as fit (an H200 measured one per SM 0.92× → 0.74× where two fit)
    per_sm = occupancy(tiles, Hardware.of(cfg.target), shape.itemsize).blocks if persistent else 0
    extra = {**({"producer": "tma"} if tma else {}), **({"persistent": per_sm} if per_sm else {}),
             **({"store": "tma"} if tma_store else {"store": store} if staged else {})}
    choice = GemmChoice("wgmma", {**params, **extra}, split, 0.0, chunk)
    if tail:
        cfg.require(split == 1 and not persistent and not tma_store and not staged and op.shape.get("split_k") is None,
                    "a row split for the last wave takes an unsplit product's tiles, without persistent blocks, "
                    "TMA or staged stores")
        rows = _tail_split(cfg, op, choice)
        cfg.require(rows is not None or cfg.mode == "apply",
                    "a row split needs a partial last wave and a tail of warpgroup-MMA rows (tail_split_choice)")
        choice = rows or choice  # applied at sizes without a partial last wave: the product unsplit there
    return _gemm_as(cfg, op, choice)


def _tail_split(cfg: TemplateConfig, op: Any, choice: GemmChoice) -> GemmChoice | None:
    """``choice``'s rows split for its last wave (``tail_split_choice``), None where that does not apply."""
    s = op.shape
    if choice.split != 1 or op.name != "matmul":
        return None
    return tail_split_choice(cfg.target, choice, s["M"], s["N"], s["K"], op.func.tensor("A").dtype,
                             op.func.tensor("C").dtype.itemsize)


def wgmma_model(op: Any, target: Any, values: dict[str, object]) -> float:
    """The analytical prediction (seconds) of a warpgroup-MMA configuration; a split of K is predicted
    as its chunks, a batch of shorter products, plus the partial sums' round trip."""
    shape = gemm_shape(op)
    own = op.shape.get("split_k")
    split, chunk = (int(own), 0) if own else gemm_chunks(shape.k, int(values["bk"]), int(values.get("split", 1)))  # type: ignore[call-overload]
    length = chunk or -(-shape.k // split)
    chunks = replace(shape, k=length, batch=shape.batch * split)
    cfg = WgmmaConfig.of(values, op.func.tensor("C").dtype.itemsize)
    if cfg.persistent:  # the template launches as many persistent blocks per SM as fit
        cfg = replace(cfg, persistent=occupancy(replace(cfg, persistent=0), Hardware.of(target), shape.itemsize).blocks)
    if not values.get("group"):  # 0: sized to the L2 as the template builds it
        cfg = replace(cfg, group=raster_group(shape.m, shape.n, length, shape.itemsize, cfg.bm, target.l2_bytes))
    if values.get("tail") and op.name == "matmul" and split == 1:  # the two products and their combination
        params = {k: values[k] for k in ("bm", "bn", "bk", "stages", "inflight") if k in values}
        tma = values.get("producer") == "tma" and tma_fits(params, shape.m, shape.n, shape.k, shape.itemsize)
        s = op.shape
        rows = tail_split_choice(target, GemmChoice("wgmma", {**params, "group": cfg.group,
                                                              **({"producer": "tma"} if tma else {})}, 1, 0.0),
                                 s["M"], s["N"], s["K"], op.func.tensor("A").dtype, op.func.tensor("C").dtype.itemsize)
        if rows is not None:
            return rows.seconds
    return predict(chunks, cfg, target) + split_seconds(target, shape.m, shape.n, shape.batch, split)


@template("matmul", "cuda", name="matmul_wgmma", model=wgmma_model, applies=wgmma_op)
def matmul_wgmma(cfg: TemplateConfig, op: Any) -> Any:
    return _wgmma_gemm(cfg, op)


@template("batch_matmul", "cuda", name="batch_matmul_wgmma", model=wgmma_model, applies=wgmma_op)
def batch_matmul_wgmma(cfg: TemplateConfig, op: Any) -> Any:
    return _wgmma_gemm(cfg, op)


def _tensor_core_gemm(cfg: TemplateConfig, op: Any, tiles: dict[str, int]) -> Any:
    """An mma.sync GEMM of ``tiles``, K split only by the operator's own ``split_k``, its operands
    copied aligned where their rows are not 16-byte aligned (the default's code: ``gemm_as``)."""
    split, chunk = _gemm_split(cfg, op, tiles["bk"], [1], None, decide=False)
    return _gemm_as(cfg, op, GemmChoice("mma", tiles, split, 0.0, chunk))


# --- tensor cores (ALCOP's space and model) ----------------------------------------------------------


def gemm_shape(op: Any) -> GemmShape:
    """The GEMM a tensor-core operator computes, for the analytical model."""
    s = op.shape
    itemsize = op.func.inputs[0].dtype.itemsize
    if op.name == "matmul":
        return GemmShape(s["M"], s["N"], s["K"], itemsize=itemsize)
    if op.name == "batch_matmul":
        return GemmShape(s["M"], s["N"], s["K"], batch=s["batch"], itemsize=itemsize)
    spatial = ("D", "H", "W") if op.name == "conv3d_igemm" else ("H", "W")
    filt = ("T", "R", "S") if op.name == "conv3d_igemm" else ("R", "S")
    out, taps, pixels = s["N"], 1, s["N"]
    for dim, f in zip(spatial, filt, strict=True):
        out *= (s[dim] + 2 * s["padding"] - s[f]) // s["stride"] + 1
        taps *= s[f]
        pixels *= s[dim]
    return GemmShape(out, s["K"], s["C"], taps=taps, itemsize=itemsize,
                     input_bytes=itemsize * (pixels * s["C"] + taps * s["C"] * s["K"]), gather=True)


def tensorcore_model(op: Any, target: Any, values: dict[str, object]) -> float:
    """ALCOP's analytical prediction (seconds) of a tensor-core configuration."""
    return predict(gemm_shape(op), TileConfig.of(values), target)


def _tensorcore_space(cfg: TemplateConfig, shape: GemmShape) -> dict[str, int]:
    """Declare ALCOP's decisions and their constraints; the first choices are the library's default."""
    knobs = {"bm": [128, 64, 256, 32], "bn": [128, 64, 256, 32], "bk": [32, 16, 64], "wm": [64, 32, 16],
             "wn": [64, 32, 16]}
    t = {name: int(cfg.knob(name, choices)) for name, choices in knobs.items()}  # type: ignore[call-overload]
    t["stages"] = cfg.integer("stages", 1, 6, default=3)
    t["reg_stages"] = cfg.integer("reg_stages", 1, 2, default=2)
    tiles = TileConfig(**t)
    cfg.require(tiles.bm % tiles.wm == 0 and tiles.bn % tiles.wn == 0,
                "the warp tile must divide the block tile")
    cfg.require(tiles.wm * tiles.wn <= 64 * 64, "more than 128 accumulator registers per thread")
    cfg.require(tiles.reg_stages == 1 or tiles.bk > 16,
                "register double-buffering needs two 16-wide steps per K tile (bk > 16)")
    # a tile twice the matrix or more only repeats a smaller tile's work
    cfg.require(tiles.bm // 2 < shape.m or tiles.bm == 32, "the block tile is twice the matrix's rows")
    cfg.require(tiles.bn // 2 < shape.n or tiles.bn == 32, "the block tile is twice the matrix's columns")
    cfg.require(tiles.bk // 2 < shape.k or tiles.bk == 16, "the K tile is twice the reduction")
    cfg.require(shape.m >= 16 and shape.k >= 16, "fewer than 16 rows or reduction steps than one instruction")
    regs = tiles.registers_per_thread(shape.itemsize, shape.gather)
    cfg.resources(threads_per_block=tiles.threads, shared_bytes=tiles.shared_bytes(shape.itemsize),
                  registers_per_thread=regs, registers_per_block=regs * tiles.threads)
    return t


@template("matmul", "cuda", name="matmul_tensorcore", model=tensorcore_model, applies=tensor_core_op)
def matmul_tensorcore(cfg: TemplateConfig, op: Any) -> Any:
    # ALCOP's space as published (its analytical model and exhaustive tables): no split of K
    return _tensor_core_gemm(cfg, op, _tensorcore_space(cfg, gemm_shape(op)))


@template("batch_matmul", "cuda", name="batch_matmul_tensorcore", model=tensorcore_model,
          applies=tensor_core_op)
def batch_matmul_tensorcore(cfg: TemplateConfig, op: Any) -> Any:
    return _tensor_core_gemm(cfg, op, _tensorcore_space(cfg, gemm_shape(op)))


def _few_channels(op: Any, target: Target) -> bool:
    """A convolution of fewer input channels than a tensor-core K step (an image's colors)."""
    return target.has("gpu") and op.shape["C"] < MMA_M16N8K16.shape[2]


def _padded_channels_tensor_core(op: Any, target: Target) -> bool:
    """A 16-bit convolution the tensor cores compute over a channel-padded copy of its input: fewer
    channels than a K step, or channels that are no whole 16-byte vectors (``igemm.pads_channels``)."""
    return tensor_core_op(op, target) and pads_channels(op.shape["C"], op.func.tensor("I").dtype.itemsize)


def _many_channels_tensor_core(op: Any, target: Target) -> bool:
    return tensor_core_op(op, target) and not _padded_channels_tensor_core(op, target)


def _few_channels_cuda_cores(op: Any, target: Target) -> bool:
    return _few_channels(op, target) and not tensor_core_op(op, target)



def _conv_sizes(op: Any) -> dict[str, int]:
    """A 2-D implicit GEMM's sizes and its output's rows M = N·P·Q."""
    s = op.shape
    P = (s["H"] + 2 * s["padding"] - s["R"]) // s["stride"] + 1
    Q = (s["W"] + 2 * s["padding"] - s["S"]) // s["stride"] + 1
    dims = {k: s[k] for k in ("N", "H", "W", "C", "K", "R", "S", "stride", "padding")}
    return {**dims, "M": s["N"] * P * Q}


def _tile_name(kernel: str, params: dict[str, int]) -> str:
    """A block tile as a word: ``wgmma:128x64x64`` (bm × bn × bk), ``mma:64x64x32:32x32`` (and the warp tile)."""
    name = f"{kernel}:{params['bm']}x{params['bn']}x{params['bk']}"
    return name + (f":{params['wm']}x{params['wn']}" if kernel == "mma" else "")


def _parse_tile(name: str) -> tuple[str, dict[str, int]]:
    kernel, block, *warp = name.split(":")
    params = dict(zip(("bm", "bn", "bk"), map(int, block.split("x")), strict=True))
    if warp:
        params.update(zip(("wm", "wn"), map(int, warp[0].split("x")), strict=True))
    return kernel, params


def _split_name(rows: bool, chunks: int) -> str:
    """A split of an implicit GEMM's reduction as a word: ``none``, ``rows`` (a chunk per filter row),
    ``c2`` (two channel chunks), ``rows+c2``."""
    return "+".join((["rows"] if rows else []) + ([f"c{chunks}"] if chunks > 1 else [])) or "none"


def _parse_split(name: str) -> tuple[bool, int]:
    parts = name.split("+")
    return "rows" in parts, next((int(p[1:]) for p in parts if p.startswith("c")), 1)


# wide warpgroup-MMA tiles of 64 rows the convolution template adds to igemm_options' tiles (the
# default's): one warpgroup issuing wgmma.m64n256k16 (or n192) gathers a 64-row input tile for as many
# filters as a 128×128 tile's two warpgroups gather 128 rows for (half the gathered copies per product,
# the implicit GEMM's costly part); 128 rows × 256 filters spill their accumulators
IGEMM_WIDE_TILES = (256, 192)


@template("conv2d_igemm", "cuda", name="conv2d_igemm_choices", applies=_many_channels_tensor_core)
def conv2d_igemm_choices(cfg: TemplateConfig, op: Any) -> Any:
    """The implicit GEMM on the tensor cores as the default builds it (``igemm_schedule``): the kernel
    and block tile (``tile``: warpgroup MMA or mma.sync), the split of the reduction over filter rows
    and channel chunks (``split``), the pipeline's stages and, on warpgroup MMA, the MMA groups left
    in flight (``inflight``: 1 as the default, 0 or 2); the tiles and splits those that
    ``igemm_options`` ranks (and mma.sync's other block tile, warpgroup MMA's wide 64-row tiles:
    ``IGEMM_WIDE_TILES``), the default's (``igemm_choice``) first."""
    d = _conv_sizes(op)
    M, C, K, R, S = d["M"], d["C"], d["K"], d["R"], d["S"]
    itemsize = op.func.tensor("I").dtype.itemsize
    tiles: list[object] = []
    splits: list[object] = []
    first, first_inflight = None, None
    wgmma = igemm_kernel(cfg.target, M, C, K, R * S)[0] == "wgmma"
    if cfg.mode == "define":
        args = (cfg.target, M, C, K, R, S, itemsize, d["N"] * d["H"] * d["W"], op.func.tensor("O").dtype.itemsize)
        options, default = igemm_options(*args), igemm_choice(*args)
        # options of one tile with other splits name it once
        names = list(dict.fromkeys(_tile_name(o.kernel, o.params) for o in options))
        tiles = _first(_tile_name(default.kernel, default.params), names)
        if default.kernel == "mma":  # the other tiles of mma.sync's default (128×128 or 64×64)
            for other in (dict(bm=128, bn=128, wm=64, wn=64), dict(bm=64, bn=64, wm=32, wn=32)):
                tiles = _first(tiles[0], [*tiles, _tile_name("mma", {**default.params, **other})])
        if default.kernel == "wgmma":
            tiles = _first(tiles[0], [*tiles, *(_tile_name("wgmma", dict(bm=64, bn=bn, bk=64))
                                                for bn in IGEMM_WIDE_TILES if bn <= K)])
        bks = {_parse_tile(str(t))[1]["bk"] for t in tiles}
        splits = _first(_split_name(default.rows, default.chunks),
                        [_split_name(r, c) for bk in sorted(bks) for r, c in igemm_splits(C, R, S, bk)])
        deepest = no_deeper(default.params, chunk_steps(C, R, S, default.params["bk"], default.rows,
                                                           default.chunks))
        first, first_inflight = deepest["stages"], deepest.get("inflight")
    kernel, params = _parse_tile(str(cfg.knob("tile", tiles)))
    rows, chunks = _parse_split(str(cfg.knob("split", splits)))
    stages = cfg.integer("stages", 1, 6, default=first or 4)
    inflight = int(cfg.knob("inflight", _first(first_inflight, [1, 0, 2]))) if wgmma else 1  # type: ignore[arg-type]
    bk = params["bk"]
    steps = chunk_steps(C, R, S, bk, rows, chunks)
    if cfg.mode != "apply":  # at the workload's own sizes: a split of whole channel tiles, each kernel once
        cfg.require((rows, chunks) in igemm_splits(C, R, S, bk), "a split of channels in chunks of no whole K tile")
        # wgmma reads the filter tile in 128-byte swizzled rows: 64 filters or a multiple (72 filters in a
        # 128-wide tile are a 72-wide one)
        cfg.require(kernel != "wgmma" or min(params["bn"], K) % 64 == 0,
                    "a filter tile of warpgroup MMA that is not a multiple of 64 filters")
        cfg.require(stages <= steps, "more stages than the K loop has steps: the same kernel as fewer")
        cfg.require(kernel != "wgmma" or inflight <= max(0, min(stages, steps) - 2),
                    "more MMA groups in flight than the pipeline's stages leave: the same kernel as fewer")
    elif (rows, chunks) not in igemm_splits(C, R, S, bk):  # applied at other sizes, where the split does not fit
        rows, chunks = False, 1
    if kernel == "wgmma":
        params = {**params, "stages": stages, "inflight": inflight}
        tile: Any = WgmmaConfig(params["bm"], params["bn"], bk, stages, inflight)
    else:
        params = {**params, "stages": stages, "reg_stages": 2 if bk > MMA_M16N8K16.shape[2] else 1}
        tile = TileConfig(params["bm"], params["bn"], bk, params["wm"], params["wn"], stages, params["reg_stages"])
    regs = tile.registers_per_thread(itemsize, kernel == "mma")
    cfg.resources(threads_per_block=tile.threads, shared_bytes=tile.shared_bytes(itemsize),
                  registers_per_thread=regs, registers_per_block=regs * tile.threads)
    sched = cfg.schedule(op.func)
    if kernel != igemm_kernel(cfg.target, M, C, K, R * S)[0]:  # applied at sizes of another kernel: its default
        return op.schedule(cfg.target)
    choice = IgemmChoice(kernel, no_deeper(params, steps), rows, chunks)
    return igemm_schedule(sched, cfg.target, choice, *(d[k] for k in ("N", "H", "W", "C", "K", "R", "S", "stride",
                                                                       "padding"))) or sched


@template("conv2d_igemm", "cuda", name="conv2d_igemm_rows", applies=_padded_channels_tensor_core)
def conv2d_igemm_rows(cfg: TemplateConfig, op: Any) -> Any:
    """A convolution of few input channels as the default builds it (``igemm_rows``: channels and image
    padded, each filter row one run of the reduction, on mma.sync): block and warp tiles, K tile,
    stages and the split of the reduction (``split``: over the filter rows and/or run chunks), the
    default's (``igemm_rows_choice``) first."""
    d = _conv_sizes(op)
    cp, Sp = padded_channels(d["C"], d["S"])
    run = Sp * cp
    itemsize = op.func.tensor("I").dtype.itemsize
    default = igemm_rows_choice(cfg.target, d["M"], d["K"], d["R"], run, itemsize,
                                (d["N"] * d["H"] * d["W"] * cp + d["R"] * run * d["K"]) * itemsize,
                                op.func.tensor("O").dtype.itemsize)
    usual, usual_bk = {k: default.params[k] for k in ("bm", "bn", "wm", "wn")}, default.params["bk"]
    names = [f"{t['bm']}x{t['bn']}:{t['wm']}x{t['wn']}" for t in (
        usual, dict(bm=128, bn=128, wm=64, wn=64), dict(bm=64, bn=64, wm=32, wn=32), dict(bm=128, bn=32, wm=32, wn=32),
        dict(bm=64, bn=32, wm=32, wn=32))]
    block, warp = (part.split("x") for part in str(cfg.knob("tile", _first(names[0], names))).split(":"))
    tiles = {"bm": int(block[0]), "bn": int(block[1]), "wm": int(warp[0]), "wn": int(warp[1])}
    bk = int(cfg.knob("bk", _first(usual_bk, [32, 16])))  # type: ignore[call-overload]
    stages = cfg.integer("stages", 1, 4, default=3)
    splits = [_split_name(r, c) for b in (32, 16) for r, c in igemm_splits(run, d["R"], 1, b)]
    rows, chunks = _parse_split(str(cfg.knob("split", _first(_split_name(default.rows, default.chunks), splits))))
    cfg.require(bk == 16 or run % 32 == 0, "K tiles of 32 that do not divide a filter row's run")
    if cfg.mode != "apply":
        cfg.require((rows, chunks) in igemm_splits(run, d["R"], 1, bk), "a split of the runs in no whole K tiles")
    reg_stages = 2 if bk > MMA_M16N8K16.shape[2] else 1
    tile = TileConfig(tiles["bm"], tiles["bn"], bk, tiles["wm"], tiles["wn"], stages, reg_stages)
    regs = tile.registers_per_thread(itemsize, True)
    cfg.resources(threads_per_block=tile.threads, shared_bytes=tile.shared_bytes(itemsize),
                  registers_per_thread=regs, registers_per_block=regs * tile.threads)
    cfg.schedule(op.func)
    return igemm_rows(cfg.target, *(d[k] for k in ("N", "H", "W", "C", "K", "R", "S", "stride", "padding")),
                      op.func.tensor("I").dtype.name, op.func.tensor("O").dtype.name, tiles, bk, stages,
                      (rows, chunks))


def _igemm_cuda(cfg: TemplateConfig, op: Any, taps: list[str]) -> Any:
    """``igemm_cuda``: threads per block, output pixels per thread and output channels per block (the
    register tile is their product); the first choices are the default's for large outputs."""
    shape = gemm_shape(op)
    pixels = int(cfg.knob("pixels", [128, 64, 256]))  # type: ignore[call-overload]
    # the default's (``gpu_schedules._igemm``): as many as divide the output evenly
    usual_p = next(p for p in (4, 2, 1) if shape.m % (128 * p) == 0 or p == 1)
    usual_c = next(c for c in (16, 8, 4, 2, 1) if shape.n % c == 0)
    per_thread = int(cfg.knob("per_thread", _first(usual_p, [4, 2, 1, 8])))  # type: ignore[call-overload]
    channels = int(cfg.knob("channels", _first(usual_c, [16, 8, 4, 32])))  # type: ignore[call-overload]
    cfg.require(channels <= shape.n, "more output channels per block than the convolution has")
    _block_resources(cfg, pixels, shape.taps * shape.k * channels // 2, per_thread * channels + channels)
    sched = cfg.schedule(op.func)
    igemm_cuda(sched, "O", "col", "Wt", taps, pixels=pixels, channels=channels, per_thread=per_thread)
    return sched


@template("conv2d_igemm", "cuda", name="conv2d_igemm_cuda", applies=_few_channels_cuda_cores)
def conv2d_igemm_cuda(cfg: TemplateConfig, op: Any) -> Any:
    return _igemm_cuda(cfg, op, ["r", "s"])


@template("conv3d_igemm", "cuda", name="conv3d_igemm_cuda", applies=_few_channels)
def conv3d_igemm_cuda(cfg: TemplateConfig, op: Any) -> Any:
    return _igemm_cuda(cfg, op, ["t", "r", "s"])


@template("conv2d_igemm", "cuda", name="conv2d_igemm_tensorcore", model=tensorcore_model,
          applies=_many_channels_tensor_core)
def conv2d_igemm_tensorcore(cfg: TemplateConfig, op: Any) -> Any:
    tiles = _tensorcore_space(cfg, gemm_shape(op))
    sched = cfg.schedule(op.func)
    igemm_tensorcore(sched, "O", "col", "Wt", ["r", "s"], **tiles)
    return sched


@template("conv3d_igemm", "cuda", name="conv3d_igemm_tensorcore", model=tensorcore_model,
          applies=_many_channels_tensor_core)
def conv3d_igemm_tensorcore(cfg: TemplateConfig, op: Any) -> Any:
    tiles = _tensorcore_space(cfg, gemm_shape(op))
    sched = cfg.schedule(op.func)
    igemm_tensorcore(sched, "O", "col", "Wt", ["t", "r", "s"], **tiles)
    return sched
