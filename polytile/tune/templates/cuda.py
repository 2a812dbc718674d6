"""CUDA schedule templates: thread-block tiling with shared-memory staging and register accumulators.

Matmul: the output is tiled into blocks of (ty·ii) × (tx·jj) elements, one thread computing ii × jj
of them in registers (``cache_write(loc="local")``); the reduction is cut into steps of ki, and an
operand tile of each step is staged in shared memory by the whole block (``cache_identity`` at the
block-level step loop, ``loc="shared"``; the backend spreads the copy over the threads and inserts
the barriers). Conv2d uses the same structure over output channels × output columns, rows of the
output spread over the grid. Each template declares threads per block, shared memory and
registers so that configurations over the target's limits are discarded before anything is built.

Staging *both* operands at one loop currently fails to lower ("the scope of cache … is split by
the AST generator"), so a decision chooses which operand is staged.
"""

from __future__ import annotations

from typing import Any

from ..space import TemplateConfig
from ..task import template

THREADS = [1, 2, 4, 8, 16, 32]
PER_THREAD = [1, 2, 4, 8]


def _block_resources(cfg: TemplateConfig, threads: int, shared_floats: int, accumulators: int) -> None:
    regs = accumulators + 32  # accumulators plus addressing, loop counters and operands
    cfg.require(threads >= 32, "fewer than a warp of threads per block")
    cfg.resources(threads_per_block=threads, shared_bytes=4 * shared_floats, registers_per_thread=regs,
                  registers_per_block=regs * threads)


@template("matmul", "cuda")
def matmul_cuda(cfg: TemplateConfig, op: Any) -> Any:
    s = op.shape
    _, ty, ii = cfg.split("tile_i", s["M"], 3, inner=sorted(set(THREADS + PER_THREAD)),
                          keep=lambda c: c[1] in THREADS and c[2] in PER_THREAD, default=[16, 4])
    _, tx, jj = cfg.split("tile_j", s["N"], 3, inner=sorted(set(THREADS + PER_THREAD)),
                          keep=lambda c: c[1] in THREADS and c[2] in PER_THREAD, default=[16, 4])
    _, ki = cfg.split("tile_k", s["K"], 2, inner=[4, 8, 16, 32], default=[8])
    staged = cfg.knob("shared", ["A", "B", "none"])
    unroll_k = cfg.tag("unroll_k", "ki", ["unroll", "serial"])
    tile = {"A": ty * ii, "B": tx * jj, "none": 0}[staged]  # type: ignore[index]
    _block_resources(cfg, ty * tx, ki * tile, ii * jj)
    sched = cfg.schedule(op.func)
    st = sched["C"]
    st.split("i", ty * ii, "bi", "i1").split("i1", ii, "ty", "ii")
    st.split("j", tx * jj, "bj", "j1").split("j1", jj, "tx", "jj")
    st.split("k", ki, "ko", "ki")
    st.reorder("bi", "bj", "ko", "ty", "tx", "ki", "ii", "jj")  # copies at ko: block level, cooperative
    if staged != "none":
        st.cache_identity(staged, "ko", loc="shared")
    st.cache_write("tx", loc="local")
    st.bind("bi", "blockIdx.y").bind("bj", "blockIdx.x").bind("ty", "threadIdx.y").bind("tx", "threadIdx.x")
    st.tag("ki", unroll_k).unroll("ii").unroll("jj")
    return sched


@template("conv2d", "cuda")
def conv2d_cuda(cfg: TemplateConfig, op: Any) -> Any:
    s = op.shape
    P = (s["H"] + 2 * s["padding"] - s["dilation"] * (s["R"] - 1) - 1) // s["stride"] + 1
    Q = (s["W"] + 2 * s["padding"] - s["dilation"] * (s["S"] - 1) - 1) // s["stride"] + 1
    _, tk, kk = cfg.split("tile_k", s["K"], 3, inner=sorted(set(THREADS + PER_THREAD)),
                          keep=lambda c: c[1] in THREADS and c[2] in PER_THREAD, default=[8, 4])
    _, tq, qq = cfg.split("tile_q", Q, 3, inner=sorted(set(THREADS + PER_THREAD)),
                          keep=lambda c: c[1] in THREADS and c[2] in PER_THREAD, default=[16, 1])
    _, ci = cfg.split("tile_c", s["C"], 2, inner=[1, 2, 4, 8, 16], default=[4])
    staged = cfg.knob("shared", ["weights", "input", "none"])
    halo = (tq * qq - 1) * s["stride"] + (s["S"] - 1) * s["dilation"] + 1
    shared = {"weights": ci * s["R"] * s["S"] * tk * kk, "input": ci * s["R"] * halo, "none": 0}[staged]
    _block_resources(cfg, tk * tq, shared, kk * qq)
    cfg.require(P >= 1, "empty output")
    sched = cfg.schedule(op.func)
    st = sched["O"]
    st.split("k", tk * kk, "bk", "k1").split("k1", kk, "tk", "kk")
    st.split("q", tq * qq, "bq", "q1").split("q1", qq, "tq", "qq")
    st.split("c", ci, "co", "ci")
    st.reorder("n", "bk", "p", "bq", "co", "tk", "tq", "ci", "r", "s", "kk", "qq")
    if staged == "weights":
        st.cache_identity("Wt", "co", loc="shared")
    elif staged == "input":
        st.cache_identity("Ipad" if "Ipad" in sched.stage_names() else "I", "co", loc="shared")
    st.cache_write("tq", loc="local")
    st.bind("bk", "blockIdx.y").bind("p", "blockIdx.x").bind("tk", "threadIdx.y").bind("tq", "threadIdx.x")
    st.unroll("kk").unroll("qq")
    if "Ipad" in sched.stage_names():
        # one block per padded row, one thread per column (the row fits a block)
        sched["Ipad"].bind("cc", "blockIdx.y").bind("h", "blockIdx.x").bind("w", "threadIdx.x")
    return sched
