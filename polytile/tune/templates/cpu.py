"""CPU schedule templates for the operators of ``polytile.ops``.

The matrix products share one BLIS-shaped space (``gemm_space``/``apply_gemm``): register tile
MR × NR (NR a number of vectors), cache blocks MC, NC, KC, the order of the block loops, which
operands are packed, which loop runs in parallel, whether the register tile is unrolled and full
tiles separated. Convolution tiles output channels × rows × a vector of columns over the reduction
(in a chosen order), with packed weights. Softmax and layer normalization are memory-bound: their
spaces choose the vector width, unrolling and parallelism.
"""

from __future__ import annotations

import math
from typing import Any

from ..space import TemplateConfig
from ..task import template


def _upto(values: list[int], limit: int, first: int | None = None) -> list[int]:
    """The values up to ``limit`` (at least the smallest), ``first`` (the default) leading."""
    out = sorted({v for v in values if v <= limit} | {min(values)})
    if first is not None:
        out = [first] + [v for v in out if v != first]
    return out


def _nearest(values: list[int], x: float) -> int:
    return min(values, key=lambda v: (abs(math.log(v / x)), v))


def gemm_space(cfg: TemplateConfig, M: int, N: int, K: int, batch: int = 1) -> dict[str, Any]:
    """Declare the decisions of a BLIS-shaped GEMM schedule and its constraints; returns the tiles.
    The first choice of every decision is the operator library's default tiling for the target."""
    from ...ops.matmul import cpu_gemm_tiles
    target = cfg.target
    lanes = target.vector_lanes(4)
    d = cpu_gemm_tiles(M, N, K, target)
    vec_choices = _upto([1, 2, 3, 4, 6], max(1, math.ceil(N / lanes)))
    nr_vecs = cfg.knob("nr_vecs", _upto(vec_choices, 6, _nearest(vec_choices, d["nr"] // lanes)))
    mr_choices = _upto([1, 2, 3, 4, 5, 6, 8, 10, 12, 14], M)
    mr = cfg.knob("mr", _upto(mr_choices, 14, _nearest(mr_choices, d["mr"])))
    nr = lanes * nr_vecs  # type: ignore[operator]
    blocks = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]
    mc_blocks = cfg.knob("mc_blocks", _upto(blocks, 64, _nearest(blocks, d["mc"] / mr)))  # type: ignore[operator]
    nc_choices = [1, 2, 4, 8, 16, 32, 64]
    nc_blocks = cfg.knob("nc_blocks", _upto(nc_choices, 64, _nearest(nc_choices, d["nc"] / nr)))
    kc_choices = _upto([32, 64, 128, 192, 256, 384, 512, 768, 1024], K)
    kc = cfg.knob("kc", _upto(kc_choices, 1024, _nearest(kc_choices, d["kc"])))
    order = cfg.reorder("outer_order", ["jc", "kc", "ic"])
    inner = cfg.reorder("inner_order", ["jr", "ir"])
    pack_a = cfg.knob("pack_a", [True, False])
    pack_b = cfg.knob("pack_b", [True, False])
    par = cfg.knob("parallel", ["ic", "jc", "jr", "batch"] if batch > 1 else ["ic", "jc", "jr"])
    unroll_m = cfg.tag("unroll_m", "im", ["unroll", "serial"])
    separate = cfg.knob("separate", [True, False])
    mc = mr * mc_blocks  # type: ignore[operator]
    nc = nr * nc_blocks  # type: ignore[operator]
    cfg.require(mc <= max(M, mr) * 2 and nc <= max(N, nr) * 2, "cache blocks far larger than the matrix")
    cfg.require(mc // 2 < M or mc_blocks == 1, "MC block covers the matrix twice")
    cfg.require(nc // 2 < N or nc_blocks == 1, "NC block covers the matrix twice")
    cfg.resources(vector_registers=mr * nr_vecs + nr_vecs + 1)  # type: ignore[operator]
    return {"mr": mr, "nr": nr, "mc": mc, "nc": nc, "kc": kc, "lanes": lanes, "order": order, "inner": inner,
            "pack_a": pack_a, "pack_b": pack_b, "parallel": par, "unroll_m": unroll_m, "separate": separate}


def apply_gemm(sched: Any, out: str, a: str, b: str, t: dict[str, Any], b_transposed: bool = False,
               batch: str | None = None) -> None:
    """Schedule ``out[(batch,) i, j] = sum_k a[.., i, k] * b[.., k, j]`` (``b[.., j, k]`` when
    ``b_transposed``) with the tiles of ``gemm_space``."""
    mr, nr, lanes = t["mr"], t["nr"], t["lanes"]
    st = sched[out]
    st.split("j", t["nc"], "jc", "j1").split("k", t["kc"], "kc", "k1").split("i", t["mc"], "ic", "i1")
    st.split("j1", nr, "jr", "jn").split("i1", mr, "ir", "im").split("jn", lanes, "jv", "jl")
    st.reorder(*((batch,) if batch else ()), *t["order"], *t["inner"], "k1", "im", "jv", "jl")
    if t["pack_b"]:
        if b_transposed:
            st.cache(b, "kc", layout=lambda *e: (*e[:-2], e[-2] // nr, e[-1], e[-2] % nr))
        else:
            st.cache(b, "kc", layout=lambda *e: (*e[:-2], e[-1] // nr, e[-2], e[-1] % nr))
    if t["pack_a"]:
        st.cache(a, "ic", layout=lambda *e: (*e[:-2], e[-2] // mr, e[-1], e[-2] % mr))
    st.cache_write(t["inner"][1])
    if t["separate"]:
        st.separate(t["inner"][1])
    st.tag("im", t["unroll_m"]).unroll("jv").vectorize("jl")
    st.parallel(batch if t["parallel"] == "batch" else t["parallel"])


@template("matmul", "cpu")
def matmul_cpu(cfg: TemplateConfig, op: Any) -> Any:
    s = op.shape
    tiles = gemm_space(cfg, s["M"], s["N"], s["K"])
    sched = cfg.schedule(op.func)
    apply_gemm(sched, "C", "A", "B", tiles)
    return sched


@template("batch_matmul", "cpu")
def batch_matmul_cpu(cfg: TemplateConfig, op: Any) -> Any:
    s = op.shape
    tiles = gemm_space(cfg, s["M"], s["N"], s["K"], batch=s["batch"])
    sched = cfg.schedule(op.func)
    apply_gemm(sched, "C", "A", "B", tiles, batch="bb")
    return sched


@template("dense", "cpu")
def dense_cpu(cfg: TemplateConfig, op: Any) -> Any:
    s = op.shape
    tiles = gemm_space(cfg, s["M"], s["N"], s["K"])
    epilogue = cfg.knob("epilogue", ["vector", "fused_row"])
    sched = cfg.schedule(op.func)
    apply_gemm(sched, "XW", "X", "W", tiles, b_transposed=True)
    ep = sched["Y"]
    ep.split("j", tiles["lanes"], "jo", "jl").vectorize("jl")
    if epilogue == "vector":
        ep.parallel("i")
    return sched


@template("conv2d", "cpu")
def conv2d_cpu(cfg: TemplateConfig, op: Any) -> Any:
    """Direct NCHW convolution: an output tile of k_tile channels × p_tile rows × q_tile columns (a
    vector) accumulated in registers over the channels and filter taps, in a chosen order (another
    order than the algorithm's reassociates the sum)."""
    s = op.shape
    target = cfg.target
    lanes = target.vector_lanes(4)
    K = s["K"]
    P = (s["H"] + 2 * s["padding"] - s["dilation"] * (s["R"] - 1) - 1) // s["stride"] + 1
    Q = (s["W"] + 2 * s["padding"] - s["dilation"] * (s["S"] - 1) - 1) // s["stride"] + 1
    _, k_tile = cfg.split("tile_k", K, 2, inner=[1, 2, 3, 4, 6, 8, 12, 16], default=[min(8, K)])
    _, p_tile = cfg.split("tile_p", P, 2, inner=[1, 2, 4, 7, 8])
    q_tile = cfg.knob("q_tile", _upto(sorted({lanes // 2, lanes, 2 * lanes, 7, 14, 28, Q}), max(Q, 1),
                                      min(lanes, Q)))
    order = cfg.reorder("reduction_order", ["c", "r", "s"],
                        orders=[["c", "r", "s"], ["r", "s", "c"], ["r", "c", "s"]])
    pack_w = cfg.knob("pack_w", [True, False])
    par = cfg.knob("parallel", ["ko", "po"])
    unroll_p = cfg.tag("unroll_p", "pi", ["unroll", "serial"])
    separate = cfg.knob("separate", [True, False])
    vecs = math.ceil(q_tile / lanes)  # type: ignore[operator]
    cfg.resources(vector_registers=k_tile * p_tile * vecs + vecs + 1)
    sched = cfg.schedule(op.func)
    st = sched["O"]
    st.split("k", k_tile, "ko", "ki").split("p", p_tile, "po", "pi").split("q", q_tile, "qo", "qi")
    if tuple(order) != ("c", "r", "s"):
        st.reassociate()
    st.reorder("n", "ko", "po", "qo", *order, "ki", "pi", "qi")
    if pack_w:
        st.cache("Wt", "ko", layout=lambda kk, cc, rr, ss: (cc, rr, ss, kk))
    st.cache_write("qo")
    if separate:
        st.separate("qo")
    st.unroll("ki").tag("pi", unroll_p).vectorize("qi").parallel(par)
    if "Ipad" in sched.stage_names():
        sched["Ipad"].parallel("cc")
    return sched


def _row_space(cfg: TemplateConfig, N: int) -> tuple[int, bool, bool]:
    target = cfg.target
    lanes = target.vector_lanes(4)
    width = cfg.knob("vector", _upto([lanes // 4, lanes // 2, lanes, 2 * lanes, 4 * lanes], max(N, 1)))
    parallel = cfg.knob("parallel", [True, False])
    fuse = cfg.knob("fuse_rows", [True, False])
    return width, parallel, fuse  # type: ignore[return-value]


@template("softmax", "cpu")
def softmax_cpu(cfg: TemplateConfig, op: Any) -> Any:
    width, parallel, fuse = _row_space(cfg, op.shape["N"])
    sched = cfg.schedule(op.func)
    if fuse:
        sched["ex"].after(sched["mx"], "i")
        sched["sm"].after(sched["ex"], "i")
        sched["Y"].after(sched["sm"], "i")
    sched["Y"].split("j", width, "jo", "jl").vectorize("jl")
    if parallel:
        for name in (["mx"] if fuse else ["mx", "ex", "sm", "Y"]):
            sched[name].parallel("i")
    return sched


@template("layernorm", "cpu")
def layernorm_cpu(cfg: TemplateConfig, op: Any) -> Any:
    width, parallel, fuse = _row_space(cfg, op.shape["N"])
    sched = cfg.schedule(op.func)
    if fuse:
        sched["s2"].after(sched["s1"], "i")
        sched["Y"].after(sched["s2"], "i")
    sched["Y"].split("j", width, "jo", "jl").vectorize("jl")
    if parallel:
        for name in (["s1"] if fuse else ["s1", "s2", "Y"]):
            sched[name].parallel("i")
    return sched
