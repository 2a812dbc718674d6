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

from ...intrinsics import MMA_M16N8K16
from ...ops.gpu_schedules import (
    GEMV_MAX_SPLIT,
    GEMV_ROWS,
    MAX_SPLIT,
    align_operands,
    gemm_cuda,
    gemm_tensorcore,
    gemm_wgmma,
    gemv_cuda,
    igemm_cuda,
    igemm_tensorcore,
    sum_partials,
)
from ...target import Target
from ..analytical import GemmShape, TileConfig, WgmmaConfig, predict, raster_group, split_seconds
from ..space import TemplateConfig
from ..task import template


def _block_resources(cfg: TemplateConfig, threads: int, shared_floats: int, accumulators: int) -> None:
    regs = accumulators + 40  # accumulators, operands held in registers, addressing and counters
    cfg.require(threads >= 32, "fewer than a warp of threads per block")
    cfg.resources(threads_per_block=threads, shared_bytes=4 * shared_floats, registers_per_thread=regs,
                  registers_per_block=regs * threads)


def _gemm_space(cfg: TemplateConfig, M: int, N: int) -> dict[str, int]:
    bm = cfg.knob("bm", [128, 32, 64, 256])
    bn = cfg.knob("bn", [128, 32, 64, 256])
    bk = cfg.knob("bk", [8, 4, 16, 32])
    tm = cfg.knob("tm", [8, 2, 4])
    tn = cfg.knob("tn", [8, 2, 4])
    stages = cfg.integer("stages", 1, 4, default=3)
    cfg.require((bm // 2) % (tm // 2) == 0 and (bn // 2) % (tn // 2) == 0,
                "the register tile must divide the block tile")
    # a grid dimension of one block disappears from the loop nest, which the backend rejects
    cfg.require(bm < M and bn < N, "the block tile covers the whole matrix")
    threads = (bm // tm) * (bn // tn)  # type: ignore[operator]
    _block_resources(cfg, threads, stages * bk * (bm + bn) + 2, tm * tn + tm + tn)  # type: ignore[operator]
    return {"bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn, "stages": stages}  # type: ignore[dict-item]


def _split_built(op: Any, chosen: int) -> int:
    """The split of K a configuration builds for ``op``: the operator's own ``split_k`` when it was
    given one; else 1 unless an unbatched matmul; else the ``chosen`` split, or 1 where it does not
    divide K (the configuration applied at other sizes: the tuner's check at prime sizes)."""
    if op.shape.get("split_k") is not None:
        return int(op.shape["split_k"])
    if op.name != "matmul":
        return 1
    return chosen if op.shape["K"] % chosen == 0 else 1


def _split(cfg: TemplateConfig, op: Any, bk: int | None = None, decide: bool = True) -> int:
    """The split of K (split-K): the operator's own, or with ``decide`` (an unbatched matmul only) 1 or
    a divisor of K up to MAX_SPLIT, in chunks of at least two K tiles; with ``bk``, chunks of whole K
    tiles (the tensor cores compute whole tiles)."""
    K = op.shape["K"]
    if not decide or op.name != "matmul" or op.shape.get("split_k") is not None:  # the operator's split
        split = _split_built(op, 1)
    else:
        split = _split_built(op, int(cfg.knob("split", [d for d in range(1, MAX_SPLIT + 1) if K % d == 0])))  # type: ignore[call-overload]
        cfg.require(split == 1 or K // split >= 2 * (bk or 16), "chunks of fewer than two K tiles")
    cfg.require(split == 1 or bk is None or (K // split) % bk == 0, "chunks of K that are not whole K tiles")
    return split


def _gemm_schedule(cfg: TemplateConfig, op: Any, split: int, batch_loops: int = 1) -> tuple[Any, Any, Any]:
    """A fresh schedule for the template: of the op's own function, or of its split restructuring
    (``ops.matmul_func``) — the scheduled computation and its batch loop(s). ``batch_loops``: how many
    batch loops the kernel takes (a split batched product has two, its batch and its chunks)."""
    batch = "bb" if op.name == "batch_matmul" else None
    own = op.shape.get("split_k") or 1
    if split == 1 and own == 1:
        return cfg.schedule(op.func), "C", batch
    cfg.require(not batch or batch_loops >= 2, f"a batched product's reduction is split only on the GEMV kernel (at "
                f"most {GEMV_ROWS} rows): this kernel takes one batch loop; leave split_k unset")
    from ...ops.matmul import matmul_func
    s = op.shape
    func = op.func if split == own else matmul_func(s["M"], s["N"], s["K"], op.func.inputs[0].dtype.name, split,
                                                    op.func.outputs[0].dtype.name)
    sched = cfg.schedule(func)
    sum_partials(sched, "C", batch=batch)
    return sched, "P", (batch, "s") if batch else "s"


GEMV_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""The GEMV template's splits of K besides K's divisors: chunks of ⌈K/S⌉ (the last one shorter: the
GEMV sums partial K tiles), up to ``GEMV_MAX_SPLIT`` (its partial products are a few rows)."""


def _gemv_split(cfg: TemplateConfig, op: Any, bk: int) -> int:
    """The GEMV's split of K: the operator's own; else (an unbatched matmul) one of ``GEMV_SPLITS``
    leaving no chunk empty, in chunks of at least two K tiles; applied at a size where it leaves a
    chunk empty, 1."""
    K = op.shape["K"]
    if op.name != "matmul" or op.shape.get("split_k") is not None:
        return _split_built(op, 1)
    # and the divisors of K up to MAX_SPLIT (chunks of one length: the space before GEMV_SPLITS)
    fits = sorted({s for s in GEMV_SPLITS if s <= GEMV_MAX_SPLIT and (s - 1) * -(-K // s) < K}
                  | {d for d in range(1, MAX_SPLIT + 1) if K % d == 0})
    split = int(cfg.knob("split", fits))  # type: ignore[call-overload]
    if (split - 1) * -(-K // split) >= K:
        split = 1
    cfg.require(split == 1 or -(-K // split) >= 2 * bk, "chunks of fewer than two K tiles")
    return split


def _gemv_op(op: Any, target: Target) -> bool:
    """A matrix–vector-like product (at most GEMV_ROWS rows) on a GPU: the GEMV template applies first."""
    return target.has("gpu") and op.shape.get("M", GEMV_ROWS + 1) <= GEMV_ROWS


def _gemv(cfg: TemplateConfig, op: Any) -> Any:
    """``gemv_cuda``: threads per block (each 8 bytes of B's columns through shared memory, or 16 bytes
    loaded straight into registers: ``direct``), the K tile, stages and the split of K; the first
    choices are the library's usual ones."""
    itemsize = op.func.inputs[0].dtype.itemsize
    threads = int(cfg.knob("threads", [128, 64, 32, 256]))  # type: ignore[call-overload]
    bk = int(cfg.knob("bk", [32, 16, 64, 8]))  # type: ignore[call-overload]
    stages = cfg.integer("stages", 2, 6, default=4)
    direct = bool(cfg.knob("direct", [False, True]))
    vec = (16 if direct else 8) // itemsize
    split = _gemv_split(cfg, op, bk)
    M = op.shape["M"]
    cfg.require(threads == 32 or threads * vec // 2 < op.shape["N"], "the block is twice the matrix's columns")
    b_tile = 0 if direct else threads * vec  # B in registers (direct) or in shared tiles
    b_regs = bk * vec * itemsize // 4 if direct else vec
    cfg.require(not direct or b_regs <= 64, "a direct K step of more than 64 registers of B per thread")
    cfg.resources(threads_per_block=threads, shared_bytes=stages * bk * (b_tile + M) * itemsize,
                  registers_per_thread=M * vec + b_regs + 32, registers_per_block=(M * vec + b_regs + 32) * threads)
    sched, out, batch = _gemm_schedule(cfg, op, split, batch_loops=2)
    # a direct GEMV reads B's rows in place whatever their alignment (vectors where they allow)
    align_operands(sched, out, ("A",) if direct else ("A", "B"), granule=4)
    # whole register tiles (products over constant loops) where no K tile crosses into the next chunk
    whole = split == 1 or -(-op.shape["K"] // split) % bk == 0
    gemv_cuda(sched, out, "A", "B", bn=threads * vec, vec=vec, bk=bk, stages=stages, batch=batch, direct=direct,
              whole=whole)
    return sched


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
    tiles = _gemm_space(cfg, op.shape["M"], op.shape["N"])
    # whole register tiles: chunks of whole K tiles
    sched, out, batch = _gemm_schedule(cfg, op, _split(cfg, op, tiles["bk"]))
    gemm_cuda(sched, out, "A", "B", batch=batch, **tiles)
    return sched


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


@template("conv2d", "cuda")
def conv2d_cuda(cfg: TemplateConfig, op: Any) -> Any:
    """Direct convolution: ``kt`` output channels per thread in registers, ``pixels`` output pixels
    per block (one per thread), weights of the block's channels optionally staged in shared memory."""
    s = op.shape
    kt = cfg.knob("kt", [k for k in (8, 1, 2, 4, 16) if k <= s["K"]])
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


def _wgmma_space(cfg: TemplateConfig, shape: GemmShape) -> dict[str, int]:
    """Block tile bm × bn (bm/64 warpgroups issuing wgmma.m64n{bn}k16), K tile bk, shared stages,
    the MMA groups left in flight and the block order (``group`` rows of blocks launched together:
    0 sizes it to the target's L2 as the default does, ``raster_group``; 1 is row by row); the first
    choices are the library's default (wgmma_gemm_config)."""
    t = {"bm": int(cfg.knob("bm", [128, 64, 256])), "bn": int(cfg.knob("bn", [256, 128, 64, 192])),  # type: ignore[call-overload]
         "bk": int(cfg.knob("bk", [64, 128, 32]))}  # type: ignore[call-overload]
    t["stages"] = cfg.integer("stages", 1, 6, default=4)
    t["inflight"] = cfg.integer("inflight", 0, 2, default=1)
    group = int(cfg.knob("group", [0, 1, 8, 16]))  # type: ignore[call-overload]
    t["group"] = group or raster_group(shape.m, shape.n, shape.k, shape.itemsize, t["bm"], cfg.target.l2_bytes)
    cfg.require(t["inflight"] == 0 or t["stages"] >= t["inflight"] + 2,
                "groups in flight need stages ≥ inflight + 2 (a slot to load ahead)")
    cfg.require(t["bm"] // 2 < shape.m or t["bm"] == 64, "the block tile is twice the matrix's rows")
    cfg.require(t["bn"] // 2 < shape.n or t["bn"] == 64, "the block tile is twice the matrix's columns")
    cfg.require(t["bk"] // 2 < shape.k or t["bk"] == 32, "the K tile is twice the reduction")
    cfg.require(shape.m >= 16, "fewer than 16 rows: the GEMV template (matmul_gemv) computes such products")
    tiles = WgmmaConfig(**t)
    regs = tiles.registers_per_thread(shape.itemsize)
    cfg.resources(threads_per_block=tiles.threads, shared_bytes=tiles.shared_bytes(shape.itemsize),
                  registers_per_thread=regs, registers_per_block=regs * tiles.threads)
    return t


def wgmma_model(op: Any, target: Any, values: dict[str, object]) -> float:
    """The analytical prediction (seconds) of a warpgroup-MMA configuration; a split of K is predicted
    as its chunks, a batch of shorter products, plus the partial sums' round trip."""
    shape = gemm_shape(op)
    split = _split_built(op, int(values.get("split", 1)))  # type: ignore[call-overload]
    chunks = replace(shape, k=shape.k // split, batch=shape.batch * split)
    cfg = WgmmaConfig.of(values)
    if not values.get("group"):  # 0: sized to the L2 as the template builds it
        cfg = replace(cfg, group=raster_group(shape.m, shape.n, shape.k, shape.itemsize, cfg.bm, target.l2_bytes))
    return predict(chunks, cfg, target) + split_seconds(target, shape.m, shape.n, shape.batch, split)


@template("matmul", "cuda", name="matmul_wgmma", model=wgmma_model, applies=wgmma_op)
def matmul_wgmma(cfg: TemplateConfig, op: Any) -> Any:
    return _tensor_core_gemm(cfg, op, _wgmma_space(cfg, gemm_shape(op)), gemm_wgmma)


@template("batch_matmul", "cuda", name="batch_matmul_wgmma", model=wgmma_model, applies=wgmma_op)
def batch_matmul_wgmma(cfg: TemplateConfig, op: Any) -> Any:
    return _tensor_core_gemm(cfg, op, _wgmma_space(cfg, gemm_shape(op)), gemm_wgmma)


def _tensor_core_gemm(cfg: TemplateConfig, op: Any, tiles: dict[str, int], fn: Any, split: bool = True) -> Any:
    """A tensor-core GEMM of ``tiles``, K split (``split``: a decision) or not, its operands copied
    aligned where their rows are not 16-byte aligned (the library's default does the same)."""
    sched, out, batch = _gemm_schedule(cfg, op, _split(cfg, op, tiles["bk"], decide=split))
    align_operands(sched, out, granule=4)
    fn(sched, out, "A", "B", batch=batch, **tiles)
    return sched


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
    return _tensor_core_gemm(cfg, op, _tensorcore_space(cfg, gemm_shape(op)), gemm_tensorcore, split=False)


@template("batch_matmul", "cuda", name="batch_matmul_tensorcore", model=tensorcore_model,
          applies=tensor_core_op)
def batch_matmul_tensorcore(cfg: TemplateConfig, op: Any) -> Any:
    return _tensor_core_gemm(cfg, op, _tensorcore_space(cfg, gemm_shape(op)), gemm_tensorcore, split=False)


def _few_channels(op: Any, target: Target) -> bool:
    """A convolution of fewer input channels than a tensor-core K step (an image's colors)."""
    return target.has("gpu") and op.shape["C"] < MMA_M16N8K16.shape[2]


def _many_channels_tensor_core(op: Any, target: Target) -> bool:
    return tensor_core_op(op, target) and not _few_channels(op, target)


def _igemm_cuda(cfg: TemplateConfig, op: Any, taps: list[str]) -> Any:
    """``igemm_cuda``: threads per block, output pixels per thread and output channels per block (the
    register tile is their product); the first choices are the default's for large outputs."""
    shape = gemm_shape(op)
    pixels = int(cfg.knob("pixels", [128, 64, 256]))  # type: ignore[call-overload]
    per_thread = int(cfg.knob("per_thread", [4, 2, 1, 8]))  # type: ignore[call-overload]
    channels = int(cfg.knob("channels", [16, 8, 4, 32]))  # type: ignore[call-overload]
    cfg.require(channels <= shape.n, "more output channels per block than the convolution has")
    _block_resources(cfg, pixels, shape.taps * shape.k * channels // 2, per_thread * channels + channels)
    sched = cfg.schedule(op.func)
    igemm_cuda(sched, "O", "col", "Wt", taps, pixels=pixels, channels=channels, per_thread=per_thread)
    return sched


@template("conv2d_igemm", "cuda", name="conv2d_igemm_cuda", applies=_few_channels)
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
