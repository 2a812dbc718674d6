"""CPU schedule templates for the operators of ``polytile.ops``.

Each template chooses the parameters of the operator's own CPU schedule functions, and the first
choice of every decision is the operator's default schedule for the workload and target (the same
generated code), so the default is a point of every space and the tuners measure it first.

The matrix products share one GEMM space (``gemm_space``, ``ops.matmul.schedule_gemm_cpu``):
register tile MR × NR (NR a number of vectors), cache blocks MC, NC, KC, the order of the block
loops, which operands are packed (none: the streaming form the defaults take for few rows), which
loop runs in parallel (or none), whether the register tile is unrolled and full tiles separated;
``dense`` adds dot products over K (W read in place). Convolution tiles output channels × rows ×
columns over the reduction (in a chosen order), vectors along the columns or over the channels,
with packed weights. Softmax and layer normalization are memory-bound: their spaces choose the form
of the row reductions (lane-wise partials or one element at a time), the vectors per step, fusion
and parallelism.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ...ops.matmul import schedule_gemm_cpu
from ..space import TemplateConfig
from ..task import template


def _upto(values: list[int], limit: int, first: int | None = None) -> list[int]:
    """The values up to ``limit`` (at least the smallest), ``first`` (the default) leading."""
    out = sorted({v for v in values if v <= limit} | {min(values)})
    if first is not None:
        out = [first] + [v for v in out if v != first]
    return out


def _first(default: object, others: list[Any]) -> list[Any]:
    """``others`` with ``default`` moved (or added) to the front: the decision's default."""
    return [default] + [v for v in others if v != default]


def gemm_space(cfg: TemplateConfig, op: Any, default: Mapping[str, Any], batch: int = 0) -> dict[str, Any]:
    """Declare the decisions of a GEMM schedule (``ops.matmul.schedule_gemm_cpu``) and its constraints;
    returns the tiles and form. The first choice of every decision is the operator's ``default``
    schedule for the shape and target, so the default is a point of the space: the BLIS form, or for
    few rows the streaming form (``cpu_gemm_default``: nothing packed, one block of rows, B read 8 rows
    at a time, no parallel loop unless the columns come in several blocks)."""
    M, N, K = (op.shape[k] for k in ("M", "N", "K"))
    lanes = default["lanes"]
    # checks and builds read a configuration's values: the choices are made when the space is defined
    c = _gemm_choices(op, cfg.target, default, batch) if cfg.mode == "define" else _UNMADE
    nr_vecs = cfg.knob("nr_vecs", c["nr_vecs"])
    mr = cfg.knob("mr", c["mr"])
    nr = lanes * nr_vecs  # type: ignore[operator]
    mc_blocks = cfg.knob("mc_blocks", c["mc_blocks"])
    nc_blocks = cfg.knob("nc_blocks", c["nc_blocks"])
    kc = cfg.knob("kc", c["kc"])
    order = cfg.reorder("outer_order", ["jc", "kc", "ic"])
    inner = cfg.reorder("inner_order", ["jr", "ir"])
    pack_a = cfg.knob("pack_a", c["pack_a"])
    pack_b = cfg.knob("pack_b", c["pack_b"])
    par = cfg.knob("parallel", c["parallel"])
    unroll_m = cfg.tag("unroll_m", "im", ["unroll", "serial"])
    separate = cfg.knob("separate", [True, False])
    mc = mr * mc_blocks  # type: ignore[operator]
    nc = nr * nc_blocks  # type: ignore[operator]
    cfg.require(mc <= max(M, mr) * 2 and nc <= max(N, nr) * 2, "cache blocks far larger than the matrix")
    cfg.require(mc // 2 < M or mc_blocks == 1, "MC block covers the matrix twice")
    cfg.require(nc // 2 < N or nc_blocks == 1, "NC block covers the matrix twice")
    # B's vectors are held for the MR rows that use them (one row uses each as it is loaded)
    cfg.resources(vector_registers=mr * nr_vecs + (nr_vecs if mr > 1 else 1) + 1)  # type: ignore[operator]
    return {"mr": mr, "nr": nr, "mc": mc, "nc": nc, "kc": kc, "lanes": lanes, "order": order, "inner": inner,
            "pack_a": pack_a, "pack_b": pack_b, "parallel": par, "unroll_m": unroll_m, "separate": separate}


def _gemm_choices(op: Any, target: Any, default: Mapping[str, Any], batch: int) -> dict[str, list[Any]]:
    """The choices of ``gemm_space``'s knobs, the ``default``'s first."""
    M, N, K = (op.shape[k] for k in ("M", "N", "K"))
    lanes = default["lanes"]
    regs = 32 if target.vector_bits >= 512 else 16
    d = default
    return {
        "nr_vecs": _upto([1, 2, 3, 4, 6, 8, 16], max(1, min(regs // 2, math.ceil(N / lanes))), d["nr"] // lanes),
        "mr": _upto([1, 2, 3, 4, 5, 6, 8, 10, 12, 14], min(M, 14), d["mr"]),
        "mc_blocks": _first(d["mc"] // d["mr"], [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]),
        "nc_blocks": _first(d["nc"] // d["nr"], [1, 2, 4, 8, 16, 32, 64]),
        # a result stored narrower than its sums keeps them whole in its register tile (``whole_sums``)
        "kc": [K] if op.func.outputs[0].narrowed else
              _upto([8, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1024], K, d["kc"]),
        "pack_a": _first(d["pack_a"], [True, False]),
        "pack_b": _first(d["pack_b"], [True, False]),
        "parallel": _first(d["parallel"], ["ic", "jc", "jr", *(["batch"] if batch > 1 else []), None]),
    }


_UNMADE: Mapping[str, list[Any]] = collections.defaultdict(list)
"""The choices outside define mode: none (``TemplateConfig.knob`` returns the configuration's value)."""


def _gemm_default(cfg: TemplateConfig, op: Any, batch: int = 0) -> Mapping[str, Any]:
    from ...ops.matmul import whole_sums
    s, out = op.shape, op.func.outputs[0]
    tiles = _cpu_gemm_default(s["M"], s["N"], s["K"], cfg.target, out.value_dtype.itemsize, batch)
    return whole_sums(tiles, out, s["K"])  # type: ignore[arg-type]


@functools.lru_cache(maxsize=256)
def _cpu_gemm_default(M: int, N: int, K: int, target: Any, itemsize: int, batch: int) -> Mapping[str, Any]:
    """``ops.matmul.cpu_gemm_default``, computed once per workload (read-only): the tuner's checks run
    the template for every configuration annealing meets (tens of thousands per plan)."""
    from ...ops.matmul import cpu_gemm_default
    return MappingProxyType(cpu_gemm_default(M, N, K, target, itemsize, batch))


@template("matmul", "cpu")
def matmul_cpu(cfg: TemplateConfig, op: Any) -> Any:
    tiles = gemm_space(cfg, op, _gemm_default(cfg, op))
    sched = cfg.schedule(op.func)
    schedule_gemm_cpu(sched, "C", "A", "B", tiles)
    return sched


@template("batch_matmul", "cpu")
def batch_matmul_cpu(cfg: TemplateConfig, op: Any) -> Any:
    tiles = gemm_space(cfg, op, _gemm_default(cfg, op, op.shape["batch"]), batch=op.shape["batch"])
    sched = cfg.schedule(op.func)
    schedule_gemm_cpu(sched, "C", "A", "B", tiles, batch="bb")
    return sched


@template("dense", "cpu")
def dense_cpu(cfg: TemplateConfig, op: Any) -> Any:
    """``kernel`` "gemm" (the GEMM space, W's panels packed or read in place) or, with K of at least a
    vector, "dot": dot products over K reading W (N × K) in place (``ops.matmul.schedule_dot_cpu``),
    mr rows of X × nr_vecs rows of W a register tile, the parallel loop "jr" or none (the BLIS form's
    other decisions are then unused). The first choices are the operator's default
    (``dense_cpu_default``: dot products for few rows)."""
    from ...ops.matmul import GEMM_FORM, cpu_gemm_tiles, dense_cpu_default
    s = op.shape
    itemsize = op.func.outputs[0].dtype.itemsize
    d = dense_cpu_default(s["M"], s["N"], s["K"], cfg.target, itemsize)
    default = {**GEMM_FORM, **cpu_gemm_tiles(s["M"], s["N"], s["K"], cfg.target, itemsize), "parallel": "ic"}
    if d["kernel"] == "dot":
        nr = d["nj"] * d["lanes"]  # the cache blocks, unused, one register tile each
        default.update(mr=d["mr"], nr=nr, mc=d["mr"], nc=nr, parallel=d["parallel"])
    kernel = cfg.knob("kernel", _first(d["kernel"], ["gemm", "dot"] if s["K"] >= d["lanes"] else ["gemm"]))
    tiles = gemm_space(cfg, op, default)
    epilogue = cfg.knob("epilogue", ["vector", "fused_row"])
    cfg.require(kernel == "gemm" or tiles["parallel"] in ("jr", None), "dot products: the parallel loop is jr")
    sched = cfg.schedule(op.func)
    form = {**tiles, "kernel": kernel, "epilogue": epilogue, "nj": tiles["nr"] // tiles["lanes"]}
    return op.schedules["cpu"](sched, cfg.target, form) or sched


@template("conv2d", "cpu")
def conv2d_cpu(cfg: TemplateConfig, op: Any) -> Any:
    """Direct NCHW convolution (``ops.conv.schedule_conv2d_tiles_cpu``): an output tile of k_tile
    channels × p_tile rows × q_tile columns accumulated in registers over the channels and filter
    taps (in a chosen order; another order than the algorithm's reassociates the sum), the vector
    along the columns or over the channels. The first choices are the operator's default schedule
    (``conv2d_cpu_default``)."""
    from ...ops.conv import conv2d_cpu_default, conv_out, schedule_conv2d_tiles_cpu
    s = op.shape
    target = cfg.target
    lanes = target.vector_lanes(4)
    K = s["K"]
    P = conv_out(s["H"], s["R"], s["stride"], s["padding"], s["dilation"])
    Q = conv_out(s["W"], s["S"], s["stride"], s["padding"], s["dilation"])
    d = conv2d_cpu_default(K, Q, s["R"] * s["S"], s["stride"], target)
    vectors = cfg.knob("vectors", _first(d["vectors"], ["columns", "channels"]))
    k_tile = cfg.knob("k_tile", _upto([1, 2, 3, 4, 6, 8, 12, 16, lanes, 2 * lanes, 3 * lanes], max(K, lanes),
                                      d["k_tile"]))
    p_tile = cfg.knob("p_tile", _upto([1, 2, 4, 7, 8], P, 1))
    q_tile = cfg.knob("q_tile", _upto(sorted({1, 2, 3, 4, 5, 6, lanes // 2, lanes, 2 * lanes, 7, 14, 28, Q}),
                                      max(Q, 1), d["q_tile"]))
    order = cfg.reorder("reduction_order", ["c", "r", "s"],
                        orders=[["c", "r", "s"], ["r", "s", "c"], ["r", "c", "s"]])
    pack_w = cfg.knob("pack_w", [True, False])
    par = cfg.knob("parallel", ["ko", "po"])
    unroll_p = cfg.tag("unroll_p", "pi", ["unroll", "serial"])
    separate = cfg.knob("separate", [True, False])
    if vectors == "channels":
        kv = k_tile // lanes  # type: ignore[operator]
        cfg.require(k_tile % lanes == 0, "channel vectors: the channel tile is whole vectors")  # type: ignore[operator]
        cfg.resources(vector_registers=kv * p_tile * q_tile + kv + 2)  # type: ignore[operator]
    else:
        vecs = math.ceil(q_tile / lanes)  # type: ignore[operator]
        cfg.resources(vector_registers=k_tile * p_tile * vecs + vecs + 1)  # type: ignore[operator]
    sched = cfg.schedule(op.func)
    schedule_conv2d_tiles_cpu(sched, {"vectors": vectors, "lanes": lanes, "k_tile": k_tile, "p_tile": p_tile,
                                      "q_tile": q_tile, "order": order, "pack_w": pack_w, "parallel": par,
                                      "unroll_p": unroll_p, "separate": separate, "w_copy": d["w_copy"]},
                              has_pad="Ipad" in sched.stage_names())
    return sched


def _row_space(cfg: TemplateConfig, op: Any, row_buffer: bool) -> dict[str, Any]:
    """The decisions of a row operator's schedule (``ops.norm.ROW_FORM``), the operator's default
    (``rows_cpu_default``) first: lane-wise partial reductions or one element at a time, the
    partials' vector accumulators, vectors per elementwise step, the stages fused at the row loop,
    the row loop in parallel, whole vectors separated, softmax's row buffer."""
    from ...ops.norm import rows_cpu_default
    N = op.shape["N"]
    lanes = cfg.target.vector_lanes(4)
    d = rows_cpu_default(N, cfg.target)
    lanewise = cfg.knob("lanewise", _first(d["lanewise"], [True, False]))
    accumulators = cfg.knob("accumulators", _first(d["accumulators"], [1, 2, 4, 8]))
    vectors = cfg.knob("vectors", _first(d["vectors"], [1, 2, 4]))
    fuse = cfg.knob("fuse_rows", _first(d["fuse"], [True, False]))
    parallel = cfg.knob("parallel", _first(d["parallel"], [True, False]))
    separate = cfg.knob("separate", _first(d["separate"], [True, False]))
    buffer = cfg.knob("row_buffer", _first(d["row_buffer"], [True, False])) if row_buffer else False
    cfg.require(not lanewise or N >= accumulators * lanes, "lane-wise partials: a row holds at least the partials")  # type: ignore[operator]
    cfg.require(lanewise or accumulators == d["accumulators"], "accumulators: only for lane-wise partials")
    cfg.require(fuse or not buffer, "a row buffer needs the stages fused at the row loop")
    return {"lanewise": lanewise, "accumulators": accumulators, "vectors": vectors, "fuse": fuse,
            "parallel": parallel, "separate": separate, "row_buffer": buffer}


def _rows(cfg: TemplateConfig, op: Any, row_buffer: bool) -> Any:
    """The schedule of a row operator in the form of its decisions (the operator's own CPU schedule
    function takes the form, restructuring the reductions into lane-wise partials)."""
    form = _row_space(cfg, op, row_buffer)
    sched = cfg.schedule(op.func)
    return op.schedules["cpu"](sched, cfg.target, form) or sched


@template("softmax", "cpu")
def softmax_cpu(cfg: TemplateConfig, op: Any) -> Any:
    return _rows(cfg, op, row_buffer=True)


@template("layernorm", "cpu")
def layernorm_cpu(cfg: TemplateConfig, op: Any) -> Any:
    return _rows(cfg, op, row_buffer=False)
