"""CUDA schedule templates: the operator library's GPU schedules with their tile sizes as decisions.

Matrix products (matmul, batch_matmul, dense) tune the block tile BM × BN, the reduction step BK
staged in shared memory, the TM × TN register tile of a thread and the number of pipeline stages
of the shared tiles (an integer decision) of ``gpu_schedules.gemm_cuda``.
Conv2d tunes the structure of the library's direct convolution: output channels per thread (a
register tile), output pixels per block, whether the block's weights are staged in shared memory
and whether the channel loop is unrolled. Each template declares threads per block, shared memory
and registers, so configurations over the target's limits are discarded before anything is built.
"""

from __future__ import annotations

from typing import Any

from ...ops.gpu_schedules import gemm_cuda
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


@template("matmul", "cuda")
def matmul_cuda(cfg: TemplateConfig, op: Any) -> Any:
    tiles = _gemm_space(cfg, op.shape["M"], op.shape["N"])
    sched = cfg.schedule(op.func)
    gemm_cuda(sched, "C", "A", "B", **tiles)
    return sched


@template("batch_matmul", "cuda")
def batch_matmul_cuda(cfg: TemplateConfig, op: Any) -> Any:
    tiles = _gemm_space(cfg, op.shape["M"], op.shape["N"])
    sched = cfg.schedule(op.func)
    gemm_cuda(sched, "C", "A", "B", batch="bb", **tiles)
    return sched


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
